#!/usr/bin/env bash
# Mutation testing with the simulation as the judge (docs/evidence.md, "Mutation testing").
# cargo-mutants generates the mutants of each FILE; each is applied to a scratch copy of the
# tree, the simulator is built against it and run over N seeds (default 200: one lease and
# 12-shard groups, alternating), stopping at the first violation. One line per mutant:
#
#   caught  SEED  NAME        the simulation reported a violation (first seed)
#   missed  -     NAME        N seeds without a violation
#   unviable -    NAME        the mutant does not build
#
#   scripts/sim-mutants.sh [--seeds N] [--re REGEX] FILE...
#
# --re keeps only the mutants whose name matches REGEX (e.g. one function). The summary line
# counts each outcome. cargo-mutants' own test phase runs `cargo test`; the simulation is a
# separate package built with --cfg tokio_unstable, hence this loop of our own.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seeds=200
re=""
# A mutant whose run takes this long hangs (200 seeds take under a minute on 2 cores).
limit="${SIM_MUTANT_LIMIT:-600s}"
while [ "$#" -gt 0 ]; do
  case "$1" in
    --seeds) seeds="$2"; shift 2 ;;
    --re) re="$2"; shift 2 ;;
    *) break ;;
  esac
done
[ "$#" -gt 0 ] || { echo "usage: scripts/sim-mutants.sh [--seeds N] [--re REGEX] FILE..." >&2; exit 2; }
target="${CARGO_TARGET_DIR:-$root/target}/sim-mutants"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
tree="$scratch/tree"
mkdir -p "$tree"
# One copy for every mutant (the same path keeps the build incremental across mutants): the
# working tree as it is, without build output.
tar -C "$root" --exclude=./target --exclude=./sim/target --exclude=./.git -cf - . | tar -C "$tree" -xf -
# Each mutated file is restored from this copy, not from the working tree, which may change
# while the run goes on.
orig="$scratch/orig"
for file in "$@"; do
  mkdir -p "$orig/$(dirname "$file")"
  cp "$tree/$file" "$orig/$file"
done
declare -A count=([caught]=0 [missed]=0 [unviable]=0)
for file in "$@"; do
  (cd "$root" && cargo mutants --list --json --diff --file "$file") >"$scratch/list.json"
  n="$(jq length "$scratch/list.json")"
  for i in $(seq 0 $((n - 1))); do
    name="$(jq -r ".[$i].name" "$scratch/list.json")"
    if [ -n "$re" ] && ! grep -Eq -- "$re" <<<"$name"; then
      continue
    fi
    cp "$orig/$file" "$tree/$file"
    jq -r ".[$i].diff" "$scratch/list.json" >"$scratch/mutant.diff"
    if ! patch --quiet "$tree/$file" <"$scratch/mutant.diff" >/dev/null; then
      echo "unviable -     $name (diff did not apply)"
      count[unviable]=$((count[unviable] + 1))
      continue
    fi
    if ! (cd "$tree/sim" && CARGO_TARGET_DIR="$target" cargo build --quiet --release --locked) >/dev/null 2>&1; then
      echo "unviable -     $name"
      count[unviable]=$((count[unviable] + 1))
      cp "$orig/$file" "$tree/$file"
      continue
    fi
    rc=0
    out="$(timeout "$limit" "$target/release/tenure-sim" --seeds "$seeds" --fail-fast --jobs "$(nproc)" 2>&1)" || rc=$?
    first="$(grep -m1 '^VIOLATION seed' <<<"$out" | awk '{print $3}' || true)"
    if [ -n "$first" ]; then
      kind="$(grep -m1 -A1 '^VIOLATION seed' <<<"$out" | tail -1 | awk '{print $1}')"
      printf 'caught  %-5s %s (%s)\n' "$first" "$name" "$kind"
      count[caught]=$((count[caught] + 1))
    elif [ "$rc" -ne 0 ]; then
      # A hang (the simulation's virtual time never ends a seed) or a panic: found too.
      why="$([ "$rc" -eq 124 ] && echo "timeout after ${limit}" || grep -m1 -o 'panicked at .*' <<<"$out" || echo "exit $rc")" || true
      printf 'caught  -     %s (%s)\n' "$name" "$why"
      count[caught]=$((count[caught] + 1))
    else
      echo "missed  -     $name"
      count[missed]=$((count[missed] + 1))
    fi
    cp "$orig/$file" "$tree/$file"
  done
done
echo "sim-mutants: caught ${count[caught]}, missed ${count[missed]}, unviable ${count[unviable]} ($seeds seeds each)"
