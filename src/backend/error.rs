//! Errors a backend can report: I/O failures and rejected lock names.

use std::fmt;
use std::sync::Arc;

// Several checkouts of this crate may share one target directory (worktrees, a CI cache).
// Cargo's fingerprints do not name the checkout, so one could take another's artifacts for
// its own; reading this variable (set per checkout in `.cargo/config.toml`'s `[env]`, or not
// at all) makes it part of this crate's fingerprint without touching any dependency's.
const _: Option<&str> = option_env!("TENURE_BUILD_TREE");

/// What kind of I/O failure a backend hit; decides whether the runtime retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// The store could not be reached or the connection broke. Transient.
    Unavailable,
    /// The store did not answer in time; the request may or may not have taken effect. Transient.
    Timeout,
    /// The store refused our credentials. Permanent until reconfigured.
    Unauthenticated,
    /// The credentials are valid but lack a permission. Permanent until reconfigured.
    PermissionDenied,
    /// The store answered something the backend cannot interpret (a script returned an
    /// unexpected shape, a resourceVersion that is not an integer). Permanent: fail closed.
    Protocol,
    /// A misconfiguration found when talking to the store (bad URL, missing namespace).
    Config,
}

impl BackendErrorKind {
    /// Whether retrying the same request later can succeed.
    #[must_use]
    pub const fn is_transient(self) -> bool {
        matches!(self, Self::Unavailable | Self::Timeout)
    }
}

impl fmt::Display for BackendErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unavailable => "backend unavailable",
            Self::Timeout => "backend timed out",
            Self::Unauthenticated => "backend authentication failed",
            Self::PermissionDenied => "backend permission denied",
            Self::Protocol => "unexpected backend answer",
            Self::Config => "backend misconfigured",
        })
    }
}

/// An I/O failure talking to a lease store. Never "busy" or "not held": those are values.
///
/// Cheap to clone (the source is shared), so one failure can be reported to every lease of a
/// failed batch. Messages never contain credentials: backends redact them before building one.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct BackendError {
    kind: BackendErrorKind,
    message: String,
    #[source]
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl BackendError {
    /// A failure of `kind`, described by `message`.
    #[must_use]
    pub fn new(kind: BackendErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying error.
    #[must_use]
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// The request did not finish within `what`'s timeout.
    #[must_use]
    pub fn timeout(what: &str, after: std::time::Duration) -> Self {
        Self::new(
            BackendErrorKind::Timeout,
            format!("{what} did not finish within {after:?}"),
        )
    }

    /// What kind of failure this is.
    #[must_use]
    pub const fn kind(&self) -> BackendErrorKind {
        self.kind
    }

    /// Whether retrying later can succeed.
    #[must_use]
    pub const fn is_transient(&self) -> bool {
        self.kind.is_transient()
    }

    /// The human-readable description, without the kind.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// A lock name the backend cannot use, with the rule it breaks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid lock name {name:?}: {rule}")]
pub struct InvalidName {
    /// The rejected name.
    pub name: String,
    /// The rule, in words ("must not be empty", "at most 253 characters", ...).
    pub rule: String,
}

impl InvalidName {
    /// `name` breaks `rule`.
    #[must_use]
    pub fn new(name: &str, rule: impl Into<String>) -> Self {
        Self {
            name: name.to_owned(),
            rule: rule.into(),
        }
    }
}

/// The rules every backend applies to lock names: not empty, at most `max_len` bytes, no
/// control characters. Backends add their own on top (Redis: no braces; Kubernetes: DNS-1123).
pub(crate) fn check_common_name_rules(name: &str, max_len: usize) -> Result<(), InvalidName> {
    if name.is_empty() {
        return Err(InvalidName::new(name, "must not be empty"));
    }
    if name.len() > max_len {
        return Err(InvalidName::new(
            name,
            format!("must be at most {max_len} bytes"),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(InvalidName::new(
            name,
            "must not contain control characters",
        ));
    }
    Ok(())
}
