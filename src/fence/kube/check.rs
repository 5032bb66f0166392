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
    /// A sharded group's fence ([`FencingPolicy::shards`](super::FencingPolicy::shards)) is
    /// enforced on every shard Lease: for each, a token just below its floor is refused and
    /// the floor's own admitted; a write naming the group but no shard is refused.
    ShardsEnforced {
        /// Each shard Lease's number and floor, in shard order: `0..shards` and any Lease of
        /// an earlier, larger count still there.
        floors: Vec<(u32, u64)>,
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
    /// (`parameterNotFoundAction: Allow`). For a sharded group: a shard's Lease does not
    /// exist or does not carry the group's label (no term of it yet, or written by an older
    /// tenure), so writes naming that shard are not judged.
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
        let shards = policy
            .shard_count()
            .map(|n| format!(" --shards {n}"))
            .unwrap_or_default();
        return open(
            OpenCause::PolicyMissing,
            format!(
                "no ValidatingAdmissionPolicy {name}: nothing fences {} {lease} (install it: `tenure policy --lease {} --namespace {}{shards} | kubectl apply -f -`)",
                if shards.is_empty() {
                    "lease"
                } else {
                    "sharded group"
                },
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
    if let Some(shards) = policy.shard_count() {
        return check_shards(client, policy, participant, shards).await;
    }
    let mut attempts = 0;
    loop {
        let floor = match read_floor(client, policy, policy.lease_name()).await? {
            Ok(floor) => floor,
            Err(verdict) => return Ok(verdict),
        };
        match prove_floor(client, policy, participant, policy.lease_name(), floor).await? {
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

/// How many shards a check proves at once (two dry runs each, more while a floor moves).
const SHARDS_IN_FLIGHT: usize = 16;

/// [`check`] of a sharded group: every shard Lease the binding selects, `0..shards` at least,
/// proved at its floor; then a write naming the group but no shard must be refused.
async fn check_shards(
    client: &kube::Client,
    policy: &super::FencingPolicy,
    participant: &Participant,
    shards: u32,
) -> Result<CheckVerdict, CheckError> {
    use futures::StreamExt;
    let group = policy.lease_name();
    let namespace = policy.namespace();
    let label = format!(
        "{}={}",
        crate::backend::kube::SHARD_GROUP_LABEL,
        crate::backend::kube::group_label_value(group)
    );
    let leases = Api::<Lease>::namespaced(client.clone(), namespace);
    let listed = leases
        .list(&kube::api::ListParams::default().labels(&label))
        .await
        .map_err(|source| CheckError::Read {
            what: format!("the Leases {label} in {namespace}"),
            source,
        })?;
    // The group's shard Leases by number; a labelled Lease of another name is not a shard.
    let mut found: std::collections::BTreeMap<u32, Lease> = listed
        .items
        .into_iter()
        .filter_map(|l| {
            let name = l.metadata.name.clone()?;
            match crate::backend::group::parse_shard_lease_name(&name) {
                Some((g, shard)) if g == group => Some((shard, l)),
                _ => None,
            }
        })
        .collect();
    let missing: Vec<u32> = (0..shards).filter(|s| !found.contains_key(s)).collect();
    if !missing.is_empty() {
        let shown: Vec<String> = missing.iter().take(8).map(u32::to_string).collect();
        let more = if missing.len() > 8 { ", …" } else { "" };
        return Ok(CheckVerdict::Open {
            cause: OpenCause::LeaseMissing,
            message: format!(
                "{} of the {shards} shard Leases of group {namespace}/{group} (shards {}{more}) do not exist or lack the label {label}: writes naming them are not judged until their shard's next grant creates or labels them (start the group: tenure run --lease {group} --shards {shards}; a Lease written by an older tenure is labelled by its next grant)",
                missing.len(),
                shown.join(", ")
            ),
        });
    }
    let mut floors = Vec::with_capacity(found.len());
    for (shard, lease) in &found {
        let name = format!("{namespace}/{}", policy.shard_lease(*shard));
        match floor_of(lease, &name) {
            Ok(floor) => floors.push((*shard, floor)),
            Err(verdict) => return Ok(verdict),
        }
    }
    found.clear();
    // Each shard proved at its floor, a few at once; a floor that moved is read again.
    let proofs = futures::stream::iter(floors)
        .map(|(shard, floor)| async move {
            let election = policy.shard_lease(shard);
            let mut floor = floor;
            for _ in 0..3 {
                match prove_floor(client, policy, participant, &election, floor).await? {
                    Some(CheckVerdict::Enforced { floor }) => return Ok(Ok((shard, floor))),
                    Some(verdict) => return Ok(Err(verdict)),
                    None => match read_floor(client, policy, &election).await? {
                        Ok(now) => floor = now,
                        Err(verdict) => return Ok(Err(verdict)),
                    },
                }
            }
            Err(CheckError::NoAnswer {
                message: format!(
                    "the floor of lease {namespace}/{election} moved under each of 3 attempts (terms granted faster than the check runs)"
                ),
            })
        })
        .buffer_unordered(SHARDS_IN_FLIGHT);
    let mut proofs = std::pin::pin!(proofs);
    let mut proven = Vec::new();
    while let Some(result) = proofs.next().await {
        match result? {
            Ok(shard) => proven.push(shard),
            Err(verdict) => return Ok(verdict),
        }
    }
    proven.sort_unstable();
    // A write naming the group itself names no shard: every shard's evaluation refuses it.
    let token = proven.first().map_or(1, |(_, floor)| *floor);
    let fencer =
        super::Fencer::impersonating(client.clone(), participant.user(), participant.groups())
            .map_err(|_| CheckError::BadParticipant {
                participant: participant.user().to_owned(),
            })?
            .lease_namespace(namespace);
    let api = fencer.probe_api(group, Some(token));
    let probe = super::policy::probe_name(&policy.shard_lease(0));
    let deadline = tokio::time::Instant::now() + PROOF_WINDOW;
    loop {
        match dry_create(
            &api,
            &probe,
            &format!("{namespace}/{}", policy.shard_lease(0)),
        )
        .await
        {
            Answer::Refused(message) if message.contains(": missing shard") => break,
            Answer::Denied(message) => {
                return Err(CheckError::Forbidden {
                    participant: participant.to_string(),
                    namespace: namespace.to_owned(),
                    message,
                });
            }
            Answer::Failed(message) if tokio::time::Instant::now() >= deadline => {
                return Err(CheckError::NoAnswer { message });
            }
            Answer::Failed(_) => tokio::time::sleep(RETRY * 10).await,
            other => {
                return Ok(CheckVerdict::Open {
                    cause: OpenCause::NotEnforced,
                    message: format!(
                        "a write of {participant} naming the group {namespace}/{group} itself (no shard) with token {token} was not refused as naming no shard ({other:?}): the policy {} is not a sharded group's (re-apply `tenure policy --shards`'s output)",
                        policy.name()
                    ),
                });
            }
        }
    }
    Ok(CheckVerdict::ShardsEnforced { floors: proven })
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
    if param(binding) != param(&want) && policy.shard_count().is_some() {
        return Some(format!(
            "the binding {name} does not select the shard Leases of group {}/{} (its paramRef must select {}={} in {}): it does not fence the group's writes (re-apply `tenure policy --shards`'s output)",
            policy.namespace(),
            policy.lease_name(),
            crate::backend::kube::SHARD_GROUP_LABEL,
            crate::backend::kube::group_label_value(policy.lease_name()),
            policy.namespace(),
        ));
    }
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

/// The floor of the Lease `name` (0 before the first term), or the verdict when the Lease is
/// missing or its floor is broken.
async fn read_floor(
    client: &kube::Client,
    policy: &super::FencingPolicy,
    name: &str,
) -> Result<Result<u64, CheckVerdict>, CheckError> {
    let lease = format!("{}/{name}", policy.namespace());
    let Some(record) = Api::<Lease>::namespaced(client.clone(), policy.namespace())
        .get_opt(name)
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
    Ok(floor_of(&record, &lease))
}

/// `record`'s floor (0 when it has none), or the verdict when it is broken.
fn floor_of(record: &Lease, lease: &str) -> Result<u64, CheckVerdict> {
    let floor_text = record
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::backend::kube::record::FENCING_FLOOR).cloned());
    match floor_text.as_deref().map(str::parse::<u64>) {
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
    }
}

/// The two dry runs at `floor` naming the election `election` (the Lease's name): `None`
/// when the floor's own token was refused as stale (a newer term came: read the floor again).
async fn prove_floor(
    client: &kube::Client,
    policy: &super::FencingPolicy,
    participant: &Participant,
    election: &str,
    floor: u64,
) -> Result<Option<CheckVerdict>, CheckError> {
    let lease = &format!("{}/{election}", policy.namespace());
    let fencer =
        super::Fencer::impersonating(client.clone(), participant.user(), participant.groups())
            .map_err(|_| CheckError::BadParticipant {
                participant: participant.user().to_owned(),
            })?
            .lease_namespace(policy.namespace());
    let probe = super::policy::probe_name(election);
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
            // A sharded group's shard whose floor this server has not reached: it lags.
            Answer::Admitted | Answer::Unseen(_) | Answer::Failed(_)
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(RETRY * 10).await;
            }
            Answer::Admitted | Answer::Unseen(_) | Answer::Failed(_) => {
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
            Answer::Unseen(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(RETRY * 10).await;
            }
            Answer::Unseen(message) => {
                return Ok(Some(CheckVerdict::Open {
                    cause: OpenCause::NotEnforced,
                    message: format!(
                        "the API server has not reached the floor {floor} of lease {lease} in {PROOF_WINDOW:?} (its Lease parameter cache lags or has stopped: kubernetes/kubernetes#130887 -- restart every kube-apiserver and keep the anchor {}): {message}",
                        super::ANCHOR_NAME
                    ),
                }));
            }
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
