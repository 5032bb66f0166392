//! Leadership Events on the Lease (`<identity> became leader` / `stopped leading`, reason
//! `LeaderElection`), written as client-go's `LeaseLock.RecordEvent` writes them.

use kube::api::{Api, PostParams};

use super::error::{self, Op};
use super::inner::{Fail, Inner};
use super::record;
use super::slots::Traffic;
use super::state::Current;
use crate::backend::{BackendError, BackendErrorKind, LeadershipEvent};

impl Inner {
    /// Writes a Normal Event, reason `LeaderElection`, on the Lease, as client-go's
    /// `LeaseLock.RecordEvent` does: "<identity> became leader" / "<identity> stopped leading".
    pub(super) async fn record_event(
        &self,
        name: &str,
        event: &LeadershipEvent,
    ) -> Result<(), BackendError> {
        let (identity, what, note) = match event {
            LeadershipEvent::BecameLeader { identity, fencing } => (
                identity,
                "became leader",
                format!("fencing token {fencing}"),
            ),
            LeadershipEvent::StoppedLeading {
                identity,
                fencing,
                reason,
            } => (
                identity,
                "stopped leading",
                format!("fencing token {fencing}: {reason}"),
            ),
        };
        let (uid, rv) = {
            let locks = self.locks();
            match locks.get(name).and_then(|st| st.known.clone()) {
                Some(Current::Present(seen)) => (seen.lease.metadata.uid.clone(), Some(seen.rv)),
                _ => (None, None),
            }
        };
        let now = k8s_openapi::jiff::Timestamp::now();
        let event: k8s_openapi::api::core::v1::Event = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": format!("{name}.{:x}", now.as_nanosecond()),
                "namespace": self.namespace,
                "annotations": { record::FENCING: note },
            },
            "involvedObject": {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "name": name,
                "namespace": self.namespace,
                "uid": uid,
                "resourceVersion": rv.map(|v| v.to_string()),
            },
            "reason": "LeaderElection",
            "message": format!("{identity} {what}"),
            "type": "Normal",
            "source": { "component": "tenure" },
            "reportingComponent": "tenure",
            "reportingInstance": identity,
            "firstTimestamp": now.to_string(),
            "lastTimestamp": now.to_string(),
            "count": 1,
        }))
        .map_err(|e| BackendError::new(BackendErrorKind::Protocol, format!("event: {e}")))?;
        let api: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(self.api.clone().into_client(), &self.namespace);
        let op = Op {
            verb: "create",
            resource: error::EVENTS,
            namespace: &self.namespace,
            name,
        };
        match self
            .call(
                op,
                Traffic::Ordinary,
                api.create(&PostParams::default(), &event),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(Fail::Error(e)) => Err(e),
            Err(Fail::NotFound | Fail::Conflict) => Ok(()),
        }
    }
}
