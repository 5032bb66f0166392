//! One reconcile of a term: the user's reconciler and error policy as one shared function
//! ([`ReconcileFn`]), what a term hands each reconcile ([`Session`]), and the applier's items
//! with the error policy's action carried in the error ([`Failed`]). The standby, the grant's
//! first pass and the sharded controller all reconcile through these.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use futures::{FutureExt, TryFuture, TryFutureExt};
use kube::Resource;
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::ObjectRef;

use super::ControllerError;
use crate::election::Term;

/// What the applier of a standby reports, its reconcile errors carrying the error policy's
/// action.
pub(super) type Item<K, E> =
    Result<(ObjectRef<K>, Action), controller::Error<Failed<E>, ControllerError>>;

/// A reconcile's error with the action the error policy chose for it (the policy needs the
/// term's context, which only the reconcile has; the applier's own policy reads the action).
pub(super) struct Failed<E> {
    pub(super) error: E,
    pub(super) action: Action,
}

impl<E: fmt::Debug> fmt::Debug for Failed<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failed")
            .field("error", &self.error)
            .field("action", &self.action)
            .finish()
    }
}

impl<E: fmt::Display> fmt::Display for Failed<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<E: std::error::Error> std::error::Error for Failed<E> {}

/// The user's reconciler with its error policy, as one function of the object and the term's
/// context: built once per controller ([`reconcile_fn`]), shared by every term's applier.
pub(super) type ReconcileFn<K, Ctx, E> =
    Arc<dyn Fn(Arc<K>, Arc<Ctx>) -> BoxFuture<'static, Result<Action, Failed<E>>> + Send + Sync>;

/// The reconciler (called one at a time: kube-runtime's takes `FnMut`) and error policy as a
/// [`ReconcileFn`].
pub(super) fn reconcile_fn<K, R, RFut, EP, Ctx>(
    reconciler: R,
    error_policy: EP,
) -> ReconcileFn<K, Ctx, RFut::Error>
where
    K: Send + Sync + 'static,
    R: FnMut(Arc<K>, Arc<Ctx>) -> RFut + Send + 'static,
    RFut: TryFuture<Ok = Action> + Send + 'static,
    RFut::Error: Send + 'static,
    EP: Fn(Arc<K>, &RFut::Error, Arc<Ctx>) -> Action + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
{
    let reconciler = Mutex::new(reconciler);
    let error_policy = Arc::new(error_policy);
    Arc::new(move |obj: Arc<K>, ctx: Arc<Ctx>| {
        let work = {
            let mut reconcile = reconciler.lock().unwrap_or_else(PoisonError::into_inner);
            TryFutureExt::into_future(reconcile(obj.clone(), ctx.clone()))
        };
        let error_policy = error_policy.clone();
        async move {
            work.await.map_err(|error| Failed {
                action: error_policy(obj, &error, ctx),
                error,
            })
        }
        .boxed()
    })
}

/// What the grant hands the term's reconciles: the term and its context.
pub(super) struct Session<Ctx> {
    pub(super) term: Term,
    pub(super) ctx: Arc<Ctx>,
}

/// An applier's item with the reconcile error as the reconciler returned it.
pub(super) fn unwrap_failed<K, E>(
    item: Item<K, E>,
) -> Result<(ObjectRef<K>, Action), controller::Error<E, ControllerError>>
where
    K: Resource<DynamicType = ()> + 'static,
    E: 'static,
{
    use controller::Error as E2;
    item.map_err(|e| match e {
        E2::ReconcilerFailed(failed, obj) => E2::ReconcilerFailed(failed.error, obj),
        E2::ObjectNotFound(obj) => E2::ObjectNotFound(obj),
        E2::QueueError(e) => E2::QueueError(e),
        E2::RunnerError(e) => E2::RunnerError(e),
    })
}

/// One reconcile of the term: the user's reconcile of `obj` with the term's context, unless
/// the term has ended.
pub(super) fn granted<K, Ctx, E>(
    session: &Session<Ctx>,
    reconcile: &ReconcileFn<K, Ctx, E>,
    obj: Arc<K>,
) -> BoxFuture<'static, Result<Action, Failed<E>>>
where
    K: Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: Send + 'static,
{
    if session.term.cancellation().is_cancelled() {
        return futures::future::ready(Ok(Action::await_change())).boxed();
    }
    reconcile(obj, session.ctx.clone())
}
