//! The cost and the window of fencing enforced by the API server, on a real kube-apiserver.
//!
//! - **Per-write latency**, interleaved so machine noise hits each mode alike: a merge patch
//!   of a ConfigMap by (1) a plain client the policy does not govern (no impersonation, no
//!   policy: the baseline), (2) a fenced client of a non-participant (the self-impersonation
//!   alone), (3) a fenced client governed by a policy like tenure's (same parameter, same
//!   match) whose only validation is `true` (what any such policy costs), (4) a fenced client
//!   of a participant (impersonation + tenure's policy). p50 and p99 of each, and the ratios
//!   to the baseline.
//! - **The stale-write window**, over several takeovers: the old leader keeps writing with
//!   its token as fast as it can (two objects, one request at a time) while the successor is
//!   granted, and the successor writes as soon as its `acquire` returns. etcd's revision
//!   order is the judge. Counted: stale writes that landed after the grant (a response
//!   revision above the successor's token: the API server reads the policy's Lease from an
//!   informer, a few milliseconds behind), and stale writes that landed after the
//!   successor's first write (goal: 0: `FencedApi`'s first write waits until the policy
//!   refuses the token below its own); when the first stale write was refused, relative to
//!   the successor's `acquire` returning (negative: before the grant was returned).
//!
//! Prints a table and writes `target/bench/kube_fencing.json`. Run with
//! `cargo bench --bench kube_fencing --features kube`. `TENURE_BENCH_WRITES` sets the writes
//! per mode (default 400), `TENURE_BENCH_ROUNDS` the takeovers (default 7).

#[path = "../tests/kube_support/mod.rs"]
mod kube_support;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding, Validation,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_support::fencing::{apply, cm, install, participant, uninstall};
use kube_support::unique;
use tenure::backend::kube::{KubeBackend, KubeOptions};
use tenure::fence::kube::{FenceError, FencedApi, Fencer, FencingPolicy};
use tenure::lock::LockOptions;
use tenure::{FencingToken, Locker};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// One takeover under a nonstop stale writer.
struct Window {
    sent: usize,
    landed_after_grant: usize,
    landed_after_first_write: usize,
    /// Seconds from the successor's `acquire` returning to the first refused stale write.
    first_refusal: Option<f64>,
    acquire_ms: f64,
    first_write_ms: f64,
    /// From the grant's version of the Lease to the stamp's, as a watch saw them.
    stamp_gap_ms: Option<f64>,
}

type Versions = Arc<std::sync::Mutex<Vec<(u64, Duration, bool)>>>;

/// Watches Lease `name` from now on, recording each version's resourceVersion, when it was
/// seen (since `t0`), and whether it carried the exact token stamp (`tenure.dev/fencing`).
async fn watch_versions(ns: &str, name: &str, t0: Instant) -> Versions {
    use futures::StreamExt;
    let api: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(kube_support::shared().admin().await, ns);
    let from = api
        .get(name)
        .await
        .ok()
        .and_then(|l| l.metadata.resource_version)
        .unwrap_or_default();
    let versions: Versions = Arc::default();
    let sink = versions.clone();
    let params = kube::api::WatchParams::default().fields(&format!("metadata.name={name}"));
    let Ok(stream) = api.watch(&params, &from).await else {
        return versions;
    };
    tokio::spawn(async move {
        let mut stream = stream.boxed();
        while let Some(Ok(event)) = stream.next().await {
            if let kube::api::WatchEvent::Modified(l) | kube::api::WatchEvent::Added(l) = event {
                let rv = l
                    .metadata
                    .resource_version
                    .as_deref()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let stamped = l
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("tenure.dev/fencing"));
                if let Ok(mut v) = sink.lock() {
                    v.push((rv, t0.elapsed(), stamped));
                }
            }
        }
    });
    versions
}

/// Milliseconds from the version `token` (the grant) to the first later stamped version.
fn stamp_gap(versions: &Versions, token: u64) -> Option<f64> {
    let v = versions.lock().ok()?;
    let granted = v.iter().find(|(rv, _, _)| *rv == token)?.1;
    let stamped = v.iter().find(|(rv, _, s)| *rv > token && *s)?.1;
    Some(ms(stamped.saturating_sub(granted)))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(run());
    ExitCode::SUCCESS
}

/// Installs a policy like tenure's for the Lease `bench` and ServiceAccount `sa`, with one
/// validation that is always true, and returns its name.
async fn trivial_policy(ns: &str, sa: &str) -> String {
    let spec = FencingPolicy::new(ns, "bench")
        .and_then(|p| p.service_account(ns, sa))
        .and_then(|p| p.resource("configmaps"))
        .unwrap_or_else(|e| panic!("{e}"));
    let name = format!("{}-trivial", spec.name());
    let mut policy = spec.policy();
    policy.metadata.name = Some(name.clone());
    if let Some(s) = policy.spec.as_mut() {
        s.variables = None;
        s.validations = Some(vec![Validation {
            expression: "true".into(),
            ..Validation::default()
        }]);
    }
    let mut binding = spec.binding();
    binding.metadata.name = Some(name.clone());
    binding.spec.policy_name = name.clone();
    let admin = kube_support::shared().admin().await;
    apply(
        &Api::<ValidatingAdmissionPolicy>::all(admin.clone()),
        &name,
        &policy,
    )
    .await;
    apply(
        &Api::<ValidatingAdmissionPolicyBinding>::all(admin),
        &name,
        &binding,
    )
    .await;
    name
}

fn backend(client: &kube::Client, ns: &str) -> KubeBackend {
    KubeBackend::with_options(client.clone(), KubeOptions::new().namespace(ns))
        .unwrap_or_else(|e| panic!("backend: {e}"))
}

async fn run() {
    let writes = env_usize("TENURE_BENCH_WRITES", 400);
    let rounds = env_usize("TENURE_BENCH_ROUNDS", 7);
    // The shared harness server (this process's own, stopped when it exits).
    let server = kube_support::shared();
    let ns = unique("bench-fencing");
    server.namespace(&ns).await;
    let (writer, _) = participant(&ns, "writer").await;
    let (outsider, _) = participant(&ns, "outsider").await;
    let (trivial_sa, _) = participant(&ns, "trivial").await;
    let policy = FencingPolicy::new(&ns, "bench")
        .and_then(|p| p.service_account(&ns, "writer"))
        .and_then(|p| p.resource("configmaps"))
        .unwrap_or_else(|e| panic!("{e}"));
    let locker = Locker::with_identity(backend(&writer, &ns), "bench").expect("identity");
    let term = locker
        .try_acquire(
            "bench",
            &LockOptions::new()
                .ttl(Duration::from_secs(15))
                .auto_renew(true),
        )
        .await
        .unwrap_or_else(|e| panic!("acquire: {e}"));
    install(&policy, &Api::namespaced(writer.clone(), &ns)).await;
    // The floor of any such policy: the same parameter (the Lease), the same participant
    // match, one validation that is always true. What remains is tenure's CEL.
    let trivial = trivial_policy(&ns, "trivial").await;
    // (No refusal to wait for: give the API server's policy informer time to load it.)
    tokio::time::sleep(Duration::from_secs(3)).await;

    // ---- per-write latency ----
    let baseline: Api<ConfigMap> = Api::namespaced(outsider.clone(), &ns);
    let impersonating: FencedApi<ConfigMap> = Fencer::new(outsider.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns)
        .warn_only(true)
        .namespaced_with_token("trivial", FencingToken::new(1), &ns);
    let trivially_governed: FencedApi<ConfigMap> = Fencer::new(trivial_sa.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns)
        .warn_only(true)
        .namespaced_with_token("trivial", FencingToken::new(1), &ns);
    let fenced: FencedApi<ConfigMap> = Fencer::new(writer.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns)
        .namespaced_with_token("bench", term.fencing_token(), &ns);
    for name in ["lat-plain", "lat-imp", "lat-fenced", "lat-trivial"] {
        let _ = baseline
            .create(&PostParams::default(), &cm(name, "0"))
            .await;
    }
    let pp = PatchParams::default();
    let mut samples: [Vec<Duration>; 4] = Default::default();
    for i in 0..writes + 20 {
        let patch = Patch::Merge(serde_json::json!({"data": {"v": i.to_string()}}));
        // Rotate the order each round so no mode always goes first.
        for k in 0..4 {
            let mode = (i + k) % 4;
            let start = Instant::now();
            match mode {
                0 => {
                    baseline
                        .patch("lat-plain", &pp, &patch)
                        .await
                        .map(|_| ())
                        .unwrap_or_else(|e| panic!("plain: {e}"));
                }
                1 => {
                    impersonating
                        .patch("lat-imp", &pp, &patch)
                        .await
                        .map(|_| ())
                        .unwrap_or_else(|e| panic!("impersonating: {e}"));
                }
                2 => {
                    trivially_governed
                        .patch("lat-trivial", &pp, &patch)
                        .await
                        .map(|_| ())
                        .unwrap_or_else(|e| panic!("trivially governed: {e}"));
                }
                _ => {
                    fenced
                        .patch("lat-fenced", &pp, &patch)
                        .await
                        .map(|_| ())
                        .unwrap_or_else(|e| panic!("fenced: {e}"));
                }
            }
            // The first 20 rounds warm connections and caches.
            if i >= 20 {
                samples[mode].push(start.elapsed());
            }
        }
    }
    for s in &mut samples {
        s.sort();
    }
    let stats: Vec<(Duration, Duration)> = samples
        .iter()
        .map(|s| (percentile(s, 0.5), percentile(s, 0.99)))
        .collect();
    drop(term);
    uninstall(&policy.name()).await;
    uninstall(&trivial).await;

    // ---- the stale-write window ----
    let mut window_rows = Vec::new();
    for round in 0..rounds {
        let lease = format!("window-{round}");
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(1))
            .wait(Duration::from_secs(10));
        let old = Locker::with_identity(backend(&writer, &ns), "old").expect("identity");
        let held = old
            .try_acquire(&lease, &opts)
            .await
            .unwrap_or_else(|e| panic!("old: {e}"));
        let token_old = held.fencing_token();
        let round_policy = FencingPolicy::new(&ns, &lease)
            .and_then(|p| p.service_account(&ns, "writer"))
            .and_then(|p| p.resource("configmaps"))
            .unwrap_or_else(|e| panic!("{e}"));
        install(&round_policy, &Api::namespaced(writer.clone(), &ns)).await;
        // Only this round's policy governs now (the earlier ones are removed): one Lease.
        let stale: FencedApi<ConfigMap> = Fencer::new(writer.clone())
            .await
            .expect("identity")
            .lease_namespace(&ns)
            .namespaced_with_token(&lease, token_old, &ns);
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = Instant::now();
        let writer_task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut log = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Acquire) {
                    n += 1;
                    let name = if n.is_multiple_of(2) {
                        "touched"
                    } else {
                        "untouched"
                    };
                    let patch = Patch::Apply(serde_json::json!({
                        "apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": name}, "data": {"n": n.to_string()}
                    }));
                    let sent = t0.elapsed();
                    let r = stale
                        .patch(name, &PatchParams::apply("old").force(), &patch)
                        .await;
                    let outcome = match r {
                        Ok(o) => Some(
                            o.metadata
                                .resource_version
                                .and_then(|v| v.parse::<u64>().ok())
                                .unwrap_or(0),
                        ),
                        Err(FenceError::Stale { .. }) => None,
                        Err(e) => panic!("stale writer: {e}"),
                    };
                    log.push((sent, outcome));
                }
                log
            })
        };
        // The old holder stops renewing (frozen, partitioned); the new one waits it out.
        held.orphan();
        // Every version of the Lease, with when this process saw it: the grant and the stamp.
        let versions = watch_versions(&ns, &lease, t0).await;
        let new = Locker::with_identity(backend(&writer, &ns), "new").expect("identity");
        let called = t0.elapsed();
        let granted = new
            .acquire(&lease, &opts)
            .await
            .unwrap_or_else(|e| panic!("new: {e}"));
        let returned = t0.elapsed();
        let token_new = granted.fencing_token().get();
        // The new leader's workload starts: its first fenced write (which first waits until
        // the policy refuses the token below its own).
        let successor: FencedApi<ConfigMap> = Fencer::new(writer.clone())
            .await
            .expect("identity")
            .lease_namespace(&ns)
            .namespaced_with_token(&lease, granted.fencing_token(), &ns);
        let first_write = successor
            .patch(
                "touched",
                &PatchParams::apply("new").force(),
                &Patch::Apply(serde_json::json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "touched"}, "data": {"by": "new"}
                })),
            )
            .await
            .unwrap_or_else(|e| panic!("the successor's first write: {e}"));
        let first_write_at = t0.elapsed();
        let first_write_rv = first_write
            .metadata
            .resource_version
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Release);
        let log = writer_task.await.unwrap_or_default();
        let _ = granted.release().await;
        let landed_after_grant = log
            .iter()
            .filter(|(_, rv)| rv.is_some_and(|rv| rv > token_new))
            .count();
        let landed_after_first_write = log
            .iter()
            .filter(|(_, rv)| rv.is_some_and(|rv| rv > first_write_rv))
            .count();
        let first_refusal = log
            .iter()
            .find(|(_, rv)| rv.is_none())
            .map(|(sent, _)| sent.as_secs_f64() - returned.as_secs_f64());
        window_rows.push(Window {
            sent: log.len(),
            landed_after_grant,
            landed_after_first_write,
            first_refusal,
            acquire_ms: ms(returned - called),
            first_write_ms: ms(first_write_at - returned),
            stamp_gap_ms: stamp_gap(&versions, token_new),
        });
        uninstall(&round_policy.name()).await;
    }

    // ---- report ----
    let (p50_base, p99_base) = stats[0];
    println!(
        "\nper-write latency, merge patch of a ConfigMap ({writes} writes per mode, interleaved)"
    );
    println!(
        "{:<44} {:>9} {:>9} {:>10} {:>10}",
        "mode", "p50 ms", "p99 ms", "p50 ratio", "p99 ratio"
    );
    let names = [
        "plain client, not governed (baseline)",
        "fenced client, non-participant (impersonation)",
        "fenced client, a policy with `true` as its CEL",
        "fenced client, participant (impersonation + policy)",
    ];
    for (name, (p50, p99)) in names.iter().zip(&stats) {
        println!(
            "{name:<44} {:>9.2} {:>9.2} {:>10.2} {:>10.2}",
            ms(*p50),
            ms(*p99),
            p50.as_secs_f64() / p50_base.as_secs_f64(),
            p99.as_secs_f64() / p99_base.as_secs_f64()
        );
    }
    println!(
        "\nstale-write window: the old leader writes nonstop while the new one is granted ({rounds} takeovers)"
    );
    println!(
        "{:<6} {:>8} {:>12} {:>18} {:>24} {:>11} {:>16} {:>12}",
        "round",
        "stale",
        "landed after",
        "landed after the",
        "first refusal vs",
        "acquire",
        "first write",
        "grant→stamp"
    );
    println!(
        "{:<6} {:>8} {:>12} {:>18} {:>24} {:>11} {:>16} {:>12}",
        "",
        "sent",
        "the grant",
        "new first write",
        "acquire returning",
        "ms",
        "ms after acq.",
        "ms (watch)"
    );
    let worst = |f: fn(&Window) -> usize| window_rows.iter().map(f).max().unwrap_or(0);
    for (i, w) in window_rows.iter().enumerate() {
        println!(
            "{i:<6} {:>8} {:>12} {:>18} {:>24} {:>11.1} {:>16.1} {:>12}",
            w.sent,
            w.landed_after_grant,
            w.landed_after_first_write,
            w.first_refusal
                .map_or("none".to_owned(), |s| format!("{:+.1} ms", s * 1e3)),
            w.acquire_ms,
            w.first_write_ms,
            w.stamp_gap_ms.map_or("?".to_owned(), |g| format!("{g:.1}"))
        );
    }
    let worst_landed = worst(|w| w.landed_after_grant);
    let worst_after_first = worst(|w| w.landed_after_first_write);
    println!(
        "most stale writes that landed after a grant: {worst_landed} (the policy's informer lag); after the new leader's first write: {worst_after_first} (goal: 0)"
    );

    let json = format!(
        "{{\n  \"latency_ms\": {{\"plain\": {{\"p50\": {:.3}, \"p99\": {:.3}}}, \"impersonation\": {{\"p50\": {:.3}, \"p99\": {:.3}}}, \"trivial_policy\": {{\"p50\": {:.3}, \"p99\": {:.3}}}, \"fenced\": {{\"p50\": {:.3}, \"p99\": {:.3}}}}},\n  \"fenced_over_plain\": {{\"p50\": {:.3}, \"p99\": {:.3}}},\n  \"writes_per_mode\": {writes},\n  \"window\": [{}],\n  \"most_landed_after_grant\": {worst_landed},\n  \"most_landed_after_first_write\": {worst_after_first}\n}}\n",
        ms(stats[0].0),
        ms(stats[0].1),
        ms(stats[1].0),
        ms(stats[1].1),
        ms(stats[2].0),
        ms(stats[2].1),
        ms(stats[3].0),
        ms(stats[3].1),
        stats[3].0.as_secs_f64() / p50_base.as_secs_f64(),
        stats[3].1.as_secs_f64() / p99_base.as_secs_f64(),
        window_rows
            .iter()
            .map(|w| format!(
                "{{\"stale_sent\": {}, \"landed_after_grant\": {}, \"landed_after_first_write\": {}, \"first_refusal_ms_vs_acquire_return\": {}, \"acquire_ms\": {:.1}, \"first_write_ms_after_acquire\": {:.1}, \"grant_to_stamp_ms\": {}}}",
                w.sent,
                w.landed_after_grant,
                w.landed_after_first_write,
                w.first_refusal.map_or("null".to_owned(), |s| format!("{:.1}", s * 1e3)),
                w.acquire_ms,
                w.first_write_ms,
                w.stamp_gap_ms.map_or("null".to_owned(), |g| format!("{g:.2}"))
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    let path = dir.join("kube_fencing.json");
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, json)) {
        Ok(()) => eprintln!("wrote {}", path.display()),
        Err(e) => eprintln!("could not write {}: {e}", path.display()),
    }
}
