//! Maps the Kubernetes client's errors into [`BackendError`] kinds, naming the verb and resource.

use crate::backend::{BackendError, BackendErrorKind};
use crate::util::error_chain;

/// A Kubernetes resource: its plural name and API group.
#[derive(Clone, Copy, Debug)]
pub struct Resource {
    pub plural: &'static str,
    /// `""` for the core group.
    pub group: &'static str,
    pub version: &'static str,
}

/// `coordination.k8s.io/v1` leases.
pub const LEASES: Resource = Resource {
    plural: "leases",
    group: "coordination.k8s.io",
    version: "v1",
};
/// `authorization.k8s.io/v1` selfsubjectaccessreviews (the permission check at start).
pub const REVIEWS: Resource = Resource {
    plural: "selfsubjectaccessreviews",
    group: "authorization.k8s.io",
    version: "v1",
};
/// Core `v1` events.
pub const EVENTS: Resource = Resource {
    plural: "events",
    group: "",
    version: "v1",
};

/// What was being done when a request failed, for the message: `("update", "default/my-lock")`.
#[derive(Clone, Copy, Debug)]
pub struct Op<'a> {
    /// The Kubernetes verb (get, create, update, list, watch).
    pub verb: &'static str,
    /// What kind of object.
    pub resource: Resource,
    /// The namespace of the Lease.
    pub namespace: &'a str,
    /// The Lease's name.
    pub name: &'a str,
}

impl std::fmt::Display for Op<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self.resource;
        let gv = if r.group.is_empty() {
            r.version.to_owned()
        } else {
            format!("{}/{}", r.group, r.version)
        };
        write!(
            f,
            "{} {} {}/{} ({gv})",
            self.verb, r.plural, self.namespace, self.name
        )
    }
}

/// Whether `e` (or something it wraps) is a timeout.
fn is_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            return true;
        }
        let text = err.to_string();
        if text.contains("timed out") || text.contains("deadline has elapsed") {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Maps `e`, hit while doing `op`, to a [`BackendError`].
pub fn map(e: kube::Error, op: Op<'_>) -> BackendError {
    let (kind, message) = match &e {
        kube::Error::Api(status) => {
            let detail = if status.message.is_empty() {
                status.reason.clone()
            } else {
                status.message.clone()
            };
            match status.code {
                401 => (
                    BackendErrorKind::Unauthenticated,
                    format!("{op}: the API server rejected the credentials (401): {detail}"),
                ),
                403 => (
                    BackendErrorKind::PermissionDenied,
                    format!(
                        "{op}: forbidden (403): the user may not \"{verb}\" \"{plural}\" in API \
                         group \"{group}\" in namespace \"{ns}\"; grant it with a Role (tenure \
                         needs get, list, watch, create, update on leases — a sharded group \
                         patch and delete too — and create on events): {detail}",
                        verb = op.verb,
                        plural = op.resource.plural,
                        group = op.resource.group,
                        ns = op.namespace,
                    ),
                ),
                404 => (
                    BackendErrorKind::Config,
                    format!(
                        "{op}: not found (404); does namespace {:?} exist? {detail}",
                        op.namespace
                    ),
                ),
                408 | 504 => (
                    BackendErrorKind::Timeout,
                    format!("{op}: the API server timed out ({}): {detail}", status.code),
                ),
                409 | 429 | 500 | 502 | 503 => (
                    BackendErrorKind::Unavailable,
                    format!(
                        "{op}: the API server is unavailable ({}): {detail}",
                        status.code
                    ),
                ),
                code => (
                    BackendErrorKind::Protocol,
                    format!("{op}: unexpected answer ({code}): {detail}"),
                ),
            }
        }
        kube::Error::Auth(_) => (
            BackendErrorKind::Unauthenticated,
            format!("{op}: could not obtain credentials: {e}"),
        ),
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            if is_timeout(&e) {
                (BackendErrorKind::Timeout, format!("{op}: timed out: {e}"))
            } else {
                (
                    BackendErrorKind::Unavailable,
                    format!("{op}: cannot reach the API server: {}", error_chain(&e)),
                )
            }
        }
        kube::Error::InferConfig(_)
        | kube::Error::InferKubeconfig(_)
        | kube::Error::RustlsTls(_)
        | kube::Error::TlsRequired
        | kube::Error::ProxyProtocolUnsupported { .. }
        | kube::Error::ProxyProtocolDisabled { .. } => (
            BackendErrorKind::Config,
            format!("{op}: client misconfigured: {e}"),
        ),
        _ => (
            BackendErrorKind::Protocol,
            format!("{op}: unexpected answer: {e}"),
        ),
    };
    BackendError::new(kind, message).with_source(e)
}

/// A configuration error (kubeconfig unreadable, no cluster found).
pub fn config(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> BackendError {
    let message = format!("{what}: {}", error_chain(&e));
    BackendError::new(BackendErrorKind::Config, message).with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, "Reason")
                .with_code(code)
                .boxed(),
        )
    }

    const OP: Op<'static> = Op {
        verb: "update",
        resource: LEASES,
        namespace: "team-a",
        name: "my-lock",
    };

    #[test]
    fn statuses_map_to_kinds() {
        for (code, kind) in [
            (401, BackendErrorKind::Unauthenticated),
            (403, BackendErrorKind::PermissionDenied),
            (404, BackendErrorKind::Config),
            (408, BackendErrorKind::Timeout),
            (504, BackendErrorKind::Timeout),
            (429, BackendErrorKind::Unavailable),
            (503, BackendErrorKind::Unavailable),
            (422, BackendErrorKind::Protocol),
        ] {
            assert_eq!(map(api(code, "m"), OP).kind(), kind, "{code}");
        }
    }

    #[test]
    fn permission_errors_name_verb_resource_and_namespace() {
        let e = map(api(403, "leases is forbidden"), OP);
        let m = e.message();
        assert!(m.contains("\"update\""), "{m}");
        assert!(m.contains("\"leases\""), "{m}");
        assert!(m.contains("team-a"), "{m}");
        assert!(m.contains("leases is forbidden"), "{m}");
    }
}
