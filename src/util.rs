//! Small helpers shared across the crate: randomness for jitter, the default identity, error
//! messages with their causes.

/// A random u64 from the OS source, for jitter (not for secrets: see
/// [`HolderToken`](crate::backend::HolderToken)).
pub(crate) fn random_u64() -> u64 {
    // Jitter only needs to differ between processes; if the OS source fails, no jitter.
    getrandom::u64().unwrap_or(0)
}

/// This process's default identity: `$POD_NAME` when set (the Kubernetes downward API
/// convention), otherwise `<hostname>-<pid>`.
///
/// # Example
///
/// ```
/// let id = tenure::default_identity();
/// assert!(!id.is_empty());
/// ```
#[must_use]
pub fn default_identity() -> String {
    if let Ok(pod) = std::env::var("POD_NAME")
        && !pod.trim().is_empty()
    {
        return pod;
    }
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}-{}", std::process::id())
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
