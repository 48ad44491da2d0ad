//! What the controllers share (those on GpuNodes and Nodes in [`reconcile`](crate::reconcile),
//! the one on ComputeDomains in [`compute_domain`](crate::compute_domain)): their error, their
//! kube-runtime settings and retry policy, the log of a reconcile's result, and [`Synced`], the
//! wait for caches' first lists.

use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, Stream};
use kube::Resource;
use kube::runtime::controller::{self, Action, Error as ControllerError};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{debug, warn};

use crate::write::WriteError;

/// A failed reconcile (retried after [`RETRY`]).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A write failed.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// A cache's watcher went away (the controller is stopping).
    #[error("a watch cache was dropped")]
    CacheGone,
}

/// Retry delay after a failed reconcile.
const RETRY: Duration = Duration::from_secs(5);

/// Reconciles in flight at once, per controller. kube-runtime polls every reconcile in flight
/// whenever one of them wakes, and spawns a task for each: unbounded, a resync would start one per
/// GpuNode at once, at O(n²) polls and a task's memory per GpuNode.
pub(crate) const CONCURRENCY: u16 = 16;

/// Triggers of one object within this long of each other make one reconcile, after the last.
/// A write's own echoes (the Node's labels, then the GpuNode's conditions, seconds apart under
/// load) then meet caches that hold both, instead of one of them writing again from a stale one.
const DEBOUNCE: Duration = Duration::from_secs(1);

pub(crate) fn controller_config() -> controller::Config {
    controller::Config::default()
        .concurrency(CONCURRENCY)
        .debounce(DEBOUNCE)
}

/// Resolves once some caches have had their first list, for any number of waiters.
///
/// `Store::wait_until_ready` wakes only the last of several concurrent waiters (kube-runtime
/// 5.0: a oneshot receiver underneath, which keeps one waker): so each store is waited on once,
/// and that wait shared ([`Synced::of`]). kube-runtime's `Controller` waits on its own store
/// itself, so the first lists of the GpuNodes and Nodes (the sweep's) are told by their event
/// streams instead (`reconcile`'s `first_list`).
#[derive(Clone)]
pub(crate) struct Synced(Shared<BoxFuture<'static, bool>>);

impl Synced {
    pub(crate) fn new(all: impl Future<Output = bool> + Send + 'static) -> Self {
        Self(all.boxed().shared())
    }

    /// Resolves once `store` has had its first list (false if its writer is dropped before);
    /// the store must have no other waiter.
    pub(crate) fn of<K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static>(
        store: Store<K>,
    ) -> Self {
        Self::new(async move { store.wait_until_ready().await.is_ok() })
    }

    /// Resolves once every one of `parts` has.
    pub(crate) fn all(parts: Vec<Synced>) -> Self {
        Self::new(async move {
            for p in parts {
                if !p.0.await {
                    return false;
                }
            }
            true
        })
    }

    /// Whether it has resolved successfully (as a waiter saw it: false until one has).
    pub(crate) fn is_done(&self) -> bool {
        self.0.peek() == Some(&true)
    }

    pub(crate) async fn wait(&self) -> Result<(), ReconcileError> {
        if self.0.clone().await {
            Ok(())
        } else {
            Err(ReconcileError::CacheGone)
        }
    }
}

/// A watch stream's changed and deleted objects, with kube-runtime's default backoff.
pub(crate) fn touched<K, S>(events: S) -> impl Stream<Item = Result<K, watcher::Error>> + Send
where
    K: Resource + Clone + Send,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    events.default_backoff().touched_objects()
}

/// Logs a failed reconcile. An object that does not exist is not a failure: a GpuNode (a Node
/// without one, or a deleted one: the sweep's business), a Node gone before its sweep, or a
/// ComputeDomain gone before its reconcile.
pub(crate) fn log_result<K: Resource>(
    kind: &str,
    r: Result<(ObjectRef<K>, Action), ControllerError<ReconcileError, watcher::Error>>,
) {
    match r {
        Ok(_) => {}
        Err(ControllerError::ObjectNotFound(obj)) => debug!(%obj, "no such {kind}"),
        Err(err) => warn!(%err, "{kind} reconcile failed"),
    }
}

pub(crate) fn retry<K, S>(_: Arc<K>, err: &ReconcileError, _: Arc<S>) -> Action {
    warn!(%err, "reconcile failed; retrying in {} s", RETRY.as_secs());
    Action::requeue(RETRY)
}
