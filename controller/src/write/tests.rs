//! The writes against a mocked API server (`tower-test`): for each action a [`Plan`] can hold,
//! the exact requests sent (method, path and query, the essentials of the body), and how the
//! API's error answers are handled. Its helpers serve `reconcile`'s tests too.

use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use mockgpu_api::{GpuNode, GpuNodeSpec, Mode};
use serde_json::Value;

use super::*;
use crate::labels::{GPU_COUNT, PROFILE};
use crate::metrics::WriteLabels;
use crate::mock_api::{Sent, Server, api_server, requests, status};
use crate::slim::tests::slim;

/// What the server was sent, once `clients` (holding the last clients) are dropped.
pub(crate) async fn sent<T>(clients: T, server: Server) -> Vec<Sent> {
    drop(clients);
    server.sent().await
}

/// The GpuNode as the API server has it (uid `gu`).
pub(crate) fn gpunode() -> GpuNode {
    let mut g = GpuNode::new(
        "node-a",
        GpuNodeSpec::new("node-a", Mode::Mock, "gb300", Vec::new()),
    );
    g.metadata.uid = Some("gu".into());
    g
}

/// The API server's answer to a successful write: the created Event, the patched Node's metadata
/// or GpuNode, the deleted pod.
pub(crate) fn ok(s: &Sent) -> (u16, Value) {
    match (&*s.method, &*s.uri) {
        ("POST", uri) if uri.contains("/events") => (201, s.body.clone()),
        ("PATCH", uri) if uri.starts_with("/api/v1/nodes/node-a/status") => (
            200,
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "node-a", "uid": "nu"},
                "status": {"conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "GPUProblem", "status": "True"},
                ]},
            }),
        ),
        ("PATCH", uri) if uri.starts_with("/api/v1/nodes/") => (
            200,
            json!({
                "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                "metadata": {"name": "node-a", "uid": "nu"},
            }),
        ),
        ("PATCH", uri) if uri.starts_with("/apis/mockgpu.io/") => {
            (200, serde_json::to_value(gpunode()).unwrap())
        }
        ("DELETE", _) => (
            200,
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}),
        ),
        _ => status(500, "Unexpected"),
    }
}

/// [`ok`], but `code` to every request of `method`.
fn failing(
    method: &'static str,
    code: u16,
    reason: &'static str,
) -> impl Fn(&Sent) -> (u16, Value) + Send + 'static {
    move |s| {
        if s.method == method {
            status(code, reason)
        } else {
            ok(s)
        }
    }
}

/// Slurm's node records, as a fake: the names asked to delete (drains and resumes as
/// `drain <name> <reason>`, `resume <name>`), and the answer to each.
pub(crate) struct FakeSlurm {
    answer: fn() -> Result<NodeDeleted, SlurmError>,
    drain: fn() -> Result<Drain, SlurmError>,
    resume: fn() -> Result<Resume, SlurmError>,
    pub(crate) asked: Mutex<Vec<String>>,
}

impl SlurmNodes for FakeSlurm {
    async fn delete_node(&self, name: &str) -> Result<NodeDeleted, SlurmError> {
        self.asked.lock().unwrap().push(name.to_string());
        (self.answer)()
    }

    async fn drain_node(&self, name: &str, reason: &str) -> Result<Drain, SlurmError> {
        self.asked
            .lock()
            .unwrap()
            .push(format!("drain {name} {reason}"));
        (self.drain)()
    }

    async fn resume_node(&self, name: &str) -> Result<Resume, SlurmError> {
        self.asked.lock().unwrap().push(format!("resume {name}"));
        (self.resume)()
    }
}

pub(crate) fn fake_slurm(answer: fn() -> Result<NodeDeleted, SlurmError>) -> Arc<FakeSlurm> {
    Arc::new(FakeSlurm {
        answer,
        drain: || Ok(Drain::Drained),
        resume: || Ok(Resume::Resumed),
        asked: Mutex::default(),
    })
}

/// A fake Slurm answering drains with `drain` and resumes with `resume`.
pub(crate) fn fake_slurm_states(
    drain: fn() -> Result<Drain, SlurmError>,
    resume: fn() -> Result<Resume, SlurmError>,
) -> Arc<FakeSlurm> {
    Arc::new(FakeSlurm {
        answer: || Ok(NodeDeleted::Deleted),
        drain,
        resume,
        asked: Mutex::default(),
    })
}

/// A writer through `client` as replica `replica-0`, with Slurm `slurm` (`None`: no
/// slurmrestd).
pub(crate) fn writer(client: Client, slurm: Option<Arc<FakeSlurm>>) -> Writer<FakeSlurm> {
    let recorder = recorder(client.clone(), "replica-0");
    Writer::new(client, recorder, Metrics::default(), slurm)
}

/// Runs `plan` through the executor against a server answering `answer`, with Slurm `slurm`:
/// the outcome, what was sent, and the metrics.
async fn execute_plan(
    plan: Plan,
    slurm: Option<Arc<FakeSlurm>>,
    answer: impl Fn(&Sent) -> (u16, Value) + Send + 'static,
) -> (Result<(), WriteError>, Vec<Sent>, Metrics) {
    let (client, server) = api_server(answer);
    let w = writer(client, slurm);
    let metrics = w.metrics.clone();
    let result = w.execute(&slim(&gpunode()), Some("nu"), &plan).await;
    (result, sent(w, server).await, metrics)
}

pub(crate) const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events?";
pub(crate) const NODE_APPLY: &str =
    "/api/v1/nodes/node-a?&force=true&fieldManager=mockgpu-controller";
pub(crate) const STATUS_APPLY: &str =
    "/apis/mockgpu.io/v1alpha1/gpunodes/node-a/status?&force=true&fieldManager=mockgpu-controller";
pub(crate) const APPLY_PATCH: &str = "application/apply-patch+yaml";

/// An Event's (type, reason, note, what it is about as kind/namespace/name/uid), after checking
/// that this replica reported it.
pub(crate) fn event(s: &Sent) -> (String, String, String, String) {
    let b = &s.body;
    assert_eq!(
        (
            b["reportingController"].as_str(),
            b["reportingInstance"].as_str()
        ),
        (Some(CONTROLLER_MANAGER), Some("replica-0")),
        "{b}"
    );
    assert_eq!(b["action"], b["reason"], "{b}");
    let r = &b["regarding"];
    let regarding = ["kind", "namespace", "name", "uid"]
        .map(|k| r[k].as_str().unwrap_or_default())
        .join("/");
    let text = |k: &str| b[k].as_str().unwrap_or_default().to_string();
    (text("type"), text("reason"), text("note"), regarding)
}

pub(crate) fn ev(
    type_: &str,
    reason: &str,
    note: &str,
    regarding: &str,
) -> (String, String, String, String) {
    (type_.into(), reason.into(), note.into(), regarding.into())
}

pub(crate) const ON_GPUNODE: &str = "GpuNode//node-a/gu";

fn writes(m: &Metrics, kind: &'static str) -> u64 {
    m.writes.get_or_create(&WriteLabels { kind }).get()
}

fn remediations(m: &Metrics, action: &'static str, result: &'static str) -> u64 {
    m.remediation
        .get_or_create(&ActionLabels { action, result })
        .get()
}

pub(crate) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The node-label apply's body for `labels`.
pub(crate) fn node_apply(labels: &BTreeMap<String, String>) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a", "labels": labels},
    })
}

#[tokio::test]
async fn labels_are_applied_with_our_field_manager_and_recorded() {
    let want = labels(&[(PROFILE, "gb300"), (GPU_COUNT, "4")]);
    let plan = Plan {
        labels: Some(want.clone()),
        ..Plan::default()
    };
    let (r, sent, m) = execute_plan(plan, None, ok).await;
    r.unwrap();
    assert_eq!(requests(&sent), [("PATCH", NODE_APPLY), ("POST", EVENTS)]);
    assert_eq!(sent[0].content_type, APPLY_PATCH);
    assert_eq!(sent[0].body, node_apply(&want));
    let note = "node labels: mockgpu.io/profile=gb300, nvidia.com/gpu.count=4";
    assert_eq!(
        event(&sent[1]),
        ev("Normal", "LabelsApplied", note, ON_GPUNODE)
    );
    assert_eq!((writes(&m, "node_labels"), writes(&m, "event")), (1, 1));
}

/// An empty set applied with our field manager drops the labels we own, and only those.
#[tokio::test]
async fn labels_are_removed_by_applying_an_empty_set() {
    let plan = Plan {
        labels: Some(BTreeMap::new()),
        ..Plan::default()
    };
    let (r, sent, _) = execute_plan(plan, None, ok).await;
    r.unwrap();
    assert_eq!(requests(&sent), [("PATCH", NODE_APPLY), ("POST", EVENTS)]);
    assert_eq!(sent[0].body, node_apply(&BTreeMap::new()));
    let note = "the node's mockgpu labels were removed";
    assert_eq!(
        event(&sent[1]),
        ev("Normal", "LabelsRemoved", note, ON_GPUNODE)
    );
}

#[tokio::test]
async fn conditions_are_applied_to_the_status_subresource() {
    let conditions = vec![Condition {
        type_: condition::STALE.into(),
        status: "False".into(),
        reason: "Heartbeating".into(),
        message: "the agent reports within 90 s".into(),
        last_transition_time: Time(Timestamp::from_second(1_800_000_000).unwrap()),
        observed_generation: Some(3),
    }];
    let plan = Plan {
        conditions: Some(conditions.clone()),
        ..Plan::default()
    };
    let (r, sent, m) = execute_plan(plan, None, ok).await;
    r.unwrap();
    assert_eq!(requests(&sent), [("PATCH", STATUS_APPLY)]);
    assert_eq!(sent[0].content_type, APPLY_PATCH);
    let want = json!({
        "apiVersion": "mockgpu.io/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": "node-a"},
        "status": {"conditions": [{
            "type": "Stale", "status": "False", "reason": "Heartbeating",
            "message": "the agent reports within 90 s",
            "lastTransitionTime": "2027-01-15T08:00:00Z", "observedGeneration": 3,
        }]},
    });
    assert_eq!(sent[0].body, want);
    assert_eq!(writes(&m, "gpunode_conditions"), 1);
}

/// Conditions that became true are Warning Events on the GpuNode; a drift is counted.
#[tokio::test]
async fn notices_are_warning_events() {
    let notice = |reason, note: &str| plan::Notice {
        reason,
        note: note.into(),
    };
    let plan = Plan {
        notices: vec![
            notice("HeartbeatLost", "no heartbeat"),
            notice("Drifted", "slurmd pod(s) slurm/d started before"),
            notice("InjectionMissing", "running GPU container(s) without"),
        ],
        ..Plan::default()
    };
    let (r, sent, m) = execute_plan(plan, None, ok).await;
    r.unwrap();
    assert_eq!(requests(&sent), [("POST", EVENTS); 3]);
    let events: Vec<_> = sent.iter().map(event).collect();
    assert_eq!(
        events,
        [
            ev("Warning", "HeartbeatLost", "no heartbeat", ON_GPUNODE),
            ev(
                "Warning",
                "Drifted",
                "slurmd pod(s) slurm/d started before",
                ON_GPUNODE
            ),
            ev(
                "Warning",
                "InjectionMissing",
                "running GPU container(s) without",
                ON_GPUNODE
            ),
        ]
    );
    assert_eq!(m.drifts.get(), 1);
}

/// A pod to delete: `name` in namespace `slurm`, UID `uid-NAME`.
fn pod_action(name: &str, why: &'static str) -> plan::PodAction {
    plan::PodAction {
        namespace: "slurm".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        why,
    }
}

/// The deletion of pod `name` (namespace `slurm`), its body (the UID precondition) checked.
fn pod_delete(s: &Sent, name: &str) -> (String, String) {
    assert_eq!(
        s.body,
        json!({"preconditions": {"uid": format!("uid-{name}")}}),
        "deleting {name}"
    );
    (s.method.clone(), s.uri.clone())
}

fn delete(name: &str) -> (String, String) {
    (
        "DELETE".into(),
        format!("/api/v1/namespaces/slurm/pods/{name}?"),
    )
}

/// The two Events of a deleted pod `name`: on the GpuNode and on the pod.
fn pod_deleted_events(sent: &[Sent], name: &str, why: &str) {
    let note = format!("pod slurm/{name} deleted ({why}): it is recreated afresh");
    assert_eq!(
        requests(sent),
        [
            ("POST", EVENTS),
            ("POST", "/apis/events.k8s.io/v1/namespaces/slurm/events?")
        ]
    );
    assert_eq!(
        event(&sent[0]),
        ev("Normal", "PodDeleted", &note, ON_GPUNODE)
    );
    let on_pod = format!("Pod/slurm/{name}/uid-{name}");
    assert_eq!(event(&sent[1]), ev("Normal", "PodDeleted", &note, &on_pod));
}

/// Remediation of a drift: the Slurm record first (an Event), then the drifted slurmd pod, with
/// its UID as the precondition (two Events).
#[tokio::test]
async fn a_drift_deletes_the_slurm_record_then_the_slurmd_pod() {
    let cases = [
        (
            (|| Ok(NodeDeleted::Deleted)) as fn() -> _,
            "Slurm node node-a deleted: its slurmd registers afresh",
        ),
        (
            || Ok(NodeDeleted::AlreadyGone),
            "Slurm node node-a was already gone",
        ),
    ];
    for (answer, note) in cases {
        let slurm = fake_slurm(answer);
        let plan = Plan {
            slurm_nodes: vec!["node-a".into()],
            delete_pods: vec![pod_action("slurmd-0", condition::DRIFTED)],
            ..Plan::default()
        };
        let (r, sent, m) = execute_plan(plan, Some(slurm.clone()), ok).await;
        r.unwrap();
        assert_eq!(*slurm.asked.lock().unwrap(), ["node-a"]);
        assert_eq!(sent.len(), 4, "{:?}", requests(&sent));
        assert_eq!(requests(&sent[..1]), [("POST", EVENTS)]);
        assert_eq!(
            event(&sent[0]),
            ev("Normal", "SlurmNodeDeleted", note, ON_GPUNODE)
        );
        assert_eq!(pod_delete(&sent[1], "slurmd-0"), delete("slurmd-0"));
        pod_deleted_events(&sent[2..], "slurmd-0", condition::DRIFTED);
        assert_eq!(remediations(&m, "delete_slurm_node", "ok"), 1);
        assert_eq!(remediations(&m, "delete_pod", "ok"), 1);
    }
}

/// A Slurm record that cannot be deleted keeps the drifted slurmd pods (they would register the
/// old GPUs again) and fails the reconcile, with a Warning.
#[tokio::test]
async fn a_failed_slurm_deletion_keeps_the_slurmd_pods() {
    let slurm = fake_slurm(|| Err(SlurmError::Unauthorized));
    let plan = Plan {
        slurm_nodes: vec!["node-a".into()],
        delete_pods: vec![pod_action("slurmd-0", condition::DRIFTED)],
        ..Plan::default()
    };
    let (r, sent, m) = execute_plan(plan, Some(slurm.clone()), ok).await;
    assert!(
        matches!(&r, Err(WriteError::Slurm { node, source: SlurmError::Unauthorized }) if node == "node-a"),
        "{r:?}"
    );
    assert_eq!(*slurm.asked.lock().unwrap(), ["node-a"]);
    assert_eq!(requests(&sent), [("POST", EVENTS)]);
    let note =
        "deleting Slurm node node-a: slurmrestd rejected the token; its slurmd pods are kept";
    assert_eq!(
        event(&sent[0]),
        ev("Warning", "SlurmNodeDeleteFailed", note, ON_GPUNODE)
    );
    assert_eq!(remediations(&m, "delete_slurm_node", "error"), 1);
    assert_eq!(remediations(&m, "delete_pod", "ok"), 0);
}

/// Without slurmrestd a drift is only reported (its slurmd pods are kept); a pod whose GPU
/// container lacks the injection is deleted all the same.
#[tokio::test]
async fn without_slurmrestd_only_pods_missing_the_injection_are_deleted() {
    let plan = Plan {
        slurm_nodes: vec!["node-a".into()],
        delete_pods: vec![
            pod_action("slurmd-0", condition::DRIFTED),
            pod_action("job", condition::INJECTION_MISSING),
        ],
        ..Plan::default()
    };
    let (r, sent, _) = execute_plan(plan, None, ok).await;
    r.unwrap();
    assert_eq!(sent.len(), 4, "{:?}", requests(&sent));
    let note = "remediation is on but no slurmrestd is configured: the Slurm records and slurmd \
                pods are left as they are";
    assert_eq!(
        event(&sent[0]),
        ev("Warning", "RemediationUnavailable", note, ON_GPUNODE)
    );
    assert_eq!(pod_delete(&sent[1], "job"), delete("job"));
    pod_deleted_events(&sent[2..], "job", condition::INJECTION_MISSING);
}

/// A pod already gone (404), or replaced under its name by a pod of another UID (409: the
/// precondition failed), needs no deletion: the action counts as done.
#[tokio::test]
async fn a_pod_gone_or_replaced_counts_as_deleted() {
    for (code, reason) in [(404, "NotFound"), (409, "Conflict")] {
        let plan = Plan {
            delete_pods: vec![pod_action("job", condition::INJECTION_MISSING)],
            ..Plan::default()
        };
        let (r, sent, m) = execute_plan(plan, None, failing("DELETE", code, reason)).await;
        assert!(r.is_ok(), "{code}: {r:?}");
        assert_eq!(pod_delete(&sent[0], "job"), delete("job"));
        pod_deleted_events(&sent[1..], "job", condition::INJECTION_MISSING);
        assert_eq!(remediations(&m, "delete_pod", "ok"), 1, "{code}");
    }
}

/// Any other error deleting a pod fails the reconcile (retried), with no Event.
#[tokio::test]
async fn a_failed_pod_deletion_fails_the_reconcile() {
    let plan = Plan {
        delete_pods: vec![
            pod_action("job", condition::INJECTION_MISSING),
            pod_action("next", condition::INJECTION_MISSING),
        ],
        ..Plan::default()
    };
    let (r, sent, m) = execute_plan(plan, None, failing("DELETE", 500, "InternalError")).await;
    assert!(
        matches!(&r, Err(WriteError::Kube { what, source: kube::Error::Api(s) })
            if what == "deleting pod slurm/job (InjectionMissing)" && s.code == 500),
        "{r:?}"
    );
    assert_eq!(sent.len(), 1, "{:?}", requests(&sent));
    assert_eq!(pod_delete(&sent[0], "job"), delete("job"));
    assert_eq!(remediations(&m, "delete_pod", "error"), 1);
}

/// A failed label apply fails the reconcile before anything else is written.
#[tokio::test]
async fn a_failed_label_apply_stops_the_reconcile() {
    let plan = Plan {
        labels: Some(labels(&[(PROFILE, "gb300")])),
        conditions: Some(Vec::new()),
        delete_pods: vec![pod_action("job", condition::INJECTION_MISSING)],
        ..Plan::default()
    };
    let (r, sent, m) = execute_plan(plan, None, |_: &Sent| status(403, "Forbidden")).await;
    assert!(
        matches!(&r, Err(WriteError::Kube { what, source: kube::Error::Api(s) })
            if what == "applying labels to node node-a" && s.code == 403),
        "{r:?}"
    );
    assert_eq!(requests(&sent), [("PATCH", NODE_APPLY)]);
    assert_eq!(writes(&m, "node_labels"), 0);
}

/// A failed condition apply (here a conflict) fails the reconcile before its Events.
#[tokio::test]
async fn a_failed_condition_apply_fails_the_reconcile() {
    let plan = Plan {
        conditions: Some(Vec::new()),
        notices: vec![plan::Notice {
            reason: "HeartbeatLost",
            note: "no heartbeat".into(),
        }],
        ..Plan::default()
    };
    let (r, sent, _) = execute_plan(plan, None, |_: &Sent| status(409, "Conflict")).await;
    assert!(
        matches!(&r, Err(WriteError::Kube { what, .. })
            if what == "applying conditions to GpuNode node-a"),
        "{r:?}"
    );
    assert_eq!(requests(&sent), [("PATCH", STATUS_APPLY)]);
}

/// An Event that cannot be recorded is not a failure: the writes after it go on.
#[tokio::test]
async fn a_failed_event_does_not_stop_the_writes() {
    let plan = Plan {
        labels: Some(labels(&[(PROFILE, "gb300")])),
        conditions: Some(Vec::new()),
        ..Plan::default()
    };
    let (r, sent, m) = execute_plan(plan, None, failing("POST", 500, "InternalError")).await;
    r.unwrap();
    assert_eq!(
        requests(&sent),
        [
            ("PATCH", NODE_APPLY),
            ("POST", EVENTS),
            ("PATCH", STATUS_APPLY)
        ]
    );
    assert_eq!(writes(&m, "event"), 0);
}

/// A plan of nothing (a requeue at most) writes nothing.
#[tokio::test]
async fn nothing_planned_writes_nothing() {
    let plan = Plan {
        requeue_after: Some(Duration::from_secs(30)),
        ..Plan::default()
    };
    let (r, sent, _) = execute_plan(plan, Some(fake_slurm(|| Ok(NodeDeleted::Deleted))), ok).await;
    r.unwrap();
    assert_eq!(requests(&sent), []);
}

pub(crate) const NODE_STATUS: &str = "/api/v1/nodes/node-a/status?&fieldManager=mockgpu-controller";
pub(crate) const STRATEGIC: &str = "application/strategic-merge-patch+json";
const ON_NODE: &str = "Node//node-a/nu";
const FAULT: &str = "GPU 1 (GPU-1): Xid 79 (GPU has fallen off the bus.)";

fn gpu_problem(status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: "GPUProblem".into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Time(Timestamp::from_second(1_800_000_000).unwrap()),
        observed_generation: None,
    }
}

/// The GPU-fault condition is set on the Node's status by a strategic merge patch of that one
/// entry of `status.conditions` (merge key `type`): nothing else of the status is in it, no
/// directive replaces the list, so the kubelet's conditions stay; then the Events, on the
/// GpuNode and on the Node.
#[tokio::test]
async fn the_node_condition_is_one_merged_entry_of_the_node_status() {
    let plan = Plan {
        node_condition: Some(gpu_problem("True", "XidError", FAULT)),
        fault_event: Some(plan::FaultEvent {
            warning: true,
            reason: "GpuFault",
            note: FAULT.into(),
        }),
        ..Plan::default()
    };
    let (r, sent, m) = execute_plan(plan, None, ok).await;
    r.unwrap();
    assert_eq!(
        requests(&sent),
        [("PATCH", NODE_STATUS), ("POST", EVENTS), ("POST", EVENTS)]
    );
    assert_eq!(sent[0].content_type, STRATEGIC);
    let mut body = sent[0].body.clone();
    let entry = &mut body["status"]["conditions"][0];
    assert!(
        entry["lastHeartbeatTime"].is_string(),
        "a heartbeat time: {entry}"
    );
    entry.as_object_mut().unwrap().remove("lastHeartbeatTime");
    assert_eq!(
        body,
        json!({"status": {"conditions": [{
            "type": "GPUProblem",
            "status": "True",
            "reason": "XidError",
            "message": FAULT,
            "lastTransitionTime": "2027-01-15T08:00:00Z",
        }]}})
    );
    assert_eq!(
        event(&sent[1]),
        ev("Warning", "GpuFault", FAULT, ON_GPUNODE)
    );
    assert_eq!(event(&sent[2]), ev("Warning", "GpuFault", FAULT, ON_NODE));
    assert_eq!(writes(&m, "node_condition"), 1);
}

/// The patch keeps the kubelet's conditions under strategic merge's rules for a list with a
/// merge key: entries of other types are kept, ours is replaced by type. (The merge below is
/// those rules for this list, as the API server applies them; the patch must hold no
/// `$patch`/`$retainKeys` directive, which would change them.)
#[test]
fn the_patch_merged_into_a_kubelet_status_keeps_its_conditions() {
    let patch = node_condition_patch(
        &gpu_problem("False", "NoGpuFault", "no GPU faults"),
        Timestamp::from_second(1_800_000_100).unwrap(),
    );
    let text = patch.to_string();
    assert!(
        !text.contains("$patch") && !text.contains("$retainKeys"),
        "{text}"
    );
    let live = json!([
        {"type": "MemoryPressure", "status": "False"},
        {"type": "Ready", "status": "True", "reason": "KubeletReady"},
        {"type": "GPUProblem", "status": "True", "reason": "XidError"},
    ]);
    let mut merged = live.as_array().unwrap().clone();
    for entry in patch["status"]["conditions"].as_array().unwrap() {
        match merged.iter_mut().find(|c| c["type"] == entry["type"]) {
            Some(c) => {
                for (k, v) in entry.as_object().unwrap() {
                    c[k] = v.clone();
                }
            }
            None => merged.push(entry.clone()),
        }
    }
    let brief: Vec<String> = merged
        .iter()
        .map(|c| format!("{}={}", c["type"], c["status"]).replace('"', ""))
        .collect();
    assert_eq!(
        brief,
        ["MemoryPressure=False", "Ready=True", "GPUProblem=False"]
    );
    assert_eq!(patch["status"].as_object().unwrap().len(), 1, "{patch}");
}

/// A failed Node condition write fails the reconcile before the GpuNode's conditions (which
/// tell what was set) are applied: it is tried again.
#[tokio::test]
async fn a_failed_node_condition_is_tried_again() {
    let plan = Plan {
        node_condition: Some(gpu_problem("True", "XidError", FAULT)),
        conditions: Some(vec![gpu_problem("True", "XidError", FAULT)]),
        ..Plan::default()
    };
    let (r, sent, _) = execute_plan(plan, None, failing("PATCH", 500, "InternalError")).await;
    assert!(
        matches!(&r, Err(WriteError::Kube { what, .. }) if what == "setting condition GPUProblem of node node-a"),
        "{r:?}"
    );
    assert_eq!(requests(&sent), [("PATCH", NODE_STATUS)]);
}

/// A drain: Slurm is asked with our reason, an Event tells it; a node drained already or by
/// someone else is left alone without an Event; no slurmrestd, no drain and no error.
#[tokio::test]
async fn a_drain_asks_slurm_and_tells_it() {
    let reason = format!("mockgpu: {FAULT}");
    let plan = Plan {
        slurm_drain: Some(plan::SlurmDrain {
            nodes: vec!["node-a".into(), "gpu-a".into()],
            reason: reason.clone(),
        }),
        ..Plan::default()
    };
    let slurm = fake_slurm_states(|| Ok(Drain::Drained), || Ok(Resume::Resumed));
    let (r, sent, m) = execute_plan(plan.clone(), Some(slurm.clone()), ok).await;
    r.unwrap();
    assert_eq!(
        *slurm.asked.lock().unwrap(),
        [
            format!("drain node-a {reason}"),
            format!("drain gpu-a {reason}")
        ]
    );
    // the second drain's Event joins the first's series (the recorder patches it)
    assert_eq!(sent.len(), 2, "{:?}", requests(&sent));
    assert_eq!(requests(&sent[..1]), [("POST", EVENTS)]);
    let note = format!("Slurm node node-a drained: {reason}");
    assert_eq!(
        event(&sent[0]),
        ev("Normal", "SlurmNodeDrained", &note, ON_GPUNODE)
    );
    assert_eq!(remediations(&m, "drain_slurm_node", "ok"), 2);
    for drain in [
        (|| Ok(Drain::AlreadyDrained)) as fn() -> _,
        || Ok(Drain::Foreign("admin: bad DIMM".into())),
        || Ok(Drain::NoSuchNode),
    ] {
        let slurm = fake_slurm_states(drain, || Ok(Resume::Resumed));
        let (r, sent, _) = execute_plan(plan.clone(), Some(slurm.clone()), ok).await;
        r.unwrap();
        assert_eq!(slurm.asked.lock().unwrap().len(), 2);
        assert_eq!(requests(&sent), [], "no Event");
    }
    let (r, sent, _) = execute_plan(plan.clone(), None, ok).await;
    r.unwrap();
    assert_eq!(requests(&sent), []);
    // a failure: a Warning, the reconcile fails (and is tried again)
    let slurm = fake_slurm_states(|| Err(SlurmError::Unauthorized), || Ok(Resume::Resumed));
    let (r, sent, m) = execute_plan(plan, Some(slurm.clone()), ok).await;
    assert!(
        matches!(&r, Err(WriteError::SlurmState { what: "draining", node, .. }) if node == "node-a"),
        "{r:?}"
    );
    assert_eq!(
        event(&sent[0]),
        ev(
            "Warning",
            "SlurmNodeDrainFailed",
            "draining Slurm node node-a: slurmrestd rejected the token",
            ON_GPUNODE
        )
    );
    assert_eq!(remediations(&m, "drain_slurm_node", "error"), 1);
}

/// A resume goes before the GpuNode's conditions: one that fails leaves them unapplied (the
/// faults' clearing is seen, and the resume tried, again). A drain of someone else's is left,
/// with an Event saying so.
#[tokio::test]
async fn a_resume_goes_first_and_spares_foreign_drains() {
    let plan = Plan {
        node_condition: Some(gpu_problem("False", "NoGpuFault", "no GPU faults")),
        slurm_resume: vec!["node-a".into()],
        conditions: Some(vec![gpu_problem("False", "NoGpuFault", "no GPU faults")]),
        ..Plan::default()
    };
    let slurm = fake_slurm_states(|| Ok(Drain::Drained), || Ok(Resume::Resumed));
    let (r, sent, m) = execute_plan(plan.clone(), Some(slurm.clone()), ok).await;
    r.unwrap();
    assert_eq!(*slurm.asked.lock().unwrap(), ["resume node-a"]);
    assert_eq!(
        requests(&sent),
        [
            ("PATCH", NODE_STATUS),
            ("POST", EVENTS),
            ("PATCH", STATUS_APPLY)
        ]
    );
    assert_eq!(
        event(&sent[1]),
        ev(
            "Normal",
            "SlurmNodeResumed",
            "Slurm node node-a resumed: its GPU faults cleared",
            ON_GPUNODE
        )
    );
    assert_eq!(remediations(&m, "resume_slurm_node", "ok"), 1);

    let slurm = fake_slurm_states(
        || Ok(Drain::Drained),
        || Ok(Resume::NotOurs("admin: bad DIMM".into())),
    );
    let (r, sent, _) = execute_plan(plan.clone(), Some(slurm), ok).await;
    r.unwrap();
    let note = "Slurm node node-a is left drained: its reason is not mockgpu's (admin: bad DIMM)";
    assert_eq!(
        event(&sent[1]),
        ev("Normal", "SlurmNodeLeftDrained", note, ON_GPUNODE)
    );

    let slurm = fake_slurm_states(|| Ok(Drain::Drained), || Err(SlurmError::Timeout));
    let (r, sent, _) = execute_plan(plan, Some(slurm), ok).await;
    assert!(
        matches!(
            &r,
            Err(WriteError::SlurmState {
                what: "resuming",
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(
        requests(&sent),
        [("PATCH", NODE_STATUS), ("POST", EVENTS)],
        "the GpuNode's conditions are not applied"
    );
}
