#!/usr/bin/env bash
# Build the node tests' images with buildah, offline (no registry, no container engine),
# as docker-archive tarballs ready for `ctr images import`:
#
#   images.sh OUTDIR TENURE_BIN PAUSE_BIN
#
#   OUTDIR/tenure.tar       docker.io/library/tenure:0.1.0 from the repository's Dockerfile
#                           (TENURE_BINARY=prebuilt: TENURE_BIN must be the static musl build)
#   OUTDIR/tenure-next.tar  the same image as tenure:0.1.0-next (the upgrade test's new tag)
#   OUTDIR/busybox.tar      docker.io/library/busybox:1.37 from Debian's busybox-static
#   OUTDIR/pause.tar        registry.k8s.io/pause:3.10 from e2e/node/cmd/pause
#
#   images.sh --peers OUTDIR KUBE_CONTROLLER_BIN CLIENTGO_CANDIDATE_BIN [TENURE_BIN]
#
#   OUTDIR/kube-controller.tar     docker.io/library/tenure-kube-controller:0.1.0, the static
#                                  musl build of examples/kube_controller.rs
#                                  (images/kube-controller.Dockerfile)
#   OUTDIR/clientgo-candidate.tar  docker.io/library/clientgo-candidate:0.1.0, client-go's
#                                  leader election (e2e/kube-testenv/cmd/clientgo-candidate)
#                                  with busybox (images/clientgo-candidate.Dockerfile)
#   OUTDIR/tenure-busybox.tar      docker.io/library/tenure-busybox:0.1.0, busybox with the
#                                  static musl tenure at /usr/local/bin/tenure: a workload image
#                                  that has tenure (images/tenure-busybox.Dockerfile)
#   A binary given as "-" skips its image.
#
# buildah's storage is a temporary directory under OUTDIR (vfs driver), removed at the end.
# Prints OUTDIR.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
usage() {
  echo "usage: $0 OUTDIR TENURE_BIN PAUSE_BIN" >&2
  echo "       $0 --peers OUTDIR KUBE_CONTROLLER_BIN CLIENTGO_CANDIDATE_BIN [TENURE_BIN]" >&2
  exit 2
}
peers=false
if [[ ${1:-} == --peers ]]; then
  peers=true
  shift
fi
if $peers; then
  [[ $# -eq 3 || $# -eq 4 ]] || usage
else
  [[ $# -eq 3 ]] || usage
fi
for tool in buildah busybox; do
  command -v "$tool" >/dev/null || { echo "images.sh: $tool not found (Debian packages buildah, busybox-static)" >&2; exit 1; }
done
static() {
  if ldd "$1" 2>&1 | grep -q '=>'; then
    echo "images.sh: $1 is dynamically linked; the image needs a static build" >&2
    exit 1
  fi
}
if $peers; then
  out=$1 controller_bin=$2 candidate_bin=$3 in_image_bin=${4:--}
  [[ $controller_bin == - ]] || static "$controller_bin"
  [[ $candidate_bin == - ]] || static "$candidate_bin"
  [[ $in_image_bin == - ]] || static "$in_image_bin"
else
  out=$1 tenure_bin=$2 pause_bin=$3
  static "$tenure_bin"
fi
app_version=$(awk -F'"' '/^appVersion:/ {print $2}' "$repo/charts/tenure/Chart.yaml")
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "$out/.buildah.XXXXXX")
bh() { buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs "$@"; }
cleanup() {
  bh rm --all >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
# buildah (as root) would otherwise create /etc/cni/net.d/cni.lock on the host for its network
# backend, even for builds without RUN, and put temporary files in /var/tmp: both go under
# $work instead. (Its blob info cache, /var/lib/containers/cache, has no such setting.)
mkdir -p "$work/cni" "$work/tmp"
printf '[network]\nnetwork_config_dir = "%s"\n' "$work/cni" >"$work/containers.conf"
export CONTAINERS_CONF=$work/containers.conf TMPDIR=$work/tmp

# The same passwd and group the Dockerfile's `build` stage writes.
passwd_group() {
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$1/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$1/group"
}
# Debian's static busybox and its applet links in DIR/bin.
busybox_bin() {
  mkdir -p "$1/bin"
  install -m 0755 "$(command -v busybox)" "$1/bin/busybox"
  local applet
  for applet in $("$1/bin/busybox" --list); do
    [[ $applet == busybox ]] || ln -s busybox "$1/bin/$applet"
  done
}

if $peers; then
  if [[ $controller_bin != - ]]; then
    ctx=$work/kube-controller-context
    mkdir -p "$ctx"
    install -m 0755 "$controller_bin" "$ctx/kube_controller"
    cp /etc/ssl/certs/ca-certificates.crt "$ctx/ca-certificates.crt"
    passwd_group "$ctx"
    bh build --quiet --layers=false --format docker -f "$here/images/kube-controller.Dockerfile" \
      -t "localhost/tenure-node-kube-controller:build" "$ctx" >/dev/null
    bh push --quiet "localhost/tenure-node-kube-controller:build" \
      "docker-archive:$out/kube-controller.tar:docker.io/library/tenure-kube-controller:$app_version"
  fi
  if [[ $candidate_bin != - ]]; then
    ctx=$work/clientgo-context
    busybox_bin "$ctx"
    install -m 0755 "$candidate_bin" "$ctx/clientgo-candidate"
    bh build --quiet --layers=false --format docker -f "$here/images/clientgo-candidate.Dockerfile" \
      -t "localhost/tenure-node-clientgo:build" "$ctx" >/dev/null
    bh push --quiet "localhost/tenure-node-clientgo:build" \
      "docker-archive:$out/clientgo-candidate.tar:docker.io/library/clientgo-candidate:$app_version"
  fi
  if [[ $in_image_bin != - ]]; then
    ctx=$work/tenure-busybox-context
    busybox_bin "$ctx"
    install -m 0755 "$in_image_bin" "$ctx/tenure"
    bh build --quiet --layers=false --format docker -f "$here/images/tenure-busybox.Dockerfile" \
      -t "localhost/tenure-node-tenure-busybox:build" "$ctx" >/dev/null
    bh push --quiet "localhost/tenure-node-tenure-busybox:build" \
      "docker-archive:$out/tenure-busybox.tar:docker.io/library/tenure-busybox:$app_version"
  fi
  echo "$out"
  exit 0
fi

# tenure: the repository's Dockerfile, its `prebuilt` path.
ctx=$work/tenure-context
mkdir -p "$ctx"
install -m 0755 "$tenure_bin" "$ctx/tenure"
cp /etc/ssl/certs/ca-certificates.crt "$ctx/ca-certificates.crt"
passwd_group "$ctx"
bh build --quiet --layers=false --format docker --build-arg TENURE_BINARY=prebuilt \
  -f "$repo/Dockerfile" -t "localhost/tenure-node-test:build" "$ctx" >/dev/null
bh push --quiet "localhost/tenure-node-test:build" "docker-archive:$out/tenure.tar:docker.io/library/tenure:$app_version"
bh push --quiet "localhost/tenure-node-test:build" "docker-archive:$out/tenure-next.tar:docker.io/library/tenure:$app_version-next"
bh inspect --type image "localhost/tenure-node-test:build" >"$out/tenure.inspect.json"

# busybox: the static binary and its applet links.
ctx=$work/busybox-context
busybox_bin "$ctx"
bh build --quiet --layers=false --format docker -f "$here/images/busybox.Dockerfile" \
  -t "localhost/tenure-node-busybox:build" "$ctx" >/dev/null
bh push --quiet "localhost/tenure-node-busybox:build" "docker-archive:$out/busybox.tar:docker.io/library/busybox:1.37"

# pause
ctx=$work/pause-context
mkdir -p "$ctx"
install -m 0755 "$pause_bin" "$ctx/pause"
bh build --quiet --layers=false --format docker -f "$here/images/pause.Dockerfile" \
  -t "localhost/tenure-node-pause:build" "$ctx" >/dev/null
bh push --quiet "localhost/tenure-node-pause:build" "docker-archive:$out/pause.tar:registry.k8s.io/pause:3.10"
echo "$out"
