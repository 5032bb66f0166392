//! Sharded leadership end to end on the real kube-apiserver, with separate processes (the
//! scenario is in `shard_e2e`): 32 shards over 3 → 5 → 2 → 3 replicas and a kill -9, 0 stale
//! writes accepted, rebalance times printed; and a rolling update from 8 to 12 shards.

mod kube_support;
mod safety;
mod shard_e2e;

use std::path::PathBuf;
use std::time::Duration;

use tenure::backend::kube::{KubeBackend, KubeOptions};

const CHILD_DIR: &str = "TENURE_SHARD_DIR";
const CHILD_KUBECONFIG: &str = "TENURE_SHARD_KUBECONFIG";
const CHILD_NS: &str = "TENURE_SHARD_NS";
const REPLICA_LOG: &str = "TENURE_REPLICA_LOG";

/// The replicas' timings: a lease of 6 s, renewed every 2 s, each renewal allowed until the
/// renew deadline 2 s later. Not the 2 s lease the Redis suite's replicas use: 32 shards on
/// it are 48 Lease writes a second (each fanned out to every replica's watch), more than an
/// API server sharing two cores with two busy loops and five replicas serves in time. In a
/// flake hunt under `--load` (load 15–20) single GETs of the group record took over 1.5 s,
/// the replicas' own workloads took longer than 115 ms to notice a cancellation, and every
/// shard term was lost at its 1.3 s renew deadline, also once a renewal could take until
/// that deadline (#42). A third of the writes, and 2 s for each, fit.
fn replica_config() -> tenure::ElectionConfig {
    tenure::ElectionConfig::new()
        .lease_duration(Duration::from_secs(6))
        .renew_deadline(Duration::from_secs(4))
        .retry_period(Duration::from_secs(1))
        .stop_margin(Duration::from_secs(1))
        .rejoin(true)
}

/// Each HTTP request of a replica's backend: up to the time a renewal has (above), not the
/// default 1.5 s, which a GET on the loaded server exceeded.
const REPLICA_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs this binary's replica when the scenario re-ran it as one; whether it did.
async fn as_replica() -> bool {
    let (Ok(dir), Ok(kubeconfig), Ok(ns), Ok(identity)) = (
        std::env::var(CHILD_DIR),
        std::env::var(CHILD_KUBECONFIG),
        std::env::var(CHILD_NS),
        std::env::var("TENURE_SAFETY_IDENTITY"),
    ) else {
        return false;
    };
    // With `TENURE_REPLICA_LOG` set (say under scripts/flake-hunt.sh), each replica logs its
    // warnings to stderr, which the run's log keeps: why a shard was lost, not only that.
    if std::env::var_os(REPLICA_LOG).is_some() {
        let _ = tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::WARN)
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .finish(),
        );
    }
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    let backend = KubeBackend::from_config(
        config,
        KubeOptions::new()
            .namespace(ns)
            .request_timeout(REPLICA_REQUEST_TIMEOUT),
    )
    .expect("backend");
    // A span at the log's level, so that each line names its replica.
    let span = tracing::warn_span!("replica", id = %identity);
    tracing::Instrument::instrument(
        shard_e2e::candidate(backend, &identity, &PathBuf::from(dir), replica_config()),
        span,
    )
    .await;
    true
}

/// Held by each test while it runs: one at a time. They share one apiserver on what may be a
/// two-core machine, and the thousand-shards replica keeps all 32 of its request slots busy
/// for a minute or more; beside it, under CPU load, the 32-shard scenario's replicas (whose
/// requests time out after 1 s) started no shard in 60 s (2 of 5 runs in a flake hunt).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A fresh namespace and register directory, and the replicas' environment.
async fn setting(what: &str) -> (PathBuf, [(&'static str, String); 3]) {
    let server = kube_support::shared();
    let ns = kube_support::unique(what);
    server.namespace(&ns).await;
    let dir = kube_support::fresh_dir(what);
    shard_e2e::registers(&dir);
    let env = [
        (CHILD_DIR, dir.display().to_string()),
        (
            CHILD_KUBECONFIG,
            server.admin_kubeconfig().display().to_string(),
        ),
        (CHILD_NS, ns),
    ];
    (dir, env)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_shards_over_three_five_two_three_replicas_and_a_kill() {
    if as_replica().await {
        return;
    }
    let _alone = ONE_AT_A_TIME.lock().await;
    let (dir, env) = setting("shards").await;
    let times = shard_e2e::scenario(
        "thirty_two_shards_over_three_five_two_three_replicas_and_a_kill",
        &env,
        &dir,
    );
    println!("sharded rebalance on kube (32 shards, lease 6 s), 0 stale writes: {times:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_from_8_to_12_shards_never_runs_two_counts_at_once() {
    if as_replica().await {
        return;
    }
    let _alone = ONE_AT_A_TIME.lock().await;
    let (dir, env) = setting("resize").await;
    let took = shard_e2e::resize_scenario(
        "a_rolling_update_from_8_to_12_shards_never_runs_two_counts_at_once",
        &env,
        &dir,
        8,
        12,
    );
    println!(
        "8 → 12 shards on kube (lease 6 s): the new count ran {took:?} after the last old replica's SIGTERM"
    );
}

/// Set in the child of [`a_thousand_shards_in_one_process_stay_far_under_the_default_fd_limit`].
const THOUSAND: &str = "TENURE_SHARD_THOUSAND";
const THOUSAND_SHARDS: u32 = 1000;

/// The child's timings. This test is about open files, not throughput, so they leave the
/// replica room to renew 1,000 leases on a loaded machine: at the defaults (a renewal every
/// 5 s, each request bounded at 1 s including its wait for one of the backend's 32 slots) a
/// burst of 1,000 renewals needs ~30 ms per request, and a debug build beside two busy loops
/// held 0 to 200 of its 1,000 shards at any time for 300 s (15 minutes in a flake hunt). Here
/// a lease renews every 20 s and a request may wait 7 s: ~220 ms per request, 50 renewals a
/// second (at 15 s and 5 s the replica still lost shards on a machine at load 13).
fn thousand_config() -> tenure::ElectionConfig {
    tenure::ElectionConfig::new()
        .lease_duration(Duration::from_secs(60))
        .renew_deadline(Duration::from_secs(40))
        .retry_period(Duration::from_secs(8))
        .request_timeout(THOUSAND_REQUEST_TIMEOUT)
}

/// The request bound of the child's elector and backend.
const THOUSAND_REQUEST_TIMEOUT: Duration = Duration::from_secs(7);

/// How long the child may take to hold every shard and renew each lease twice before the test
/// stops it and fails (with what it printed) rather than waiting forever.
const THOUSAND_LIMIT: Duration = Duration::from_secs(600);

/// Issue #26: a replica's load does not grow with its shards. One process holds 1,000 shard
/// Leases under the default limit of 1,024 open files, with one watch for all of them and
/// requests in flight bounded: its open files stay a small constant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_shards_in_one_process_stay_far_under_the_default_fd_limit() {
    if std::env::var_os(THOUSAND).is_some() {
        thousand_shards().await;
        return;
    }
    let _alone = ONE_AT_A_TIME.lock().await;
    let (dir, env) = setting("thousand").await;
    let exe = std::env::current_exe().expect("test binary");
    let (out_path, err_path) = (dir.join("child.out"), dir.join("child.err"));
    let file = |p: &PathBuf| {
        std::fs::File::create(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()))
    };
    let mut child = std::process::Command::new(exe)
        .args([
            "a_thousand_shards_in_one_process_stay_far_under_the_default_fd_limit",
            "--exact",
            "--nocapture",
        ])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env(THOUSAND, "1")
        .stdin(std::process::Stdio::null())
        .stdout(file(&out_path))
        .stderr(file(&err_path))
        .spawn()
        .expect("child ran");
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break Some(status);
        }
        if started.elapsed() > THOUSAND_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let status = status.unwrap_or_else(|| {
        panic!("the replica did not finish within {THOUSAND_LIMIT:?}:\n{stdout}\n{stderr}")
    });
    assert!(status.success(), "{status}\n{stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("THOUSAND "))
        .unwrap_or_else(|| panic!("no result line: {stdout}"));
    println!("{line}");
    let field = |key: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} in {line}"))
    };
    assert_eq!(field("owned="), u64::from(THOUSAND_SHARDS), "{line}");
    assert!(
        field("peak_fds=") <= 96,
        "open files must not grow with the shards held: {line}"
    );
}

/// The child: 1,000 shards, all held by this one replica, under RLIMIT_NOFILE 1,024; prints
/// `THOUSAND owned=N peak_fds=F took_ms=T`.
async fn thousand_shards() {
    let limit = libc::rlimit {
        rlim_cur: 1024,
        rlim_max: 1024,
    };
    // SAFETY: setrlimit reads a valid rlimit; lowering our own limit has no other effect.
    assert_eq!(
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) },
        0
    );
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k}"));
    let kc = kube::config::Kubeconfig::read_from(var(CHILD_KUBECONFIG)).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    let backend = KubeBackend::from_config(
        config,
        KubeOptions::new()
            .namespace(var(CHILD_NS))
            .request_timeout(THOUSAND_REQUEST_TIMEOUT),
    )
    .expect("backend");
    let locker = tenure::Locker::with_identity(backend, "solo").expect("identity");
    let elector =
        tenure::shard::ShardedElector::new(locker, "thousand", THOUSAND_SHARDS, thousand_config())
            .expect("elector");
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                let open = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
                peak.fetch_max(open, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let started = std::time::Instant::now();
    // What a failure shows: how many shards the replica held as time went by.
    let progress = {
        let owned = elector.owned();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let held = owned.borrow().len();
                println!("held {held} shards after {:?}", started.elapsed());
            }
        })
    };
    let mut owned = elector.owned();
    let shutdown = async {
        let all = owned
            .wait_for(|o| o.len() == THOUSAND_SHARDS as usize)
            .await
            .is_ok();
        assert!(all, "the elector stopped before holding every shard");
        // Two renewals of every lease (one each lease_duration / 3), and a little more.
        tokio::time::sleep(Duration::from_secs(43)).await;
    };
    let took = std::cell::Cell::new(None);
    let run = elector.run_until(shutdown, |_shard, _term| std::future::pending::<()>());
    let watcher = async {
        let mut owned = elector.owned();
        let _ = owned
            .wait_for(|o| o.len() == THOUSAND_SHARDS as usize)
            .await;
        took.set(Some(started.elapsed()));
        std::future::pending::<()>().await;
    };
    let result = tokio::select! {
        r = run => r,
        () = watcher => unreachable!(),
    };
    sampler.abort();
    progress.abort();
    result.expect("the group ran");
    println!(
        "THOUSAND owned={} peak_fds={} took_ms={}",
        took.get().map_or(0, |_| THOUSAND_SHARDS),
        peak.load(std::sync::atomic::Ordering::Relaxed),
        took.get().map_or(0, |t| t.as_millis()),
    );
}
