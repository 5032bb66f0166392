//! The cost and the window of fencing enforced by the API server, on a real kube-apiserver.
//!
//! - **Per-write latency**, interleaved in a new random order each round (no mode always first
//!   or after the same one), so machine noise hits each mode alike: a merge patch
//!   of a ConfigMap by (1) a plain client the policy does not govern (no impersonation, no
//!   policy: the baseline), (2) a fenced client of a non-participant (the self-impersonation
//!   alone), (3) a fenced client governed by a policy like tenure's (same parameter, same
//!   match) whose only validation is `true` (what any such policy costs), (4) a fenced client
//!   of a participant, for a real term of an election, after its fence proof (impersonation +
//!   tenure's policy + the proof's rechecks, one every 10 s). Nothing refuses the lower token
//!   of (2) and (3), so their fences are never proven: they write with `warn_only(true)`, and
//!   a recheck period longer than the run keeps their failing proofs (a dry-run every 10 ms
//!   for `PROOF_WINDOW`) from loading the server while the others are measured. p50 and p99
//!   of each, and the ratios to the baseline (goal for (4): p50 ≤ 1.15×, p99 ≤ 1.25×).
//! - **The proof's cost**: one per round among the writes, a fresh `Fencer` (its identity learned
//!   first, untimed) proves the same term — the two dry-run creates of the probe Lease a
//!   recheck sends — timed from `Fencer::prove` to its answer. Set against the write rate: a
//!   recheck every 10 s is 12 requests a minute per term.
//! - **The stale-write window**, over several takeovers: the old leader keeps writing with
//!   its token as fast as it can (two objects, one request at a time) while the successor is
//!   granted, and the successor writes as soon as its `acquire` returns (its `Fencer` made
//!   beforehand, as a process does once). etcd's revision order is the judge. Counted: stale
//!   writes that landed after the grant (a response revision above the successor's token: the
//!   API server reads the policy's Lease from an informer, a few milliseconds behind), and
//!   stale writes that landed after the successor's first write (goal: 0: `FencedApi`'s first
//!   write waits for the term's proof, which needs the token below its own refused); when the
//!   first stale write was refused, relative to the successor's `acquire` returning
//!   (negative: before the grant was returned); the grant (`acquire` returning) to the first
//!   admitted write, barrier included, and the successor's second write (no barrier).
//!   Every round installs its own policy and deletes it after: the anchor
//!   (`FencingPolicy::anchor`, installed first by `install`) stays, so deleting a round's
//!   binding never stops the API server's Lease informer (kubernetes#130887).
//!
//! Prints the takeovers, then a summary table, and writes `target/bench/kube_fencing.json`.
//! Run with `cargo bench --bench kube_fencing --features kube`. `TENURE_BENCH_WRITES` sets
//! the writes per mode (default 1000), `TENURE_BENCH_ROUNDS` the takeovers (default 24).

#[path = "support/mod.rs"]
mod support;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding, Validation,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use support::env::knob;
use support::kube_harness::fencing::{apply, cm, elect, install, participant, uninstall};
use support::kube_harness::{shared, unique};
use support::out::{Say, save};
use support::stats::{ms, p50_p99};
use tenure::backend::kube::{KubeBackend, KubeOptions};
use tenure::fence::kube::{DEFAULT_RECHECK, FenceError, FencedApi, Fencer, FencingPolicy};
use tenure::lock::LockOptions;
use tenure::{FencingToken, Locker};

/// Writes before the measured ones, per mode: connections, caches, the first proofs.
const WARMUP: usize = 20;

/// One takeover under a nonstop stale writer.
struct Window {
    sent: usize,
    landed_after_grant: usize,
    landed_after_first_write: usize,
    /// Seconds from the successor's `acquire` returning to the first refused stale write.
    first_refusal: Option<f64>,
    acquire_ms: f64,
    /// From `acquire` returning to the first write's answer: the proof (barrier) + one write.
    first_write_ms: f64,
    /// The successor's second write, right after: one write, no barrier.
    second_write_ms: f64,
    /// From the grant's version of the Lease to the stamp's, as a watch saw them.
    stamp_gap_ms: Option<f64>,
}

type Versions = Arc<std::sync::Mutex<Vec<(u64, Duration, bool)>>>;

/// Watches Lease `name` from now on, recording each version's resourceVersion, when it was
/// seen (since `t0`), and whether it carried the exact token stamp (`tenure.dev/fencing`).
async fn watch_versions(ns: &str, name: &str, t0: Instant) -> Versions {
    use futures::StreamExt;
    let api: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(shared().admin().await, ns);
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

fn main() -> ExitCode {
    let Some(rt) = support::role::runtime(2) else {
        return ExitCode::FAILURE;
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
    let admin = shared().admin().await;
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
    KubeBackend::from_client(client.clone(), KubeOptions::new().namespace(ns))
        .unwrap_or_else(|e| panic!("backend: {e}"))
}

/// A fencer whose fence no policy proves (nothing refuses its lower token): its writes go
/// anyway (`warn_only`), and its failing proof runs once, in the warm-up (a recheck period
/// longer than the run), instead of a dry-run every 10 ms for `PROOF_WINDOW` every 10 s.
async fn unproven(client: &kube::Client, ns: &str) -> Fencer {
    Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(ns)
        .warn_only(true)
        .recheck_every(Duration::from_secs(24 * 3600))
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

/// The successor's write: server-side apply of the ConfigMap the old leader also writes.
async fn successor_write(api: &FencedApi<ConfigMap>, by: &str) -> Result<ConfigMap, FenceError> {
    let patch = Patch::Apply(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "touched"}, "data": {"by": by}
    }));
    api.patch("touched", &PatchParams::apply("new").force(), &patch)
        .await
}

#[allow(clippy::too_many_lines)]
async fn run() {
    let writes = knob("TENURE_BENCH_WRITES", 1000);
    let rounds = knob("TENURE_BENCH_ROUNDS", 24);
    let t_run = Instant::now();
    // The shared harness server (this process's own, stopped when it exits).
    let server = shared();
    let ns = unique("bench-fencing");
    server.namespace(&ns).await;
    let (writer, _) = participant(&ns, "writer").await;
    let (outsider, _) = participant(&ns, "outsider").await;
    let (trivial_sa, _) = participant(&ns, "trivial").await;
    let policy = FencingPolicy::new(&ns, "bench")
        .and_then(|p| p.service_account(&ns, "writer"))
        .and_then(|p| p.resource("configmaps"))
        .unwrap_or_else(|e| panic!("{e}"));
    // A real term of an election on the Lease `bench`, as a workload gets it.
    let (term, end_term, election) = elect(&writer, &ns, "bench").await;
    // The anchor first, then the election's policy (waits until it is enforced).
    install(&policy, &Api::namespaced(writer.clone(), &ns)).await;
    // The floor of any such policy: the same parameter (the Lease), the same participant
    // match, one validation that is always true. What remains is tenure's CEL.
    let trivial = trivial_policy(&ns, "trivial").await;
    // (No refusal to wait for: give the API server's policy informer time to load it.)
    tokio::time::sleep(Duration::from_secs(3)).await;

    // ---- per-write latency, and the proof's cost ----
    let baseline: Api<ConfigMap> = Api::namespaced(outsider.clone(), &ns);
    let impersonating_fencer = unproven(&outsider, &ns).await;
    let impersonating: FencedApi<ConfigMap> =
        impersonating_fencer.namespaced_with_token("unproven-imp", FencingToken::new(1), &ns);
    let trivial_fencer = unproven(&trivial_sa, &ns).await;
    let trivially_governed: FencedApi<ConfigMap> =
        trivial_fencer.namespaced_with_token("unproven-trivial", FencingToken::new(1), &ns);
    // The participant's: the default recheck (10 s), so its rechecks run among the writes.
    let fencer = Fencer::new(writer.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns);
    let fenced: FencedApi<ConfigMap> = fencer.namespaced(&term, &ns);
    for name in ["lat-plain", "lat-imp", "lat-fenced", "lat-trivial"] {
        let _ = baseline
            .create(&PostParams::default(), &cm(name, "0"))
            .await;
    }
    let pp = PatchParams::default();
    // Modes 1 to 3: the fenced clients, with their ConfigMap and their name in a failure.
    let fenced_modes = [
        (&impersonating, "lat-imp", "impersonating"),
        (&trivially_governed, "lat-trivial", "trivially governed"),
        (&fenced, "lat-fenced", "fenced"),
    ];
    let mut samples: [Vec<Duration>; 4] = Default::default();
    let mut proofs: Vec<Duration> = Vec::new();
    let t_latency = Instant::now();
    // A fixed seed: the same orders every run.
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    for i in 0..writes + WARMUP {
        let patch = Patch::Merge(serde_json::json!({"data": {"v": i.to_string()}}));
        // The four writes and one proof in a new random order each round, so no mode always
        // goes first or follows the same one.
        let mut order = [0usize, 1, 2, 3, 4];
        for j in (1..order.len()).rev() {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            #[allow(clippy::cast_possible_truncation)]
            order.swap(j, (rng % (j as u64 + 1)) as usize);
        }
        for mode in order {
            if mode == 4 {
                // One proof of the same term by a fresh fencer (its identity learned first,
                // untimed): what a recheck sends, two dry-run creates of the probe.
                let fresh = Fencer::new(writer.clone())
                    .await
                    .expect("identity")
                    .lease_namespace(&ns);
                let start = Instant::now();
                let state = fresh.prove(&term).await;
                if i >= WARMUP {
                    proofs.push(start.elapsed());
                }
                assert!(
                    state.is_enforced(),
                    "the bench term's fence is not proven: {state:?}"
                );
                continue;
            }
            let start = Instant::now();
            if mode == 0 {
                baseline
                    .patch("lat-plain", &pp, &patch)
                    .await
                    .map(|_| ())
                    .unwrap_or_else(|e| panic!("plain: {e}"));
            } else {
                let (api, name, what) = fenced_modes[mode - 1];
                api.patch(name, &pp, &patch)
                    .await
                    .map(|_| ())
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            // The first rounds warm connections and caches, and wait for the first proofs.
            if i >= WARMUP {
                samples[mode].push(start.elapsed());
            }
        }
    }
    let latency_secs = t_latency.elapsed().as_secs_f64();
    // The modes that write unproven say so (their proof failed, as it must without a policy
    // that refuses their token); the participant's is proven (its writes went).
    let unproven_as_expected =
        impersonating_fencer.open_fence().is_some() && trivial_fencer.open_fence().is_some();
    let fenced_open = fencer.open_fence();
    let fenced_mean =
        samples[3].iter().sum::<Duration>() / u32::try_from(writes.max(1)).unwrap_or(1);
    let stats: Vec<(Duration, Duration)> = samples.into_iter().map(p50_p99).collect();
    let proof_count = proofs.len();
    let (proof_p50, proof_p99) = p50_p99(proofs);
    // Their proofs end with their clients.
    drop((fenced, impersonating, trivially_governed));
    drop((fencer, impersonating_fencer, trivial_fencer));
    let _ = end_term.send(());
    let _ = election.await;
    drop(term);
    uninstall(&policy.name()).await;
    uninstall(&trivial).await;

    // ---- the stale-write window ----
    let t_window = Instant::now();
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
        // The anchor stays; only this round's election policy governs (the earlier ones are
        // removed): one Lease.
        install(&round_policy, &Api::namespaced(writer.clone(), &ns)).await;
        // The old and the new leader are two processes: two fencers, each made once, before
        // its term (a fencer learns its identity with one request).
        let stale: FencedApi<ConfigMap> = Fencer::new(writer.clone())
            .await
            .expect("identity")
            .lease_namespace(&ns)
            .namespaced_with_token(&lease, token_old, &ns);
        let successor_fencer = Fencer::new(writer.clone())
            .await
            .expect("identity")
            .lease_namespace(&ns);
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
        // The new leader's workload starts: its first fenced write (which first waits for the
        // term's proof: the token below its own refused, its own admitted).
        let successor: FencedApi<ConfigMap> =
            successor_fencer.namespaced_with_token(&lease, granted.fencing_token(), &ns);
        let first_write = successor_write(&successor, "new")
            .await
            .unwrap_or_else(|e| panic!("the successor's first write: {e}"));
        let first_write_at = t0.elapsed();
        let second_start = Instant::now();
        successor_write(&successor, "new, again")
            .await
            .unwrap_or_else(|e| panic!("the successor's second write: {e}"));
        let second_write_ms = ms(second_start.elapsed());
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
            second_write_ms,
            stamp_gap_ms: stamp_gap(&versions, token_new),
        });
        uninstall(&round_policy.name()).await;
    }
    let window_secs = t_window.elapsed().as_secs_f64();

    // ---- report: the takeovers, then the summary ----
    println!(
        "\nstale-write window: the old leader writes nonstop while the new one is granted ({rounds} takeovers)"
    );
    println!(
        "{:<6} {:>6} {:>10} {:>12} {:>18} {:>9} {:>12} {:>10} {:>10}",
        "round",
        "stale",
        "landed",
        "landed after",
        "first refusal vs",
        "acquire",
        "first write",
        "2nd write",
        "grant→stamp"
    );
    println!(
        "{:<6} {:>6} {:>10} {:>12} {:>18} {:>9} {:>12} {:>10} {:>10}",
        "",
        "sent",
        "after grant",
        "new 1st write",
        "acquire returning",
        "ms",
        "ms after acq",
        "ms",
        "ms (watch)"
    );
    for (i, w) in window_rows.iter().enumerate() {
        println!(
            "{i:<6} {:>6} {:>10} {:>12} {:>18} {:>9.1} {:>12.1} {:>10.1} {:>10}",
            w.sent,
            w.landed_after_grant,
            w.landed_after_first_write,
            w.first_refusal
                .map_or("none".to_owned(), |s| format!("{:+.1} ms", s * 1e3)),
            w.acquire_ms,
            w.first_write_ms,
            w.second_write_ms,
            w.stamp_gap_ms.map_or("?".to_owned(), |g| format!("{g:.1}"))
        );
    }
    let secs = |d: f64| Duration::from_secs_f64(d / 1e3);
    let (first_p50, first_p99) =
        p50_p99(window_rows.iter().map(|w| secs(w.first_write_ms)).collect());
    let (second_p50, second_p99) = p50_p99(
        window_rows
            .iter()
            .map(|w| secs(w.second_write_ms))
            .collect(),
    );
    let (barrier_p50, barrier_p99) = p50_p99(
        window_rows
            .iter()
            .map(|w| secs((w.first_write_ms - w.second_write_ms).max(0.0)))
            .collect(),
    );
    let stale_after_first: usize = window_rows.iter().map(|w| w.landed_after_first_write).sum();
    let stale_after_grant: usize = window_rows.iter().map(|w| w.landed_after_grant).sum();
    let most_after_grant = window_rows
        .iter()
        .map(|w| w.landed_after_grant)
        .max()
        .unwrap_or(0);
    let stale_sent: usize = window_rows.iter().map(|w| w.sent).sum();

    let (p50_base, p99_base) = stats[0];
    let (p50_fenced, p99_fenced) = stats[3];
    let p50_ratio = ratio(p50_fenced, p50_base);
    let p99_ratio = ratio(p99_fenced, p99_base);
    let verdict = |r: f64, goal: f64| if r <= goal { "met" } else { "MISSED" };
    println!(
        "\n== kube fencing, one run: {writes} writes per mode, {proof_count} proofs, {rounds} takeovers ({latency_secs:.0} s + {window_secs:.0} s; {:.0} s in all) ==",
        t_run.elapsed().as_secs_f64()
    );
    println!("\n1. per-write latency, merge patch of a ConfigMap (modes interleaved)");
    println!(
        "{:<58} {:>8} {:>8} {:>9} {:>9}",
        "mode", "p50 ms", "p99 ms", "p50 ×base", "p99 ×base"
    );
    let names = [
        "plain client, not governed, no policy (baseline)",
        "fenced, non-participant: impersonation (warn-only)",
        "fenced, policy whose CEL is `true` (warn-only)",
        "fenced, participant: policy + per-term proof (proven)",
    ];
    for (name, (p50, p99)) in names.iter().zip(&stats) {
        println!(
            "{name:<58} {:>8.2} {:>8.2} {:>9.2} {:>9.2}",
            ms(*p50),
            ms(*p99),
            ratio(*p50, p50_base),
            ratio(*p99, p99_base)
        );
    }
    println!(
        "fenced/baseline: p50 {p50_ratio:.2}× (goal ≤ 1.15×: {}), p99 {p99_ratio:.2}× (goal ≤ 1.25×: {}); warn-only fences unproven as expected: {}; participant's fence: {}",
        verdict(p50_ratio, 1.15),
        verdict(p99_ratio, 1.25),
        if unproven_as_expected { "yes" } else { "NO" },
        fenced_open.as_deref().unwrap_or("proven")
    );
    println!(
        "\n2. grant (acquire returning) → first admitted write, barrier included ({rounds} takeovers)"
    );
    println!("{:<44} {:>8} {:>8}", "", "p50 ms", "p99 ms");
    for (name, p50, p99) in [
        (
            "first write (proof barrier + the write)",
            first_p50,
            first_p99,
        ),
        ("second write (no barrier)", second_p50, second_p99),
        (
            "barrier (first − second, per takeover)",
            barrier_p50,
            barrier_p99,
        ),
    ] {
        println!("{name:<44} {:>8.2} {:>8.2}", ms(p50), ms(p99));
    }
    let recheck_per_min = 2.0 * 60.0 / DEFAULT_RECHECK.as_secs_f64();
    let writes_per_min = 60.0 / fenced_mean.as_secs_f64().max(1e-9);
    println!(
        "\n3. the proof: two dry-run creates of the probe Lease ({proof_count} proofs of the bench term)"
    );
    println!(
        "one proof: p50 {:.2} ms, p99 {:.2} ms ({:.2}× / {:.2}× the fenced write's p50 / p99)",
        ms(proof_p50),
        ms(proof_p99),
        ratio(proof_p50, p50_fenced),
        ratio(proof_p99, p99_fenced)
    );
    println!(
        "a recheck every {}s: {recheck_per_min:.0} requests/min per term, {:.1} ms/min of requests at p50 ({:.3}% of the time); vs the fenced writer back-to-back ({writes_per_min:.0} writes/min, mean {:.2} ms): +{:.2}% requests; vs 60 writes/min: +{:.0}%; vs 6 writes/min: +{:.0}%",
        DEFAULT_RECHECK.as_secs(),
        ms(proof_p50) * 60.0 / DEFAULT_RECHECK.as_secs_f64(),
        ms(proof_p50) / DEFAULT_RECHECK.as_secs_f64() / 10.0,
        ms(fenced_mean),
        recheck_per_min / writes_per_min * 100.0,
        recheck_per_min / 60.0 * 100.0,
        recheck_per_min / 6.0 * 100.0
    );
    println!(
        "\n4. stale writes (the old leader sending nonstop: {stale_sent} stale writes in all)"
    );
    println!(
        "accepted after the new term's first write: {stale_after_first} over {rounds} takeovers (goal: 0: {}); after the grant, before that write: {stale_after_grant} in all, at most {most_after_grant} per takeover (the policy's informer lag, closed by the barrier)",
        if stale_after_first == 0 {
            "met"
        } else {
            "MISSED"
        }
    );

    let json = format!(
        "{{\n  \"latency_ms\": {{\"plain\": {{\"p50\": {:.3}, \"p99\": {:.3}}}, \"impersonation\": {{\"p50\": {:.3}, \"p99\": {:.3}}}, \"trivial_policy\": {{\"p50\": {:.3}, \"p99\": {:.3}}}, \"fenced\": {{\"p50\": {:.3}, \"p99\": {:.3}}}}},\n  \"fenced_over_plain\": {{\"p50\": {p50_ratio:.3}, \"p99\": {p99_ratio:.3}}},\n  \"writes_per_mode\": {writes},\n  \"proof_ms\": {{\"p50\": {:.3}, \"p99\": {:.3}, \"n\": {proof_count}}},\n  \"recheck_requests_per_min\": {recheck_per_min:.1},\n  \"grant_to_first_write_ms\": {{\"p50\": {:.2}, \"p99\": {:.2}}},\n  \"second_write_ms\": {{\"p50\": {:.2}, \"p99\": {:.2}}},\n  \"window\": [{}],\n  \"stale_landed_after_grant\": {stale_after_grant},\n  \"most_landed_after_grant\": {most_after_grant},\n  \"stale_landed_after_first_write\": {stale_after_first}\n}}\n",
        ms(stats[0].0),
        ms(stats[0].1),
        ms(stats[1].0),
        ms(stats[1].1),
        ms(stats[2].0),
        ms(stats[2].1),
        ms(stats[3].0),
        ms(stats[3].1),
        ms(proof_p50),
        ms(proof_p99),
        ms(first_p50),
        ms(first_p99),
        ms(second_p50),
        ms(second_p99),
        window_rows
            .iter()
            .map(|w| format!(
                "{{\"stale_sent\": {}, \"landed_after_grant\": {}, \"landed_after_first_write\": {}, \"first_refusal_ms_vs_acquire_return\": {}, \"acquire_ms\": {:.1}, \"first_write_ms_after_acquire\": {:.1}, \"second_write_ms\": {:.1}, \"grant_to_stamp_ms\": {}}}",
                w.sent,
                w.landed_after_grant,
                w.landed_after_first_write,
                w.first_refusal.map_or("null".to_owned(), |s| format!("{:.1}", s * 1e3)),
                w.acquire_ms,
                w.first_write_ms,
                w.second_write_ms,
                w.stamp_gap_ms.map_or("null".to_owned(), |g| format!("{g:.2}"))
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    save("kube_fencing.json", &json, Say::Stderr);
}
