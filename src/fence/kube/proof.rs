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

use super::REFUSAL_PREFIX;
use super::error::{Current, FenceState, parse_current};
use super::policy::probe_name;

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
pub(super) enum Answer {
    /// Past admission (created, or the probe exists: the store said so after admission).
    Admitted,
    /// Refused as stale by this election's policy.
    Stale(Option<Current>),
    /// Refused by this election's policy for another reason (missing, malformed, broken floor).
    Refused(String),
    /// Not allowed (RBAC, impersonation): asking again will not help.
    Denied(String),
    /// Anything else: a transport failure, a timeout, a server error.
    Failed(String),
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
        Ok(Err(kube::Error::Api(s))) if s.code == 409 => Answer::Admitted,
        Ok(Err(kube::Error::Api(s)))
            if s.message.contains(REFUSAL_PREFIX)
                && s.message.contains(&format!("lease {lease}: ")) =>
        {
            if s.message.contains(&format!("lease {lease}: stale")) {
                Answer::Stale(parse_current(&s.message))
            } else {
                Answer::Refused(s.message)
            }
        }
        Ok(Err(kube::Error::Api(s))) if s.code == 401 || s.code == 403 => {
            Answer::Denied(format!("{} ({})", s.message, s.code))
        }
        Ok(Err(kube::Error::Api(s))) => Answer::Failed(format!("{} ({})", s.message, s.code)),
        Ok(Err(e)) => Answer::Failed(e.to_string()),
    }
}

/// One proof: `None` when a recheck could not get an answer (the state stays as it was; a
/// server that cannot be reached refuses writes by itself).
///
/// The lower token may be admitted for a few milliseconds after a grant (the API server's
/// informer lags): the first proof asks again every 10 ms, a recheck every 100 ms, both
/// within [`PROOF_WINDOW`]; a recheck of a fence already found open asks once, so an open
/// fence costs the API server two requests per recheck period, not a stream of them.
async fn prove(setup: &ProofSetup, first: bool, open: bool) -> Option<FenceState> {
    let probe = probe_name(&setup.lease_name);
    let below = setup.ours.saturating_sub(1);
    let deadline = tokio::time::Instant::now() + PROOF_WINDOW;
    // The lower token first: refused once the server's copy of the Lease has our floor.
    loop {
        let late = tokio::time::Instant::now() >= deadline;
        match dry_create(&setup.below, &probe, &setup.lease).await {
            Answer::Stale(_) => break,
            Answer::Admitted if late || open => {
                return Some(FenceState::Unenforced {
                    cause: open_cause(&setup.lease, below, setup.ours),
                });
            }
            Answer::Admitted if first => tokio::time::sleep(RETRY).await,
            Answer::Admitted => tokio::time::sleep(RETRY * 10).await,
            Answer::Refused(message) => {
                return Some(FenceState::Unenforced {
                    cause: format!("the API server refuses this election's writes: {message}"),
                });
            }
            Answer::Denied(message) => {
                return Some(FenceState::Unenforced {
                    cause: cannot_prove(&setup.lease_namespace, &message),
                });
            }
            Answer::Failed(message) if late => {
                tracing::warn!(lease = %setup.lease, "fence proof got no answer: {message}");
                return first.then(|| FenceState::Unenforced {
                    cause: format!(
                        "no answer within {PROOF_WINDOW:?}: {}",
                        cannot_prove(&setup.lease_namespace, &message)
                    ),
                });
            }
            // A transport failure: ask again, less often.
            Answer::Failed(_) => tokio::time::sleep(RETRY * 10).await,
        }
    }
    // Then ours: admitted, unless a newer term has raised the floor past it.
    match dry_create(&setup.at, &probe, &setup.lease).await {
        Answer::Admitted => Some(FenceState::Enforced),
        Answer::Stale(current) => Some(FenceState::Superseded {
            current: current.unwrap_or(Current::Term(0)),
        }),
        Answer::Refused(message) => Some(FenceState::Unenforced {
            cause: format!("the API server refuses this term's own token: {message}"),
        }),
        Answer::Denied(message) => Some(FenceState::Unenforced {
            cause: cannot_prove(&setup.lease_namespace, &message),
        }),
        Answer::Failed(message) => first.then(|| FenceState::Unenforced {
            cause: format!("the fence could not be proven: {message}"),
        }),
    }
}

/// The message for a proof that could not be taken.
fn cannot_prove(lease_namespace: &str, message: &str) -> String {
    format!(
        "the fence could not be proven: {message} (a participant needs `create` on leases in \
         {lease_namespace}, and `impersonate` on itself and on \
         userextras/tenure.dev/fencing-token in apiGroup authentication.k8s.io)"
    )
}

/// The message for an open fence: what was seen, the likely causes, the fix.
fn open_cause(lease: &str, below: u64, ours: u64) -> String {
    let (namespace, name) = lease.split_once('/').unwrap_or(("", lease));
    format!(
        "the API server admitted a dry-run write with token {below}, below this term's {ours}, \
         for {PROOF_WINDOW:?}: nothing enforces the fence on lease {lease} there. Likely causes: \
         the policy or binding tenure-fencing.{namespace}.{name} is missing (install them: \
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
