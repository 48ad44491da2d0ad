//! The executor: two controllers that look up what [`plan`] needs in their caches, carry out its
//! [`Plan`] against the API server (and Slurm), and record an Event per action. Nothing is written
//! that is already in place: a (re)start on a cluster as the plan wants it writes nothing.
//!
//! - On GpuNodes (kube-runtime's `Controller`, also triggered by their Nodes, slurmd pods and GPU
//!   pods): labels, conditions, remediation.
//! - The sweep, on Nodes (triggered by GpuNodes' deletions, and by Nodes that carry our labels
//!   without a GpuNode): a node whose GpuNode is gone loses our labels. There is no finalizer:
//!   deleting a GpuNode never waits for the controller, and a node whose GpuNode went while no
//!   controller ran is cleaned when one starts (once both caches have had their first list).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::channel::{mpsc, oneshot};
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{self, Action, Error as ControllerError};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use mockgpu_api::gpunode::{CONTROLLER_MANAGER, condition};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::labels;
use crate::labels::{NodeLabels, NodeMeta};
use crate::metrics::{ActionLabels, Metrics};
use crate::plan::{self, Input, Plan, Settings, requests_resource};
use crate::slim::{PodsByNode, SlimGpuNode, SlimPod};
use crate::slurm::{NodeDeleted, SlurmNodes};

/// A failed reconcile (retried after [`RETRY`]).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// An API request failed.
    #[error("{what}: {source}")]
    Kube {
        /// The request, in words.
        what: String,
        /// The error.
        source: kube::Error,
    },
    /// Deleting a Slurm node record failed (its slurmd pods are left running).
    #[error("deleting Slurm node {node}: {source}")]
    Slurm {
        /// The Slurm node.
        node: String,
        /// The error.
        source: crate::slurm::SlurmError,
    },
    /// A cache's watcher went away (the controller is stopping).
    #[error("a watch cache was dropped")]
    CacheGone,
}

/// Retry delay after a failed reconcile.
const RETRY: Duration = Duration::from_secs(5);

/// Reconciles in flight at once, per controller. kube-runtime polls every reconcile in flight
/// whenever one of them wakes, and spawns a task for each: unbounded, a resync would start one per
/// GpuNode at once, at O(n²) polls and a task's memory per GpuNode.
const CONCURRENCY: u16 = 16;

/// Triggers of one object within this long of each other make one reconcile, after the last.
/// A write's own echoes (the Node's labels, then the GpuNode's conditions, seconds apart under
/// load) then meet caches that hold both, instead of one of them writing again from a stale one.
const DEBOUNCE: Duration = Duration::from_secs(1);

fn controller_config() -> controller::Config {
    controller::Config::default()
        .concurrency(CONCURRENCY)
        .debounce(DEBOUNCE)
}

/// What both controllers share.
pub struct Context<S> {
    client: Client,
    settings: Settings,
    slurm: Option<Arc<S>>,
    recorder: Recorder,
    metrics: Metrics,
    nodes: Store<NodeMeta>,
    slurmd: PodsByNode,
    pods: PodsByNode,
    /// The three caches above have had their first list.
    synced: Synced,
}

/// Resolves once some caches have had their first list, for any number of waiters.
///
/// `Store::wait_until_ready` wakes only the last of several concurrent waiters (kube-runtime
/// 5.0: a oneshot receiver underneath, which keeps one waker): so each store is waited on once,
/// and that wait shared ([`Synced::of`]). kube-runtime's `Controller` waits on its own store
/// itself, so the GpuNodes' first list is told by their event stream instead ([`first_list`]).
#[derive(Clone)]
struct Synced(Shared<BoxFuture<'static, bool>>);

impl Synced {
    fn new(all: impl Future<Output = bool> + Send + 'static) -> Self {
        Self(all.boxed().shared())
    }

    /// Resolves once `store` has had its first list (false if its writer is dropped before);
    /// the store must have no other waiter.
    fn of<K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static>(store: Store<K>) -> Self {
        Self::new(async move { store.wait_until_ready().await.is_ok() })
    }

    /// Resolves once every one of `parts` has.
    fn all(parts: Vec<Synced>) -> Self {
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
    fn is_done(&self) -> bool {
        self.0.peek() == Some(&true)
    }

    async fn wait(&self) -> Result<(), ReconcileError> {
        if self.0.clone().await {
            Ok(())
        } else {
            Err(ReconcileError::CacheGone)
        }
    }
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

/// A cache of the pods of watch `events` (kube-runtime's store, indexed by node), the events
/// passed through after it, and its first list.
fn pod_cache<S>(events: S) -> (impl Stream<Item = S::Item> + Send, PodsByNode, Synced)
where
    S: Stream<Item = Result<watcher::Event<SlimPod>, watcher::Error>> + Send,
{
    let (store, writer) = reflector::store();
    let listed = Synced::of(store.clone());
    let cache = PodsByNode::new(store);
    let index = cache.clone();
    let events = reflector::reflector(writer, events).inspect_ok(move |e| index.apply(e));
    (events, cache, listed)
}

/// `stream`, started once `synced` resolves.
fn after<S: Stream + Send + 'static>(synced: Synced, stream: S) -> impl Stream<Item = S::Item> {
    futures::stream::once(async move {
        let _ = synced.wait().await;
        stream
    })
    .flatten()
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ReconcileError {
    let what = what.into();
    move |source| ReconcileError::Kube { what, source }
}

fn node_of(pod: SlimPod) -> Option<ObjectRef<SlimGpuNode>> {
    pod.node.map(|n| ObjectRef::new(&n))
}

/// Runs both controllers until they end (they do not, unless every watch stream ends); slurmd
/// pods are those matching the label selector `slurmd_selector`.
///
/// One watch per kind of object, each cached once (only what `plan` reads, see
/// [`slim`](crate::slim) and [`labels::trim`]; pods by node, and only GPU pods of all pods),
/// shared by both controllers. The GpuNodes are listed last, once the other caches are: by then
/// every Node and pod has triggered its GpuNode, and a (re)start reconciles each GpuNode once.
pub async fn controllers<S: SlurmNodes + 'static>(
    client: Client,
    settings: Settings,
    slurm: Option<Arc<S>>,
    recorder: Recorder,
    metrics: Metrics,
    slurmd_selector: &str,
) {
    let gpunodes: Api<SlimGpuNode> = Api::all(client.clone());
    // metadata only
    let nodes: Api<NodeMeta> = Api::all(client.clone());
    let pods: Api<SlimPod> = Api::all(client.clone());
    let cfg = watcher::Config::default;
    // the sweep's triggers (Node names): every GpuNode deleted; every Node written that carries
    // labels of ours and has no GpuNode, once the GpuNodes are listed; and once they are, every
    // Node of those already cached
    let (sweep_tx, sweep_rx) = mpsc::unbounded::<String>();
    // the cache only needs the resource version its watch has read by then: dropping it spares a
    // copy in each cached GpuNode and in its keys
    let (gpunode_store, w) = reflector::store();
    let (gpunode_events, gpunodes_listed) = first_list(reflector::reflector(
        w,
        watcher(gpunodes, cfg()).modify(forget_version),
    ));
    // each cache is written before its event triggers a reconcile, so a reconcile sees at least
    // what triggered it
    let (node_store, w) = reflector::store();
    let nodes_listed = Synced::of(node_store.clone());
    let node_events = reflector::reflector(
        w,
        watcher(nodes, cfg()).modify(|n| labels::trim(&mut n.metadata)),
    );
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
    let (slurmd_events, slurmd_cache, slurmd_listed) =
        pod_cache(watcher(pods.clone(), cfg().labels(slurmd_selector)));
    let resource = settings.gpu_resource.clone();
    let keep = resource.clone();
    let (pod_events, gpu_pod_cache, pods_listed) = pod_cache(
        watcher(pods, cfg()).try_filter(move |e| futures::future::ready(gpu_pod_event(e, &keep))),
    );
    let synced = Synced::all(vec![nodes_listed, slurmd_listed, pods_listed]);
    let (gone, to_sweep) = (metrics.clone(), sweep_tx.clone());
    let gpunode_events = gpunode_events.inspect_ok(move |e| {
        if let watcher::Event::Delete(g) = e {
            let name = g.name_any();
            gone.node(&name, None);
            let _ = to_sweep.unbounded_send(name);
        }
    });
    // cached with their UID (for Events), but the scheduler's keys, two for each GpuNode while
    // its next reconcile is due, do without it
    let gpunode_events = after(synced.clone(), gpunode_events.modify(forget_uid));
    let ctx = Arc::new(Context {
        client,
        settings,
        slurm,
        recorder,
        metrics,
        synced,
        nodes: node_store,
        slurmd: slurmd_cache,
        pods: gpu_pod_cache,
    });
    let main = Controller::for_stream(
        gpunode_events.default_backoff().applied_objects(),
        gpunode_store.clone(),
    )
    .watches_stream(touched(node_events), |n| {
        Some(ObjectRef::new(&n.name_any()))
    })
    .watches_stream(touched(slurmd_events), node_of)
    .watches_stream(touched(pod_events), move |p| {
        requests_resource(&p, &resource)
            .then(|| node_of(p))
            .flatten()
    })
    .with_config(controller_config())
    .run(reconcile_gpunode, retry, ctx.clone())
    .for_each(|r| async move { log_result("GpuNode", r) });
    // the sweep: Nodes whose GpuNode is gone, from the same caches (a failed one is tried again
    // after RETRY)
    let sweep_ctx = Arc::new((ctx, gpunode_store, gpunodes_listed));
    let sweep = sweep_rx.for_each_concurrent(usize::from(CONCURRENCY), move |name| {
        let (ctx, again) = (sweep_ctx.clone(), sweep_tx.clone());
        async move {
            if let Err(err) = sweep_node(&name, &ctx).await {
                warn!(%err, node = %name, "Node reconcile failed; retrying in {} s", RETRY.as_secs());
                tokio::time::sleep(RETRY).await;
                let _ = again.unbounded_send(name);
            }
        }
    });
    tokio::join!(main, sweep, first_sweep);
}

/// Whether Node `n` carries labels of ours but has no GpuNode (in `gpunodes`, listed).
fn orphaned(n: &NodeMeta, gpunodes: &Store<SlimGpuNode>) -> bool {
    NodeLabels::of(&n.metadata).ours().next().is_some()
        && gpunodes.get(&ObjectRef::new(&n.name_any())).is_none()
}

/// Drops the object's UID.
fn forget_uid<K: Resource>(o: &mut K) {
    o.meta_mut().uid = None;
}

/// Drops the object's resource version (its watch has read it).
fn forget_version<K: Resource>(o: &mut K) {
    o.meta_mut().resource_version = None;
}

/// Whether the all-pods cache keeps watch event `e`: pods that ask for `resource` (a pod's
/// extended resources never change), every deletion and the list's bounds.
fn gpu_pod_event(e: &watcher::Event<SlimPod>, resource: &str) -> bool {
    match e {
        watcher::Event::Apply(p) | watcher::Event::InitApply(p) => requests_resource(p, resource),
        watcher::Event::Delete(_) | watcher::Event::Init | watcher::Event::InitDone => true,
    }
}

/// A watch stream's changed and deleted objects, with kube-runtime's default backoff.
fn touched<K, S>(events: S) -> impl Stream<Item = Result<K, watcher::Error>> + Send
where
    K: Resource + Clone + Send,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    events.default_backoff().touched_objects()
}

/// Logs a failed reconcile. A GpuNode that does not exist (a Node without one, or a deleted
/// one: the sweep's business) is not a failure.
fn log_result<K: Resource>(
    kind: &str,
    r: Result<(ObjectRef<K>, Action), ControllerError<ReconcileError, watcher::Error>>,
) {
    match r {
        Ok(_) => {}
        Err(ControllerError::ObjectNotFound(obj)) => debug!(%obj, "no such {kind}"),
        Err(err) => warn!(%err, "{kind} reconcile failed"),
    }
}

fn retry<K, S>(_: Arc<K>, err: &ReconcileError, _: Arc<S>) -> Action {
    warn!(%err, "reconcile failed; retrying in {} s", RETRY.as_secs());
    Action::requeue(RETRY)
}

async fn reconcile_gpunode<S: SlurmNodes>(
    g: Arc<SlimGpuNode>,
    ctx: Arc<Context<S>>,
) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    ctx.synced.wait().await?;
    let name = g.name_any();
    let node = ctx
        .nodes
        .get(&ObjectRef::new(&name))
        .map(|n| NodeLabels::of(&n.metadata));
    let (slurmd, pods) = (ctx.slurmd.on_node(&name), ctx.pods.on_node(&name));
    let p = plan::plan(&Input {
        gpunode: Some(&g),
        node: node.as_ref(),
        slurmd_pods: &slurmd.iter().map(|p| &**p).collect::<Vec<_>>(),
        pods: &pods.iter().map(|p| &**p).collect::<Vec<_>>(),
        now: Timestamp::now(),
        settings: &ctx.settings,
    });
    let gone = g.metadata.deletion_timestamp.is_some();
    let held = g.status.as_ref().map_or(0, |s| s.held_gpus);
    ctx.metrics
        .node(&name, (!gone).then_some((g.spec.gpu_count, held)));
    let result = execute(&ctx, &g, &p).await;
    ctx.metrics
        .reconcile_seconds
        .observe(started.elapsed().as_secs_f64());
    result?;
    Ok(p.requeue_after
        .map_or_else(Action::await_change, Action::requeue))
}

async fn execute<S: SlurmNodes>(
    ctx: &Context<S>,
    g: &SlimGpuNode,
    p: &Plan,
) -> Result<(), ReconcileError> {
    let name = g.name_any();
    let gref = g.object_ref(&());
    if let Some(labels) = &p.labels {
        apply_labels(ctx, &name, labels).await?;
        let (reason, note) = labels_note(labels);
        ctx.event(&gref, EventType::Normal, reason, note).await;
    }
    if let Some(conditions) = &p.conditions {
        apply_conditions(ctx, &name, conditions).await?;
    }
    for n in &p.notices {
        if n.reason == "Drifted" {
            ctx.metrics.drifts.inc();
        }
        ctx.event(&gref, EventType::Warning, n.reason, n.note.clone())
            .await;
    }
    let mut slurm_done = p.slurm_nodes.is_empty();
    if !p.slurm_nodes.is_empty() {
        match &ctx.slurm {
            None => {
                let note = "remediation is on but no slurmrestd is configured: the Slurm records \
                            and slurmd pods are left as they are"
                    .to_string();
                ctx.event(&gref, EventType::Warning, "RemediationUnavailable", note)
                    .await;
            }
            Some(slurm) => {
                for node in &p.slurm_nodes {
                    delete_slurm_node(ctx, slurm.as_ref(), &gref, node).await?;
                }
                slurm_done = true;
            }
        }
    }
    for a in &p.delete_pods {
        if a.why == condition::DRIFTED && !slurm_done {
            continue;
        }
        delete_pod(ctx, &gref, a).await?;
    }
    Ok(())
}

fn labels_note(labels: &std::collections::BTreeMap<String, String>) -> (&'static str, String) {
    if labels.is_empty() {
        return (
            "LabelsRemoved",
            "the node's mockgpu labels were removed".into(),
        );
    }
    let list: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    ("LabelsApplied", format!("node labels: {}", list.join(", ")))
}

async fn apply_labels<S>(
    ctx: &Context<S>,
    node: &str,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<(), ReconcileError> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    labels::apply(&nodes, node, labels)
        .await
        .map_err(kube_err(format!("applying labels to node {node}")))?;
    ctx.metrics.wrote("node_labels");
    info!(%node, ?labels, "node labels applied");
    Ok(())
}

async fn apply_conditions<S>(
    ctx: &Context<S>,
    name: &str,
    conditions: &[Condition],
) -> Result<(), ReconcileError> {
    let api: Api<SlimGpuNode> = Api::all(ctx.client.clone());
    let patch = json!({
        "apiVersion": "mockgpu.io/v1alpha1",
        "kind": "GpuNode",
        "metadata": {"name": name},
        "status": {"conditions": conditions},
    });
    api.patch_status(
        name,
        &PatchParams::apply(CONTROLLER_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(kube_err(format!("applying conditions to GpuNode {name}")))?;
    ctx.metrics.wrote("gpunode_conditions");
    let brief: Vec<String> = conditions
        .iter()
        .map(|c| format!("{}={}", c.type_, c.status))
        .collect();
    info!(gpunode = %name, conditions = %brief.join(" "), "conditions applied");
    Ok(())
}

async fn delete_slurm_node<S: SlurmNodes>(
    ctx: &Context<S>,
    slurm: &S,
    gref: &k8s_openapi::api::core::v1::ObjectReference,
    node: &str,
) -> Result<(), ReconcileError> {
    let labels = |result| ActionLabels {
        action: "delete_slurm_node",
        result,
    };
    match slurm.delete_node(node).await {
        Ok(done) => {
            ctx.metrics.remediation.get_or_create(&labels("ok")).inc();
            let note = match done {
                NodeDeleted::Deleted => {
                    format!("Slurm node {node} deleted: its slurmd registers afresh")
                }
                NodeDeleted::AlreadyGone => format!("Slurm node {node} was already gone"),
            };
            info!(%node, ?done, "Slurm node record deleted");
            ctx.event(gref, EventType::Normal, "SlurmNodeDeleted", note)
                .await;
            Ok(())
        }
        Err(source) => {
            ctx.metrics
                .remediation
                .get_or_create(&labels("error"))
                .inc();
            let note = format!("deleting Slurm node {node}: {source}; its slurmd pods are kept");
            ctx.event(gref, EventType::Warning, "SlurmNodeDeleteFailed", note)
                .await;
            Err(ReconcileError::Slurm {
                node: node.to_string(),
                source,
            })
        }
    }
}

async fn delete_pod<S>(
    ctx: &Context<S>,
    gref: &k8s_openapi::api::core::v1::ObjectReference,
    a: &plan::PodAction,
) -> Result<(), ReconcileError> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &a.namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(a.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let labels = |result| ActionLabels {
        action: "delete_pod",
        result,
    };
    let what = format!("deleting pod {}/{} ({})", a.namespace, a.name, a.why);
    let deleted = match api.delete(&a.name, &params).await {
        // gone already, or replaced by a pod of another UID: nothing to do
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        r => r.map(drop),
    };
    match deleted {
        Ok(()) => {
            ctx.metrics.remediation.get_or_create(&labels("ok")).inc();
            info!(pod = %format!("{}/{}", a.namespace, a.name), why = a.why, "pod deleted");
            let note = format!(
                "pod {}/{} deleted ({}): it is recreated afresh",
                a.namespace, a.name, a.why
            );
            ctx.event(gref, EventType::Normal, "PodDeleted", note.clone())
                .await;
            let pod_ref = k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(a.namespace.clone()),
                name: Some(a.name.clone()),
                uid: Some(a.uid.clone()),
                ..Default::default()
            };
            ctx.event(&pod_ref, EventType::Normal, "PodDeleted", note)
                .await;
            Ok(())
        }
        Err(e) => {
            ctx.metrics
                .remediation
                .get_or_create(&labels("error"))
                .inc();
            Err(kube_err(what)(e))
        }
    }
}

impl<S> Context<S> {
    /// Records an Event; a failure is logged, not fatal.
    async fn event(
        &self,
        regarding: &k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary: None,
        };
        match self.recorder.publish(&ev, regarding).await {
            Ok(()) => self.metrics.wrote("event"),
            Err(err) => warn!(%err, %reason, "cannot record an event"),
        }
    }
}

/// The sweep's context: the shared one, the GpuNode cache and its first list.
type SweepContext<S> = (Arc<Context<S>>, Store<SlimGpuNode>, Synced);

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
        node: Some(&NodeLabels::of(&node.metadata)),
        slurmd_pods: &[],
        pods: &[],
        now: Timestamp::now(),
        settings: &ctx.settings,
    });
    if let Some(labels) = &p.labels {
        apply_labels(ctx, name, labels).await?;
        let (reason, note) = labels_note(labels);
        let nref = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(name.to_string()),
            uid: node.metadata.uid.clone(),
            ..Default::default()
        };
        ctx.event(
            &nref,
            EventType::Normal,
            reason,
            format!("{note}: its GpuNode is gone"),
        )
        .await;
    }
    Ok(())
}

/// The Event recorder of replica `identity`.
pub fn recorder(client: Client, identity: &str) -> Recorder {
    Recorder::new(
        client,
        kube::runtime::events::Reporter {
            controller: CONTROLLER_MANAGER.into(),
            instance: Some(identity.into()),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, ResourceRequirements};

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

    /// The all-pods cache keeps GPU pods only, and every deletion and list bound.
    #[test]
    fn only_gpu_pods_are_cached() {
        let pod = |gpus: Option<&str>| {
            slim_pod(&Pod {
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
            })
        };
        use watcher::Event::*;
        let cases = [
            (Apply(pod(Some("1"))), true),
            (InitApply(pod(Some("2"))), true),
            (Apply(pod(None)), false),
            (InitApply(pod(Some("0"))), false),
            (Delete(pod(None)), true),
            (Init, true),
            (InitDone, true),
        ];
        for (e, keep) in cases {
            assert_eq!(gpu_pod_event(&e, "nvidia.com/gpu"), keep, "{e:?}");
        }
    }
}

#[cfg(test)]
mod writes;
