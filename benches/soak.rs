//! Memory over time: one leading `tenure run` per backend (local, Redis, Kubernetes) renewing
//! fast for a long time, its resident memory sampled from /proc every 10 s. Prints a table per
//! backend — renewals, what they equal at the default lease (one renewal every 5 s), RSS and
//! anonymous RSS at the start, after the warm-up and at the end, and the growth after the
//! warm-up — and writes the samples to `target/bench/soak.json`.
//!
//! Run: `cargo bench --features cli --bench soak` (one hour). Knobs: `TENURE_SOAK_SECS`
//! (3600), `TENURE_SOAK_LEASE_MS` (450: a renewal every 150 ms, 24,000 an hour — 33 hours
//! at the defaults), `TENURE_SOAK_WARMUP_SECS` (600), `TENURE_SOAK_BACKENDS` (`local,redis,kube`).
//! The leaders run with `--rejoin`, so a renewal lost to a busy machine starts a new term
//! instead of ending the run; the table counts terms.

#[path = "support/mod.rs"]
mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use support::env::{knob, knob_list};
use support::kube_harness;
use support::out::{Say, save_json};
use support::proc::{Process, status, status_field, tenure_bin};
use support::redis_harness::RedisServer;
use support::scratch::Scratch;
use support::table;

/// One sample: seconds since the start, VmRSS and RssAnon in KiB.
type Sample = (u64, u64, u64);

fn main() {
    let secs: u64 = knob("TENURE_SOAK_SECS", 3600);
    let lease_ms: u64 = knob("TENURE_SOAK_LEASE_MS", 450);
    let warmup: u64 = knob("TENURE_SOAK_WARMUP_SECS", 600).min(secs / 2);
    let backends = knob_list::<String>("TENURE_SOAK_BACKENDS")
        .unwrap_or_else(|| ["local", "redis", "kube"].map(String::from).to_vec());
    let scratch =
        Scratch::new(std::env::temp_dir().join(format!("tenure-soak-{}", std::process::id())));
    let durations = [
        "--lease-duration".to_owned(),
        format!("{lease_ms}ms"),
        "--renew-deadline".to_owned(),
        format!("{}ms", lease_ms * 2 / 3),
        "--retry-period".to_owned(),
        format!("{}ms", (lease_ms / 7).max(1)),
        "--rejoin".to_owned(),
    ];
    let redis = backends
        .iter()
        .any(|b| b == "redis")
        .then(RedisServer::start);
    let kube = backends
        .iter()
        .any(|b| b == "kube")
        .then(|| kube_harness::Server::start(kube_harness::Launch::default()));
    let mut leaders: Vec<(String, Process, u16)> = Vec::new();
    for (i, backend) in backends.iter().enumerate() {
        let port = kube_harness::free_port();
        let mut cmd = Command::new(tenure_bin());
        cmd.args(["run", "--lease", &format!("soak-{backend}")])
            .args(&durations)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        match backend.as_str() {
            "local" => {
                cmd.args(["--backend", "local", "--state-dir"])
                    .arg(scratch.0.join(format!("state-{i}")));
            }
            "redis" => {
                let url = redis.as_ref().map(RedisServer::url).unwrap_or_default();
                cmd.args(["--backend", &url]);
            }
            "kube" => {
                let server = kube.as_ref().unwrap_or_else(|| panic!("no API server"));
                cmd.args(["--backend", "kube", "--namespace", "default"])
                    .env("KUBECONFIG", server.admin_kubeconfig());
            }
            other => panic!("TENURE_SOAK_BACKENDS: unknown backend {other:?}"),
        }
        cmd.args(["--", "sleep", "1000000"]);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("tenure: {e}"));
        leaders.push((backend.clone(), Process::new(backend, child), port));
    }
    eprintln!(
        "[soak] {} leader(s), lease {lease_ms} ms, {secs} s; sampling every 10 s",
        leaders.len()
    );
    // Past start-up: the first sample is of a leader that has connected and started its command.
    std::thread::sleep(Duration::from_secs(2));
    let started = Instant::now();
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); leaders.len()];
    loop {
        let at = started.elapsed().as_secs();
        for (i, (name, p, _)) in leaders.iter().enumerate() {
            let s = status(p.pid());
            match (status_field(&s, "VmRSS:"), status_field(&s, "RssAnon:")) {
                (Some(rss), Some(anon)) => samples[i].push((at, rss, anon)),
                _ => panic!("[soak] {name}: tenure is gone after {at} s"),
            }
        }
        if at >= secs {
            break;
        }
        std::thread::sleep(Duration::from_secs(10));
    }
    let renewals = secs * 3000 / lease_ms;
    let mut out = Vec::new();
    println!(
        "\nsoak: a leading `tenure run` renewing every {} ms for {secs} s ({renewals} renewals, \
         {:.1} h at the default lease); KiB",
        lease_ms / 3,
        renewals as f64 * 5.0 / 3600.0
    );
    println!(
        "{}",
        table::header(
            &[
                "backend",
                "terms",
                "RSS start",
                &format!("RSS at {warmup} s"),
                "RSS end",
                "anon start",
                &format!("anon at {warmup} s"),
                "anon end",
                "growth after warm-up",
            ],
            8
        )
    );
    for (i, (name, p, port)) in leaders.iter().enumerate() {
        let s = &samples[i];
        let at = |t: u64| {
            s.iter()
                .find(|x| x.0 >= t)
                .or(s.last())
                .copied()
                .unwrap_or_default()
        };
        let (first, warm, last) = (s[0], at(warmup), s[s.len() - 1]);
        let terms = terms(*port);
        println!(
            "{}",
            table::row(&[
                name.clone(),
                terms.map_or("?".into(), |t| t.to_string()),
                first.1.to_string(),
                warm.1.to_string(),
                last.1.to_string(),
                first.2.to_string(),
                warm.2.to_string(),
                last.2.to_string(),
                format!("{:+}", i128::from(last.1) - i128::from(warm.1)),
            ])
        );
        out.push(json!({"backend": name, "terms": terms, "samples": s}));
        p.terminate();
    }
    save_json(
        "soak.json",
        &json!({"secs": secs, "lease_ms": lease_ms, "warmup_secs": warmup, "leaders": out}),
        Say::Stdout,
    );
}

/// The leader's terms so far, from its /metrics (`tenure_leader_transitions_total`).
fn terms(port: u16) -> Option<u64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.lines()
        .find(|l| l.starts_with("tenure_leader_transitions_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
}
