//! The writes of the controller's reconciles: a [`Plan`] carried out against the API server (and
//! Slurm), an Event recorded per action, and a swept Node's labels removed. Nothing here decides
//! (that is `plan`'s) or reads a cache (`reconcile`'s).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client, Resource, ResourceExt};
use mockgpu_api::gpunode::{CONTROLLER_MANAGER, condition};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::metrics::{ActionLabels, Metrics};
use crate::plan::{self, Plan};
use crate::slim::SlimGpuNode;
use crate::slurm::{Drain, NodeDeleted, Resume, SlurmError, SlurmNodes};

/// A failed write.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
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
        source: SlurmError,
    },
    /// Draining or resuming a Slurm node failed.
    #[error("{what} Slurm node {node}: {source}")]
    SlurmState {
        /// `draining` or `resuming`.
        what: &'static str,
        /// The Slurm node.
        node: String,
        /// The error.
        source: SlurmError,
    },
}

/// A [`WriteError::Kube`] of the request `what`.
pub(crate) fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> WriteError {
    let what = what.into();
    move |source| WriteError::Kube { what, source }
}

/// Records Events as the controller, counting them as writes; clones share the recorder's
/// cache (which makes a repeated Event a series).
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
    metrics: Metrics,
}

impl Events {
    /// Events through `recorder`, counted in `metrics`.
    pub fn new(recorder: Recorder, metrics: Metrics) -> Self {
        Self { recorder, metrics }
    }

    /// Records an Event about `regarding`; a failure is logged, not fatal.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
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

/// What writes: the API client, the Events, the write and remediation metrics, and Slurm
/// (`None`: no slurmrestd).
pub struct Writer<S> {
    client: Client,
    events: Events,
    metrics: Metrics,
    slurm: Option<Arc<S>>,
}

impl<S: SlurmNodes> Writer<S> {
    /// A writer through `client`, recording Events with `recorder`.
    pub fn new(
        client: Client,
        recorder: Recorder,
        metrics: Metrics,
        slurm: Option<Arc<S>>,
    ) -> Self {
        Self {
            client,
            events: Events::new(recorder, metrics.clone()),
            metrics,
            slurm,
        }
    }

    /// Carries out `p` on GpuNode `g` (whose Node has UID `node_uid`), recording an Event per
    /// action.
    pub async fn execute(
        &self,
        g: &SlimGpuNode,
        node_uid: Option<&str>,
        p: &Plan,
    ) -> Result<(), WriteError> {
        let name = g.name_any();
        let gref = g.object_ref(&());
        if let Some(labels) = &p.labels {
            self.apply_labels(&name, labels).await?;
            let (reason, note) = labels_note(labels);
            self.events
                .publish(&gref, EventType::Normal, reason, note)
                .await;
        }
        if let Some(c) = &p.node_condition {
            self.set_node_condition(&name, c).await?;
        }
        if let Some(slurm) = &self.slurm {
            for node in &p.slurm_resume {
                self.resume_slurm_node(slurm.as_ref(), &gref, node).await?;
            }
        }
        if let Some(conditions) = &p.conditions {
            self.apply_conditions(&name, conditions).await?;
        }
        for n in &p.notices {
            if n.reason == "Drifted" {
                self.metrics.drifts.inc();
            }
            self.events
                .publish(&gref, EventType::Warning, n.reason, n.note.clone())
                .await;
        }
        if let Some(e) = &p.fault_event {
            let type_ = if e.warning {
                EventType::Warning
            } else {
                EventType::Normal
            };
            let nref = node_ref(&name, node_uid.map(str::to_string));
            for regarding in [&gref, &nref] {
                self.events
                    .publish(regarding, type_, e.reason, e.note.clone())
                    .await;
            }
        }
        if let (Some(drain), Some(slurm)) = (&p.slurm_drain, &self.slurm) {
            for node in &drain.nodes {
                self.drain_slurm_node(slurm.as_ref(), &gref, node, &drain.reason)
                    .await?;
            }
        }
        let mut slurm_done = p.slurm_nodes.is_empty();
        if !p.slurm_nodes.is_empty() {
            match &self.slurm {
                None => {
                    let note = "remediation is on but no slurmrestd is configured: the Slurm \
                                records and slurmd pods are left as they are"
                        .to_string();
                    self.events
                        .publish(&gref, EventType::Warning, "RemediationUnavailable", note)
                        .await;
                }
                Some(slurm) => {
                    for node in &p.slurm_nodes {
                        self.delete_slurm_node(slurm.as_ref(), &gref, node).await?;
                    }
                    slurm_done = true;
                }
            }
        }
        for a in &p.delete_pods {
            if a.why == condition::DRIFTED && !slurm_done {
                continue;
            }
            self.delete_pod(&gref, a).await?;
        }
        Ok(())
    }

    async fn apply_labels(
        &self,
        node: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), WriteError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        apply_node_labels(&nodes, node, labels)
            .await
            .map_err(kube_err(format!("applying labels to node {node}")))?;
        self.metrics.wrote("node_labels");
        info!(%node, ?labels, "node labels applied");
        Ok(())
    }

    async fn apply_conditions(
        &self,
        name: &str,
        conditions: &[Condition],
    ) -> Result<(), WriteError> {
        let api: Api<SlimGpuNode> = Api::all(self.client.clone());
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
        self.metrics.wrote("gpunode_conditions");
        let brief: Vec<String> = conditions
            .iter()
            .map(|c| format!("{}={}", c.type_, c.status))
            .collect();
        info!(gpunode = %name, conditions = %brief.join(" "), "conditions applied");
        Ok(())
    }

    /// Sets condition `c` on Node `name`'s status: a strategic merge patch of that one entry of
    /// `status.conditions` (merged by `type`), so that the kubelet's conditions, and anyone
    /// else's, stay as they are.
    async fn set_node_condition(&self, name: &str, c: &Condition) -> Result<(), WriteError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let patch = node_condition_patch(c, Timestamp::now());
        let params = PatchParams {
            field_manager: Some(CONTROLLER_MANAGER.into()),
            ..PatchParams::default()
        };
        nodes
            .patch_status(name, &params, &Patch::Strategic(&patch))
            .await
            .map_err(kube_err(format!(
                "setting condition {} of node {name}",
                c.type_
            )))?;
        self.metrics.wrote("node_condition");
        info!(node = %name, condition = %c.type_, status = %c.status, reason = %c.reason,
            "node condition set");
        Ok(())
    }

    async fn drain_slurm_node(
        &self,
        slurm: &S,
        gref: &ObjectReference,
        node: &str,
        reason: &str,
    ) -> Result<(), WriteError> {
        let action = "drain_slurm_node";
        match slurm.drain_node(node, reason).await {
            Ok(Drain::Drained) => {
                self.count(action, "ok");
                info!(%node, %reason, "Slurm node drained");
                let note = format!("Slurm node {node} drained: {reason}");
                self.events
                    .publish(gref, EventType::Normal, "SlurmNodeDrained", note)
                    .await;
                Ok(())
            }
            Ok(Drain::Foreign(theirs)) => {
                debug!(%node, reason = %theirs, "Slurm node carries someone else's reason: not drained");
                Ok(())
            }
            Ok(Drain::AlreadyDrained | Drain::NoSuchNode) => Ok(()),
            Err(source) => {
                self.count(action, "error");
                let note = format!("draining Slurm node {node}: {source}");
                self.events
                    .publish(gref, EventType::Warning, "SlurmNodeDrainFailed", note)
                    .await;
                Err(WriteError::SlurmState {
                    what: "draining",
                    node: node.to_string(),
                    source,
                })
            }
        }
    }

    async fn resume_slurm_node(
        &self,
        slurm: &S,
        gref: &ObjectReference,
        node: &str,
    ) -> Result<(), WriteError> {
        let action = "resume_slurm_node";
        match slurm.resume_node(node).await {
            Ok(Resume::Resumed) => {
                self.count(action, "ok");
                info!(%node, "Slurm node resumed");
                let note = format!("Slurm node {node} resumed: its GPU faults cleared");
                self.events
                    .publish(gref, EventType::Normal, "SlurmNodeResumed", note)
                    .await;
                Ok(())
            }
            Ok(Resume::NotOurs(theirs)) => {
                let note = format!(
                    "Slurm node {node} is left drained: its reason is not mockgpu's ({theirs})"
                );
                self.events
                    .publish(gref, EventType::Normal, "SlurmNodeLeftDrained", note)
                    .await;
                Ok(())
            }
            Ok(Resume::NotDrained | Resume::NoSuchNode) => Ok(()),
            Err(source) => {
                self.count(action, "error");
                let note = format!("resuming Slurm node {node}: {source}");
                self.events
                    .publish(gref, EventType::Warning, "SlurmNodeResumeFailed", note)
                    .await;
                Err(WriteError::SlurmState {
                    what: "resuming",
                    node: node.to_string(),
                    source,
                })
            }
        }
    }

    async fn delete_slurm_node(
        &self,
        slurm: &S,
        gref: &ObjectReference,
        node: &str,
    ) -> Result<(), WriteError> {
        let action = "delete_slurm_node";
        match slurm.delete_node(node).await {
            Ok(done) => {
                self.count(action, "ok");
                let note = match done {
                    NodeDeleted::Deleted => {
                        format!("Slurm node {node} deleted: its slurmd registers afresh")
                    }
                    NodeDeleted::AlreadyGone => format!("Slurm node {node} was already gone"),
                };
                info!(%node, ?done, "Slurm node record deleted");
                self.events
                    .publish(gref, EventType::Normal, "SlurmNodeDeleted", note)
                    .await;
                Ok(())
            }
            Err(source) => {
                self.count(action, "error");
                let note =
                    format!("deleting Slurm node {node}: {source}; its slurmd pods are kept");
                self.events
                    .publish(gref, EventType::Warning, "SlurmNodeDeleteFailed", note)
                    .await;
                Err(WriteError::Slurm {
                    node: node.to_string(),
                    source,
                })
            }
        }
    }

    async fn delete_pod(
        &self,
        gref: &ObjectReference,
        a: &plan::PodAction,
    ) -> Result<(), WriteError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &a.namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(a.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let action = "delete_pod";
        let what = format!("deleting pod {}/{} ({})", a.namespace, a.name, a.why);
        let deleted = match api.delete(&a.name, &params).await {
            // gone already, or replaced by a pod of another UID: nothing to do
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
            r => r.map(drop),
        };
        match deleted {
            Ok(()) => {
                self.count(action, "ok");
                info!(pod = %format!("{}/{}", a.namespace, a.name), why = a.why, "pod deleted");
                let note = format!(
                    "pod {}/{} deleted ({}): it is recreated afresh",
                    a.namespace, a.name, a.why
                );
                self.events
                    .publish(gref, EventType::Normal, "PodDeleted", note.clone())
                    .await;
                let pod_ref = ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    namespace: Some(a.namespace.clone()),
                    name: Some(a.name.clone()),
                    uid: Some(a.uid.clone()),
                    ..Default::default()
                };
                self.events
                    .publish(&pod_ref, EventType::Normal, "PodDeleted", note)
                    .await;
                Ok(())
            }
            Err(e) => {
                self.count(action, "error");
                Err(kube_err(what)(e))
            }
        }
    }

    /// Counts a remediation `action` that ended in `result` (`ok` or `error`).
    fn count(&self, action: &'static str, result: &'static str) {
        let labels = ActionLabels { action, result };
        self.metrics.remediation.get_or_create(&labels).inc();
    }

    /// Removes our labels from Node `name` (of `uid`), whose GpuNode is gone, with an Event.
    pub async fn sweep_labels(
        &self,
        name: &str,
        uid: Option<String>,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), WriteError> {
        self.apply_labels(name, labels).await?;
        let (reason, note) = labels_note(labels);
        let nref = node_ref(name, uid);
        let note = format!("{note}: its GpuNode is gone");
        self.events
            .publish(&nref, EventType::Normal, reason, note)
            .await;
        Ok(())
    }
}

/// A reference to Node `name` of `uid`.
fn node_ref(name: &str, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.to_string()),
        uid,
        ..Default::default()
    }
}

/// The strategic merge patch of Node status that sets condition `c` (one entry of
/// `status.conditions`, merged by `type`), its heartbeat `now`.
pub fn node_condition_patch(c: &Condition, now: Timestamp) -> serde_json::Value {
    json!({
        "status": {
            "conditions": [{
                "type": c.type_,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": c.last_transition_time,
                "lastHeartbeatTime": Time(now),
            }],
        },
    })
}

fn labels_note(labels: &BTreeMap<String, String>) -> (&'static str, String) {
    if labels.is_empty() {
        return (
            "LabelsRemoved",
            "the node's mockgpu labels were removed".into(),
        );
    }
    let list: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    ("LabelsApplied", format!("node labels: {}", list.join(", ")))
}

/// Applies `labels` to node `name` with our field manager (server-side apply, forced): the set
/// replaces what we owned, so an empty set removes our labels and nothing else. The answer comes
/// back as metadata only.
pub async fn apply_node_labels(
    nodes: &Api<Node>,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), kube::Error> {
    let patch = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
    });
    let params = PatchParams::apply(CONTROLLER_MANAGER).force();
    nodes
        .patch_metadata(name, &params, &Patch::Apply(&patch))
        .await?;
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
pub(crate) mod tests;
