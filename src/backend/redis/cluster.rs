//! A Redis Cluster's command connections, made by tenure: the slot map read with
//! `CLUSTER SLOTS`, one [`Managed`] connection per master (bounded like a single server's, see
//! [`limit`](super::limit)), every call routed to the master serving its keys' slot, `MOVED`
//! and `ASK` redirects followed.
//!
//! Why not the redis crate's cluster client: it opens its node connections itself, over
//! streams tenure cannot wrap, so a node's replies could make tenure allocate without bound.
//! tenure's calls in a cluster are simple (each pipeline's keyed commands share one slot; no
//! replica reads, no cross-slot fan-out), so routing them is little code.
//!
//! Topology changes are followed the way a cluster tells its clients: a `MOVED` reply sends
//! the call to the named node at once and marks the map stale; an `ASK` reply (a slot being
//! migrated) sends it once to the named node after `ASKING`; a node that cannot be reached marks
//! the map stale too. The next call after a stale mark reads the map again (one read at a
//! time; callers waiting meanwhile share it), from the known masters and the seed in turn.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ::redis::{ErrorKind, Pipeline, RedisError, ServerErrorKind, Value};

use super::server::{ConnError, Connector, Managed};

/// How many redirects one call follows before it fails: a slot moves once per resharding
/// step, so more than a few in a row means the nodes disagree about who serves it.
const MAX_REDIRECTS: usize = 5;

/// The number of hash slots of a Redis Cluster.
const SLOTS: u16 = 16384;

/// A master, as the cluster announces it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Node {
    host: String,
    port: u16,
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Which master serves each slot: ranges sorted by their first slot, not overlapping.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct SlotMap {
    ranges: Vec<(u16, u16, Node)>,
}

impl SlotMap {
    fn node(&self, slot: u16) -> Option<&Node> {
        let i = self.ranges.partition_point(|(start, _, _)| *start <= slot);
        let (_, end, node) = self.ranges.get(i.checked_sub(1)?)?;
        (slot <= *end).then_some(node)
    }

    fn masters(&self) -> Vec<Node> {
        let mut out: Vec<Node> = Vec::new();
        for (_, _, node) in &self.ranges {
            if !out.contains(node) {
                out.push(node.clone());
            }
        }
        out
    }
}

/// Reads a `CLUSTER SLOTS` reply asked of `asked`. Each range is read alone: one that does not
/// parse, names no usable master or overlaps an earlier one is skipped with a warning (the
/// slots it claims then have no node, and calls for them fail until a later read).
fn parse_slots(reply: &Value, asked: &Node) -> Result<SlotMap, String> {
    let Value::Array(entries) = reply else {
        return Err(format!("CLUSTER SLOTS answered {}", kind(reply)));
    };
    let mut ranges: Vec<(u16, u16, Node)> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        match parse_range(entry, asked) {
            Ok(range) => ranges.push(range),
            Err(why) => {
                tracing::warn!(
                    node = %asked,
                    "redis cluster: CLUSTER SLOTS entry {i} skipped: {why}"
                );
            }
        }
    }
    ranges.sort_by_key(|(start, _, _)| *start);
    let mut map = SlotMap::default();
    for range in ranges {
        if let Some((_, end, _)) = map.ranges.last()
            && range.0 <= *end
        {
            tracing::warn!(
                node = %asked,
                "redis cluster: CLUSTER SLOTS range {}-{} skipped: it overlaps slot {end}",
                range.0,
                range.1
            );
            continue;
        }
        map.ranges.push(range);
    }
    Ok(map)
}

/// One `[start, end, [host, port, id, ...], replicas...]` entry.
fn parse_range(entry: &Value, asked: &Node) -> Result<(u16, u16, Node), String> {
    let Value::Array(parts) = entry else {
        return Err(format!("it is {}, not an array", kind(entry)));
    };
    let slot = |v: Option<&Value>| match v {
        Some(Value::Int(n)) => u16::try_from(*n)
            .ok()
            .filter(|s| *s < SLOTS)
            .ok_or_else(|| format!("slot {n} is out of range")),
        other => Err(format!("a slot is {}", other.map_or("missing", kind))),
    };
    let start = slot(parts.first())?;
    let end = slot(parts.get(1))?;
    if start > end {
        return Err(format!("it starts at {start} after its end {end}"));
    }
    let Some(Value::Array(master)) = parts.get(2) else {
        return Err("it names no master".to_owned());
    };
    let host = match master.first() {
        Some(Value::BulkString(b)) => std::str::from_utf8(b)
            .map_err(|_| "the master's host is not UTF-8".to_owned())?
            .to_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        other => {
            return Err(format!(
                "the master's host is {}",
                other.map_or("missing", kind)
            ));
        }
    };
    // An empty host is the node that answered; "?" is a node whose endpoint is unknown.
    let host = match host.as_str() {
        "" => asked.host.clone(),
        "?" => return Err("the master's endpoint is unknown (\"?\")".to_owned()),
        h if h.len() > 255 => return Err("the master's host is over 255 bytes".to_owned()),
        _ => host,
    };
    let port = match master.get(1) {
        Some(Value::Int(p)) => u16::try_from(*p)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("the master's port {p} is out of range"))?,
        other => {
            return Err(format!(
                "the master's port is {}",
                other.map_or("missing", kind)
            ));
        }
    };
    Ok((start, end, Node { host, port }))
}

/// A value's kind, for messages (never its contents, which may be huge or secret).
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Nil => "nil",
        Value::Int(_) => "an integer",
        Value::BulkString(_) | Value::SimpleString(_) | Value::VerbatimString { .. } => "a string",
        Value::Array(_) | Value::Set(_) | Value::Map(_) => "an aggregate",
        Value::ServerError(_) => "an error",
        _ => "an unexpected value",
    }
}

/// Where a reply sends a call instead.
#[derive(Debug, PartialEq, Eq)]
enum Redirect {
    Moved(Node),
    Ask(Node),
}

/// The redirect among `replies`, if any (`MOVED 3999 127.0.0.1:6381`, `ASK ...`).
fn redirect(replies: &[Value]) -> Option<Redirect> {
    replies.iter().find_map(|r| {
        let Value::ServerError(e) = r else {
            return None;
        };
        let moved = match e.kind() {
            Some(ServerErrorKind::Moved) => true,
            Some(ServerErrorKind::Ask) => false,
            _ => return None,
        };
        let (_slot, addr) = e.details()?.trim().split_once(' ')?;
        let (host, port) = addr.rsplit_once(':')?;
        let node = Node {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: port.parse().ok().filter(|p| *p != 0)?,
        };
        Some(if moved {
            Redirect::Moved(node)
        } else {
            Redirect::Ask(node)
        })
    })
}

/// The key whose slot routes `pipe`: the first key of its first script call (every keyed
/// command of one pipeline shares a slot; tenure's only keyed commands are script calls).
fn routing_key(pipe: &Pipeline) -> Option<Vec<u8>> {
    pipe.cmd_iter().find_map(|cmd| {
        let mut args = cmd.args_iter().map(|a| match a {
            ::redis::Arg::Simple(b) => Some(b),
            _ => None,
        });
        let name = args.next()??;
        if !name.eq_ignore_ascii_case(b"EVALSHA") && !name.eq_ignore_ascii_case(b"EVAL") {
            return None;
        }
        let _script = args.next()??;
        let keys: usize = std::str::from_utf8(args.next()??).ok()?.parse().ok()?;
        if keys == 0 {
            return None;
        }
        args.next()?.map(<[u8]>::to_vec)
    })
}

/// `pipe` with `ASKING` before each command, so that a slot's importing node takes them.
fn asking(pipe: &Pipeline) -> Pipeline {
    let mut out = ::redis::pipe();
    for cmd in pipe.cmd_iter() {
        out.cmd("ASKING");
        out.add_command(cmd.clone());
    }
    out
}

/// An error of the cluster's own making, in the redis crate's form.
fn cluster_error(what: String) -> ConnError {
    ConnError::Redis(RedisError::from((
        ErrorKind::ClusterConnectionNotFound,
        "redis cluster",
        what,
    )))
}

/// What the connection knows of the cluster.
#[derive(Default)]
struct State {
    /// Counts map reads, so that callers that saw the same stale map read it once.
    generation: u64,
    map: SlotMap,
    stale: bool,
    /// A connection per node (the masters of the map, the seed, redirect targets until the
    /// next read), made when first used.
    conns: HashMap<Node, Arc<Managed>>,
}

/// A Redis Cluster connection: cheap to share, safe to use from many tasks.
pub(crate) struct Cluster {
    seed: Connector,
    seed_node: Node,
    state: Mutex<State>,
    /// Held while the map is read: one read at a time.
    reading: tokio::sync::Mutex<()>,
}

impl Cluster {
    /// Reads the slot map from the seed; fails if it cannot, or if no slot has a master.
    pub(crate) async fn connect(seed: Connector) -> Result<Arc<Self>, ConnError> {
        let (host, port) = seed
            .host_port()
            .ok_or_else(|| cluster_error("a cluster's seed must be a TCP address".to_owned()))?;
        let cluster = Arc::new(Self {
            seed,
            seed_node: Node { host, port },
            state: Mutex::default(),
            reading: tokio::sync::Mutex::new(()),
        });
        cluster.read_map(0).await?;
        Ok(cluster)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection to `node`, made on first use.
    fn conn(&self, node: &Node) -> Result<Arc<Managed>, ConnError> {
        let mut state = self.lock();
        if let Some(c) = state.conns.get(node) {
            return Ok(c.clone());
        }
        let connector = self
            .seed
            .for_node(&node.host, node.port)
            .map_err(|e| cluster_error(format!("node {node}: {e}")))?;
        let conn = Managed::new(connector);
        state.conns.insert(node.clone(), conn.clone());
        Ok(conn)
    }

    /// Reads the map again unless another caller did since `seen` (a generation).
    async fn read_map(&self, seen: u64) -> Result<(), ConnError> {
        let _reading = self.reading.lock().await;
        let mut candidates = {
            let state = self.lock();
            if state.generation != seen {
                return Ok(());
            }
            state.map.masters()
        };
        if !candidates.contains(&self.seed_node) {
            candidates.push(self.seed_node.clone());
        }
        let mut last = None;
        for node in candidates {
            match self.read_map_from(&node).await {
                Ok(map) => {
                    let mut state = self.lock();
                    let masters = map.masters();
                    state
                        .conns
                        .retain(|n, _| masters.contains(n) || *n == self.seed_node);
                    state.map = map;
                    state.stale = false;
                    state.generation += 1;
                    return Ok(());
                }
                Err(e) => {
                    tracing::debug!(%node, "redis cluster: cannot read the slot map here");
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| cluster_error("no node to read the slot map from".to_owned())))
    }

    async fn read_map_from(&self, node: &Node) -> Result<SlotMap, ConnError> {
        let mut pipe = ::redis::pipe();
        pipe.cmd("CLUSTER").arg("SLOTS");
        let reply = self
            .conn(node)?
            .send(&pipe, 1)
            .await?
            .pop()
            .unwrap_or(Value::Nil);
        if let Value::ServerError(e) = reply {
            return Err(ConnError::Redis(e.into()));
        }
        let map =
            parse_slots(&reply, node).map_err(|e| cluster_error(format!("node {node}: {e}")))?;
        if map.ranges.is_empty() {
            return Err(cluster_error(format!("node {node} knows no slot's master")));
        }
        Ok(map)
    }

    /// Sends the `count` commands of `pipe` in one round trip to the master serving their
    /// slot, following redirects.
    pub(crate) async fn send(
        &self,
        pipe: &Pipeline,
        count: usize,
    ) -> Result<Vec<Value>, ConnError> {
        let key = routing_key(pipe)
            .ok_or_else(|| cluster_error("a call without a key cannot be routed".to_owned()))?;
        let slot = slot_of(&key);
        let mut target: Option<Redirect> = None;
        for _ in 0..=MAX_REDIRECTS {
            let (node, ask) = match target.take() {
                Some(Redirect::Moved(node)) => (node, false),
                Some(Redirect::Ask(node)) => (node, true),
                None => (self.route(slot).await?, false),
            };
            let conn = self.conn(&node)?;
            let answer = if ask {
                conn.send(&asking(pipe), count * 2)
                    .await
                    .map(|r| r.into_iter().skip(1).step_by(2).collect())
            } else {
                conn.send(pipe, count).await
            };
            let replies = answer.inspect_err(|e| {
                if unreachable(e) {
                    self.lock().stale = true;
                }
            })?;
            match redirect(&replies) {
                None => return Ok(replies),
                Some(Redirect::Moved(to)) => {
                    tracing::debug!(slot, %to, "redis cluster: slot moved");
                    self.lock().stale = true;
                    target = Some(Redirect::Moved(to));
                }
                Some(ask) => target = Some(ask),
            }
        }
        Err(cluster_error(format!(
            "slot {slot}: more than {MAX_REDIRECTS} redirects in a row (the nodes disagree about who serves it)"
        )))
    }

    /// The master serving `slot`, after reading the map again if it is stale.
    async fn route(&self, slot: u16) -> Result<Node, ConnError> {
        let (stale, generation) = {
            let state = self.lock();
            (state.stale, state.generation)
        };
        if stale {
            // A failed read leaves the old map, which may still be right for this slot.
            if let Err(e) = self.read_map(generation).await {
                tracing::debug!("redis cluster: slot map not read again: {e:?}");
            }
        }
        self.lock()
            .map
            .node(slot)
            .cloned()
            .ok_or_else(|| cluster_error(format!("no node serves slot {slot}")))
    }

    /// Loads `sources` into every master's script cache, in one round trip per master.
    /// Returns the replies of the first master whose loads did not all succeed, else the
    /// first master's.
    pub(crate) async fn load(&self, sources: &[&str]) -> Result<Vec<Value>, ConnError> {
        let mut pipe = ::redis::pipe();
        for src in sources {
            pipe.cmd("SCRIPT").arg("LOAD").arg(*src);
        }
        let masters = self.lock().map.masters();
        let loads = masters
            .iter()
            .map(|node| async { self.conn(node)?.send(&pipe, sources.len()).await });
        let mut first = None;
        for replies in futures::future::join_all(loads).await {
            let replies = replies?;
            if replies.iter().any(|r| matches!(r, Value::ServerError(_))) {
                return Ok(replies);
            }
            first.get_or_insert(replies);
        }
        first.ok_or_else(|| cluster_error("no master to load the scripts on".to_owned()))
    }
}

/// Whether `e` means the node could not be reached (it may have failed over).
fn unreachable(e: &ConnError) -> bool {
    match e {
        ConnError::Redis(e) => e.is_unrecoverable_error() || e.is_io_error() || e.is_timeout(),
        ConnError::Refused(_) => false,
    }
}

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag (the bytes between the first `{`
/// and the next `}`, if not empty), else of the whole key, modulo 16384 — the cluster
/// specification's rule. (The redis crate computes it too, but keeps the number private.)
fn slot_of(key: &[u8]) -> u16 {
    crc16_xmodem(hash_tag(key).unwrap_or(key)) % SLOTS
}

fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|b| *b == b'{')?;
    let rest = &key[open + 1..];
    let close = rest.iter().position(|b| *b == b'}')?;
    (close > 0).then(|| &rest[..close])
}

/// CRC-16/XMODEM (polynomial 0x1021, initial value 0), bit by bit: keys are short.
fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: u16) -> Node {
        Node {
            host: host.to_owned(),
            port,
        }
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn range(start: i64, end: i64, host: Value, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![host, Value::Int(port), bulk("id")]),
        ])
    }

    #[test]
    fn slots_follow_the_cluster_specification() {
        // The specification's check value and the examples Redis documents.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31c3);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"{user1000}.followers"), slot_of(b"user1000"));
        // An empty tag is no tag: the whole key hashes.
        assert_eq!(slot_of(b"foo{}{bar}"), crc16_xmodem(b"foo{}{bar}") % SLOTS);
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
        assert_eq!(slot_of(b"{}"), crc16_xmodem(b"{}") % SLOTS);
    }

    #[test]
    fn each_range_is_read_alone() {
        let asked = node("10.0.0.1", 7000);
        let long = "h".repeat(255);
        let reply = Value::Array(vec![
            range(0, 99, bulk("10.0.0.1"), 7000),
            // A one-slot range; an empty host is the node asked.
            range(200, 200, bulk(""), 7001),
            range(1000, 1000, bulk(&long), 7002),
            range(16000, 16383, bulk("10.0.0.3"), 7002),
            // Bad ones, each in a gap it would fill if it were taken.
            range(100, 110, bulk("10.0.0.4"), 70000),
            range(111, 120, bulk("10.0.0.4"), 0),
            range(121, 130, bulk("?"), 7003),
            range(131, 140, bulk(&"h".repeat(256)), 7003),
            range(150, 141, bulk("10.0.0.4"), 7003),
            range(300, 16384, bulk("10.0.0.4"), 7003),
            range(-1, 5, bulk("10.0.0.4"), 7003),
            range(400, 500, Value::Int(4), 7003),
            // Overlapping an earlier range.
            range(50, 60, bulk("10.0.0.4"), 7003),
            Value::Int(7),
        ]);
        let map = parse_slots(&reply, &asked).expect("an array");
        assert_eq!(
            map.ranges,
            vec![
                (0, 99, node("10.0.0.1", 7000)),
                (200, 200, node("10.0.0.1", 7001)),
                (1000, 1000, node(&long, 7002)),
                (16000, 16383, node("10.0.0.3", 7002)),
            ],
        );
        assert_eq!(map.node(0), Some(&node("10.0.0.1", 7000)));
        assert_eq!(map.node(99), Some(&node("10.0.0.1", 7000)));
        assert_eq!(map.node(100), None);
        assert_eq!(map.node(200), Some(&node("10.0.0.1", 7001)));
        assert_eq!(map.node(16383), Some(&node("10.0.0.3", 7002)));
        assert_eq!(map.masters().len(), 4);
        assert!(parse_slots(&Value::Int(1), &asked).is_err());
    }

    #[test]
    fn a_slot_without_a_range_has_no_node() {
        let map = parse_slots(
            &Value::Array(vec![range(10, 20, bulk("h"), 1)]),
            &node("h", 1),
        )
        .expect("an array");
        assert_eq!(map.node(9), None);
        assert_eq!(map.node(10), Some(&node("h", 1)));
        assert_eq!(map.node(20), Some(&node("h", 1)));
        assert_eq!(map.node(21), None);
    }

    #[test]
    fn redirects_name_their_node() {
        let server =
            |text: &str| match ::redis::parse_redis_value(format!("-{text}\r\n").as_bytes()) {
                Ok(v @ Value::ServerError(_)) => v,
                other => panic!("{other:?}"),
            };
        assert_eq!(
            redirect(&[Value::Okay, server("MOVED 3999 127.0.0.1:6381")]),
            Some(Redirect::Moved(node("127.0.0.1", 6381)))
        );
        assert_eq!(
            redirect(&[server("ASK 3999 redis-2.internal:7000")]),
            Some(Redirect::Ask(node("redis-2.internal", 7000)))
        );
        assert_eq!(redirect(&[server("ERR something")]), None);
        assert_eq!(redirect(&[server("MOVED 3999 127.0.0.1:0")]), None);
        assert_eq!(redirect(&[server("MOVED garbage")]), None);
        assert_eq!(redirect(&[Value::Int(1)]), None);
        // Messages name nodes the way addresses are written.
        assert_eq!(node("10.0.0.1", 7000).to_string(), "10.0.0.1:7000");
        assert_eq!(node("::1", 7000).to_string(), "[::1]:7000");
    }

    #[test]
    fn calls_route_by_their_first_key() {
        let mut pipe = ::redis::pipe();
        pipe.cmd("SCRIPT").arg("LOAD").arg("return 1");
        pipe.cmd("EVALSHA")
            .arg("abc")
            .arg(2)
            .arg("{lock}:a")
            .arg("{lock}:b");
        assert_eq!(routing_key(&pipe), Some(b"{lock}:a".to_vec()));
        let mut keyless = ::redis::pipe();
        keyless.cmd("EVALSHA").arg("abc").arg(0).arg("not a key");
        assert_eq!(routing_key(&keyless), None);
        let asked = asking(&pipe);
        let names: Vec<Vec<u8>> = asked
            .cmd_iter()
            .filter_map(|c| match c.args_iter().next() {
                Some(::redis::Arg::Simple(b)) => Some(b.to_vec()),
                _ => None,
            })
            .collect();
        assert_eq!(names, [&b"ASKING"[..], b"SCRIPT", b"ASKING", b"EVALSHA"]);
    }
}
