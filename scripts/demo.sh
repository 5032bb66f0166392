#!/usr/bin/env bash
# The README's main job: the same command started twice under `tenure run` on the default
# (local) backend. The second run waits until the first is done, then runs with a higher
# fencing token. Both print tenure's warning that the local backend only covers one host.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --features cli --bin tenure
tenure="${CARGO_TARGET_DIR:-target}/debug/tenure"
state="$(mktemp -d)"
trap 'rm -rf "$state"' EXIT
export TENURE_STATE_DIR="$state"
for run in 1 2; do
  "$tenure" run --lease demo -- sh -c \
    'echo "run $0: leading with fencing token $TENURE_FENCING_TOKEN"; sleep 2; echo "run $0: done"' "$run" &
  sleep 0.5
done
wait
