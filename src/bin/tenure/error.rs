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
    /// `tenure policy --check` found the fence not enforced.
    #[error("{message}")]
    FenceOpen {
        /// What was seen, the likely cause and the fix.
        message: String,
    },
    /// `--try` or `--timeout`: the lease was not won in time; the command did not run.
    #[error("{message}")]
    NotAcquired {
        /// Who holds it, or why it could not be known.
        message: String,
    },
    /// `--fence`: the term's fence could not be proven; the command did not start.
    #[error("{message}")]
    Unfenced {
        /// What the proof saw, and the fix.
        message: String,
    },
    /// `--once-per`: the command exited 0 but its completion was not recorded.
    #[error("{message}")]
    NotRecorded {
        /// Why, and what it means (the job may run again this period).
        message: String,
    },
    /// `tenure status --require-leader`: nobody holds the lease (or some shard's lease).
    #[error("{message}")]
    Leaderless {
        /// Which lease (or shards) nobody holds.
        message: String,
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
            Self::FenceOpen { .. } => 5,
            Self::NotAcquired { .. } => 6,
            Self::Unfenced { .. } => 8,
            Self::NotRecorded { .. } => 9,
            Self::Leaderless { .. } => 10,
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

/// `s` as it may be shown on a terminal: control characters escaped (`\n`, `\r`, `\t`, others
/// as `\u{1b}`), and so are the invisible format characters that reorder or hide text
/// (bidirectional overrides, zero-width spaces). Text tenure did not write itself — a holder
/// identity read from a store, a path in an error — must never move the cursor, recolour
/// the screen or forge a line. JSON output needs none of this: it has its own escaping.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    use std::fmt::Write as _;
    if !s.chars().any(needs_escape) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Control characters (C0, DEL, C1) and the invisible characters that change how the text
/// around them is shown.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{feff}')
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}')
}

/// The library's option names in a rule, replaced by the flags that set them.
fn flag_names(rule: &str) -> String {
    rule.replace("lease_duration", "--lease-duration")
        .replace("renew_deadline", "--renew-deadline")
        .replace("retry_period", "--retry-period")
        .replace("grace", "--grace")
}

/// Whether `e` is a [`BackendError`] or shows one as itself (`#[error(transparent)]`
/// wrappers, whose `source()` skips the backend error and goes to what lies below it).
fn is_backend_error(e: &(dyn std::error::Error + 'static)) -> bool {
    fn election(e: &ElectionError) -> bool {
        matches!(e, ElectionError::Lock(LockError::Backend(_)))
    }
    e.is::<BackendError>()
        || matches!(e.downcast_ref::<LockError>(), Some(LockError::Backend(_)))
        || e.downcast_ref::<ElectionError>().is_some_and(election)
        || matches!(
            e.downcast_ref::<tenure::shard::ShardError>(),
            Some(tenure::shard::ShardError::Election(el)) if election(el)
        )
}

/// An error and its sources joined with ": ", each distinct message once. The chain ends at
/// a [`BackendError`]: its message is complete (the backend built it from its source, with
/// credentials redacted), and what lies below is the client library's own error, whose text
/// may repeat it, dump a struct (kube's `ApiError: ... (Status { .. })`) or show what the
/// backend redacted.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut current = e;
    while !is_backend_error(current)
        && let Some(s) = current.source()
    {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        current = s;
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
            ElectionError::ShardLease { .. } => Self::Config {
                message: format!("--lease: {e}"),
            },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_escapes_what_a_terminal_would_interpret() {
        assert!(matches!(
            printable("web-1 é ü"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            printable("a\x1b[2Jb\r\nc\td\u{9b}e\u{7f}"),
            "a\\u{1b}[2Jb\\r\\nc\\td\\u{9b}e\\u{7f}"
        );
        assert_eq!(printable("x\u{202e}y\u{200b}"), "x\\u{202e}y\\u{200b}");
    }

    /// A source below a backend error (the client library's error) is not printed: the
    /// backend's message already says it, redacted. kube's Display of an API status repeats
    /// the message and dumps the `Status` struct; a pod's log showed it three times on one
    /// line.
    #[test]
    fn chain_ends_at_the_backend_error() {
        use tenure::backend::BackendErrorKind;
        let below = std::io::Error::other("ApiError: the detail (Status { code: 403 }) pw=hunter2");
        let backend = BackendError::new(
            BackendErrorKind::PermissionDenied,
            "update leases ns/x: forbidden (403): the detail",
        )
        .with_source(below);
        let text = chain(&backend);
        assert_eq!(
            text,
            "backend permission denied: update leases ns/x: forbidden (403): the detail"
        );
        let election = ElectionError::Lock(LockError::Backend(backend));
        let line = CliError::from(election).to_string();
        assert!(line.contains("forbidden (403): the detail"), "{line}");
        assert!(
            !line.contains("Status {") && !line.contains("hunter2"),
            "{line}"
        );
        assert_eq!(line.matches("the detail").count(), 1, "{line}");
        // The same through a sharded elector's error.
        let backend = BackendError::new(BackendErrorKind::PermissionDenied, "the detail")
            .with_source(std::io::Error::other("Status { }"));
        let sharded =
            tenure::shard::ShardError::Election(ElectionError::Lock(LockError::Backend(backend)));
        assert_eq!(chain(&sharded), "backend permission denied: the detail");
    }
}
