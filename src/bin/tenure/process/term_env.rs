//! The environment that names a command's term: the variables every copy of the command gets,
//! and the term read back from a process's environment (how the reaper ties an escaped
//! descendant to its term).

/// The term's fencing token.
pub const ENV_FENCING_TOKEN: &str = "TENURE_FENCING_TOKEN";
/// The term's lease (with `--shards`, the shard's: NAME-SHARD).
pub const ENV_LEASE: &str = "TENURE_LEASE";
/// This replica's identity.
pub const ENV_IDENTITY: &str = "TENURE_IDENTITY";
/// With `--shards`: the shard a copy of the command serves (0 to N − 1).
pub const ENV_SHARD: &str = "TENURE_SHARD";
/// With `--shards`: the group's shard count N.
pub const ENV_SHARDS: &str = "TENURE_SHARDS";

/// With `--once-per`: the start of the period the run is for, on the store's clock (RFC 3339,
/// UTC), e.g. `2026-01-01T00:00:00Z` with `--once-per 24h`.
pub const ENV_PERIOD_START: &str = "TENURE_PERIOD_START";

/// With `--fence`: the term's kubeconfig, reaching the Kubernetes API through its fenced
/// endpoint (kubectl, Helm, client-go and the Python client read it).
pub const ENV_KUBECONFIG: &str = "KUBECONFIG";
/// With `--fence`: the term's fenced endpoint for any HTTP client,
/// `http://127.0.0.1:PORT/term/<secret>` (the API's paths go after it).
pub const ENV_KUBE_SERVER: &str = "TENURE_KUBE_SERVER";

/// A running term, as its command's environment names it: (lease, fencing token).
pub type Marker = (String, String);

/// The term `pid` was started for, from the `TENURE_LEASE` and `TENURE_FENCING_TOKEN` of its
/// environment (as it was when the process started its program); `None` when either is
/// missing or the environment cannot be read.
pub fn marker_of(pid: libc::pid_t) -> Option<Marker> {
    // The environment block of a program is at most a few MiB (ARG_MAX); read a bounded part.
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(format!("/proc/{pid}/environ"))
        .ok()?
        .take(4 << 20)
        .read_to_end(&mut bytes)
        .ok()?;
    let (mut lease, mut token) = (None, None);
    for entry in bytes.split(|&b| b == 0) {
        let Some(eq) = entry.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (name, value) = (&entry[..eq], &entry[eq + 1..]);
        if name == ENV_LEASE.as_bytes() {
            lease = Some(String::from_utf8_lossy(value).into_owned());
        } else if name == ENV_FENCING_TOKEN.as_bytes() {
            token = Some(String::from_utf8_lossy(value).into_owned());
        }
    }
    Some((lease?, token?))
}
