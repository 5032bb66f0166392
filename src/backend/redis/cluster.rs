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
//! migrated) sends it once to the named node after `ASKING`; a node that cannot be reached, or
//! that a call gave up waiting for (a frozen node keeps its connections open and answers
//! nothing, so the caller's bound runs out first), marks the map stale too and becomes a
//! *suspect*. The next call after a stale mark reads the map again (one read at a time;
//! callers waiting meanwhile share it), asking the nodes that answer first and the suspects
//! last, and asking the next node too whenever one has not answered within a quarter of the
//! request timeout: so a frozen master costs a map read a quarter of the call's bound, not the
//! whole of it, and a failover is followed at the first call after the cluster promoted a
//! replica. A suspect is logged as a warning, and again every 10 s while calls still find it
//! silent.
//!
//! Every node connection carries the configured credentials, and the nodes are whatever the
//! slot map and the redirects name — not only the seed the operator gave. So a map naming more
//! than [`MAX_CLUSTER_MASTERS`] masters is refused, the connections one client holds are
//! capped, and a password over plain TCP is warned about when the cluster connection is made.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ::redis::{ErrorKind, Pipeline, RedisError, ServerErrorKind, Value};
use futures::StreamExt;
use futures::stream::FuturesUnordered;

use super::server::{ConnError, Connector, Managed};

/// How many redirects one call follows before it fails: a slot moves once per resharding
/// step, so more than a few in a row means the nodes disagree about who serves it.
const MAX_REDIRECTS: usize = 5;

/// The number of hash slots of a Redis Cluster.
const SLOTS: u16 = 16384;

/// The most masters a slot map may name: Redis Cluster is designed for at most 1,000 nodes, so
/// a map naming more is not a real cluster's, and tenure refuses it (keeping the map it had)
/// rather than open a connection — carrying the credentials — to each of its masters.
pub const MAX_CLUSTER_MASTERS: usize = 1000;

/// The most node connections one client holds: the masters, the seed, and the nodes
/// redirects named since the map was last read (each `MOVED` makes the next call read it
/// again, which drops the connections to nodes that are no masters).
const MAX_CONNECTIONS: usize = MAX_CLUSTER_MASTERS + 64;

/// A map read asks one more node each time this share of the request timeout passes without
/// an answer (a quarter: a call that met a frozen master still has most of its bound left for
/// the new master once the map names it).
const ASK_SHARE: u32 = 4;

/// How often a node that calls still find silent is logged again.
const SILENT_LOG_EVERY: Duration = Duration::from_secs(10);

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

    /// The masters, each once, in slot order.
    fn masters(&self) -> Vec<Node> {
        let mut seen: HashSet<&Node> = HashSet::new();
        self.ranges
            .iter()
            .filter(|(_, _, node)| seen.insert(node))
            .map(|(_, _, node)| node.clone())
            .collect()
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

/// Refuses a map (read from `asked`) naming more than [`MAX_CLUSTER_MASTERS`] masters.
fn within_cap(map: &SlotMap, asked: &Node) -> Result<(), ConnError> {
    let masters = map.masters().len();
    if masters > MAX_CLUSTER_MASTERS {
        return Err(hostile_answer(format!(
            "node {asked}'s slot map names {masters} masters; tenure accepts at most \
             {MAX_CLUSTER_MASTERS} (MAX_CLUSTER_MASTERS) and connects to none of them"
        )));
    }
    Ok(())
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

/// A node's answer that no real cluster gives, in the redis crate's form (a protocol error).
fn hostile_answer(what: String) -> ConnError {
    ConnError::Redis(RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "redis cluster",
        what,
    )))
}

/// A node that did not answer its last request.
struct Suspect {
    /// When it first did not answer.
    since: Instant,
    /// When that was last logged (calls log it; map reads only count it).
    logged: Option<Instant>,
}

/// What the connection knows of the cluster.
#[derive(Default)]
struct State {
    /// Counts map reads, so that callers that saw the same stale map read it once.
    generation: u64,
    map: SlotMap,
    stale: bool,
    /// A connection per node (the masters of the map, the seed, redirect targets until the
    /// next read), made when first used; at most [`MAX_CONNECTIONS`].
    conns: HashMap<Node, Arc<Managed>>,
    /// Nodes (of `conns`) whose last request went unanswered: asked last for the map.
    suspects: HashMap<Node, Suspect>,
}

impl State {
    /// Whom to ask for the map, in order: the masters and the seed that answer, in slot order;
    /// then the suspects, the one that went silent last asked last.
    fn map_sources(&self, seed: &Node) -> Vec<Node> {
        let mut nodes = self.map.masters();
        if !nodes.contains(seed) {
            nodes.push(seed.clone());
        }
        nodes.sort_by_key(|n| self.suspects.get(n).map(|s| s.since));
        nodes
    }
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
        if seed.password_in_clear() {
            tracing::warn!(
                "redis cluster: the password goes over plain TCP (redis://) to every node the \
                 cluster names in its slot map or in a MOVED/ASK redirect, not only to the seed \
                 {host}:{port}; use rediss:// with a CA that vouches only for your nodes"
            );
        }
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

    /// The connection to `node`, made on first use (unless [`MAX_CONNECTIONS`] are open).
    fn conn(&self, node: &Node) -> Result<Arc<Managed>, ConnError> {
        let mut state = self.lock();
        if let Some(c) = state.conns.get(node) {
            return Ok(c.clone());
        }
        if state.conns.len() >= MAX_CONNECTIONS {
            state.stale = true;
            return Err(cluster_error(format!(
                "node {node}: not connecting, {MAX_CONNECTIONS} node connections are open already \
                 (the slot map and redirects named that many nodes)"
            )));
        }
        let connector = self
            .seed
            .for_node(&node.host, node.port)
            .map_err(|e| cluster_error(format!("node {node}: {e}")))?;
        let conn = Managed::new(connector);
        state.conns.insert(node.clone(), conn.clone());
        Ok(conn)
    }

    /// A call to `node` went unanswered (`why`): the map is read again before the next call,
    /// from other nodes first. Logged as a warning, and again every [`SILENT_LOG_EVERY`] while
    /// calls still find the node silent.
    fn call_unanswered(&self, node: &Node, why: &str) {
        let now = Instant::now();
        let silent_since = {
            let mut state = self.lock();
            state.stale = true;
            let suspect = state.suspects.entry(node.clone()).or_insert(Suspect {
                since: now,
                logged: None,
            });
            let first = match suspect.logged {
                Some(t) if now.duration_since(t) < SILENT_LOG_EVERY => return,
                Some(_) => false,
                None => true,
            };
            suspect.logged = Some(now);
            (!first).then(|| now.duration_since(suspect.since))
        };
        match silent_since {
            None => tracing::warn!(
                %node,
                "redis cluster: node {node} did not answer ({why}); reading the slot map again, \
                 from other nodes first. Calls for its slots fail until it answers or the \
                 cluster promotes a replica"
            ),
            Some(d) => tracing::warn!(
                %node,
                "redis cluster: node {node} has not answered for {d:.0?} ({why}), and the slot \
                 map still names it; waiting for it to answer or for the cluster to promote a \
                 replica"
            ),
        }
    }

    /// A map read got no answer from `node` in time: asked last next time, not logged (the
    /// read went on to another node).
    fn ask_unanswered(&self, node: &Node) {
        self.lock().suspects.entry(node.clone()).or_insert(Suspect {
            since: Instant::now(),
            logged: None,
        });
    }

    /// `node` answered: no longer a suspect.
    fn answered(&self, node: &Node) {
        let was = self.lock().suspects.remove(node);
        if let Some(Suspect {
            since,
            logged: Some(_),
        }) = was
        {
            tracing::info!(%node, "redis cluster: node {node} answers again after {:.1?}", since.elapsed());
        }
    }

    /// Reads the map again unless another caller did since `seen` (a generation).
    async fn read_map(&self, seen: u64) -> Result<(), ConnError> {
        let _reading = self.reading.lock().await;
        let sources = {
            let state = self.lock();
            if state.generation != seen {
                return Ok(());
            }
            state.map_sources(&self.seed_node)
        };
        let (from, map) = self.ask_for_map(sources).await?;
        let mut state = self.lock();
        let (old, new) = (state.map.masters(), map.masters());
        if state.generation > 0 && old != new {
            let gone: Vec<String> = old
                .iter()
                .filter(|n| !new.contains(n))
                .map(Node::to_string)
                .collect();
            let added: Vec<String> = new
                .iter()
                .filter(|n| !old.contains(n))
                .map(Node::to_string)
                .collect();
            tracing::info!(
                node = %from,
                "redis cluster: the slot map changed: masters {added:?} new, {gone:?} gone"
            );
        }
        let seed = &self.seed_node;
        state.conns.retain(|n, _| new.contains(n) || n == seed);
        state.suspects.retain(|n, _| new.contains(n) || n == seed);
        state.map = map;
        state.stale = false;
        state.generation += 1;
        Ok(())
    }

    /// How long a node may take to answer before it counts as silent: a share of the request
    /// timeout.
    fn ask_budget(&self) -> Duration {
        self.seed.request_timeout() / ASK_SHARE
    }

    /// Asks `sources` for the map in turn, the next one also whenever no answer came within a
    /// share of the request timeout, or at once when one failed; the first map wins.
    async fn ask_for_map(&self, sources: Vec<Node>) -> Result<(Node, SlotMap), ConnError> {
        let budget = self.ask_budget();
        let mut sources = sources.into_iter();
        let mut asking = FuturesUnordered::new();
        let mut waiting_on: Vec<Node> = Vec::new();
        let mut last = None;
        let mut ask_next = true;
        loop {
            if ask_next && let Some(node) = sources.next() {
                waiting_on.push(node.clone());
                asking.push(async move {
                    let read = self.read_map_from(&node).await;
                    (node, read)
                });
            }
            if asking.is_empty() {
                return Err(last.unwrap_or_else(|| {
                    cluster_error("no node to read the slot map from".to_owned())
                }));
            }
            tokio::select! {
                Some((node, read)) = asking.next() => {
                    waiting_on.retain(|n| *n != node);
                    match read {
                        Ok(map) => {
                            self.answered(&node);
                            return Ok((node, map));
                        }
                        Err(e) => {
                            tracing::debug!(%node, "redis cluster: cannot read the slot map here");
                            if unreachable(&e) {
                                self.ask_unanswered(&node);
                            } else {
                                self.answered(&node);
                            }
                            last = Some(e);
                            ask_next = true;
                        }
                    }
                }
                () = tokio::time::sleep(budget) => {
                    for node in &waiting_on {
                        self.ask_unanswered(node);
                    }
                    ask_next = true;
                }
            }
        }
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
        within_cap(&map, node)?;
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
            let call = InFlight {
                cluster: self,
                node: &node,
                sent: Instant::now(),
            };
            let answer = if ask {
                conn.send(&asking(pipe), count * 2)
                    .await
                    .map(|r| r.into_iter().skip(1).step_by(2).collect())
            } else {
                conn.send(pipe, count).await
            };
            call.settle(answer.as_ref().err());
            let replies = answer?;
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

/// A call on its way to `node`. Dropped unsettled after the ask budget, its caller stopped
/// waiting for the answer — the caller's bound ran out, which is how a frozen node shows (its
/// connection stays open, the answer never comes) — so the node counts as not answering. (A
/// caller that leaves sooner, say at shutdown, says nothing about the node.)
struct InFlight<'a> {
    cluster: &'a Cluster,
    node: &'a Node,
    sent: Instant,
}

impl InFlight<'_> {
    /// The call ended: with an answer, or with `error`.
    fn settle(self, error: Option<&ConnError>) {
        // Not dropped: the outcome is known (it holds only references, nothing leaks).
        let this = std::mem::ManuallyDrop::new(self);
        match error {
            Some(e) if unreachable(e) => {
                let why = match e {
                    ConnError::Redis(e) if e.is_timeout() => "the request timed out",
                    _ => "the connection failed",
                };
                this.cluster.call_unanswered(this.node, why);
            }
            _ => this.cluster.answered(this.node),
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.sent.elapsed() >= self.cluster.ask_budget() {
            self.cluster
                .call_unanswered(self.node, "the caller stopped waiting for the answer");
        }
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

    /// A map of `n` one-slot masters on distinct ports.
    fn one_slot_masters(n: u16) -> SlotMap {
        SlotMap {
            ranges: (0..n).map(|i| (i, i, node("10.0.0.1", 1000 + i))).collect(),
        }
    }

    #[test]
    fn a_map_naming_more_masters_than_the_cap_is_refused() {
        let asked = node("10.0.0.1", 7000);
        let cap = u16::try_from(MAX_CLUSTER_MASTERS).expect("a slot count");
        assert!(within_cap(&one_slot_masters(cap), &asked).is_ok());
        // Many ranges of few masters are fine: the cap counts masters.
        let mut few = one_slot_masters(cap);
        few.ranges
            .extend((cap..SLOTS).map(|i| (i, i, node("10.0.0.1", 1000))));
        assert_eq!(few.masters().len(), MAX_CLUSTER_MASTERS);
        assert!(within_cap(&few, &asked).is_ok());
        let Err(ConnError::Redis(e)) = within_cap(&one_slot_masters(cap + 1), &asked) else {
            panic!("one master too many was taken");
        };
        assert_eq!(
            e.kind(),
            ErrorKind::UnexpectedReturnType,
            "a protocol error"
        );
        let text = e.to_string();
        assert!(
            text.contains("10.0.0.1:7000's slot map names 1001 masters"),
            "{text}"
        );
    }

    fn cluster() -> Cluster {
        let info = ::redis::IntoConnectionInfo::into_connection_info("redis://127.0.0.1:1")
            .expect("a URL");
        let seed = Connector::new(info, None, Duration::from_secs(1), Duration::from_secs(1))
            .expect("no TLS");
        Cluster {
            seed,
            seed_node: node("127.0.0.1", 1),
            state: Mutex::default(),
            reading: tokio::sync::Mutex::new(()),
        }
    }

    #[test]
    fn a_client_holds_at_most_max_connections() {
        let cluster = cluster();
        let ports = 1..=u16::try_from(MAX_CONNECTIONS).expect("a port count");
        for port in ports.clone() {
            cluster
                .conn(&node("10.0.0.1", port))
                .expect("under the cap");
        }
        assert!(!cluster.lock().stale);
        let Err(ConnError::Redis(e)) = cluster.conn(&node("10.0.0.2", 1)) else {
            panic!("a connection over the cap");
        };
        assert!(
            e.to_string().contains("node connections are open already"),
            "{e}"
        );
        assert!(
            cluster.lock().stale,
            "the next call reads the map (and prunes)"
        );
        assert_eq!(cluster.lock().conns.len(), MAX_CONNECTIONS);
        // Those already open stay usable.
        assert!(cluster.conn(&node("10.0.0.1", 1)).is_ok());
    }

    #[test]
    fn the_map_is_asked_of_silent_nodes_last() {
        let cluster = cluster();
        let (a, b, c, seed) = (
            node("10.0.0.1", 1),
            node("10.0.0.2", 1),
            node("10.0.0.3", 1),
            node("127.0.0.1", 1),
        );
        cluster.lock().map = SlotMap {
            ranges: vec![(0, 9, a.clone()), (10, 19, b.clone()), (20, 29, c.clone())],
        };
        let sources = || cluster.lock().map_sources(&cluster.seed_node);
        assert_eq!(sources(), [a.clone(), b.clone(), c.clone(), seed.clone()]);
        // a went silent first, then the seed: both last, the seed (silent last) at the end.
        // (A millisecond apart: the order is by when each went silent.)
        let tick = || std::thread::sleep(Duration::from_millis(1));
        cluster.call_unanswered(&a, "test");
        tick();
        cluster.ask_unanswered(&seed);
        assert!(cluster.lock().stale, "a call's silence marks the map stale");
        assert_eq!(sources(), [b.clone(), c.clone(), a.clone(), seed.clone()]);
        // A map read's silence does not mark it stale; an answer clears a suspect.
        cluster.lock().stale = false;
        tick();
        cluster.ask_unanswered(&b);
        assert!(!cluster.lock().stale);
        cluster.answered(&a);
        assert_eq!(sources(), [a, c, seed, b]);
        // A seed that serves slots is asked once.
        cluster
            .lock()
            .map
            .ranges
            .push((30, 39, node("127.0.0.1", 1)));
        assert_eq!(sources().len(), 4);
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
