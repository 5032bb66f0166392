//! Keeps a loopback or probe endpoint within its share of the process's file descriptors: an
//! accept loop that backs off (and warns at most every 10 s) while `accept` fails, and a cap
//! on open connections at which a newcomer closes the oldest — strangers before clients that
//! proved who they are — sized from `RLIMIT_NOFILE` so the rest of the process keeps room.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The first pause after a failed `accept`; each further failure in a row doubles it.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// The longest pause between two `accept` attempts that fail.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// While `accept` keeps failing, a warning at most this often (the first failure is logged
/// at once).
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(10);

/// `1/divisor` of the process's open-file limit, at least 1; `None` when the limit cannot be
/// read. An endpoint's connection cap is at most its share, so that however many clients
/// connect the rest of the process still has descriptors for its store, its command and its
/// other endpoint. (An unlimited limit gives a share beyond any endpoint's own maximum.)
pub(crate) fn descriptor_share(divisor: u64) -> Option<usize> {
    share_of(open_file_limit(), divisor)
}

fn share_of(limit: Option<u64>, divisor: u64) -> Option<usize> {
    let share = limit? / divisor.max(1);
    Some(usize::try_from(share).unwrap_or(usize::MAX).max(1))
}

/// The soft `RLIMIT_NOFILE` of this process (unlimited, `RLIM_INFINITY`, is the type's largest
/// value); `None` if it cannot be read.
fn open_file_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit only writes the struct it is given, which lives on this stack frame.
        let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) };
        if read != 0 {
            return None;
        }
        // rlim_t is u64 on Linux and macOS, i64 on some BSDs.
        #[allow(clippy::useless_conversion, clippy::unnecessary_fallible_conversions)]
        u64::try_from(limit.rlim_cur).ok()
    }
    #[cfg(not(unix))]
    None
}

/// A listener whose connections are admitted under an [`Open`] cap.
#[derive(Debug)]
pub(crate) struct Acceptor {
    listener: TcpListener,
    open: Arc<Open>,
    failures: Failures,
}

impl Acceptor {
    /// `endpoint` names the endpoint in the warnings, e.g. "the probe endpoint".
    pub(crate) fn new(listener: TcpListener, open: Arc<Open>, endpoint: &'static str) -> Self {
        Self {
            listener,
            open,
            failures: Failures::new(endpoint),
        }
    }

    /// The next connection and its place under the cap (the oldest connection closed to make
    /// room if the cap is reached). A failed `accept` is logged (rate-limited) and retried
    /// after a pause, so this only returns a connection.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future loses at most a connection already accepted (it is closed).
    pub(crate) async fn accept(&mut self) -> (TcpStream, Slot) {
        let stream = loop {
            match self.listener.accept().await {
                Ok((stream, _peer)) => {
                    let _ = self.failures.recovered();
                    break stream;
                }
                Err(e) => tokio::time::sleep(self.failures.failed(&e)).await,
            }
        };
        (stream, self.open.admit().await)
    }
}

/// The open connections of one or more endpoints, oldest first, each with the token that
/// closes it; at most `cap` of them hold a socket at any time.
///
/// At the cap a new connection closes the oldest instead of waiting for a slot: a probe
/// opens a fresh connection and must be answered within the kubelet's timeout (1 s by
/// default), a command's client opens one when it has something to write, while the
/// connections that fill the cap are, in the cases that matter, idle or slow clients that
/// would hold their slots until a timeout ends them. A keep-alive client that loses its
/// connection opens another. Connections [vouched](Slot::vouch) for (their client showed a
/// secret) are closed only once no stranger is left to close, so a client without the
/// secret cannot push out the requests of one that has it.
#[derive(Debug)]
pub(crate) struct Open {
    cap: usize,
    /// One permit per socket held: taken at admission, given back when the connection's
    /// [`Slot`] is dropped (after its socket is closed), so a closed connection's place is
    /// only reused once its descriptor is free.
    permits: Arc<Semaphore>,
    conns: Mutex<Conns>,
}

#[derive(Debug, Default)]
struct Conns {
    next: u64,
    /// Connections whose client has shown nothing yet, by age.
    strangers: BTreeMap<u64, CancellationToken>,
    /// Connections whose client showed the endpoint's secret, by age.
    vouched: BTreeMap<u64, CancellationToken>,
}

impl Open {
    /// A cap of `cap` connections (at least 1).
    pub(crate) fn new(cap: usize) -> Self {
        let cap = cap.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            cap,
            permits: Arc::new(Semaphore::new(cap)),
            conns: Mutex::new(Conns::default()),
        }
    }

    /// How many connections hold a socket at most.
    #[cfg_attr(
        not(feature = "kube"),
        allow(dead_code, reason = "only the fenced endpoint tells its cap")
    )]
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// Registers a new connection; at the cap it first closes the oldest stranger (or, with
    /// none left, the oldest vouched connection) and waits for its socket to be released.
    pub(crate) async fn admit(self: &Arc<Self>) -> Slot {
        let permit = loop {
            if let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() {
                break permit;
            }
            // At the cap. The connection closed here lets go of its permit once its socket is
            // closed; if every holder is closing already there is none to close, and the
            // first of them to finish lets this one in.
            self.close_oldest();
            if let Ok(permit) = Arc::clone(&self.permits).acquire_owned().await {
                break permit;
            }
            // Unreachable: the semaphore is never closed. Trying again is harmless.
        };
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        let id = conns.next;
        conns.next += 1;
        let closed = CancellationToken::new();
        conns.strangers.insert(id, closed.clone());
        Slot {
            id,
            closed,
            open: Arc::clone(self),
            _permit: permit,
        }
    }

    /// Closes the oldest stranger, or the oldest vouched connection when no stranger is open.
    fn close_oldest(&self) {
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        let oldest = match conns.strangers.pop_first() {
            Some(stranger) => Some(stranger),
            None => conns.vouched.pop_first(),
        };
        if let Some((_, closed)) = oldest {
            closed.cancel();
        }
    }
}

/// One admitted connection's place under the cap; dropping it (once the connection is
/// closed) frees the place.
#[derive(Debug)]
pub(crate) struct Slot {
    id: u64,
    closed: CancellationToken,
    open: Arc<Open>,
    _permit: OwnedSemaphorePermit,
}

impl Slot {
    /// The client showed the endpoint's secret: from now on the connection is closed at the
    /// cap only after every stranger.
    #[cfg_attr(
        not(feature = "kube"),
        allow(dead_code, reason = "only the fenced endpoint has a secret to show")
    )]
    pub(crate) fn vouch(&self) {
        let mut conns = self
            .open
            .conns
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(closed) = conns.strangers.remove(&self.id) {
            conns.vouched.insert(self.id, closed);
        }
    }

    /// Completes once a newer connection has closed this one at the cap: the connection's
    /// task should then drop it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub(crate) async fn evicted(&self) {
        self.closed.cancelled().await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut conns = self
            .open
            .conns
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        conns.strangers.remove(&self.id);
        conns.vouched.remove(&self.id);
        // The permit goes back after this, when the fields drop.
    }
}

/// A run of failed `accept` calls: how long to pause next, and what to log.
#[derive(Debug)]
pub(crate) struct Failures {
    endpoint: &'static str,
    /// Failures in a row; 0 while accepting works.
    count: u64,
    /// Failures since the last warning.
    unreported: u64,
    last_warning: Option<Instant>,
}

impl Failures {
    fn new(endpoint: &'static str) -> Self {
        Self {
            endpoint,
            count: 0,
            unreported: 0,
            last_warning: None,
        }
    }

    /// Records a failure; returns how long to pause before accepting again.
    fn failed(&mut self, error: &std::io::Error) -> Duration {
        self.count += 1;
        self.unreported += 1;
        let now = Instant::now();
        if self
            .last_warning
            .is_none_or(|at| now.duration_since(at) >= WARN_EVERY)
        {
            tracing::warn!(
                error = %error,
                failures = self.unreported,
                "{} cannot accept connections; pausing, then retrying",
                self.endpoint
            );
            self.last_warning = Some(now);
            self.unreported = 0;
        }
        let doublings = u32::try_from(self.count - 1).unwrap_or(u32::MAX).min(16);
        FIRST_BACKOFF
            .saturating_mul(1 << doublings)
            .min(MAX_BACKOFF)
    }

    /// Records a successful `accept`; whether it ended a run of failures (logged once).
    fn recovered(&mut self) -> bool {
        if self.count == 0 {
            return false;
        }
        tracing::info!(
            failures = self.count,
            "{} accepts connections again",
            self.endpoint
        );
        *self = Self::new(self.endpoint);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn closed(slot: &Slot) -> bool {
        slot.closed.is_cancelled()
    }

    /// `f`, failing the test after 5 s: a place never freed would otherwise hang it.
    async fn soon<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(5), f)
            .await
            .expect("within 5 s")
    }

    /// A newcomer at the cap, admitted on a task of its own (it waits for a place).
    fn admit_later(open: &Arc<Open>) -> tokio::task::JoinHandle<Slot> {
        let open = Arc::clone(open);
        tokio::spawn(async move { open.admit().await })
    }

    #[tokio::test]
    async fn the_cap_closes_the_oldest_connections_first() {
        let open = Arc::new(Open::new(2));
        let a = soon(open.admit()).await;
        let b = soon(open.admit()).await;
        assert!(!closed(&a) && !closed(&b));
        // At the cap the newcomer waits for the oldest to let go of its socket.
        let admitting = admit_later(&open);
        soon(a.evicted()).await;
        assert!(!closed(&b), "only the oldest is closed");
        tokio::task::yield_now().await;
        assert!(
            !admitting.is_finished(),
            "admitted before a's socket is released"
        );
        drop(a);
        let c = soon(admitting).await.expect("admitted");
        assert!(!closed(&b) && !closed(&c));
        let admitting = admit_later(&open);
        soon(b.evicted()).await;
        assert!(!closed(&c), "then the next oldest");
        drop(b);
        let d = soon(admitting).await.expect("admitted");
        assert!(!closed(&c) && !closed(&d));
    }

    #[tokio::test]
    async fn a_closed_connection_frees_its_place() {
        let open = Arc::new(Open::new(2));
        assert_eq!(open.cap(), 2);
        assert_eq!(Open::new(0).cap(), 1, "at least one");
        let a = soon(open.admit()).await;
        let b = soon(open.admit()).await;
        drop(a);
        let c = soon(open.admit()).await;
        assert!(!closed(&b) && !closed(&c));
        assert_eq!(open.conns.lock().expect("not poisoned").strangers.len(), 2);
    }

    #[tokio::test]
    async fn vouched_connections_are_closed_only_after_every_stranger() {
        let open = Arc::new(Open::new(3));
        let client = soon(open.admit()).await;
        client.vouch();
        let stranger = soon(open.admit()).await;
        let other_client = soon(open.admit()).await;
        other_client.vouch();
        // Newcomers at the cap close the stranger, though it is younger than `client`.
        let admitting = admit_later(&open);
        soon(stranger.evicted()).await;
        assert!(!closed(&client) && !closed(&other_client));
        drop(stranger);
        let newcomer = soon(admitting).await.expect("admitted");
        // The newcomer is a stranger: the next one closes it, not a vouched client.
        let admitting = admit_later(&open);
        soon(newcomer.evicted()).await;
        assert!(!closed(&client) && !closed(&other_client));
        drop(newcomer);
        let last = soon(admitting).await.expect("admitted");
        last.vouch();
        // With no stranger left, the oldest vouched connection goes.
        let admitting = admit_later(&open);
        soon(client.evicted()).await;
        assert!(!closed(&other_client) && !closed(&last));
        drop(client);
        soon(admitting).await.expect("admitted");
    }

    #[test]
    fn the_share_is_a_fraction_of_the_limit_and_at_least_one() {
        assert_eq!(share_of(Some(1024), 4), Some(256));
        assert_eq!(share_of(Some(1024), 16), Some(64));
        assert_eq!(share_of(Some(3), 4), Some(1));
        assert_eq!(share_of(Some(1024), 0), Some(1024));
        assert_eq!(share_of(None, 4), None);
        assert_eq!(
            share_of(Some(u64::MAX), 4),
            Some(usize::MAX / 4),
            "unlimited"
        );
    }

    /// The limit read by getrlimit is the one the kernel shows in /proc/self/limits.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_share_is_of_this_processs_soft_open_file_limit() {
        let limits = std::fs::read_to_string("/proc/self/limits").expect("/proc/self/limits");
        let soft: u64 = limits
            .lines()
            .find_map(|l| l.strip_prefix("Max open files"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .expect("a finite soft limit on open files");
        assert!(soft > 16, "{soft}");
        assert_eq!(open_file_limit(), Some(soft));
        assert_eq!(descriptor_share(16), usize::try_from(soft / 16).ok());
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_from_10ms_to_1s_and_reset_on_success() {
        let mut f = Failures::new("the test endpoint");
        let e = std::io::Error::other("EMFILE");
        assert!(!f.recovered(), "no run of failures to end (nothing logged)");
        let pauses: Vec<_> = (0..10).map(|_| f.failed(&e).as_millis()).collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        assert!(f.recovered());
        assert!(!f.recovered(), "logged once");
        assert_eq!(f.failed(&e), FIRST_BACKOFF);
        for _ in 0..1_000 {
            assert!(f.failed(&e) <= MAX_BACKOFF);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failures_warn_at_most_every_10s() {
        let mut f = Failures::new("the test endpoint");
        let e = std::io::Error::other("EMFILE");
        f.failed(&e);
        assert_eq!(f.unreported, 0, "the first failure is reported at once");
        f.failed(&e);
        f.failed(&e);
        assert_eq!(f.unreported, 2, "then no warning within 10 s");
        tokio::time::advance(WARN_EVERY).await;
        f.failed(&e);
        assert_eq!(
            f.unreported, 0,
            "a warning again after 10 s, counting the silent ones"
        );
    }
}
