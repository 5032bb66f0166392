//! The command connection of a backend: one multiplexed [`ConnectionManager`] to a single
//! server, or a Redis Cluster connection that routes every call to the node serving its keys'
//! slot.
//!
//! Only a single server takes many locks in one script call. In a cluster each lock's keys hash
//! to their own slot, possibly on another node, so there every script call carries one lock,
//! and a batch becomes concurrent calls.

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Pipeline, RedisResult, Value};

/// A connection shared by every lease of a backend; cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    /// Whether one script call may carry the keys of many locks.
    pub(crate) fn batches(&self) -> bool {
        matches!(self, Self::Single(_))
    }

    /// Sends the `count` commands of `pipe` in one round trip. A cluster connection routes the
    /// whole pipeline by its first command with a key, so every command must share its slot.
    pub(crate) async fn send(&self, pipe: &Pipeline, count: usize) -> RedisResult<Vec<Value>> {
        match self {
            Self::Single(c) => c.clone().send_packed_commands(pipe, 0, count).await,
            Self::Cluster(c) => c.clone().req_packed_commands(pipe, 0, count).await,
        }
    }

    /// Loads `sources` into the script cache: in one round trip on a single server, on every
    /// node of a cluster. Returns each load's reply.
    pub(crate) async fn load(&self, sources: &[&str]) -> RedisResult<Vec<Value>> {
        match self {
            Self::Single(c) => {
                let mut pipe = ::redis::pipe();
                for src in sources {
                    pipe.cmd("SCRIPT").arg("LOAD").arg(*src);
                }
                c.clone()
                    .send_packed_commands(&pipe, 0, sources.len())
                    .await
            }
            Self::Cluster(c) => {
                let mut out = Vec::with_capacity(sources.len());
                for src in sources {
                    // Routed to all nodes by the connection (SCRIPT LOAD has no key).
                    let mut cmd = ::redis::cmd("SCRIPT");
                    cmd.arg("LOAD").arg(*src);
                    out.push(c.clone().req_packed_command(&cmd).await?);
                }
                Ok(out)
            }
        }
    }
}
