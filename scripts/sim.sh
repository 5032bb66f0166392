#!/usr/bin/env bash
# Deterministic simulation of tenure's real lock runtime, LeaderElector and ShardedElector
# (sim/, docs/evidence.md). Prints one summary line and exits non-zero on any violation.
#
#   scripts/sim.sh --seeds N [--replicas R --shards S] [--check-determinism] [...]
#   scripts/sim.sh --seed S ... --trace      replay one seed (every failure prints this line)
#   scripts/sim.sh --bite [N]                re-introduce each defect in sim/defects/ into a
#                                            scratch copy and show the simulation finds it
#                                            within N seeds (default 200); with names after N,
#                                            only those defects
#   scripts/sim.sh --help                    every option of the simulator
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# Its own target directory: the simulator is built with --cfg tokio_unstable
# (sim/.cargo/config.toml), which must not invalidate tenure's own builds.
target="${CARGO_TARGET_DIR:-$root/target}/sim"

build() { # build SOURCE_ROOT TARGET_DIR
  (cd "$1/sim" && CARGO_TARGET_DIR="$2" cargo build --quiet --release --locked)
}

if [ "${1:-}" != "--bite" ]; then
  build "$root" "$target"
  exec "$target/release/tenure-sim" "$@"
fi

shift
seeds="${1:-200}"
shift || true
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
missed=0
for defect in "$root"/sim/defects/*.patch; do
  name="$(basename "$defect" .patch)"
  if [ "$#" -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$name"; then
    continue
  fi
  copy="$scratch/$name"
  mkdir -p "$copy"
  # The working tree as it is (uncommitted changes included), without build output.
  tar -C "$root" --exclude=./target --exclude=./sim/target --exclude=./.git -cf - . | tar -C "$copy" -xf -
  (cd "$copy" && patch --quiet -p1 < "$defect")
  build "$copy" "$target-bite"
  out="$("$target-bite/release/tenure-sim" --seeds "$seeds" --jobs "$(nproc)" 2>&1 || true)"
  found="$(grep -c '^VIOLATION seed' <<<"$out" || true)"
  first="$(grep -m1 '^VIOLATION seed' <<<"$out" | awk '{print $3}')"
  if [ "$found" -gt 0 ]; then
    kind="$(grep -m1 -A1 '^VIOLATION seed' <<<"$out" | tail -1 | awk '{print $1}')"
    # The replay line of the first violation names the nemesis that preceded it, if any.
    nemesis="$(grep -m1 "replay: .*--seed $first " <<<"$out" | sed -n 's/.*# //p' || true)"
    echo "bite: $name found by $found of $seeds seeds (first: seed $first, $kind; $nemesis)"
  else
    echo "bite: $name NOT FOUND in $seeds seeds"
    missed=$((missed + 1))
  fi
done
[ "$missed" -eq 0 ]
