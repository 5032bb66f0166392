//! `FenceProxy`: one term's fenced Kubernetes API on loopback, for writers that are not Rust
//! (kubectl, Helm, client-go, the Python client, curl). Every request it forwards goes through
//! [`Fencer::client`] — the term's token as a user extra, writes held until the term's fence
//! is proven, refused once the term has ended — so a command gets the fence by pointing its
//! kubeconfig here, with no code change. Only a client that shows the term's secret is served.
//!
//! Why a proxy rather than a kubeconfig with `as`/`as-user-extra`: the Python client ignores
//! impersonation in a kubeconfig and kubectl before 1.35 cannot send a user extra, while every
//! client can talk to a URL. The proxy also refuses locally what the API
//! server would refuse anyway (writes of an ended term) and holds the first write until the
//! proof, which a kubeconfig cannot do.

use std::convert::Infallible;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::REFUSAL_PREFIX;
use super::client::Fencer;
use super::error::{Ended, FenceState, Gated};
use crate::election::{Leader, Term};
use crate::net::{Acceptor, Open, Slot, descriptor_share};

/// The largest request body the proxy forwards (the API server's own limit for an object is
/// 3 MiB; a bigger body is refused with 413 before anything is sent).
pub const MAX_REQUEST_BODY: usize = 16 * 1024 * 1024;

/// Where a term's secret goes in the URL: `http://127.0.0.1:PORT/term/<secret>`.
const PATH_PREFIX: &str = "/term/";

/// How long a client may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// The endpoints of a process hold at most this fraction of its open-file limit in
/// connections (a quarter: 256 of the usual 1,024). A connection being forwarded may hold a
/// second descriptor, to the API server; the rest is left to the elector, the command and
/// the probe endpoint (a sixteenth).
const DESCRIPTOR_SHARE: u64 = 4;

/// The most connections the endpoints of a process hold, whatever the open-file limit.
const MAX_CONNECTIONS: usize = 1024;

/// The connections of every endpoint of this process: one cap, since the terms of a sharded
/// run each have an endpoint and all draw on the same descriptors.
fn open_connections() -> Arc<Open> {
    static OPEN: OnceLock<Arc<Open>> = OnceLock::new();
    Arc::clone(OPEN.get_or_init(|| {
        let cap = descriptor_share(DESCRIPTOR_SHARE)
            .map_or(MAX_CONNECTIONS, |share| share.min(MAX_CONNECTIONS));
        Arc::new(Open::new(cap))
    }))
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// A loopback endpoint of the Kubernetes API for one term: requests under its
/// [`url`](Self::url) — which holds a per-term secret, `http://127.0.0.1:PORT/term/<secret>` —
/// are forwarded as the term's fenced requests (see [`Fencer::client`]); any other is refused
/// with 401. It serves until dropped or
/// [`stop`](Self::stop)ped; once the term has ended it answers every request with a refusal
/// that names tenure, the term's token and, when known, the current term's.
///
/// [`kubeconfig`](Self::kubeconfig) gives the file kubectl, Helm, client-go and the Python
/// client read; any other HTTP client sends its requests under [`url`](Self::url) (e.g.
/// `GET {url}/api/v1/namespaces/default/configmaps`). The secret is in the path, not in a
/// bearer token, because client-go (kubectl, Helm) never sends a token over plain HTTP.
/// Upgraded connections (exec, attach, port-forward) are refused.
///
/// # Connection cap
///
/// The endpoints of a process hold at most a quarter of its open-file limit
/// (`RLIMIT_NOFILE`; at most 1,024: [`connection_cap`](Self::connection_cap)) in connections
/// between them. At the cap a new connection closes the oldest one whose client has not shown
/// the secret (or, when every one has, the oldest): idle or slow strangers cannot take the
/// descriptors the elector, the command's writes or a probe endpoint need, nor push out a
/// request that is being forwarded. The connection of a request refused with 401 is closed
/// after the answer. If accepting fails (out of descriptors) the endpoint pauses, 10 ms
/// doubling up to 1 s, and warns at most every 10 s.
///
/// # Example
///
/// ```no_run
/// # async fn demo(fencer: tenure::fence::kube::Fencer, term: tenure::election::Term) -> std::io::Result<()> {
/// use tenure::fence::kube::FenceProxy;
///
/// let proxy = FenceProxy::start(&fencer, &term, None).await?;
/// std::fs::write("/run/me/kubeconfig", proxy.kubeconfig("default"))?;
/// // KUBECONFIG=/run/me/kubeconfig kubectl apply -f job.yaml   (fenced by the term's token)
/// # Ok(()) }
/// ```
pub struct FenceProxy {
    addr: SocketAddr,
    secret: Secret,
    stop: CancellationToken,
}

impl fmt::Debug for FenceProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FenceProxy")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// The per-term secret a client must show; never printed.
#[derive(Clone)]
struct Secret(Arc<str>);

impl Secret {
    fn new() -> std::io::Result<Self> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
        let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Self(text.into()))
    }

    /// The rest of `path` after `/term/<this secret>`, if it begins so (the secret compared
    /// as bytes, in constant time); `/` when nothing follows.
    fn strip<'p>(&self, path: &'p str) -> Option<&'p str> {
        let rest = path.strip_prefix(PATH_PREFIX)?;
        let want = self.0.as_bytes();
        let shown = rest.as_bytes().get(..want.len())?;
        let same = shown
            .iter()
            .zip(want)
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0;
        if !same {
            return None;
        }
        // The secret is ASCII, so after a match its end is a character boundary; `get`
        // rather than indexing all the same: a client's path never panics this.
        match rest.get(want.len()..)? {
            "" => Some("/"),
            after if after.starts_with('/') => Some(after),
            _ => None,
        }
    }
}

/// What every connection of one proxy shares.
struct Shared {
    client: kube::Client,
    term: Term,
    lease: String,
    secret: Secret,
    leader: Option<watch::Receiver<Option<Leader>>>,
}

impl FenceProxy {
    /// Starts the endpoint for `term` on `127.0.0.1` (a port the system chooses), forwarding
    /// through `fencer`'s client for the term. `leader` (an elector's
    /// [`leader`](crate::election::LeaderElector::leader) watch) lets a refusal after the
    /// term name the current holder and token.
    ///
    /// # Errors
    ///
    /// The loopback listener could not be bound, or no randomness for the secret.
    pub async fn start(
        fencer: &Fencer,
        term: &Term,
        leader: Option<watch::Receiver<Option<Leader>>>,
    ) -> std::io::Result<Self> {
        Self::start_under(fencer, term, leader, open_connections()).await
    }

    /// [`start`](Self::start) with its connections under `open`'s cap.
    async fn start_under(
        fencer: &Fencer,
        term: &Term,
        leader: Option<watch::Receiver<Option<Leader>>>,
        open: Arc<Open>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let secret = Secret::new()?;
        let stop = CancellationToken::new();
        let shared = Arc::new(Shared {
            client: fencer.client(term),
            term: term.clone(),
            lease: format!("{}/{}", fencer.lease_ns(), term.lease_name()),
            secret: secret.clone(),
            leader,
        });
        let acceptor = Acceptor::new(listener, open, "the fenced endpoint");
        tokio::spawn(serve(acceptor, shared, stop.clone()));
        Ok(Self { addr, secret, stop })
    }

    /// The endpoint's URL with the term's secret, `http://127.0.0.1:PORT/term/<secret>`: the
    /// API's paths go after it. Keep it from other users: whoever has it writes as this term.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}{PATH_PREFIX}{}", self.addr, self.secret.0)
    }

    /// How many connections the endpoints of this process hold open between them: a quarter
    /// of its open-file limit (`RLIMIT_NOFILE`), at most 1,024 — read once, when the first
    /// endpoint starts (or this is first called). See [the cap](Self#connection-cap).
    #[must_use]
    pub fn connection_cap() -> usize {
        open_connections().cap()
    }

    /// The address the endpoint listens on.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kubeconfig (YAML) whose only context reaches this endpoint's [`url`](Self::url), with
    /// `namespace` as the default namespace: for kubectl, Helm, client-go and the Python
    /// client.
    #[must_use]
    pub fn kubeconfig(&self, namespace: &str) -> String {
        // The URL is plain (digits, dots, a hex secret); the namespace is quoted as a JSON
        // string, which YAML reads as the same string. No credentials: the URL is the secret.
        let namespace = serde_json::to_string(namespace).unwrap_or_else(|_| "\"\"".into());
        format!(
            "# tenure: the Kubernetes API for one term, fenced by its token; replaced each term.\n\
             apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: tenure\n  cluster:\n    server: {url}\n\
             users:\n\
             - name: tenure\n  user: {{}}\n\
             contexts:\n\
             - name: tenure\n  context:\n    cluster: tenure\n    user: tenure\n    namespace: {namespace}\n\
             current-context: tenure\n",
            url = self.url(),
        )
    }

    /// Stops serving: the listener closes and every open connection (watches too) ends.
    pub fn stop(self) {}
}

impl Drop for FenceProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn serve(mut acceptor: Acceptor, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let (stream, slot) = tokio::select! {
            () = stop.cancelled() => return,
            admitted = acceptor.accept() => admitted,
        };
        let _ = stream.set_nodelay(true);
        let shared = Arc::clone(&shared);
        let stop = stop.clone();
        tokio::spawn(async move {
            let slot = Arc::new(slot);
            let service = service_fn({
                let slot = Arc::clone(&slot);
                move |request| {
                    let shared = Arc::clone(&shared);
                    let slot = Arc::clone(&slot);
                    async move { Ok::<_, Infallible>(forward(&shared, &slot, request).await) }
                }
            });
            // Half-close: `nc` and other simple clients shut their write side once the request
            // is sent; hyper would otherwise drop the connection before it answers.
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .half_close(true)
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                () = stop.cancelled() => {}
                () = slot.evicted() => {
                    tracing::debug!("fenced endpoint: a connection closed, the oldest at the connection cap");
                }
            }
            // The socket is closed (with the service's copy of `slot`); the last copy goes
            // here and frees the connection's place.
            drop(slot);
        });
    }
}

/// Headers that belong to one connection, or that the proxy sets itself: never forwarded.
fn forwarded(name: &HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "host"
            | "authorization"
            | "connection"
            | "keep-alive"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
    ) && !name.as_str().starts_with("impersonate-")
}

async fn forward(shared: &Shared, slot: &Slot, request: Request<Incoming>) -> Response<ProxyBody> {
    let Some(path) = shared.secret.strip(request.uri().path()) else {
        return unauthorized();
    };
    slot.vouch();
    let path = path.to_owned();
    if !shared.term.is_valid() {
        return ended(shared);
    }
    if request.headers().contains_key(header::UPGRADE) {
        return status(
            StatusCode::NOT_IMPLEMENTED,
            "NotImplemented",
            "tenure: the fenced endpoint does not carry upgraded connections (exec, attach, port-forward)".into(),
        );
    }
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, MAX_REQUEST_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            let too_large = e.is::<http_body_util::LengthLimitError>();
            return if too_large {
                status(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "RequestEntityTooLarge",
                    format!("tenure: request body over {MAX_REQUEST_BODY} bytes"),
                )
            } else {
                status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("tenure: cannot read the request body: {e}"),
                )
            };
        }
    };
    let uri = match parts.uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    let mut upstream = Request::builder().method(parts.method).uri(uri);
    if let Some(headers) = upstream.headers_mut() {
        copy_headers(&parts.headers, headers);
    }
    let Ok(upstream) = upstream.body(kube::client::Body::from(body)) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "tenure: the request's target is not a valid URI path".into(),
        );
    };
    match shared.client.send(upstream).await {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            let mut out = Response::new(body.map_err(|e| Box::new(e) as BoxError).boxed_unsync());
            *out.status_mut() = parts.status;
            copy_headers(&parts.headers, out.headers_mut());
            out
        }
        Err(kube::Error::Service(e)) if e.is::<Ended>() => ended(shared),
        Err(kube::Error::Service(e)) if e.is::<Gated>() => match e.downcast::<Gated>() {
            Ok(gated) => gated_status(shared, &gated),
            Err(e) => bad_gateway(&e.to_string()),
        },
        Err(e) => bad_gateway(&e.to_string()),
    }
}

fn copy_headers(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if forwarded(name) {
            to.append(name, value.clone());
        }
    }
}

/// The refusal after the term: names tenure, the term's token and the current one if known.
fn ended(shared: &Shared) -> Response<ProxyBody> {
    let ours = shared.term.fencing_token();
    let current = shared
        .leader
        .as_ref()
        .and_then(|l| l.borrow().clone())
        .filter(|l| l.fencing.is_some_and(|f| f > ours))
        .map_or_else(
            || "a newer term may hold the lease".to_owned(),
            |l| {
                format!(
                    "current token {} held by {}",
                    l.fencing.map_or(0, |f| f.get()),
                    l.identity
                )
            },
        );
    status(
        StatusCode::FORBIDDEN,
        "Forbidden",
        format!(
            "{REFUSAL_PREFIX} lease {}: stale: token {ours}, term ended ({current}); this command's term is over, so its requests are refused",
            shared.lease
        ),
    )
}

fn gated_status(shared: &Shared, gated: &Gated) -> Response<ProxyBody> {
    let ours = shared.term.fencing_token();
    match &gated.state {
        FenceState::Superseded { current } => status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "{REFUSAL_PREFIX} lease {}: stale: token {ours} < current {current}",
                gated.lease
            ),
        ),
        FenceState::Unenforced { cause } => status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            format!(
                "tenure: the fence on lease {} is not enforced, so this write was not sent (it would not be fenced): {cause}",
                gated.lease
            ),
        ),
        FenceState::Proving | FenceState::Enforced => status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            format!(
                "tenure: the fence proof of lease {} did not finish; write not sent",
                gated.lease
            ),
        ),
    }
}

/// The answer to a client without the term's secret: names nothing of the term (a stranger
/// learns no lease), and the connection is closed after it: a stranger's connection carries
/// one request at most.
fn unauthorized() -> Response<ProxyBody> {
    let mut response = status(
        StatusCode::UNAUTHORIZED,
        "Unauthorized",
        "tenure: this endpoint serves a term's requests under its secret URL ($TENURE_KUBE_SERVER, the server in $KUBECONFIG); a past term's URL is refused".into(),
    );
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

fn bad_gateway(error: &str) -> Response<ProxyBody> {
    status(
        StatusCode::BAD_GATEWAY,
        "ServiceUnavailable",
        format!("tenure: the API server could not be reached: {error}"),
    )
}

/// A Kubernetes `Status` answer, which kubectl and the client libraries print as the error.
fn status(code: StatusCode, reason: &str, message: String) -> Response<ProxyBody> {
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    let mut response = Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_under_the_exact_secret_are_served() {
        let secret = Secret("abc123".into());
        assert_eq!(
            secret.strip("/term/abc123/api/v1/pods"),
            Some("/api/v1/pods")
        );
        assert_eq!(secret.strip("/term/abc123"), Some("/"));
        assert_eq!(secret.strip("/term/abc123/"), Some("/"));
        for wrong in [
            "/term/abc12/api",
            "/term/abc1234/api",
            "/term/abd123/api",
            "/term/ABC123/api",
            // Two wrong bytes whose differences would cancel out under XOR.
            "/term/bac123/api",
            "/api/v1/pods",
            "/term/",
            "/x/term/abc123/api",
        ] {
            assert_eq!(secret.strip(wrong), None, "{wrong}");
        }
    }

    /// A multi-byte character where the secret would end: refused, not a panic (the probe's
    /// `/term/<63 × a>é/…` against a 64-byte secret).
    #[test]
    fn a_path_that_splits_a_character_at_the_secrets_end_is_refused() {
        let secret = Secret("abc123".into());
        for path in [
            "/term/abc12é/api",
            "/term/abc12é",
            "/term/ab€/api",
            "/term/é",
        ] {
            assert_eq!(secret.strip(path), None, "{path}");
        }
        let secret = Secret::new().expect("randomness");
        let path = format!("/term/{}é/api/v1/pods", "a".repeat(secret.0.len() - 1));
        assert_eq!(secret.strip(&path), None);
        assert_eq!(
            secret.strip(&format!("/term/{}/é", secret.0)),
            Some("/é"),
            "after the secret, any character is the API's business"
        );
    }

    /// One request on a fresh connection: (status code, body). With `half_close` the client
    /// shuts its write side once the request is sent, as `nc` does.
    async fn exchange(addr: SocketAddr, request: &str, half_close: bool) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.write_all(request.as_bytes()).await.expect("send");
        if half_close {
            stream.shutdown().await.expect("half-close");
        }
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.expect("read");
        let code = answer
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (code, body.to_owned())
    }

    async fn call(addr: SocketAddr, request: &str) -> (u16, String) {
        exchange(addr, request, false).await
    }

    /// A client for a server that is not there (nothing listens on port 9): a forwarded
    /// request fails as unreachable.
    fn unreachable_client() -> kube::Client {
        kube::Client::try_from(kube::Config::new(
            "http://127.0.0.1:9".parse().expect("a URI"),
        ))
        .expect("a client")
    }

    fn get(path: &str, extra: &str) -> String {
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n")
    }

    #[tokio::test]
    async fn strangers_upgrades_big_bodies_and_an_ended_term_get_a_status_naming_tenure() {
        let held = crate::election::TestTerm::begin("jobs", "me")
            .await
            .expect("a term");
        let term = held.term();
        let fencer = Fencer::without_policy(unreachable_client()).lease_namespace("ops");
        let next = Leader {
            identity: "next".into(),
            fencing: Some(crate::FencingToken::new(term.fencing_token().get() + 1)),
        };
        let (tell, leader) = watch::channel(Some(next.clone()));
        let proxy = FenceProxy::start(&fencer, &term, Some(leader))
            .await
            .expect("bound");
        let addr = proxy.local_addr();
        let base = proxy.url();
        let prefix = &base[base.find("/term/").expect("secret path")..];
        assert!(
            proxy
                .kubeconfig("ops")
                .contains(&format!("server: {base}\n"))
        );
        assert!(proxy.kubeconfig("ops").contains("namespace: \"ops\""));
        let shown = format!("{proxy:?}");
        assert!(
            shown.contains("FenceProxy") && shown.contains(&addr.to_string()),
            "{shown}"
        );
        assert!(!shown.contains(&prefix[6..]), "the secret is not in Debug");

        let (code, body) = call(addr, &get("/term/not-the-secret/api", "")).await;
        assert_eq!(code, 401, "{body}");
        assert!(
            body.contains("\"kind\":\"Status\"") && body.contains("tenure"),
            "{body}"
        );
        assert!(
            !body.contains("jobs") && !body.contains("ops"),
            "a stranger learns no lease: {body}"
        );
        // A character split where the secret ends: 401, and the endpoint is still up.
        let split = format!(
            "/term/{}é/api",
            "a".repeat(prefix.len() - "/term/".len() - 1)
        );
        let (code, body) = call(addr, &get(&split, "")).await;
        assert_eq!(code, 401, "{body}");

        let (code, body) = call(
            addr,
            &get(
                &format!("{prefix}/api/v1/namespaces/ops/pods/p/exec"),
                "Upgrade: SPDY/3.1\r\n",
            ),
        )
        .await;
        assert_eq!(code, 501, "{body}");

        let big = format!(
            "POST {prefix}/api/v1/namespaces/ops/configmaps HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{}",
            MAX_REQUEST_BODY + 1,
            "x".repeat(MAX_REQUEST_BODY + 1)
        );
        let (code, body) = call(addr, &big).await;
        assert_eq!(code, 413, "{body}");
        // Bigger than any object the API server takes (3 MiB), under the bound: forwarded.
        let fits = 4 * 1024 * 1024;
        let (code, body) = call(
            addr,
            &format!(
                "POST {prefix}/api/v1/namespaces/ops/configmaps HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {fits}\r\n\r\n{}",
                "x".repeat(fits)
            ),
        )
        .await;
        assert_eq!(code, 502, "{body}");

        let (code, body) = call(addr, &get(&format!("{prefix}/api"), "")).await;
        assert_eq!(code, 502, "the term's own URL is forwarded: {body}");
        let http10 = format!(
            "POST {prefix}/api/v1/namespaces/ops/configmaps HTTP/1.0\r\nHost: x\r\nContent-Length: 2\r\n\r\n{{}}"
        );
        let (code, answer) = exchange(addr, &http10, true).await;
        assert_eq!(
            code, 502,
            "a client that half-closes (nc) is answered: {answer:?}"
        );
        assert!(body.contains("could not be reached"), "{body}");

        let ours = term.fencing_token().get();
        held.end().await.expect("ended");
        // The holder last seen is this very term: no newer one to name.
        tell.send_replace(Some(Leader {
            identity: "me".into(),
            fencing: Some(term.fencing_token()),
        }));
        let (code, body) = call(addr, &get(&format!("{prefix}/api"), "")).await;
        assert_eq!(code, 403, "{body}");
        assert!(body.contains("a newer term may hold the lease"), "{body}");
        tell.send_replace(Some(next));
        let (code, body) = call(addr, &get(&format!("{prefix}/api"), "")).await;
        assert_eq!(code, 403, "{body}");
        assert!(
            body.contains(&format!(
                "tenure fencing: lease ops/jobs: stale: token {ours}, term ended (current token {} held by next)",
                ours + 1
            )),
            "{body}"
        );

        proxy.stop();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "a stopped endpoint accepts nothing"
        );
    }

    /// A fencer that carries a token (impersonating) cannot prove its fence on a server that
    /// does not answer: writes are not sent and get 503 with the cause; reads go.
    #[tokio::test]
    async fn a_write_whose_fence_is_not_proven_gets_503_and_reads_still_go() {
        let held = crate::election::TestTerm::begin("jobs", "me")
            .await
            .expect("a term");
        let fencer =
            Fencer::impersonating(unreachable_client(), "system:serviceaccount:ops:w", &[])
                .expect("valid user")
                .lease_namespace("ops");
        let proxy = FenceProxy::start(&fencer, &held.term(), None)
            .await
            .expect("bound");
        let base = proxy.url();
        let prefix = &base[base.find("/term/").expect("secret path")..];
        let post = format!(
            "POST {prefix}/api/v1/namespaces/ops/configmaps HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
        );
        let (code, body) = call(proxy.local_addr(), &post).await;
        assert_eq!(code, 503, "{body}");
        assert!(
            body.contains("tenure: the fence on lease ops/jobs is not enforced"),
            "{body}"
        );
        let (code, body) = call(proxy.local_addr(), &get(&format!("{prefix}/api"), "")).await;
        assert_eq!(code, 502, "a read is not held: {body}");
        held.end().await.expect("ended");
    }

    /// Reads from `stream` until the server closes it (within 10 s).
    async fn read_until_closed(stream: &mut tokio::net::TcpStream) -> String {
        use tokio::io::AsyncReadExt;
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
            .await
            .expect("the endpoint closed the connection")
            .expect("read");
        String::from_utf8_lossy(&answer).into_owned()
    }

    /// A stranger's keep-alive connection gets one 401 and is closed: the request pipelined
    /// after it is never answered.
    #[tokio::test]
    async fn a_connection_is_closed_after_its_401() {
        use tokio::io::AsyncWriteExt;
        let held = crate::election::TestTerm::begin("jobs", "me")
            .await
            .expect("a term");
        let fencer = Fencer::without_policy(unreachable_client()).lease_namespace("ops");
        let proxy = FenceProxy::start(&fencer, &held.term(), None)
            .await
            .expect("bound");
        let mut stream = tokio::net::TcpStream::connect(proxy.local_addr())
            .await
            .expect("connect");
        let request = "GET /term/wrong/api HTTP/1.1\r\nHost: x\r\n\r\n";
        stream
            .write_all(format!("{request}{request}").as_bytes())
            .await
            .expect("send");
        let answer = read_until_closed(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 401 "), "{answer}");
        assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{answer}");
        assert!(answer.contains("connection: close"), "{answer}");
        held.end().await.expect("ended");
    }

    /// More idle strangers than the cap: the oldest are closed as newer ones come, a client
    /// with the secret is served, and its connection outlives the strangers that follow it.
    #[tokio::test]
    async fn idle_strangers_above_the_cap_are_closed_oldest_first() {
        use tokio::io::AsyncWriteExt;
        const CAP: usize = 4;
        let held = crate::election::TestTerm::begin("jobs", "me")
            .await
            .expect("a term");
        let fencer = Fencer::without_policy(unreachable_client()).lease_namespace("ops");
        let proxy = FenceProxy::start_under(&fencer, &held.term(), None, Arc::new(Open::new(CAP)))
            .await
            .expect("bound");
        let addr = proxy.local_addr();
        let base = proxy.url();
        let prefix = &base[base.find("/term/").expect("secret path")..];
        let connect = || async { tokio::net::TcpStream::connect(addr).await.expect("connect") };
        let mut idle = Vec::new();
        for _ in 0..3 * CAP {
            idle.push(connect().await);
        }
        // The first 2 × CAP were closed to make room for the last CAP.
        for stream in &mut idle[..2 * CAP] {
            assert_eq!(
                read_until_closed(stream).await,
                "",
                "closed without an answer"
            );
        }
        let (code, body) = call(addr, &get(&format!("{prefix}/api"), "")).await;
        assert_eq!(code, 502, "served beside a full cap of strangers: {body}");

        // A client that showed the secret keeps its keep-alive connection while strangers
        // come and go; the strangers close each other.
        let mut client = connect().await;
        let request = format!("GET {prefix}/api HTTP/1.1\r\nHost: x\r\n\r\n");
        client.write_all(request.as_bytes()).await.expect("send");
        // Answered: the secret was seen before any stranger below connects.
        let mut first = Vec::new();
        while !String::from_utf8_lossy(&first).ends_with("\"status\":\"Failure\"}") {
            let mut chunk = [0u8; 4096];
            let n = tokio::io::AsyncReadExt::read(&mut client, &mut chunk)
                .await
                .expect("read");
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&first));
            first.extend_from_slice(&chunk[..n]);
        }
        let mut strangers = Vec::new();
        for _ in 0..2 * CAP {
            strangers.push(connect().await);
        }
        client
            .write_all(
                format!("GET {prefix}/api HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .expect("send");
        let answer = read_until_closed(&mut client).await;
        assert!(
            answer.starts_with("HTTP/1.1 502 "),
            "the second request answered on the kept connection: {answer}"
        );
        held.end().await.expect("ended");
    }

    /// A quarter of the soft limit the kernel shows for this process, at most 1,024.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_cap_is_a_quarter_of_the_open_file_limit_up_to_1024() {
        let limits = std::fs::read_to_string("/proc/self/limits").expect("/proc/self/limits");
        let soft: usize = limits
            .lines()
            .find_map(|l| l.strip_prefix("Max open files"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .expect("a finite soft limit on open files");
        assert_eq!(FenceProxy::connection_cap(), (soft / 4).clamp(1, 1024));
    }

    #[test]
    fn connection_and_identity_headers_are_not_forwarded() {
        for dropped in [
            "host",
            "authorization",
            "impersonate-user",
            "impersonate-extra-x",
            "connection",
            "upgrade",
            "content-length",
        ] {
            assert!(!forwarded(&HeaderName::from_static(dropped)), "{dropped}");
        }
        for kept in ["content-type", "accept", "user-agent", "accept-encoding"] {
            assert!(forwarded(&HeaderName::from_static(kept)), "{kept}");
        }
    }
}
