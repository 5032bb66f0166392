//! Why a status write failed ([`PublishError`]), mapped from the Kubernetes client's errors.

use crate::util::error_chain;

/// Why the [`StatusPublisher`](super::StatusPublisher) could not write an `Election`'s status.
///
/// The publisher never returns these: it logs them (rate-limited), retries with a backoff,
/// and keeps the latest one in [`PublisherStats::last_error`](super::PublisherStats::last_error).
/// A failed write never affects the lease or the workload.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The `Election` does not exist and the publisher was not told to create it.
    #[error(
        "election {election} not found: create it, or let the publisher create it (`create_if_missing`)"
    )]
    NotFound {
        /// `namespace/name` of the Election.
        election: String,
    },
    /// The API server refused the request (RBAC): the message names the verb and resource.
    #[error("forbidden: {op}: {message}")]
    Forbidden {
        /// What was attempted, e.g. `update elections/status default/my-election`.
        op: String,
        /// The API server's message.
        message: String,
    },
    /// Other writers kept changing the status between our read and our write.
    #[error("status of election {election} kept changing: {attempts} write conflicts in a row")]
    Conflict {
        /// `namespace/name` of the Election.
        election: String,
        /// How many compare-and-swap attempts conflicted.
        attempts: u32,
    },
    /// The API server could not be reached, timed out or answered with a server error.
    #[error("{op}: {message}")]
    Unavailable {
        /// What was attempted.
        op: String,
        /// What went wrong.
        message: String,
    },
    /// The API server rejected the request as invalid (for example, the CRD installed in the
    /// cluster is older than this crate's), or its answer could not be decoded.
    #[error("rejected: {op}: {message}")]
    Rejected {
        /// What was attempted.
        op: String,
        /// The API server's message.
        message: String,
    },
    /// The fencing token does not fit the status's `int64` field.
    #[error("fencing token {token} is above the largest int64 and cannot be published")]
    TokenOutOfRange {
        /// The token.
        token: u64,
    },
}

impl PublishError {
    /// Maps a client error hit while doing `op` (`"update elections/status ns/name"`).
    pub(super) fn from_kube(e: kube::Error, op: String, election: &str) -> Self {
        match e {
            kube::Error::Api(status) => {
                let message = if status.message.is_empty() {
                    status.reason.clone()
                } else {
                    status.message.clone()
                };
                match status.code {
                    403 | 401 => Self::Forbidden { op, message },
                    // A create answered 404: the resource type itself is missing.
                    404 if op.starts_with("create") => Self::Rejected {
                        op,
                        message: format!(
                            "{message} (is the Election CRD installed? `tenure crd | kubectl apply -f -`)"
                        ),
                    },
                    404 => Self::NotFound {
                        election: election.to_owned(),
                    },
                    409 => Self::Conflict {
                        election: election.to_owned(),
                        attempts: 1,
                    },
                    408 | 429 | 500..=599 => Self::Unavailable { op, message },
                    _ => Self::Rejected { op, message },
                }
            }
            kube::Error::SerdeError(e) => Self::Rejected {
                op,
                message: format!("cannot decode the answer: {e}"),
            },
            other => Self::Unavailable {
                op,
                message: error_chain(&other),
            },
        }
    }

    /// The error of a request that did not answer within the publisher's request timeout.
    pub(super) fn timeout(op: String) -> Self {
        Self::Unavailable {
            op,
            message: "request timed out".to_owned(),
        }
    }

    /// A short, stable name of the variant, for rate-limiting log lines.
    pub(super) fn kind_name(&self) -> &'static str {
        match self {
            Self::NotFound { .. } => "not found",
            Self::Forbidden { .. } => "forbidden",
            Self::Conflict { .. } => "conflict",
            Self::Unavailable { .. } => "unavailable",
            Self::Rejected { .. } => "rejected",
            Self::TokenOutOfRange { .. } => "token out of range",
        }
    }
}
