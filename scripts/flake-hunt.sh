#!/usr/bin/env bash
# Flake hunt: builds the named integration test targets once, runs each test binary N times
# (optionally beside one busy loop per core, the CPU load a shared CI machine adds), and lists
# every test that failed at least once with the first lines of its message.
#
#   scripts/flake-hunt.sh [--runs N] [--load] [--timeout SECS] [--out DIR] TEST... [-- ARGS...]
#
#   TEST      a test target name (tests/TEST.rs): cli cli_kube cli_redis redis_backend ...
#   --runs    how many times each binary runs (default 3)
#   --load    one `while :; do :; done` per core for the whole hunt
#   --timeout a run still going after SECS is killed and counted as a failure (default 1800)
#   --out     where the logs and summary.txt go (default: a fresh directory under /tmp)
#   ARGS      passed to every test binary (a name filter, --test-threads=1, ...)
#
# Runs are sequential: binary 1 N times, then binary 2 N times, and so on. Exit status: 0 when
# every run of every binary passed, 1 when any test failed (or a run timed out or crashed),
# 2 on bad usage or a failed build. The tests need what scripts/test.sh installs (Redis) and,
# for the Kubernetes suites, the apiserver `e2e/scripts/kube-testenv.sh build` caches.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

runs=3 load=0 timeout=1800 out=""
targets=() args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="${2:?--runs needs a count}"; shift 2 ;;
    --runs=*) runs="${1#*=}"; shift ;;
    --load) load=1; shift ;;
    --timeout) timeout="${2:?--timeout needs seconds}"; shift 2 ;;
    --timeout=*) timeout="${1#*=}"; shift ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --out=*) out="${1#*=}"; shift ;;
    -h|--help) usage ;;
    --) shift; args=("$@"); break ;;
    -*) echo "flake-hunt: unknown option $1" >&2; usage ;;
    *) targets+=("$1"); shift ;;
  esac
done
case "$runs" in ''|*[!0-9]*|0) echo "flake-hunt: --runs must be a positive integer, not '$runs'" >&2; exit 2 ;; esac
case "$timeout" in ''|*[!0-9]*|0) echo "flake-hunt: --timeout must be a positive number of seconds, not '$timeout'" >&2; exit 2 ;; esac
[ ${#targets[@]} -gt 0 ] || { echo "flake-hunt: name at least one test target" >&2; usage; }
for t in "${targets[@]}"; do
  [ -f "tests/$t.rs" ] || { echo "flake-hunt: no test target '$t' (tests/$t.rs)" >&2; exit 2; }
done
out="${out:-$(mktemp -d /tmp/flake-hunt.XXXXXX)}"
mkdir -p "$out"

# What is under test: the commit, and whether the work tree differed from it, at build time.
built_from="$(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' with uncommitted changes')"

# Build once; cargo names each test executable on stderr.
echo "== building ${targets[*]} (all features)"
build_log="$out/build.log"
test_flags=()
for t in "${targets[@]}"; do test_flags+=(--test "$t"); done
if ! cargo test --all-features --no-run "${test_flags[@]}" >"$build_log" 2>&1; then
  tail -n 40 "$build_log" >&2
  echo "flake-hunt: build failed (log: $build_log)" >&2
  exit 2
fi
declare -A exe
while IFS= read -r line; do
  # "  Executable tests/cli.rs (/target/debug/deps/cli-0123abcd)"
  if [[ "$line" =~ Executable\ tests/([A-Za-z0-9_]+)\.rs\ \((.*)\)$ ]]; then
    exe[${BASH_REMATCH[1]}]="${BASH_REMATCH[2]}"
  fi
done <"$build_log"
for t in "${targets[@]}"; do
  [ -x "${exe[$t]:-}" ] || { echo "flake-hunt: cargo named no executable for '$t' (log: $build_log)" >&2; exit 2; }
done

# The load: one busy loop per core, each in its own process group, ended by pid on exit.
loaders=()
stop_load() {
  for pid in "${loaders[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${loaders[@]}"; do wait "$pid" 2>/dev/null || true; done
  loaders=()
}
trap stop_load EXIT
trap 'exit 130' INT TERM
cores=$(nproc)
if [ "$load" = 1 ]; then
  for _ in $(seq "$cores"); do
    sh -c 'while :; do :; done' &
    loaders+=("$!")
  done
fi

# From one run's output: "NAME<TAB>first lines of its message" per failed test. The message
# is the panic line and the three lines after it (what libtest prints under "---- NAME stdout
# ----"), or the section's first four lines when nothing panicked.
failures_of() {
  awk '
    /^---- .* stdout ----$/ { flush(); name = $2; n = 0; from = 0; skip = 0; next }
    /^failures:$/ && name != "" { flush(); name = ""; next }
    name != "" {
      if ($0 ~ /^stack backtrace:$/) skip = 1
      if (skip || $0 ~ /^note: run with `RUST_BACKTRACE/ || $0 == "") next
      lines[++n] = $0
      if (!from && $0 ~ /panicked at /) from = n
    }
    function flush(   i, s, first) {
      if (name == "") return
      first = from ? from : 1
      s = ""
      for (i = first; i <= n && i < first + 4; i++) s = s (s == "" ? "" : " | ") lines[i]
      printf "%s\t%s\n", name, s
    }
    END { flush() }
  ' "$1"
}

summary="$out/summary.txt"
failed_tsv="$out/failures.tsv"
: >"$failed_tsv"
table=()
started=$(date +%s)
echo "== $runs run(s) of each of ${targets[*]}; load: $([ "$load" = 1 ] && echo "$cores busy loop(s)" || echo none); logs in $out"
for t in "${targets[@]}"; do
  passed_runs=0 failed_runs=0 tests_run=""
  for i in $(seq "$runs"); do
    log="$out/$t.$i.log"
    t0=$(date +%s)
    rc=0
    timeout --kill-after=30 "$timeout" "${exe[$t]}" "${args[@]}" >"$log" 2>&1 || rc=$?
    took=$(( $(date +%s) - t0 ))
    result=$(grep -E '^test result: ' "$log" | tail -n 1 || true)
    counts=$(sed -nE 's/^test result: [A-Za-z]+\. ([0-9]+) passed; ([0-9]+) failed.*/\1 passed, \2 failed/p' <<<"$result")
    failures_of "$log" | while IFS=$'\t' read -r name msg; do
      printf '%s::%s\t%s\t%s\n' "$t" "$name" "$i" "$msg" >>"$failed_tsv"
    done
    # A run with no failed test that still did not pass: timed out, crashed or never reported.
    named=$(awk -F'\t' -v r="$i" -v p="$t::" '$2 == r && index($1, p) == 1' "$failed_tsv" | wc -l)
    if [ "$rc" -ne 0 ] && [ "$named" -eq 0 ]; then
      case "$rc" in
        124|137) why="timed out after ${timeout}s; running then: $(sed -nE 's/^test (.*) has been running for over .*/\1/p' "$log" | sort -u | tr '\n' ' ')" ;;
        *) why="exited $rc without naming a failed test: $(tail -n 3 "$log" | tr '\n' ' ')" ;;
      esac
      printf '%s::(the binary)\t%s\t%s\n' "$t" "$i" "$why" >>"$failed_tsv"
    fi
    if [ "$rc" -eq 0 ]; then passed_runs=$((passed_runs + 1)); else failed_runs=$((failed_runs + 1)); fi
    printf '   %-16s run %d/%d: %s in %ds (%s)\n' "$t" "$i" "$runs" \
      "$([ "$rc" -eq 0 ] && echo ok || echo "FAILED rc=$rc")" "$took" "${counts:-no result line}"
    if [[ "$counts" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
      tests_run=$((BASH_REMATCH[1] + BASH_REMATCH[2]))
    fi
  done
  table+=("$(printf '%-16s %5s %5d %5d %6s' "$t" "$runs" "$passed_runs" "$failed_runs" "${tests_run:-?}")")
done
elapsed=$(( $(date +%s) - started ))
stop_load

{
  echo "flake hunt: ${targets[*]} × $runs run(s), load: $([ "$load" = 1 ] && echo "$cores busy loop(s) on $cores core(s)" || echo none), $(date -u +%Y-%m-%dT%H:%M:%SZ), ${elapsed}s, built from $built_from"
  echo
  printf '%-16s %5s %5s %5s %6s\n' target runs ok fail tests
  printf '%s\n' "${table[@]}"
  echo
  if [ -s "$failed_tsv" ]; then
    echo "failed at least once:"
    # Per test: how many runs it failed, then each failing run's message.
    cut -f1 "$failed_tsv" | sort | uniq -c | sort -rn | while read -r count name; do
      echo "  $name — failed $count of $runs run(s)"
      awk -F'\t' -v n="$name" -v out="$out" '$1 == n {
        split(n, t, "::"); m = $3; gsub(/ \| /, "\n        ", m)
        printf "      run %s (%s/%s.%s.log):\n        %s\n", $2, out, t[1], $2, m
      }' "$failed_tsv"
    done
  else
    echo "no test failed."
  fi
} | tee "$summary"
echo "(summary: $summary)"
[ ! -s "$failed_tsv" ]
