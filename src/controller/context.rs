//! What each term's reconciles get as their context: the same `Arc<Ctx>` for every term (as
//! kube-runtime's `Controller::run` takes it), or one made for each term ([`per_term`]), so a
//! reconcile reaches its term's fencing token and fenced clients through the context it
//! already receives — in single and sharded leadership alike.

use std::sync::Arc;

use crate::election::Term;

/// The context of a term's reconciles: given to [`Controller::run`](super::Controller::run)
/// and [`run_sharded`](super::Controller::run_sharded) where kube-runtime's `run` takes an
/// `Arc<Ctx>`.
///
/// Implemented by `Arc<Ctx>` (one context for every term) and by [`PerTerm`] (a context made
/// at the start of each term, or of each shard term in sharded mode).
pub trait TermContext<Ctx>: Send + 'static {
    /// The context of the reconciles of `term`; called once per term, before its first
    /// reconcile.
    fn for_term(&mut self, term: &Term) -> Arc<Ctx>;
}

impl<Ctx: Send + Sync + 'static> TermContext<Ctx> for Arc<Ctx> {
    fn for_term(&mut self, _: &Term) -> Arc<Ctx> {
        Arc::clone(self)
    }
}

/// A context made for each term by a function of the term: see [`per_term`].
#[derive(Clone, Debug)]
pub struct PerTerm<F>(F);

/// The context of each term's reconciles, made from the term when it begins: its fenced
/// clients, its token, anything that must not outlive it.
///
/// # Example
///
/// ```no_run
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use tenure::controller::per_term;
/// use tenure::fence::kube::{FencedApi, Fencer};
///
/// struct Data {
///     /// This term's fenced ConfigMaps: every write carries the term's token.
///     cms: FencedApi<ConfigMap>,
/// }
///
/// # fn demo(fencer: Fencer) {
/// let context = per_term(move |term| {
///     Arc::new(Data {
///         cms: fencer.namespaced(term, "default"),
///     })
/// });
/// # let _ = context;
/// # }
/// ```
pub fn per_term<F, Ctx>(make: F) -> PerTerm<F>
where
    F: FnMut(&Term) -> Arc<Ctx> + Send + 'static,
{
    PerTerm(make)
}

impl<F, Ctx> TermContext<Ctx> for PerTerm<F>
where
    F: FnMut(&Term) -> Arc<Ctx> + Send + 'static,
{
    fn for_term(&mut self, term: &Term) -> Arc<Ctx> {
        (self.0)(term)
    }
}
