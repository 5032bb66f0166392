//! Who leads, as this candidate last saw it: [`Leader`], and the watch that the elector keeps
//! current from the store's holder changes and its own terms.

use tokio::sync::watch;

use crate::backend::{FencingToken, HolderChange};

/// Who leads, as seen by any candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The leader's identity.
    pub identity: String,
    /// The fencing token of its term, when the store reports it.
    pub fencing: Option<FencingToken>,
}

/// The leader as last seen, shared by an elector's clones; receivers wake only on a change.
pub(super) struct LeaderWatch(watch::Sender<Option<Leader>>);

impl LeaderWatch {
    /// No leader known yet.
    pub(super) fn new() -> Self {
        Self(watch::channel(None).0)
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<Option<Leader>> {
        self.0.subscribe()
    }

    /// Takes in a holder change: the holder it names (none when the lease is free) leads.
    pub(super) fn publish(&self, change: &HolderChange) {
        let leader = change.holder.as_ref().map(|identity| Leader {
            identity: identity.clone(),
            fencing: change.fencing,
        });
        self.0.send_if_modified(|current| {
            if *current == leader {
                return false;
            }
            current.clone_from(&leader);
            true
        });
    }

    /// Clears the leader if it is `identity` (in the term with `fencing`, when given): that
    /// term is over, and who leads next is unknown until the store says.
    pub(super) fn forget(&self, identity: &str, fencing: Option<FencingToken>) {
        self.0.send_if_modified(|current| {
            let own = current.as_ref().is_some_and(|l| {
                l.identity == identity && fencing.is_none_or(|f| l.fencing == Some(f))
            });
            if own {
                *current = None;
            }
            own
        });
    }
}
