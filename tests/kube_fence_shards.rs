//! One fencing policy per sharded group, on a real kube-apiserver: the binding selects the
//! group's shard Leases by their label and the API server evaluates the policy once per shard
//! Lease, each evaluation judging only the requests that name its own shard. A shard term's
//! `Fencer` clients prove their shard's fence and write; a stale token for a shard, another
//! shard's token (a shard its replica does not hold) and a write naming no shard are refused
//! by the API server, naming the group, the shard, the token and the current one; with the
//! group's binding deleted a shard term's proof fails closed naming the group's policy.
//! `tenure policy --shards` prints it (applied with kubectl) and `--check --shards` proves
//! every shard.
//!
//! Then `tenure run --shards 16 --fence` on three replicas, each copy writing its shard's
//! object through its own fenced endpoint, while replicas are frozen, thawed and killed: no
//! write of an older term of a shard lands after a newer term's (a watch of the objects is the
//! judge, in the API server's order); with the group's binding deleted the running copies'
//! writes fail closed and a shard taken over starts no copy (exit 8). And a resize under
//! writes (6 shards to 4, the replica holding a shard the new count never takes frozen through
//! it): no write of the old count lands after the new count's first write to that object, and
//! the old count's tokens are refused on every shard Lease, those beyond the new count too.
//! A fenced sharded run's `/metrics` carries each shard lease's token and fence state.

mod cli_support;
mod kube_support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cli_support::{Tenure, wait_until};
use futures::StreamExt;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use kube_support::fencing::{
    apply_policy, cm, enforced, group_replica, participant, raw_write, terms_of_all,
};
use kube_support::{kubectl, shared, unique};
use tenure::fence::kube::{FenceError, FenceState, Fencer, FencingPolicy};

const GROUP: &str = "orders";

fn group_policy(ns: &str, shards: u32) -> FencingPolicy {
    FencingPolicy::new(ns, GROUP)
        .and_then(|p| p.service_account(ns, "ctl"))
        .and_then(|p| p.resource("configmaps"))
        .and_then(|p| p.shards(shards))
        .expect("valid policy")
}

fn extras(election: Option<&str>, token: Option<u64>) -> Vec<String> {
    let mut e = Vec::new();
    if let Some(token) = token {
        e.push(format!("tenure.dev/fencing-token={token}"));
    }
    if let Some(election) = election {
        e.push(format!("tenure.dev/fencing-election={election}"));
    }
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_policy_judges_each_shard_by_its_own_lease_and_refuses_writes_naming_no_shard() {
    let ns = unique("shardfence");
    shared().namespace(&ns).await;
    let (client, kubeconfig) = participant(&ns, "ctl").await;
    let policy = group_policy(&ns, 4);
    let (mut begun, _stop) = group_replica(&client, &ns, GROUP, "r1", 4);
    let terms = terms_of_all(&mut begun, 4).await;
    apply_policy(&policy).await;
    for term in terms.values() {
        enforced(&client, &ns, term).await;
    }
    let fencer = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns);
    // Every shard's live term writes through a FencedApi of its Term, whatever the order of
    // the tokens: each is judged by its own shard Lease.
    for (shard, term) in &terms {
        fencer
            .namespaced::<ConfigMap>(term, &ns)
            .create(&PostParams::default(), &cm(&format!("obj-{shard}"), "x"))
            .await
            .unwrap_or_else(|e| panic!("shard {shard}'s live term was refused: {e}"));
    }
    let token = |shard: u32| terms[&shard].fencing_token().get();
    let election = |shard: u32| format!("{ns}/{GROUP}-{shard}");
    // The live token of each shard, naming it: admitted by the API server alone.
    for shard in 0..4 {
        raw_write(
            &kubeconfig,
            &ns,
            &format!("obj-{shard}"),
            &extras(Some(&election(shard)), Some(token(shard))),
        )
        .unwrap_or_else(|e| panic!("shard {shard}'s live token refused: {e}"));
    }
    // A stale token for shard 1: refused, naming the group, the shard, the token and the
    // current one.
    let refused = raw_write(
        &kubeconfig,
        &ns,
        "obj-1",
        &extras(Some(&election(1)), Some(token(1) - 1)),
    )
    .expect_err("a stale token of shard 1 admitted");
    assert!(
        refused.contains(&format!(
            "lease {ns}/{GROUP}-1: stale: token {} < current {} (shard 1 of group {ns}/{GROUP})",
            token(1) - 1,
            token(1)
        )),
        "{refused}"
    );
    // Another shard's live token naming shard 2: the replica does not hold shard 2 with it.
    let other = if token(3) > token(2) { 3 } else { 0 };
    let refused = raw_write(
        &kubeconfig,
        &ns,
        "obj-2",
        &extras(Some(&election(2)), Some(token(other))),
    )
    .expect_err("another shard's token admitted for shard 2");
    assert!(
        refused.contains(&format!("lease {ns}/{GROUP}-2: "))
            && refused.contains(&format!("token {}", token(other)))
            && refused.contains(&format!("{}", token(2)))
            && refused.contains(&format!("shard 2 of group {ns}/{GROUP}")),
        "{refused}"
    );
    // Writes naming no shard: the group itself, no election, no token.
    let refused = raw_write(
        &kubeconfig,
        &ns,
        "obj-0",
        &extras(Some(&format!("{ns}/{GROUP}")), Some(token(0))),
    )
    .expect_err("a write naming the group but no shard admitted");
    assert!(
        refused.contains(&format!("group {ns}/{GROUP}: missing shard")),
        "{refused}"
    );
    let refused = raw_write(&kubeconfig, &ns, "obj-0", &extras(None, Some(token(0))))
        .expect_err("a token naming no election admitted");
    assert!(refused.contains("missing election"), "{refused}");
    let refused = raw_write(&kubeconfig, &ns, "obj-0", &extras(None, None))
        .expect_err("a participant's write without a token admitted");
    assert!(refused.contains("missing token"), "{refused}");
    // Another election of the same participant (with no policy) is not judged by the group's.
    raw_write(
        &kubeconfig,
        &ns,
        "obj-0",
        &extras(Some(&format!("{ns}/elsewhere")), Some(1)),
    )
    .unwrap_or_else(|e| panic!("a write naming another election refused by the group: {e}"));

    // A single-lease election of the same ServiceAccount, fenced by its own policy: its term
    // and the group's shard terms write side by side, neither policy refusing the other's.
    let (solo_term, _solo_end, _solo_run) =
        kube_support::fencing::elect(&client, &ns, "solo").await;
    let solo = FencingPolicy::new(&ns, "solo")
        .and_then(|p| p.service_account(&ns, "ctl"))
        .and_then(|p| p.resource("configmaps"))
        .expect("valid policy");
    apply_policy(&solo).await;
    enforced(&client, &ns, &solo_term).await;
    for round in 0..2 {
        fencer
            .namespaced::<ConfigMap>(&solo_term, &ns)
            .create(&PostParams::default(), &cm(&format!("solo-{round}"), "x"))
            .await
            .unwrap_or_else(|e| panic!("the single lease's term was refused: {e}"));
        for (shard, term) in &terms {
            fencer
                .namespaced::<ConfigMap>(term, &ns)
                .create(
                    &PostParams::default(),
                    &cm(&format!("obj-{shard}-{round}"), "x"),
                )
                .await
                .unwrap_or_else(|e| {
                    panic!("shard {shard}'s term refused beside the single lease's: {e}")
                });
        }
    }
    // Each policy still refuses its own stale tokens.
    let solo_token = solo_term.fencing_token().get();
    let refused = raw_write(
        &kubeconfig,
        &ns,
        "obj-0",
        &extras(Some(&format!("{ns}/solo")), Some(solo_token - 1)),
    )
    .expect_err("the single lease's stale token admitted");
    assert!(
        refused.contains(&format!("lease {ns}/solo: stale")),
        "{refused}"
    );
    let refused = raw_write(
        &kubeconfig,
        &ns,
        "obj-0",
        &extras(Some(&election(0)), Some(token(0) - 1)),
    )
    .expect_err("shard 0's stale token admitted beside the single lease");
    assert!(
        refused.contains(&format!("lease {ns}/{GROUP}-0: stale")),
        "{refused}"
    );

    // The group's binding deleted: a shard term's proof fails closed, naming the group's
    // policy, and its fenced write is not sent.
    let admin = shared().admin().await;
    Api::<ValidatingAdmissionPolicyBinding>::all(admin)
        .delete(&policy.name(), &DeleteParams::default())
        .await
        .expect("delete the binding");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let cause = loop {
        let fresh = Fencer::new(client.clone())
            .await
            .expect("identity")
            .lease_namespace(&ns);
        match fresh.prove(&terms[&3]).await {
            FenceState::Unenforced { cause } => break cause,
            FenceState::Enforced if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("the deleted binding was not seen: {other:?}"),
        }
    };
    assert!(
        cause.contains(&format!("tenure-fencing.{ns}.{GROUP} ")) && cause.contains("shard 3"),
        "{cause}"
    );
    let fresh = Fencer::new(client.clone())
        .await
        .expect("identity")
        .lease_namespace(&ns);
    match fresh
        .namespaced::<ConfigMap>(&terms[&3], &ns)
        .create(&PostParams::default(), &cm("unfenced", "x"))
        .await
    {
        Err(FenceError::Unenforced { lease, .. }) => assert_eq!(lease, election(3)),
        other => panic!("a write with the binding gone was not refused: {other:?}"),
    }
    let cms: Api<ConfigMap> = Api::namespaced(client, &ns);
    assert!(cms.get_opt("unfenced").await.expect("read").is_none());
}

/// A term's copy (`tenure run --shards N --fence -- python3 WRITER DIR NS`): annotates each
/// ConfigMap its shard owns (listed in `DIR/keys-N-SHARD`) with `w=TOKEN-I` through its
/// term's endpoint, over one kept-alive connection, every 300 ms, logging each attempt to
/// `DIR/log-SHARD` as `ok IDENTITY TOKEN I KEY`, `refused IDENTITY TOKEN I KEY STATUS BODY`
/// or `failed IDENTITY TOKEN I KEY ERROR`.
const WRITER: &str = r#"
import http.client, json, os, sys, time, urllib.parse
out, ns = sys.argv[1], sys.argv[2]
env = os.environ
token, shard, shards, me = env["TENURE_FENCING_TOKEN"], env["TENURE_SHARD"], env["TENURE_SHARDS"], env["TENURE_IDENTITY"]
url = urllib.parse.urlsplit(env["TENURE_KUBE_SERVER"])
keys = open("%s/keys-%s-%s" % (out, shards, shard)).read().split()
log = open("%s/log-%s" % (out, shard), "a", buffering=1)
connect = lambda: http.client.HTTPConnection(url.hostname, url.port, timeout=10)
conn = connect()
i = 0
while True:
    i += 1
    for key in keys:
        body = json.dumps({"metadata": {"annotations": {"w": "%s-%d" % (token, i)}}})
        head = "%s %s %d %s" % (me, token, i, key)
        try:
            conn.request("PATCH", "%s/api/v1/namespaces/%s/configmaps/%s" % (url.path, ns, key), body,
                         {"Content-Type": "application/merge-patch+json"})
            r = conn.getresponse()
            data = r.read().decode(errors="replace").replace("\n", " ")
            if r.status == 200:
                log.write("ok %s\n" % head)
            else:
                log.write("refused %s %d %s\n" % (head, r.status, data[:600]))
        except Exception as e:
            log.write("failed %s %r\n" % (head, e))
            conn.close()
            conn = connect()
            time.sleep(0.2)
    time.sleep(0.3)
"#;

/// Every version of each object, by name, in the API server's order: (writer's token, its I).
type History = Arc<Mutex<BTreeMap<String, Vec<(u64, u64)>>>>;

/// A namespace for `tenure run --shards --fence` replicas: the participant `ctl`, the
/// group's policy from `tenure policy --shards` applied with kubectl, the objects the copies
/// write (`key-0` … labelled `fence-test`), and a watch recording every version of each.
struct Fleet {
    ns: String,
    dir: PathBuf,
    kubeconfig: PathBuf,
    /// Every version of each object, in the API server's order: (writer's token, its I).
    history: History,
    watch: tokio::task::JoinHandle<()>,
}

impl Fleet {
    /// The objects are `key-0` … up to the first `key-K` with which every shard of every
    /// count in `counts` owns at least one (so every shard term writes).
    async fn new(tag: &str, counts: &[u32]) -> Self {
        let ns = unique(tag);
        shared().namespace(&ns).await;
        let (_, kubeconfig) = participant(&ns, "ctl").await;
        let dir = kube_support::fresh_dir(tag);
        std::fs::write(dir.join("writer.py"), WRITER).expect("write the writer");
        let covered = |keys: usize| {
            counts.iter().all(|&n| {
                (0..n).all(|shard| {
                    (0..keys).any(|k| tenure::shard::shard_of(&format!("key-{k}"), n) == shard)
                })
            })
        };
        let keys = (1..10_000)
            .find(|&k| covered(k))
            .expect("keys for every shard");
        // Each count's keys per shard, as tenure::shard::shard_of spreads them.
        for &n in counts {
            for shard in 0..n {
                // One object a shard: 16 copies writing every key on two shared cores
                // would judge the machine, not the fence.
                let mine: Vec<String> = (0..keys)
                    .map(|k| format!("key-{k}"))
                    .filter(|k| tenure::shard::shard_of(k, n) == shard)
                    .take(1)
                    .collect();
                std::fs::write(dir.join(format!("keys-{n}-{shard}")), mine.join("\n"))
                    .expect("write keys");
            }
        }
        let admin = shared().admin().await;
        let cms: Api<ConfigMap> = Api::namespaced(admin, &ns);
        for k in 0..keys {
            let mut object = cm(&format!("key-{k}"), "0");
            object.metadata.labels = Some(BTreeMap::from([("fence-test".into(), "1".into())]));
            cms.create(&PostParams::default(), &object)
                .await
                .expect("create an object");
        }
        let history: History = Arc::default();
        let seen = history.clone();
        let watch = tokio::spawn(async move {
            let mut stream = kube::runtime::watcher(
                cms,
                kube::runtime::watcher::Config::default().labels("fence-test=1"),
            )
            .boxed();
            while let Some(event) = stream.next().await {
                if let Ok(kube::runtime::watcher::Event::Apply(cm)) = event
                    && let Some(name) = cm.metadata.name.clone()
                    && let Some(w) = cm.metadata.annotations.and_then(|mut a| a.remove("w"))
                    && let Some((t, i)) = w.split_once('-')
                    && let (Ok(t), Ok(i)) = (t.parse(), i.parse())
                {
                    seen.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(name)
                        .or_default()
                        .push((t, i));
                }
            }
        });
        let fleet = Self {
            ns,
            dir,
            kubeconfig,
            history,
            watch,
        };
        fleet.apply_printed_policy(counts[0]);
        fleet
    }

    /// `tenure policy --lease GROUP --shards N … | kubectl apply -f -` as admin.
    fn apply_printed_policy(&self, shards: u32) {
        let printed = std::process::Command::new(cli_support::TENURE)
            .args(["policy", "--lease", GROUP, "--namespace", &self.ns])
            .args(["--service-account", "ctl", "--resource", "configmaps"])
            .args(["--shards", &shards.to_string()])
            .output()
            .expect("tenure policy");
        assert!(printed.status.success(), "{printed:?}");
        let text = String::from_utf8_lossy(&printed.stdout).into_owned();
        assert!(text.contains("tenure.dev/shard-group: orders"), "{text}");
        for _ in 0..3 {
            let mut child = std::process::Command::new(kubectl())
                .arg("--kubeconfig")
                .arg(shared().admin_kubeconfig())
                .args(["apply", "-f", "-"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("kubectl");
            if let Some(mut stdin) = child.stdin.take() {
                use std::io::Write;
                stdin.write_all(text.as_bytes()).expect("pipe");
            }
            let out = child.wait_with_output().expect("kubectl apply");
            if out.status.success() {
                return;
            }
            // Another test applied the shared anchor at the same moment.
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("AlreadyExists"),
                "kubectl apply: {out:?}"
            );
        }
        panic!("kubectl apply kept racing");
    }

    /// `tenure run --lease GROUP --shards N --fence` as `identity`, its copies the writer.
    ///
    /// Leases of 8 s (renew deadline 6 s): with 16 shards, their copies and the API server
    /// on two cores shared with other builds, the 3 s of the other CLI tests lose terms to
    /// scheduling delays alone, which tests the machine rather than the fence.
    fn replica(&self, identity: &str, shards: u32) -> Tenure {
        self.replica_with(identity, shards, &[])
    }

    /// [`replica`](Self::replica) with `extra` flags of `tenure run`.
    fn replica_with(&self, identity: &str, shards: u32, extra: &[&str]) -> Tenure {
        let mut args = cli_support::strings(&["run", "--lease", GROUP, "--backend", "kube"]);
        args.extend(cli_support::strings(extra));
        args.extend(cli_support::strings(&[
            "--namespace",
            &self.ns,
            "--lease-duration",
            "8s",
            "--renew-deadline",
            "6s",
            "--retry-period",
            "1s",
            "--identity",
            identity,
            "--shards",
            &shards.to_string(),
            "--fence",
            "--",
            "python3",
        ]));
        args.extend([
            self.dir.join("writer.py").display().to_string(),
            self.dir.display().to_string(),
            self.ns.clone(),
        ]);
        Tenure::start(
            &args,
            &[("KUBECONFIG", &self.kubeconfig.display().to_string())],
            self.dir
                .join(format!("{identity}-{}.err", cli_support::now_ns())),
        )
    }

    fn log(&self, shard: u32) -> String {
        std::fs::read_to_string(self.dir.join(format!("log-{shard}"))).unwrap_or_default()
    }

    /// The last successful write of `shard`: (identity, token).
    fn last_ok(&self, shard: u32) -> Option<(String, u64)> {
        self.log(shard).lines().rev().find_map(|line| {
            let mut words = line.strip_prefix("ok ")?.split(' ');
            Some((words.next()?.to_owned(), words.next()?.parse().ok()?))
        })
    }

    /// Waits until every shard `0..shards` has written with a token above `after[shard]`.
    fn wait_all_writing(&self, shards: u32, after: &BTreeMap<u32, u64>, what: &str) {
        wait_until(Duration::from_secs(180), what, || {
            (0..shards).all(|s| {
                self.last_ok(s)
                    .is_some_and(|(_, t)| t > after.get(&s).copied().unwrap_or(0))
            })
        });
    }

    fn tokens_now(&self, shards: u32) -> BTreeMap<u32, u64> {
        (0..shards)
            .filter_map(|s| Some((s, self.last_ok(s)?.1)))
            .collect()
    }

    /// Writes of an older term that landed after a newer term's, per object.
    fn stale(&self) -> Vec<(String, (u64, u64, u64))> {
        let history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        history
            .iter()
            .flat_map(|(name, h)| {
                kube_support::landed_after_newer(h)
                    .into_iter()
                    .map(move |s| (name.clone(), s))
            })
            .collect()
    }
}

/// Freezes `replica` and its copies' process groups (as a paused pod); returns the groups.
fn freeze(replica: &Tenure) -> Vec<i32> {
    let groups = kube_support::child_process_groups(replica.pid());
    replica.signal(libc::SIGSTOP);
    for g in &groups {
        // SAFETY: signalling process groups our child created.
        unsafe { libc::kill(-g, libc::SIGSTOP) };
    }
    groups
}

fn thaw(replica: &Tenure, groups: &[i32]) {
    for g in groups {
        // SAFETY: as in `freeze`.
        unsafe { libc::kill(-g, libc::SIGCONT) };
    }
    replica.signal(libc::SIGCONT);
}

/// The shards whose last successful write was by `identity`.
fn held_by(fleet: &Fleet, shards: u32, identity: &str) -> Vec<u32> {
    (0..shards)
        .filter(|&s| fleet.last_ok(s).is_some_and(|(who, _)| who == identity))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_fenced_shards_on_three_replicas_frozen_killed_and_thawed_accept_no_stale_write() {
    const SHARDS: u32 = 16;
    let fleet = Fleet::new("shards16", &[SHARDS]).await;
    let mut replicas: BTreeMap<&str, Tenure> = ["r1", "r2", "r3"]
        .into_iter()
        .map(|id| (id, fleet.replica(id, SHARDS)))
        .collect();
    let every_shard: Vec<u32> = (0..SHARDS).collect();
    wait_until(
        Duration::from_secs(180),
        "every shard with keys writing",
        || every_shard.iter().all(|&s| fleet.last_ok(s).is_some()),
    );
    // Rounds: freeze r1 until its shards are written by newer terms, thaw it; kill r2 and
    // restart it; freeze r3 for less than a lease (nothing moves) and thaw it.
    let rounds: [(&str, &str); 3] = [("r1", "freeze"), ("r2", "kill"), ("r3", "blink")];
    for (who, how) in rounds {
        let before = fleet.tokens_now(SHARDS);
        let theirs: Vec<u32> = held_by(&fleet, SHARDS, who)
            .into_iter()
            .filter(|s| every_shard.contains(s))
            .collect();
        match how {
            "freeze" => {
                let groups = freeze(&replicas[who]);
                wait_until(
                    Duration::from_secs(120),
                    "the frozen replica's shards taken over",
                    || {
                        theirs
                            .iter()
                            .all(|&s| fleet.last_ok(s).is_some_and(|(_, t)| t > before[&s]))
                    },
                );
                thaw(&replicas[who], &groups);
            }
            "kill" => {
                // A pod killed: the replica and its copies at once.
                let groups = kube_support::child_process_groups(replicas[who].pid());
                replicas[who].signal(libc::SIGKILL);
                for g in groups {
                    // SAFETY: signalling process groups our child created.
                    unsafe { libc::kill(-g, libc::SIGKILL) };
                }
                wait_until(
                    Duration::from_secs(120),
                    "the killed replica's shards taken over",
                    || {
                        theirs
                            .iter()
                            .all(|&s| fleet.last_ok(s).is_some_and(|(_, t)| t > before[&s]))
                    },
                );
                replicas.insert(who, fleet.replica(who, SHARDS));
            }
            _ => {
                let groups = freeze(&replicas[who]);
                std::thread::sleep(Duration::from_millis(800));
                thaw(&replicas[who], &groups);
            }
        }
        // Writes go on afterwards, on every shard.
        let now = fleet.tokens_now(SHARDS);
        wait_until(Duration::from_secs(120), "writes after the round", || {
            every_shard.iter().all(|&s| {
                fleet
                    .log(s)
                    .lines()
                    .filter(|l| l.starts_with("ok "))
                    .count()
                    > 0
                    && fleet.last_ok(s).is_some_and(|(_, t)| t >= now[&s])
            })
        });
        eprintln!("round {who} {how}: it held shards {theirs:?}");
    }
    std::thread::sleep(Duration::from_secs(2));

    // The server refuses what no term of its shard holds: an old token of a moved shard, and
    // a live token of another shard.
    let floors = fleet.tokens_now(SHARDS);
    let moved: Vec<(u32, u64)> = every_shard
        .iter()
        .filter_map(|&s| {
            let first = fleet.log(s).lines().find_map(|l| {
                l.strip_prefix("ok ")?
                    .split(' ')
                    .nth(1)?
                    .parse::<u64>()
                    .ok()
            })?;
            (first < floors[&s]).then_some((s, first))
        })
        .collect();
    assert!(!moved.is_empty(), "no shard changed hands: {floors:?}");
    for &(shard, old) in &moved {
        let refused = raw_write(
            &fleet.kubeconfig,
            &fleet.ns,
            &format!("key-{}", 0),
            &extras(Some(&format!("{}/{GROUP}-{shard}", fleet.ns)), Some(old)),
        )
        .expect_err("an old term's token admitted");
        assert!(
            refused.contains(&format!(
                "lease {}/{GROUP}-{shard}: stale: token {old} < current",
                fleet.ns
            )),
            "{refused}"
        );
    }
    let (a, b) = (every_shard[0], every_shard[1]);
    let refused = raw_write(
        &fleet.kubeconfig,
        &fleet.ns,
        "key-0",
        &extras(Some(&format!("{}/{GROUP}-{a}", fleet.ns)), Some(floors[&b])),
    )
    .expect_err("a token of another shard admitted");
    assert!(
        refused.contains(&format!("shard {a} of group {}/{GROUP}", fleet.ns))
            && refused.contains(&format!("token {}", floors[&b])),
        "{refused}"
    );

    // The group's binding deleted: the running copies' writes fail closed within a recheck,
    // and a shard term that begins starts no copy: its replica exits 8 naming the group's
    // policy. (On a loaded machine terms move meanwhile, and a replica whose new term cannot
    // prove its fence leaves with its copies: a shard whose copy went that way is done too.)
    let admin = shared().admin().await;
    let policy = group_policy(&fleet.ns, SHARDS);
    Api::<ValidatingAdmissionPolicyBinding>::all(admin)
        .delete(&policy.name(), &DeleteParams::default())
        .await
        .expect("delete the binding");
    let marks: BTreeMap<u32, usize> = every_shard
        .iter()
        .map(|&s| (s, fleet.log(s).len()))
        .collect();
    let mut exited: BTreeMap<&str, (Option<i32>, String)> = BTreeMap::new();
    let check_exits = |replicas: &mut BTreeMap<&'static str, Tenure>,
                       exited: &mut BTreeMap<&str, (Option<i32>, String)>| {
        for (who, r) in replicas.iter_mut() {
            if !exited.contains_key(who)
                && let Ok(Some(status)) = r.child.try_wait()
            {
                exited.insert(*who, (status.code(), r.log()));
            }
        }
    };
    let refused_unfenced = |s: u32| {
        fleet.log(s)[marks[&s]..]
            .lines()
            .any(|l| l.starts_with("refused ") && l.contains("not enforced"))
    };
    wait_until(
        Duration::from_secs(90),
        "every copy's writes refused as unfenced, or its replica gone",
        || {
            check_exits(&mut replicas, &mut exited);
            exited.len() == replicas.len() || every_shard.iter().all(|&s| refused_unfenced(s))
        },
    );
    let refused_shards = every_shard.iter().filter(|&&s| refused_unfenced(s)).count();
    let mut killed = None;
    if exited.is_empty() {
        // Every copy refused and every replica running: r1 killed, its shards' next terms
        // cannot prove their fence.
        let groups = kube_support::child_process_groups(replicas["r1"].pid());
        replicas["r1"].signal(libc::SIGKILL);
        for g in groups {
            // SAFETY: signalling process groups our child created.
            unsafe { libc::kill(-g, libc::SIGKILL) };
        }
        killed = Some("r1");
        wait_until(Duration::from_secs(120), "a survivor exits 8", || {
            check_exits(&mut replicas, &mut exited);
            exited.keys().any(|w| Some(*w) != killed)
        });
    }
    let stopped: Vec<_> = exited.iter().filter(|(w, _)| Some(**w) != killed).collect();
    assert!(!stopped.is_empty());
    for (who, (code, log)) in stopped {
        assert_eq!(*code, Some(8), "{who}: {log}");
        assert!(
            log.contains("the command was not started")
                && log.contains(&format!("tenure-fencing.{}.{GROUP}", fleet.ns)),
            "{who}: {log}"
        );
    }
    eprintln!(
        "binding deleted: {refused_shards} of {SHARDS} shards' copies refused as unfenced; replicas exited 8: {:?}",
        exited
            .keys()
            .filter(|w| Some(**w) != killed)
            .collect::<Vec<_>>()
    );
    drop(replicas);
    fleet.watch.abort();

    let stale = fleet.stale();
    let history = fleet
        .history
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let versions: usize = history.values().map(Vec::len).sum();
    let terms: usize = history
        .values()
        .map(|h| {
            h.iter()
                .map(|v| v.0)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        })
        .sum();
    let refused: usize = (0..SHARDS)
        .map(|s| {
            fleet
                .log(s)
                .lines()
                .filter(|l| l.starts_with("refused "))
                .count()
        })
        .sum();
    eprintln!(
        "{versions} versions of {} objects, {terms} object-terms, {} shards moved, refusals heard {refused}, stale accepted {}",
        history.len(),
        moved.len(),
        stale.len()
    );
    assert!(
        stale.is_empty(),
        "stale writes accepted after a newer term's: {stale:?}"
    );
}

/// The resize hole: a copy of the old count frozen through a resize from 6 shards to 4 (its
/// replica holding shard 5, which the new count never takes) and thawed once the new count
/// writes. None of its writes lands (the watch of the objects counts every accepted write as
/// an effect), and every old term's token is refused on every shard Lease of the old count,
/// those beyond the new count too: the drain took each old lease once, so its current token
/// is above every old term's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_resize_a_thawed_copy_of_the_old_count_writes_nothing() {
    const OLD: u32 = 6;
    const NEW: u32 = 4;
    let fleet = Fleet::new("shardresize", &[OLD, NEW]).await;
    let mut old: BTreeMap<String, Tenure> = ["a1", "a2"]
        .into_iter()
        .map(|id| (id.to_owned(), fleet.replica(id, OLD)))
        .collect();
    fleet.wait_all_writing(
        OLD,
        &BTreeMap::new(),
        "every shard of the old count writing",
    );
    let (frozen_id, _) = fleet.last_ok(OLD - 1).expect("the last shard writes");
    let frozen = old.remove(&frozen_id).expect("an old replica");
    let groups = freeze(&frozen);
    // Every old term's token, the frozen replica's shards' last ones included.
    std::thread::sleep(Duration::from_millis(300));
    let old_tokens = fleet.tokens_now(OLD);
    let frozen_shards = held_by(&fleet, OLD, &frozen_id);
    assert!(frozen_shards.contains(&(OLD - 1)), "{frozen_shards:?}");
    // A rolling update: the other old replica leaves, two of the new count join.
    for (id, mut r) in old {
        r.signal(libc::SIGTERM);
        let status = r.wait(Duration::from_secs(30));
        assert!(status.success(), "{id}: {status:?}: {}", r.log());
    }
    let new: Vec<Tenure> = ["b1", "b2"]
        .into_iter()
        .map(|id| fleet.replica(id, NEW))
        .collect();
    let newest_old = old_tokens.values().copied().max().unwrap_or(0);
    let above: BTreeMap<u32, u64> = (0..NEW).map(|s| (s, newest_old)).collect();
    fleet.wait_all_writing(NEW, &above, "every shard of the new count writing");
    // The frozen copy wakes up with its old terms and writes until its replica sees them
    // over: every write refused.
    let marks: BTreeMap<u32, usize> = (0..OLD).map(|s| (s, fleet.log(s).len())).collect();
    thaw(&frozen, &groups);
    std::thread::sleep(Duration::from_secs(5));
    let woke: Vec<String> = (0..OLD)
        .flat_map(|s| {
            fleet.log(s)[marks[&s]..]
                .lines()
                .filter(|l| l.split(' ').nth(1) == Some(frozen_id.as_str()))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    let landed: Vec<&String> = woke.iter().filter(|l| l.starts_with("ok ")).collect();
    assert!(
        landed.is_empty(),
        "the thawed old copy's writes: {landed:?}"
    );
    // Each old shard's last old token, naming its Lease: refused as stale by the API server,
    // on the shards the new count runs and on those it does not.
    for (&shard, &token) in &old_tokens {
        let refused = raw_write(
            &fleet.kubeconfig,
            &fleet.ns,
            "key-0",
            &extras(Some(&format!("{}/{GROUP}-{shard}", fleet.ns)), Some(token)),
        )
        .expect_err("an old count's token admitted");
        assert!(
            refused.contains(&format!(
                "lease {}/{GROUP}-{shard}: stale: token {token} < current",
                fleet.ns
            )),
            "shard {shard}: {refused}"
        );
    }
    drop(new);
    drop(frozen);
    std::thread::sleep(Duration::from_millis(500));
    fleet.watch.abort();
    let stale = fleet.stale();
    let history = fleet
        .history
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let versions: usize = history.values().map(Vec::len).sum();
    let refused = woke.iter().filter(|l| l.starts_with("refused ")).count();
    eprintln!(
        "resize {OLD} to {NEW}: {versions} versions of {} objects; the thawed copy's attempts {} (refused {refused}, failed {}); stale accepted {}",
        history.len(),
        woke.len(),
        woke.iter().filter(|l| l.starts_with("failed ")).count(),
        stale.len()
    );
    assert!(
        stale.is_empty(),
        "old-count writes accepted after a newer term's: {stale:?}"
    );
}

/// `tenure run --shards 2 --fence --listen`: `/metrics` carries each shard lease's
/// `tenure_fencing_token` (the token its copy writes with), `tenure_fence_enforced` (1) and
/// `leader_election_master_status` (1), named `GROUP-SHARD`, as a one-lease run exports them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_sharded_run_exports_each_shard_leases_token_and_fence_state() {
    const SHARDS: u32 = 2;
    let fleet = Fleet::new("shardmetrics", &[SHARDS]).await;
    let port = cli_support::free_port();
    let listen = format!("127.0.0.1:{port}");
    let replica = fleet.replica_with("r1", SHARDS, &["--listen", &listen]);
    wait_until(
        Duration::from_secs(120),
        "both shards' copies writing",
        || (0..SHARDS).all(|s| fleet.last_ok(s).is_some()),
    );
    let sample = |text: &str, metric: &str, shard: u32| -> Option<u64> {
        let head = format!("{metric}{{name=\"{GROUP}-{shard}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&head))
            .and_then(|v| v.trim().parse().ok())
    };
    let mut text = String::new();
    wait_until(Duration::from_secs(30), "every shard's series", || {
        text = cli_support::http_get(port, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default();
        (0..SHARDS).all(|s| {
            sample(&text, "tenure_fence_enforced", s).is_some()
                && sample(&text, "tenure_fencing_token", s).is_some()
        })
    });
    for shard in 0..SHARDS {
        let (who, token) = fleet.last_ok(shard).expect("the shard wrote");
        assert_eq!(who, "r1");
        assert_eq!(
            sample(&text, "tenure_fencing_token", shard),
            Some(token),
            "shard {shard}'s token on /metrics is the one its copy writes with:\n{text}\n{}",
            replica.log()
        );
        assert_eq!(
            sample(&text, "tenure_fence_enforced", shard),
            Some(1),
            "{text}"
        );
        assert_eq!(
            sample(&text, "leader_election_master_status", shard),
            Some(1),
            "{text}"
        );
    }
    assert!(fleet.stale().is_empty(), "{:?}", fleet.stale());
    drop(replica);
    fleet.watch.abort();
}

/// A shard term whose proof the API server does not answer ends alone: the replica keeps its
/// other shards writing and campaigns for the shard again, whose copy starts once a proof is
/// answered. An unreachable webhook (`failurePolicy: Fail`) matching only shard 2's probe
/// makes every dry run of that shard's proof a server error, the proof's "no answer"; before,
/// that ended the whole replica with exit 8 and every shard's copy with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_proof_without_an_answer_ends_that_shards_term_not_the_replica() {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    const SHARDS: u32 = 3;
    const STUCK: u32 = 2;
    let fleet = Fleet::new("shardnoanswer", &[SHARDS]).await;
    let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(shared().admin().await);
    let name = format!("{}.no-answer.tenure.test", fleet.ns);
    let webhook: ValidatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "webhooks": [{
            "name": "no-answer.tenure.test",
            // Nothing listens there: every call fails, and so does the request (Fail).
            "clientConfig": {"url": format!("https://127.0.0.1:{}/", cli_support::free_port())},
            "rules": [{"apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"],
                       "operations": ["CREATE"], "resources": ["leases"]}],
            "matchConditions": [{"name": "shard-2-probe", "expression": format!(
                "object.metadata.namespace == '{}' && object.metadata.name == \
                 'tenure-fence-probe.{GROUP}-{STUCK}'", fleet.ns)}],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 2,
        }],
    }))
    .expect("a webhook configuration");
    webhooks
        .create(&PostParams::default(), &webhook)
        .await
        .expect("create the webhook");
    let mut replica = fleet.replica("r1", SHARDS);
    wait_until(
        Duration::from_secs(120),
        "the other shards' copies writing",
        || {
            (0..SHARDS)
                .filter(|&s| s != STUCK)
                .all(|s| fleet.last_ok(s).is_some())
        },
    );
    // Shard 2's proofs got no answer at least twice (a term, then the next one's).
    wait_until(
        Duration::from_secs(60),
        "shard 2's proof failing twice without ending the replica",
        || {
            replica
                .log()
                .matches(&format!(
                    "the fence on lease {}/{GROUP}-{STUCK} could not be proven, so this shard's command was not started and its term ends",
                    fleet.ns
                ))
                .count()
                >= 2
        },
    );
    assert!(
        replica.child.try_wait().expect("try_wait").is_none(),
        "the replica is still running: {}",
        replica.log()
    );
    assert!(
        replica.log().contains("no answer from the API server"),
        "{}",
        replica.log()
    );
    assert!(
        fleet.last_ok(STUCK).is_none(),
        "no copy of shard 2 started unproven"
    );
    // The others kept writing meanwhile.
    wait_until(
        Duration::from_secs(30),
        "the other shards still writing",
        || {
            (0..SHARDS).filter(|&s| s != STUCK).all(|s| {
                fleet
                    .log(s)
                    .lines()
                    .filter(|l| l.starts_with("ok "))
                    .count()
                    >= 3
            })
        },
    );
    // The webhook gone, a later term of shard 2 proves its fence and starts its copy.
    webhooks
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the webhook");
    wait_until(Duration::from_secs(120), "shard 2's copy writing", || {
        fleet.last_ok(STUCK).is_some()
    });
    assert!(
        replica.child.try_wait().expect("try_wait").is_none(),
        "{}",
        replica.log()
    );
    assert!(fleet.stale().is_empty(), "{:?}", fleet.stale());
    drop(replica);
    fleet.watch.abort();
}
