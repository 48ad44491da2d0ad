//! The executor: two kube-runtime controllers that look up what [`plan`] needs in their caches,
//! carry out its [`Plan`] against the API server (and Slurm), and record an Event per action.
//!
//! - On GpuNodes (also triggered by their Nodes, slurmd pods and GPU pods): labels, conditions,
//!   remediation.
//! - On Nodes (also triggered by GpuNodes, deletions included): a node whose GpuNode is gone
//!   loses our labels. There is no finalizer: deleting a GpuNode never waits for the controller,
//!   and a node whose GpuNode went while no controller ran is cleaned when one starts (the Node
//!   cache's first list reconciles every node).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PartialObjectMeta, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{Action, Error as ControllerError};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use mockgpu_api::GpuNode;
use mockgpu_api::gpunode::{CONTROLLER_MANAGER, condition};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::labels;
use crate::metrics::{ActionLabels, Metrics};
use crate::plan::{self, Input, Plan, Settings, requests_resource};
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

/// What both controllers share.
pub struct Context<S> {
    client: Client,
    settings: Settings,
    slurm: Option<Arc<S>>,
    recorder: Recorder,
    metrics: Metrics,
    nodes: Store<PartialObjectMeta<Node>>,
    slurmd: Store<Pod>,
    pods: Store<Pod>,
    /// The three caches above have had their first list.
    synced: Synced,
}

/// Resolves once some caches have had their first list, for any number of waiters.
///
/// `Store::wait_until_ready` wakes only the last of several concurrent waiters (a oneshot
/// underneath): the other reconcilers would wait forever, and their objects would never be
/// reconciled again. One shared wait per set of caches wakes them all.
#[derive(Clone)]
struct Synced(Shared<BoxFuture<'static, bool>>);

impl Synced {
    fn new(all: impl Future<Output = bool> + Send + 'static) -> Self {
        Self(all.boxed().shared())
    }

    async fn wait(&self) -> Result<(), ReconcileError> {
        if self.0.clone().await {
            Ok(())
        } else {
            Err(ReconcileError::CacheGone)
        }
    }
}

/// `store`'s first list, as a future for [`Synced::new`] (false if its writer went away).
fn listed<K>(store: &Store<K>) -> impl Future<Output = bool> + Send + 'static
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Send + Sync,
{
    let store = store.clone();
    async move { store.wait_until_ready().await.is_ok() }
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ReconcileError {
    let what = what.into();
    move |source| ReconcileError::Kube { what, source }
}

fn on_node(pod: &Pod, node: &str) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
}

fn node_of(pod: Pod) -> Option<ObjectRef<GpuNode>> {
    pod.spec?.node_name.map(|n| ObjectRef::new(&n))
}

/// Runs both controllers until they end (they do not, unless every watch stream ends); slurmd
/// pods are those matching the label selector `slurmd_selector`.
pub async fn controllers<S: SlurmNodes + 'static>(
    client: Client,
    settings: Settings,
    slurm: Option<Arc<S>>,
    recorder: Recorder,
    metrics: Metrics,
    slurmd_selector: &str,
) {
    let gpunodes: Api<GpuNode> = Api::all(client.clone());
    // metadata only (labels and managed fields are all that is looked at)
    let nodes: Api<PartialObjectMeta<Node>> = Api::all(client.clone());
    let gpunode_meta: Api<PartialObjectMeta<GpuNode>> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    // each cache is written before its event triggers a reconcile, so a reconcile sees at least
    // what triggered it
    let (node_store, w) = reflector::store();
    let node_events = reflector::reflector(w, watcher(nodes.clone(), watcher::Config::default()));
    let (slurmd_store, w) = reflector::store();
    let slurmd_cfg = watcher::Config::default().labels(slurmd_selector);
    let slurmd_events = reflector::reflector(w, watcher(pods.clone(), slurmd_cfg).modify(strip));
    let resource = settings.gpu_resource.clone();
    let (pod_store, w) = reflector::store();
    let pod_events =
        reflector::reflector(w, watcher(pods, watcher::Config::default()).modify(strip));
    let (n, s, p) = (
        listed(&node_store),
        listed(&slurmd_store),
        listed(&pod_store),
    );
    let synced = Synced::new(async move { n.await && s.await && p.await });
    let ctx = Arc::new(Context {
        client,
        settings,
        slurm,
        recorder,
        metrics,
        synced,
        nodes: node_store,
        slurmd: slurmd_store,
        pods: pod_store,
    });
    let main = Controller::new(gpunodes.clone(), watcher::Config::default())
        .watches_stream(touched(node_events), |n| {
            Some(ObjectRef::new(&n.name_any()))
        })
        .watches_stream(touched(slurmd_events), node_of)
        .watches_stream(touched(pod_events), move |p| {
            requests_resource(&p, &resource)
                .then(|| node_of(p))
                .flatten()
        })
        .run(reconcile_gpunode, retry, ctx.clone())
        .for_each(|r| async move { log_result("GpuNode", r) });
    // the sweep: its own Node and GpuNode caches (metadata only)
    let (swept, w) = reflector::store();
    let sweep_nodes = reflector::reflector(w, watcher(nodes, watcher::Config::default()));
    let (gone_store, w) = reflector::store::<PartialObjectMeta<GpuNode>>();
    let gpunode_events = reflector::reflector(w, watcher(gpunode_meta, watcher::Config::default()));
    let gone_synced = Synced::new(listed(&gone_store));
    let sweep_ctx = Arc::new((ctx, gone_store, gone_synced));
    let sweep = Controller::for_stream(sweep_nodes.default_backoff().applied_objects(), swept)
        .watches_stream(touched(gpunode_events), |g| {
            Some(ObjectRef::new(&g.name_any()))
        })
        .run(sweep_node, retry, sweep_ctx)
        .for_each(|r| async move { log_result("Node", r) });
    tokio::join!(main, sweep);
}

/// A watch stream's changed and deleted objects, with kube-runtime's default backoff.
fn touched<K, S>(events: S) -> impl Stream<Item = Result<K, watcher::Error>> + Send
where
    K: Resource + Clone + Send,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    events.default_backoff().touched_objects()
}

/// Pods are cached without their managed fields (the biggest part, and unused).
fn strip(pod: &mut Pod) {
    pod.managed_fields_mut().clear();
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
    g: Arc<GpuNode>,
    ctx: Arc<Context<S>>,
) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    ctx.synced.wait().await?;
    let name = g.name_any();
    let node = ctx.nodes.get(&ObjectRef::new(&name));
    let slurmd = ctx.slurmd.state_filter(|p| on_node(p, &name));
    let resource = &ctx.settings.gpu_resource;
    let pods = ctx
        .pods
        .state_filter(|p| on_node(p, &name) && requests_resource(p, resource));
    let slurmd: Vec<&Pod> = slurmd.iter().map(AsRef::as_ref).collect();
    let pods_ref: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
    let p = plan::plan(&Input {
        gpunode: Some(&g),
        node: node.as_ref().map(|n| &n.metadata),
        slurmd_pods: &slurmd,
        pods: &pods_ref,
        now: Timestamp::now(),
        settings: &ctx.settings,
    });
    let gone = g.metadata.deletion_timestamp.is_some();
    let held = g.status.as_ref().map_or(0, |s| s.held_gpus);
    ctx.metrics
        .node(&name, (!gone).then_some((g.spec.gpu_count, held)));
    let result = execute(&ctx, &g, &p, &pods).await;
    ctx.metrics
        .reconcile_seconds
        .observe(started.elapsed().as_secs_f64());
    result?;
    Ok(p.requeue_after
        .map_or_else(Action::await_change, Action::requeue))
}

async fn execute<S: SlurmNodes>(
    ctx: &Context<S>,
    g: &GpuNode,
    p: &Plan,
    pods: &[Arc<Pod>],
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
        let pod = pods
            .iter()
            .find(|x| x.metadata.uid.as_deref() == Some(&a.uid))
            .map(|x| x.object_ref(&()))
            .or_else(|| {
                ctx.slurmd
                    .find(|x| x.metadata.uid.as_deref() == Some(&a.uid))
                    .map(|x| x.object_ref(&()))
            });
        delete_pod(ctx, &gref, pod, a).await?;
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
    info!(%node, ?labels, "node labels applied");
    Ok(())
}

async fn apply_conditions<S>(
    ctx: &Context<S>,
    name: &str,
    conditions: &[Condition],
) -> Result<(), ReconcileError> {
    let api: Api<GpuNode> = Api::all(ctx.client.clone());
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
    pod_ref: Option<k8s_openapi::api::core::v1::ObjectReference>,
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
            if let Some(p) = pod_ref {
                ctx.event(&p, EventType::Normal, "PodDeleted", note).await;
            }
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
        if let Err(err) = self.recorder.publish(&ev, regarding).await {
            warn!(%err, %reason, "cannot record an event");
        }
    }
}

/// The sweep's context: the shared one and its own GpuNode cache.
type SweepContext<S> = (Arc<Context<S>>, Store<PartialObjectMeta<GpuNode>>, Synced);

async fn sweep_node<S: SlurmNodes>(
    node: Arc<PartialObjectMeta<Node>>,
    ctx: Arc<SweepContext<S>>,
) -> Result<Action, ReconcileError> {
    let (ctx, gpunodes, synced) = (&ctx.0, &ctx.1, &ctx.2);
    synced.wait().await?;
    let name = node.name_any();
    if gpunodes.get(&ObjectRef::new(&name)).is_some() {
        return Ok(Action::await_change());
    }
    let p = plan::plan(&Input {
        gpunode: None,
        node: Some(&node.metadata),
        slurmd_pods: &[],
        pods: &[],
        now: Timestamp::now(),
        settings: &ctx.settings,
    });
    ctx.metrics.node(&name, None);
    if let Some(labels) = &p.labels {
        apply_labels(ctx, &name, labels).await?;
        let (reason, note) = labels_note(labels);
        let nref = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(name.clone()),
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
    Ok(Action::await_change())
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
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    /// Several reconcilers waiting at once for the first list all go on (a bare
    /// `wait_until_ready` wakes only one of them).
    #[tokio::test]
    async fn every_waiter_wakes_on_the_first_list() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let synced = Synced::new(listed(&store));
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let s = synced.clone();
                tokio::spawn(async move { s.wait().await.is_ok() })
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
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(cm));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        for w in waiters {
            let woke = tokio::time::timeout(Duration::from_secs(5), w).await;
            assert!(
                matches!(woke, Ok(Ok(true))),
                "a waiter stayed asleep: {woke:?}"
            );
        }
        assert_eq!(store.state().len(), 1);
    }

    /// A cache whose writer went away fails the wait instead of hanging.
    #[tokio::test]
    async fn a_dropped_cache_fails_the_wait() {
        let (store, writer) = reflector::store::<ConfigMap>();
        let synced = Synced::new(listed(&store));
        drop(writer);
        let r = tokio::time::timeout(Duration::from_secs(5), synced.wait()).await;
        assert!(matches!(r, Ok(Err(ReconcileError::CacheGone))), "{r:?}");
    }
}
