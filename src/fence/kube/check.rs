//! `tenure policy --check`: the fence's proof run from outside, as a cluster admin
//! impersonating a participant, against the Lease's current floor.

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

use super::proof::{Answer, PROOF_WINDOW, RETRY, dry_create};
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
    Ok(match floor_text.as_deref().map(str::parse::<u64>) {
        None => Ok(0),
        Some(Ok(f)) if floor_text.as_deref() == Some(f.to_string().as_str()) => Ok(f),
        Some(_) => Err(CheckVerdict::Open {
            cause: OpenCause::BrokenFloor,
            message: format!(
                "the Lease {lease}'s annotation {} is {:?}, not a fencing token: every participant write is refused until the next grant rewrites it (or remove the annotation)",
                crate::backend::kube::record::FENCING_FLOOR,
                floor_text.unwrap_or_default()
            ),
        }),
    })
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
    let forbidden = |message: String| CheckError::Forbidden {
        participant: participant.to_string(),
        namespace: policy.namespace().to_owned(),
        message,
    };
    let refused = |what: &str, message: String| {
        Ok(Some(CheckVerdict::Open {
            cause: OpenCause::Refused,
            message: format!("{what} refused as {participant}: {message}"),
        }))
    };
    // Before any term (floor 0) there is no lower token: a write without one must be refused.
    let below = floor.checked_sub(1);
    let api = fencer.probe_api(election, below);
    let deadline = tokio::time::Instant::now() + PROOF_WINDOW;
    loop {
        match dry_create(&api, &probe, lease).await {
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
    let at = fencer.probe_api(election, Some(floor));
    let deadline = tokio::time::Instant::now() + PROOF_WINDOW;
    loop {
        match dry_create(&at, &probe, lease).await {
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
