//! Maps the redis crate's errors and the servers' error replies into [`BackendError`] kinds,
//! with credentials scrubbed from every message.

use std::sync::Arc;

use super::server::ConnError;
use crate::backend::{BackendError, BackendErrorKind, InvalidName};

/// Scrubs a secret (the password) from text that is about to become an error message or a
/// log line. Defence in depth: the messages built here never format the connection info.
#[derive(Clone, Default)]
pub(crate) struct Scrubber {
    secret: Option<Arc<str>>,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scrubber")
    }
}

impl Scrubber {
    pub(crate) fn new(secret: Option<&str>) -> Self {
        Self {
            secret: secret.filter(|s| !s.is_empty()).map(Arc::from),
        }
    }

    pub(crate) fn scrub(&self, text: String) -> String {
        match &self.secret {
            Some(s) if text.contains(&**s) => text.replace(&**s, "<redacted>"),
            _ => text,
        }
    }
}

/// The kind of a server error reply, from its code (the first word).
pub(crate) fn kind_of_code(code: &str) -> Option<BackendErrorKind> {
    Some(match code {
        "NOAUTH" | "WRONGPASS" => BackendErrorKind::Unauthenticated,
        "NOPERM" => BackendErrorKind::PermissionDenied,
        // The server is there but cannot serve right now; retrying can succeed.
        "LOADING" | "BUSY" | "MASTERDOWN" | "READONLY" | "TRYAGAIN" | "CLUSTERDOWN" | "OOM"
        | "MISCONF" => BackendErrorKind::Unavailable,
        _ => return None,
    })
}

/// Errors whose code is a generic `ERR` but whose text says what happened: Redis 7.0 reports a
/// command an ACL user may not run *inside a script* as "ERR The user executing the script
/// can't run this command or subcommand".
fn kind_of_text(text: &str) -> Option<BackendErrorKind> {
    let t = text.to_ascii_lowercase();
    (t.contains("noperm")
        || t.contains("no permissions to")
        || t.contains("can't run this command"))
    .then_some(BackendErrorKind::PermissionDenied)
}

/// An error reply returned inside a script's answer (`{-1, "CODE message"}`).
pub(crate) fn from_reply(message: &str, what: &str, scrub: &Scrubber) -> BackendError {
    let code = message.split_whitespace().next().unwrap_or("");
    let kind = kind_of_code(code)
        .or_else(|| kind_of_text(message))
        .unwrap_or(BackendErrorKind::Protocol);
    BackendError::new(kind, scrub.scrub(format!("redis {what}: {message}")))
}

/// Maps a failed call on a connection, naming the operation that failed. A refused reply (too
/// big, or malformed) is a protocol error: the server is broken or hostile, and retrying will
/// not help.
pub(crate) fn from_conn(err: &ConnError, what: &str, scrub: &Scrubber) -> BackendError {
    match err {
        ConnError::Redis(e) => from_redis(e, what, scrub),
        ConnError::Refused(why) => BackendError::new(
            BackendErrorKind::Protocol,
            scrub.scrub(format!("redis {what}: {why}")),
        ),
    }
}

/// Maps a redis crate error, naming the operation that failed.
pub(crate) fn from_redis(err: &::redis::RedisError, what: &str, scrub: &Scrubber) -> BackendError {
    use ::redis::{ErrorKind as K, ServerErrorKind as S};
    let text = err.to_string();
    let kind = match err.code().and_then(kind_of_code).or_else(|| {
        matches!(err.kind(), K::Server(_) | K::Extension)
            .then(|| kind_of_text(&text))
            .flatten()
    }) {
        Some(kind) => kind,
        None => match err.kind() {
            K::AuthenticationFailed => BackendErrorKind::Unauthenticated,
            K::Server(S::NoPerm) => BackendErrorKind::PermissionDenied,
            K::Io if err.is_timeout() => BackendErrorKind::Timeout,
            // A certificate the configured CA does not vouch for will not start to verify by
            // itself: a configuration problem, not an outage.
            K::Io if is_certificate_failure(&text) => BackendErrorKind::Config,
            K::Io | K::ClusterConnectionNotFound => BackendErrorKind::Unavailable,
            K::Server(S::BusyLoading | S::TryAgain | S::ClusterDown | S::MasterDown)
            | K::Server(S::ReadOnly) => BackendErrorKind::Unavailable,
            K::InvalidClientConfig => BackendErrorKind::Config,
            _ => BackendErrorKind::Protocol,
        },
    };
    let message = match kind {
        BackendErrorKind::Unauthenticated => format!(
            "redis {what}: the server refused the credentials (check the ACL user name and password): {text}"
        ),
        BackendErrorKind::PermissionDenied => format!(
            "redis {what}: the ACL user lacks a permission (it needs the lock's keys and channel under the key prefix, and EVALSHA, SCRIPT LOAD, SUBSCRIBE and the commands the scripts call): {text}"
        ),
        BackendErrorKind::Config if is_certificate_failure(&text) => format!(
            "redis {what}: the server's TLS certificate was not accepted (check the CA certificate and the host name): {text}"
        ),
        _ => format!("redis {what}: {text}"),
    };
    BackendError::new(kind, scrub.scrub(message))
}

fn is_certificate_failure(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    t.contains("certificate") || t.contains("unknownissuer")
}

/// A [`BackendErrorKind::Config`] error: an option or a name the backend refuses.
pub(crate) fn config_error(message: impl Into<String>) -> BackendError {
    BackendError::new(BackendErrorKind::Config, message)
}

/// A name the key layout refuses, as a [`BackendErrorKind::Config`] error.
pub(crate) fn name_error(e: InvalidName) -> BackendError {
    config_error(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_kinds() {
        let s = Scrubber::default();
        let k = |m: &str| from_reply(m, "acquire", &s).kind();
        assert_eq!(
            k("NOPERM no permissions"),
            BackendErrorKind::PermissionDenied
        );
        assert_eq!(k("WRONGPASS invalid"), BackendErrorKind::Unauthenticated);
        assert_eq!(
            k("NOAUTH Authentication required."),
            BackendErrorKind::Unauthenticated
        );
        assert_eq!(k("LOADING dataset"), BackendErrorKind::Unavailable);
        assert_eq!(k("WRONGTYPE Operation"), BackendErrorKind::Protocol);
        assert_eq!(
            k("ERR The user executing the script can't run this command or subcommand script: x"),
            BackendErrorKind::PermissionDenied
        );
    }

    #[test]
    fn scrubber_removes_the_secret() {
        let s = Scrubber::new(Some("hunter2"));
        assert_eq!(
            s.scrub("auth hunter2 failed".into()),
            "auth <redacted> failed"
        );
        assert_eq!(Scrubber::new(Some("")).scrub("x".into()), "x");
    }
}
