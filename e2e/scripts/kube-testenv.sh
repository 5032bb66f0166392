#!/usr/bin/env bash
# Build, start and stop the kube-testenv launcher (a real kube-apiserver with an
# embedded etcd, on 127.0.0.1 only) for end-to-end tests.
#
#   kube-testenv.sh build              build (or reuse) the launcher; prints its path
#   kube-testenv.sh build-candidate    same for the client-go leader-election candidate
#   kube-testenv.sh build-kubectl      same for kubectl (k8s.io/kubernetes/cmd/kubectl, same release)
#   kube-testenv.sh build-fenced-writer same for the Go example of `tenure run --fence` (cmd/fenced-writer)
#   kube-testenv.sh build-cr-peer      build (or reuse) the controller-runtime peer of the
#                                      controller bench (its own module, e2e/controller-runtime-peer)
#   kube-testenv.sh start DIR [-- ARGS] start it with --dir DIR, wait for DIR/ready
#   kube-testenv.sh stop DIR           SIGTERM the launcher of DIR, SIGKILL after a timeout
#
# Binaries are cached outside the repo in
#   ${TENURE_CACHE:-$HOME/.cache/tenure}/kube-testenv/<hash>/
# where <hash> covers go.mod, go.sum, every .go file of e2e/kube-testenv and of
# e2e/launchkit (the launchers' shared module), the Go version and this script's
# build recipe. Only Go and the Go module proxy are needed; the first (cold) build
# downloads the modules and takes several minutes.
# The controller-runtime peer is cached the same way, by the hash of its own
# module, in ${TENURE_CACHE:-$HOME/.cache/tenure}/controller-runtime-peer/<hash>/.
#
# Environment:
#   TENURE_CACHE                 cache root (default $HOME/.cache/tenure)
#   GO                           go binary (default: go on PATH, else /usr/local/go/bin/go)
#   KUBE_TESTENV_START_TIMEOUT   seconds to wait for DIR/ready (default 180)
#   KUBE_TESTENV_STOP_TIMEOUT    seconds to wait after SIGTERM before SIGKILL (default 60)
set -euo pipefail

# Bump when the build flags below change, so cached binaries are rebuilt.
RECIPE=2

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MOD=$(cd "$here/../kube-testenv" && pwd)
# The launchers' shared module, which go.mod replaces with this directory (relative to MOD).
SHARED=../launchkit
CACHE_ROOT=${TENURE_CACHE:-${HOME:-/root}/.cache/tenure}/kube-testenv
START_TIMEOUT=${KUBE_TESTENV_START_TIMEOUT:-180}
STOP_TIMEOUT=${KUBE_TESTENV_STOP_TIMEOUT:-60}

log() { echo "kube-testenv.sh: $*" >&2; }
die() { log "$@"; exit 1; }

# shellcheck source=find-go.sh
source "$(dirname "${BASH_SOURCE[0]}")/find-go.sh"
# shellcheck source=k8s-version.sh
source "$(dirname "${BASH_SOURCE[0]}")/k8s-version.sh"

# tree_hash GO DIR [MORE...]: hash of everything that determines the binaries of the module in
# DIR: this script's recipe, the Go version, and go.mod, go.sum and every .go file under DIR
# and under the directories MORE (relative to DIR).
tree_hash() {
  local go=$1 mod=$2
  shift 2
  (
    cd "$mod"
    printf 'recipe %s\n' "$RECIPE"
    "$go" env GOVERSION GOOS GOARCH
    find . "$@" -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) -not -path './.*' -print |
      LC_ALL=C sort | while IFS= read -r f; do
        printf '%s ' "$f"
        sha256sum <"$f" | cut -d' ' -f1
      done
  ) | sha256sum | cut -c1-16
}

# The launcher's: its module and the shared one.
source_hash() { tree_hash "$1" "$MOD" "$SHARED"; }

# build_one NAME PKG: build package PKG of the module into the cache as NAME.
build_one() {
  local name=$1 pkg=$2 go hash dir bin tmp kver ldflags start
  go=$(find_go)
  hash=$(source_hash "$go")
  dir=$CACHE_ROOT/$hash
  bin=$dir/$name
  if [[ -x $bin ]]; then echo "$bin"; return 0; fi

  mkdir -p "$dir"
  # Serialise concurrent builds of the same hash.
  if command -v flock >/dev/null 2>&1; then
    exec {lockfd}>"$dir/.lock"
    flock "$lockfd"
    if [[ -x $bin ]]; then echo "$bin"; return 0; fi
  fi

  kver=$(k8s_version "$MOD")
  # /version reports the real release (see k8s-version.sh).
  ldflags=$(k8s_ldflags "$go" "$MOD") || exit 1

  log "building $name ($pkg, k8s.io/kubernetes $kver) into $dir; a cold build takes several minutes"
  start=$SECONDS
  tmp=$(mktemp "$dir/.$name.XXXXXX")
  if ! (cd "$MOD" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
        "$go" build -trimpath -ldflags "$ldflags" -o "$tmp" "$pkg") >&2; then
    rm -f "$tmp"
    die "go build of $pkg failed"
  fi
  chmod 755 "$tmp"
  mv -f "$tmp" "$bin"
  log "built $bin in $((SECONDS - start))s"
  echo "$bin"
}

cmd_build() { build_one kube-testenv .; }
cmd_build_candidate() { build_one clientgo-candidate ./cmd/clientgo-candidate; }
# kubectl of the pinned release, for the Helm chart checks (`kubectl apply
# --dry-run=server`, `kubectl auth can-i`), at the apiserver's release. go.mod lists it
# as a `tool`, so its dependencies are in go.mod/go.sum (-mod=readonly works).
cmd_build_kubectl() { build_one kubectl k8s.io/kubernetes/cmd/kubectl; }
# The Go example of docs/fencing-kubernetes.md: a plain client-go writer.
cmd_build_fenced_writer() { build_one fenced-writer ./cmd/fenced-writer; }

# The controller-runtime peer: a module of its own, so that controller-runtime's
# dependencies never change the launcher's. Built like build_one, without the
# kubernetes version stamps (it only reports controller-runtime's own version).
CR_CACHE_ROOT=${TENURE_CACHE:-${HOME:-/root}/.cache/tenure}/controller-runtime-peer

# cr_peer_hash GO MOD: the peer's module alone.
cr_peer_hash() { tree_hash "$1" "$2"; }

cmd_build_cr_peer() {
  local name=controller-runtime-peer mod go hash dir bin tmp start
  mod=$(cd "$here/../controller-runtime-peer" && pwd) || die "no e2e/controller-runtime-peer"
  go=$(find_go)
  hash=$(cr_peer_hash "$go" "$mod")
  dir=$CR_CACHE_ROOT/$hash
  bin=$dir/$name
  if [[ -x $bin ]]; then echo "$bin"; return 0; fi
  mkdir -p "$dir"
  if command -v flock >/dev/null 2>&1; then
    exec {lockfd}>"$dir/.lock"
    flock "$lockfd"
    if [[ -x $bin ]]; then echo "$bin"; return 0; fi
  fi
  log "building $name ($mod) into $dir; a cold build downloads controller-runtime's modules"
  start=$SECONDS
  tmp=$(mktemp "$dir/.$name.XXXXXX")
  if ! (cd "$mod" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
        "$go" build -trimpath -ldflags "-s -w" -o "$tmp" .) >&2; then
    rm -f "$tmp"
    die "go build of $mod failed"
  fi
  chmod 755 "$tmp"
  mv -f "$tmp" "$bin"
  log "built $bin in $((SECONDS - start))s"
  echo "$bin"
}

# alive PID: the process exists and is not a zombie.
alive() {
  local state
  kill -0 "$1" 2>/dev/null || return 1
  state=$(sed -n 's/^[0-9]* (.*) \([A-Za-z]\) .*/\1/p' "/proc/$1/stat" 2>/dev/null || true)
  [[ $state != Z ]]
}

# is_ours PID: PID is alive and is a kube-testenv process.
is_ours() {
  local pid=$1
  alive "$pid" || return 1
  [[ -r /proc/$pid/cmdline ]] || return 0
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q kube-testenv
}

cmd_start() {
  [[ $# -ge 1 ]] || die "usage: $0 start DIR [-- extra kube-apiserver flags]"
  local dir=$1 bin pid deadline
  shift
  [[ ${1:-} == -- ]] && shift
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if [[ -f $dir/pid ]] && is_ours "$(cat "$dir/pid")"; then
    die "already running in $dir (pid $(cat "$dir/pid")); stop it first"
  fi
  bin=$(cmd_build)
  rm -f "$dir/ready" "$dir/pid"
  local extra=()
  [[ $# -gt 0 ]] && extra=(-- "$@")
  "$bin" --dir "$dir" "${extra[@]}" >"$dir/log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$dir/pid"
  log "started pid $pid, waiting up to ${START_TIMEOUT}s for $dir/ready"
  deadline=$((SECONDS + START_TIMEOUT))
  while [[ ! -f $dir/ready ]]; do
    if ! alive "$pid"; then
      local rc=0
      wait "$pid" || rc=$?
      log "launcher exited (status $rc) before it was ready; last lines of $dir/log:"
      tail -n 40 "$dir/log" >&2 || true
      rm -f "$dir/pid"
      exit 1
    fi
    if ((SECONDS >= deadline)); then
      log "not ready after ${START_TIMEOUT}s; last lines of $dir/log:"
      tail -n 40 "$dir/log" >&2 || true
      cmd_stop "$dir" || true
      exit 1
    fi
    sleep 0.2
  done
  log "ready: $(cat "$dir/ready") (KUBECONFIG=$dir/admin.kubeconfig)"
  echo "$dir"
}

cmd_stop() {
  [[ $# -eq 1 ]] || die "usage: $0 stop DIR"
  local dir=$1 pid deadline
  if [[ ! -f $dir/pid ]]; then
    log "no $dir/pid; nothing to stop"
    return 0
  fi
  pid=$(cat "$dir/pid")
  if ! is_ours "$pid"; then
    log "pid $pid from $dir/pid is not running"
    rm -f "$dir/pid"
    return 0
  fi
  kill -TERM "$pid"
  deadline=$((SECONDS + STOP_TIMEOUT))
  while alive "$pid"; do
    if ((SECONDS >= deadline)); then
      log "pid $pid still running ${STOP_TIMEOUT}s after SIGTERM; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.2
  done
  rm -f "$dir/pid"
  log "stopped pid $pid"
}

case ${1:-} in
  build) shift; cmd_build "$@" ;;
  build-candidate) shift; cmd_build_candidate "$@" ;;
  build-kubectl) shift; cmd_build_kubectl "$@" ;;
  build-fenced-writer) shift; cmd_build_fenced_writer "$@" ;;
  build-cr-peer) shift; cmd_build_cr_peer "$@" ;;
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  *) sed -n '2,27s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
