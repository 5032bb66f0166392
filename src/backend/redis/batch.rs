//! Group commit: coalesces concurrent requests of one kind into batched calls, without adding
//! latency to a lone caller.
//!
//! A request that finds no call in flight is sent at once, from the caller's own task, as a
//! batch of one. Requests that arrive while a call is in flight queue up; when that call
//! returns, everything queued leaves together in one batch (sent from a spawned task, since the
//! caller that landed returns its own answer). Under load the batch size grows with the
//! concurrency; with a single caller nothing ever queues.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::oneshot;

use crate::backend::{BackendError, BackendErrorKind};

/// Runs one batch: one answer per request, in order.
pub(crate) type Exec<R, T> =
    Arc<dyn Fn(Vec<R>) -> BoxFuture<'static, Vec<Result<T, BackendError>>> + Send + Sync>;

/// Coalesces requests of type `R` answered with `T`.
pub(crate) struct Coalescer<R, T> {
    inner: Arc<Inner<R, T>>,
}

struct Inner<R, T> {
    state: Mutex<State<R, T>>,
    exec: Exec<R, T>,
    /// Calls allowed in flight at once; more requests queue. `usize::MAX`: no coalescing.
    max_in_flight: usize,
    /// The bound on a batch sent from the queue (a caller's own call is bounded by its caller).
    timeout: Duration,
}

struct State<R, T> {
    in_flight: usize,
    queue: Vec<Queued<R, T>>,
}

struct Queued<R, T> {
    req: R,
    tx: oneshot::Sender<Result<T, BackendError>>,
    /// Whether the request may be skipped when its caller has gone (acquire, renew: not
    /// sending them changes nothing; a release is always sent).
    skippable: bool,
}

impl<R: Send + 'static, T: Send + 'static> Coalescer<R, T> {
    /// A coalescer running batches with `exec`; `max_in_flight` calls at once.
    pub(crate) fn new(exec: Exec<R, T>, max_in_flight: usize, timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    in_flight: 0,
                    queue: Vec::new(),
                }),
                exec,
                max_in_flight: max_in_flight.max(1),
                timeout,
            }),
        }
    }

    /// Sends `req`, alone at once if nothing is in flight, otherwise with the next batch.
    ///
    /// Cancel safety: dropping the future of a request sent alone cancels the wait for its
    /// answer, not the request; a queued request still goes out with the next batch unless it is
    /// `skippable`.
    pub(crate) async fn call(&self, req: R, skippable: bool) -> Result<T, BackendError> {
        let route = {
            let mut st = self.inner.lock();
            if st.in_flight < self.inner.max_in_flight {
                st.in_flight += 1;
                Route::Alone(req)
            } else {
                let (tx, rx) = oneshot::channel();
                st.queue.push(Queued { req, tx, skippable });
                Route::Queued(rx)
            }
        };
        match route {
            Route::Alone(req) => {
                let _flight = Flight(self.inner.clone());
                let mut out = (self.inner.exec)(vec![req]).await;
                out.pop().unwrap_or_else(|| Err(no_answer()))
            }
            Route::Queued(rx) => rx.await.unwrap_or_else(|_| {
                Err(BackendError::new(
                    BackendErrorKind::Unavailable,
                    "the batch carrying this request was dropped",
                ))
            }),
        }
    }
}

enum Route<R, T> {
    Alone(R),
    Queued(oneshot::Receiver<Result<T, BackendError>>),
}

impl<R, T> Inner<R, T> {
    fn lock(&self) -> MutexGuard<'_, State<R, T>> {
        // Nothing panics while the lock is held; recover the state rather than propagate.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<R: Send + 'static, T: Send + 'static> Inner<R, T> {
    /// A call returned: send what queued meanwhile, or free the slot.
    fn landed(self: &Arc<Self>) {
        let batch = {
            let mut st = self.lock();
            if st.queue.is_empty() {
                st.in_flight -= 1;
                return;
            }
            std::mem::take(&mut st.queue)
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(self.clone().fly(batch));
            }
            Err(_) => {
                // No runtime to send from (the last caller was dropped outside one): the queued
                // callers get an error from their dropped senders.
                self.lock().in_flight -= 1;
            }
        }
    }

    async fn fly(self: Arc<Self>, batch: Vec<Queued<R, T>>) {
        let _flight = Flight(self.clone());
        let mut reqs = Vec::with_capacity(batch.len());
        let mut txs = Vec::with_capacity(batch.len());
        for q in batch {
            if q.skippable && q.tx.is_closed() {
                continue;
            }
            reqs.push(q.req);
            txs.push(q.tx);
        }
        if reqs.is_empty() {
            return;
        }
        let n = reqs.len();
        let answers = tokio::time::timeout(self.timeout, (self.exec)(reqs))
            .await
            .unwrap_or_else(|_| {
                let e = BackendError::timeout("redis batch", self.timeout);
                super::engine::errors(&e, n).collect()
            });
        let mut answers = answers.into_iter();
        for tx in txs {
            let _ = tx.send(answers.next().unwrap_or_else(|| Err(no_answer())));
        }
    }
}

/// Holds an in-flight slot; returning it sends the queue.
struct Flight<R: Send + 'static, T: Send + 'static>(Arc<Inner<R, T>>);

impl<R: Send + 'static, T: Send + 'static> Drop for Flight<R, T> {
    fn drop(&mut self) {
        self.0.landed();
    }
}

fn no_answer() -> BackendError {
    BackendError::new(
        BackendErrorKind::Protocol,
        "redis batch returned fewer answers than requests",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn counting(sizes: Arc<Mutex<Vec<usize>>>) -> Exec<u32, u32> {
        Arc::new(move |reqs: Vec<u32>| {
            let sizes = sizes.clone();
            Box::pin(async move {
                sizes
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(reqs.len());
                tokio::time::sleep(Duration::from_millis(10)).await;
                reqs.into_iter().map(|r| Ok(r * 2)).collect()
            })
        })
    }

    #[tokio::test(start_paused = true)]
    async fn coalescer_should_send_a_lone_request_alone_and_at_once() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let c = Coalescer::new(counting(sizes.clone()), 1, Duration::from_secs(1));
        let started = tokio::time::Instant::now();
        assert_eq!(c.call(21, true).await.ok(), Some(42));
        assert_eq!(started.elapsed(), Duration::from_millis(10));
        assert_eq!(c.call(1, true).await.ok(), Some(2));
        assert_eq!(*sizes.lock().unwrap_or_else(|e| e.into_inner()), vec![1, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn coalescer_should_batch_what_queues_behind_a_call_in_flight() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let c = Arc::new(Coalescer::new(
            counting(sizes.clone()),
            1,
            Duration::from_secs(1),
        ));
        let done = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..10u32 {
            let (c, done) = (c.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                assert_eq!(c.call(i, true).await.ok(), Some(i * 2));
                done.fetch_add(1, Ordering::Relaxed);
            }));
        }
        for t in tasks {
            t.await
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        }
        assert_eq!(done.load(Ordering::Relaxed), 10);
        let sizes = sizes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(sizes, vec![1, 9], "one alone, then the rest together");
    }

    #[tokio::test(start_paused = true)]
    async fn coalescer_should_skip_abandoned_skippable_requests_and_keep_going() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let c = Arc::new(Coalescer::new(
            counting(sizes.clone()),
            1,
            Duration::from_secs(1),
        ));
        let first = tokio::spawn({
            let c = c.clone();
            async move { c.call(1, true).await }
        });
        tokio::task::yield_now().await;
        // Queued behind the first, then abandoned.
        let abandoned = {
            let c = c.clone();
            tokio::spawn(async move { c.call(2, true).await })
        };
        tokio::task::yield_now().await;
        abandoned.abort();
        let kept = {
            let c = c.clone();
            tokio::spawn(async move { c.call(3, false).await })
        };
        assert_eq!(first.await.ok().and_then(Result::ok), Some(2));
        assert_eq!(kept.await.ok().and_then(Result::ok), Some(6));
        let sizes = sizes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(sizes, vec![1, 1]);
        // The slot is free again: a lone call goes at once.
        assert_eq!(c.call(5, true).await.ok(), Some(10));
    }
}
