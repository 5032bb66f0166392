//! The per-term proof that the API server enforces the fence, which is also the barrier
//! before a term's first fenced write: dry-run creates of the election's probe Lease with the
//! token below the term's (must be refused as stale) and with the term's own (must be
//! admitted), at the start of the term and every recheck period after it.
//!
//! Why a proof: the policy reads the Lease from the API server's informer, a cache tenure
//! cannot see. It lags the grant by milliseconds when healthy, and on Kubernetes 1.30–1.36
//! it can stop for good (kubernetes/kubernetes#130887), after which every stale write is
//! admitted without a sign. A proof that the server refuses the previous term's token, taken
//! before this term writes, makes "no stale write lands after the new term's first write"
//! exact on the server that answered it; a failed proof fails every fenced write closed.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::error::{Current, FenceState, NO_ANSWER, parse_current};
use super::policy::probe_name;
use super::{REFUSAL_PREFIX, REQUEST_ELECTION_EXTRA, REQUEST_TOKEN_EXTRA};

/// How long a term's proof may take to see the lower token refused: the API server's Lease
/// informer catches up with the grant within milliseconds when healthy; a server that still
/// admits the lower token after this is taken to be open, and fenced writes fail closed.
pub const PROOF_WINDOW: Duration = Duration::from_secs(3);

/// How often a term re-proves its fence by default ([`Fencer::recheck_every`](super::Fencer::recheck_every)):
/// one dry-run pair per period, so a policy or binding deleted mid-term, or a parameter cache
/// that stopped, fails the term's fenced writes within one period.
pub const DEFAULT_RECHECK: Duration = Duration::from_secs(10);

/// How often the proof asks again while the lower token is still admitted.
pub(super) const RETRY: Duration = Duration::from_millis(10);

/// One dry-run's own bound: a request that hangs must not hold the barrier.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Everything one term's proof needs: the probe clients and where to report.
pub(crate) struct ProofSetup {
    /// `namespace/name` of the election's Lease.
    pub lease: String,
    pub lease_name: String,
    pub ours: u64,
    /// Dry-run creates of the probe through a client carrying the token below ours, and ours.
    pub below: Api<Lease>,
    pub at: Api<Lease>,
    /// Plain client for Events on the Lease.
    pub events: Option<kube::Client>,
    pub lease_namespace: String,
    pub recheck: Duration,
    #[cfg(feature = "metrics")]
    pub metrics: Option<crate::election::ElectionMetrics>,
    /// Ends the rechecks with the term (None: when the last handle is dropped).
    pub cancel: Option<CancellationToken>,
}

/// A running proof, shared by every fenced client of one term; its task ends when the term
/// does or when the last handle is dropped.
pub(crate) struct Proof {
    lease: String,
    state: watch::Receiver<FenceState>,
    task: tokio::task::AbortHandle,
}

impl Drop for Proof {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proof {
    /// Starts the proof of one term's fence.
    pub fn start(setup: ProofSetup) -> Arc<Self> {
        let (tx, state) = watch::channel(FenceState::Proving);
        let lease = setup.lease.clone();
        let task = tokio::spawn(run(setup, tx)).abort_handle();
        Arc::new(Self { lease, state, task })
    }

    /// The election's Lease, `namespace/name`.
    pub fn lease(&self) -> &str {
        &self.lease
    }

    /// Whether the proof still runs (its term has not ended, no newer term was seen).
    pub fn running(&self) -> bool {
        self.state.has_changed().is_ok()
    }

    /// The latest state.
    pub fn state(&self) -> FenceState {
        self.state.borrow().clone()
    }

    /// The state once the first proof has finished.
    pub async fn settled(&self) -> FenceState {
        let mut state = self.state.clone();
        match state.wait_for(|s| *s != FenceState::Proving).await {
            Ok(s) => s.clone(),
            // The task is gone (its runtime shut down): nothing proves the fence.
            Err(_) => FenceState::Unenforced {
                cause: "the fence proof stopped before it finished".into(),
            },
        }
    }
}

/// The proof's life: the first proof, then one every recheck period until the term ends or
/// a newer term is seen.
async fn run(setup: ProofSetup, tx: watch::Sender<FenceState>) {
    let cancel = setup.cancel.clone().unwrap_or_default();
    let mut first = true;
    loop {
        let open = matches!(*tx.borrow(), FenceState::Unenforced { .. });
        let verdict = tokio::select! {
            v = prove(&setup, first, open) => v,
            () = cancel.cancelled() => return,
        };
        first = false;
        if let Some(next) = verdict {
            let previous = tx.borrow().clone();
            report(&setup, &previous, &next).await;
            let done = matches!(next, FenceState::Superseded { .. });
            tx.send_replace(next);
            if done {
                return;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(setup.recheck) => {}
            () = cancel.cancelled() => return,
        }
    }
}

/// What one dry-run create of the probe got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// Past admission: created, or the probe exists (a 409 comes from the store, after
    /// every admission policy passed the request).
    Admitted,
    /// Refused as stale by this election's policy.
    Stale(Option<Current>),
    /// Refused by this election's policy because no term of it has this token *yet*: a
    /// sharded group's policy wants a shard's current term's token exactly, and a token
    /// above the floor it has seen is one whose grant its Lease cache has not reached. To
    /// the proof, a lagging cache, like [`Answer::Admitted`] for a lower token.
    Unseen(String),
    /// Refused by this election's policy for another reason (missing token or election,
    /// malformed, broken floor).
    Refused(String),
    /// Refused by another election's fencing policy: one that judges requests naming this
    /// election (written by a tenure whose policies did not compose), so it would refuse this
    /// term's writes too.
    OtherElection {
        /// The other election's Lease, `namespace/name`.
        lease: String,
        /// The API server's message.
        message: String,
    },
    /// Refused by an admission policy or webhook that is not tenure's.
    OtherAdmission(String),
    /// Not allowed (RBAC, impersonation): asking again will not help.
    Denied(String),
    /// Anything else: a transport failure, a timeout, a server error.
    Failed(String),
}

/// How a sharded group's policy begins the refusal of a token that is not its shard's
/// current term's but not below it either (`policy::shard_validations`).
pub(super) const NOT_THIS_SHARDS_TERM: &str = "not this shard's term";

/// Which dry run of the proof: the token below the term's, or the term's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Probe {
    Below,
    At,
}

pub(super) async fn dry_create(api: &Api<Lease>, probe: &str, lease: &str) -> Answer {
    let object = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(probe.to_owned()),
            ..Default::default()
        },
        spec: None,
    };
    let pp = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, api.create(&pp, &object)).await {
        Err(_) => Answer::Failed(format!("no answer within {REQUEST_TIMEOUT:?}")),
        Ok(Ok(_)) => Answer::Admitted,
        Ok(Err(kube::Error::Api(s))) => classify(s.code, &s.message, lease),
        Ok(Err(e)) => Answer::Failed(e.to_string()),
    }
}

/// What an API server's error answer to a probe of election `lease` (`namespace/name`) means.
///
/// The order matters: a refusal by a ValidatingAdmissionPolicy is a 403 like an RBAC one, so
/// the policies' messages are recognised first, and only a refusal whose message names *this*
/// election (`tenure fencing: lease NS/NAME: `) counts as this election's answer — another
/// election's refusal must never pass for proof of this one.
pub(super) fn classify(code: u16, message: &str, lease: &str) -> Answer {
    if code == 409 {
        return Answer::Admitted;
    }
    if let Some(at) = message.find(REFUSAL_PREFIX) {
        let rest = message[at + REFUSAL_PREFIX.len()..].trim_start();
        let named = rest.strip_prefix("lease ").and_then(|r| r.split_once(": "));
        return match named {
            Some((l, tail)) if l == lease => {
                if tail.starts_with("stale") {
                    Answer::Stale(parse_current(message))
                } else if tail.starts_with(NOT_THIS_SHARDS_TERM) {
                    Answer::Unseen(message.to_owned())
                } else {
                    Answer::Refused(message.to_owned())
                }
            }
            Some((other, _)) => Answer::OtherElection {
                lease: other.to_owned(),
                message: message.to_owned(),
            },
            // A sharded group's refusal of a request that names no shard of it: this
            // election's when it is a shard of that group (`NS/GROUP-SHARD`).
            None => match rest.strip_prefix("group ").and_then(|r| r.split_once(": ")) {
                Some((group, _))
                    if lease
                        .strip_prefix(group)
                        .is_some_and(|shard| shard.starts_with('-')) =>
                {
                    Answer::Refused(message.to_owned())
                }
                Some((group, _)) => Answer::OtherElection {
                    lease: group.to_owned(),
                    message: message.to_owned(),
                },
                None => Answer::OtherAdmission(message.to_owned()),
            },
        };
    }
    if message.contains("ValidatingAdmissionPolicy '") || message.contains("admission webhook") {
        return Answer::OtherAdmission(format!("{message} ({code})"));
    }
    if code == 401 || code == 403 {
        return Answer::Denied(format!("{message} ({code})"));
    }
    Answer::Failed(format!("{message} ({code})"))
}

/// One proof: `None` when a recheck could not get an answer (the state stays as it was; a
/// server that cannot be reached refuses writes by itself).
async fn prove(setup: &ProofSetup, first: bool, open: bool) -> Option<FenceState> {
    let probe = probe_name(&setup.lease_name);
    let facts = Facts {
        lease: &setup.lease,
        lease_namespace: &setup.lease_namespace,
        ours: setup.ours,
    };
    decide(&facts, first, open, |which| {
        let api = match which {
            Probe::Below => &setup.below,
            Probe::At => &setup.at,
        };
        dry_create(api, &probe, &setup.lease)
    })
    .await
}

/// What a proof's verdict is about.
pub(super) struct Facts<'a> {
    /// `namespace/name` of the election's Lease.
    pub(super) lease: &'a str,
    pub(super) lease_namespace: &'a str,
    /// The term's token.
    pub(super) ours: u64,
}

/// The proof's decisions, given a way to `ask` each dry run: `None` when a recheck could not
/// get an answer.
///
/// The lower token may be admitted for a few milliseconds after a grant (the API server's
/// informer lags): the first proof asks again every 10 ms, a recheck every 100 ms, both
/// within [`PROOF_WINDOW`]; a recheck of a fence already found open asks once, so an open
/// fence costs the API server two requests per recheck period, not a stream of them.
pub(super) async fn decide<F, Fut>(
    facts: &Facts<'_>,
    first: bool,
    open: bool,
    mut ask: F,
) -> Option<FenceState>
where
    F: FnMut(Probe) -> Fut,
    Fut: std::future::Future<Output = Answer>,
{
    let below = facts.ours.saturating_sub(1);
    let unenforced = |cause: String| Some(FenceState::Unenforced { cause });
    let deadline = tokio::time::Instant::now() + PROOF_WINDOW;
    // The lower token first: refused once the server's copy of the Lease has our floor.
    loop {
        let late = tokio::time::Instant::now() >= deadline;
        match ask(Probe::Below).await {
            Answer::Stale(_) => break,
            Answer::Admitted if late || open => {
                return unenforced(open_cause(facts.lease, below, facts.ours));
            }
            Answer::Unseen(message) if late || open => {
                return unenforced(unseen_cause(facts.lease, facts.ours, &message));
            }
            Answer::Admitted | Answer::Unseen(_) if first => tokio::time::sleep(RETRY).await,
            Answer::Admitted | Answer::Unseen(_) => tokio::time::sleep(RETRY * 10).await,
            Answer::Failed(message) if late => {
                tracing::warn!(lease = %facts.lease, "fence proof got no answer: {message}");
                return first.then(|| FenceState::Unenforced {
                    cause: format!(
                        "{NO_ANSWER} within {PROOF_WINDOW:?}: {}",
                        cannot_prove(facts.lease_namespace, &message)
                    ),
                });
            }
            // A transport failure: ask again, less often.
            Answer::Failed(_) => tokio::time::sleep(RETRY * 10).await,
            other => return unenforced(refused_cause(facts, &other, "writes")),
        }
    }
    // Then ours: admitted, unless a newer term has raised the floor past it.
    match ask(Probe::At).await {
        Answer::Admitted => Some(FenceState::Enforced),
        Answer::Stale(current) => Some(FenceState::Superseded {
            current: current.unwrap_or(Current::Term(0)),
        }),
        Answer::Failed(message) => first.then(|| FenceState::Unenforced {
            cause: format!(
                "{NO_ANSWER} for this term's own token: the fence could not be proven: {message}"
            ),
        }),
        other => unenforced(refused_cause(facts, &other, "own token")),
    }
}

/// The cause for a refusal that proves nothing: `what` the server refused (this election's
/// "writes", or this term's "own token").
fn refused_cause(facts: &Facts<'_>, answer: &Answer, what: &str) -> String {
    match answer {
        Answer::Refused(message) => {
            format!("the API server refuses this election's {what}: {message}")
        }
        Answer::OtherElection { lease, message } => format!(
            "the fencing policy of another election (lease {lease}) refuses this election's \
             {what}: it judges requests that name election {}, as policies of a tenure whose \
             elections did not compose did; re-apply that election's policy from this tenure \
             (`tenure policy`): {message}",
            facts.lease
        ),
        Answer::OtherAdmission(message) => format!(
            "an admission policy or webhook that is not this election's refuses the probe, so \
             the fence cannot be proven (and may refuse this term's writes too): {message}"
        ),
        Answer::Denied(message) => cannot_prove(facts.lease_namespace, message),
        Answer::Failed(message) => format!("the fence could not be proven: {message}"),
        Answer::Unseen(message) => unseen_cause(facts.lease, facts.ours, message),
        Answer::Admitted | Answer::Stale(_) => {
            format!("the fence could not be proven: unexpected answer {answer:?}")
        }
    }
}

/// The message for a proof that could not be taken.
fn cannot_prove(lease_namespace: &str, message: &str) -> String {
    format!(
        "the fence could not be proven: {message} (a participant needs `create` on leases in \
         {lease_namespace}, and `impersonate` on itself and on \
         userextras/{REQUEST_TOKEN_EXTRA} and userextras/{REQUEST_ELECTION_EXTRA} in apiGroup \
         authentication.k8s.io)"
    )
}

/// The message for a sharded group's policy that never saw this term: its Lease cache lags
/// or has stopped.
fn unseen_cause(lease: &str, ours: u64, message: &str) -> String {
    format!(
        "for {PROOF_WINDOW:?} the API server refused this term's neighbour token {} as not \
         the current term's of lease {lease}: its copy of the Lease has not reached this term's \
         grant (token {ours}), so it could not refuse the previous term either. Likely cause: \
         its Lease parameter cache lags or has stopped (Kubernetes 1.30-1.36 stop it for good \
         once no Lease-parameter policy has a binding: kubernetes/kubernetes#130887) -- restart \
         every kube-apiserver and keep the anchor policy `tenure policy` prints ({message})",
        ours.saturating_sub(1)
    )
}

/// The fencing policy that judges `lease` (`namespace/name`): `tenure-fencing.NS.NAME`, and
/// when the name is a sharded group's shard's (`GROUP-SHARD`), the group's,
/// `tenure-fencing.NS.GROUP`, as the alternative.
fn policy_names(lease: &str) -> String {
    let (namespace, name) = lease.split_once('/').unwrap_or(("", lease));
    match crate::backend::group::parse_shard_lease_name(name) {
        Some((group, shard)) => format!(
            "tenure-fencing.{namespace}.{group} (the policy of sharded group {group}, for its \
             shard {shard}; or, for an election of that name, tenure-fencing.{namespace}.{name})"
        ),
        None => format!("tenure-fencing.{namespace}.{name}"),
    }
}

/// The message for an open fence: what was seen, the likely causes, the fix.
fn open_cause(lease: &str, below: u64, ours: u64) -> String {
    let policy = policy_names(lease);
    format!(
        "the API server admitted a dry-run write with token {below}, below this term's {ours}, \
         for {PROOF_WINDOW:?}: nothing enforces the fence on lease {lease} there. Likely causes: \
         the policy or binding {policy} is missing (install them: \
         `tenure policy`), or the API server's Lease parameter cache has stopped (Kubernetes \
         1.30-1.36 stop it for good once no Lease-parameter policy has a binding: \
         kubernetes/kubernetes#130887, #133827, fix #141015) -- restart every kube-apiserver, \
         and keep the anchor policy `tenure policy` prints so it cannot recur"
    )
}

/// Says a change of state where an operator looks: the log, the metric, an Event on the Lease.
async fn report(setup: &ProofSetup, previous: &FenceState, next: &FenceState) {
    #[cfg(feature = "metrics")]
    if let Some(m) = &setup.metrics {
        let (result, enforced) = match next {
            FenceState::Enforced => ("enforced", Some(true)),
            FenceState::Unenforced { .. } => ("unenforced", Some(false)),
            FenceState::Superseded { .. } => ("superseded", None),
            FenceState::Proving => ("proving", None),
        };
        m.fence_checked(&setup.lease_name, result, enforced);
    }
    if previous == next {
        // Loud while it lasts: once per recheck period.
        if let FenceState::Unenforced { cause } = next {
            tracing::error!(lease = %setup.lease, fencing_token = setup.ours, "fence still not enforced: {cause}");
        }
        return;
    }
    let event = match (previous, next) {
        (_, FenceState::Unenforced { cause }) => {
            tracing::error!(
                lease = %setup.lease,
                fencing_token = setup.ours,
                "fence not enforced, fenced writes fail closed: {cause}"
            );
            Some(("Warning", "FenceOpen", cause.clone()))
        }
        (FenceState::Unenforced { .. }, FenceState::Enforced) => {
            tracing::info!(lease = %setup.lease, fencing_token = setup.ours, "fence enforced again");
            Some((
                "Normal",
                "FenceEnforced",
                format!(
                    "the API server refuses tokens below {} again: fenced writes go",
                    setup.ours
                ),
            ))
        }
        (_, FenceState::Enforced) => {
            tracing::debug!(lease = %setup.lease, fencing_token = setup.ours, "fence proven");
            None
        }
        (_, FenceState::Superseded { current }) => {
            tracing::info!(lease = %setup.lease, fencing_token = setup.ours, "a newer term exists: {current}");
            None
        }
        (_, FenceState::Proving) => None,
    };
    if let (Some((kind, reason, message)), Some(client)) = (event, &setup.events)
        && let Err(e) = lease_event(client, setup, kind, reason, &message).await
    {
        tracing::debug!(lease = %setup.lease, "cannot write the {reason} Event: {e}");
    }
}

/// Writes one Event on the election's Lease (best effort: the Lease and the log say it too).
async fn lease_event(
    client: &kube::Client,
    setup: &ProofSetup,
    kind: &str,
    reason: &str,
    message: &str,
) -> Result<(), kube::Error> {
    use k8s_openapi::api::core::v1::Event;
    let now = k8s_openapi::jiff::Timestamp::now();
    // An Event message is at most 1 KiB.
    let message: String = message.chars().take(1000).collect();
    let event: Event = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("{}.{:x}", setup.lease_name, now.as_nanosecond()),
            "namespace": setup.lease_namespace,
        },
        "involvedObject": {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "name": setup.lease_name,
            "namespace": setup.lease_namespace,
        },
        "reason": reason,
        "message": message,
        "type": kind,
        "source": { "component": "tenure" },
        "reportingComponent": "tenure",
        "firstTimestamp": now.to_string(),
        "lastTimestamp": now.to_string(),
        "count": 1,
    }))
    .map_err(kube::Error::SerdeError)?;
    Api::<Event>::namespaced(client.clone(), &setup.lease_namespace)
        .create(&PostParams::default(), &event)
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::super::script::Script;
    use super::*;

    const LEASE: &str = "ops/ctl";

    fn facts() -> Facts<'static> {
        Facts {
            lease: LEASE,
            lease_namespace: "ops",
            ours: 50,
        }
    }

    /// The verdict on `s`'s answers, bounded: a decision that never comes fails the test
    /// instead of hanging it (the clock is paused, so the bound costs no real time).
    async fn run(s: &Script, first: bool, open: bool) -> Option<FenceState> {
        tokio::time::timeout(
            PROOF_WINDOW * 10,
            decide(&facts(), first, open, |p| s.ask(p)),
        )
        .await
        .expect("a decision within ten proof windows")
    }

    fn stale() -> Answer {
        Answer::Stale(Some(Current::Term(50)))
    }

    fn cause_of(state: Option<FenceState>) -> String {
        match state {
            Some(FenceState::Unenforced { cause }) => cause,
            other => panic!("expected Unenforced, got {other:?}"),
        }
    }

    #[test]
    fn every_answer_is_classified_and_only_this_elections_refusal_is_its_proof() {
        let vap = "leases.coordination.k8s.io \"tenure-fence-probe.ctl\" is forbidden: \
                   ValidatingAdmissionPolicy 'tenure-fencing.ops.ctl' with binding \
                   'tenure-fencing.ops.ctl' denied request:";
        assert_eq!(
            classify(
                403,
                &format!("{vap} tenure fencing: lease ops/ctl: stale: token 49 < current 50"),
                LEASE
            ),
            Answer::Stale(Some(Current::Term(50)))
        );
        let missing = format!("{vap} tenure fencing: lease ops/ctl: missing token: …");
        assert_eq!(
            classify(403, &missing, LEASE),
            Answer::Refused(missing.clone())
        );
        // Another election's refusal, even a stale one, is never this one's proof.
        let other = format!("{vap} tenure fencing: lease ops/other: stale: token 49 < current 60");
        assert_eq!(
            classify(403, &other, LEASE),
            Answer::OtherElection {
                lease: "ops/other".into(),
                message: other.clone()
            }
        );
        // A lease whose name this one starts with is another election.
        let longer = format!("{vap} tenure fencing: lease ops/ctl-2: stale: token 1 < current 2");
        assert!(
            matches!(classify(403, &longer, LEASE), Answer::OtherElection { lease, .. } if lease == "ops/ctl-2")
        );
        let foreign = "leases \"x\" is forbidden: ValidatingAdmissionPolicy 'no-leases' with binding 'b' denied request: nope";
        assert!(
            matches!(classify(403, foreign, LEASE), Answer::OtherAdmission(m) if m.contains("no-leases"))
        );
        let webhook = "admission webhook \"guard.example.com\" denied the request: no";
        assert!(matches!(
            classify(400, webhook, LEASE),
            Answer::OtherAdmission(_)
        ));
        let rbac = "leases.coordination.k8s.io is forbidden: User \"system:serviceaccount:ops:w\" cannot create resource \"leases\"";
        assert!(matches!(classify(403, rbac, LEASE), Answer::Denied(m) if m.contains("(403)")));
        assert!(matches!(
            classify(401, "Unauthorized", LEASE),
            Answer::Denied(_)
        ));
        // The probe exists: the store answered, after every admission policy passed it.
        assert_eq!(classify(409, "already exists", LEASE), Answer::Admitted);
        assert!(
            matches!(classify(500, "etcd down", LEASE), Answer::Failed(m) if m.contains("(500)"))
        );
        assert!(matches!(
            classify(429, "slow down", LEASE),
            Answer::Failed(_)
        ));
    }

    #[test]
    fn a_sharded_groups_answers_are_classified_for_its_shards() {
        let vap = "ValidatingAdmissionPolicy 'tenure-fencing.ops.orders' with binding \
                   'tenure-fencing.ops.orders' denied request:";
        let shard = "ops/orders-3";
        let stale = format!(
            "{vap} tenure fencing: lease ops/orders-3: stale: token 49 < current 50 (shard 3 of group ops/orders)"
        );
        assert_eq!(
            classify(403, &stale, shard),
            Answer::Stale(Some(Current::Term(50)))
        );
        // A token the shard's Lease has not reached: the cache lags, to the proof.
        let ahead = format!(
            "{vap} tenure fencing: lease ops/orders-3: not this shard's term: token 51, current 50 (shard 3 of group ops/orders): …"
        );
        assert_eq!(classify(403, &ahead, shard), Answer::Unseen(ahead.clone()));
        // The group's refusal of a request naming no shard: this shard's group's.
        let no_shard = format!("{vap} tenure fencing: group ops/orders: missing shard: …");
        assert_eq!(
            classify(403, &no_shard, shard),
            Answer::Refused(no_shard.clone())
        );
        // Another group's, or a group whose name this lease only starts with: not ours.
        for other in ["ops/payments", "ops/order"] {
            let message = format!("{vap} tenure fencing: group {other}: missing token: …");
            assert_eq!(
                classify(403, &message, shard),
                Answer::OtherElection {
                    lease: other.to_owned(),
                    message: message.clone()
                }
            );
        }
        let junk = format!("{vap} tenure fencing: something else");
        assert!(matches!(
            classify(403, &junk, shard),
            Answer::OtherAdmission(_)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_groups_policy_that_has_not_seen_the_term_is_waited_out_then_fails_closed() {
        let unseen = || {
            Answer::Unseen(
                "tenure fencing: lease ops/ctl: not this shard's term: token 49, current 40".into(),
            )
        };
        let s = Script::new(vec![
            (Probe::Below, unseen()),
            (Probe::Below, unseen()),
            (Probe::Below, stale()),
            (Probe::At, Answer::Admitted),
        ]);
        assert_eq!(run(&s, true, false).await, Some(FenceState::Enforced));
        let at: Vec<Duration> = s.asked().into_iter().map(|(_, t)| t).collect();
        assert_eq!(at, [0, 10, 20, 20].map(Duration::from_millis));
        // Never reached within the window: closed, saying what was seen and why.
        let s = Script::new(vec![(Probe::Below, unseen())]);
        let cause = cause_of(run(&s, true, false).await);
        let asked = s.asked();
        let last = asked.last().expect("asked").1;
        assert!(
            last >= PROOF_WINDOW && last < PROOF_WINDOW + RETRY * 2,
            "gave up at {last:?}"
        );
        assert!(
            cause.contains("has not reached this term's grant (token 50)")
                && cause.contains("#130887")
                && cause.contains("not this shard's term"),
            "{cause}"
        );
        // A recheck of a fence found open asks once.
        let s = Script::new(vec![(Probe::Below, unseen())]);
        let cause = cause_of(run(&s, false, true).await);
        assert_eq!(s.asked().len(), 1);
        assert!(cause.contains("token 50"), "{cause}");
        // Its own token unseen after the lower one was refused: closed at once.
        let s = Script::new(vec![(Probe::Below, stale()), (Probe::At, unseen())]);
        assert!(cause_of(run(&s, true, false).await).contains("has not reached"));
    }

    #[test]
    fn an_open_fence_names_the_groups_policy_for_a_shard_lease() {
        let cause = open_cause("ops/orders-3", 49, 50);
        assert!(
            cause.contains("tenure-fencing.ops.orders (the policy of sharded group orders, for its shard 3; or, for an election of that name, tenure-fencing.ops.orders-3)"),
            "{cause}"
        );
        let cause = open_cause("ops/ctl", 49, 50);
        assert!(
            cause.contains("binding tenure-fencing.ops.ctl is missing"),
            "{cause}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_proof_sees_the_lower_token_refused_then_its_own_admitted() {
        let s = Script::new(vec![(Probe::Below, stale()), (Probe::At, Answer::Admitted)]);
        assert_eq!(run(&s, true, false).await, Some(FenceState::Enforced));
        let probes: Vec<Probe> = s.asked().into_iter().map(|(p, _)| p).collect();
        assert_eq!(probes, [Probe::Below, Probe::At]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_proof_waits_out_a_lagging_informer_every_10_ms() {
        let s = Script::new(vec![
            (Probe::Below, Answer::Admitted),
            (Probe::Below, Answer::Admitted),
            (Probe::Below, Answer::Admitted),
            (Probe::Below, stale()),
            (Probe::At, Answer::Admitted),
        ]);
        assert_eq!(run(&s, true, false).await, Some(FenceState::Enforced));
        let at: Vec<Duration> = s.asked().into_iter().map(|(_, t)| t).collect();
        assert_eq!(
            at,
            [0, 10, 20, 30, 30].map(Duration::from_millis),
            "asked again every RETRY"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_recheck_waits_out_a_lagging_informer_every_100_ms() {
        let s = Script::new(vec![
            (Probe::Below, Answer::Admitted),
            (Probe::Below, Answer::Admitted),
            (Probe::Below, stale()),
            (Probe::At, Answer::Admitted),
        ]);
        assert_eq!(run(&s, false, false).await, Some(FenceState::Enforced));
        let at: Vec<Duration> = s.asked().into_iter().map(|(_, t)| t).collect();
        assert_eq!(at, [0, 100, 200, 200].map(Duration::from_millis));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lower_token_admitted_for_the_whole_window_is_an_open_fence() {
        let s = Script::new(vec![(Probe::Below, Answer::Admitted)]);
        let cause = cause_of(run(&s, true, false).await);
        let asked = s.asked();
        let last = asked.last().expect("asked").1;
        assert!(
            last >= PROOF_WINDOW && last < PROOF_WINDOW + RETRY * 2,
            "gave up at {last:?}, not at the window's end"
        );
        assert!(asked.len() >= 300, "asked {} times", asked.len());
        assert!(
            asked.iter().all(|(p, _)| *p == Probe::Below),
            "never its own token"
        );
        assert!(
            cause.contains("admitted a dry-run write with token 49, below this term's 50")
                && cause.contains("tenure-fencing.ops.ctl")
                && cause.contains("#130887")
                && cause.contains("anchor"),
            "{cause}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_recheck_of_an_open_fence_asks_once() {
        let s = Script::new(vec![(Probe::Below, Answer::Admitted)]);
        let cause = cause_of(run(&s, false, true).await);
        assert_eq!(s.asked().len(), 1);
        assert!(cause.contains("token 49"), "{cause}");
    }

    #[tokio::test(start_paused = true)]
    async fn no_answer_fails_a_first_proof_and_keeps_a_rechecks_state() {
        let s = Script::new(vec![(
            Probe::Below,
            Answer::Failed("connection refused".into()),
        )]);
        let cause = cause_of(run(&s, true, false).await);
        assert!(
            cause.starts_with(
                "no answer from the API server within 3s: the fence could not be proven: connection refused"
            ),
            "{cause}"
        );
        let asked = s.asked();
        assert!(asked.last().expect("asked").1 >= PROOF_WINDOW);
        assert!(
            asked.windows(2).all(|w| w[1].1 - w[0].1 == RETRY * 10),
            "a transport failure is asked again every 100 ms"
        );
        let s = Script::new(vec![(Probe::Below, Answer::Failed("timeout".into()))]);
        assert_eq!(
            run(&s, false, false).await,
            None,
            "a recheck keeps the state"
        );
        let s = Script::new(vec![
            (Probe::Below, stale()),
            (Probe::At, Answer::Failed("timeout".into())),
        ]);
        assert_eq!(run(&s, false, false).await, None);
        let s = Script::new(vec![
            (Probe::Below, stale()),
            (Probe::At, Answer::Failed("timeout".into())),
        ]);
        assert!(cause_of(run(&s, true, false).await).contains("could not be proven: timeout"));
    }

    /// `tenure run --shards --fence` ends only the shard's term on a proof the API server did
    /// not answer, and the whole replica on any other: only no answer is unanswered.
    #[tokio::test(start_paused = true)]
    async fn only_a_proof_without_an_answer_is_unanswered() {
        let failed = || Answer::Failed("timeout".into());
        let unanswered = [
            Script::new(vec![(Probe::Below, failed())]),
            Script::new(vec![(Probe::Below, stale()), (Probe::At, failed())]),
        ];
        for s in unanswered {
            let state = run(&s, true, false).await.expect("a verdict");
            assert!(state.is_unanswered(), "{state:?}");
        }
        let answered = [
            Script::new(vec![(Probe::Below, Answer::Admitted)]),
            Script::new(vec![(
                Probe::Below,
                Answer::Denied("forbidden (403)".into()),
            )]),
            Script::new(vec![(
                Probe::Below,
                Answer::Unseen("not this shard's term".into()),
            )]),
            Script::new(vec![(Probe::Below, stale()), (Probe::At, Answer::Admitted)]),
            Script::new(vec![(Probe::Below, stale()), (Probe::At, stale())]),
        ];
        for s in answered {
            let state = run(&s, true, false).await.expect("a verdict");
            assert!(!state.is_unanswered(), "{state:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_that_prove_nothing_fail_closed_at_once_naming_their_cause() {
        let cases = [
            (
                Answer::Refused("tenure fencing: lease ops/ctl: missing election".into()),
                "refuses this election's writes: tenure fencing",
            ),
            (
                Answer::OtherElection {
                    lease: "ops/other".into(),
                    message: "m".into(),
                },
                "another election (lease ops/other) refuses this election's writes: it judges requests that name election ops/ctl",
            ),
            (
                Answer::OtherAdmission("webhook says no".into()),
                "not this election's refuses the probe",
            ),
            (
                Answer::Denied("cannot impersonate (403)".into()),
                "could not be proven: cannot impersonate (403) (a participant needs `create` on leases in ops, and `impersonate` on itself and on userextras/tenure.dev/fencing-token and userextras/tenure.dev/fencing-election",
            ),
        ];
        for (answer, expected) in cases {
            let s = Script::new(vec![(Probe::Below, answer.clone())]);
            let cause = cause_of(run(&s, true, false).await);
            assert!(cause.contains(expected), "{answer:?}: {cause}");
            assert_eq!(s.asked().len(), 1, "{answer:?}: asked again");
            // The same answer to the term's own token.
            let s = Script::new(vec![(Probe::Below, stale()), (Probe::At, answer.clone())]);
            let cause = cause_of(run(&s, false, false).await);
            let own = expected.replace("writes", "own token");
            assert!(cause.contains(&own), "{answer:?} (own token): {cause}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn its_own_token_refused_as_stale_means_a_newer_term() {
        let s = Script::new(vec![
            (Probe::Below, stale()),
            (Probe::At, Answer::Stale(Some(Current::Term(77)))),
        ]);
        assert_eq!(
            run(&s, true, false).await,
            Some(FenceState::Superseded {
                current: Current::Term(77)
            })
        );
        let s = Script::new(vec![
            (Probe::Below, stale()),
            (Probe::At, Answer::Stale(None)),
        ]);
        assert_eq!(
            run(&s, true, false).await,
            Some(FenceState::Superseded {
                current: Current::Term(0)
            })
        );
    }

    /// A client of an API server that is not there: a loopback port nobody listens on, so
    /// every dry run fails (refused, or no answer within its bound).
    fn nowhere() -> kube::Client {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let url = format!("http://127.0.0.1:{port}").parse().expect("url");
        kube::Client::try_from(kube::Config::new(url)).expect("client")
    }

    /// A proof of term 50 of `ops/ctl` through `client`, ending with `term` (None: with its
    /// last handle).
    fn setup(client: &kube::Client, term: Option<CancellationToken>) -> ProofSetup {
        ProofSetup {
            lease: LEASE.into(),
            lease_name: "ctl".into(),
            ours: 50,
            below: Api::namespaced(client.clone(), "ops"),
            at: Api::namespaced(client.clone(), "ops"),
            events: Some(client.clone()),
            lease_namespace: "ops".into(),
            recheck: DEFAULT_RECHECK,
            #[cfg(feature = "metrics")]
            metrics: None,
            cancel: term,
        }
    }

    /// A log: what a subscriber writes, kept to be read.
    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Log {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Waits (bounded) until the proof's task has ended.
    async fn ended(proof: &Proof) {
        tokio::time::timeout(Duration::from_secs(60), async {
            while proof.running() {
                tokio::time::sleep(RETRY).await;
            }
        })
        .await
        .expect("the proof's task ends");
    }

    /// A proof is a task of its term: it starts proving at once, settles on a verdict (an API
    /// server that does not answer proves nothing), reports it, keeps rechecking while the
    /// term lasts and stops when it ends, its last verdict kept.
    #[tokio::test(start_paused = true)]
    async fn a_proof_runs_until_its_term_ends_and_an_unanswered_one_proves_nothing() {
        let term = CancellationToken::new();
        #[allow(unused_mut)]
        let mut s = setup(&nowhere(), Some(term.clone()));
        #[cfg(feature = "metrics")]
        let mut registry = prometheus_client::registry::Registry::default();
        #[cfg(feature = "metrics")]
        {
            s.metrics = Some(crate::election::ElectionMetrics::register(&mut registry));
        }
        // What the proof logs (its task runs on this thread, under this subscriber).
        let log = Log::default();
        let writer = log.clone();
        // A second dispatcher for the whole process: while a scoped subscriber is the only
        // one, tracing caches a callsite's interest from whichever thread reaches it first,
        // and a sibling test's thread without a subscriber caches "never"
        // (tokio-rs/tracing#3611; tests/support/captured.rs says more).
        static SECOND_DISPATCHER: std::sync::OnceLock<tracing::Dispatch> =
            std::sync::OnceLock::new();
        SECOND_DISPATCHER
            .get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
        let _logging = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::DEBUG)
                .with_writer(move || writer.clone())
                .with_ansi(false)
                .finish(),
        );
        let proof = Proof::start(s);
        assert_eq!(proof.lease(), LEASE);
        assert_eq!(proof.state(), FenceState::Proving);
        assert!(proof.running());
        let settled = tokio::time::timeout(PROOF_WINDOW * 10, proof.settled())
            .await
            .expect("the first proof settles");
        let cause = cause_of(Some(settled.clone()));
        assert!(
            cause.starts_with(
                "no answer from the API server within 3s: the fence could not be proven"
            ),
            "{cause}"
        );
        assert_eq!(proof.state(), settled);
        #[cfg(feature = "metrics")]
        {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
            assert!(
                text.contains("tenure_fence_enforced{name=\"ctl\"} 0")
                    && text.contains("result=\"unenforced\"} 1"),
                "the verdict is reported: {text}"
            );
        }
        // Said once where an operator looks: the log, and an Event (which cannot be written
        // here, and says so).
        let said = String::from_utf8_lossy(&log.0.lock().expect("lock")).into_owned();
        assert!(
            said.contains("fence not enforced, fenced writes fail closed")
                && !said.contains("still not enforced")
                && said.contains("cannot write the FenceOpen Event"),
            "{said}"
        );
        // Rechecks that get no answer keep the verdict, and the proof runs on with its term.
        tokio::time::sleep(DEFAULT_RECHECK * 3).await;
        assert!(proof.running(), "the term has not ended");
        assert_eq!(proof.state(), settled);
        term.cancel();
        ended(&proof).await;
        assert_eq!(proof.state(), settled, "the last verdict stays");
    }

    /// A term that ends while its first proof runs (SIGTERM at start-up) settles on "not
    /// proven", never on a verdict the proof did not reach.
    #[tokio::test(start_paused = true)]
    async fn a_term_ended_before_its_first_proof_finished_proves_nothing() {
        let term = CancellationToken::new();
        let proof = Proof::start(setup(&nowhere(), Some(term.clone())));
        term.cancel();
        let cause = cause_of(Some(proof.settled().await));
        assert!(
            cause.contains("the fence proof stopped before it finished"),
            "{cause}"
        );
        ended(&proof).await;
    }

    /// A proof without a term (a handed-over token) ends with its last handle: its task must
    /// not go on sending dry runs for nobody.
    #[tokio::test(start_paused = true)]
    async fn dropping_the_last_handle_ends_the_proof() {
        let proof = Proof::start(setup(&nowhere(), None));
        let mut state = proof.state.clone();
        drop(proof);
        let gone = tokio::time::timeout(Duration::from_secs(60), state.wait_for(|_| false)).await;
        assert!(
            matches!(gone, Ok(Err(_))),
            "the proof's task outlived its last handle: {gone:?}"
        );
    }
}
