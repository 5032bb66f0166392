//! What the backend's user may do with a Lease, asked of the API server itself
//! (SelfSubjectAccessReview), so that a missing permission shows when a candidate starts, not
//! when it first has to take over — possibly weeks later, when the leader dies.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::KubeBackend;
use super::error::{Op, REVIEWS, map};
use crate::backend::BackendError;

/// What an elector does with its Lease, by name: read it, watch it (list and watch with a
/// `metadata.name` field selector, which RBAC matches against `resourceNames`), and renew or
/// take it over.
const ON_THE_LEASE: [&str; 4] = ["get", "list", "watch", "update"];

impl KubeBackend {
    /// The permissions an elector needs on Lease `name` that the API server says this
    /// backend's user lacks, as `verb` strings: `get`, `list`, `watch`, `update` (on that
    /// Lease) and `create` (on Leases: RBAC cannot restrict a create by name). Empty when all
    /// are granted. Events, which tenure only announces, are not checked.
    ///
    /// Each check is a `SelfSubjectAccessReview`, which every authenticated user may create.
    /// A candidate without `update` otherwise follows without a complaint while another
    /// replica leads, and fails only when it has to take over.
    ///
    /// # Errors
    ///
    /// A [`BackendError`] when a review itself fails (unreachable server, a server or proxy
    /// that refuses reviews): then nothing is known either way.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn f(backend: tenure::backend::kube::KubeBackend) -> Result<(), tenure::backend::BackendError> {
    /// let missing = backend.missing_permissions("nightly-report").await?;
    /// if !missing.is_empty() {
    ///     eprintln!("may not {} the lease", missing.join(", "));
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn missing_permissions(&self, name: &str) -> Result<Vec<&'static str>, BackendError> {
        let checks = ON_THE_LEASE
            .iter()
            .map(|verb| (*verb, Some(name)))
            .chain([("create", None)]);
        self.missing_of(checks).await
    }

    /// The permissions a run-once job (`tenure run --once-per`) needs on its completion record,
    /// the Lease `{name}-done`, that this backend's user lacks: `get` and `update` on it and
    /// `create` on Leases. Empty when all are granted.
    ///
    /// # Errors
    ///
    /// A [`BackendError`] when a review itself fails, or when `{name}-done` is not a valid
    /// Lease name (`name` longer than 248 characters).
    pub async fn missing_completion_permissions(
        &self,
        name: &str,
    ) -> Result<Vec<&'static str>, BackendError> {
        let record = super::completion::record_name(name)?;
        self.missing_of([
            ("get", Some(record.as_str())),
            ("update", Some(record.as_str())),
            ("create", None),
        ])
        .await
    }

    /// The verbs of `checks` (each on the Lease named, or on Leases) this backend's user may
    /// not use, in the order given. The reviews go out together: they run before every
    /// campaign of `tenure run`, and one after another they were a round trip each on the
    /// start path (issue #45).
    async fn missing_of<'a>(
        &self,
        checks: impl IntoIterator<Item = (&'static str, Option<&'a str>)>,
    ) -> Result<Vec<&'static str>, BackendError> {
        let answers = futures::future::try_join_all(
            checks
                .into_iter()
                .map(|(verb, lease)| async move { Ok((verb, self.may(verb, lease).await?)) }),
        )
        .await?;
        Ok(answers
            .into_iter()
            .filter(|(_, allowed)| !allowed)
            .map(|(verb, _)| verb)
            .collect())
    }

    /// Whether this backend's user may `verb` Leases (the one named `lease`, if given) in its
    /// namespace.
    async fn may(&self, verb: &'static str, lease: Option<&str>) -> Result<bool, BackendError> {
        let reviews: Api<SelfSubjectAccessReview> = Api::all(self.inner.api.clone().into_client());
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some("coordination.k8s.io".into()),
                    resource: Some("leases".into()),
                    verb: Some(verb.into()),
                    namespace: Some(self.inner.namespace.clone()),
                    name: lease.map(str::to_owned),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let op = Op {
            verb: "create",
            resource: REVIEWS,
            namespace: &self.inner.namespace,
            name: lease.unwrap_or("*"),
        };
        let answer = tokio::time::timeout(
            self.inner.request_timeout,
            reviews.create(&PostParams::default(), &review),
        )
        .await
        .map_err(|_| BackendError::timeout(&op.to_string(), self.inner.request_timeout))?
        .map_err(|e| map(e, op))?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}
