//! A run-once job's completion record on Redis: the string `<prefix>{name}:done` in the
//! lock's hash slot, holding [`Completion::encode`]'s text without expiry, read by
//! `completion_check.lua` (with the server's `TIME` and whether the checking term is the
//! lock's latest, never more than a record's worth) and written only by
//! `completion_record.lua`, which compares the lock's fencing counter with the writer's token
//! in the same step: a term granted after the writer's makes the write fail.

use std::sync::LazyLock;

use ::redis::Value;

use super::engine::{Engine, Lua, as_i64, protocol};
use crate::backend::completion::MAX_COMPLETION_RECORD;
use crate::backend::{BackendError, Completion, CompletionCheck, CompletionRead, FencingToken};

static CHECK: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("completion_check", include_str!("completion_check.lua")));
static RECORD: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("completion_record", include_str!("completion_record.lua")));

/// The completion scripts, for loading them up front with the others.
pub(crate) fn scripts() -> [&'static Lua; 2] {
    [&*CHECK, &*RECORD]
}

/// One call of `script` on the lock's fencing counter and completion record; its reply.
async fn call(
    engine: &Engine,
    script: &'static Lua,
    what: &str,
    name: &str,
    args: &[&[u8]],
) -> Result<Value, BackendError> {
    let (fence, done) = (engine.keys.fence(name), engine.keys.completion(name));
    engine.call(script, what, &[&fence, &done], args).await
}

/// `name`'s completion record, the server's clock, and whether `token` is the latest term.
pub(super) async fn check(
    engine: &Engine,
    name: &str,
    token: FencingToken,
) -> Result<CompletionCheck, BackendError> {
    let (token, max) = (token.to_string(), MAX_COMPLETION_RECORD.to_string());
    let what = "check completion";
    let reply = call(
        engine,
        &CHECK,
        what,
        name,
        &[token.as_bytes(), max.as_bytes()],
    )
    .await?;
    parse_check(&reply).ok_or_else(|| protocol(what, &reply))
}

/// Parses `completion_check.lua`'s reply; `None` when it is not of that shape.
fn parse_check(reply: &Value) -> Option<CompletionCheck> {
    let Value::Array(parts) = reply else {
        return None;
    };
    let (time, rest) = parts.split_at_checked(4)?;
    let number = |v: &Value| as_i64(v).and_then(|n| u64::try_from(n).ok());
    let now_ms = number(&time[0])?
        .checked_mul(1000)?
        .checked_add(number(&time[1])? / 1000)?;
    let latest = match as_i64(&time[2])? {
        0 => false,
        1 => true,
        _ => return None,
    };
    let last = match (as_i64(&time[3])?, rest) {
        (0, []) => CompletionRead::Absent,
        (1, [Value::BulkString(text)]) => CompletionRead::parse(text),
        (2, []) => CompletionRead::Damaged {
            reason: "the record key holds another type than a string".to_owned(),
        },
        (3, [len]) => CompletionRead::Damaged {
            reason: format!(
                "the record is {} bytes, longer than any completion record",
                as_i64(len)?
            ),
        },
        _ => return None,
    };
    Some(CompletionCheck {
        now_ms,
        last,
        latest,
    })
}

/// Writes `record` if its term is still the lock's latest.
pub(super) async fn record(
    engine: &Engine,
    name: &str,
    record: &Completion,
) -> Result<bool, BackendError> {
    let (token, text) = (record.token.to_string(), record.encode());
    let what = "record completion";
    let reply = call(
        engine,
        &RECORD,
        what,
        name,
        &[token.as_bytes(), text.as_bytes()],
    )
    .await?;
    match as_i64(&reply) {
        Some(1) => Ok(true),
        Some(0) => Ok(false),
        _ => Err(protocol(what, &reply)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(n: i64) -> Value {
        Value::Int(n)
    }

    #[test]
    fn replies_parse_and_anything_else_is_a_protocol_error() {
        let check = |parts: Vec<Value>| parse_check(&Value::Array(parts));
        let absent =
            check(vec![int(1_767_225_600), int(123_456), int(1), int(0)]).expect("absent parses");
        assert_eq!(absent.now_ms, 1_767_225_600_123);
        assert!(absent.latest);
        assert_eq!(absent.last, CompletionRead::Absent);
        let text = b"c1:7:1767225600000:5:web-1".to_vec();
        let present = check(vec![
            int(1_767_225_600),
            int(0),
            int(0),
            int(1),
            Value::BulkString(text),
        ])
        .expect("present parses");
        assert!(!present.latest);
        assert!(matches!(present.last, CompletionRead::Present(ref c) if c.identity == "web-1"));
        for damaged in [
            vec![int(1), int(0), int(1), int(2)],
            vec![int(1), int(0), int(1), int(3), int(1 << 30)],
            vec![
                int(1),
                int(0),
                int(1),
                int(1),
                Value::BulkString(b"c1:x".to_vec()),
            ],
        ] {
            assert!(
                matches!(
                    check(damaged.clone()),
                    Some(CompletionCheck {
                        last: CompletionRead::Damaged { .. },
                        ..
                    })
                ),
                "{damaged:?}"
            );
        }
        for bad in [
            vec![],
            vec![int(1), int(0), int(2), int(0)],
            vec![int(-1), int(0), int(1), int(0)],
            vec![int(1), int(0), int(1), int(7)],
            vec![int(1), int(0), int(1), int(1)],
            vec![int(1), int(0), int(1), int(0), int(5)],
        ] {
            assert_eq!(check(bad.clone()), None, "{bad:?}");
        }
        assert_eq!(parse_check(&int(1)), None);
    }
}
