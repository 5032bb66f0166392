//! What one fencing policy per sharded group costs, on a real kube-apiserver (issue #41).
//!
//! - **The first term's proof, per shard**: each round a fresh replica runs a group of
//!   `TENURE_BENCH_SHARDS` shards (default 16) under the group's policy
//!   (`FencingPolicy::shards`), its shard terms beginning together; each term, as it is
//!   delivered, is proven by the replica's one `Fencer` (made beforehand, as `tenure run
//!   --shards --fence` does), timed from `Fencer::prove` to its answer. The first round's
//!   shard Leases do not exist before their grants: the API server meets each as a new
//!   parameter of the binding's label selector. Later rounds take Leases that exist. p50 and
//!   p99 over every shard of every round (`TENURE_BENCH_ROUNDS`, default 5), and of the first
//!   round alone.
//! - **Admission per write**, interleaved in a new random order each round (no mode always
//!   first or after the same one): a merge patch of a ConfigMap by (1) a client no policy
//!   governs (the baseline), (2) a fenced client of a single-lease election under its own
//!   policy (one parameter), (3) a fenced client of a shard term under the group's policy
//!   (one evaluation per shard Lease: `TENURE_BENCH_SHARDS` parameters). The participants of
//!   (2) and (3) are different ServiceAccounts, so each write meets only its own policy's
//!   match. p50 and p99 of each (`TENURE_BENCH_WRITES`, default 300), and the ratios.
//! - `TENURE_BENCH_STATIC=1`: admission per write only, against a static group: the shard
//!   Leases made directly (named, labelled and with a floor as a group's replicas leave them,
//!   held by no one) instead of a replica's terms, so no elector's renewals compete with the
//!   measured writes; for hundreds of shards on a small machine. Each write meets the same
//!   parameters a running group's would. Two more modes join the interleaving: (0) a write no
//!   policy matches at all (a Lease patch: the policies govern ConfigMaps, and of Leases only
//!   the probe's create), and (4) a shard term's write under a second group of as many
//!   shards whose policy has the messages as they were before every message began with
//!   `variables.otherElection ? '' :` (the API server evaluates every evaluation's message,
//!   passing or not) — so the change's effect is measured in one run, under the same load.
//!   Its participant is a ServiceAccount of its own, but both groups' policies match every
//!   ConfigMap write, so every ConfigMap mode pays both groups' match conditions alike
//!   (`TENURE_BENCH_LEGACY=0` leaves the second group out).
//! - `TENURE_BENCH_CPU_WRITES=N` (static only; 0, the default, skips it): the API server's
//!   CPU (utime + stime of the `kube-testenv` process, apiserver and its embedded etcd, from
//!   `/proc/PID/stat`) around a block of N writes of each mode, the blocks in a rotated order,
//!   `TENURE_BENCH_CPU_ROUNDS` rounds (default 3): CPU-seconds per 1,000 writes per mode. Needs
//!   a server this bench started (not `TENURE_KUBE_DIR`).
//!
//! Run with `cargo bench --all-features --bench kube_fence_shards`; writes
//! `target/bench/kube_fence_shards.json`.

#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use support::env::knob;
use support::kube_harness::fencing::{apply, cm, elect, install, install_anchor, participant};
use support::kube_harness::{shared, unique};
use support::out::{Say, save_json};
use support::stats::{ms, p50_p99};
use tenure::Locker;
use tenure::backend::kube::{KubeBackend, KubeOptions};
use tenure::election::{ElectionConfig, Term};
use tenure::fence::kube::{FenceState, Fencer, FencingPolicy};
use tenure::shard::ShardedElector;
use tokio::sync::{mpsc, oneshot};

/// Writes before the measured ones, per mode: connections, caches, the first proofs.
const WARMUP: usize = 20;

const GROUP: &str = "orders";

/// The static run's second group, whose policy has the messages of before `SPARED`.
const LEGACY_GROUP: &str = "legacy";

/// How every message began before it was spared for writes naming another election.
const SPARED: &str = "variables.otherElection ? '' : ";

/// The mode names, by index.
const MODES: [&str; 5] = [
    "no policy matches (a Lease patch)",
    "not a participant (ConfigMap, matched by every policy's rules)",
    "single lease, its policy",
    "shard term, the group's policy",
    "shard term, the group's policy, messages not spared (before)",
];

fn main() -> ExitCode {
    let Some(rt) = support::role::runtime(2) else {
        return ExitCode::FAILURE;
    };
    rt.block_on(run());
    ExitCode::SUCCESS
}

/// One replica of the group, run in the background: each shard term it begins is sent on the
/// channel; the sender ends the run, which the handle then awaits.
fn replica(
    client: &kube::Client,
    ns: &str,
    identity: &str,
    shards: u32,
) -> (
    mpsc::UnboundedReceiver<(u32, Term)>,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let backend = KubeBackend::from_client(client.clone(), KubeOptions::new().namespace(ns))
        .expect("backend");
    let locker = Locker::with_identity(backend, identity).expect("identity");
    let config = ElectionConfig::new()
        .lease_duration(Duration::from_secs(15))
        .renew_deadline(Duration::from_secs(10))
        .retry_period(Duration::from_millis(500));
    let elector = ShardedElector::new(locker, GROUP, shards, config).expect("elector");
    let (terms, begun) = mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        let run = elector.run_until(
            async {
                let _ = stopped.await;
            },
            move |shard, term: Term| {
                let _ = terms.send((shard, term.clone()));
                async move { term.cancellation().cancelled().await }
            },
        );
        if let Err(e) = run.await {
            eprintln!("the replica's group run ended: {e}");
        }
    });
    (begun, stop, run)
}

/// Proves every shard's term as it is delivered, all at once: (shard, time to the answer),
/// and the terms.
async fn prove_as_delivered(
    fencer: &Fencer,
    begun: &mut mpsc::UnboundedReceiver<(u32, Term)>,
    shards: u32,
) -> (Vec<Duration>, BTreeMap<u32, Term>) {
    let mut proofs = tokio::task::JoinSet::new();
    let mut terms = BTreeMap::new();
    while terms.len() < shards as usize {
        let (shard, term) = tokio::time::timeout(Duration::from_secs(120), begun.recv())
            .await
            .unwrap_or_else(|_| panic!("only shards {:?} began within 120 s", terms.keys()))
            .expect("the replica runs");
        let fencer = fencer.clone();
        let proving = term.clone();
        proofs.spawn(async move {
            let start = Instant::now();
            let state = fencer.prove(&proving).await;
            (shard, start.elapsed(), state)
        });
        terms.insert(shard, term);
    }
    let mut took = Vec::new();
    while let Some(done) = proofs.join_next().await {
        let (shard, elapsed, state) = done.expect("a proof task");
        assert!(
            matches!(state, FenceState::Enforced),
            "shard {shard}'s first proof: {state:?}"
        );
        took.push(elapsed);
    }
    (took, terms)
}

/// The floor of every shard Lease of a static group (`TENURE_BENCH_STATIC=1`).
const STATIC_FLOOR: u64 = 1_000;

/// A static group (`TENURE_BENCH_STATIC=1`): the `shards` shard Leases made directly, as a
/// group's replicas leave them — named `GROUP-SHARD`, labelled for the group, each with a
/// floor — but held by no one, so no elector's renewals load the API server under the
/// measured writes (at 64 and more shards on a loaded two-core machine, a replica's terms
/// churned). The policy evaluates exactly these parameters for each write.
async fn static_shard_leases(ns: &str, group: &FencingPolicy, shards: u32) {
    let label = group.lease_name().to_owned();
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(shared().admin().await, ns);
    for shard in 0..shards {
        let lease = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": group.shard_lease(shard),
                "labels": {tenure::backend::kube::SHARD_GROUP_LABEL: label},
                "annotations": {"tenure.dev/fencing-floor": STATIC_FLOOR.to_string()},
            },
        }))
        .expect("a Lease");
        leases
            .create(&PostParams::default(), &lease)
            .await
            .unwrap_or_else(|e| panic!("shard Lease {shard}: {e}"));
    }
    // The API server's parameter informer sees them within a second or so.
    tokio::time::sleep(Duration::from_secs(3)).await;
}

/// A fenced API of shard 0's next term, as the replica begins it (other shards' terms that
/// begin meanwhile are left alone).
async fn next_term_of_shard_0(
    fencer: &Fencer,
    begun: &mut mpsc::UnboundedReceiver<(u32, Term)>,
    ns: &str,
) -> tenure::fence::kube::FencedApi<ConfigMap> {
    loop {
        let (shard, term) = tokio::time::timeout(Duration::from_secs(120), begun.recv())
            .await
            .unwrap_or_else(|_| panic!("no new term of shard 0 within 120 s"))
            .expect("the replica runs");
        if shard == 0 {
            return fencer.namespaced::<ConfigMap>(&term, ns);
        }
    }
}

async fn run() {
    let writes = knob("TENURE_BENCH_WRITES", 300);
    let static_group = knob("TENURE_BENCH_STATIC", 0_u32) == 1;
    // A static group has no terms to prove.
    let rounds = if static_group {
        0
    } else {
        knob("TENURE_BENCH_ROUNDS", 5_usize)
    };
    let shards = knob("TENURE_BENCH_SHARDS", 16_u32);
    let server = shared();
    let ns = unique("bench-shardfence");
    server.namespace(&ns).await;
    let (group_sa, _) = participant(&ns, "grp").await;
    let (single_sa, _) = participant(&ns, "one").await;
    let (outsider, _) = participant(&ns, "outsider").await;
    let group = FencingPolicy::new(&ns, GROUP)
        .and_then(|p| p.service_account(&ns, "grp"))
        .and_then(|p| p.resource("configmaps"))
        .and_then(|p| p.shards(shards))
        .unwrap_or_else(|e| panic!("{e}"));
    install_anchor().await;
    let admin = server.admin().await;
    install_policy(admin, &group, &group.policy()).await;
    // The binding selects nothing yet: give the API server's policy informer time to load it.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // ---- the first term's proof, per shard ----
    let fencer = Fencer::new(group_sa.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns);
    let mut all: Vec<Duration> = Vec::new();
    let mut first_round: Vec<Duration> = Vec::new();
    let mut live = None;
    if static_group {
        static_shard_leases(&ns, &group, shards).await;
    }
    for round in 0..rounds {
        let (mut begun, stop, handle) = replica(&group_sa, &ns, &format!("r{round}"), shards);
        let t = Instant::now();
        let (took, terms) = prove_as_delivered(&fencer, &mut begun, shards).await;
        let (p50, p99) = p50_p99(took.clone());
        eprintln!(
            "round {round}: {shards} shard terms proven in {:.0} ms (per shard p50 {:.1} ms, p99 {:.1} ms)",
            ms(t.elapsed()),
            ms(p50),
            ms(p99)
        );
        if round == 0 {
            first_round.clone_from(&took);
        }
        all.extend(took);
        if round + 1 == rounds {
            live = Some((terms, begun, stop, handle));
        } else {
            let _ = stop.send(());
            let _ = handle.await;
        }
    }
    // The shard writer: shard 0's term of the last round, or (static) its token.
    let mut replica_run = live;

    // ---- admission per write: group policy vs a single lease's ----
    let single = FencingPolicy::new(&ns, "solo")
        .and_then(|p| p.service_account(&ns, "one"))
        .and_then(|p| p.resource("configmaps"))
        .unwrap_or_else(|e| panic!("{e}"));
    let (solo_term, _end_solo, _solo_run) = elect(&single_sa, &ns, "solo").await;
    install(&single, &Api::namespaced(single_sa.clone(), &ns)).await;
    let single_fencer = Fencer::new(single_sa.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns);
    let unmatched: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(outsider.clone(), &ns);
    let baseline: Api<ConfigMap> = Api::namespaced(outsider.clone(), &ns);
    let single_api = single_fencer.namespaced::<ConfigMap>(&solo_term, &ns);
    let mut shard_api = match &replica_run {
        Some((terms, ..)) => fencer.namespaced::<ConfigMap>(&terms[&0], &ns),
        None => fencer.namespaced_with_token(
            &group.shard_lease(0),
            tenure::FencingToken::new(STATIC_FLOOR),
            &ns,
        ),
    };
    let legacy_api = if static_group && knob("TENURE_BENCH_LEGACY", 1_u32) == 1 {
        Some(legacy_group(&ns, shards).await)
    } else {
        None
    };
    let modes: Vec<usize> = if static_group {
        (0..MODES.len())
            .filter(|&m| m != 4 || legacy_api.is_some())
            .collect()
    } else {
        vec![1, 2, 3]
    };
    // Shard 0's terms after the first (one ended under load: its replica could not renew in
    // time); their writes' latency is measured like the first's.
    let mut new_terms = 0;
    let admin = server.admin().await;
    for name in ["lat-plain", "lat-single", "lat-shard", "lat-legacy"] {
        let _ = Api::<ConfigMap>::namespaced(admin.clone(), &ns)
            .create(&PostParams::default(), &cm(name, "0"))
            .await;
    }
    let _ = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(admin, &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "lat-none"}}))
                .expect("a Lease"),
        )
        .await;
    let pp = PatchParams::default();
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); MODES.len()];
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    for i in 0..writes + WARMUP {
        let patch = Patch::Merge(serde_json::json!({"data": {"v": i.to_string()}}));
        let mut order = modes.clone();
        for j in (1..order.len()).rev() {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            #[allow(clippy::cast_possible_truncation)]
            order.swap(j, (rng % (j as u64 + 1)) as usize);
        }
        for mode in order {
            let start = Instant::now();
            let result = if mode == 3 {
                match shard_api.patch("lat-shard", &pp, &patch).await {
                    Ok(_) => Ok(()),
                    // The shard's term ended (a renewal late on a loaded machine): write
                    // with its next term, and leave this sample out.
                    Err(e) if e.is_stale() && replica_run.is_some() => {
                        eprintln!("write {i}: shard 0's term ended ({e}); taking its next");
                        let Some((_, begun, ..)) = replica_run.as_mut() else {
                            unreachable!("guarded");
                        };
                        shard_api = next_term_of_shard_0(&fencer, begun, &ns).await;
                        new_terms += 1;
                        continue;
                    }
                    Err(e) => Err(e.to_string()),
                }
            } else {
                let writers = Writers {
                    unmatched: &unmatched,
                    baseline: &baseline,
                    single: &single_api,
                    shard: &shard_api,
                    legacy: legacy_api.as_ref(),
                };
                writers.write(mode, i).await
            };
            let elapsed = start.elapsed();
            if let Err(e) = result {
                panic!("mode {mode}'s write {i} failed: {e}");
            }
            if i >= WARMUP {
                samples[mode].push(elapsed);
            }
        }
    }
    if let Some((_, _, stop, handle)) = replica_run {
        let _ = stop.send(());
        let _ = handle.await;
    }

    // ---- the API server's CPU per 1,000 writes of each mode (static only) ----
    let cpu_writes = knob("TENURE_BENCH_CPU_WRITES", 0_usize);
    let cpu = if static_group && cpu_writes > 0 {
        let writers = Writers {
            unmatched: &unmatched,
            baseline: &baseline,
            single: &single_api,
            shard: &shard_api,
            legacy: legacy_api.as_ref(),
        };
        cpu_per_thousand(&writers, &modes, cpu_writes).await
    } else {
        Vec::new()
    };

    let (all50, all99) = p50_p99(all.clone());
    let (first50, first99) = p50_p99(first_round);
    let stats: Vec<Option<(Duration, Duration)>> = samples
        .into_iter()
        .map(|v| (!v.is_empty()).then(|| p50_p99(v)))
        .collect();
    let plain = stats[1].expect("the not-a-participant mode always runs");
    println!(
        "kube_fence_shards: {shards} shards, {rounds} rounds, {writes} writes a mode ({new_terms} later terms of shard 0 written with)"
    );
    println!(
        "first-term proof per shard: p50 {:.1} ms, p99 {:.1} ms ({} proofs); first round (new Leases): p50 {:.1} ms, p99 {:.1} ms",
        ms(all50),
        ms(all99),
        all.len(),
        ms(first50),
        ms(first99)
    );
    println!("| write | p50 ms | p99 ms | p50 / not a participant | p99 / not a participant |");
    println!("|---|---|---|---|---|");
    for (name, stat) in MODES.iter().zip(&stats) {
        let Some((p50, p99)) = stat else { continue };
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} |",
            ms(*p50),
            ms(*p99),
            p50.as_secs_f64() / plain.0.as_secs_f64(),
            p99.as_secs_f64() / plain.1.as_secs_f64()
        );
    }
    if let (Some(single_w), Some(shard_w)) = (stats[2], stats[3]) {
        println!(
            "group vs single: p50 {:+.2} ms, p99 {:+.2} ms",
            ms(shard_w.0) - ms(single_w.0),
            ms(shard_w.1) - ms(single_w.1)
        );
    }
    if let (Some(legacy_w), Some(shard_w)) = (stats[4], stats[3]) {
        println!(
            "spared messages vs before: p50 {:+.2} ms, p99 {:+.2} ms",
            ms(shard_w.0) - ms(legacy_w.0),
            ms(shard_w.1) - ms(legacy_w.1)
        );
    }
    if !cpu.is_empty() {
        println!(
            "| API server CPU per 1,000 writes ({cpu_writes}-write blocks) | CPU-s per 1,000, each round | mean |"
        );
        println!("|---|---|---|");
        for (mode, per_round) in &cpu {
            let mean = per_round.iter().sum::<f64>() / per_round.len().max(1) as f64;
            let rounds: Vec<String> = per_round.iter().map(|c| format!("{c:.3}")).collect();
            println!("| {} | {} | {mean:.3} |", MODES[*mode], rounds.join(", "));
        }
    }
    let json_ms = |stat: &Option<(Duration, Duration)>| {
        stat.map_or(
            serde_json::Value::Null,
            |(p50, p99)| serde_json::json!({"p50": ms(p50), "p99": ms(p99)}),
        )
    };
    save_json(
        "kube_fence_shards.json",
        &serde_json::json!({
            "shards": shards, "static": static_group, "rounds": rounds, "writes": writes, "later_shard_terms": new_terms,
            "proof_ms": {"p50": ms(all50), "p99": ms(all99), "n": all.len()},
            "proof_first_round_ms": {"p50": ms(first50), "p99": ms(first99)},
            "write_ms": {
                "unmatched": json_ms(&stats[0]),
                "baseline": json_ms(&stats[1]),
                "single": json_ms(&stats[2]),
                "shard": json_ms(&stats[3]),
                "shard_unspared": json_ms(&stats[4]),
            },
            "cpu_s_per_1000_writes": cpu.iter().map(|(m, c)| (MODES[*m].to_owned(), serde_json::json!(c))).collect::<BTreeMap<_, _>>(),
        }),
        Say::Stdout,
    );
}

/// The writers of every mode but a replica's shard term's (whose term may end mid-run).
struct Writers<'a> {
    unmatched: &'a Api<k8s_openapi::api::coordination::v1::Lease>,
    baseline: &'a Api<ConfigMap>,
    single: &'a tenure::fence::kube::FencedApi<ConfigMap>,
    shard: &'a tenure::fence::kube::FencedApi<ConfigMap>,
    legacy: Option<&'a tenure::fence::kube::FencedApi<ConfigMap>>,
}

impl Writers<'_> {
    /// Write `i` of `mode` (an index of [`MODES`]).
    async fn write(&self, mode: usize, i: usize) -> Result<(), String> {
        let pp = PatchParams::default();
        let patch = Patch::Merge(serde_json::json!({"data": {"v": i.to_string()}}));
        let done = |r: Result<ConfigMap, String>| r.map(|_| ());
        match mode {
            0 => self
                .unmatched
                .patch(
                    "lat-none",
                    &pp,
                    &Patch::Merge(
                        serde_json::json!({"metadata": {"annotations": {"v": i.to_string()}}}),
                    ),
                )
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            1 => self
                .baseline
                .patch("lat-plain", &pp, &patch)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            2 => done(
                self.single
                    .patch("lat-single", &pp, &patch)
                    .await
                    .map_err(|e| e.to_string()),
            ),
            3 => done(
                self.shard
                    .patch("lat-shard", &pp, &patch)
                    .await
                    .map_err(|e| e.to_string()),
            ),
            _ => match self.legacy {
                Some(api) => done(
                    api.patch("lat-legacy", &pp, &patch)
                        .await
                        .map_err(|e| e.to_string()),
                ),
                None => Err("no legacy group (static runs only)".to_owned()),
            },
        }
    }
}

/// The API server's CPU-seconds per 1,000 writes of each of `modes`: `rounds` blocks of
/// `block` writes each, the modes rotated each round.
async fn cpu_per_thousand(
    writers: &Writers<'_>,
    modes: &[usize],
    block: usize,
) -> Vec<(usize, Vec<f64>)> {
    let Some(pid) = shared().pid() else {
        eprintln!("the API server is not this bench's (TENURE_KUBE_DIR): its CPU is not measured");
        return Vec::new();
    };
    let rounds = knob("TENURE_BENCH_CPU_ROUNDS", 3_usize);
    let mut per_mode: Vec<(usize, Vec<f64>)> = modes.iter().map(|&m| (m, Vec::new())).collect();
    for round in 0..rounds {
        for k in 0..modes.len() {
            let slot = (k + round) % modes.len();
            let mode = modes[slot];
            let before = support::proc::cpu_time(pid).expect("the API server's /proc/PID/stat");
            for i in 0..block {
                if let Err(e) = writers.write(mode, i).await {
                    panic!("CPU block of mode {mode}: write {i} failed: {e}");
                }
            }
            let after = support::proc::cpu_time(pid).expect("the API server's /proc/PID/stat");
            #[allow(clippy::cast_precision_loss)]
            let per_thousand = (after - before).as_secs_f64() * 1_000.0 / block as f64;
            eprintln!(
                "cpu round {round}: {}: {per_thousand:.3} CPU-s per 1,000 writes",
                MODES[mode]
            );
            per_mode[slot].1.push(per_thousand);
        }
    }
    per_mode
}

/// The static run's second group ([`LEGACY_GROUP`], as many shards, a participant of its
/// own): its policy's messages as they were before [`SPARED`]; a fenced API of its shard 0.
async fn legacy_group(ns: &str, shards: u32) -> tenure::fence::kube::FencedApi<ConfigMap> {
    let (legacy_sa, _) = participant(ns, "grpold").await;
    let legacy = FencingPolicy::new(ns, LEGACY_GROUP)
        .and_then(|p| p.service_account(ns, "grpold"))
        .and_then(|p| p.resource("configmaps"))
        .and_then(|p| p.shards(shards))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut policy = legacy.policy();
    for v in policy
        .spec
        .as_mut()
        .and_then(|s| s.validations.as_mut())
        .into_iter()
        .flatten()
    {
        let message = v
            .message_expression
            .as_deref()
            .expect("a message expression");
        v.message_expression = Some(
            message
                .strip_prefix(SPARED)
                .expect("every message begins spared")
                .to_owned(),
        );
    }
    let admin = shared().admin().await;
    install_policy(admin, &legacy, &policy).await;
    static_shard_leases(ns, &legacy, shards).await;
    Fencer::new(legacy_sa)
        .await
        .expect("identity")
        .lease_namespace(ns)
        .namespaced_with_token(
            &legacy.shard_lease(0),
            tenure::FencingToken::new(STATIC_FLOOR),
            ns,
        )
}

/// Applies `policy` (the election's, or a variant of it) and the election's binding.
async fn install_policy(
    admin: kube::Client,
    election: &FencingPolicy,
    policy: &ValidatingAdmissionPolicy,
) {
    apply(
        &Api::<ValidatingAdmissionPolicy>::all(admin.clone()),
        &election.name(),
        policy,
    )
    .await;
    apply(
        &Api::<ValidatingAdmissionPolicyBinding>::all(admin),
        &election.name(),
        &election.binding(),
    )
    .await;
}
