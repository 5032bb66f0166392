//! The service under a fenced client: it impersonates the client's own identity with the
//! term's token as a user extra, holds writes until the term's fence is proven, and refuses
//! writes once the term has ended.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response};
use kube::client::Body;

use super::error::{Ended, FenceError, FenceState, Gated};
use super::proof::Proof;
use crate::election::Term;

/// `Impersonate-Extra-tenure.dev%2ffencing-token` (the key percent-encoded, as the header
/// name rules require).
pub(super) fn extra_header() -> HeaderName {
    HeaderName::from_static("impersonate-extra-tenure.dev%2ffencing-token")
}

/// `Impersonate-Extra-tenure.dev%2ffencing-election`: the election the request names.
pub(super) fn election_header() -> HeaderName {
    HeaderName::from_static("impersonate-extra-tenure.dev%2ffencing-election")
}

/// The headers that impersonate `user` (with `groups`) exactly: a ServiceAccount's groups
/// follow from its name, so only the user is sent; anyone else's groups are sent too
/// (`system:authenticated` is added by the server).
pub(super) fn impersonation_headers(
    user: &str,
    groups: &[String],
) -> Result<HeaderMap, FenceError> {
    let value = |v: &str| {
        HeaderValue::from_str(v).map_err(|_| FenceError::Forbidden {
            message: format!("cannot impersonate {v:?}: not a valid header value"),
        })
    };
    let mut headers = HeaderMap::new();
    headers.insert("impersonate-user", value(user)?);
    if !user.starts_with("system:serviceaccount:") {
        for group in groups.iter().filter(|g| *g != "system:authenticated") {
            headers.append("impersonate-group", value(group)?);
        }
    }
    Ok(headers)
}

/// A term's writes wait for its fence proof.
#[derive(Clone)]
pub(super) struct Gate {
    pub(super) proof: Arc<Proof>,
    pub(super) warn_only: bool,
}

impl Gate {
    /// `Ok` when a write may go.
    async fn pass(&self) -> Result<(), Gated> {
        match self.proof.settled().await {
            FenceState::Enforced => Ok(()),
            FenceState::Unenforced { cause } if self.warn_only => {
                tracing::error!(
                    lease = %self.proof.lease(),
                    "fenced write sent although the fence is not enforced (warn-only): {cause}"
                );
                Ok(())
            }
            state => Err(Gated {
                lease: self.proof.lease().to_owned(),
                state,
            }),
        }
    }
}

/// The service under a term's client: adds the headers, holds writes until the fence is
/// proven, refuses writes after the term.
#[derive(Clone)]
pub(super) struct Stamped {
    pub(super) inner: kube::Client,
    pub(super) headers: Arc<HeaderMap>,
    /// `None`: no local check (a token handed over without its term).
    pub(super) term: Option<Term>,
    /// `None`: no proof (no request token, or the proof's own probes).
    pub(super) gate: Option<Gate>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<Request<Body>> for Stamped {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        let write = !matches!(
            *request.method(),
            Method::GET | Method::HEAD | Method::OPTIONS
        );
        for (name, value) in self.headers.iter() {
            request.headers_mut().append(name, value.clone());
        }
        let inner = self.inner.clone();
        let term = self.term.clone();
        let gate = self.gate.clone().filter(|_| write);
        Box::pin(async move {
            if let Some(gate) = gate {
                gate.pass().await.map_err(|e| Box::new(e) as BoxError)?;
            }
            // Checked at the last moment before sending: a term that ended while the caller
            // prepared the write (or while it waited for the proof) sends nothing.
            if write && term.as_ref().is_some_and(|t| !t.is_valid()) {
                return Err(Box::new(Ended) as BoxError);
            }
            inner.send(request).await.map_err(BoxError::from)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_account_impersonates_only_its_user() {
        let h = impersonation_headers(
            "system:serviceaccount:ns:sa",
            &[
                "system:serviceaccounts".into(),
                "system:authenticated".into(),
            ],
        )
        .expect("valid");
        assert_eq!(h.get_all("impersonate-group").iter().count(), 0);
        let h = impersonation_headers("alice", &["devs".into(), "system:authenticated".into()])
            .expect("valid");
        let groups: Vec<_> = h.get_all("impersonate-group").iter().collect();
        assert_eq!(groups, vec!["devs"]);
        assert!(impersonation_headers("bad\nname", &[]).is_err());
    }
}
