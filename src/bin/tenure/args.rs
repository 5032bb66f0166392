//! The command line: subcommands, flags, their defaults and help, and the duration syntax.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use tenure::crd::parse_duration;
use tenure::election::Preference;

/// Exit codes of tenure itself, listed in `--help` and docs/errors.md.
pub const EXIT_CODES: &str = "\
Exit codes:
  N        the command's own exit code (128 + signal number when a signal killed it)
  2        bad usage or configuration (flags, lease name, durations, a --shards count the
           group does not run, a backend without group membership)
  3        the lease was lost and --rejoin is off; the command was stopped
  4        the backend could not be used (unreachable, credentials, permissions)
  5        tenure policy --check: the fence is not enforced (the line says why and what to do)
  6        --try / --timeout: the lease was not won in time (held elsewhere); CMD did not run
  7        --once-per: this period's run was completed already; CMD did not run
           (--done-exit-code changes it, e.g. to 0 for a CronJob)
  8        --fence: the term's fence could not be proven; CMD did not start (with
           --shards, a shard proof that got no answer ends only that shard's term)
  9        --once-per: CMD exited 0 but its completion could not be recorded (the store
           refused it: a newer term began; or it could not be reached): it may run again
  10       status --require-leader: nobody holds the lease (with --shards: some shard's)
  126/127  the command could not be run / was not found
  128 + N  tenure stopped by signal N while it was not leading
With --shards: 0 after SIGTERM or SIGINT (the copies' own exit codes are logged only).";

/// Run a command on one replica at a time, fenced by a lease.
#[derive(Debug, Parser)]
#[command(name = "tenure", version, after_long_help = EXIT_CODES)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run CMD only while this process holds the lease.
    ///
    /// Campaigns for the lease, starts CMD once it is held, and stops CMD (SIGTERM to its
    /// process group, SIGKILL after --grace) when the lease is lost. CMD gets
    /// TENURE_FENCING_TOKEN, TENURE_LEASE and TENURE_IDENTITY in its environment. When CMD
    /// exits, the lease is released and tenure exits with CMD's exit code.
    ///
    /// Example: tenure run --lease nightly-report -- ./report.sh --since yesterday
    ///
    /// With --shards N, the work is split into N shards spread evenly over the replicas
    /// running with the same --lease: one copy of CMD runs per shard this replica holds, each
    /// with TENURE_SHARD (0 to N-1), TENURE_SHARDS (N) and its shard's own
    /// TENURE_FENCING_TOKEN and TENURE_LEASE (NAME-SHARD). See --shards.
    ///
    /// Example: tenure run --lease mailer --shards 8 --backend kube -- ./mailer
    #[command(after_long_help = EXIT_CODES)]
    Run(Box<RunArgs>),
    /// Show who holds a lease (with --shards, each shard's lease and the group's members).
    ///
    /// Example: tenure status --lease nightly-report --backend redis://127.0.0.1:6379
    Status(StatusArgs),
    /// Print the Election custom resource definition (YAML) for `kubectl apply -f -`.
    Crd,
    /// Print the fencing policy of one election (YAML) for `kubectl apply -f -`.
    ///
    /// The election's Lease (empty, if it does not exist yet), a ValidatingAdmissionPolicy
    /// and its binding: the API server then refuses a participant's write to a governed
    /// resource whose fencing token is lower than the current term's, or that carries none
    /// (see `tenure::fence::kube`). People and other controllers are never affected.
    ///
    /// Example: tenure policy --lease reports --namespace ops --service-account reports
    /// --resource configmaps --resource deployments.apps | kubectl apply -f -
    Policy(PolicyArgs),
    /// Copy this executable to DIR/tenure, for an init container that injects tenure into
    /// another image.
    ///
    /// The copy replaces DIR/tenure in one rename: a symbolic link there is replaced, never
    /// followed.
    Install {
        /// The directory to copy into (usually an emptyDir volume).
        dir: PathBuf,
    },
    /// Delete a Deployment and wait until its pods have stopped.
    ///
    /// For `helm uninstall` (the chart's pre-delete hook): Helm deletes the Role and
    /// ServiceAccount right after the Deployment, before the pods stop, and a leader whose
    /// permissions are gone cannot release its lease. Run first, this deletes the Deployment
    /// with foreground propagation (the API server keeps it until its pods are gone) and waits
    /// until it has disappeared, so every replica stops — and its leader releases — while its
    /// permissions still exist. A Deployment that is already gone is not an error.
    ///
    /// Needs `get` and `delete` on the Deployment. Exit codes: 0 gone, 1 pods still stopping
    /// at --timeout, 2 bad flags, 4 the API refused or could not be reached.
    ///
    /// Example: tenure drain --deployment reports-tenure --namespace ops --timeout 2m
    Drain(DrainArgs),
    /// Move leadership on purpose: ask the lease's holder to hand over (to --to).
    ///
    /// Records the request in the store; a tenure leader checks for one every retry period,
    /// ends its term the graceful way (its command gets SIGTERM and --grace) and releases the
    /// lease so that only --to may take it for a short window (then anyone may: a target that
    /// has died costs that window, no more). Without --to the leader steps down and sits out
    /// that window. The new term has a higher fencing token. Waits until the holder changed.
    ///
    /// Exit codes: 0 moved (to --to, when given), 1 not moved within --wait, 2 bad flags,
    /// 4 the backend could not be used, 6 the lease is not held.
    ///
    /// Example: tenure handoff --lease nightly-report --to worker-2 --backend redis://127.0.0.1:6379
    Handoff(HandoffArgs),
}

/// `tenure handoff`.
#[derive(Debug, Args)]
pub struct HandoffArgs {
    /// The lease whose holder should hand over.
    #[arg(long, value_name = "NAME", value_parser = parse_lease)]
    pub lease: String,

    /// The replica (its identity) that should lead next [default: whoever campaigns].
    #[arg(long, value_name = "IDENTITY")]
    pub to: Option<String>,

    #[command(flatten)]
    pub backend: BackendArgs,

    /// How long the request stands: a holder that has not acted on it by then (not a tenure
    /// elector, or gone) is no longer asked, and nobody is kept out of the lease by it.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub window: Duration,

    /// How long to wait for the holder to change before exiting 1.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub wait: Duration,
}

/// `tenure drain`.
#[derive(Debug, Args)]
pub struct DrainArgs {
    /// The Deployment to delete.
    #[arg(long, value_name = "NAME")]
    pub deployment: String,

    /// Its namespace [default: the service account's, or the kubeconfig context's].
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,

    /// How long to wait for the pods to stop (a Go duration: 90s, 2m).
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub timeout: String,
}

/// `tenure policy`.
#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// The election's Lease (at most 63 characters).
    #[arg(long, value_name = "NAME")]
    pub lease: String,

    /// The Lease's namespace.
    #[arg(long, value_name = "NS")]
    pub namespace: String,

    /// A participant: a ServiceAccount whose writes are fenced, as NAME (in --namespace) or
    /// NAMESPACE/NAME; repeatable [default: tenure, if no --user is given either].
    #[arg(long = "service-account", value_name = "SA")]
    pub service_accounts: Vec<String>,

    /// A participant by user name, as the API server authenticates it; repeatable.
    #[arg(long = "user", value_name = "USER")]
    pub users: Vec<String>,

    /// With --check and --user: a group the (first) user belongs to, impersonated with it;
    /// repeatable. A user whose permissions come from a group (e.g. system:masters) is refused
    /// everything when impersonated without it.
    #[arg(long = "group", value_name = "GROUP", requires = "check")]
    pub groups: Vec<String>,

    /// A governed resource, as `resource[.group]` (configmaps, deployments.apps); repeatable
    /// [default: every resource but Leases (except the probe), Events, Elections and access
    /// reviews]. Its subresources are governed too, CONNECT included (pods/exec, attach,
    /// portforward, proxy). The election's own resources are refused.
    #[arg(long = "resource", value_name = "RESOURCE")]
    pub resources: Vec<String>,

    /// The election is a sharded group of N shards (`tenure run --lease NAME --shards N`):
    /// one policy for all its shards, whose binding selects the shard Leases NAME-0 …
    /// NAME-<N-1> by their label tenure.dev/shard-group=NAME (no Lease is printed: each shard
    /// Lease is created, labelled, by its first grant), and the RBAC `tenure run --shards`
    /// needs. A write naming a shard must carry exactly that shard's current term's token. The
    /// policy does not depend on N (a resize needs no new policy); --check proves shards 0 to
    /// N-1 (and any Lease of a larger count still there).
    #[arg(long, value_name = "N", value_parser = parse_shards)]
    pub shards: Option<u32>,

    /// The replicas run with `tenure run --prefer PREFERENCE` (the same values): each
    /// announces itself in a member Lease NAME-healthy-member-<hash>, named after its identity,
    /// so the printed RBAC grants get, list, watch, update, patch, create and delete on Leases
    /// of any name in --namespace instead of the Lease by name. The policy is the same: it
    /// governs no Lease but its probe, so member Leases are written without a token.
    #[arg(long, value_name = "PREFERENCE", value_parser = parse_preference, conflicts_with = "shards")]
    pub prefer: Option<Preference>,

    /// The replicas run with `tenure run --health-cmd` (only whether it is given matters; the
    /// command is not run): as --prefer, the RBAC covers their member Leases.
    #[arg(long, value_name = "CMD", conflicts_with = "shards")]
    pub health_cmd: Option<String>,

    /// Instead of printing the policy, prove that the API server enforces it: the policy,
    /// its binding (applying it with this Lease) and the Lease exist, and dry-run writes as
    /// the first participant (impersonated, with --group's groups for a user): a token below
    /// the Lease's floor is refused, the floor's own token admitted. Exit 0 enforced, 5 not
    /// (the line names the cause and the fix), 4 the check could not run (the line says
    /// which permission it lacked). With --shards, every shard at its own floor, and a write
    /// naming the group but no shard refused. Proves only the API server it reached: on an HA
    /// control plane, run it against each.
    #[arg(long)]
    pub check: bool,
}

/// `tenure run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The lease's name; every replica of one singleton uses the same name.
    ///
    /// Kubernetes' rule for object names on every backend (so a job moves between backends
    /// unchanged): at most 253 lowercase letters, digits, '-' or '.', each '.'-separated part
    /// starting and ending with a letter or digit. Example: --lease nightly-report
    #[arg(long, value_name = "NAME", value_parser = parse_lease)]
    pub lease: String,

    #[command(flatten)]
    pub backend: BackendArgs,

    /// This replica's identity, shown to the others [default: $POD_NAME, else hostname-pid].
    ///
    /// At most 253 bytes (the longest Kubernetes object name), without control characters;
    /// the same rules apply to $POD_NAME. Example: --identity "$(hostname)-worker-2"
    #[arg(long, value_name = "ID")]
    pub identity: Option<String>,

    /// How long the lease lasts without renewal; others wait this long for a silent leader.
    ///
    /// Every DURATION is written as Kubernetes and Go write them: numbers with units (ns, us,
    /// ms, s, m, h), e.g. 500ms, 15s, 1m30s, 1.5h, 1h2m3.5s; `0` needs no unit. Negative
    /// durations and numbers without a unit are refused (exit code 2).
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,

    /// A leader that has not renewed for this long stops its command.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub renew_deadline: Duration,

    /// Pause between retries of failed requests.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub retry_period: Duration,

    /// How long the command may take to exit after SIGTERM before it gets SIGKILL (never past
    /// the lease's validity).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub grace: Duration,

    /// After losing the lease, campaign again and rerun the command instead of exiting.
    #[arg(long)]
    pub rejoin: bool,

    /// Take the lease now or exit 6 without running the command: one campaign, ended as soon
    /// as another holder is seen (or after --retry-period without an answer). For a job that
    /// must not queue behind another replica's run. Like `consul lock -try`.
    #[arg(long = "try", env = "TENURE_TRY", conflicts_with_all = ["timeout", "shards"])]
    pub try_once: bool,

    /// Give up waiting for the lease after DURATION: exit 6 without running the command if no
    /// term began by then. Once a term began it is not cut short.
    /// Example: --timeout 10m
    #[arg(long, value_name = "DURATION", env = "TENURE_TIMEOUT", value_parser = parse_duration, conflicts_with = "shards")]
    pub timeout: Option<Duration>,

    /// Run CMD at most once per PERIOD across every replica of the lease: a run-once job
    /// (cron jobs, migrations). Periods are calendar-aligned on the store's clock (UTC days
    /// for 24h, clock hours for 1h: period number = floor(store time / PERIOD)), never on a
    /// replica's own clock. When a term begins, tenure reads the lease's completion record
    /// from the store: if a run completed in this period, CMD is not run and tenure exits 7
    /// (--done-exit-code). Otherwise CMD runs with TENURE_PERIOD_START (the period's start,
    /// RFC 3339); when it exits 0, tenure records the completion, fenced by the term's token
    /// (refused once a newer term has begun), and exits 0. A run is complete only then: a
    /// command that failed or was killed with its term (kill -9, a lost lease) leaves no
    /// record and the next run of the period runs it again; a command that exited 0 whose
    /// record was refused or could not be written exits 9 (it may run again). At least 1s.
    /// Example: --once-per 24h
    #[arg(long, value_name = "PERIOD", env = "TENURE_ONCE_PER", value_parser = parse_period, conflicts_with = "shards")]
    pub once_per: Option<Duration>,

    /// With --once-per: the exit code when this period's run was completed already. A
    /// CronJob's pod sets 0, so that a Job finding the work done succeeds.
    #[arg(
        long,
        value_name = "CODE",
        env = "TENURE_DONE_EXIT_CODE",
        default_value_t = 7,
        requires = "once_per"
    )]
    pub done_exit_code: u8,

    /// Check this invocation instead of running it: the store answers; on Kubernetes this
    /// user's permissions on the Lease (and, with --once-per, on NAME-done) by
    /// SelfSubjectAccessReview; with --fence the impersonation of itself its fenced requests
    /// need and the election's fencing policy. One line per check, with the fix for a
    /// failure. Exit 0 when all pass, 4 when one fails. Nothing is campaigned for or run.
    /// Example: tenure run --check --lease reports --backend kube --fence -- ./report.sh
    #[arg(long)]
    pub check: bool,

    /// Serve GET /metrics, /healthz and /readyz on this address (e.g. 0.0.0.0:9090).
    #[arg(long, value_name = "ADDR", env = "TENURE_LISTEN")]
    pub listen: Option<std::net::SocketAddr>,

    /// Let /healthz fail too (not only /readyz) while the store has not answered this replica
    /// for 2 × --lease-duration + --retry-period, so that a liveness probe restarts it. Use it
    /// when a restart is what mends a lost connection (a stale DNS entry, a wedged client);
    /// without it a follower cut off from the store stays live, since restarting it would not
    /// bring the store back.
    #[arg(long, requires = "listen", conflicts_with = "shards")]
    pub store_liveness: bool,

    /// A directory only this replica's processes see and that outlives them (a pod's emptyDir:
    /// the chart sets it). tenure, its watchdog and the command hold a lock on a file there
    /// while they live and record each campaign's holder token in it; a tenure restarted with
    /// the same --identity that finds the lock free knows they are all gone, ends their term
    /// at once and leads without waiting for the lease to expire (the fencing token rises).
    /// If the lock is still held (a frozen or still-running process), the lease expires as
    /// usual. With --shards, one lock for the replica: every shard term it held is ended.
    #[arg(long, value_name = "DIR", env = "TENURE_RESTART_DIR")]
    pub restart_dir: Option<std::path::PathBuf>,

    /// On Kubernetes (--backend kube): fence the command's Kubernetes writes by its term's
    /// token with no code change. Each term's command gets KUBECONFIG (read by kubectl, Helm,
    /// client-go and the Python client) and TENURE_KUBE_SERVER (for any HTTP client: the
    /// API's paths go after it), both reaching a loopback endpoint of tenure's, at a URL
    /// holding a per-term secret, that adds the term's token to every request (impersonating
    /// this replica's own identity, which needs RBAC: `tenure policy` prints it), holds writes
    /// until the fence is proven and refuses everything once the term has ended. The
    /// kubeconfig is private to this user, under $TMPDIR, and gone with the term. Pair it
    /// with the fencing policy (`tenure policy`, the chart's fencing.policy.enabled).
    #[arg(long)]
    pub fence: bool,

    /// Publish this replica's view into the status of the Election custom resource (needs
    /// Kubernetes access, whatever the backend).
    #[arg(long)]
    pub publish_status: bool,

    /// The Election resource to publish to [default: the lease name].
    #[arg(long, value_name = "NAME", requires = "publish_status", value_parser = parse_election)]
    pub election: Option<String>,

    /// Sharded workers: split the work into N shards (1 to 4096) spread evenly over the
    /// live replicas of this --lease, and run one copy of CMD per shard held here.
    ///
    /// Each copy is a term of its own: its own process group, watchdog, --grace and fencing
    /// token, with TENURE_SHARD (its shard, 0 to N-1), TENURE_SHARDS (N), TENURE_LEASE
    /// (NAME-SHARD, the shard's lease), TENURE_FENCING_TOKEN and TENURE_IDENTITY in its
    /// environment. A copy that exits ends its shard's term: the lease is released and the
    /// shard is campaigned for again (after --retry-period) while it stays assigned here,
    /// so its exit code is only logged. A shard assigned to another replica (one joined) is
    /// handed over: its copy gets SIGTERM and --grace, then its lease is released. SIGTERM or
    /// SIGINT to tenure leaves the group: every copy gets the signal and --grace, every
    /// lease is released, the other replicas take the shards over, and tenure exits 0.
    /// The group's N is kept by the store: a replica started with another N waits, and
    /// changes the group to its N once no live replica runs the old one and every old lease
    /// is free (a rolling update that changes N completes). With --publish-status, the
    /// Election shows each shard's holder and token. Escaped descendants of a copy (setsid daemons) may live while the term named
    /// by their TENURE_LEASE and TENURE_FENCING_TOKEN runs. --rejoin is implied. Needs a
    /// backend with group membership (local, kube, Redis); on Kubernetes each replica also
    /// writes a member Lease NAME-member-HASH, deleted when it leaves.
    #[arg(long, value_name = "N", value_parser = parse_shards)]
    pub shards: Option<u32>,

    /// A shell command (`sh -c`) that says whether this replica can do its work: exit 0
    /// healthy, anything else (or no answer within --health-interval) unhealthy. A leader
    /// unhealthy for --unhealthy-after hands the lease to a replica that is healthy (each
    /// replica announces its health in the store) and keeps it when none is; a replica that
    /// stepped down for its health campaigns again only after --health-recovery healthy.
    /// Example: --health-cmd 'pg_isready -h db'
    #[arg(long, value_name = "CMD", conflicts_with = "shards")]
    pub health_cmd: Option<String>,

    /// How often --health-cmd runs (and how long one run may take).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration, requires = "health_cmd")]
    pub health_interval: Duration,

    /// How long the leader must stay unhealthy before it hands over.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_duration, requires = "health_cmd")]
    pub unhealthy_after: Duration,

    /// How long a replica that stepped down for its health must be healthy again before it
    /// campaigns: the hysteresis that keeps two flapping replicas from trading the lease.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration, requires = "health_cmd")]
    pub health_recovery: Duration,

    /// Which replica the leader hands the lease to when it lets go without a named target
    /// (SIGTERM, a --health-cmd step-down, `tenure handoff` without --to):
    /// `newest` — the replica whose `tenure run` started last (in a rolling update, one of
    /// the new version: one rollout moves leadership once); `identities:A,B,...` — the first
    /// of these that is running, else any running one. Each replica announces itself in the
    /// store while it runs (with --health-cmd, while healthy). A preferred replica that does
    /// not take the lease within the hand-off window makes the release an ordinary one.
    /// Without it SIGTERM releases the lease to whoever campaigns first.
    #[arg(long, value_name = "PREFERENCE", env = "TENURE_PREFER", value_parser = parse_preference, conflicts_with = "shards")]
    pub prefer: Option<Preference>,

    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<std::ffi::OsString>,
}

/// `--prefer`: `newest`, or `identities:` and a comma-separated list of identities.
pub fn parse_preference(s: &str) -> Result<Preference, String> {
    if s == "newest" {
        return Ok(Preference::Newest);
    }
    let Some(list) = s.strip_prefix("identities:") else {
        return Err(format!(
            "{s:?} is not a preference: `newest`, or `identities:` and a comma-separated list (identities:pod-a,pod-b)"
        ));
    };
    let ids: Vec<String> = list.split(',').map(str::to_owned).collect();
    let max = tenure::lock::MAX_IDENTITY_LEN;
    if let Some(bad) = ids.iter().find(|id| id.is_empty() || id.len() > max) {
        return Err(format!(
            "{s:?}: every identity in the list must have 1 to {max} bytes, not {}",
            bad.len()
        ));
    }
    Ok(Preference::Identities(ids))
}

/// `--once-per`: a duration of at least one second (the Kubernetes API server's clock has
/// whole seconds).
pub fn parse_period(s: &str) -> Result<Duration, String> {
    let period = parse_duration(s).map_err(|e| e.to_string())?;
    if period < Duration::from_secs(1) {
        return Err(format!(
            "{s:?} is shorter than 1s: a run-once period is at least one second"
        ));
    }
    Ok(period)
}

/// A shard count: 1 to [`tenure::shard::MAX_SHARDS`].
pub fn parse_shards(s: &str) -> Result<u32, String> {
    let max = tenure::shard::MAX_SHARDS;
    match s.trim().parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a shard count from 1 to {max}")),
    }
}

/// clap's multi-line error text as one line: the message (its indented continuation lines
/// joined with ", "), the tip, and the help to read (`tenure run --help`, from the usage
/// line, else `subcommand`'s).
pub fn one_line(rendered: &str, subcommand: Option<&str>, sources: &[String]) -> String {
    let mut message = String::new();
    let mut tips = Vec::new();
    let mut help = subcommand.map_or("tenure --help".to_owned(), |s| format!("tenure {s} --help"));
    for line in rendered.lines() {
        let trimmed = line.trim();
        if let Some(first) = trimmed.strip_prefix("error: ") {
            message.push_str(first);
        } else if let Some(tip) = trimmed.strip_prefix("tip: ") {
            tips.push(tip.to_owned());
        } else if let Some(usage) = trimmed.strip_prefix("Usage: ") {
            // A missing or conflicting argument is named without the flag that needs it or
            // conflicts: clap's usage line shows that flag.
            if message.starts_with("the following required arguments")
                || message.contains("cannot be used with")
            {
                tips.push(format!("usage: {usage}"));
            }
            let words: Vec<&str> = usage
                .split_whitespace()
                .take_while(|w| !w.starts_with(['-', '<', '[']))
                .collect();
            help = format!("{} --help", words.join(" "));
        } else if line.starts_with(' ') && !trimmed.is_empty() && !message.is_empty() {
            message.push_str(if message.ends_with(':') { " " } else { ", " });
            message.push_str(trimmed);
        }
    }
    if message.is_empty() {
        message = rendered
            .lines()
            .next()
            .unwrap_or("invalid arguments")
            .to_owned();
    }
    tips.extend(sources.iter().cloned());
    tips.push(format!("see '{help}'"));
    format!("{message} ({})", tips.join("; "))
}

/// The command line as clap parses it, with two rules for the job flags' environment
/// variables, which a host or an image sets as defaults for every job it runs: `TENURE_TRY=false`
/// is `--try` off, as if unset (clap counts a flag set from the environment as given, even to
/// `false`, so it would conflict with `--timeout`); and `TENURE_DONE_EXIT_CODE` does not need
/// `--once-per` (on the command line `--done-exit-code` without it is a mistake; in the
/// environment it is the code for those jobs that run once per period).
pub fn command() -> clap::Command {
    command_in(|name| std::env::var_os(name))
}

/// [`command`] against the environment `env`.
fn command_in(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> clap::Command {
    use clap::CommandFactory;
    let try_off = env("TENURE_TRY").is_some_and(|v| v == "false");
    let done_code_from_env = env("TENURE_DONE_EXIT_CODE").is_some();
    // The ids are the fields of `RunArgs` (`cli_definition_is_consistent` builds both shapes).
    Cli::command().mut_subcommand("run", |run| {
        let run = if try_off {
            run.mut_arg("try_once", |a| a.env(clap::builder::Resettable::Reset))
        } else {
            run
        };
        if done_code_from_env {
            run.mut_arg("done_exit_code", |a| {
                a.requires(clap::builder::Resettable::Reset)
            })
        } else {
            run
        }
    })
}

/// For a usage error: which flags it names were set by an environment variable rather than on
/// the command line (`--try is set by $TENURE_TRY`), so that an error about a flag nobody typed
/// says where it came from. `message` is clap's rendered error, `argv` the arguments after the
/// subcommand's name.
pub fn set_by_env(
    cmd: &clap::Command,
    subcommand: Option<&str>,
    message: &str,
    argv: &[String],
) -> Vec<String> {
    let Some(sub) = subcommand.and_then(|s| cmd.find_subcommand(s)) else {
        return Vec::new();
    };
    // The error itself, not clap's usage line (which lists every flag set, wherever from).
    let message = message.split("Usage:").next().unwrap_or(message);
    sub.get_arguments()
        .filter_map(|arg| {
            let (long, var) = (arg.get_long()?, arg.get_env()?);
            let flag = format!("--{long}");
            let given = argv
                .iter()
                .any(|a| *a == flag || a.starts_with(&format!("{flag}=")));
            let named = message.contains(&format!("'{flag}'"))
                || message.contains(&format!("'{flag} "))
                || message.contains(&format!("{flag} <"));
            (named && !given && std::env::var_os(var).is_some())
                .then(|| format!("{flag} is set by ${}", var.to_string_lossy()))
        })
        .collect()
}

/// `--lease`: one rule on every backend, Kubernetes' for object names (a DNS-1123 subdomain of
/// at most 253 characters), so a job that runs on one backend runs on every other with the same
/// name (Redis and the local backend take more, Kubernetes refuses the rest).
pub fn parse_lease(s: &str) -> Result<String, String> {
    if is_dns1123(s, 253, true) {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is not a lease name: at most 253 lowercase letters, digits, '-' or '.', each '.'-separated part starting and ending with a letter or digit (Kubernetes' rule for object names, applied on every backend so a job moves between backends unchanged); e.g. {:?}",
            suggest_lease(s)
        ))
    }
}

/// A lease name close to `s` that the rule accepts: lowercase, other characters as '-'.
fn suggest_lease(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars().take(253) {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let trimmed = out
        .split('.')
        .map(|p| p.trim_matches('-'))
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join(".");
    if trimmed.is_empty() {
        "my-job".to_owned()
    } else {
        trimmed
    }
}

/// `--election`: a Kubernetes object name (a DNS-1123 subdomain of at most 253 characters).
pub fn parse_election(s: &str) -> Result<String, String> {
    if is_dns1123(s, 253, true) {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is not a Kubernetes object name: at most 253 lowercase alphanumeric characters, '-' or '.', each '.'-separated part starting and ending with an alphanumeric character"
        ))
    }
}

/// Kubernetes' rule for names: at most `max` characters, lowercase alphanumeric or '-' parts
/// (separated by '.' where `dots`, as in object names; namespaces are single labels), each
/// starting and ending with an alphanumeric character.
pub fn is_dns1123(name: &str, max: usize, dots: bool) -> bool {
    let label = |l: &str| {
        let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        let b = l.as_bytes();
        b.first().is_some_and(alnum)
            && b.last().is_some_and(alnum)
            && b.iter().all(|c| alnum(c) || *c == b'-')
    };
    name.len() <= max
        && if dots {
            name.split('.').all(label)
        } else {
            label(name)
        }
}

impl RunArgs {
    /// The identity to campaign with, and where it came from, for error messages: `--identity`,
    /// else `$POD_NAME` (taken as it is, so that a bad one is reported rather than replaced),
    /// else [`tenure::default_identity`].
    pub fn identity(&self) -> (String, &'static str) {
        if let Some(id) = &self.identity {
            return (id.clone(), "--identity");
        }
        match std::env::var("POD_NAME") {
            Ok(pod) if !pod.trim().is_empty() => (pod, "$POD_NAME (the default of --identity)"),
            _ => (
                tenure::default_identity(),
                "the default of --identity (<hostname>-<pid>)",
            ),
        }
    }
}

/// `tenure status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The lease's name (the same rule as `tenure run --lease`).
    #[arg(long, value_name = "NAME", value_parser = parse_lease)]
    pub lease: String,

    #[command(flatten)]
    pub backend: BackendArgs,

    /// The lease is a group of N shards (`tenure run --shards N`): show each shard's lease
    /// (NAME-SHARD) and the group's live members.
    #[arg(long, value_name = "N", value_parser = parse_shards)]
    pub shards: Option<u32>,

    /// Output format.
    #[arg(long, short, value_enum, default_value_t = Output::Table)]
    pub output: Output,

    /// Exit 10 when nobody holds the lease (with --shards: when any shard's lease is free),
    /// after printing what was read: a check for scripts and the chart's `helm test`. Without
    /// it status exits 0 whether or not the lease is held.
    #[arg(long)]
    pub require_leader: bool,
}

/// Output formats of `tenure status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns for people.
    Table,
    /// One JSON object for scripts.
    Json,
}

/// Where the lease lives, shared by `run` and `status`.
#[derive(Debug, Args)]
pub struct BackendArgs {
    /// `local` (files on this host), `kube` (a Kubernetes Lease) or a `redis://` / `rediss://`
    /// URL. Without it tenure uses `local` and warns: no mutual exclusion across hosts.
    #[arg(long, value_name = "BACKEND", env = "TENURE_BACKEND")]
    pub backend: Option<String>,

    /// Kubernetes namespace of the Lease and the Election [default: the pod's, or the
    /// kubeconfig context's].
    #[arg(long, value_name = "NS", env = "POD_NAMESPACE")]
    pub namespace: Option<String>,

    /// Local backend: the state directory [default: $XDG_RUNTIME_DIR/tenure, else
    /// /tmp/tenure-UID].
    #[arg(long, value_name = "DIR", env = "TENURE_STATE_DIR")]
    pub state_dir: Option<PathBuf>,

    /// Redis ACL user (overrides the URL's).
    #[arg(long, value_name = "USER", env = "TENURE_REDIS_USERNAME")]
    pub redis_username: Option<String>,

    /// Redis password read from this file (trailing newline ignored). The password may also
    /// come from $TENURE_REDIS_PASSWORD; it is never logged.
    ///
    /// Any file that can be read will do (/dev/stdin, a pipe); at most 4096 bytes are read,
    /// and a longer file is refused.
    #[arg(long, value_name = "PATH", env = "TENURE_REDIS_PASSWORD_FILE")]
    pub redis_password_file: Option<PathBuf>,

    /// PEM file of the CA that signed the Redis server's certificate (rediss://); at most
    /// 1 MiB.
    #[arg(long, value_name = "PATH", env = "TENURE_REDIS_CA_FILE")]
    pub redis_ca_file: Option<PathBuf>,

    /// The Redis URL names a seed node of a Redis Cluster (one script call per lock, routed to
    /// the node serving its slot).
    #[arg(long, env = "TENURE_REDIS_CLUSTER")]
    pub redis_cluster: bool,

    /// Redis key prefix of the lease's keys.
    #[arg(long, value_name = "PREFIX", env = "TENURE_KEY_PREFIX")]
    pub key_prefix: Option<String>,

    /// Whether `backend` came from $TENURE_BACKEND rather than the flag (set after parsing).
    #[arg(skip)]
    pub backend_from_env: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefer_takes_newest_or_a_list_of_identities_and_names_what_is_wrong() {
        assert_eq!(parse_preference("newest"), Ok(Preference::Newest));
        assert_eq!(
            parse_preference("identities:pod-a,pod-b"),
            Ok(Preference::Identities(vec!["pod-a".into(), "pod-b".into()]))
        );
        for (bad, says) in [
            ("oldest", "is not a preference: `newest`, or `identities:`"),
            ("Newest", "is not a preference"),
            ("pod-a,pod-b", "is not a preference"),
            (
                "identities:",
                "every identity in the list must have 1 to 253 bytes, not 0",
            ),
            ("identities:a,,b", "not 0"),
        ] {
            let e = parse_preference(bad).expect_err(bad);
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        let long = format!("identities:{}", "a".repeat(254));
        assert!(
            parse_preference(&long)
                .expect_err("too long")
                .contains("not 254"),
        );
    }

    /// The `run` flags that take a DURATION, parsed by clap from `--flag=value` pairs.
    fn durations(flags: &[(&str, &str)]) -> Result<[Duration; 4], String> {
        let mut argv = vec!["tenure".to_owned(), "run".into(), "--lease=l".into()];
        argv.extend(
            flags
                .iter()
                .map(|(flag, value)| format!("--{flag}={value}")),
        );
        argv.extend(["--".into(), "true".into()]);
        match Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            Command::Run(a) => Ok([a.lease_duration, a.renew_deadline, a.retry_period, a.grace]),
            other => Err(format!("not run: {other:?}")),
        }
    }

    #[test]
    fn duration_flags_take_go_durations() {
        let secs = Duration::from_secs;
        assert_eq!(
            durations(&[]),
            Ok([secs(15), secs(10), secs(2), secs(5)]),
            "the defaults"
        );
        assert_eq!(
            durations(&[
                ("lease-duration", "1m30s"),
                ("renew-deadline", "1h2m3.5s"),
                ("retry-period", "300ms"),
                ("grace", "0"),
            ]),
            Ok([
                secs(90),
                Duration::from_millis(3_723_500),
                Duration::from_millis(300),
                Duration::ZERO
            ])
        );
        assert_eq!(
            durations(&[("lease-duration", "90s"), ("grace", "1.5h")]),
            Ok([secs(90), secs(10), secs(2), secs(5400)])
        );
    }

    #[test]
    fn bad_durations_are_usage_errors_naming_flag_and_value() {
        for (flag, value, needle) in [
            ("lease-duration", "-1s", "is negative"),
            ("grace", "15", "has no unit"),
            ("retry-period", "", "empty duration"),
            ("renew-deadline", "soon", "is not a duration"),
            ("grace", "15d", "unknown unit"),
            ("lease-duration", "3000000h", "too long"),
        ] {
            let err = durations(&[(flag, value)]).expect_err(value);
            assert!(err.contains(needle), "--{flag}={value:?}: {err}");
            assert!(
                err.contains(&format!("--{flag}")),
                "--{flag}={value:?}: {err}"
            );
            if !value.is_empty() {
                assert!(err.contains(value), "--{flag}={value:?}: {err}");
            }
        }
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        // The environment's rules name fields of `RunArgs` (`mut_arg` panics on an unknown id).
        command_in(|_| Some("false".into())).debug_assert();
    }

    #[test]
    fn names_follow_kubernetes_rules() {
        assert!(is_dns1123("reports-tenure", 253, true));
        assert!(is_dns1123("a.b-c", 253, true));
        assert!(!is_dns1123("a.b", 63, false));
        assert!(!is_dns1123("", 253, true));
        assert!(!is_dns1123("Reports", 253, true));
        assert!(!is_dns1123("-a", 253, true));
        assert!(!is_dns1123("a..b", 253, true));
        assert!(!is_dns1123(&"a".repeat(64), 63, false));
        assert!(is_dns1123(&"a".repeat(63), 63, false));
    }

    #[test]
    fn election_names_are_kubernetes_object_names() {
        assert_eq!(parse_election("jobs.prod-1"), Ok("jobs.prod-1".into()));
        for bad in ["", "Jobs", "a_b", "-a", "a..b", &"a".repeat(254)] {
            let e = parse_election(bad).expect_err(bad);
            assert!(e.contains("not a Kubernetes object name"), "{e}");
        }
    }

    #[test]
    fn clap_errors_become_one_line_with_the_tip_and_the_help_to_read() {
        let err = |argv: &[&str]| {
            let e = Cli::try_parse_from(argv).expect_err("refused");
            one_line(&e.render().to_string(), argv.get(1).copied(), &[])
        };
        let line = err(&["tenure", "run", "--lease", "x", "--bogus", "--", "true"]);
        assert_eq!(
            line,
            "unexpected argument '--bogus' found (to pass '--bogus' as a value, use '-- --bogus'; see 'tenure run --help')"
        );
        let line = err(&["tenure", "run", "--", "true"]);
        assert!(
            line.starts_with("the following required arguments were not provided: --lease <NAME>"),
            "{line}"
        );
        assert!(line.ends_with("see 'tenure run --help')"), "{line}");
        let line = err(&[
            "tenure",
            "run",
            "--lease",
            "x",
            "--store-liveness",
            "--",
            "true",
        ]);
        assert!(
            line.starts_with(
                "the following required arguments were not provided: --listen <ADDR> (usage: tenure run "
            ) && line.contains("--store-liveness"),
            "the flag that needs it is named: {line}"
        );
        let line = err(&[
            "tenure",
            "run",
            "--lease",
            "x",
            "--lease-duration",
            "15",
            "--",
            "true",
        ]);
        assert!(line.contains("has no unit"), "{line}");
        let line = err(&["tenure", "nonsense"]);
        assert!(
            line.starts_with("unrecognized subcommand 'nonsense'"),
            "{line}"
        );
        assert!(!line.contains('\n'), "{line}");
        let line = err(&[
            "tenure",
            "run",
            "--lease",
            "x",
            "--publish-status",
            "--election",
            "Bad_Name",
            "--",
            "true",
        ]);
        assert!(line.contains("not a Kubernetes object name"), "{line}");
    }
}
