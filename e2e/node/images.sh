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
# buildah's storage is a temporary directory under OUTDIR (vfs driver), removed at the end.
# Prints OUTDIR.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
[[ $# -eq 3 ]] || { echo "usage: $0 OUTDIR TENURE_BIN PAUSE_BIN" >&2; exit 2; }
out=$1 tenure_bin=$2 pause_bin=$3
for tool in buildah busybox; do
  command -v "$tool" >/dev/null || { echo "images.sh: $tool not found (Debian packages buildah, busybox-static)" >&2; exit 1; }
done
if ldd "$tenure_bin" 2>&1 | grep -q '=>'; then
  echo "images.sh: $tenure_bin is dynamically linked; the image needs the static musl build" >&2
  exit 1
fi
app_version=$(awk -F'"' '/^appVersion:/ {print $2}' "$repo/charts/tenure/Chart.yaml")
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "$out/.buildah.XXXXXX")
cleanup() {
  buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs rm --all >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
bh() { buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs "$@"; }

# tenure: the repository's Dockerfile, its `prebuilt` path.
ctx=$work/tenure-context
mkdir -p "$ctx"
install -m 0755 "$tenure_bin" "$ctx/tenure"
cp /etc/ssl/certs/ca-certificates.crt "$ctx/ca-certificates.crt"
# The same passwd and group the Dockerfile's `build` stage writes.
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$ctx/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$ctx/group"
bh build --quiet --layers=false --format docker --build-arg TENURE_BINARY=prebuilt \
  -f "$repo/Dockerfile" -t "localhost/tenure-node-test:build" "$ctx" >/dev/null
bh push --quiet "localhost/tenure-node-test:build" "docker-archive:$out/tenure.tar:docker.io/library/tenure:$app_version"
bh push --quiet "localhost/tenure-node-test:build" "docker-archive:$out/tenure-next.tar:docker.io/library/tenure:$app_version-next"
bh inspect --type image "localhost/tenure-node-test:build" >"$out/tenure.inspect.json"

# busybox: the static binary and its applet links.
ctx=$work/busybox-context
mkdir -p "$ctx/bin"
install -m 0755 "$(command -v busybox)" "$ctx/bin/busybox"
for applet in $("$ctx/bin/busybox" --list); do
  [[ $applet == busybox ]] || ln -s busybox "$ctx/bin/$applet"
done
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
