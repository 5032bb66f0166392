//! `tenure policy --check`: the fence's proof run from outside, as a cluster admin
//! impersonating a participant, against the Lease's current floor.

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

use super::proof::{Answer, PROOF_WINDOW, Probe, RETRY, dry_create};
use super::{REQUEST_ELECTION_EXTRA, REQUEST_TOKEN_EXTRA};

/// What [`check`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckVerdict {
    /// The API server refuses a participant's token below the Lease's floor (or, before the
    /// first term, a participant's write without a token) and admits the floor's own token.
    Enforced {
        /// The Lease's floor at the check (0: no term yet).
        floor: u64,
    },
    /// The fence is not enforced on the API server that answered.
    Open {
        /// Why.
        cause: OpenCause,
        /// What was seen and what to do, in one line.
        message: String,
    },
}

/// Why [`check`] found the fence open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OpenCause {
    /// No ValidatingAdmissionPolicy `tenure-fencing.<namespace>.<lease>`.
    PolicyMissing,
    /// The policy exists but its binding does not.
    BindingMissing,
    /// The binding exists but applies another policy or reads another Lease: it does not
    /// fence this election.
    BindingMismatch,
    /// The election's Lease does not exist: the binding admits everything
    /// (`parameterNotFoundAction: Allow`).
    LeaseMissing,
    /// The Lease's `tenure.dev/fencing-floor` is not a fencing token: participant writes are
    /// all refused (closed, but broken).
    BrokenFloor,
    /// Policy, binding and Lease exist, yet the server admitted a participant's token below
    /// the floor: its Lease parameter cache is stale (kubernetes/kubernetes#130887), or the
    /// participant is not matched by the policy.
    NotEnforced,
    /// The current term's own token is refused: by this election's policy for a reason other
    /// than staleness, by another election's policy (one that judges requests naming this
    /// election), or by another admission policy or webhook. The live term cannot write.
    Refused,
}

/// Why [`check`] could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// Reading one of the objects the fence is made of failed (e.g. 403: the caller may not
    /// `get` ValidatingAdmissionPolicies, which are cluster-scoped).
    #[error("cannot read the {what}: {source}{}", read_hint(source))]
    Read {
        /// Which object: `ValidatingAdmissionPolicy NAME`, `binding NAME`, `Lease NS/NAME`.
        what: String,
        /// The API error or transport failure.
        #[source]
        source: kube::Error,
    },
    /// The dry run as the participant was not allowed: the caller may not impersonate it
    /// (with its groups and the two user extras), or the participant may not create Leases.
    #[error(
        "the dry run as {participant} was refused: {message} (the check impersonates the \
         participant: the caller needs `impersonate` on it, on each of its groups and on \
         userextras/{REQUEST_TOKEN_EXTRA} and userextras/{REQUEST_ELECTION_EXTRA} in apiGroup \
         authentication.k8s.io; the participant needs `create` on leases in {namespace})"
    )]
    Forbidden {
        /// Who the dry run impersonated.
        participant: String,
        /// The Lease namespace.
        namespace: String,
        /// The API server's message.
        message: String,
    },
    /// The dry run got no usable answer within the proof's window (unreachable, timeouts,
    /// server errors).
    #[error("no answer to the dry run within {PROOF_WINDOW:?}: {message}")]
    NoAnswer {
        /// The last failure.
        message: String,
    },
    /// The participant's name cannot be sent as an impersonation header.
    #[error("cannot impersonate {participant:?}: not a valid header value")]
    BadParticipant {
        /// The name given.
        participant: String,
    },
}

fn read_hint(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(s) if s.code == 403 => {
            " (the check reads the cluster-scoped ValidatingAdmissionPolicy and its binding and \
             the election's Lease: run it as a user allowed to get them, e.g. a cluster admin)"
        }
        _ => "",
    }
}

/// Who a check's dry run speaks as: a participant of the policy, as the API server
/// authenticates it, with its groups (a user whose permissions come from a group, such as
/// `system:masters`, is refused everything when impersonated without them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Participant {
    user: String,
    groups: Vec<String>,
}

impl Participant {
    /// The participant `user` (`system:serviceaccount:NS:NAME` for a ServiceAccount, whose
    /// groups follow from its name).
    #[must_use]
    pub fn new(user: impl Into<String>) -> Self {
        Self {
            user: user.into(),
            groups: Vec::new(),
        }
    }

    /// Adds a group the participant belongs to (impersonated with it).
    #[must_use]
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.groups.push(group.into());
        self
    }

    /// The user name.
    #[must_use]
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The groups.
    #[must_use]
    pub fn groups(&self) -> &[String] {
        &self.groups
    }
}

impl std::fmt::Display for Participant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.user)?;
        if !self.groups.is_empty() {
            write!(f, " (groups {})", self.groups.join(", "))?;
        }
        Ok(())
    }
}

/// Proves from outside, as `tenure policy --check` does, that the API server `client`
/// reaches enforces the fence of `policy`'s election: the policy, its binding (applying that
/// policy with this election's Lease) and the Lease exist, and two dry-run creates of the probe
/// Lease as `participant` (impersonated, with its groups, naming this election): the token just
/// below the Lease's floor is refused as stale, and the floor's own token is admitted. One
/// check proves only the API server that answered it.
///
/// # Errors
///
/// [`CheckError`] when the check could not run: the objects could not be read, the dry run
/// was not allowed (the message says which permission is needed), or no answer came.
///
/// # Cancel safety
///
/// Cancel safe: it only reads and sends dry runs.
pub async fn check(
    client: &kube::Client,
    policy: &super::FencingPolicy,
    participant: &Participant,
) -> Result<CheckVerdict, CheckError> {
    let name = policy.name();
    let lease = format!("{}/{}", policy.namespace(), policy.lease_name());
    let open = |cause, message: String| Ok(CheckVerdict::Open { cause, message });
    let read = |what: String| move |source| CheckError::Read { what, source };
    if Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .get_opt(&name)
        .await
        .map_err(read(format!("ValidatingAdmissionPolicy {name}")))?
        .is_none()
    {
        return open(
            OpenCause::PolicyMissing,
            format!(
                "no ValidatingAdmissionPolicy {name}: nothing fences lease {lease} (install it: `tenure policy --lease {} --namespace {} | kubectl apply -f -`)",
                policy.lease_name(),
                policy.namespace()
            ),
        );
    }
    let Some(binding) = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .get_opt(&name)
        .await
        .map_err(read(format!("ValidatingAdmissionPolicyBinding {name}")))?
    else {
        return open(
            OpenCause::BindingMissing,
            format!(
                "the policy {name} has no binding {name}: it fences nothing (re-apply `tenure policy`'s output; keep the anchor {} so a deleted binding cannot stop the API server's Lease cache)",
                super::ANCHOR_NAME
            ),
        );
    };
    if let Some(message) = binding_mismatch(&binding, policy) {
        return open(OpenCause::BindingMismatch, message);
    }
    let mut attempts = 0;
    loop {
        let floor = match read_floor(client, policy, &lease).await? {
            Ok(floor) => floor,
            Err(verdict) => return Ok(verdict),
        };
        match prove_floor(client, policy, participant, &lease, floor).await? {
            // A term was granted between the read and the dry run: read the new floor.
            None if attempts < 3 => attempts += 1,
            None => {
                return Err(CheckError::NoAnswer {
                    message: format!(
                        "the floor of lease {lease} moved under each of {attempts} attempts (terms granted faster than the check runs)"
                    ),
                });
            }
            Some(verdict) => return Ok(verdict),
        }
    }
}

/// What is wrong with a binding that does not apply `policy` with its election's Lease.
fn binding_mismatch(
    binding: &ValidatingAdmissionPolicyBinding,
    policy: &super::FencingPolicy,
) -> Option<String> {
    let want = policy.binding();
    let name = policy.name();
    let spec = &binding.spec;
    if spec.policy_name != want.spec.policy_name {
        return Some(format!(
            "the binding {name} applies the policy {:?}, not {name}: it does not fence lease {}/{} (re-apply `tenure policy`'s output)",
            spec.policy_name,
            policy.namespace(),
            policy.lease_name()
        ));
    }
    let param = |b: &ValidatingAdmissionPolicyBinding| {
        b.spec
            .param_ref
            .as_ref()
            .map(|p| (p.namespace.clone(), p.name.clone(), p.selector.clone()))
    };
    if param(binding) != param(&want) {
        let (ns, lease) = binding
            .spec
            .param_ref
            .as_ref()
            .map(|p| {
                (
                    p.namespace.clone().unwrap_or_default(),
                    p.name.clone().unwrap_or_else(|| "(a selector)".into()),
                )
            })
            .unwrap_or_default();
        return Some(format!(
            "the binding {name} reads the Lease {ns}/{lease} as its parameter, not {}/{}: it judges this election's writes by another Lease's floor (re-apply `tenure policy`'s output)",
            policy.namespace(),
            policy.lease_name()
        ));
    }
    None
}

/// The Lease's floor (0 before the first term), or the verdict when the Lease is missing or
/// its floor is broken.
async fn read_floor(
    client: &kube::Client,
    policy: &super::FencingPolicy,
    lease: &str,
) -> Result<Result<u64, CheckVerdict>, CheckError> {
    let Some(record) = Api::<Lease>::namespaced(client.clone(), policy.namespace())
        .get_opt(policy.lease_name())
        .await
        .map_err(|source| CheckError::Read {
            what: format!("Lease {lease}"),
            source,
        })?
    else {
        return Ok(Err(CheckVerdict::Open {
            cause: OpenCause::LeaseMissing,
            message: format!(
                "the Lease {lease} does not exist: the binding admits every write until a term creates it (`tenure policy` prints it empty)"
            ),
        }));
    };
    let floor_text = record
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::backend::kube::record::FENCING_FLOOR).cloned());
    Ok(match parse_floor(floor_text.as_deref()) {
        Some(f) => Ok(f),
        None => Err(CheckVerdict::Open {
            cause: OpenCause::BrokenFloor,
            message: format!(
                "the Lease {lease}'s annotation {} is {:?}, not a fencing token: every participant write is refused until the next grant rewrites it (or remove the annotation)",
                crate::backend::kube::record::FENCING_FLOOR,
                floor_text.unwrap_or_default()
            ),
        }),
    })
}

/// The floor a Lease's `tenure.dev/fencing-floor` annotation gives (0 when there is none: no
/// term yet), or `None` when it is not a fencing token as tenure writes it (decimal, no sign,
/// no leading zeros): the policy's CEL refuses every participant write under such a floor.
fn parse_floor(text: Option<&str>) -> Option<u64> {
    let Some(text) = text else {
        return Some(0);
    };
    text.parse::<u64>().ok().filter(|f| f.to_string() == text)
}

/// The two dry runs at `floor`: `None` when the floor's own token was refused as stale (a
/// newer term came: read the floor again).
async fn prove_floor(
    client: &kube::Client,
    policy: &super::FencingPolicy,
    participant: &Participant,
    lease: &str,
    floor: u64,
) -> Result<Option<CheckVerdict>, CheckError> {
    let fencer =
        super::Fencer::impersonating(client.clone(), participant.user(), participant.groups())
            .map_err(|_| CheckError::BadParticipant {
                participant: participant.user().to_owned(),
            })?
            .lease_namespace(policy.namespace());
    let probe = policy.probe();
    let election = policy.lease_name();
    // Before any term (floor 0) there is no lower token: a write without one must be refused.
    let below = fencer.probe_api(election, floor.checked_sub(1));
    let at = fencer.probe_api(election, Some(floor));
    let facts = Floor {
        participant,
        namespace: policy.namespace(),
        lease,
        floor,
    };
    judge_floor(&facts, |which| {
        let api = match which {
            Probe::Below => &below,
            Probe::At => &at,
        };
        dry_create(api, &probe, lease)
    })
    .await
}

/// What a check's two dry runs are about.
struct Floor<'a> {
    participant: &'a Participant,
    /// The Lease namespace.
    namespace: &'a str,
    /// `namespace/name` of the election's Lease.
    lease: &'a str,
    /// The Lease's floor (0: no term yet).
    floor: u64,
}

/// The check's decisions, given a way to `ask` each dry run: the token below the floor (none
/// at floor 0) must be refused as stale, asked again every 100 ms within [`PROOF_WINDOW`]
/// while the server admits it or does not answer; then the floor's own token must be
/// admitted. `None` when the floor's own token was refused as stale (a newer term came).
async fn judge_floor<F, Fut>(
    facts: &Floor<'_>,
    mut ask: F,
) -> Result<Option<CheckVerdict>, CheckError>
where
    F: FnMut(Probe) -> Fut,
    Fut: std::future::Future<Output = Answer>,
{
    let Floor {
        participant,
        lease,
        floor,
        ..
    } = *facts;
    let forbidden = |message: String| CheckError::Forbidden {
        participant: participant.to_string(),
        namespace: facts.namespace.to_owned(),
        message,
    };
    let refused = |what: &str, message: String| {
        Ok(Some(CheckVerdict::Open {
            cause: OpenCause::Refused,
            message: format!("{what} refused as {participant}: {message}"),
        }))
    };
    let below = floor.checked_sub(1);
    let deadline = tokio::time::Instant::now() + PROOF_WINDOW;
    loop {
        match ask(Probe::Below).await {
            Answer::Stale(_) => break,
            Answer::Refused(message) if below.is_none() && message.contains(": missing token") => {
                break;
            }
            Answer::Refused(message) => {
                return refused("a dry run below the floor was", message);
            }
            Answer::OtherElection { message, .. } | Answer::OtherAdmission(message) => {
                return refused("a dry run naming this election was", message);
            }
            Answer::Denied(message) => return Err(forbidden(message)),
            Answer::Failed(message) if tokio::time::Instant::now() >= deadline => {
                return Err(CheckError::NoAnswer { message });
            }
            Answer::Admitted | Answer::Failed(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(RETRY * 10).await;
            }
            Answer::Admitted | Answer::Failed(_) => {
                let what = below.map_or_else(
                    || "a write without a token".to_owned(),
                    |b| format!("token {b}, below the Lease's floor {floor},"),
                );
                return Ok(Some(CheckVerdict::Open {
                    cause: OpenCause::NotEnforced,
                    message: format!(
                        "the API server admitted {what} from {participant} on lease {lease} although the policy, its binding and the Lease exist: its Lease parameter cache is stale (Kubernetes 1.30-1.36 stop it for good once no Lease-parameter policy has a binding: kubernetes/kubernetes#130887, #133827) -- restart every kube-apiserver and keep the anchor {} -- or {participant} is not a participant of the policy",
                        super::ANCHOR_NAME
                    ),
                }));
            }
        }
    }
    // Then the floor's own token: what the live term writes with must be admitted.
    let deadline = tokio::time::Instant::now() + PROOF_WINDOW;
    loop {
        match ask(Probe::At).await {
            Answer::Admitted => return Ok(Some(CheckVerdict::Enforced { floor })),
            Answer::Stale(_) => return Ok(None),
            Answer::Refused(message)
            | Answer::OtherElection { message, .. }
            | Answer::OtherAdmission(message) => {
                return refused(&format!("the floor's own token {floor} was"), message);
            }
            Answer::Denied(message) => return Err(forbidden(message)),
            Answer::Failed(message) if tokio::time::Instant::now() >= deadline => {
                return Err(CheckError::NoAnswer { message });
            }
            Answer::Failed(_) => tokio::time::sleep(RETRY * 10).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::script::Script;
    use super::*;
    use crate::fence::kube::FencingPolicy;
    use crate::fence::kube::error::Current;

    const LEASE: &str = "ops/ctl";

    /// The verdict at `floor` on `s`'s answers, bounded (the clock is paused).
    async fn judge(s: &Script, floor: u64) -> Result<Option<CheckVerdict>, CheckError> {
        let participant = Participant::new("system:serviceaccount:ops:w");
        let facts = Floor {
            participant: &participant,
            namespace: "ops",
            lease: LEASE,
            floor,
        };
        tokio::time::timeout(PROOF_WINDOW * 10, judge_floor(&facts, |p| s.ask(p)))
            .await
            .expect("a verdict within ten proof windows")
    }

    fn stale() -> Answer {
        Answer::Stale(Some(Current::Term(50)))
    }

    fn open(verdict: Result<Option<CheckVerdict>, CheckError>) -> (OpenCause, String) {
        match verdict {
            Ok(Some(CheckVerdict::Open { cause, message })) => (cause, message),
            other => panic!("expected Open, got {other:?}"),
        }
    }

    fn times(s: &Script) -> Vec<Duration> {
        s.asked().into_iter().map(|(_, t)| t).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_floor_is_enforced_once_the_token_below_is_stale_and_its_own_admitted() {
        let s = Script::new(vec![(Probe::Below, stale()), (Probe::At, Answer::Admitted)]);
        assert!(matches!(
            judge(&s, 50).await,
            Ok(Some(CheckVerdict::Enforced { floor: 50 }))
        ));
        // Before the first term a write without a token must be refused as missing one.
        let missing =
            "tenure fencing: lease ops/ctl: missing token: a participant must name its term";
        let s = Script::new(vec![
            (Probe::Below, Answer::Refused(missing.into())),
            (Probe::At, Answer::Admitted),
        ]);
        assert!(matches!(
            judge(&s, 0).await,
            Ok(Some(CheckVerdict::Enforced { floor: 0 }))
        ));
        // With a term, a missing token is not the refusal that proves the floor.
        let s = Script::new(vec![(Probe::Below, Answer::Refused(missing.into()))]);
        let (cause, message) = open(judge(&s, 50).await);
        assert_eq!(cause, OpenCause::Refused);
        assert!(
            message.starts_with("a dry run below the floor was refused as system:serviceaccount:ops:w: tenure fencing"),
            "{message}"
        );
        // At floor 0 another refusal proves nothing either.
        let s = Script::new(vec![(
            Probe::Below,
            Answer::Refused("tenure fencing: lease ops/ctl: malformed".into()),
        )]);
        assert_eq!(open(judge(&s, 0).await).0, OpenCause::Refused);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lagging_server_is_asked_again_every_100_ms_within_the_window() {
        let s = Script::new(vec![
            (Probe::Below, Answer::Admitted),
            (Probe::Below, Answer::Failed("timeout".into())),
            (Probe::Below, stale()),
            (Probe::At, Answer::Failed("timeout".into())),
            (Probe::At, Answer::Admitted),
        ]);
        assert!(matches!(
            judge(&s, 50).await,
            Ok(Some(CheckVerdict::Enforced { floor: 50 }))
        ));
        assert_eq!(
            times(&s),
            [0, 100, 200, 200, 300].map(Duration::from_millis)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_below_the_floor_admitted_for_the_whole_window_is_an_open_fence() {
        let s = Script::new(vec![(Probe::Below, Answer::Admitted)]);
        let (cause, message) = open(judge(&s, 50).await);
        assert_eq!(cause, OpenCause::NotEnforced);
        assert!(
            message.contains("admitted token 49, below the Lease's floor 50, from system:serviceaccount:ops:w on lease ops/ctl")
                && message.contains("#130887"),
            "{message}"
        );
        let asked = times(&s);
        let last = *asked.last().expect("asked");
        assert!(
            last >= PROOF_WINDOW && last < PROOF_WINDOW + RETRY * 10,
            "gave up at {last:?}, not at the window's end"
        );
        assert!(s.asked().iter().all(|(p, _)| *p == Probe::Below));
        let s = Script::new(vec![(Probe::Below, Answer::Admitted)]);
        let (_, message) = open(judge(&s, 0).await);
        assert!(
            message.contains("admitted a write without a token"),
            "{message}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_answer_within_the_window_is_no_verdict() {
        for script in [
            vec![(Probe::Below, Answer::Failed("connection refused".into()))],
            vec![
                (Probe::Below, stale()),
                (Probe::At, Answer::Failed("connection refused".into())),
            ],
        ] {
            let s = Script::new(script);
            match judge(&s, 50).await {
                Err(CheckError::NoAnswer { message }) => assert_eq!(message, "connection refused"),
                other => panic!("expected NoAnswer, got {other:?}"),
            }
            let asked = s.asked();
            let (which, _) = *asked.last().expect("asked");
            let tries: Vec<Duration> = asked
                .iter()
                .filter(|(p, _)| *p == which)
                .map(|(_, t)| *t)
                .collect();
            let span = *tries.last().expect("asked") - tries[0];
            assert!(
                span >= PROOF_WINDOW && span < PROOF_WINDOW + RETRY * 10,
                "{which:?}: gave up after {span:?}"
            );
            assert!(
                tries.windows(2).all(|w| w[1] - w[0] == RETRY * 10),
                "paced every 100 ms"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_name_what_was_refused_and_a_newer_term_reads_the_floor_again() {
        let other = || Answer::OtherElection {
            lease: "ops/other".into(),
            message: "tenure fencing: lease ops/other: stale".into(),
        };
        let s = Script::new(vec![(Probe::Below, other())]);
        let (cause, message) = open(judge(&s, 50).await);
        assert_eq!(cause, OpenCause::Refused);
        assert!(
            message.starts_with("a dry run naming this election was refused as"),
            "{message}"
        );
        let s = Script::new(vec![(
            Probe::Below,
            Answer::OtherAdmission("webhook: no".into()),
        )]);
        assert!(open(judge(&s, 50).await).1.ends_with("webhook: no"));
        for answer in [
            Answer::Refused("tenure fencing: lease ops/ctl: malformed".into()),
            other(),
            Answer::OtherAdmission("webhook: no".into()),
        ] {
            let s = Script::new(vec![(Probe::Below, stale()), (Probe::At, answer.clone())]);
            let (cause, message) = open(judge(&s, 50).await);
            assert_eq!(cause, OpenCause::Refused, "{answer:?}");
            assert!(
                message.starts_with(
                    "the floor's own token 50 was refused as system:serviceaccount:ops:w"
                ),
                "{answer:?}: {message}"
            );
        }
        for script in [
            vec![(
                Probe::Below,
                Answer::Denied("cannot impersonate (403)".into()),
            )],
            vec![
                (Probe::Below, stale()),
                (Probe::At, Answer::Denied("cannot impersonate (403)".into())),
            ],
        ] {
            let s = Script::new(script);
            match judge(&s, 50).await {
                Err(CheckError::Forbidden {
                    participant,
                    namespace,
                    message,
                }) => {
                    assert_eq!(participant, "system:serviceaccount:ops:w");
                    assert_eq!(namespace, "ops");
                    assert_eq!(message, "cannot impersonate (403)");
                }
                other => panic!("expected Forbidden, got {other:?}"),
            }
        }
        let s = Script::new(vec![
            (Probe::Below, stale()),
            (Probe::At, Answer::Stale(Some(Current::Term(51)))),
        ]);
        assert!(
            matches!(judge(&s, 50).await, Ok(None)),
            "a newer term: read again"
        );
    }

    fn policy() -> FencingPolicy {
        FencingPolicy::new("ops", "ctl").expect("a valid policy")
    }

    #[test]
    fn a_binding_fences_this_election_only_if_it_applies_this_policy_with_this_lease() {
        let policy = policy();
        assert_eq!(binding_mismatch(&policy.binding(), &policy), None);
        let mut other_policy = policy.binding();
        other_policy.spec.policy_name = "tenure-fencing.ops.other".into();
        let message = binding_mismatch(&other_policy, &policy).expect("a mismatch");
        assert!(
            message.contains("applies the policy \"tenure-fencing.ops.other\"")
                && message.contains("lease ops/ctl"),
            "{message}"
        );
        let mut other_lease = policy.binding();
        if let Some(p) = other_lease.spec.param_ref.as_mut() {
            p.name = Some("other".into());
        }
        let message = binding_mismatch(&other_lease, &policy).expect("a mismatch");
        assert!(
            message.contains("reads the Lease ops/other as its parameter, not ops/ctl"),
            "{message}"
        );
        let mut no_param = policy.binding();
        no_param.spec.param_ref = None;
        assert!(binding_mismatch(&no_param, &policy).is_some());
    }

    #[test]
    fn a_floor_is_a_canonical_fencing_token_or_none_at_all() {
        assert_eq!(parse_floor(None), Some(0), "no term yet");
        assert_eq!(parse_floor(Some("0")), Some(0));
        assert_eq!(parse_floor(Some("4711")), Some(4711));
        assert_eq!(parse_floor(Some(&u64::MAX.to_string())), Some(u64::MAX));
        for broken in ["", "007", "+7", "-1", "7 ", "x", "18446744073709551616"] {
            assert_eq!(parse_floor(Some(broken)), None, "{broken:?}");
        }
    }

    #[test]
    fn a_participant_is_shown_with_its_groups() {
        let alone = Participant::new("system:serviceaccount:ops:w");
        assert_eq!(alone.user(), "system:serviceaccount:ops:w");
        assert!(alone.groups().is_empty());
        assert_eq!(alone.to_string(), "system:serviceaccount:ops:w");
        let grouped = Participant::new("alice").group("dev").group("ops");
        assert_eq!(grouped.groups(), ["dev", "ops"]);
        assert_eq!(grouped.to_string(), "alice (groups dev, ops)");
    }

    #[test]
    fn a_forbidden_read_says_who_may_run_the_check() {
        let status = |code| {
            kube::Error::Api(
                kube::core::Status::failure("no", "Forbidden")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(read_hint(&status(403)).contains("cluster admin"));
        assert_eq!(read_hint(&status(404)), "");
        assert_eq!(read_hint(&status(401)), "");
    }
}
