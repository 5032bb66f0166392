//! Starts and stops Debian's `redis-server` for the Redis tests: one private server per test,
//! on a free loopback port, in its own temporary directory, optionally with TLS (a CA made with
//! the `openssl` CLI) and ACL users. The tests never skip: without `redis-server` (or `openssl`
//! for TLS) on the PATH they fail, saying what to install.

#![allow(dead_code)] // Each test binary uses a different part of the harness.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The ACL rules the Redis backend's docs tell operators to grant (without the user's name
/// and password): keys and channels under `tenure:`, and the commands its scripts run (the
/// `z…` and `h…` ones for group membership).
pub const DOCUMENTED_ACL_RULES: &str = "resetkeys ~tenure:* resetchannels &tenure:* -@all \
     +evalsha +script|load +subscribe +unsubscribe +ping \
     +get +set +setrange +incr +pexpire +pttl +publish +time +strlen \
     +zadd +zrem +zscore +zrangebyscore +zremrangebyscore +hset +hdel +hmget";

/// An ACL `user` line (for [`Options::acl_user`]): `name` with `password` and the documented
/// rules.
pub fn documented_acl_user(name: &str, password: &str) -> String {
    format!("{name} on >{password} {DOCUMENTED_ACL_RULES}")
}

/// The password of the `default` user when a server is started with ACL users.
pub const ADMIN_PASSWORD: &str = "admin-pw-8f2c";

mod tempdir;
pub use tempdir::TempDir;

/// A CA and a server certificate for 127.0.0.1 / localhost signed by it, made with `openssl`.
#[derive(Debug)]
pub struct Tls {
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `openssl` ({e}): the TLS tests need the openssl CLI (Debian package `openssl`)"
            )
        });
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes a self-signed CA `<name>.crt`/`<name>.key` in `dir`.
pub fn make_ca(dir: &Path, name: &str) -> PathBuf {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-subj",
            &format!("/CN=tenure test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
    dir.join(format!("{name}.crt"))
}

/// Makes a CA and a server certificate signed by it in `dir`.
pub fn make_tls(dir: &Path) -> Tls {
    let ca_cert = make_ca(dir, "ca");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap_or_else(|e| panic!("cannot write server.ext: {e}"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    );
    Tls {
        ca_cert,
        server_cert: dir.join("server.crt"),
        server_key: dir.join("server.key"),
    }
}

/// How to start a server.
#[derive(Debug, Default, Clone)]
pub struct Options {
    tls: bool,
    acl_users: Vec<String>,
    cluster: bool,
    /// `cluster-node-timeout` in ms (2000 unless set).
    node_timeout_ms: Option<u64>,
    /// A replica's first sync starts at once (no diskless-sync delay).
    quick_sync: bool,
}

impl Options {
    /// Serve TLS only (no plain port), with a CA made by the harness.
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Adds an ACL `user ...` line (without the leading `user`). Turns on a password for the
    /// default user: [`ADMIN_PASSWORD`].
    pub fn acl_user(mut self, rule: &str) -> Self {
        self.acl_users.push(rule.to_owned());
        self
    }

    /// Cluster mode: the node serves no slot until [`RedisCluster`] assigns them.
    fn cluster(mut self) -> Self {
        self.cluster = true;
        self
    }

    /// `cluster-node-timeout`: how long a node may not answer before the others count it as
    /// failing (then a replica of a failed master is promoted about a second later).
    pub fn cluster_node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout_ms = Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        self
    }

    pub fn start(self) -> RedisServer {
        RedisServer::start_with(self)
    }
}

/// A Redis Cluster of private servers on loopback, each master serving a share of the 16384
/// slots, with or without replicas; killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    /// The masters first (as created), then the replicas, if any.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `n` (at least 3, what `redis-cli --cluster create` asks) masters and joins them.
    pub fn start(n: usize) -> Self {
        Self::start_with(n, &Options::default())
    }

    /// Like [`start`](Self::start), every node with `opts` (e.g. ACL users).
    pub fn start_with(n: usize, opts: &Options) -> Self {
        Self::create(n, 0, opts)
    }

    /// Starts `masters` masters with one replica each, `cluster-node-timeout` 1 s: a master
    /// that stops answering is failed over to its replica within a few seconds.
    pub fn start_replicated(masters: usize) -> Self {
        let mut opts = Options::default().cluster_node_timeout(Duration::from_secs(1));
        opts.quick_sync = true;
        Self::create(masters, 1, &opts)
    }

    fn create(masters: usize, replicas: usize, opts: &Options) -> Self {
        let n = masters * (1 + replicas);
        let nodes: Vec<RedisServer> = (0..n).map(|_| opts.clone().cluster().start()).collect();
        let mut create = Command::new("redis-cli");
        if !opts.acl_users.is_empty() {
            create.env("REDISCLI_AUTH", ADMIN_PASSWORD);
        }
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli (Debian package redis-tools): {e}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut cluster = Self { nodes };
        let deadline = Instant::now() + Duration::from_secs(30);
        let known = Some(cluster.nodes.len().to_string());
        while !cluster.nodes.iter().all(|n| {
            n.cluster_info("cluster_state").as_deref() == Some("ok")
                && n.cluster_info("cluster_known_nodes") == known
                && (n.info_field("replication", "role").as_deref() == Some("master")
                    || n.info_field("replication", "master_link_status").as_deref() == Some("up"))
        }) {
            assert!(
                Instant::now() < deadline,
                "the cluster did not settle in 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
            .nodes
            .sort_by_key(|n| n.info_field("replication", "role").as_deref() != Some("master"));
        let masters_seen = cluster
            .nodes
            .iter()
            .filter(|n| n.info_field("replication", "role").as_deref() == Some("master"))
            .count();
        assert_eq!(
            masters_seen, masters,
            "{n} nodes, {masters} of them masters"
        );
        cluster
    }

    /// The index in [`nodes`](Self::nodes) of the master serving `slot`, as node `via` sees it
    /// (ask one that answers).
    pub fn master_of(&self, via: usize, slot: u16) -> usize {
        let redis::Value::Array(ranges) = self.nodes[via].cmd(&["CLUSTER", "SLOTS"]) else {
            panic!("CLUSTER SLOTS is not an array");
        };
        for range in ranges {
            let redis::Value::Array(parts) = range else {
                continue;
            };
            let (
                Some(redis::Value::Int(lo)),
                Some(redis::Value::Int(hi)),
                Some(redis::Value::Array(master)),
            ) = (parts.first(), parts.get(1), parts.get(2))
            else {
                continue;
            };
            if (*lo..=*hi).contains(&i64::from(slot))
                && let Some(redis::Value::Int(port)) = master.get(1)
            {
                return self.index_of(u16::try_from(*port).unwrap_or(0));
            }
        }
        panic!("no node serves slot {slot}");
    }

    /// The index of the replica of master `master`.
    pub fn replica_of(&self, master: usize) -> usize {
        let port = self.nodes[master].port().to_string();
        (0..self.nodes.len())
            .find(|&i| {
                i != master
                    && self.nodes[i]
                        .info_field("replication", "master_port")
                        .as_deref()
                        == Some(port.as_str())
            })
            .unwrap_or_else(|| panic!("node {master} has no replica"))
    }

    /// The index of the node listening on `port`.
    pub fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// A seed node's URL.
    pub fn url(&self) -> String {
        self.nodes[0].url()
    }

    /// `calls` of a command summed over every node's INFO commandstats.
    pub fn command_calls(&self, command: &str) -> u64 {
        self.nodes.iter().map(|n| n.command_calls(command)).sum()
    }
}

/// A private `redis-server`, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    opts: Options,
    tls: Option<Tls>,
    dir: TempDir,
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("no free port: {e}"));
    l.local_addr()
        .unwrap_or_else(|e| panic!("no local addr: {e}"))
        .port()
}

fn check_installed() {
    match Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("`redis-server --version` failed ({s})"),
        Err(e) => panic!(
            "cannot run `redis-server` ({e}): the Redis tests need Debian's redis-server on the PATH \
             (apt-get install redis-server redis-tools); they do not skip"
        ),
    }
}

impl RedisServer {
    /// Commands the clients sent (not those the scripts called, nor the harness's own INFO
    /// and CONFIG), by name, from INFO commandstats: how round trips are counted.
    pub fn top_level_calls(&self) -> std::collections::BTreeMap<String, u64> {
        const NOT_TOP_LEVEL: &[&str] = &[
            "get", "set", "setrange", "incr", "pexpire", "pttl", "publish", "time", "info",
        ];
        let info = match self.cmd(&["INFO", "commandstats"]) {
            redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            redis::Value::VerbatimString { text, .. } => text,
            other => panic!("INFO answered {other:?}"),
        };
        info.lines()
            .filter_map(|l| {
                let (cmd, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
                Some((cmd.to_owned(), calls.parse().ok()?))
            })
            .filter(|(cmd, _)| !NOT_TOP_LEVEL.contains(&cmd.as_str()) && !cmd.starts_with("config"))
            .collect()
    }

    /// A plain server without persistence.
    pub fn start() -> Self {
        Options::default().start()
    }

    pub fn options() -> Options {
        Options::default()
    }

    fn start_with(opts: Options) -> Self {
        check_installed();
        let dir = TempDir::new("redis");
        let tls = opts.tls.then(|| make_tls(dir.path()));
        let mut server = Self {
            child: None,
            port: 0,
            opts,
            tls,
            dir,
        };
        let mut last_err = String::new();
        for _ in 0..5 {
            server.port = free_port();
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last_err = e,
            }
        }
        panic!("redis-server did not start: {last_err}");
    }

    fn config(&self) -> String {
        let dir = self.dir.path().display();
        let mut c = format!(
            "bind 127.0.0.1\nsave \"\"\nappendonly no\ndir {dir}\ndaemonize no\nlogfile {dir}/redis.log\n"
        );
        match &self.tls {
            Some(t) => c.push_str(&format!(
                "port 0\ntls-port {}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients no\n",
                self.port,
                t.server_cert.display(),
                t.server_key.display(),
                t.ca_cert.display()
            )),
            None => c.push_str(&format!("port {}\n", self.port)),
        }
        if self.opts.cluster {
            c.push_str(&format!(
                "cluster-enabled yes\ncluster-config-file nodes.conf\ncluster-node-timeout {}\n",
                self.opts.node_timeout_ms.unwrap_or(2000)
            ));
        }
        if self.opts.quick_sync {
            c.push_str("repl-diskless-sync-delay 0\n");
        }
        if !self.opts.acl_users.is_empty() {
            c.push_str(&format!("user default on >{ADMIN_PASSWORD} ~* &* +@all\n"));
            for u in &self.opts.acl_users {
                c.push_str(&format!("user {u}\n"));
            }
        }
        c
    }

    fn spawn(&mut self) -> Result<(), String> {
        let conf = self.dir.path().join("redis.conf");
        std::fs::write(&conf, self.config()).map_err(|e| format!("write config: {e}"))?;
        let _ = std::fs::remove_file(self.dir.path().join("redis.log"));
        let child = Command::new("redis-server")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn redis-server: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                self.child = None;
                return Err(format!(
                    "redis-server exited with {status}: {err}\n{}",
                    self.log()
                ));
            }
            if self.ping().is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!("redis-server not ready after 15 s\n{}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The tail of the server's log, for failure messages.
    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// `redis://127.0.0.1:<port>/` (or `rediss://`), without credentials.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// A URL with these credentials.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://{user}:{password}@127.0.0.1:{}/", self.port)
    }

    /// The test CA's certificate (PEM), for TLS servers.
    pub fn ca_pem(&self) -> Vec<u8> {
        let t = self.tls.as_ref().expect("not a TLS server");
        std::fs::read(&t.ca_cert).unwrap_or_else(|e| panic!("read CA: {e}"))
    }

    /// The directory the server runs in (for extra files, e.g. another CA).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn admin_client(&self) -> redis::Client {
        let url = if self.opts.acl_users.is_empty() {
            self.url()
        } else {
            self.url_as("default", ADMIN_PASSWORD)
        };
        match &self.tls {
            Some(t) => redis::Client::build_with_tls(
                url.as_str(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(
                        std::fs::read(&t.ca_cert).unwrap_or_else(|e| panic!("read CA: {e}")),
                    ),
                },
            ),
            None => redis::Client::open(url.as_str()),
        }
        .unwrap_or_else(|e| panic!("admin client: {e}"))
    }

    fn ping(&self) -> redis::RedisResult<()> {
        let mut c = self
            .admin_client()
            .get_connection_with_timeout(Duration::from_millis(500))?;
        redis::cmd("PING").query::<String>(&mut c).map(|_| ())
    }

    /// An administrative connection (the default user).
    pub fn admin(&self) -> redis::Connection {
        self.admin_client()
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("admin connection: {e}"))
    }

    /// Runs one command as the admin and returns its reply.
    pub fn cmd(&self, args: &[&str]) -> redis::Value {
        let mut c = self.admin();
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query::<redis::Value>(&mut c)
            .unwrap_or_else(|e| panic!("{args:?} failed: {e}"))
    }

    /// A field of `INFO <section>`.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        let mut c = self.admin();
        let info: String = redis::cmd("INFO")
            .arg(section)
            .query(&mut c)
            .unwrap_or_else(|e| panic!("INFO failed: {e}"));
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")).map(str::to_owned))
    }

    /// A field of `CLUSTER INFO`.
    pub fn cluster_info(&self, field: &str) -> Option<String> {
        let mut c = self.admin();
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut c)
            .unwrap_or_else(|e| panic!("CLUSTER INFO failed: {e}"));
        info.lines().find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().to_owned())
        })
    }

    /// `calls` of a command in INFO commandstats (e.g. `evalsha`), 0 if never called.
    pub fn command_calls(&self, command: &str) -> u64 {
        self.command_stat(command, "calls")
    }

    /// `stat` (`calls`, `rejected_calls`…) of a command in INFO commandstats, 0 if never called.
    pub fn command_stat(&self, command: &str, stat: &str) -> u64 {
        self.info_field("commandstats", &format!("cmdstat_{command}"))
            .and_then(|v| {
                v.split(',').find_map(|kv| {
                    kv.strip_prefix(stat)
                        .and_then(|rest| rest.strip_prefix('='))
                        .map(str::to_owned)
                })
            })
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Stops the server without saving (all data lost) and starts it again on the same port.
    pub fn restart(&mut self) {
        self.stop();
        let mut last = String::new();
        for _ in 0..50 {
            match self.spawn() {
                Ok(()) => return,
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart on port {}: {last}", self.port);
    }

    /// Stops the server without saving.
    pub fn stop(&mut self) {
        if let Ok(mut c) = self
            .admin_client()
            .get_connection_with_timeout(Duration::from_secs(1))
        {
            let _ = redis::cmd("SHUTDOWN")
                .arg("NOSAVE")
                .query::<redis::Value>(&mut c);
        }
        if let Some(mut child) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The backend on `server`, connected as the default user.
pub async fn backend(server: &RedisServer) -> tenure::backend::redis::RedisBackend {
    use tenure::backend::redis::{RedisBackend, RedisConfig};
    let config = RedisConfig::new(&server.url()).unwrap_or_else(|e| panic!("{e}"));
    RedisBackend::connect(config)
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", server.url()))
}

/// An acquire request for `name` with a fresh holder token.
pub fn req(name: &str, identity: &str, ttl: Duration) -> tenure::backend::AcquireRequest {
    tenure::backend::AcquireRequest {
        name: name.into(),
        holder: tenure::backend::HolderToken::random(),
        identity: identity.into(),
        ttl,
    }
}

/// Sends `r`, which must be granted; its fencing token.
pub async fn granted(
    b: &impl tenure::backend::Backend,
    r: &tenure::backend::AcquireRequest,
) -> tenure::backend::FencingToken {
    match b.try_acquire(r).await {
        Ok(tenure::backend::Acquired::Granted { fencing }) => fencing,
        other => panic!("expected a grant for {}, got {other:?}", r.name),
    }
}

/// Sends a signal to a process with `kill(1)`.
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap_or_else(|e| panic!("cannot run kill: {e}"));
    assert!(status.success(), "kill -{sig} {pid} failed");
}
