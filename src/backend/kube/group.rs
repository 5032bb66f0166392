//! The group record on Kubernetes (sharded leadership): one Lease per group, `{group}-group`,
//! holding [`GroupRecord::encode`]'s text in one annotation, read with a direct `GET` (a
//! quorum read, never the watch-fed view) and changed only by a compare-and-swap on its
//! `resourceVersion` (a create when there is none).
//!
//! The Lease carries no `tenure.dev/group` label, so the group's member watch never lists it.
//! Whatever else is found under that name (a plain election's Lease, an annotation tenure
//! cannot parse) is reported as [`GroupRead::Damaged`], never as an error.

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;

use super::inner::{Fail, Inner};
use super::read::ReadLease;
use super::record;
use super::slots::Traffic;
use crate::backend::{BackendError, BackendErrorKind, GroupRead, GroupRecord, GroupVersion};

/// The annotation holding the group record's text.
const GROUP_RECORD_ANNOTATION: &str = "tenure.dev/group-record";

/// The name of `group`'s record Lease, checked against Kubernetes' rule for object names.
fn record_name(group: &str) -> Result<String, BackendError> {
    let name = format!("{group}-group");
    record::validate_name(&name).map_err(|e| {
        BackendError::new(
            BackendErrorKind::Config,
            format!("group {group:?} cannot keep its record in a Lease: {e}"),
        )
    })?;
    Ok(name)
}

impl Inner {
    /// A fresh `GET` of a record Lease (a group's, a run-once job's): `None` when there is
    /// none.
    pub(super) async fn get_record(&self, name: &str) -> Result<Option<ReadLease>, BackendError> {
        let op = self.op("get", name);
        match self.call(op, Traffic::Ordinary, self.reads.get(name)).await {
            Ok(read) => Ok(Some(read)),
            Err(Fail::NotFound) => Ok(None),
            Err(Fail::Conflict) => Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!("{op}: unexpected 409"),
            )),
            Err(Fail::Error(e)) => Err(e),
        }
    }

    /// `group`'s record, read from the server.
    pub(super) async fn group_record(&self, group: &str) -> Result<GroupRead, BackendError> {
        let name = record_name(group)?;
        let Some(read) = self.get_record(&name).await? else {
            return Ok(GroupRead::Absent);
        };
        let lease = &read.lease;
        let Some(rv) = lease.metadata.resource_version.clone() else {
            return Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!(
                    "{}: the API server answered without a resourceVersion",
                    self.op("get", &name)
                ),
            ));
        };
        let text = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(GROUP_RECORD_ANNOTATION));
        let Some(text) = text else {
            let unparsed = read
                .damaged
                .as_ref()
                .map(|d| format!(" (read without {d}, which tenure cannot parse)"))
                .unwrap_or_default();
            return Ok(GroupRead::Damaged {
                reason: format!(
                    "Lease {}/{name} exists but is not a group record (a plain election of \
                     that name?): it has no {GROUP_RECORD_ANNOTATION} annotation{unparsed}",
                    self.namespace
                ),
            });
        };
        Ok(match GroupRead::parse(text.as_bytes(), GroupVersion(rv)) {
            GroupRead::Damaged { reason } => GroupRead::Damaged {
                reason: format!(
                    "Lease {}/{name}, annotation {GROUP_RECORD_ANNOTATION}: {reason}",
                    self.namespace
                ),
            },
            read => read,
        })
    }

    /// Writes `record` as `group`'s record if the Lease is still at `expected` (`None`: if
    /// there is none). `false` when another writer changed, created or deleted it first.
    pub(super) async fn swap_group_record(
        &self,
        group: &str,
        expected: Option<&GroupVersion>,
        record: &GroupRecord,
    ) -> Result<bool, BackendError> {
        let name = record_name(group)?;
        let pp = PostParams::default();
        let Some(GroupVersion(rv)) = expected else {
            let mut lease = Lease::default();
            lease.metadata.name = Some(name.clone());
            lease.metadata.annotations =
                Some([(GROUP_RECORD_ANNOTATION.to_owned(), record.encode())].into());
            let op = self.op("create", &name);
            return match self
                .call(op, Traffic::Ordinary, self.api.create(&pp, &lease))
                .await
            {
                Ok(_) => Ok(true),
                // AlreadyExists: another member created it first.
                Err(Fail::Conflict) => Ok(false),
                Err(Fail::NotFound) => Err(BackendError::new(
                    BackendErrorKind::Config,
                    format!("{op}: not found (404); does the namespace exist?"),
                )),
                Err(Fail::Error(e)) => Err(e),
            };
        };
        // Start from the Lease as it is, so what others keep in it (labels, other
        // annotations, a spec) is written back unchanged; the `PUT` carries `expected`, so a
        // write in between fails it with a conflict.
        let Some(read) = self.get_record(&name).await? else {
            return Ok(false);
        };
        if read.lease.metadata.resource_version.as_ref() != Some(rv) {
            return Ok(false);
        }
        let mut lease = read.lease;
        lease.metadata.resource_version = Some(rv.clone());
        lease
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(GROUP_RECORD_ANNOTATION.to_owned(), record.encode());
        match self
            .call(
                self.op("update", &name),
                Traffic::Ordinary,
                self.api.replace(&name, &pp, &lease),
            )
            .await
        {
            Ok(_) => Ok(true),
            // Changed or deleted since `expected` was read.
            Err(Fail::Conflict | Fail::NotFound) => Ok(false),
            Err(Fail::Error(e)) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_lease_name_must_be_a_lease_name() {
        assert_eq!(record_name("orders").expect("valid"), "orders-group");
        for bad in ["Orders", "a_b", "", &"x".repeat(250)] {
            let e = record_name(bad).expect_err(bad);
            assert_eq!(e.kind(), BackendErrorKind::Config, "{bad}");
        }
    }
}
