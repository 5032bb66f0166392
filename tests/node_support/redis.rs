//! Redis for the node tests: a `redis-server` started inside the node's network namespace
//! (pods reach it on the node's address; nothing of it is on the host's network), a small RESP
//! client that connects from inside that namespace, and a watch of a lock's key (every grant
//! and release with its arrival time: [`super::Terms`], as [`super::LeaseWatch`] for a Lease).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{NODE_IP, Node, Terms, fresh_dir, run, tail, wait_for};

/// The password of Redis's `default` user (the tests' own connections).
pub const ADMIN_PASSWORD: &str = "node-admin-pw-5d1e";

/// The ACL rules the README documents for tenure's user (README "Redis": "An ACL user").
pub const DOCUMENTED_ACL_RULES: &str = "resetkeys ~tenure:* resetchannels &tenure:* -@all \
     +evalsha +script|load +subscribe +unsubscribe +ping \
     +get +set +setrange +incr +pexpire +pttl +publish +time +strlen \
     +zadd +zrem +zscore +zrangebyscore +zremrangebyscore +hset +hdel +hmget";

/// Runs `f` on a thread that has entered the network namespace of `pid` (a network
/// namespace may be entered by one thread of a multi-threaded process; the thread ends right
/// after, and the sockets it made stay in that namespace).
fn in_netns<T: Send + 'static>(pid: u32, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
            .unwrap_or_else(|e| panic!("netns of {pid}: {e}"));
        // SAFETY: setns on this thread only, which ends after `f`.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap_or_else(|_| panic!("netns thread panicked"))
}

/// A TCP connection to `NODE_IP:port` from inside the node's network namespace.
pub fn connect_in_node(node_pid: u32, port: u16) -> std::io::Result<TcpStream> {
    in_netns(node_pid, move || {
        TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([198, 18, 0, 1], port)),
            Duration::from_secs(2),
        )
    })
}

/// A private `redis-server` listening on the node's address only, with a password for the
/// `default` user and an ACL user for tenure; stopped on drop (and killed with this process:
/// parent-death signal).
pub struct RedisServer {
    child: Option<Child>,
    node_pid: u32,
    pub port: u16,
    pub user: String,
    pub password: String,
    dir: PathBuf,
}

impl RedisServer {
    /// Starts it in `node`'s network namespace: ACL user `user` with `password` and the
    /// documented rules.
    pub fn start(node: &Node, user: &str, password: &str) -> Self {
        let dir = fresh_dir("redis");
        // A port free on the node's address (the namespace is this node's own: nothing else
        // binds between this and redis-server's bind).
        let port = node
            .listen()
            .local_addr()
            .unwrap_or_else(|e| panic!("{e}"))
            .port();
        let conf = dir.join("redis.conf");
        std::fs::write(
            &conf,
            format!(
                "bind {NODE_IP}\nport {port}\nprotected-mode yes\nsave \"\"\nappendonly no\n\
                 dir {d}\ndaemonize no\nlogfile {d}/redis.log\n\
                 user default on >{ADMIN_PASSWORD} ~* &* +@all\n\
                 user {user} on >{password} {DOCUMENTED_ACL_RULES}\n",
                d = dir.display()
            ),
        )
        .unwrap_or_else(|e| panic!("redis.conf: {e}"));
        let mut cmd = Command::new("nsenter");
        cmd.args([
            "-t",
            &node.inner_pid.to_string(),
            "-n",
            "--",
            "redis-server",
        ])
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        // SAFETY: prctl in the child between fork and exec (async-signal-safe). nsenter
        // without -p execs redis-server in place, which keeps the parent-death signal.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!("cannot start redis-server (Debian package redis-server): {e}")
        });
        let mut server = RedisServer {
            child: Some(child),
            node_pid: node.inner_pid,
            port,
            user: user.to_owned(),
            password: password.to_owned(),
            dir,
        };
        wait_for(Duration::from_secs(20), "redis-server answering", || {
            if let Some(c) = server.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!(
                    "redis-server exited ({status}):\n{}",
                    tail(&server.dir.join("redis.log"), 20)
                );
            }
            let mut c = server.admin().ok()?;
            (c.cmd(&["PING"]).ok()? == Resp::Simple("PONG".into())).then_some(())
        });
        server
    }

    /// `redis://NODE_IP:PORT` (no credentials: the chart's value).
    pub fn url(&self) -> String {
        format!("redis://{NODE_IP}:{}", self.port)
    }

    /// A connection as the `default` (admin) user.
    pub fn admin(&self) -> std::io::Result<Resp0> {
        let mut c = Resp0::connect(self.node_pid, self.port)?;
        match c.cmd(&["AUTH", "default", ADMIN_PASSWORD])? {
            Resp::Simple(_) => Ok(c),
            other => Err(std::io::Error::other(format!("AUTH: {other:?}"))),
        }
    }

    /// The lock `lease`'s key as it is now.
    pub fn holder(&self, lease: &str) -> KeyState {
        let mut c = self
            .admin()
            .unwrap_or_else(|e| panic!("redis admin connection: {e}"));
        KeyState::of(
            &c.cmd(&["GET", &lock_key(lease)])
                .unwrap_or_else(|e| panic!("GET: {e}")),
        )
    }

    /// `tenure status --output json` run with the static binary inside the node's network
    /// namespace, as tenure's user: what tenure itself reports for `lease`.
    pub fn tenure_status(&self, lease: &str) -> Value {
        let bin = std::env::var("TENURE_NODE_TENURE_BIN").unwrap_or_default();
        run(
            Command::new("nsenter")
                .args(["-t", &self.node_pid.to_string(), "-n", "--", &bin])
                .args(["status", "--lease", lease, "--backend", &self.url()])
                .args(["--redis-username", &self.user, "--output", "json"])
                .env("TENURE_REDIS_PASSWORD", &self.password),
            None,
        )
        .json()
    }

    pub fn log(&self) -> String {
        tail(&self.dir.join("redis.log"), 30)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on the redis-server this test started.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while !matches!(c.try_wait(), Ok(Some(_))) {
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The key of lock `lease` with tenure's default prefix (README "Redis", key layout).
pub fn lock_key(lease: &str) -> String {
    format!("tenure:{{{lease}}}")
}

/// A RESP reply.
#[derive(Clone, Debug, PartialEq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Resp>),
}

/// A minimal RESP2 client: enough for AUTH, PING and GET.
pub struct Resp0 {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Resp0 {
    pub fn connect(node_pid: u32, port: u16) -> std::io::Result<Self> {
        let stream = connect_in_node(node_pid, port)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.set_nodelay(true)?;
        let reader = BufReader::new(stream.try_clone()?);
        Ok(Resp0 { stream, reader })
    }

    pub fn cmd(&mut self, args: &[&str]) -> std::io::Result<Resp> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        self.stream.write_all(&out)?;
        self.read()
    }

    fn read(&mut self) -> std::io::Result<Resp> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end_matches("\r\n");
        let (kind, rest) = line.split_at(1.min(line.len()));
        let num = || {
            rest.parse::<i64>()
                .map_err(|e| std::io::Error::other(format!("bad RESP {line:?}: {e}")))
        };
        Ok(match kind {
            "+" => Resp::Simple(rest.to_owned()),
            "-" => Resp::Error(rest.to_owned()),
            ":" => Resp::Int(num()?),
            "$" => {
                let n = num()?;
                if n < 0 {
                    Resp::Bulk(None)
                } else {
                    let mut buf = vec![0; n as usize + 2];
                    std::io::Read::read_exact(&mut self.reader, &mut buf)?;
                    buf.truncate(n as usize);
                    Resp::Bulk(Some(buf))
                }
            }
            "*" => {
                let n = num()?;
                let mut items = Vec::new();
                for _ in 0..n.max(0) {
                    items.push(self.read()?);
                }
                Resp::Array(items)
            }
            _ => return Err(std::io::Error::other(format!("bad RESP line {line:?}"))),
        })
    }
}

/// A lock's key, decoded: `+<holder token 32><watched 1><previous 32><fencing>:<identity>`
/// while held, `~` first once released (README "Redis", key layout).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct KeyState {
    /// The holder's identity; empty when the lock is free (released or no key).
    pub holder: String,
    /// The fencing token in the key (0 when there is no key).
    pub token: u64,
}

impl KeyState {
    pub fn of(reply: &Resp) -> Self {
        let Resp::Bulk(Some(v)) = reply else {
            return KeyState::default();
        };
        let v = String::from_utf8_lossy(v);
        let held = v.starts_with('+');
        let rest = v.get(66..).unwrap_or_default();
        let (token, identity) = rest.split_once(':').unwrap_or_else(|| {
            panic!("a lock key not in tenure's layout: {v:?}");
        });
        KeyState {
            holder: if held {
                identity.to_owned()
            } else {
                String::new()
            },
            token: token
                .parse()
                .unwrap_or_else(|e| panic!("fencing token {token:?}: {e}")),
        }
    }
}

/// Polls the lock's key every 10 ms from a thread in the node's network namespace and keeps
/// every change (holder or token) with the instant it was first seen, until dropped.
pub struct RedisWatch {
    terms: Terms,
    stop: Arc<AtomicBool>,
}

impl RedisWatch {
    pub fn start(server: &RedisServer, lease: &str) -> Self {
        let terms = Terms::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (t, st) = (terms.clone(), stop.clone());
        let (pid, port, key) = (server.node_pid, server.port, lock_key(lease));
        std::thread::spawn(move || {
            let mut conn: Option<Resp0> = None;
            while !st.load(Ordering::SeqCst) {
                if conn.is_none() {
                    conn = Resp0::connect(pid, port).ok().and_then(|mut c| {
                        matches!(
                            c.cmd(&["AUTH", "default", ADMIN_PASSWORD]),
                            Ok(Resp::Simple(_))
                        )
                        .then_some(c)
                    });
                }
                match conn.as_mut().map(|c| c.cmd(&["GET", &key])) {
                    Some(Ok(reply)) => {
                        let state = KeyState::of(&reply);
                        // No key (expired): the last term's token is still the highest.
                        let token = match state.token {
                            0 => t.last_token(),
                            token => token,
                        };
                        t.record(state.holder, token);
                    }
                    Some(Err(_)) | None => conn = None,
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        RedisWatch { terms, stop }
    }
}

impl std::ops::Deref for RedisWatch {
    type Target = Terms;

    fn deref(&self) -> &Terms {
        &self.terms
    }
}

impl Drop for RedisWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
