//! Sharded leadership end to end, with separate processes, shared by the Kubernetes and Redis
//! suites: 32 shards over 3 → 5 → 2 → 3 replicas and a kill -9. Each shard's workload writes
//! its token to its own fenced register (a file) every 50 ms without checking its term; the
//! scenario counts accepted stale writes (goal 0), checks the balance once the group settles,
//! and returns how long each rebalance took.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use tenure::Locker;
use tenure::shard::ShardedElector;

use crate::safety;

pub const SHARDS: u32 = 32;

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
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    loop {
        let r = running(dir, dead);
        let mut loads: BTreeMap<&str, usize> = live.iter().map(|l| (l.as_str(), 0)).collect();
        let mut ok = r.len() == SHARDS as usize;
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
pub async fn candidate(backend: impl tenure::Backend, identity: &str, dir: &Path) {
    let dir = dir.to_owned();
    let locker = Locker::with_identity(backend, identity).expect("identity");
    let elector =
        ShardedElector::new(locker, "workers", SHARDS, safety::config()).expect("elector");
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
                        &format!("START {shard} {} {who} {}", token.get(), safety::mono_ns()),
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
                        &format!("STOP {shard} {} {who} {}", token.get(), safety::mono_ns()),
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
