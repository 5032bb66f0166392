//! TLS for `rediss://`, done by tenure instead of the redis crate, so that the decrypted stream
//! can be wrapped in [`Limited`](super::limit::Limited) like a plain one.
//!
//! The trust decisions are the redis crate's (with its features `tls-rustls` and
//! `tokio-rustls-comp`, and without `tls-rustls-webpki-roots`): the server's certificate chain
//! must lead to the private CA given with
//! [`ca_certificate_pem`](super::RedisConfig::ca_certificate_pem), or else to a root of the
//! system's store (read with `rustls-native-certs`, failing if the store cannot be read); the
//! certificate must name the URL's host (a DNS name, or an IP address in its subject
//! alternative names), always; no client certificate is sent. The difference: the redis crate
//! reads the system's store at every connection, tenure once, when the backend connects.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

/// What a connection needs to set up TLS to the server: the client configuration (trust roots,
/// protocol versions) and the name the server's certificate must carry.
#[derive(Clone)]
pub(crate) struct Tls {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// TLS to `host`, trusting only `ca_pem`'s certificates if given, else the system's roots.
    /// The error says what is wrong, in words fit for a configuration error.
    pub(crate) fn new(host: &str, ca_pem: Option<&[u8]>) -> Result<Self, String> {
        let name = server_name(host)?;
        let roots = match ca_pem {
            Some(pem) => private_roots(pem)?,
            None => system_roots()?,
        };
        // The process's default crypto provider if one was installed (as the redis crate's
        // `ClientConfig::builder()` would use), else ring, the one this crate enables.
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("cannot set up TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            name,
        })
    }

    /// The same trust, verifying `host` instead (another node of a cluster).
    pub(crate) fn for_host(&self, host: &str) -> Result<Self, String> {
        Ok(Self {
            connector: self.connector.clone(),
            name: server_name(host)?,
        })
    }

    /// Does the handshake over `stream`: the server's certificate verified, its name checked.
    pub(crate) async fn handshake<S>(
        &self,
        stream: S,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<S>>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        self.connector.connect(self.name.clone(), stream).await
    }
}

/// The name the server's certificate must carry: `host` as a DNS name, or as an IP address if
/// it is one (the redis crate's choice too).
fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host)
        .map(|n| n.to_owned())
        .map_err(|e| format!("the host {host:?} cannot be verified in a certificate: {e}"))
}

/// Every certificate in `pem` (one CA, or a bundle), and nothing else.
fn private_roots(pem: &[u8]) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("the CA certificate does not parse as PEM: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("the CA certificate is not a usable trust anchor: {e}"))?;
    }
    if roots.is_empty() {
        return Err("the CA certificate PEM holds no certificate".to_owned());
    }
    Ok(roots)
}

/// The system's roots, as the redis crate loads them: an error reading the store fails, and so
/// does a certificate in it that is no usable trust anchor.
fn system_roots() -> Result<RootCertStore, String> {
    let mut found = rustls_native_certs::load_native_certs();
    if let Some(e) = found.errors.pop() {
        return Err(format!("cannot read the system's TLS roots: {e}"));
    }
    let mut roots = RootCertStore::empty();
    for cert in found.certs {
        roots
            .add(cert)
            .map_err(|e| format!("a system TLS root is not a usable trust anchor: {e}"))?;
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_pem_without_certificates_or_a_bad_host_is_refused() {
        let e = Tls::new("127.0.0.1", Some(b"")).expect_err("empty PEM");
        assert!(e.contains("no certificate"), "{e}");
        let e = Tls::new("127.0.0.1", Some(b"not a pem")).expect_err("no PEM");
        assert!(e.contains("no certificate"), "{e}");
        let garbled = b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n";
        assert!(Tls::new("127.0.0.1", Some(garbled)).is_err());
        let e = server_name("bad host name!").expect_err("not a DNS name");
        assert!(e.contains("bad host name!"), "{e}");
    }

    #[test]
    fn ip_addresses_and_dns_names_are_verified_as_such() {
        assert!(matches!(
            server_name("127.0.0.1"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(server_name("::1"), Ok(ServerName::IpAddress(_))));
        assert!(matches!(
            server_name("redis.internal"),
            Ok(ServerName::DnsName(_))
        ));
    }
}
