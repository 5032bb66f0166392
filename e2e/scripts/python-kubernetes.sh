#!/usr/bin/env bash
# The Python `kubernetes` client (from PyPI, the client Python users actually use), installed
# once into ~/.cache/tenure/python-kubernetes-VERSION; prints that directory (for PYTHONPATH).
# tests/kube_fence_workers.rs writes through `tenure run --fence` with it.
set -euo pipefail
version=37.0.3
dir="$HOME/.cache/tenure/python-kubernetes-$version"
mkdir -p "$HOME/.cache/tenure"
exec 9>"$dir.lock"
flock 9
if [ ! -f "$dir/.done" ]; then
  rm -rf "$dir.tmp"
  python3 -m pip install --quiet --disable-pip-version-check --no-input \
    --target "$dir.tmp" "kubernetes==$version" >&2
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
  touch "$dir/.done"
fi
echo "$dir"
