#!/usr/bin/env bash
# Build (or reuse) the node harness's binaries: the kube-node launcher, the pause program,
# and kube-apiserver, kube-controller-manager, kube-scheduler and kubelet of the pinned
# k8s.io/kubernetes release (`tool` lines in go.mod). Prints the directory holding them.
#
# Cached outside the repo in ${TENURE_CACHE:-$HOME/.cache/tenure}/kube-node/: the Kubernetes
# binaries in k8s-<hash of go.mod, go.sum, the Go version, RECIPE>/, the launcher and pause in
# <hash of every .go file too, and of the launchers' shared module ../launchkit>/ (with links
# to the former). Builds of one hash are serialised with flock. Never committed.
set -euo pipefail

RECIPE=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MOD=$here
CACHE_ROOT=${TENURE_CACHE:-${HOME:-/root}/.cache/tenure}/kube-node

log() { echo "kube-node build: $*" >&2; }
die() { log "$@"; exit 1; }
# shellcheck source=../scripts/find-go.sh
source "$here/../scripts/find-go.sh"
# shellcheck source=../scripts/k8s-version.sh
source "$here/../scripts/k8s-version.sh"

go=$(find_go)
# hash_of FILES...: the recipe, the Go version and the named files of the module.
hash_of() {
  (
    cd "$MOD"
    printf 'recipe %s\n' "$RECIPE"
    "$go" env GOVERSION GOOS GOARCH
    for f in "$@"; do
      printf '%s ' "$f"
      sha256sum <"$f" | cut -d' ' -f1
    done
  ) | sha256sum | cut -c1-16
}
# The Kubernetes binaries depend on go.mod and go.sum only; the launcher on every file, and on
# the launchers' shared module (go.mod replaces it with ../launchkit).
k8s_hash=$(hash_of go.mod go.sum)
mapfile -t sources < <(cd "$MOD" && find . ../launchkit -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) \
  -not -path './.*' -print | LC_ALL=C sort)
hash=$(hash_of "${sources[@]}")
k8s_dir=$CACHE_ROOT/k8s-$k8s_hash
dir=$CACHE_ROOT/$hash
mkdir -p "$dir" "$k8s_dir"
exec {lockfd}>"$dir/.lock"
flock "$lockfd"

ldflags=$(k8s_ldflags "$go" "$MOD")

# build DIR NAME PKG
build() {
  local dir=$1 name=$2 pkg=$3 tmp start
  [[ -x $dir/$name ]] && return 0
  log "building $name ($pkg) into $dir; the first build of the Kubernetes binaries takes several minutes"
  start=$SECONDS
  tmp=$(mktemp "$dir/.$name.XXXXXX")
  if ! (cd "$MOD" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
        "$go" build -trimpath -ldflags "$ldflags" -o "$tmp" "$pkg") >&2; then
    rm -f "$tmp"
    die "go build of $pkg failed"
  fi
  chmod 755 "$tmp"
  mv -f "$tmp" "$dir/$name"
  log "built $name in $((SECONDS - start))s"
}

exec {k8slock}>"$k8s_dir/.lock"
flock "$k8slock"
build "$dir" kube-node .
build "$dir" pause ./cmd/pause
for t in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
  build "$k8s_dir" "$t" "k8s.io/kubernetes/cmd/$t"
  ln -sfn "$k8s_dir/$t" "$dir/$t"
done
echo "$dir"
