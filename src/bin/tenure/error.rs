//! What can stop tenure, each with its exit code (see [`crate::args::EXIT_CODES`]).

use tenure::backend::BackendError;
use tenure::{ElectionError, LockError};

/// A failure of tenure itself, printed as one line: `tenure: <message>`.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad flags, names or durations.
    #[error("{message}")]
    Config {
        /// What was wrong, naming the flag.
        message: String,
    },
    /// The backend could not be used.
    #[error("{message}")]
    Backend {
        /// What failed, and where.
        message: String,
    },
    /// The lease was lost and --rejoin is off.
    #[error("{message}")]
    Lost {
        /// Which term, and why.
        message: String,
    },
    /// The command could not be started.
    #[error("cannot run {program:?}: {source}")]
    Spawn {
        /// The program named after `--`.
        program: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Something tenure itself could not do (a thread, a socket, a signal handler).
    #[error("{message}")]
    Internal {
        /// What.
        message: String,
    },
}

impl CliError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Config { .. } => 2,
            Self::Lost { .. } => 3,
            Self::Backend { .. } => 4,
            Self::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound => 127,
            Self::Spawn { .. } => 126,
            Self::Internal { .. } => 1,
        }
    }

    /// A backend failure, with context.
    pub fn backend(context: &str, e: &BackendError) -> Self {
        Self::Backend {
            message: format!("{context}: {}", chain(e)),
        }
    }
}

/// The library's option names in a rule, replaced by the flags that set them.
fn flag_names(rule: &str) -> String {
    rule.replace("lease_duration", "--lease-duration")
        .replace("renew_deadline", "--renew-deadline")
        .replace("retry_period", "--retry-period")
        .replace("grace", "--grace")
}

/// An error and its sources joined with ": ", each distinct message once.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

impl From<ElectionError> for CliError {
    fn from(e: ElectionError) -> Self {
        match e {
            ElectionError::InvalidConfig { rule } => Self::Config {
                message: format!("invalid durations: {}", flag_names(&rule)),
            },
            ElectionError::Lost { .. } => Self::Lost { message: chain(&e) },
            ElectionError::Lock(LockError::InvalidName(_)) => Self::Config {
                message: format!("--lease: {}", chain(&e)),
            },
            ElectionError::Lock(
                LockError::TtlTooShort { .. } | LockError::InvalidConfig { .. },
            ) => Self::Config {
                message: format!("invalid durations: {}", chain(&e)),
            },
            ElectionError::Lock(LockError::Backend(ref b)) if !b.kind().is_transient() => {
                Self::Backend { message: chain(&e) }
            }
            other => Self::Internal {
                message: chain(&other),
            },
        }
    }
}
