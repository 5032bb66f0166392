//! The command connection of a backend: a single server's (see [`server`](super::server)), or
//! a Redis Cluster's, which routes every call to the node serving its keys' slot (see
//! [`cluster`](super::cluster)).
//!
//! Only a single server takes many locks in one script call. In a cluster each lock's keys hash
//! to their own slot, possibly on another node, so there every script call carries one lock,
//! and a batch becomes concurrent calls.

use std::sync::Arc;

use ::redis::{Pipeline, Value};

use super::cluster::Cluster;
use super::server::{ConnError, Managed};

/// A connection shared by every lease of a backend; cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(Arc<Managed>),
    Cluster(Arc<Cluster>),
}

impl Conn {
    /// Whether one script call may carry the keys of many locks.
    pub(crate) fn batches(&self) -> bool {
        matches!(self, Self::Single(_))
    }

    /// Sends the `count` commands of `pipe` in one round trip. A cluster connection routes the
    /// whole pipeline by its first command with a key, so every command must share its slot.
    pub(crate) async fn send(
        &self,
        pipe: &Pipeline,
        count: usize,
    ) -> Result<Vec<Value>, ConnError> {
        match self {
            Self::Single(m) => m.send(pipe, count).await,
            Self::Cluster(c) => c.send(pipe, count).await,
        }
    }

    /// Loads `sources` into the script cache: in one round trip on a single server, on every
    /// node of a cluster. Returns each load's reply.
    pub(crate) async fn load(&self, sources: &[&str]) -> Result<Vec<Value>, ConnError> {
        match self {
            Self::Single(m) => {
                let mut pipe = ::redis::pipe();
                for src in sources {
                    pipe.cmd("SCRIPT").arg("LOAD").arg(*src);
                }
                m.send(&pipe, sources.len()).await
            }
            Self::Cluster(c) => c.load(sources).await,
        }
    }
}
