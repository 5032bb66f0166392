//! tenure-sim: deterministic simulation of tenure's real lock runtime, `LeaderElector` and
//! `ShardedElector` under seeded faults, with a checker over each run's history.
//!
//! `scripts/sim.sh --seeds N [--replicas R --shards S]` runs it; every failing seed prints
//! the one command that replays it. See docs/evidence.md.

#[cfg(not(tokio_unstable))]
compile_error!(
    "tenure-sim needs `--cfg tokio_unstable` (sim/.cargo/config.toml sets it) to seed tokio's own randomness"
);

mod link;
mod rng;
mod scenario;
mod world;

use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Instant;

use scenario::{Outcome, Params, excuse_name, is_violation};

const USAGE: &str =
    "usage: tenure-sim [--seeds N] [--first-seed S | --seed S] [--replicas R] [--shards S]
                  [--chaos-secs T] [--no-faults] [--no-nemeses] [--drift-beyond] [--stubborn P]
                  [--check-determinism] [--fail-fast]
                  [--trace] [--jobs J] [--table]
  --seeds N            run seeds S..S+N (default 1)
  --seed S             run this one seed (same as --first-seed S --seeds 1)
  --replicas R         replicas at the start (default 5)
  --shards S           0: one lease (LeaderElector); >0: a sharded group (default: 0 for even
                       seeds, 12 for odd ones)
  --chaos-secs T       virtual seconds of faults before the quiet phase (default 120)
  --no-faults          no faults: only the quiet phase's join, leave and kill
  --no-nemeses         random faults only, no targeted ones (nemeses)
  --drift-beyond       some replica clocks run slower than the drift allowance covers
  --stubborn P         share of terms whose workload ignores cancellation (default 0.5)
  --check-determinism  run every seed twice and compare the histories
  --trace              print the history of every seed
  --jobs J             seeds run on J threads (default: the machine's cores)
  --table              print one line of figures per seed
  --fail-fast          stop at the first seed with a violation (seeds after it are not run)";

struct Args {
    seeds: u64,
    first: u64,
    replicas: usize,
    shards: Option<u32>,
    chaos_secs: u64,
    faults: bool,
    drift_beyond: bool,
    determinism: bool,
    trace: bool,
    jobs: usize,
    table: bool,
    stubborn: f64,
    nemeses: bool,
    fail_fast: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        seeds: 1,
        first: 1,
        replicas: 5,
        shards: None,
        chaos_secs: 120,
        faults: true,
        drift_beyond: false,
        determinism: false,
        trace: false,
        jobs: std::thread::available_parallelism().map_or(1, usize::from),
        table: false,
        stubborn: 0.5,
        nemeses: true,
        fail_fast: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        fn num<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, String> {
            v.parse()
                .map_err(|_| format!("{name}: {v:?} is not a number"))
        }
        match flag.as_str() {
            "--seeds" => a.seeds = num("--seeds", &value("--seeds")?)?,
            "--first-seed" => a.first = num("--first-seed", &value("--first-seed")?)?,
            "--seed" => {
                a.first = num("--seed", &value("--seed")?)?;
                a.seeds = 1;
            }
            "--replicas" => a.replicas = num("--replicas", &value("--replicas")?)?,
            "--shards" => a.shards = Some(num("--shards", &value("--shards")?)?),
            "--chaos-secs" => a.chaos_secs = num("--chaos-secs", &value("--chaos-secs")?)?,
            "--jobs" => a.jobs = num::<usize>("--jobs", &value("--jobs")?)?.max(1),
            "--stubborn" => a.stubborn = num("--stubborn", &value("--stubborn")?)?,
            "--no-faults" => a.faults = false,
            "--no-nemeses" => a.nemeses = false,
            "--fail-fast" => a.fail_fast = true,
            "--drift-beyond" => a.drift_beyond = true,
            "--check-determinism" => a.determinism = true,
            "--trace" => a.trace = true,
            "--table" => a.table = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if !(0.0..=1.0).contains(&a.stubborn) {
        return Err("--stubborn must be in [0, 1]".into());
    }
    if a.replicas == 0 {
        return Err("--replicas must be at least 1".into());
    }
    Ok(a)
}

/// Peak resident memory of this process, in KiB.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("tenure-sim: {e}");
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let began = Instant::now();
    let params = |seed: u64| Params {
        seed,
        replicas: args.replicas,
        shards: args.shards.unwrap_or(if seed % 2 == 1 { 12 } else { 0 }),
        chaos_secs: args.chaos_secs,
        faults: args.faults,
        drift_beyond: args.drift_beyond,
        keep_lines: args.trace || args.determinism || args.seeds <= 1,
        stubborn: args.stubborn,
        nemeses: args.nemeses,
    };
    let seeds: Vec<u64> = (args.first..args.first.saturating_add(args.seeds)).collect();
    let queue = Mutex::new(seeds.clone().into_iter());
    let results: Mutex<Vec<(Outcome, Option<Outcome>)>> = Mutex::new(Vec::new());
    let rss_before = peak_rss_kib();
    let failed = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..args.jobs.min(seeds.len()).max(1) {
            s.spawn(|| {
                loop {
                    if args.fail_fast && failed.load(std::sync::atomic::Ordering::Relaxed) {
                        return;
                    }
                    let Some(seed) = world::lock(&queue).next() else {
                        return;
                    };
                    let p = params(seed);
                    let first = scenario::run(&p);
                    // The second run keeps the other choice of lines: keeping them must not
                    // change the history either.
                    let second = args.determinism.then(|| {
                        scenario::run(&Params {
                            keep_lines: !p.keep_lines,
                            ..p.clone()
                        })
                    });
                    if first.findings.iter().any(is_violation)
                        || second
                            .as_ref()
                            .is_some_and(|b| b.fingerprint != first.fingerprint)
                    {
                        failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    world::lock(&results).push((first, second));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results.sort_by_key(|(o, _)| o.params.seed);

    let (mut violations, mut faults, mut events, mut excused) = (0u64, 0u64, 0u64, Vec::new());
    let mut nemeses = [0u64; scenario::NEMESES.len()];
    let mut writes = (0u64, 0u64, 0u64, 0u64);
    let mut health_moves = 0u64;
    let (mut terms, mut term_tasks, mut escaped) = (0u64, 0u64, 0u64);
    let mut dropped = (0u64, 0u64);
    for (o, again) in &results {
        faults += o.faults;
        terms += o.terms;
        term_tasks += o.term_tasks;
        escaped += o.escaped_tasks;
        dropped.0 += o.runs_dropped.0;
        dropped.1 += o.runs_dropped.1;
        health_moves += o.health_moves;
        events += o.fingerprint.1;
        for (_, name, _) in &o.nemeses {
            if let Some(i) = scenario::NEMESES.iter().position(|n| n == name) {
                nemeses[i] += 1;
            }
        }
        writes.0 += o.writes.0;
        writes.1 += o.writes.1;
        writes.2 += o.writes.2;
        writes.3 += o.writes.3;
        if args.trace {
            for line in &o.lines {
                println!("{line}");
            }
        }
        if args.table {
            let f = &o.figures;
            println!(
                "seed {:>6} replicas {:>5} shards {:>6} terms {:>7} faults {:>4} join {:>7} s ({} moves) leave {:>7} s ({} moves) kill {:>7} s ({} moves) store calls/s {:>9.1} resize +4 {:>7} s",
                o.params.seed,
                o.params.replicas,
                o.params.shards,
                o.terms,
                o.faults,
                fmt_secs(f.balanced_after_join),
                f.moves_join,
                fmt_secs(f.balanced_after_leave),
                f.moves_leave,
                fmt_secs(f.balanced_after_kill),
                f.moves_kill,
                f.store_calls_per_sec,
                fmt_secs(f.resized_after)
            );
        }
        let mut bad: Vec<&world::Finding> = o.findings.iter().filter(|f| is_violation(f)).collect();
        let nondeterministic = again.as_ref().and_then(|b| {
            (b.fingerprint != o.fingerprint).then(|| {
                format!(
                    "two runs of the seed differ: {} events hashed {:016x} vs {} hashed {:016x}",
                    o.fingerprint.1, o.fingerprint.0, b.fingerprint.1, b.fingerprint.0
                )
            })
        });
        let nd_finding;
        if let Some(diff) = nondeterministic {
            nd_finding = world::Finding {
                at_ms: 0,
                lease: "-".into(),
                kind: world::Kind::Nondeterministic,
                excuse: None,
                detail: diff,
            };
            bad.push(&nd_finding);
        }
        excused.extend(o.findings.iter().filter_map(|f| f.excuse));
        if bad.is_empty() {
            continue;
        }
        violations += bad.len() as u64;
        println!("VIOLATION seed {} ({} findings):", o.params.seed, bad.len());
        for f in bad.iter().take(5) {
            println!("  {:?} {} at {} ms: {}", f.kind, f.lease, f.at_ms, f.detail);
        }
        if let Some(f) = bad.first() {
            let from = f.at_ms.saturating_sub(40_000);
            let holders: Vec<&str> = f
                .detail
                .split_whitespace()
                .filter(|w| w.contains('#') && w.starts_with(['r', '(']))
                .map(|w| w.trim_matches(|c: char| c == '(' || c == ')' || c == ','))
                .collect();
            let trimmed: Vec<&String> = o
                .lines
                .iter()
                .filter(|l| {
                    let t: u64 = l
                        .split_whitespace()
                        .next()
                        .and_then(|t| t.parse().ok())
                        .unwrap_or(0);
                    t >= from
                        && t <= f.at_ms + 1
                        && (l.contains(&format!(" {} ", f.lease))
                            || l.contains("fault")
                            || l.contains("FINDING")
                            || holders.iter().any(|h| l.contains(h)))
                })
                .collect();
            if trimmed.is_empty() {
                println!("  (rerun with --trace for the history)");
            } else {
                println!(
                    "  the history around it ({} of {} events):",
                    trimmed.len(),
                    o.lines.len()
                );
                for l in trimmed.iter().rev().take(60).rev() {
                    println!("    {l}");
                }
            }
        }
        let nemesis = bad.first().and_then(|f| nearest_nemesis(o, f));
        match nemesis {
            Some((at, name, lease)) => println!(
                "  replay: {}   # nemesis {name} at {at} ms ({lease})",
                o.params.replay()
            ),
            None => println!(
                "  replay: {}   # no nemesis in the {} ms before it (random faults)",
                o.params.replay(),
                NEMESIS_WINDOW_LEASES * o.lease_ms
            ),
        }
    }
    let data_loss = excused
        .iter()
        .filter(|e| **e == world::Excuse::DataLoss)
        .count();
    let beyond = excused
        .iter()
        .filter(|e| **e == world::Excuse::BeyondDriftBound)
        .count();
    let rss = peak_rss_kib().saturating_sub(rss_before);
    let nemeses: Vec<String> = scenario::NEMESES
        .iter()
        .zip(nemeses)
        .map(|(n, c)| format!("{n} {c}"))
        .collect();
    println!(
        "sim: seeds {}, faults injected {faults}, histories checked {} ({events} events), violations {violations}; \
         expected overlaps: {data_loss} {}, {beyond} {}; fenced writes: {} issued, {} accepted, {} refused \
         ({} of them a plain store would have taken late); terms {terms} ({term_tasks} term tasks, {escaped} escaped tasks); runs dropped {} ({} releases owed); health step-downs {health_moves}; nemeses: {}; peak memory +{} KiB; {:.1} s",
        results.len(),
        results.len() * if args.determinism { 2 } else { 1 },
        excuse_name(world::Excuse::DataLoss),
        excuse_name(world::Excuse::BeyondDriftBound),
        writes.0,
        writes.1,
        writes.2,
        writes.3,
        dropped.0,
        dropped.1,
        if args.nemeses {
            nemeses.join(", ")
        } else {
            "off".into()
        },
        rss,
        began.elapsed().as_secs_f64()
    );
    if violations > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// How far back (in leases) a nemesis counts as the one that led to a violation.
const NEMESIS_WINDOW_LEASES: u64 = 3;

/// The latest nemesis before `f`, within a few leases: on its lease if one was, else any.
fn nearest_nemesis<'a>(o: &'a Outcome, f: &world::Finding) -> Option<(u64, &'static str, &'a str)> {
    let from = f.at_ms.saturating_sub(NEMESIS_WINDOW_LEASES * o.lease_ms);
    let window = || {
        o.nemeses
            .iter()
            .rev()
            .filter(move |(at, _, _)| *at <= f.at_ms && *at >= from)
    };
    window()
        .find(|(_, _, lease)| *lease == f.lease)
        .or_else(|| window().next())
        .map(|(at, name, lease)| (*at, *name, lease.as_str()))
}

fn fmt_secs(s: Option<f64>) -> String {
    s.map_or_else(|| "never".into(), |s| format!("{s:.2}"))
}

#[cfg(test)]
mod tests {
    use super::scenario::{Params, run};

    fn params(seed: u64, shards: u32) -> Params {
        Params {
            seed,
            replicas: 4,
            shards,
            chaos_secs: 40,
            faults: true,
            drift_beyond: false,
            keep_lines: true,
            stubborn: 0.5,
            nemeses: true,
        }
    }

    /// One seed, one history, byte for byte — for one lease and for a sharded group — and
    /// another seed another history.
    #[test]
    fn a_seed_replays_its_history_byte_for_byte() {
        for shards in [0, 8] {
            let (a, b) = (run(&params(7, shards)), run(&params(7, shards)));
            assert!(
                a.lines.len() > 50,
                "a real history: {} events",
                a.lines.len()
            );
            assert!(a.faults > 0, "faults were injected");
            assert!(a.term_tasks > 0, "terms spawned tasks");
            assert!(a.escaped_tasks > 0, "terms handed to escaped tasks");
            assert_eq!(
                a.lines, b.lines,
                "shards {shards}: two runs of seed 7 differ"
            );
            assert_eq!(a.fingerprint, b.fingerprint);
            let other = run(&params(8, shards));
            assert_ne!(
                a.fingerprint, other.fingerprint,
                "seed 8 ran seed 7's history"
            );
        }
    }

    /// Whether the lines are kept changes nothing that runs.
    #[test]
    fn keeping_the_lines_does_not_change_the_history() {
        let kept = run(&params(11, 8));
        let hashed = run(&Params {
            keep_lines: false,
            ..params(11, 8)
        });
        assert!(hashed.lines.is_empty());
        assert_eq!(kept.fingerprint, hashed.fingerprint);
    }
}
