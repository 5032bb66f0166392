//! `tenure policy --check`: the fence's proof run from outside, as a cluster admin
//! impersonating a participant, against the Lease's current floor.

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

use super::proof::{Answer, PROOF_WINDOW, RETRY, dry_create};

/// What [`check`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckVerdict {
    /// The API server refuses a participant's token below the Lease's floor (or, before the
    /// first term, a participant's write without a token).
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
}

/// Proves from outside, as `tenure policy --check` does, that the API server `client`
/// reaches enforces the fence of `policy`'s election: the policy, its binding and the Lease
/// exist, and a dry-run create of the probe Lease as the participant `participant`
/// (impersonated: the caller needs `impersonate` on that user and on
/// `userextras/tenure.dev/fencing-token`) with the token just below the Lease's floor is
/// refused. One check proves only the API server that answered it.
///
/// # Errors
///
/// The API error or transport failure that kept the check from running (RBAC, unreachable).
///
/// # Cancel safety
///
/// Cancel safe: it only reads and sends dry runs.
pub async fn check(
    client: &kube::Client,
    policy: &super::FencingPolicy,
    participant: &str,
) -> Result<CheckVerdict, kube::Error> {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let name = policy.name();
    let lease = format!("{}/{}", policy.namespace(), policy.lease_name());
    let open = |cause, message: String| Ok(CheckVerdict::Open { cause, message });
    if Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .get_opt(&name)
        .await?
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
    if Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .get_opt(&name)
        .await?
        .is_none()
    {
        return open(
            OpenCause::BindingMissing,
            format!(
                "the policy {name} has no binding {name}: it fences nothing (re-apply `tenure policy`'s output; keep the anchor {} so a deleted binding cannot stop the API server's Lease cache)",
                super::ANCHOR_NAME
            ),
        );
    }
    let Some(record) = Api::<Lease>::namespaced(client.clone(), policy.namespace())
        .get_opt(policy.lease_name())
        .await?
    else {
        return open(
            OpenCause::LeaseMissing,
            format!(
                "the Lease {lease} does not exist: the binding admits every write until a term creates it (`tenure policy` prints it empty)"
            ),
        );
    };
    let floor_text = record
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::backend::kube::record::FENCING_FLOOR).cloned());
    let floor = match floor_text.as_deref().map(str::parse::<u64>) {
        None => 0,
        Some(Ok(f)) if floor_text.as_deref() == Some(f.to_string().as_str()) => f,
        Some(_) => {
            return open(
                OpenCause::BrokenFloor,
                format!(
                    "the Lease {lease}'s annotation {} is {:?}, not a fencing token: every participant write is refused until the next grant rewrites it (or remove the annotation)",
                    crate::backend::kube::record::FENCING_FLOOR,
                    floor_text.unwrap_or_default()
                ),
            );
        }
    };
    let fencer = super::Fencer::impersonating(client.clone(), participant)
        .map_err(|e| kube::Error::Service(e.to_string().into()))?
        .lease_namespace(policy.namespace());
    // Before any term (floor 0) there is no lower token: a write without one must be refused.
    let below = floor.checked_sub(1);
    let api = fencer.probe_api(below);
    let deadline = tokio::time::Instant::now() + PROOF_WINDOW;
    loop {
        let answer = dry_create(&api, &policy.probe(), &lease).await;
        match answer {
            Answer::Stale(_) => return Ok(CheckVerdict::Enforced { floor }),
            Answer::Refused(message) if below.is_none() && message.contains(": missing token") => {
                return Ok(CheckVerdict::Enforced { floor });
            }
            Answer::Refused(message) => {
                return open(
                    OpenCause::NotEnforced,
                    format!("unexpected refusal: {message}"),
                );
            }
            Answer::Failed(message) | Answer::Denied(message) => {
                return Err(kube::Error::Service(message.into()));
            }
            Answer::Admitted if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(RETRY * 10).await;
            }
            Answer::Admitted => {
                let what = below.map_or_else(
                    || "a write without a token".to_owned(),
                    |b| format!("token {b}, below the Lease's floor {floor},"),
                );
                return open(
                    OpenCause::NotEnforced,
                    format!(
                        "the API server admitted {what} from {participant} on lease {lease} although the policy, its binding and the Lease exist: its Lease parameter cache is stale (Kubernetes 1.30-1.36 stop it for good once no Lease-parameter policy has a binding: kubernetes/kubernetes#130887, #133827) -- restart every kube-apiserver and keep the anchor {} -- or {participant} is not a participant of the policy",
                        super::ANCHOR_NAME
                    ),
                );
            }
        }
    }
}
