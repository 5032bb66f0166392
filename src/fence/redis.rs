//! Fenced writes to Redis (feature `redis`): a value and the highest token accepted for it,
//! compared and written by one script, so a stale leader's late write is refused atomically.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;

use crate::FencingToken;

/// `fenced_set.lua`: KEYS[1] = the value's key, KEYS[2] = its fence key (keep both in one
/// hash slot on a cluster, e.g. `{report}` and `{report}:fence`); ARGV[1] = the fencing token
/// (decimal), ARGV[2] = the value. Returns 1 when written, 0 when refused because a higher
/// token was already accepted. docs/fencing.md shows the same file for other languages.
const FENCED_SET: &str = include_str!("fenced_set.lua");

/// Loaded once: the script's SHA1 is computed on first use.
static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(FENCED_SET));

/// Sets `key` to `value` only if `token` is at least the highest token accepted for `key`
/// (kept at `fence_key`); returns whether it wrote.
///
/// Tokens are compared as Lua numbers (doubles): exact up to 2^53, which Redis-issued tokens
/// (microseconds since 1970 plus a counter) stay far below for centuries.
///
/// # Errors
///
/// The Redis error, if the script could not run.
///
/// # Example
///
/// ```no_run
/// # async fn demo(mut conn: redis::aio::ConnectionManager, lease: tenure::Lease) -> redis::RedisResult<()> {
/// let written = tenure::fence::redis::fenced_set(
///     &mut conn, "{report}", "{report}:fence", lease.fencing_token(), "body",
/// ).await?;
/// if !written {
///     // A newer leader has written: this process is stale and must stop.
/// }
/// # Ok(()) }
/// ```
pub async fn fenced_set<C: ConnectionLike + Send>(
    conn: &mut C,
    key: &str,
    fence_key: &str,
    token: FencingToken,
    value: &str,
) -> redis::RedisResult<bool> {
    let written: i64 = SCRIPT
        .key(key)
        .key(fence_key)
        .arg(token.get().to_string())
        .arg(value)
        .invoke_async(conn)
        .await?;
    Ok(written == 1)
}
