//! A run-once job's completion record on Kubernetes: one Lease per election, `{lease}-done`,
//! whose annotations hold the record ([`Completion::encode`]'s text in
//! `tenure.dev/completion`) and the check mark (`tenure.dev/completion-check`: the fencing
//! token of the latest term that checked, and a random nonce).
//!
//! A grant and the record are two objects, which no request changes together, so the record
//! is fenced by the check: every term writes its token into the mark (a compare-and-swap on
//! the record Lease's `resourceVersion`, reading the record in the same step) before it runs
//! the job, and a completion is written (again a compare-and-swap) only while the mark still
//! holds the writer's token. An older term's completion is therefore refused from the moment
//! a newer term has checked, and a newer term's check that comes after an older term's
//! completion sees it.
//!
//! Time is the API server's: the check's own write changes the mark (the nonce changes on
//! every check), so the server stamps its `managedFields` entry (field manager
//! `tenure-completion`) with its clock — whole seconds. `renewTime` and every other time a
//! client writes are never read.

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;

use super::inner::{Fail, Inner};
use super::read::ReadLease;
use super::record;
use super::slots::Traffic;
use crate::backend::completion::MAX_COMPLETION_RECORD;
use crate::backend::{
    BackendError, BackendErrorKind, Completion, CompletionCheck, CompletionRead, FencingToken,
    HolderToken,
};

/// The annotation holding the completion record's text.
pub(super) const COMPLETION_ANNOTATION: &str = "tenure.dev/completion";
/// The annotation holding `<token>:<nonce>` of the latest term that checked.
pub(super) const CHECK_ANNOTATION: &str = "tenure.dev/completion-check";
/// The field manager of the check's write: its `managedFields` time is the server's clock.
const FIELD_MANAGER: &str = "tenure-completion";
/// Compare-and-swap attempts before giving up on a record that keeps changing.
const ATTEMPTS: usize = 8;

/// The name of `lease`'s record Lease, checked against Kubernetes' rule for object names.
pub(super) fn record_name(lease: &str) -> Result<String, BackendError> {
    let name = format!("{lease}-done");
    record::validate_name(&name).map_err(|e| {
        BackendError::new(
            BackendErrorKind::Config,
            format!(
                "lease {lease:?} cannot keep a completion record in a Lease (at most {} characters for a run-once job): {e}",
                record::MAX_NAME_LEN - "-done".len()
            ),
        )
    })?;
    Ok(name)
}

/// The token of a check mark, if it is one (a mark another process wrote is untrusted: a bad
/// one counts as no mark, and the next check replaces it).
fn checked_token(lease: &Lease) -> Option<u64> {
    let mark = lease.metadata.annotations.as_ref()?.get(CHECK_ANNOTATION)?;
    let (token, _nonce) = mark.split_once(':')?;
    (token.len() <= 20 && token.bytes().all(|b| b.is_ascii_digit()))
        .then(|| token.parse().ok())
        .flatten()
}

/// The completion record as the record Lease holds it, bounded.
fn completion_of(read: &ReadLease) -> CompletionRead {
    let text = read
        .lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(COMPLETION_ANNOTATION));
    match text {
        None => CompletionRead::Absent,
        Some(t) if t.len() > MAX_COMPLETION_RECORD => CompletionRead::Damaged {
            reason: format!(
                "annotation {COMPLETION_ANNOTATION} is {} bytes, longer than any completion record",
                t.len()
            ),
        },
        Some(t) => match CompletionRead::parse(t.as_bytes()) {
            CompletionRead::Damaged { reason } => CompletionRead::Damaged {
                reason: format!("annotation {COMPLETION_ANNOTATION}: {reason}"),
            },
            read => read,
        },
    }
}

/// The API server's time of this field manager's latest write, in milliseconds since the
/// Unix epoch.
fn server_time_ms(lease: &Lease) -> Option<u64> {
    lease
        .metadata
        .managed_fields
        .as_ref()?
        .iter()
        .filter(|e| e.manager.as_deref() == Some(FIELD_MANAGER))
        .filter_map(|e| e.time.as_ref())
        .map(|t| t.0.as_millisecond())
        .max()
        .and_then(|ms| u64::try_from(ms).ok())
}

impl Inner {
    /// `lease`'s completion record and the API server's clock, after marking that the term
    /// with `token` checked (unless a later term already did: then nothing is written).
    pub(super) async fn check_completion(
        &self,
        lease: &str,
        token: FencingToken,
    ) -> Result<CompletionCheck, BackendError> {
        let name = record_name(lease)?;
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        for _ in 0..ATTEMPTS {
            let read = self.get_record(&name).await?;
            if let Some(read) = &read
                && checked_token(&read.lease).is_some_and(|t| t > token.get())
            {
                // A later term checked: this one is over. The time matters to no decision;
                // it is the server's time of the record's last check.
                return Ok(CompletionCheck {
                    now_ms: server_time_ms(&read.lease).unwrap_or(0),
                    last: completion_of(read),
                    latest: false,
                });
            }
            let last = read.as_ref().map_or(CompletionRead::Absent, completion_of);
            let mut lease_obj = read.map_or_else(Lease::default, |r| r.lease);
            lease_obj.metadata.name = Some(name.clone());
            let mark = format!("{token}:{}", &HolderToken::random().to_hex()[..16]);
            lease_obj
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(CHECK_ANNOTATION.to_owned(), mark);
            // The server fills managedFields in; what was read is not sent back.
            lease_obj.metadata.managed_fields = None;
            let written = if lease_obj.metadata.resource_version.is_some() {
                let op = self.op("update", &name);
                self.call(
                    op,
                    Traffic::Ordinary,
                    self.api.replace(&name, &params, &lease_obj),
                )
                .await
            } else {
                let op = self.op("create", &name);
                self.call(op, Traffic::Ordinary, self.api.create(&params, &lease_obj))
                    .await
            };
            match written {
                Ok(stored) => {
                    let now_ms = server_time_ms(&stored).ok_or_else(|| {
                        BackendError::new(
                            BackendErrorKind::Protocol,
                            format!(
                                "{}: the API server's answer has no managedFields time for field manager {FIELD_MANAGER}",
                                self.op("update", &name)
                            ),
                        )
                    })?;
                    return Ok(CompletionCheck {
                        now_ms,
                        last,
                        latest: true,
                    });
                }
                // Changed, created or deleted since it was read: read again.
                Err(Fail::Conflict | Fail::NotFound) => {}
                Err(Fail::Error(e)) => return Err(e),
            }
        }
        Err(kept_changing(&self.namespace, &name))
    }

    /// Writes `record` as `lease`'s completion record if the check mark still holds its token.
    pub(super) async fn record_completion(
        &self,
        lease: &str,
        record: &Completion,
    ) -> Result<bool, BackendError> {
        let name = record_name(lease)?;
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        for _ in 0..ATTEMPTS {
            let Some(read) = self.get_record(&name).await? else {
                return Ok(false);
            };
            if checked_token(&read.lease) != Some(record.token.get()) {
                return Ok(false);
            }
            let mut lease_obj = read.lease;
            lease_obj.metadata.managed_fields = None;
            lease_obj
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(COMPLETION_ANNOTATION.to_owned(), record.encode());
            let op = self.op("update", &name);
            match self
                .call(
                    op,
                    Traffic::Ordinary,
                    self.api.replace(&name, &params, &lease_obj),
                )
                .await
            {
                Ok(_) => return Ok(true),
                Err(Fail::Conflict) => {}
                Err(Fail::NotFound) => return Ok(false),
                Err(Fail::Error(e)) => return Err(e),
            }
        }
        Err(kept_changing(&self.namespace, &name))
    }
}

/// Every compare-and-swap lost: something rewrites the record Lease all the time.
fn kept_changing(namespace: &str, name: &str) -> BackendError {
    BackendError::new(
        BackendErrorKind::Unavailable,
        format!(
            "Lease {namespace}/{name} changed under each of {ATTEMPTS} compare-and-swap attempts"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(annotation: &str, value: &str) -> Lease {
        let mut l = Lease::default();
        l.metadata.annotations = Some([(annotation.to_owned(), value.to_owned())].into());
        l
    }

    #[test]
    fn the_record_lease_name_must_be_a_lease_name() {
        assert_eq!(record_name("nightly").expect("valid"), "nightly-done");
        let longest = "x".repeat(record::MAX_NAME_LEN - 5);
        assert!(record_name(&longest).is_ok());
        let e = record_name(&format!("{longest}x")).expect_err("too long");
        assert_eq!(e.kind(), BackendErrorKind::Config);
        assert!(e.to_string().contains("at most 248"), "{e}");
    }

    #[test]
    fn check_marks_from_others_are_untrusted() {
        assert_eq!(checked_token(&with(CHECK_ANNOTATION, "42:abcd")), Some(42));
        for bad in [
            "42",
            "",
            ":x",
            "-1:x",
            "4x:y",
            &format!("{}:x", "9".repeat(21)),
        ] {
            assert_eq!(checked_token(&with(CHECK_ANNOTATION, bad)), None, "{bad:?}");
        }
        assert_eq!(checked_token(&Lease::default()), None);
    }

    #[test]
    fn completions_are_bounded_and_parsed_alone() {
        let read = |l: Lease| {
            completion_of(&ReadLease {
                lease: l,
                damaged: None,
            })
        };
        assert_eq!(read(Lease::default()), CompletionRead::Absent);
        assert!(matches!(
            read(with(COMPLETION_ANNOTATION, "c1:7:1000:5:web-1")),
            CompletionRead::Present(c) if c.token.get() == 7
        ));
        assert!(matches!(
            read(with(COMPLETION_ANNOTATION, &"x".repeat(1 << 20))),
            CompletionRead::Damaged { reason } if reason.contains("longer") && reason.len() < 200
        ));
        assert!(matches!(
            read(with(COMPLETION_ANNOTATION, "garbage")),
            CompletionRead::Damaged { .. }
        ));
    }
}
