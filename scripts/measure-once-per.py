#!/usr/bin/env python3
"""Measures `tenure run --once-per` and `--try` on a real store (issue 44's figures).

    scripts/measure-once-per.py TENURE_BINARY BACKEND_ARGS... [-- PERIODS]

e.g. `scripts/measure-once-per.py target/debug/tenure --backend redis://127.0.0.1:6379/`,
`... --state-dir /tmp/m` (local), or `KUBECONFIG=DIR/admin.kubeconfig ... --backend kube
--namespace NS` (a kube-apiserver started by `e2e/scripts/kube-testenv.sh start DIR`; NS must
exist). Figures: docs/measured.md.

Once per period: two replicas, each running `tenure run --once-per 2s` in a loop (as two
hosts' crons would, back to back), for PERIODS (default 24) periods of 2 s. The job logs its
start and end; every third job started kills its own tenure with kill -9 a moment into the
run (the runner dies mid-run; the job dies with it). Prints, per period, the runs started,
killed, completed (the job ended and tenure exited 0: the completion is recorded), and the
exits 7 (already done); the goal is exactly one completed run per period.

--try: with the lease held by a third copy, 20 runs of `tenure run --try`: wall time to exit
(code 6), min / median / max.
"""

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

FAST = ["--lease-duration", "600ms", "--renew-deadline", "400ms", "--retry-period", "100ms"]
PERIOD_S = 2


def main():
    args = sys.argv[1:]
    periods = 24
    if "--" in args:
        i = args.index("--")
        periods = int(args[i + 1])
        args = args[:i]
    tenure, backend = args[0], args[1:]
    work = tempfile.mkdtemp(prefix="once-per-")
    log = os.path.join(work, "log")
    counter = os.path.join(work, "counter")
    with open(counter, "w") as f:
        f.write("0")
    lease = f"m{os.getpid()}"
    # The job: count the start (under flock); every third one kills its tenure ($PPID) 100 ms in.
    job = f"""
exec 9>>{counter}.lock; flock 9; n=$(( $(cat {counter}) + 1 )); echo $n > {counter}; exec 9>&-
echo "$RUN start $TENURE_PERIOD_START $n" >> {log}
if [ $((n % 3)) = 0 ]; then sleep 0.1; echo "$RUN kill $TENURE_PERIOD_START $n" >> {log}; kill -9 $PPID; sleep 5; fi
sleep 0.2
echo "$RUN end $TENURE_PERIOD_START $n" >> {log}
"""
    # Start at a period boundary, measure whole periods.
    now = time.time()
    start = (int(now) // PERIOD_S + 1) * PERIOD_S
    time.sleep(start - now)
    stop_at = start + periods * PERIOD_S
    exits = {}
    lock = threading.Lock()

    def replica(name):
        i = 0
        while time.time() < stop_at:
            i += 1
            run = f"{name}-{i}"
            env = dict(os.environ, RUN=run, TENURE_LOG="warn")
            code = subprocess.call(
                [tenure, "run", "--lease", lease, *backend, *FAST, "--identity", name,
                 "--once-per", f"{PERIOD_S}s", "--", "sh", "-c", job],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with lock:
                exits[run] = code
            if code != 0:
                # A cron-like pause after "done" or a failure (not after a completion: the
                # next run would find it done anyway).
                time.sleep(0.05)

    threads = [threading.Thread(target=replica, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    per = {}
    with open(log) as f:
        lines = [line.split() for line in f]
    ends = {l[0] for l in lines if l[1] == "end"}
    for run, kind, period, _n in lines:
        p = per.setdefault(period, {"started": 0, "killed": 0, "completed": 0})
        if kind == "start":
            p["started"] += 1
            if run in ends and exits.get(run) == 0:
                p["completed"] += 1
        elif kind == "kill":
            p["killed"] += 1
    done_exits = sum(1 for c in exits.values() if c == 7)
    other = sorted({c for c in exits.values() if c not in (0, 7, -9)})
    # The measured periods only (a run begun just before the end may fall in the next).
    window = [time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
              for t in range(start, stop_at, PERIOD_S)]
    empty = {"started": 0, "killed": 0, "completed": 0}
    print(f"{'period start':<22} started killed completed")
    for period in window:
        p = per.get(period, empty)
        print(f"{period:<22} {p['started']:>7} {p['killed']:>6} {p['completed']:>9}")
    completed = [per.get(p, empty)["completed"] for p in window]
    covered = sum(1 for p in window if p in per)
    print(f"periods with a run: {covered} of {periods}; completed runs per period: "
          f"exactly 1 in {completed.count(1)}, 0 in {completed.count(0)}, "
          f">1 in {sum(1 for c in completed if c > 1)}; runs killed: "
          f"{sum(per.get(p, empty)['killed'] for p in window)}; exits 7 (done already): {done_exits}; "
          f"other exit codes: {other or 'none'}")

    # --try with the lease held elsewhere.
    holder = subprocess.Popen(
        [tenure, "run", "--lease", lease + "-try", *backend, "--", "sleep", "600"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)
    times, codes = [], set()
    for _ in range(20):
        t0 = time.monotonic()
        codes.add(subprocess.call(
            [tenure, "run", "--lease", lease + "-try", *backend, "--try", "--", "true"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        times.append((time.monotonic() - t0) * 1000)
    holder.terminate()
    holder.wait()
    print(f"--try with the lease held elsewhere: exit codes {sorted(codes)}; wall time "
          f"min {min(times):.1f} ms, median {statistics.median(times):.1f} ms, "
          f"max {max(times):.1f} ms (20 runs, process start included)")


if __name__ == "__main__":
    main()
