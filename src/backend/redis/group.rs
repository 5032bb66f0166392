//! The group record on Redis (sharded leadership): the string `<prefix>{g}:group-record` in
//! the group's hash slot, holding [`GroupRecord::encode`]'s text without expiry, read by
//! `group_read.lua` (which never sends more than a record's worth, whatever is planted
//! there) and changed only by `group_swap.lua`'s compare-and-swap. Its version is the text
//! itself: every change of a record changes its text.

use std::sync::LazyLock;

use ::redis::Value;

use super::engine::{Engine, Lua, as_i64, protocol};
use crate::backend::group::MAX_GROUP_RECORD;
use crate::backend::{BackendError, GroupRead, GroupRecord, GroupVersion};

static READ: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("group_read", include_str!("group_read.lua")));
static SWAP: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("group_swap", include_str!("group_swap.lua")));

/// The group record scripts, for loading them up front with the others.
pub(crate) fn scripts() -> [&'static Lua; 2] {
    [&*READ, &*SWAP]
}

/// One call of `script` on the group's keys; its reply.
async fn call(
    engine: &Engine,
    script: &'static Lua,
    what: &str,
    group: &str,
    args: &[&[u8]],
) -> Result<Value, BackendError> {
    let record = engine.keys.group_record(group);
    engine.call(script, what, &[&record], args).await
}

/// Reads `group`'s record.
pub(super) async fn read(engine: &Engine, group: &str) -> Result<GroupRead, BackendError> {
    let max = MAX_GROUP_RECORD.to_string();
    let reply = call(engine, &READ, "read group record", group, &[max.as_bytes()]).await?;
    parse_read(&reply).ok_or_else(|| protocol("read group record", &reply))
}

/// Parses `group_read.lua`'s reply; `None` when it is not of that shape.
fn parse_read(reply: &Value) -> Option<GroupRead> {
    let Value::Array(parts) = reply else {
        return None;
    };
    match parts.as_slice() {
        [code] if as_i64(code) == Some(0) => Some(GroupRead::Absent),
        [code, Value::BulkString(text)] if as_i64(code) == Some(1) => Some(GroupRead::parse(
            text,
            GroupVersion(String::from_utf8_lossy(text).into_owned()),
        )),
        [code] if as_i64(code) == Some(2) => Some(GroupRead::Damaged {
            reason: "the record key holds another type than a string".to_owned(),
        }),
        [code, len] if as_i64(code) == Some(3) => Some(GroupRead::Damaged {
            reason: format!(
                "the record is {} bytes, longer than any group record",
                as_i64(len)?
            ),
        }),
        _ => None,
    }
}

/// Writes `record` if the record is still `expected` (`None`: if there is none).
pub(super) async fn swap(
    engine: &Engine,
    group: &str,
    expected: Option<&GroupVersion>,
    record: &GroupRecord,
) -> Result<bool, BackendError> {
    let (mode, old) = match expected {
        None => ("0", ""),
        Some(v) => ("1", v.0.as_str()),
    };
    let new = record.encode();
    let args: [&[u8]; 3] = [mode.as_bytes(), old.as_bytes(), new.as_bytes()];
    let reply = call(engine, &SWAP, "swap group record", group, &args).await?;
    match as_i64(&reply) {
        Some(1) => Ok(true),
        Some(0) => Ok(false),
        _ => Err(protocol("swap group record", &reply)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn replies_parse_and_anything_else_is_a_protocol_error() {
        assert_eq!(
            parse_read(&Value::Array(vec![Value::Int(0)])),
            Some(GroupRead::Absent)
        );
        assert_eq!(
            parse_read(&Value::Array(vec![Value::Int(1), bulk("g1:4:1:-")])),
            Some(GroupRead::Present {
                record: GroupRecord::first(4),
                version: GroupVersion("g1:4:1:-".to_owned()),
            })
        );
        for damaged in [
            vec![Value::Int(1), bulk("g1:four:1:-")],
            vec![Value::Int(2)],
            vec![Value::Int(3), Value::Int(5 << 20)],
        ] {
            assert!(
                matches!(
                    parse_read(&Value::Array(damaged.clone())),
                    Some(GroupRead::Damaged { .. })
                ),
                "{damaged:?}"
            );
        }
        assert_eq!(parse_read(&Value::Int(1)), None);
        assert_eq!(parse_read(&Value::Array(vec![Value::Int(7)])), None);
    }
}
