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

/// Slurm's node records, as a fake: the names asked to delete, and the answer to each.
pub(crate) struct FakeSlurm {
    answer: fn() -> Result<NodeDeleted, SlurmError>,
    asked: Mutex<Vec<String>>,
}

impl SlurmNodes for FakeSlurm {
    async fn delete_node(&self, name: &str) -> Result<NodeDeleted, SlurmError> {
        self.asked.lock().unwrap().push(name.to_string());
        (self.answer)()
    }
}

pub(crate) fn fake_slurm(answer: fn() -> Result<NodeDeleted, SlurmError>) -> Arc<FakeSlurm> {
    Arc::new(FakeSlurm {
        answer,
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
    let result = w.execute(&slim(&gpunode()), &plan).await;
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
