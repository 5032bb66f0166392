//! Sharded leadership end to end, with separate processes, shared by the Kubernetes and Redis
//! suites: 32 shards over 3 → 5 → 2 → 3 replicas and a kill -9. Each shard's workload writes
//! its token to its own fenced register (a file) every 50 ms without checking its term; the
//! scenario counts accepted stale writes (goal 0), checks the balance once the group settles,
//! and returns how long each rebalance took. A second scenario changes the shard count in a
//! rolling update and checks from the log that workloads of two counts never overlapped.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use tenure::Locker;
use tenure::shard::ShardedElector;

use crate::safety;

pub const SHARDS: u32 = 32;
/// The environment variable a candidate reads its shard count from.
pub const COUNT: &str = "TENURE_SHARD_COUNT";

pub fn note(log: &Path, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log");
    // One write per line: whole lines only, whoever is killed.
    f.write_all(format!("{line}\n").as_bytes())
        .expect("write log");
}

/// The terms running now per shard, from the log: (identity, token) of each START without
/// its STOP. A killed process's terms are ended by `dead`.
pub fn running(dir: &Path, dead: &[String]) -> BTreeMap<u32, Vec<(String, u64)>> {
    let text = std::fs::read_to_string(dir.join("events.log")).unwrap_or_default();
    let mut open: BTreeMap<(u32, u64), String> = BTreeMap::new();
    for line in text.lines() {
        let p: Vec<&str> = line.split(' ').collect();
        if p.len() < 5 {
            continue;
        }
        let (Ok(shard), Ok(token)) = (p[1].parse::<u32>(), p[2].parse::<u64>()) else {
            continue;
        };
        match p[0] {
            "START" => {
                open.insert((shard, token), p[3].to_owned());
            }
            "STOP" => {
                open.remove(&(shard, token));
            }
            _ => {}
        }
    }
    let mut by_shard: BTreeMap<u32, Vec<(String, u64)>> = BTreeMap::new();
    for ((shard, token), who) in open {
        if !dead.contains(&who) {
            by_shard.entry(shard).or_default().push((who, token));
        }
    }
    by_shard
}

/// Waits until every shard runs exactly one term, spread within ±1 over exactly `live`;
/// returns how long that took.
pub fn wait_balanced(dir: &Path, live: &[String], dead: &[String], what: &str) -> Duration {
    wait_balanced_over(dir, live, dead, what, SHARDS)
}

/// [`wait_balanced`] for a group of `shards`.
pub fn wait_balanced_over(
    dir: &Path,
    live: &[String],
    dead: &[String],
    what: &str,
    shards: u32,
) -> Duration {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    loop {
        let r = running(dir, dead);
        let mut loads: BTreeMap<&str, usize> = live.iter().map(|l| (l.as_str(), 0)).collect();
        let mut ok = r.len() == shards as usize;
        for terms in r.values() {
            ok &= terms.len() == 1;
            for (who, _) in terms {
                match loads.get_mut(who.as_str()) {
                    Some(n) => *n += 1,
                    None => ok = false,
                }
            }
        }
        let (min, max) = (
            loads.values().min().copied().unwrap_or(0),
            loads.values().max().copied().unwrap_or(0),
        );
        if ok && max - min <= 1 {
            return started.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "{what}: never balanced over {live:?}: loads {loads:?}, shards {r:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Accepted writes with a token below one a later term of the same shard had already been
/// granted at the time of the write (by the register's log and the START lines).
pub fn stale_accepted(dir: &Path) -> usize {
    let text = std::fs::read_to_string(dir.join("events.log")).unwrap_or_default();
    let mut starts: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
    for line in text.lines() {
        let p: Vec<&str> = line.split(' ').collect();
        if p.first() == Some(&"START")
            && p.len() >= 5
            && let (Ok(s), Ok(t), Ok(at)) = (p[1].parse(), p[2].parse(), p[4].parse())
        {
            starts.entry(s).or_default().push((t, at));
        }
    }
    let mut stale = 0;
    for shard in 0..SHARDS {
        let log =
            std::fs::read_to_string(dir.join(format!("shard-{shard}/log"))).unwrap_or_default();
        for line in log.lines() {
            let p: Vec<&str> = line.split_whitespace().collect();
            let (Some(&"accepted"), Some(Ok(token)), Some(Ok(at))) = (
                p.first(),
                p.get(1).map(|t| t.parse::<u64>()),
                p.get(2).map(|t| t.parse::<u64>()),
            ) else {
                continue;
            };
            let newer_granted = starts
                .get(&shard)
                .is_some_and(|s| s.iter().any(|(t, started)| *t > token && *started < at));
            if newer_granted {
                stale += 1;
            }
        }
    }
    stale
}

/// The candidate process's work: a sharded elector on `backend` whose workload writes each
/// shard's token to the shard's register until its term ends. SIGTERM leaves the group
/// gracefully.
/// The shard count comes from `TENURE_SHARD_COUNT` (default [`SHARDS`]); the timings from
/// `config` (the suite's store decides how short they can be).
pub async fn candidate(
    backend: impl tenure::Backend,
    identity: &str,
    dir: &Path,
    config: tenure::ElectionConfig,
) {
    let dir = dir.to_owned();
    let shards: u32 = std::env::var(COUNT)
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(SHARDS);
    let locker = Locker::with_identity(backend, identity).expect("identity");
    let elector = ShardedElector::new(locker, "workers", shards, config).expect("elector");
    let mut sigterm =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("sigterm");
    let log = dir.join("events.log");
    let exit_log = log.clone();
    let who = identity.to_owned();
    let result = elector
        .run_until(
            async {
                sigterm.recv().await;
            },
            move |shard, term| {
                let (dir, log, who) = (dir.clone(), log.clone(), who.clone());
                async move {
                    let token = term.fencing_token();
                    let register = safety::Register::at(&dir.join(format!("shard-{shard}")));
                    note(
                        &log,
                        &format!(
                            "START {shard} {} {who} {} {shards}",
                            token.get(),
                            safety::mono_ns()
                        ),
                    );
                    loop {
                        register.write(token, &who);
                        tokio::select! {
                            () = term.cancellation().cancelled() => break,
                            () = tokio::time::sleep(Duration::from_millis(50)) => {}
                        }
                    }
                    note(
                        &log,
                        &format!(
                            "STOP {shard} {} {who} {} {shards}",
                            token.get(),
                            safety::mono_ns()
                        ),
                    );
                }
            },
        )
        .await;
    note(&exit_log, &format!("EXIT {identity} {result:?}"));
}

/// A directory with one fresh register per shard, for the candidates' `CHILD_DIR`.
pub fn registers(dir: &Path) {
    for shard in 0..SHARDS {
        let d = dir.join(format!("shard-{shard}"));
        std::fs::create_dir_all(&d).expect("shard dir");
        safety::Register::new(&d);
    }
}

/// 3 → 5 → 2 → 3 replicas and a kill -9 of candidates spawned by re-running `test` with
/// `env`: waits for the balance after each step, checks that no stale write was accepted,
/// and returns the rebalance times.
pub fn scenario(test: &str, env: &[(&str, String)], dir: &Path) -> Vec<(&'static str, Duration)> {
    let spawn = |id: &str| safety::Candidate::spawn(test, env, id);
    let mut procs: BTreeMap<String, safety::Candidate> = BTreeMap::new();
    let mut dead: Vec<String> = Vec::new();
    let mut times = Vec::new();
    for id in ["r0", "r1", "r2"] {
        procs.insert(id.into(), spawn(id));
    }
    let live = |p: &BTreeMap<String, safety::Candidate>| p.keys().cloned().collect::<Vec<_>>();
    times.push((
        "start, 3 replicas",
        wait_balanced(dir, &live(&procs), &dead, "3"),
    ));
    for id in ["r3", "r4"] {
        procs.insert(id.into(), spawn(id));
    }
    times.push((
        "two joins, 5",
        wait_balanced(dir, &live(&procs), &dead, "5"),
    ));
    let mut leaving = Vec::new();
    for id in ["r0", "r1", "r2"] {
        if let Some(p) = procs.remove(id) {
            p.signal("TERM");
            leaving.push(p);
        }
    }
    times.push((
        "three graceful leaves, 2",
        wait_balanced(dir, &live(&procs), &dead, "2"),
    ));
    for mut p in leaving {
        assert!(
            p.exited_within(Duration::from_secs(30)),
            "{} did not exit after SIGTERM",
            p.identity
        );
    }
    procs.insert("r5".into(), spawn("r5"));
    times.push((
        "a join, 3",
        wait_balanced(dir, &live(&procs), &dead, "3 again"),
    ));
    if let Some(p) = procs.remove("r3") {
        p.signal("KILL");
        dead.push("r3".into());
    }
    times.push((
        "kill -9, 2",
        wait_balanced(dir, &live(&procs), &dead, "after the kill"),
    ));
    drop(procs);
    let stale = stale_accepted(dir);
    assert_eq!(stale, 0, "stale writes were accepted");
    times
}

/// Workload STARTs of one count while a workload of another count had started and not
/// stopped, by the log's monotonic times (one clock for all processes on this machine).
/// `dead` processes' terms never STOP; they are left out.
pub fn overlaps_across_counts(dir: &Path, dead: &[String]) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("events.log")).unwrap_or_default();
    let mut events: Vec<(u64, bool, u32, u32, u64, String)> = Vec::new();
    for line in text.lines() {
        let p: Vec<&str> = line.split(' ').collect();
        if p.len() < 6 || dead.iter().any(|d| d == p[3]) {
            continue;
        }
        let (Ok(shard), Ok(token), Ok(at), Ok(count)) = (
            p[1].parse::<u32>(),
            p[2].parse::<u64>(),
            p[4].parse::<u64>(),
            p[5].parse::<u32>(),
        ) else {
            continue;
        };
        match p[0] {
            "START" => events.push((at, true, count, shard, token, p[3].to_owned())),
            "STOP" => events.push((at, false, count, shard, token, p[3].to_owned())),
            _ => {}
        }
    }
    // At one instant, STOPs go first: a term that ended as another began is no overlap.
    events.sort_by_key(|e| (e.0, e.1));
    let mut open: BTreeMap<(u32, u32, u64), String> = BTreeMap::new();
    let mut overlaps = Vec::new();
    for (at, start, count, shard, token, who) in events {
        if start {
            if let Some(((c, s, t), w)) = open.iter().find(|((c, ..), _)| *c != count) {
                overlaps.push(format!(
                    "{who} started shard {shard} of {count} (token {token}) at {at} while {w} ran shard {s} of {c} (token {t})"
                ));
            }
            open.insert((count, shard, token), who);
        } else {
            open.remove(&(count, shard, token));
        }
    }
    overlaps
}

/// A rolling update from `from` to `to` shards with separate processes: two replicas run
/// `from`; two replicas of `to` join and wait; the old ones leave by SIGTERM, one after the
/// other; the group then runs `to` over the new ones; a replica restarted with `from` waits.
/// No workloads of two counts overlap, no stale write is accepted. Returns how long the
/// change took from the last old replica's SIGTERM to the new count balanced.
pub fn resize_scenario(
    test: &str,
    env: &[(&str, String)],
    dir: &Path,
    from: u32,
    to: u32,
) -> Duration {
    let spawn = |id: &str, count: u32| {
        let mut env = env.to_vec();
        env.push((COUNT, count.to_string()));
        safety::Candidate::spawn(test, &env, id)
    };
    let old: Vec<String> = vec!["a0".into(), "a1".into()];
    let new: Vec<String> = vec!["b0".into(), "b1".into()];
    let mut procs: BTreeMap<String, safety::Candidate> = BTreeMap::new();
    for id in &old {
        procs.insert(id.clone(), spawn(id, from));
    }
    wait_balanced_over(dir, &old, &[], "the old count", from);
    for id in &new {
        procs.insert(id.clone(), spawn(id, to));
    }
    // The new replicas wait while the old count runs.
    std::thread::sleep(Duration::from_secs(3));
    let r = running(dir, &[]);
    assert!(
        r.values().flatten().all(|(who, _)| old.contains(who)),
        "a replica of the new count ran a shard while the old count runs: {r:?}"
    );
    let mut changed = Duration::ZERO;
    for id in &old {
        let mut p = procs.remove(id).expect("spawned");
        let signalled = Instant::now();
        p.signal("TERM");
        assert!(
            p.exited_within(Duration::from_secs(30)),
            "{id} did not exit"
        );
        changed = signalled.elapsed();
    }
    changed += wait_balanced_over(dir, &new, &[], "the new count", to);
    procs.insert("a2".into(), spawn("a2", from));
    std::thread::sleep(Duration::from_secs(3));
    let r = running(dir, &[]);
    assert!(
        r.values().flatten().all(|(who, _)| new.contains(who)),
        "a replica restarted with the old count ran a shard: {r:?}"
    );
    drop(procs);
    assert_eq!(overlaps_across_counts(dir, &[]), Vec::<String>::new());
    assert_eq!(stale_accepted(dir), 0, "stale writes were accepted");
    changed
}
