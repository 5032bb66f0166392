//! `FencedApi`: a kube `Api` bound to one term, whose writes carry and stamp the term's token
//! and whose refusals are typed.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::core::Status;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::OBJECT_TOKEN_ANNOTATION;
use super::error::{Current, FenceError, classify};
use crate::FencingToken;

/// A kube `Api<K>` bound to one term: writes carry and stamp the term's token.
///
/// Every method mirrors `Api`'s and takes no more arguments: a fenced write takes no more
/// lines than an unfenced one. Reads and everything else go through [`api`](Self::api),
/// whose client carries the token too.
///
/// # First write
///
/// Writes wait for the term's fence proof (see [`Fencer`](super::Fencer)): only once the API server refuses
/// the token below this term's does the first write go, so no stale write can land (on that
/// server) after it. While the proof fails, writes fail with [`FenceError::Unenforced`].
#[derive(Clone)]
pub struct FencedApi<K> {
    pub(super) api: Api<K>,
    pub(super) ours: FencingToken,
    /// The election its requests name, `namespace/lease`.
    pub(super) election: Arc<str>,
}

impl<K> Debug for FencedApi<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedApi")
            .field("ours", &self.ours)
            .field("election", &self.election)
            .finish_non_exhaustive()
    }
}

impl<K> FencedApi<K>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    K::DynamicType: Default,
{
    /// The underlying `Api` (same fenced client), for reads, lists, watches and the rest.
    #[must_use]
    pub fn api(&self) -> &Api<K> {
        &self.api
    }

    /// This term's token.
    #[must_use]
    pub fn fencing_token(&self) -> FencingToken {
        self.ours
    }

    fn stamped(&self, object: &K) -> K {
        let mut object = object.clone();
        object.annotations_mut().insert(
            OBJECT_TOKEN_ANNOTATION.to_owned(),
            self.ours.get().to_string(),
        );
        object
    }

    fn refuse_higher(&self, object: &K) -> Result<(), FenceError> {
        let stored = object
            .annotations()
            .get(OBJECT_TOKEN_ANNOTATION)
            .and_then(|t| t.parse::<u64>().ok());
        match stored {
            Some(theirs) if theirs > self.ours.get() => Err(FenceError::Stale {
                lease: None,
                ours: self.ours.get(),
                current: Current::Object(theirs),
            }),
            _ => Ok(()),
        }
    }

    /// Reads an object (a plain `get`).
    ///
    /// # Errors
    ///
    /// [`FenceError::Kube`] as `Api::get`.
    pub async fn get(&self, name: &str) -> Result<K, FenceError> {
        self.api.get(name).await.map_err(FenceError::Kube)
    }

    /// Sends one write and classifies a refusal.
    async fn write<T, Fut>(&self, send: impl Fn(Api<K>, bool) -> Fut) -> Result<T, FenceError>
    where
        Fut: Future<Output = kube::Result<T>>,
    {
        send(self.api.clone(), false)
            .await
            .map_err(|e| classify(e, self.ours.get(), &self.election))
    }

    /// Creates `object` with the term's token stamped on it.
    ///
    /// # Errors
    ///
    /// [`FenceError::Stale`] / [`FenceError::TermEnded`] as the type says; otherwise as
    /// `Api::create`.
    pub async fn create(&self, pp: &PostParams, object: &K) -> Result<K, FenceError> {
        let stamped = self.stamped(object);
        self.write(|api, dry_run| {
            let pp = PostParams {
                dry_run,
                ..pp.clone()
            };
            let stamped = &stamped;
            async move { api.create(&pp, stamped).await }
        })
        .await
    }

    /// Replaces `object` (with its `resourceVersion`, as read) with the term's token
    /// stamped on it. Refused locally when the object carries a higher token than ours.
    ///
    /// # Errors
    ///
    /// As [`create`](Self::create); a 409 when the object changed since it was read.
    pub async fn replace(&self, name: &str, pp: &PostParams, object: &K) -> Result<K, FenceError> {
        self.refuse_higher(object)?;
        let stamped = self.stamped(object);
        self.write(|api, dry_run| {
            let pp = PostParams {
                dry_run,
                ..pp.clone()
            };
            let stamped = &stamped;
            async move { api.replace(name, &pp, stamped).await }
        })
        .await
    }

    /// Replaces the status of `object`. The request carries the token (the policy fences
    /// it); the API server keeps the stored annotations on a status write.
    ///
    /// # Errors
    ///
    /// As [`replace`](Self::replace).
    pub async fn replace_status(
        &self,
        name: &str,
        pp: &PostParams,
        object: &K,
    ) -> Result<K, FenceError> {
        self.refuse_higher(object)?;
        self.write(|api, dry_run| {
            let pp = PostParams {
                dry_run,
                ..pp.clone()
            };
            async move { api.replace_status(name, &pp, object).await }
        })
        .await
    }

    /// Patches an object. Apply, merge and strategic patches also stamp the token on the
    /// object; a JSON patch is sent as given (the request still carries the token).
    ///
    /// # Errors
    ///
    /// As [`create`](Self::create).
    pub async fn patch<P: Serialize + Debug>(
        &self,
        name: &str,
        pp: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<K, FenceError> {
        let stamped = stamp_patch(patch, self.ours.get())?;
        self.write(|api, dry_run| {
            let pp = PatchParams {
                dry_run,
                ..pp.clone()
            };
            let stamped = stamped.as_ref();
            async move {
                match stamped {
                    Some(stamped) => api.patch(name, &pp, stamped).await,
                    None => api.patch(name, &pp, patch).await,
                }
            }
        })
        .await
    }

    /// Patches the status subresource (the request carries the token).
    ///
    /// # Errors
    ///
    /// As [`create`](Self::create).
    pub async fn patch_status<P: Serialize + Debug>(
        &self,
        name: &str,
        pp: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<K, FenceError> {
        self.write(|api, dry_run| {
            let pp = PatchParams {
                dry_run,
                ..pp.clone()
            };
            async move { api.patch_status(name, &pp, patch).await }
        })
        .await
    }

    /// Deletes an object. The request carries the token, so the policy refuses a stale
    /// leader's delete like any other write; pass `dp.preconditions` with the
    /// `resourceVersion` you read to refuse deleting an object changed since.
    ///
    /// # Errors
    ///
    /// As [`create`](Self::create).
    pub async fn delete(
        &self,
        name: &str,
        dp: &DeleteParams,
    ) -> Result<either::Either<K, Status>, FenceError> {
        self.write(|api, dry_run| {
            let dp = DeleteParams {
                dry_run,
                ..dp.clone()
            };
            async move { api.delete(name, &dp).await }
        })
        .await
    }
}

/// The patch with `metadata.annotations[tenure.dev/fencing-token]` set, for the patch types
/// that merge maps; `None` for a JSON patch (sent unchanged).
fn stamp_patch<P: Serialize>(
    patch: &Patch<P>,
    ours: u64,
) -> Result<Option<Patch<serde_json::Value>>, FenceError> {
    let stamp = |p: &P| -> Result<serde_json::Value, FenceError> {
        let mut value =
            serde_json::to_value(p).map_err(|e| FenceError::Kube(kube::Error::SerdeError(e)))?;
        if let Some(root) = value.as_object_mut() {
            let metadata = root
                .entry("metadata")
                .or_insert_with(|| serde_json::json!({}));
            if let Some(metadata) = metadata.as_object_mut() {
                let annotations = metadata
                    .entry("annotations")
                    .or_insert_with(|| serde_json::json!({}));
                if let Some(annotations) = annotations.as_object_mut() {
                    annotations.insert(OBJECT_TOKEN_ANNOTATION.to_owned(), ours.to_string().into());
                }
            }
        }
        Ok(value)
    };
    Ok(match patch {
        Patch::Apply(p) => Some(Patch::Apply(stamp(p)?)),
        Patch::Merge(p) => Some(Patch::Merge(stamp(p)?)),
        Patch::Strategic(p) => Some(Patch::Strategic(stamp(p)?)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_apply_and_strategic_patches_are_stamped() {
        let body =
            serde_json::json!({ "data": { "a": "1" }, "metadata": { "labels": { "l": "v" } } });
        for patch in [
            Patch::Merge(body.clone()),
            Patch::Apply(body.clone()),
            Patch::Strategic(body.clone()),
        ] {
            let stamped = stamp_patch(&patch, 42)
                .expect("serializable")
                .expect("stamped");
            let value = match stamped {
                Patch::Merge(v) | Patch::Apply(v) | Patch::Strategic(v) => v,
                _ => panic!("kind changed"),
            };
            assert_eq!(
                value["metadata"]["annotations"][OBJECT_TOKEN_ANNOTATION],
                "42"
            );
            assert_eq!(value["metadata"]["labels"]["l"], "v", "the rest is kept");
            assert_eq!(value["data"]["a"], "1");
        }
    }
}
