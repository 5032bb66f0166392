//! `tenure policy --check`: the fence's proof run from outside, as a cluster admin
//! impersonating a participant, against the Lease's current floor.

use std::collections::BTreeMap;

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
    let floor = match read_floor(client, policy, policy.lease_name()).await? {
        Ok(floor) => floor,
        Err(verdict) => return Ok(verdict),
    };
    Ok(
        match prove_lease(client, policy, participant, policy.lease_name(), floor).await? {
            Ok(floor) => CheckVerdict::Enforced { floor },
            Err(verdict) => verdict,
        },
    )
}

/// How often a check reads a Lease's floor again when a term was granted between its read
/// and its dry runs, before it gives up (terms granted faster than the check runs).
const FLOOR_READS: u32 = 3;

/// The dry runs of the election `election` (a Lease's name) at `floor`, read from its Lease:
/// the floor proven, or the verdict that it is not. A floor that moved under the dry runs (a
/// term was granted in between) is read again, [`FLOOR_READS`] times at most. The one path
/// from a floor to a verdict, for one lease and for each shard of a group.
async fn prove_lease(
    client: &kube::Client,
    policy: &super::FencingPolicy,
    participant: &Participant,
    election: &str,
    floor: u64,
) -> Result<Result<u64, CheckVerdict>, CheckError> {
    let mut floor = floor;
    for _ in 0..FLOOR_READS {
        match prove_floor(client, policy, participant, election, floor).await? {
            Some(CheckVerdict::Enforced { floor }) => return Ok(Ok(floor)),
            Some(verdict) => return Ok(Err(verdict)),
            None => match read_floor(client, policy, election).await? {
                Ok(now) => floor = now,
                Err(verdict) => return Ok(Err(verdict)),
            },
        }
    }
    Err(CheckError::NoAnswer {
        message: format!(
            "the floor of lease {}/{election} moved under each of {FLOOR_READS} attempts (terms granted faster than the check runs)",
            policy.namespace()
        ),
    })
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
    let mut found = shard_leases(group, listed.items);
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
            Ok::<_, CheckError>(
                prove_lease(client, policy, participant, &election, floor)
                    .await?
                    .map(|floor| (shard, floor)),
            )
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
    let shard_lease = format!("{namespace}/{}", policy.shard_lease(0));
    let facts = NoShard {
        participant,
        namespace,
        group,
        policy: &policy.name(),
        token,
    };
    if let Some(verdict) = judge_no_shard(&facts, || dry_create(&api, &probe, &shard_lease)).await?
    {
        return Ok(verdict);
    }
    Ok(CheckVerdict::ShardsEnforced { floors: proven })
}

/// The shard Leases of `group` among `listed` (the Leases carrying the group's label), by
/// shard number: a labelled Lease whose name is not `GROUP-SHARD` of this group (another
/// group's, one labelled by hand) is not a shard of it, whatever its label says.
fn shard_leases(group: &str, listed: Vec<Lease>) -> BTreeMap<u32, Lease> {
    listed
        .into_iter()
        .filter_map(|l| {
            let name = l.metadata.name.clone()?;
            match crate::backend::group::parse_shard_lease_name(&name) {
                Some((g, shard)) if g == group => Some((shard, l)),
                _ => None,
            }
        })
        .collect()
}

/// What a check's write naming a sharded group itself, no shard, is about.
struct NoShard<'a> {
    participant: &'a Participant,
    namespace: &'a str,
    /// The group's name.
    group: &'a str,
    /// The group's policy's name.
    policy: &'a str,
    /// The token the write carries (a shard's floor: live, were it judged by that shard).
    token: u64,
}

/// The check's decision on a write naming the group itself, given a way to `ask` its dry run:
/// `None` when every shard's evaluation refused it as naming no shard (the group's policy is
/// a sharded group's), asked again every 100 ms within [`PROOF_WINDOW`] while there is no
/// answer; any other answer is an open fence.
async fn judge_no_shard<F, Fut>(
    facts: &NoShard<'_>,
    mut ask: F,
) -> Result<Option<CheckVerdict>, CheckError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Answer>,
{
    let NoShard {
        participant,
        namespace,
        group,
        policy,
        token,
    } = *facts;
    let deadline = tokio::time::Instant::now() + PROOF_WINDOW;
    loop {
        match ask().await {
            Answer::Refused(message) if message.contains(": missing shard") => return Ok(None),
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
                return Ok(Some(CheckVerdict::Open {
                    cause: OpenCause::NotEnforced,
                    message: format!(
                        "a write of {participant} naming the group {namespace}/{group} itself (no shard) with token {token} was not refused as naming no shard ({other:?}): the policy {policy} is not a sharded group's (re-apply `tenure policy --shards`'s output)"
                    ),
                }));
            }
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
        .and_then(|a| a.get(crate::backend::kube::record::FENCING_FLOOR))
        .map(String::as_str);
    parse_floor(floor_text).ok_or_else(|| CheckVerdict::Open {
        cause: OpenCause::BrokenFloor,
        message: format!(
            "the Lease {lease}'s annotation {} is {:?}, not a fencing token: every participant write is refused until the next grant rewrites it (or remove the annotation)",
            crate::backend::kube::record::FENCING_FLOOR,
            floor_text.unwrap_or_default()
        ),
    })
}

/// The floor a Lease's `tenure.dev/fencing-floor` annotation gives (0 when there is none: no
/// term yet), or `None` when it is not a fencing token as tenure writes it (decimal, no sign,
/// no leading zeros, a u64): the policy's CEL refuses every participant write under a floor
/// that is not canonical (`policy::canonical`), and no u64 token reaches one above u64.
fn parse_floor(text: Option<&str>) -> Option<u64> {
    let Some(text) = text else {
        return Some(0);
    };
    text.parse::<u64>().ok().filter(|f| f.to_string() == text)
}

/// The token each dry run of a check at `floor` carries: just below the floor (none at
/// floor 0: before the first term a participant's write without a token must be refused),
/// and the floor's own, which the live term writes with.
fn probe_token(which: Probe, floor: u64) -> Option<u64> {
    match which {
        Probe::Below => floor.checked_sub(1),
        Probe::At => Some(floor),
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
    let below = fencer.probe_api(election, probe_token(Probe::Below, floor));
    let at = fencer.probe_api(election, probe_token(Probe::At, floor));
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
    /// `namespace/name` of the election's Lease (a shard's, for a group).
    lease: &'a str,
    /// The Lease's floor (0: no term yet).
    floor: u64,
}

/// The check's decisions at one floor, given a way to `ask` each dry run ([`probe_token`]
/// says which token it carries): the token below the floor must be refused as stale (at
/// floor 0, the write without a token as missing one), asked again every 100 ms within
/// [`PROOF_WINDOW`] while the server admits it, has not seen the floor's grant (a group's
/// shard) or does not answer; then the floor's own token must be admitted. `None` when the
/// floor's own token was refused as stale (a newer term came).
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
    let below = probe_token(Probe::Below, floor);
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
    let deadline = tokio::time::Instant::now() + PROOF_WINDOW;
    loop {
        match ask(Probe::At).await {
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

    fn unseen() -> Answer {
        Answer::Unseen("tenure fencing: lease ops/ctl: not this shard's term: token 50".into())
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

    /// The last dry run came within one retry after the window's end, not before it.
    fn gave_up_at_the_window(s: &Script) {
        let last = *times(s).last().expect("asked");
        assert!(
            last >= PROOF_WINDOW && last < PROOF_WINDOW + RETRY * 10,
            "gave up at {last:?}, not at the window's end"
        );
    }

    #[test]
    fn the_dry_runs_carry_the_token_just_below_the_floor_and_the_floors_own() {
        assert_eq!(probe_token(Probe::Below, 50), Some(49));
        assert_eq!(probe_token(Probe::At, 50), Some(50));
        // The lowest floor with a lower token: 0, a canonical token.
        assert_eq!(probe_token(Probe::Below, 1), Some(0));
        assert_eq!(probe_token(Probe::At, 1), Some(1));
        // Before the first term there is no lower token: the write carries none.
        assert_eq!(probe_token(Probe::Below, 0), None);
        assert_eq!(probe_token(Probe::At, 0), Some(0));
        assert_eq!(probe_token(Probe::Below, u64::MAX), Some(u64::MAX - 1));
        assert_eq!(probe_token(Probe::At, u64::MAX), Some(u64::MAX));
    }

    #[tokio::test(start_paused = true)]
    async fn the_floor_is_enforced_once_the_token_below_is_stale_and_its_own_admitted() {
        let s = Script::new(vec![(Probe::Below, stale()), (Probe::At, Answer::Admitted)]);
        assert!(matches!(
            judge(&s, 50).await,
            Ok(Some(CheckVerdict::Enforced { floor: 50 }))
        ));
        assert_eq!(times(&s), [Duration::ZERO; 2], "no wait when both answer");
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
            message.starts_with(
                "a dry run below the floor was refused as system:serviceaccount:ops:w: tenure fencing"
            ),
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
            (Probe::Below, unseen()),
            (Probe::Below, Answer::Failed("timeout".into())),
            (Probe::Below, stale()),
            (Probe::At, Answer::Failed("timeout".into())),
            (Probe::At, unseen()),
            (Probe::At, Answer::Admitted),
        ]);
        assert!(matches!(
            judge(&s, 50).await,
            Ok(Some(CheckVerdict::Enforced { floor: 50 }))
        ));
        assert_eq!(
            times(&s),
            [0, 100, 200, 300, 300, 400, 500].map(Duration::from_millis)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_below_the_floor_admitted_for_the_whole_window_is_an_open_fence() {
        for answer in [Answer::Admitted, unseen()] {
            let s = Script::new(vec![(Probe::Below, answer.clone())]);
            let (cause, message) = open(judge(&s, 50).await);
            assert_eq!(cause, OpenCause::NotEnforced, "{answer:?}");
            assert!(
                message.contains(
                    "admitted token 49, below the Lease's floor 50, from system:serviceaccount:ops:w on lease ops/ctl"
                ) && message.contains("#130887")
                    && message.contains(crate::fence::kube::ANCHOR_NAME),
                "{message}"
            );
            gave_up_at_the_window(&s);
            assert!(s.asked().iter().all(|(p, _)| *p == Probe::Below));
        }
        let s = Script::new(vec![(Probe::Below, Answer::Admitted)]);
        let (_, message) = open(judge(&s, 0).await);
        assert!(
            message.contains("admitted a write without a token"),
            "{message}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_floor_the_server_never_reaches_is_an_open_fence() {
        let s = Script::new(vec![(Probe::Below, stale()), (Probe::At, unseen())]);
        let (cause, message) = open(judge(&s, 50).await);
        assert_eq!(cause, OpenCause::NotEnforced);
        assert!(
            message.starts_with("the API server has not reached the floor 50 of lease ops/ctl")
                && message.contains("#130887")
                && message.ends_with("not this shard's term: token 50"),
            "{message}"
        );
        let asked = s.asked();
        let at: Vec<Duration> = asked
            .iter()
            .filter(|(p, _)| *p == Probe::At)
            .map(|(_, t)| *t)
            .collect();
        assert!(at.windows(2).all(|w| w[1] - w[0] == RETRY * 10), "paced");
        gave_up_at_the_window(&s);
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

    /// The verdict on the write naming group `ops/orders` itself, on `answers`.
    async fn no_shard(answers: Vec<Answer>) -> (Result<Option<CheckVerdict>, CheckError>, usize) {
        let participant = Participant::new("system:serviceaccount:ops:w");
        let facts = NoShard {
            participant: &participant,
            namespace: "ops",
            group: "orders",
            policy: "tenure-fencing.ops.orders",
            token: 77,
        };
        let s = Script::new(answers.into_iter().map(|a| (Probe::At, a)).collect());
        let verdict = tokio::time::timeout(
            PROOF_WINDOW * 10,
            judge_no_shard(&facts, || s.ask(Probe::At)),
        )
        .await
        .expect("a verdict within ten proof windows");
        (verdict, s.asked().len())
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_naming_the_group_itself_must_be_refused_as_naming_no_shard() {
        let refused = "tenure fencing: group ops/orders: missing shard: the write names the group";
        let (verdict, asked) = no_shard(vec![
            Answer::Failed("timeout".into()),
            Answer::Refused(refused.into()),
        ])
        .await;
        assert!(matches!(verdict, Ok(None)), "{verdict:?}");
        assert_eq!(asked, 2, "a failure is asked again");
        for answer in [
            Answer::Admitted,
            Answer::Refused("tenure fencing: group ops/orders: missing token".into()),
            Answer::Stale(None),
            Answer::OtherAdmission("webhook: no".into()),
        ] {
            let (verdict, asked) = no_shard(vec![answer.clone()]).await;
            let (cause, message) = open(verdict);
            assert_eq!(cause, OpenCause::NotEnforced, "{answer:?}");
            assert_eq!(asked, 1, "{answer:?}: decided at once");
            assert!(
                message.starts_with(
                    "a write of system:serviceaccount:ops:w naming the group ops/orders itself (no shard) with token 77 was not refused as naming no shard"
                ) && message.contains("the policy tenure-fencing.ops.orders is not a sharded group's"),
                "{message}"
            );
        }
        match no_shard(vec![Answer::Denied("no (403)".into())]).await.0 {
            Err(CheckError::Forbidden {
                participant,
                namespace,
                message,
            }) => {
                assert_eq!(participant, "system:serviceaccount:ops:w");
                assert_eq!(namespace, "ops");
                assert_eq!(message, "no (403)");
            }
            other => panic!("expected Forbidden, got {other:?}"),
        }
        let (verdict, asked) = no_shard(vec![Answer::Failed("connection refused".into())]).await;
        assert!(
            matches!(&verdict, Err(CheckError::NoAnswer { message }) if message == "connection refused"),
            "{verdict:?}"
        );
        // Every 100 ms from 0 through the window's end, then no more.
        let tries = u32::try_from(asked).expect("few");
        assert!(
            RETRY * 10 * (tries - 1) >= PROOF_WINDOW && RETRY * 10 * (tries - 2) < PROOF_WINDOW,
            "{asked} tries"
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
        // A group's binding in place of the single lease's: it reads no one Lease.
        let group = policy.clone().shards(4).expect("a group");
        let mut selecting = group.binding();
        selecting.spec.policy_name = policy.name();
        let message = binding_mismatch(&selecting, &policy).expect("a mismatch");
        assert!(
            message.contains("reads the Lease ops/(a selector) as its parameter, not ops/ctl"),
            "{message}"
        );
    }

    #[test]
    fn a_groups_binding_must_select_its_own_shard_leases() {
        let group = FencingPolicy::new("ops", "orders")
            .and_then(|p| p.shards(4))
            .expect("a group");
        assert_eq!(binding_mismatch(&group.binding(), &group), None);
        // The shard count is not in the binding: a group resized keeps its binding.
        let resized = FencingPolicy::new("ops", "orders")
            .and_then(|p| p.shards(16))
            .expect("a group");
        assert_eq!(binding_mismatch(&resized.binding(), &group), None);
        let selects = |binding: &ValidatingAdmissionPolicyBinding| {
            let message = binding_mismatch(binding, &group).expect("a mismatch");
            assert!(
                message.contains(
                    "does not select the shard Leases of group ops/orders (its paramRef must select tenure.dev/shard-group=orders in ops)"
                ),
                "{message}"
            );
        };
        // Another group's selector, the same group's in another namespace, one Lease, none.
        let mut other_group = group.binding();
        other_group.spec.param_ref = FencingPolicy::new("ops", "payments")
            .and_then(|p| p.shards(4))
            .expect("a group")
            .binding()
            .spec
            .param_ref;
        selects(&other_group);
        let mut other_namespace = group.binding();
        if let Some(p) = other_namespace.spec.param_ref.as_mut() {
            p.namespace = Some("dev".into());
        }
        selects(&other_namespace);
        let mut one_lease = group.binding();
        one_lease.spec.param_ref = policy().binding().spec.param_ref;
        selects(&one_lease);
        let mut no_param = group.binding();
        no_param.spec.param_ref = None;
        selects(&no_param);
        // A single lease's policy applied by the group's binding.
        let mut single = group.binding();
        single.spec.policy_name = "tenure-fencing.ops.orders-0".into();
        assert!(
            binding_mismatch(&single, &group)
                .expect("a mismatch")
                .contains("applies the policy \"tenure-fencing.ops.orders-0\"")
        );
    }

    #[test]
    fn only_leases_named_for_a_shard_of_the_group_are_its_shards() {
        let lease = |name: Option<&str>| Lease {
            metadata: kube::api::ObjectMeta {
                name: name.map(str::to_owned),
                ..Default::default()
            },
            spec: None,
        };
        let listed = [
            Some("orders-0"),
            Some("orders-3"),
            // Labelled for the group, yet another group's shard, or no shard at all.
            Some("orders-eu-1"),
            Some("payments-2"),
            Some("orders"),
            Some("orders-x"),
            None,
        ]
        .map(lease)
        .to_vec();
        let shards = shard_leases("orders", listed);
        assert_eq!(shards.keys().copied().collect::<Vec<_>>(), [0, 3]);
        assert_eq!(
            shards[&3].metadata.name.as_deref(),
            Some("orders-3"),
            "each shard with its own Lease"
        );
        let eu = shard_leases("orders-eu", vec![lease(Some("orders-eu-1"))]);
        assert_eq!(eu.keys().copied().collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn a_floor_is_a_canonical_fencing_token_or_none_at_all() {
        assert_eq!(parse_floor(None), Some(0), "no term yet");
        assert_eq!(parse_floor(Some("0")), Some(0));
        assert_eq!(parse_floor(Some("4711")), Some(4711));
        assert_eq!(parse_floor(Some(&u64::MAX.to_string())), Some(u64::MAX));
        for broken in [
            "",
            "007",
            "+7",
            "-1",
            "7 ",
            " 7",
            "x",
            "1e3",
            "18446744073709551616",
        ] {
            assert_eq!(parse_floor(Some(broken)), None, "{broken:?}");
        }
    }

    #[test]
    fn a_leases_floor_or_the_verdict_naming_its_broken_annotation() {
        let with = |floor: Option<&str>| Lease {
            metadata: kube::api::ObjectMeta {
                name: Some("ctl".into()),
                annotations: floor.map(|f| {
                    [(
                        crate::backend::kube::record::FENCING_FLOOR.to_owned(),
                        f.to_owned(),
                    )]
                    .into()
                }),
                ..Default::default()
            },
            spec: None,
        };
        assert_eq!(floor_of(&with(None), LEASE), Ok(0));
        assert_eq!(floor_of(&with(Some("812")), LEASE), Ok(812));
        match floor_of(&with(Some("0812")), LEASE) {
            Err(CheckVerdict::Open { cause, message }) => {
                assert_eq!(cause, OpenCause::BrokenFloor);
                assert!(
                    message.starts_with(
                        "the Lease ops/ctl's annotation tenure.dev/fencing-floor is \"0812\", not a fencing token"
                    ),
                    "{message}"
                );
            }
            other => panic!("expected BrokenFloor, got {other:?}"),
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
