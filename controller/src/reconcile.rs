//! The reconciles: two controllers that look up what [`plan`] needs in their caches and have
//! [`write`](crate::write) carry out its [`Plan`](crate::plan::Plan). Nothing is written that is
//! already in place: a (re)start on a cluster as the plan wants it writes nothing.
//!
//! - On GpuNodes (kube-runtime's `Controller`, also triggered by their Nodes, slurmd pods and GPU
//!   pods): labels, conditions, remediation.
//! - The sweep, on Nodes (triggered by GpuNodes' deletions, and by Nodes that carry our labels
//!   without a GpuNode): a node whose GpuNode is gone loses our labels. There is no finalizer:
//!   deleting a GpuNode never waits for the controller, and a node whose GpuNode went while no
//!   controller ran is cleaned when one starts (once both caches have had their first list).
//! - On ComputeDomains, where the cluster has them ([`compute_domain`](crate::compute_domain)),
//!   from the same GpuNode cache.

use std::sync::Arc;
use std::time::Instant;

use futures::channel::{mpsc, oneshot};
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::jiff::Timestamp;
use kube::core::{Selector, SelectorExt};
use kube::runtime::controller::{self, Action};
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tracing::debug;

use crate::common::{
    CONCURRENCY, ReconcileError, Synced, controller_config, log_result, retry, touched,
};
use crate::compute_domain::{self, Members};
use crate::metrics::Metrics;
use crate::plan::{self, Input, Settings, requests_resource};
use crate::slim::{PodsByNode, SlimGpuNode, SlimNode, SlimPod};
use crate::slurm::SlurmNodes;
use crate::write::{Events, Writer};

/// What both controllers share.
pub struct Context<S> {
    writer: Writer<S>,
    settings: Settings,
    metrics: Metrics,
    nodes: Store<SlimNode>,
    /// Slurmd pods and pods that ask for the GPU resource.
    pods: PodsByNode,
    /// The two caches above have had their first list.
    synced: Synced,
}

/// `events` (after what caches them, so that the cache holds the whole list by then) passed
/// through, and a [`Synced`] that resolves once their first list has gone by (false if they end
/// before).
fn first_list<K, S>(events: S) -> (impl Stream<Item = S::Item> + Send, Synced)
where
    K: Send,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    let (tx, rx) = oneshot::channel::<()>();
    let mut tx = Some(tx);
    let events = events.inspect(move |e| {
        if let Ok(watcher::Event::InitDone) = e
            && let Some(tx) = tx.take()
        {
            let _ = tx.send(());
        }
    });
    (events, Synced::new(async move { rx.await.is_ok() }))
}

/// A cache of the slurmd pods (those `slurmd` selects) and the pods asking for `resource` among
/// all pods' watch `events` (kube-runtime's store, indexed by node), the events it takes passed
/// through after it, and its first list.
fn pod_cache<S>(
    events: S,
    slurmd: Selector,
    resource: String,
) -> (impl Stream<Item = S::Item> + Send, PodsByNode, Synced)
where
    S: Stream<Item = Result<watcher::Event<SlimPod>, watcher::Error>> + Send,
{
    let (store, writer) = reflector::store();
    let listed = Synced::of(store.clone());
    let cache = PodsByNode::new(store.clone());
    let index = cache.clone();
    let events = events
        .modify(move |p| {
            forget_version(p);
            mark_slurmd(p, &slurmd);
        })
        .try_filter_map(move |e| futures::future::ready(Ok(pod_event(e, &resource, &store))));
    let events = reflector::reflector(writer, events).inspect_ok(move |e| index.apply(e));
    (events, cache, listed)
}

/// Marks pod `p` as a slurmd pod if `selector` matches its labels, which it then drops.
fn mark_slurmd(p: &mut SlimPod, selector: &Selector) {
    let labels = p.metadata.labels.take().unwrap_or_default();
    p.slurmd = selector.matches(&labels);
}

/// Watch event `e` of all pods as the pod cache takes it: slurmd pods and pods that ask for
/// `resource` (a pod's extended resources never change); a pod in the cache (`cached`) that is
/// neither any more (its labels changed) as its deletion; other pods' deletions not at all.
fn pod_event(
    e: watcher::Event<SlimPod>,
    resource: &str,
    cached: &Store<SlimPod>,
) -> Option<watcher::Event<SlimPod>> {
    let kept = |p: &SlimPod| p.slurmd || requests_resource(p, resource);
    match e {
        watcher::Event::Apply(p) if kept(&p) => Some(watcher::Event::Apply(p)),
        watcher::Event::InitApply(p) => kept(&p).then_some(watcher::Event::InitApply(p)),
        watcher::Event::Apply(p) | watcher::Event::Delete(p) => cached
            .get(&ObjectRef::from_obj(&p))
            .is_some()
            .then_some(watcher::Event::Delete(p)),
        e @ (watcher::Event::Init | watcher::Event::InitDone) => Some(e),
    }
}

/// `stream`, started once `synced` resolves.
fn after<S: Stream + Send + 'static>(synced: Synced, stream: S) -> impl Stream<Item = S::Item> {
    futures::stream::once(async move {
        let _ = synced.wait().await;
        stream
    })
    .flatten()
}

fn node_of(pod: SlimPod) -> Option<ObjectRef<SlimGpuNode>> {
    pod.node.map(|n| ObjectRef::new(&n))
}

/// Runs the controllers until they end (they do not, unless every watch stream ends); slurmd
/// pods are those the label selector `slurmd` matches; ComputeDomains are kept if
/// `compute_domains` and the cluster serves them.
///
/// One watch per kind of object, each cached once (only what `plan` reads, see
/// [`slim`](crate::slim); of all pods the slurmd pods and those asking for the GPU resource, by
/// node), shared by both controllers. The GpuNodes are listed last, once the other caches are:
/// by then every Node and pod has triggered its GpuNode, and a (re)start reconciles each GpuNode
/// once.
pub async fn controllers<S: SlurmNodes + 'static>(
    client: Client,
    settings: Settings,
    slurm: Option<Arc<S>>,
    recorder: Recorder,
    metrics: Metrics,
    slurmd: Selector,
    compute_domains: bool,
) {
    let gpunodes: Api<SlimGpuNode> = Api::all(client.clone());
    // metadata only
    let nodes: Api<SlimNode> = Api::all(client.clone());
    let pods: Api<SlimPod> = Api::all(client.clone());
    let cfg = watcher::Config::default;
    // the sweep's triggers (Node names): every GpuNode deleted; every Node written that carries
    // labels of ours and has no GpuNode, once the GpuNodes are listed; and once they are, every
    // Node of those already cached
    let (sweep_tx, sweep_rx) = mpsc::unbounded::<String>();
    // the caches only need the resource version their watch has read by then: dropping it spares
    // a copy in each cached object and in its key
    let (gpunode_store, w) = reflector::store();
    let (gpunode_events, gpunodes_listed) = first_list(reflector::reflector(
        w,
        watcher(gpunodes, cfg()).modify(forget_version),
    ));
    // who is in which ComputeDomain, kept from the GpuNode watch (where the cluster has them)
    let domains = (compute_domains && compute_domain::served(&client).await)
        .then(|| Members::new(gpunode_store.clone()));
    let members = domains.as_ref().map(|(m, _)| m.clone());
    // each cache is written before its event triggers a reconcile, so a reconcile sees at least
    // what triggered it
    let (node_store, w) = reflector::store();
    let (node_events, nodes_listed) = first_list(reflector::reflector(
        w,
        watcher(nodes, cfg()).modify(forget_version),
    ));
    let (to_sweep, gpunodes, listed) = (
        sweep_tx.clone(),
        gpunode_store.clone(),
        gpunodes_listed.clone(),
    );
    let node_events = node_events.inspect_ok(move |e| {
        if let watcher::Event::Apply(n) | watcher::Event::InitApply(n) = e
            && listed.is_done()
            && orphaned(n, &gpunodes)
        {
            let _ = to_sweep.unbounded_send(n.name_any());
        }
    });
    let first_sweep = {
        let (nodes, gpunodes, listed, tx) = (
            node_store.clone(),
            gpunode_store.clone(),
            gpunodes_listed.clone(),
            sweep_tx.clone(),
        );
        async move {
            if listed.wait().await.is_ok() {
                for n in nodes.state() {
                    if orphaned(&n, &gpunodes) {
                        let _ = tx.unbounded_send(n.name_any());
                    }
                }
            }
        }
    };
    let (pod_events, pod_cache, pods_listed) =
        pod_cache(watcher(pods, cfg()), slurmd, settings.gpu_resource.clone());
    let synced = Synced::all(vec![nodes_listed, pods_listed]);
    let (gone, to_sweep) = (metrics.clone(), sweep_tx.clone());
    let gpunode_events = gpunode_events.inspect_ok(move |e| {
        if let watcher::Event::Delete(g) = e {
            let name = g.name_any();
            gone.node(&name, None);
            let _ = to_sweep.unbounded_send(name);
        }
        if let Some(m) = &members {
            m.apply(e);
        }
    });
    // cached with their UID (for Events), but the scheduler's keys, two for each GpuNode while
    // its next reconcile is due, do without it
    let gpunode_events = after(synced.clone(), gpunode_events.modify(forget_uid));
    let domain_controller = {
        let events = Events::new(recorder.clone(), metrics.clone());
        let (client, metrics, listed) = (client.clone(), metrics.clone(), gpunodes_listed.clone());
        async move {
            if let Some((members, changed)) = domains {
                compute_domain::run(client, events, metrics, members, changed, listed).await;
            }
        }
    };
    let ctx = Arc::new(Context {
        writer: Writer::new(client, recorder, metrics.clone(), slurm),
        settings,
        metrics,
        synced,
        nodes: node_store.clone(),
        pods: pod_cache,
    });
    let main = Controller::for_stream(
        gpunode_events.default_backoff().applied_objects(),
        gpunode_store.clone(),
    )
    .watches_stream(touched(node_events), |n| {
        Some(ObjectRef::new(&n.name_any()))
    })
    .watches_stream(touched(pod_events), node_of)
    .with_config(controller_config())
    .run(reconcile_gpunode, retry, ctx.clone())
    .for_each(|r| async move { log_result("GpuNode", r) });
    // the sweep: Nodes whose GpuNode is gone, from the same caches, on the triggers above only
    // (a failed one is tried again after RETRY)
    let sweep_ctx = Arc::new((ctx, gpunode_store, gpunodes_listed));
    let sweep = Controller::for_stream(futures::stream::empty(), node_store)
        .reconcile_on(sweep_rx.map(|name| ObjectRef::new(&name)))
        .with_config(controller::Config::default().concurrency(CONCURRENCY))
        .run(reconcile_node, retry, sweep_ctx)
        .for_each(|r| async move { log_result("Node", r) });
    tokio::join!(main, sweep, first_sweep, domain_controller);
}

/// Whether Node `n` carries labels of ours but has no GpuNode (in `gpunodes`, listed).
fn orphaned(n: &SlimNode, gpunodes: &Store<SlimGpuNode>) -> bool {
    n.labels.ours().next().is_some() && gpunodes.get(&ObjectRef::new(&n.name_any())).is_none()
}

/// Drops the object's UID.
fn forget_uid<K: Resource>(o: &mut K) {
    o.meta_mut().uid = None;
}

/// Drops the object's resource version (its watch has read it).
fn forget_version<K: Resource>(o: &mut K) {
    o.meta_mut().resource_version = None;
}

async fn reconcile_gpunode<S: SlurmNodes>(
    g: Arc<SlimGpuNode>,
    ctx: Arc<Context<S>>,
) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    ctx.synced.wait().await?;
    let name = g.name_any();
    let node = ctx.nodes.get(&ObjectRef::new(&name));
    let pods = ctx.pods.on_node(&name);
    let pods_that = |f: &dyn Fn(&SlimPod) -> bool| -> Vec<&SlimPod> {
        pods.iter().map(|p| &**p).filter(|p| f(p)).collect()
    };
    let p = plan::plan(&Input {
        gpunode: Some(&g),
        node: node.as_ref().map(|n| &n.labels),
        slurmd_pods: &pods_that(&|p| p.slurmd),
        pods: &pods_that(&|p| requests_resource(p, &ctx.settings.gpu_resource)),
        now: Timestamp::now(),
        settings: &ctx.settings,
    });
    let gone = g.metadata.deletion_timestamp.is_some();
    let held = g.status.as_ref().map_or(0, |s| s.held_gpus);
    ctx.metrics
        .node(&name, (!gone).then_some((g.spec.gpu_count, held)));
    let result = ctx
        .writer
        .execute(
            &g,
            node.as_ref().and_then(|n| n.metadata.uid.as_deref()),
            &p,
        )
        .await;
    ctx.metrics
        .reconcile_seconds
        .observe(started.elapsed().as_secs_f64());
    result?;
    Ok(p.requeue_after
        .map_or_else(Action::await_change, Action::requeue))
}

/// The sweep's context: the shared one, the GpuNode cache and its first list.
type SweepContext<S> = (Arc<Context<S>>, Store<SlimGpuNode>, Synced);

/// The sweep's reconcile of Node `n`.
async fn reconcile_node<S: SlurmNodes>(
    n: Arc<SlimNode>,
    ctx: Arc<SweepContext<S>>,
) -> Result<Action, ReconcileError> {
    sweep_node(&n.name_any(), &ctx).await?;
    Ok(Action::await_change())
}

async fn sweep_node<S: SlurmNodes>(
    name: &str,
    ctx: &SweepContext<S>,
) -> Result<(), ReconcileError> {
    let (ctx, gpunodes, synced) = (&ctx.0, &ctx.1, &ctx.2);
    synced.wait().await?;
    if gpunodes.get(&ObjectRef::new(name)).is_some() {
        return Ok(());
    }
    // a Node gone is no one's business
    let Some(node) = ctx.nodes.get(&ObjectRef::new(name)) else {
        debug!(node = %name, "no such Node");
        return Ok(());
    };
    let p = plan::plan(&Input {
        gpunode: None,
        node: Some(&node.labels),
        slurmd_pods: &[],
        pods: &[],
        now: Timestamp::now(),
        settings: &ctx.settings,
    });
    if let Some(labels) = &p.labels {
        ctx.writer
            .sweep_labels(name, node.metadata.uid.clone(), labels)
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, PodSpec, ResourceRequirements};

    use crate::slim::tests::slim_pod;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kube::api::ObjectMeta;

    type Events = mpsc::UnboundedSender<Result<watcher::Event<ConfigMap>, watcher::Error>>;

    /// A reflector over events sent by hand, drained by a task, and its first-list signal: from
    /// the store ([`Synced::of`]), or from the events ([`first_list`]).
    fn cache(of_store: bool) -> (Events, Store<ConfigMap>, Synced) {
        let (tx, rx) = mpsc::unbounded();
        let (store, writer) = reflector::store::<ConfigMap>();
        let events = reflector::reflector(writer, rx);
        let synced = if of_store {
            tokio::spawn(events.for_each(|_| async {}));
            Synced::of(store.clone())
        } else {
            let (events, synced) = first_list(events);
            tokio::spawn(events.for_each(|_| async {}));
            synced
        };
        (tx, store, synced)
    }

    /// Several reconcilers waiting at once for the first list all go on, and find the whole list
    /// in the store (a bare `wait_until_ready` wakes only one of them).
    #[tokio::test]
    async fn every_waiter_wakes_on_the_first_list() {
        for of_store in [true, false] {
            every_waiter_wakes(cache(of_store)).await;
        }
    }

    async fn every_waiter_wakes((events, store, synced): (Events, Store<ConfigMap>, Synced)) {
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let (s, store) = (synced.clone(), store.clone());
                tokio::spawn(async move { s.wait().await.is_ok().then(|| store.state().len()) })
            })
            .collect();
        tokio::task::yield_now().await;
        for w in &waiters {
            assert!(!w.is_finished(), "a waiter went on before the first list");
        }
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some("a".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(cm),
            watcher::Event::InitDone,
        ] {
            events.unbounded_send(Ok(e)).unwrap();
        }
        for w in waiters {
            let woke = tokio::time::timeout(Duration::from_secs(5), w).await;
            assert!(
                matches!(woke, Ok(Ok(Some(1)))),
                "a waiter stayed asleep: {woke:?}"
            );
        }
    }

    /// A cache whose events end before its first list fails the wait instead of hanging, and so
    /// does a wait on several caches of which one fails.
    #[tokio::test]
    async fn a_dropped_cache_fails_the_wait() {
        for of_store in [true, false] {
            a_dropped_cache_fails(of_store).await;
        }
    }

    async fn a_dropped_cache_fails(of_store: bool) {
        let (events, _, synced) = cache(of_store);
        let (other, _, listed) = cache(of_store);
        other.unbounded_send(Ok(watcher::Event::Init)).unwrap();
        other.unbounded_send(Ok(watcher::Event::InitDone)).unwrap();
        let both = Synced::all(vec![listed, synced.clone()]);
        drop(events);
        let r = tokio::time::timeout(Duration::from_secs(5), synced.wait()).await;
        assert!(matches!(r, Ok(Err(ReconcileError::CacheGone))), "{r:?}");
        let r = tokio::time::timeout(Duration::from_secs(5), both.wait()).await;
        assert!(matches!(r, Ok(Err(ReconcileError::CacheGone))), "{r:?}");
    }

    /// Of all pods the cache keeps the slurmd pods (as the selector tells them by their labels,
    /// which it drops) and the GPU pods; a cached pod that is neither any more leaves it, and
    /// deletions of others are dropped.
    #[test]
    fn slurmd_and_gpu_pods_are_cached() {
        let pod = |name: &str, app: &str, gpus: Option<&str>| {
            let mut p = slim_pod(&Pod {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    namespace: Some("ns".into()),
                    labels: Some([("app".to_string(), app.to_string())].into()),
                    ..Default::default()
                },
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "c".into(),
                        resources: gpus.map(|n| ResourceRequirements {
                            limits: Some(
                                [("nvidia.com/gpu".to_string(), Quantity(n.into()))].into(),
                            ),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            });
            mark_slurmd(&mut p, &crate::slim::label_selector("app=slurmd").unwrap());
            assert_eq!(p.metadata.labels, None);
            p
        };
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&watcher::Event::Apply(pod("cached", "slurmd", None)));
        let take = |e| pod_event(e, "nvidia.com/gpu", &store);
        let name = |e: Option<watcher::Event<SlimPod>>| match e {
            Some(Init) => "init".to_string(),
            Some(InitDone) => "done".to_string(),
            Some(Apply(p)) => format!("apply {} {}", p.name(), p.slurmd),
            Some(InitApply(p)) => format!("list {} {}", p.name(), p.slurmd),
            Some(Delete(p)) => format!("delete {}", p.name()),
            None => "-".to_string(),
        };
        use watcher::Event::*;
        let cases = [
            (Apply(pod("a", "slurmd", None)), "apply a true"),
            (InitApply(pod("b", "slurmd", Some("8"))), "list b true"),
            (Apply(pod("c", "job", Some("1"))), "apply c false"),
            (InitApply(pod("d", "job", Some("0"))), "-"),
            (Apply(pod("e", "job", None)), "-"),
            (Delete(pod("e", "job", None)), "-"),
            (Apply(pod("cached", "job", None)), "delete cached"),
            (Delete(pod("cached", "slurmd", None)), "delete cached"),
            (Init, "init"),
            (InitDone, "done"),
        ];
        for (e, want) in cases {
            assert_eq!(name(take(e)), want);
        }
    }
}

#[cfg(test)]
mod writes;
