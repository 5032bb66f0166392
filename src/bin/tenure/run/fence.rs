//! `--fence`: each term's command writes to Kubernetes fenced by the term's token with no code
//! change. Per term: the fence is proven first, then a [`FenceProxy`] is started and its
//! kubeconfig written — a 0600 file in a 0700 directory of tenure's own, replaced by
//! rename — and named in the command's environment; when the term's command is gone, the
//! proxy stops and the files are removed.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use tenure::Term;
use tenure::backend::kube::FENCING_FLOOR_ANNOTATION;
use tenure::election::Leader;
use tenure::fence::kube::{Current, FenceProxy, FenceState, Fencer};
use tokio::sync::watch;

use crate::error::CliError;
use crate::process::term_env::{ENV_KUBE_SERVER, ENV_KUBECONFIG};

/// What every term's fence shares: the fencer (who we are, the proofs) and the directory.
pub struct CommandFence {
    fencer: Fencer,
    namespace: String,
    dir: PathBuf,
    leader: Option<watch::Receiver<Option<Leader>>>,
    /// `--shards`: a term whose proof got no answer, or was superseded, ends alone.
    shard_terms: bool,
}

/// How a term's fence began.
pub enum Begun {
    /// Proven: the endpoint's guard and the command's environment.
    Fenced(TermFence, Vec<(&'static str, String)>),
    /// The term ended during the proof (a shutdown signal): nothing was started.
    Ended,
    /// A shard term whose proof the API server did not answer, or that a newer term
    /// superseded: its command is not started and its term ends, the replica's other shards
    /// keep theirs, and the shard is campaigned for again (a new term, a new proof).
    Unproven,
}

impl CommandFence {
    /// Learns who this process is on the API server (the identity its fenced requests
    /// impersonate) and makes the private directory for the terms' files under `parent`.
    pub async fn new(namespace: &str, parent: &Path) -> Result<Self, CliError> {
        let client = crate::backend::kube_client("--fence").await?;
        let fencer = Fencer::new(client)
            .await
            .map_err(|e| CliError::Backend {
                message: format!("--fence: {}", crate::error::chain(&e)),
            })?
            .lease_namespace(namespace);
        let dir = private_dir(parent).map_err(|e| CliError::Config {
            message: format!(
                "--fence: cannot make a private directory under {} (set TMPDIR to a writable directory): {e}",
                parent.display()
            ),
        })?;
        Ok(Self {
            fencer,
            namespace: namespace.to_owned(),
            dir,
            leader: None,
            shard_terms: false,
        })
    }

    /// `tenure run --shards`: a shard term whose proof the API server did not answer (or a
    /// newer term superseded) ends alone instead of the replica — one shard's slow proof says
    /// nothing about the fence, and ending the replica would end every shard it holds. A
    /// proof that was answered and found the fence open or unprovable (no policy, no RBAC,
    /// another policy's refusal) still ends the replica (exit 8): every shard's would fail
    /// the same way.
    pub fn per_shard(mut self) -> Self {
        self.shard_terms = true;
        self
    }

    /// Reports every term's proof into the elector's metrics (`tenure_fence_enforced`,
    /// `tenure_fence_checks_total`), which `--listen` serves and the chart's alert watches.
    pub fn with_metrics(mut self, metrics: tenure::election::ElectionMetrics) -> Self {
        // A Fencer is a handle (its state is shared); Drop on Self forbids moving it out.
        self.fencer = self.fencer.clone().with_metrics(metrics);
        self
    }

    /// Lets a refusal after a term name the holder that followed (one lease: the elector's).
    pub fn follow_leader(mut self, leader: watch::Receiver<Option<Leader>>) -> Self {
        self.leader = Some(leader);
        self
    }

    /// Proves `term`'s fence, starts its endpoint and writes its files; the environment the
    /// command gets, and the guard that ends all of it ([`Begun::Fenced`]). [`Begun::Ended`]
    /// when the term ended during the proof (a shutdown signal): then nothing is started, and
    /// no verdict is logged, since a proof stopped by the term's end says nothing about the
    /// fence. [`Begun::Unproven`] only for shard terms ([`per_shard`](Self::per_shard)).
    pub async fn begin(&self, term: &Term) -> Result<Begun, CliError> {
        let lease = format!("{}/{}", self.namespace, term.lease_name());
        let state = tokio::select! {
            biased;
            () = term.cancellation().cancelled() => return Ok(Begun::Ended),
            state = self.fencer.prove(term) => state,
        };
        if term.cancellation().is_cancelled() {
            return Ok(Begun::Ended);
        }
        // The command starts only with its writes fenced: a fence that cannot be proven fails
        // the term (exit 8) rather than run a job whose writes would all be refused, or
        // worse, report success having written nothing. A shard term the API server did not
        // answer, or that is already superseded, fails alone (see `per_shard`).
        match state {
            FenceState::Enforced => {
                tracing::info!(%lease, fencing_token = %term.fencing_token(), "fence proven: the command's writes are fenced");
            }
            FenceState::Superseded { current } if self.shard_terms => {
                tracing::warn!(
                    %lease,
                    fencing_token = %term.fencing_token(),
                    ?current,
                    "--fence: a newer term of this shard exists, so its command was not started: this shard's term ends; the replica's other shards keep theirs"
                );
                return Ok(Begun::Unproven);
            }
            FenceState::Superseded { current } => {
                return superseded(term, &lease, &current).await;
            }
            state if self.shard_terms && state.is_unanswered() => {
                let FenceState::Unenforced { cause } = state else {
                    unreachable!("is_unanswered holds only for Unenforced");
                };
                tracing::error!(
                    %lease,
                    fencing_token = %term.fencing_token(),
                    "--fence: the fence on lease {lease} could not be proven, so this shard's command was not started and its term ends (the replica's other shards keep theirs; the shard is campaigned for again): {cause}"
                );
                return Ok(Begun::Unproven);
            }
            FenceState::Unenforced { cause } => {
                return Err(CliError::Unfenced {
                    message: format!(
                        "--fence: the fence on lease {lease} is not enforced, so the command was not started: {cause}"
                    ),
                });
            }
            other => {
                return Err(CliError::Unfenced {
                    message: format!(
                        "--fence: the fence on lease {lease} could not be proven ({other:?}), so the command was not started"
                    ),
                });
            }
        }
        let proxy = FenceProxy::start(&self.fencer, term, self.leader.clone())
            .await
            .map_err(|e| CliError::Internal {
                message: format!("--fence: cannot start the fenced endpoint on loopback: {e}"),
            })?;
        let kubeconfig = self.dir.join(format!("{}.kubeconfig", term.lease_name()));
        let written = write_private(&kubeconfig, &proxy.kubeconfig(&self.namespace));
        let env = vec![
            (ENV_KUBECONFIG, kubeconfig.display().to_string()),
            (ENV_KUBE_SERVER, proxy.url()),
        ];
        // Made before the write's result is looked at: a partly written file goes with it.
        let guard = TermFence {
            _proxy: proxy,
            kubeconfig,
        };
        written.map_err(|e| CliError::Internal {
            message: format!("--fence: cannot write the term's kubeconfig: {e}"),
        })?;
        Ok(Begun::Fenced(guard, env))
    }
}

/// One lease, a term whose proof found a newer term of its lease: the term is already lost,
/// since the grant that raised the floor also moved the Lease on, so this replica's next
/// renewal fails. The elector's verdict on the lost term (exit 3, or `--rejoin`'s next
/// campaign) is the one to report, not an unproven fence's exit 8, which would send the
/// operator looking for a configuration error there is none of. The wait is bounded: a term
/// still valid past the validity it had at the proof kept renewing a Lease whose floor says
/// another term began — a floor this election's grants did not write — and that fails
/// closed and loud, as an unproven fence.
async fn superseded(term: &Term, lease: &str, current: &Current) -> Result<Begun, CliError> {
    tracing::warn!(
        %lease,
        fencing_token = %term.fencing_token(),
        ?current,
        "--fence: a newer term of this lease exists, so the command was not started: this term is lost and ends at this replica's next renewal"
    );
    let deadline = term.valid_until();
    tokio::select! {
        () = term.cancellation().cancelled() => Ok(Begun::Ended),
        () = tokio::time::sleep_until(deadline) => Err(CliError::Unfenced {
            message: format!(
                "--fence: the fence on lease {lease} refuses this term's own token {} as stale ({current:?}), yet this replica still holds the lease past the validity it had at the proof: the Lease's fencing floor (annotation {FENCING_FLOOR_ANNOTATION}) is above every token this API server issues, which this election's grants never write (an etcd restored from an older backup, or an edited annotation; remove it once no writer of an older term can be running); the command was not started",
                term.fencing_token()
            ),
        }),
    }
}

impl Drop for CommandFence {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One term's endpoint and kubeconfig: dropping it stops the endpoint (held only for that)
/// and removes the file.
pub struct TermFence {
    _proxy: FenceProxy,
    kubeconfig: PathBuf,
}

impl Drop for TermFence {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

/// A new directory only this user can enter; never one that existed (a planted one in a
/// shared /tmp could be read by its owner).
fn private_dir(parent: &Path) -> std::io::Result<PathBuf> {
    let pid = std::process::id();
    let mut last = None;
    for attempt in 0..8u32 {
        let dir = parent.join(format!("tenure-fence-{pid}-{attempt}"));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free directory name")))
}

/// Writes `text` to `path` through a new 0600 file renamed over it: a reader sees the old
/// file or the new one, never a part.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(text.as_bytes())?;
    drop(file);
    std::fs::rename(&tmp, path)
}
