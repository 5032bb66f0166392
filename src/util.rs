//! Small helpers shared across the crate: randomness for jitter, the default identity, error
//! messages with their causes.

use crate::backend::types::MAX_IDENTITY_LEN;

thread_local! {
    /// This thread's seeded jitter sequence (SplitMix64 state), when
    /// [`seed_jitter`](crate::lock::seed_jitter) set one.
    static SEEDED: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// A random u64 for jitter (not for secrets: see [`HolderToken`](crate::backend::HolderToken)):
/// from the OS source, or from this thread's seeded sequence.
pub(crate) fn random_u64() -> u64 {
    if let Some(next) = SEEDED.with(|s| {
        s.get().map(|state| {
            let state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            s.set(Some(state));
            splitmix(state)
        })
    }) {
        return next;
    }
    // Jitter only needs to differ between processes; if the OS source fails, no jitter.
    getrandom::u64().unwrap_or(0)
}

/// Makes this thread's jitter a fixed sequence from `seed` (`None`: the OS source again).
pub(crate) fn seed_jitter(seed: Option<u64>) {
    SEEDED.with(|s| s.set(seed));
}

/// FNV-1a, 64 bits, over `bytes`: the one stable hash behind shard routing
/// ([`crate::shard::shard_of`]), rendezvous weights and the Kubernetes names derived from
/// identities. Published and portable: its values must never change.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_from(0xcbf2_9ce4_8422_2325, bytes)
}

/// FNV-1a, 64 bits, continued from `h` over `bytes`: `fnv1a64_from(fnv1a64(a), b)` is
/// `fnv1a64(a ++ b)`.
pub(crate) fn fnv1a64_from(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// SplitMix64's output function: a well-mixed u64 from each step of a counter (and the
/// finalizer that spreads a weak hash's bits over the whole word).
pub(crate) fn splitmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Sleeps until `at`, or forever when there is no instant: the branch of a `select!` whose
/// deadline may be unset.
pub(crate) async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// This process's default identity: `$POD_NAME` when set (the Kubernetes downward API
/// convention), otherwise `<hostname>-<pid>`.
///
/// The result is always a valid identity for [`Locker::with_identity`](crate::Locker::with_identity):
/// at most [`MAX_IDENTITY_LEN`] bytes, without control characters. A host name too long for
/// that is cut short (at a character boundary, keeping the pid), and control characters in it
/// become `_`. A `$POD_NAME` that is not a valid identity (a pod name never is) is ignored
/// with a warning, in favour of `<hostname>-<pid>`.
///
/// # Example
///
/// ```
/// let id = tenure::default_identity();
/// assert!(!id.is_empty() && id.len() <= tenure::lock::MAX_IDENTITY_LEN);
/// ```
#[must_use]
pub fn default_identity() -> String {
    if let Ok(pod) = std::env::var("POD_NAME")
        && !pod.trim().is_empty()
    {
        if pod.len() <= MAX_IDENTITY_LEN && !pod.chars().any(char::is_control) {
            return pod;
        }
        tracing::warn!(
            bytes = pod.len(),
            "$POD_NAME is not a valid identity (at most {MAX_IDENTITY_LEN} bytes, no control \
             characters); using <hostname>-<pid> instead"
        );
    }
    let host = std::env::var("HOSTNAME")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "localhost".to_owned());
    host_identity(&host, std::process::id())
}

/// `<host>-<pid>`, with `host` cut short to keep the whole within [`MAX_IDENTITY_LEN`] bytes
/// and its control characters replaced by `_`.
fn host_identity(host: &str, pid: u32) -> String {
    let suffix = format!("-{pid}");
    let room = MAX_IDENTITY_LEN - suffix.len();
    let mut out = String::with_capacity(MAX_IDENTITY_LEN);
    for c in host.chars() {
        let c = if c.is_control() { '_' } else { c };
        if out.len() + c.len_utf8() > room {
            break;
        }
        out.push(c);
    }
    out.push_str(&suffix);
    out
}

/// `e` and its sources joined with ": ", each distinct message once (a source whose text the
/// message already contains adds nothing).
#[cfg(feature = "kube")]
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_jitter_repeats_per_seed_and_the_os_source_returns() {
        let draw = |seed| {
            seed_jitter(Some(seed));
            let xs: Vec<u64> = (0..4).map(|_| random_u64()).collect();
            seed_jitter(None);
            xs
        };
        // SplitMix64's published first outputs for seed 1234567.
        assert_eq!(
            draw(1_234_567)[..2],
            [6_457_827_717_110_365_317, 3_203_168_211_198_807_973]
        );
        let a = draw(5);
        assert_eq!(a, draw(5), "one seed, one sequence");
        assert_ne!(a, draw(6));
        assert!(
            a.windows(2).all(|w| w[0] != w[1]),
            "the sequence moves: {a:?}"
        );
        // Back on the OS source: 128 random bits do not repeat the seeded sequence.
        let (x, y) = (random_u64(), random_u64());
        assert!(x != a[0] || y != a[1]);
        assert_ne!(x, y);
    }

    #[test]
    fn host_identities_fit_the_cap_and_keep_the_pid() {
        assert_eq!(host_identity("web-1", 42), "web-1-42");
        assert_eq!(host_identity("a\nb\u{1b}", 7), "a_b_-7");
        let long = host_identity(&"h".repeat(300), 4_194_304);
        assert_eq!(long.len(), MAX_IDENTITY_LEN);
        assert!(long.ends_with("h-4194304"), "{long}");
        // Cut at a character boundary: "é" is two bytes.
        let accented = host_identity(&"é".repeat(200), 1);
        assert!(accented.len() <= MAX_IDENTITY_LEN && accented.ends_with("é-1"));
        assert_eq!(accented.len(), MAX_IDENTITY_LEN - 1);
    }
}
