#!/usr/bin/env bash
# Build (or reuse) helm from Go modules, for the chart checks in tests/helm_chart.rs.
#
#   helm.sh build     build helm.sh/helm/v3/cmd/helm@$HELM_VERSION into the cache; prints its path
#   helm.sh path      print the cached binary's path if it exists (exit 1 otherwise)
#
# The binary is never committed: it goes to
#   ${TENURE_CACHE:-$HOME/.cache/tenure}/helm/<version>-<hash>/helm
# where <hash> covers the helm version, the Go version and this script's RECIPE.
# Only Go and the Go module proxy are needed (helm's go.mod has no replace
# directives, so `go install pkg@version` works). The build flags follow helm's
# own Makefile: CGO off, -trimpath, and the version / Kubernetes-version
# variables it sets with -X (otherwise `helm version` says "v3.22" and
# .Capabilities.KubeVersion defaults to v1.20.0).
#
# Environment:
#   TENURE_CACHE    cache root (default $HOME/.cache/tenure)
#   GO              go binary (default: go on PATH, else /usr/local/go/bin/go)
#   HELM_VERSION    default v3.22.0
set -euo pipefail

# Bump when the build flags below change, so cached binaries are rebuilt.
RECIPE=1
HELM_VERSION=${HELM_VERSION:-v3.22.0}
CACHE_ROOT=${TENURE_CACHE:-${HOME:-/root}/.cache/tenure}/helm

log() { echo "helm.sh: $*" >&2; }
die() { log "$@"; exit 1; }

# shellcheck source=find-go.sh
source "$(dirname "${BASH_SOURCE[0]}")/find-go.sh"

cache_dir() {
  local go=$1 hash
  hash=$({
    printf 'recipe %s\nhelm %s\n' "$RECIPE" "$HELM_VERSION"
    "$go" env GOVERSION GOOS GOARCH
  } | sha256sum | cut -c1-16)
  echo "$CACHE_ROOT/$HELM_VERSION-$hash"
}

cmd_path() {
  local bin
  bin=$(cache_dir "$(find_go)")/helm
  [[ -x $bin ]] || exit 1
  echo "$bin"
}

cmd_build() {
  local go dir bin tmpbin gomod cgver kmajor kminor ldflags start
  go=$(find_go)
  dir=$(cache_dir "$go")
  bin=$dir/helm
  if [[ -x $bin ]]; then echo "$bin"; return 0; fi
  mkdir -p "$dir"
  # Serialise concurrent builds (test binaries running in parallel).
  if command -v flock >/dev/null 2>&1; then
    exec {lockfd}>"$dir/.lock"
    flock "$lockfd"
    if [[ -x $bin ]]; then echo "$bin"; return 0; fi
  fi

  # Run outside any module: `go install pkg@version` ignores the current
  # module anyway, and must not see a go.work or GOFLAGS=-mod=... from the caller.
  export GOTOOLCHAIN=${GOTOOLCHAIN:-local} GO111MODULE=on GOWORK=off
  export GOFLAGS="-buildvcs=false"
  cd "$dir"

  # The Kubernetes version helm assumes by default: like helm's Makefile,
  # client-go v0.X.Y -> 1.X.
  gomod=$("$go" mod download -json "helm.sh/helm/v3@$HELM_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p') ||
    die "cannot download helm.sh/helm/v3@$HELM_VERSION from the Go module proxy"
  [[ -f $gomod ]] || die "no go.mod for helm.sh/helm/v3@$HELM_VERSION"
  cgver=$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "$gomod")
  [[ $cgver =~ ^v0\.([0-9]+)\. ]] || die "cannot read k8s.io/client-go's version from $gomod"
  kmajor=1 kminor=${BASH_REMATCH[1]}

  ldflags="-s -w"
  ldflags+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags+=" -X $p.k8sVersionMajor=$kmajor -X $p.k8sVersionMinor=$kminor"
  done

  log "building helm $HELM_VERSION (default Kubernetes $kmajor.$kminor) into $dir; a cold build takes several minutes"
  start=$SECONDS
  tmpbin=$(mktemp -d "$dir/.gobin.XXXXXX")
  if ! CGO_ENABLED=0 GOBIN=$tmpbin "$go" install -trimpath -ldflags "$ldflags" \
      "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2; then
    rm -rf "$tmpbin"
    die "go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION failed"
  fi
  mv -f "$tmpbin/helm" "$bin"
  rm -rf "$tmpbin"
  log "built $bin in $((SECONDS - start))s"
  "$bin" version --short >&2 || die "the built helm does not run"
  echo "$bin"
}

case ${1:-} in
  build) shift; cmd_build "$@" ;;
  path) shift; cmd_path "$@" ;;
  *) sed -n '2,20s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
