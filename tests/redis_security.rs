//! Credentials and transport security against a real `redis-server`: an ACL user restricted to
//! tenure's keys, a wrong password, a user without the keys, TLS with a test CA and with a wrong
//! one, and passwords never showing in errors, `Debug` output or logs.

#[path = "support/captured.rs"]
mod captured;
mod support;

use std::time::Duration;

use captured::Captured;
use futures::StreamExt;
use support::RedisServer;
use tenure::backend::redis::{RedisBackend, RedisConfig};
use tenure::backend::{AcquireRequest, Acquired, Backend, BackendErrorKind};
use tenure::conformance::Suite;

const USER_PASSWORD: &str = "tenure-Pw-3b9e1";
const WRONG_PASSWORD: &str = "not-the-Pw-77aa";

/// Exactly what the module docs tell operators to grant.
fn tenure_user() -> String {
    support::documented_acl_user("tenure", USER_PASSWORD)
}

fn req(name: &str) -> AcquireRequest {
    support::req(name, "me", Duration::from_secs(5))
}

/// The conformance suite's time scale here: at one second its auto-renewed lease missed its
/// renew deadline on a loaded machine (two cores, a busy loop each beside the tests, #42).
const SUITE_TTL: Duration = Duration::from_secs(3);

async fn connect(url: &str) -> Result<RedisBackend, tenure::backend::BackendError> {
    RedisBackend::connect(RedisConfig::new(url)?.connect_timeout(Duration::from_secs(2))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_restricted_to_the_prefix_runs_the_whole_suite() {
    let server = RedisServer::options().acl_user(&tenure_user()).start();
    let backend = connect(&server.url_as("tenure", USER_PASSWORD))
        .await
        .unwrap_or_else(|e| panic!("the restricted user must be able to connect: {e}"));
    // Observe works (SUBSCRIBE on the prefix's channels).
    let mut changes = backend.observe("acl");
    let first = tokio::time::timeout(Duration::from_secs(5), changes.next()).await;
    assert!(
        matches!(first, Ok(Some(Ok(ref c))) if c.is_free()),
        "{first:?}"
    );
    Suite::new(backend.clone()).ttl(SUITE_TTL).run_all().await;
    // The password may also come from the config instead of the URL.
    let via_config = RedisBackend::connect(
        RedisConfig::new(&server.url())
            .unwrap_or_else(|e| panic!("{e}"))
            .username("tenure")
            .password(USER_PASSWORD),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        via_config.try_acquire(&req("via-config")).await,
        Ok(Acquired::Granted { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_a_clear_authentication_error() {
    let server = RedisServer::options().acl_user(&tenure_user()).start();
    let err = connect(&server.url_as("tenure", WRONG_PASSWORD))
        .await
        .expect_err("a wrong password must be refused");
    assert_eq!(err.kind(), BackendErrorKind::Unauthenticated, "{err}");
    assert!(!err.is_transient());
    let text = format!("{err} {err:?}");
    assert!(
        text.contains("credentials"),
        "the message says what is wrong: {text}"
    );
    assert!(
        !text.contains(WRONG_PASSWORD),
        "the password leaked: {text}"
    );
    // No password at all, where one is required.
    let err = connect(&server.url())
        .await
        .expect_err("the default user needs a password here");
    assert_eq!(err.kind(), BackendErrorKind::Unauthenticated, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_tenures_keys_is_denied() {
    let server = RedisServer::options()
        .acl_user(&tenure_user())
        .acl_user(&format!(
            "other on >{USER_PASSWORD} resetkeys ~other:* resetchannels &other:* +@all"
        ))
        .acl_user(&format!(
            "nopublish on >{USER_PASSWORD} resetkeys ~tenure:* resetchannels &tenure:* +@all -publish"
        ))
        .start();
    let other = connect(&server.url_as("other", USER_PASSWORD))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let err = other
        .try_acquire(&req("denied"))
        .await
        .expect_err("keys outside the user's pattern");
    assert_eq!(err.kind(), BackendErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains("permission"), "{err}");
    let nopublish = connect(&server.url_as("nopublish", USER_PASSWORD))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let err = nopublish
        .try_acquire(&req("denied"))
        .await
        .expect_err("the script's PUBLISH is denied");
    assert_eq!(err.kind(), BackendErrorKind::PermissionDenied, "{err}");
    // The script fails before it writes the lock key: nothing is left held.
    assert_eq!(
        server.cmd(&["EXISTS", "tenure:{denied}"]),
        redis::Value::Int(0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_the_test_ca_works_and_a_wrong_ca_is_refused() {
    let server = RedisServer::options().tls().start();
    let good = RedisBackend::connect(
        RedisConfig::new(&server.url())
            .unwrap_or_else(|e| panic!("{e}"))
            .ca_certificate_pem(server.ca_pem()),
    )
    .await
    .unwrap_or_else(|e| panic!("TLS with the right CA must work: {e}"));
    let mut changes = good.observe("tls");
    assert!(matches!(
        tokio::time::timeout(Duration::from_secs(5), changes.next()).await,
        Ok(Some(Ok(_)))
    ));
    Suite::new(good).ttl(SUITE_TTL).check_fencing_rises().await;

    let wrong_ca = support::make_ca(server.dir(), "wrong");
    let wrong = RedisBackend::connect(
        RedisConfig::new(&server.url())
            .unwrap_or_else(|e| panic!("{e}"))
            .ca_certificate_pem(std::fs::read(wrong_ca).unwrap_or_else(|e| panic!("{e}"))),
    )
    .await
    .expect_err("a server certificate from another CA must be refused");
    assert_eq!(wrong.kind(), BackendErrorKind::Config, "{wrong}");
    assert!(wrong.to_string().contains("certificate"), "{wrong}");
    // The system roots do not know the test CA either.
    let system = connect(&server.url())
        .await
        .expect_err("the system roots do not vouch for the test CA");
    assert_eq!(system.kind(), BackendErrorKind::Config, "{system}");
    // Plain text to a TLS port fails too.
    let plain = connect(&format!("redis://127.0.0.1:{}/", server.port()))
        .await
        .expect_err("plain text to a TLS port");
    assert!(
        plain.is_transient() || plain.kind() == BackendErrorKind::Protocol,
        "{plain}"
    );
}

#[test]
fn passwords_never_appear_in_errors_debug_output_or_logs() {
    let server = RedisServer::options().acl_user(&tenure_user()).start();
    let log = Captured::default();
    let subscriber = log.subscriber(tracing::Level::TRACE);
    let mut seen = Vec::<String>::new();
    tracing::subscriber::with_default(subscriber, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        rt.block_on(async {
            let config = RedisConfig::new(&server.url_as("tenure", USER_PASSWORD))
                .unwrap_or_else(|e| panic!("{e}"));
            seen.push(format!("{config:?}"));
            seen.push(config.redacted_url());
            let backend = RedisBackend::connect(config)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            seen.push(format!("{backend:?}"));
            let locker = tenure::Locker::with_identity(backend.clone(), "logger")
                .unwrap_or_else(|e| panic!("{e}"));
            let opts = tenure::LockOptions::new()
                .ttl(Duration::from_millis(300))
                .auto_renew(true);
            let lease = locker
                .try_acquire("logged", &opts)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            tokio::time::sleep(Duration::from_millis(250)).await;
            let busy = locker.try_acquire("logged", &opts).await;
            seen.push(format!("{busy:?}"));
            lease.release().await.unwrap_or_else(|e| panic!("{e}"));
            let mut s = backend.observe("logged");
            seen.push(format!("{:?}", s.next().await));
            // Failures: wrong password in the URL and in the config; a bad URL.
            for config in [
                RedisConfig::new(&server.url_as("tenure", WRONG_PASSWORD)),
                RedisConfig::new(&server.url())
                    .map(|c| c.username("tenure").password(WRONG_PASSWORD)),
                RedisConfig::new(&format!("redis://tenure:{WRONG_PASSWORD}@")),
            ] {
                match config {
                    Ok(c) => {
                        seen.push(format!("{c:?}"));
                        let err = RedisBackend::connect(c).await.expect_err("refused");
                        seen.push(format!("{err} / {err:?}"));
                    }
                    Err(e) => seen.push(format!("{e} / {e:?}")),
                }
            }
        });
    });
    let log = log.text();
    assert!(
        log.contains("redis backend connected"),
        "the log was captured:\n{log}"
    );
    assert!(
        log.contains("tenure:***@"),
        "the log names the redacted URL:\n{log}"
    );
    for text in seen.iter().chain(std::iter::once(&log)) {
        assert!(!text.contains(USER_PASSWORD), "password leaked: {text}");
        assert!(!text.contains(WRONG_PASSWORD), "password leaked: {text}");
    }
}

/// The capture above once came back empty in a loaded run: a sibling test's thread, which has
/// no subscriber, reached the backend's log lines first and tracing cached "never" for them
/// (see `Captured::subscriber`). This replays that order on purpose: another thread reaches a
/// callsite first, after the capture is installed and before the capture's own thread does.
#[test]
fn a_capture_sees_a_callsite_that_a_thread_without_a_subscriber_reached_first() {
    fn marker(from: &str) {
        tracing::info!(from, "capture marker");
    }
    let log = Captured::default();
    let (go, gone) = std::sync::mpsc::channel::<()>();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        gone.recv().unwrap_or_else(|e| panic!("{e}"));
        marker("other");
        done.send(()).unwrap_or_else(|e| panic!("{e}"));
    });
    tracing::subscriber::with_default(log.subscriber(tracing::Level::INFO), || {
        go.send(()).unwrap_or_else(|e| panic!("{e}"));
        finished.recv().unwrap_or_else(|e| panic!("{e}"));
        marker("captured");
    });
    other
        .join()
        .unwrap_or_else(|_| panic!("the other thread panicked"));
    let text = log.text();
    assert!(
        text.contains("capture marker from=\"captured\""),
        "the capture missed its own thread's event: {text:?}"
    );
    assert!(
        !text.contains("from=\"other\""),
        "the capture saw another thread's event: {text:?}"
    );
}
