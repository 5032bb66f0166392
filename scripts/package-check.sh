#!/usr/bin/env bash
# The crate as crates.io would get it: `cargo package` (which builds the packaged sources with
# the default features), then the packaged crate alone, unpacked outside the repository, checked
# with every feature and its doc tests run. Catches a file the library or its docs include that
# the package leaves out, and a feature that builds only beside the repository's dev setup.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-$PWD/target}"
cargo package --locked --allow-dirty --quiet
crate=$(ls -t "$target"/package/tenure-*.crate | head -1)
size=$(stat -c %s "$crate")
files=$(tar -tzf "$crate" | wc -l)
echo "packaged $(basename "$crate"): $size bytes, $files files"
# A package over 10 MiB is refused by crates.io; ours should stay far below.
if [ "$size" -gt 2000000 ]; then
  echo "the package grew past 2 MB: check Cargo.toml's include list" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xzf "$crate" -C "$work"
dir=$(echo "$work"/tenure-*)
# Its own workspace root, so the repository's Cargo.toml does not claim it.
(cd "$dir" && cargo test --locked --doc --all-features --quiet)
echo "the packaged crate's doc tests pass on their own"
