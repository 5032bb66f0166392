//! The typed outcomes of fenced writes and of the fence's proof: [`FenceError`], what beat a
//! stale token ([`Current`]), the proof's verdict ([`FenceState`]), and how an API server's
//! refusal or a local one becomes a `FenceError`.

use kube::core::Status;

use super::{REFUSAL_PREFIX, REQUEST_ELECTION_EXTRA, REQUEST_TOKEN_EXTRA};

/// How the cause of a proof that got no answer begins ([`FenceState::is_unanswered`]; the
/// proof writes it): a transport failure, a timeout or a server error through the window says
/// nothing about the fence's configuration, unlike every other cause.
pub(super) const NO_ANSWER: &str = "no answer from the API server";

/// Why a fenced write did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// A newer term exists: the API server's policy (or, without it, the object read)
    /// refused this term's token. Stop the term's work; retrying cannot succeed.
    #[error("stale write refused{}: our token {ours} < {current}", lease_suffix(.lease.as_deref()))]
    Stale {
        /// The election's Lease (`namespace/name`), when the refusal named it.
        lease: Option<String>,
        /// This term's token.
        ours: u64,
        /// What beat it: the current term's token, the object's, or the foreign holder.
        current: Current,
    },
    /// The fence is not proven on the API server (see [`FenceState`]): it admitted a token
    /// below this term's (the policy or binding is missing, or its Lease parameter cache has
    /// stopped), or the proof could not be taken. Nothing was sent: fenced writes fail closed
    /// until a recheck finds the fence enforced again ([`Fencer::warn_only`](super::Fencer::warn_only) lets them go).
    #[error("the fence on lease {lease} is not enforced, write not sent: {cause}")]
    Unenforced {
        /// The election's Lease, `namespace/name`.
        lease: String,
        /// What the proof saw, the likely cause and the fix.
        cause: String,
    },
    /// The term had already ended (cancelled, or past its validity): nothing was sent.
    #[error("the term with fencing token {ours} has ended: write not sent")]
    TermEnded {
        /// The ended term's token.
        ours: u64,
    },
    /// The policy refused a write without a token: the client sent none (a
    /// [`Fencer::without_policy`](super::Fencer::without_policy) client while the policy is installed) or it did not arrive.
    #[error("refused by the fencing policy: {message}")]
    MissingToken {
        /// The API server's message.
        message: String,
    },
    /// Another election's fencing policy refused this write although it names this
    /// election: that policy judges every election's writes of its participants (as policies
    /// of a tenure whose elections did not compose did), so it refuses any live term of
    /// another election whose token is below its own floor. Re-apply that election's policy
    /// from this tenure (`tenure policy`). Nothing says this term is stale.
    #[error(
        "refused by the fencing policy of another election (lease {lease}), although the write \
         names election {election}: re-apply that election's policy with this tenure's \
         `tenure policy` so it judges only its own writes ({message})"
    )]
    OtherElection {
        /// The election whose policy refused, `namespace/name`.
        lease: String,
        /// The election this write names, `namespace/name`.
        election: String,
        /// The API server's message.
        message: String,
    },
    /// The identity may not impersonate itself, which carrying the token needs (see the
    /// module docs for the RBAC); or the policy refused for another reason.
    #[error("{message}")]
    Forbidden {
        /// The API server's message, with a hint where one helps.
        message: String,
    },
    /// Learning this client's identity (SelfSubjectReview) failed.
    #[error("cannot learn this client's identity (SelfSubjectReview): {0}")]
    Identity(#[source] kube::Error),
    /// Any other API error or transport failure, unchanged.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// What a refused token was compared with.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Current {
    /// The current term's token (the Lease's floor).
    Term(u64),
    /// The token already on the object.
    Object(u64),
    /// A holder that does not stamp tokens (client-go) leads.
    ForeignHolder(String),
}

impl std::fmt::Display for Current {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Term(t) => write!(f, "current term's {t}"),
            Self::Object(t) => write!(f, "the object's {t}"),
            Self::ForeignHolder(h) => write!(f, "a term of {h:?}, which is not a tenure replica"),
        }
    }
}

/// What a policy's stale refusal names as the winner: "… < current F", "… < object O", or
/// "… held by H, which …".
pub(crate) fn parse_current(message: &str) -> Option<Current> {
    let number_after = |marker: &str| {
        message.find(marker).and_then(|i| {
            message[i + marker.len()..]
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse::<u64>().ok())
        })
    };
    if let Some(t) = number_after(" < current ") {
        Some(Current::Term(t))
    } else if let Some(t) = number_after(" < object ") {
        Some(Current::Object(t))
    } else {
        message.find("held by ").map(|i| {
            let holder = &message[i + "held by ".len()..];
            let holder = holder.split(", which").next().unwrap_or(holder);
            Current::ForeignHolder(holder.to_owned())
        })
    }
}

fn lease_suffix(lease: Option<&str>) -> String {
    lease.map(|l| format!(" on lease {l}")).unwrap_or_default()
}

impl FenceError {
    /// Whether this says a newer term exists or this one is over: stop, do not retry.
    #[must_use]
    pub fn is_stale(&self) -> bool {
        matches!(self, Self::Stale { .. } | Self::TermEnded { .. })
    }
}

/// What the proof of one term's fence found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FenceState {
    /// The first proof is running; fenced writes wait for it.
    Proving,
    /// The API server refuses the token below this term's and admits this term's: writes go.
    Enforced,
    /// The API server admitted the lower token (the fence is open), or the proof could not
    /// be taken: fenced writes fail with [`FenceError::Unenforced`].
    Unenforced {
        /// What was seen, the likely cause and the fix.
        cause: String,
    },
    /// The API server refused this term's own token: a newer term exists.
    Superseded {
        /// What beat it.
        current: Current,
    },
}

impl FenceState {
    /// Whether the fence is proven live.
    #[must_use]
    pub fn is_enforced(&self) -> bool {
        matches!(self, Self::Enforced)
    }

    /// Whether the fence is unproven only because the API server did not answer the proof
    /// (a transport failure, a timeout or a server error through its window): unlike an
    /// open fence, a refusal by something else or a missing permission, this says nothing
    /// about the fence's configuration, so another term may well prove it. Writes fail
    /// closed all the same.
    #[must_use]
    pub fn is_unanswered(&self) -> bool {
        matches!(self, Self::Unenforced { cause } if cause.starts_with(NO_ANSWER))
    }
}

/// Turns a kube error from a fenced request of `election` (`namespace/name`) into a
/// [`FenceError`].
pub(super) fn classify(error: kube::Error, ours: u64, election: &str) -> FenceError {
    match error {
        kube::Error::Api(status) => classify_status(*status, ours, election),
        kube::Error::Service(e) if e.is::<Ended>() => FenceError::TermEnded { ours },
        kube::Error::Service(e) if e.is::<Gated>() => match e.downcast::<Gated>() {
            Ok(gated) => gated.into_error(ours),
            Err(e) => FenceError::Kube(kube::Error::Service(e)),
        },
        other => FenceError::Kube(other),
    }
}

fn classify_status(status: Status, ours: u64, election: &str) -> FenceError {
    let message = status.message.clone();
    let Some(at) = message.find(REFUSAL_PREFIX) else {
        if status.code == 403 && message.contains("impersonate") {
            return FenceError::Forbidden {
                message: format!(
                    "{message} (a fenced client impersonates its own identity to carry the \
                     token: grant `impersonate` on its own serviceaccount and on \
                     userextras/{REQUEST_TOKEN_EXTRA} and userextras/{REQUEST_ELECTION_EXTRA} in \
                     apiGroup authentication.k8s.io, or use Fencer::without_policy)"
                ),
            };
        }
        return FenceError::Kube(kube::Error::Api(Box::new(status)));
    };
    // "tenure fencing: lease NS/NAME: stale: token T < current F" (or "< object O", or
    // ", but the lease is held by H, which …"); "…: missing token: …".
    let rest = &message[at + REFUSAL_PREFIX.len()..];
    let lease = rest
        .trim_start()
        .strip_prefix("lease ")
        .and_then(|r| r.split(": ").next())
        .map(str::to_owned);
    if let Some(other) = lease.as_deref().filter(|l| *l != election) {
        return FenceError::OtherElection {
            lease: other.to_owned(),
            election: election.to_owned(),
            message,
        };
    }
    if rest.contains(": missing token") {
        return FenceError::MissingToken { message };
    }
    let current = if rest.contains(": stale: ") {
        parse_current(rest)
    } else {
        None
    };
    match current {
        Some(current) => FenceError::Stale {
            lease,
            ours,
            current,
        },
        None => FenceError::Forbidden { message },
    }
}

/// The local refusal: the term ended before a write was sent.
#[derive(Debug)]
pub(super) struct Ended;

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the term has ended: write not sent")
    }
}

impl std::error::Error for Ended {}

/// The local refusal: the term's fence proof did not pass, so the write was not sent.
#[derive(Debug)]
pub(super) struct Gated {
    pub(super) lease: String,
    pub(super) state: FenceState,
}

impl Gated {
    pub(super) fn into_error(self, ours: u64) -> FenceError {
        match self.state {
            FenceState::Superseded { current } => FenceError::Stale {
                lease: Some(self.lease),
                ours,
                current,
            },
            FenceState::Unenforced { cause } => FenceError::Unenforced {
                lease: self.lease,
                cause,
            },
            FenceState::Proving | FenceState::Enforced => FenceError::Unenforced {
                lease: self.lease,
                cause: "the fence proof did not finish".into(),
            },
        }
    }
}

impl std::fmt::Display for Gated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            FenceState::Superseded { current } => write!(
                f,
                "write not sent: a newer term holds lease {} ({current})",
                self.lease
            ),
            FenceState::Unenforced { cause } => write!(
                f,
                "write not sent: the fence on lease {} is not enforced: {cause}",
                self.lease
            ),
            _ => write!(
                f,
                "write not sent: the fence on lease {} is unproven",
                self.lease
            ),
        }
    }
}

impl std::error::Error for Gated {}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, message: &str) -> Status {
        Status {
            code,
            message: message.to_owned(),
            ..Status::default()
        }
    }

    #[test]
    fn policy_refusals_become_typed_errors() {
        let prefix = "admission webhook denied: ValidatingAdmissionPolicy 'tenure-fencing.ns.x' with binding 'tenure-fencing.ns.x' denied request:";
        let e = classify_status(
            status(
                403,
                &format!("{prefix} {REFUSAL_PREFIX} lease ns/x: stale: token 5 < current 9"),
            ),
            5,
            "ns/x",
        );
        assert!(
            matches!(&e, FenceError::Stale { lease: Some(l), ours: 5, current: Current::Term(9) } if l == "ns/x"),
            "{e:?}"
        );
        let e = classify_status(
            status(
                403,
                &format!("{prefix} {REFUSAL_PREFIX} lease ns/x: stale: token 5 < object 7"),
            ),
            5,
            "ns/x",
        );
        assert!(
            matches!(
                e,
                FenceError::Stale {
                    current: Current::Object(7),
                    ..
                }
            ),
            "{e:?}"
        );
        let e = classify_status(
            status(
                403,
                &format!(
                    "{prefix} {REFUSAL_PREFIX} lease ns/x: stale: token 5, but the lease is held by go-1, which is not a tenure replica"
                ),
            ),
            5,
            "ns/x",
        );
        assert!(
            matches!(&e, FenceError::Stale { current: Current::ForeignHolder(h), .. } if h == "go-1"),
            "{e:?}"
        );
        let e = classify_status(
            status(
                403,
                &format!("{prefix} {REFUSAL_PREFIX} lease ns/x: missing token: …"),
            ),
            5,
            "ns/x",
        );
        assert!(matches!(e, FenceError::MissingToken { .. }), "{e:?}");
        let e = classify_status(
            status(
                403,
                "users \"x\" is forbidden: User \"y\" cannot impersonate resource \"serviceaccounts\"",
            ),
            5,
            "ns/x",
        );
        assert!(
            matches!(&e, FenceError::Forbidden { message } if message.contains("userextras")),
            "{e:?}"
        );
        // Another election's policy refusing a write that names this one: not stale.
        let e = classify_status(
            status(
                403,
                &format!("{prefix} {REFUSAL_PREFIX} lease ns/y: stale: token 5 < current 9"),
            ),
            5,
            "ns/x",
        );
        assert!(
            matches!(&e, FenceError::OtherElection { lease, election, .. } if lease == "ns/y" && election == "ns/x"),
            "{e:?}"
        );
        assert!(!e.is_stale());
        // A plain RBAC refusal is not an impersonation problem.
        let e = classify_status(
            status(403, "configmaps is forbidden: User \"x\""),
            5,
            "ns/x",
        );
        assert!(matches!(e, FenceError::Kube(kube::Error::Api(_))), "{e:?}");
        let e = classify_status(status(409, "conflict"), 5, "ns/x");
        assert!(matches!(e, FenceError::Kube(kube::Error::Api(_))), "{e:?}");
        assert!(e.to_string().contains("conflict"));
    }
}
