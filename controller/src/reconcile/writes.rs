//! The sweep's and a reconcile's writes against a mocked API server (see `write`'s tests).

use std::collections::BTreeMap;
use std::time::Duration;

use mockgpu_api::gpunode::condition::GPU_PROBLEM;
use mockgpu_api::gpunode::{AGENT_MANAGER, CONTROLLER_MANAGER};
use serde_json::{Value, json};

use super::*;
use crate::labels::tests::{node_json, node_value};
use crate::labels::{GPU_COUNT, PROFILE};
use crate::mock_api::{Sent, api_server, api_server_holding, requests, status};
use crate::slim::tests::slim;
use crate::write::tests::{
    APPLY_PATCH, EVENTS, FakeSlurm, NODE_APPLY, NODE_STATUS, ON_GPUNODE, STATUS_APPLY, ev, event,
    gpunode, labels, node_apply, ok, sent, writer,
};
use crate::write::{WriteError, recorder};

/// A context over `client` without slurmrestd, with empty caches, already synced.
fn context(client: Client) -> Context<FakeSlurm> {
    let writer = writer(client, None);
    Context {
        metrics: Metrics::default(),
        writer,
        settings: Settings {
            remediation: true,
            stale_after: Duration::from_secs(90),
            injection_grace: Duration::from_secs(60),
            gpu_resource: "nvidia.com/gpu".into(),
            drain_slurm: false,
            node_condition_type: GPU_PROBLEM.into(),
        },
        nodes: reflector::store().0,
        pods: PodsByNode::new(reflector::store().0),
        synced: Synced::new(async { true }),
    }
}

/// A store that has listed `object` (if any).
fn listed_store<K>(object: Option<K>) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let (store, mut writer) = reflector::store();
    let list = [watcher::Event::Init]
        .into_iter()
        .chain(object.map(watcher::Event::InitApply))
        .chain([watcher::Event::InitDone]);
    for e in list {
        writer.apply_watcher_event(&e);
    }
    store
}

/// The sweep's context over `client`: Node `node-a` cached, carrying a label of ours, and the
/// GpuNodes listed (`listed`: whether node-a's is among them).
fn sweep_context(client: Client, listed: bool) -> SweepContext<FakeSlurm> {
    let mut ctx = context(client);
    let node = node_json(
        &[
            (CONTROLLER_MANAGER, "Apply", &[PROFILE]),
            (AGENT_MANAGER, "Update", &[]),
        ],
        &[(PROFILE, "gb300")],
    );
    ctx.nodes = listed_store(Some(node));
    let gpunodes = listed_store(listed.then(|| slim(&gpunode())));
    (Arc::new(ctx), gpunodes, Synced::new(async { true }))
}

/// The sweep's writes over a server answering `answer`: the outcome and what was sent.
async fn sweep(
    name: &str,
    listed: bool,
    answer: impl Fn(&Sent) -> (u16, Value) + Send + 'static,
) -> (Result<(), ReconcileError>, Vec<Sent>) {
    let (client, server) = api_server(answer);
    let ctx = sweep_context(client, listed);
    let result = sweep_node(name, &ctx).await;
    drop(ctx.1);
    let ctx = Arc::into_inner(ctx.0).expect("the sweep keeps no context");
    (result, sent(ctx, server).await)
}

/// A Node whose GpuNode is gone loses our labels (an empty apply), with an Event on the Node.
#[tokio::test]
async fn the_sweep_removes_our_labels_from_a_node_without_gpunode() {
    let (r, sent) = sweep("node-a", false, ok).await;
    r.unwrap();
    assert_eq!(requests(&sent), [("PATCH", NODE_APPLY), ("POST", EVENTS)]);
    assert_eq!(sent[0].content_type, APPLY_PATCH);
    assert_eq!(sent[0].body, node_apply(&BTreeMap::new()));
    let note = "the node's mockgpu labels were removed: its GpuNode is gone";
    assert_eq!(
        event(&sent[1]),
        ev("Normal", "LabelsRemoved", note, "Node//node-a/nu")
    );
}

/// The sweep leaves alone a Node whose GpuNode exists, and a Node it does not know.
#[tokio::test]
async fn the_sweep_leaves_nodes_with_a_gpunode_or_unknown() {
    for (name, listed) in [("node-a", true), ("node-b", false)] {
        let (r, sent) = sweep(name, listed, ok).await;
        r.unwrap();
        assert_eq!(requests(&sent), [], "{name}");
    }
}

/// A failed label removal fails the sweep (it is tried again).
#[tokio::test]
async fn a_failed_sweep_is_an_error() {
    let (r, sent) = sweep("node-a", false, |_: &Sent| status(500, "InternalError")).await;
    assert!(
        matches!(&r, Err(ReconcileError::Write(WriteError::Kube { what, .. })) if what == "applying labels to node node-a"),
        "{r:?}"
    );
    assert_eq!(requests(&sent), [("PATCH", NODE_APPLY)]);
}

/// A reconcile from the caches: a new GpuNode on a Node without our labels gets them (with an
/// Event), GPUProblem=False on the Node, and its first conditions, and waits for the next change.
#[tokio::test]
async fn a_reconcile_writes_what_the_plan_of_its_caches_wants() {
    let (client, server) = api_server(ok);
    let mut ctx = context(client);
    let node = node_json(
        &[("kubelet", "Update", &["kubernetes.io/hostname"])],
        &[("kubernetes.io/hostname", "node-a")],
    );
    ctx.nodes = listed_store(Some(node));
    let ctx = Arc::new(ctx);
    let action = reconcile_gpunode(Arc::new(slim(&gpunode())), ctx.clone()).await;
    assert_eq!(action.unwrap(), Action::await_change());
    let ctx = Arc::into_inner(ctx).expect("the reconcile keeps no context");
    let sent = sent(ctx, server).await;
    assert_eq!(
        requests(&sent),
        [
            ("PATCH", NODE_APPLY),
            ("POST", EVENTS),
            ("PATCH", NODE_STATUS),
            ("PATCH", STATUS_APPLY)
        ]
    );
    let want = labels(&[(PROFILE, "gb300"), (GPU_COUNT, "0")]);
    assert_eq!(sent[0].body, node_apply(&want));
    let note = "node labels: mockgpu.io/profile=gb300, nvidia.com/gpu.count=0";
    assert_eq!(
        event(&sent[1]),
        ev("Normal", "LabelsApplied", note, ON_GPUNODE)
    );
    let node_condition = &sent[2].body["status"]["conditions"][0];
    assert_eq!(
        (&node_condition["type"], &node_condition["status"]),
        (&json!(GPU_PROBLEM), &json!("False"))
    );
    let conditions: Vec<_> = sent[3].body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| format!("{}={}", c["type"], c["status"]).replace('"', ""))
        .collect();
    assert_eq!(
        conditions,
        [
            "Stale=Unknown",
            "Drifted=False",
            "InjectionMissing=False",
            "GPUProblem=False"
        ]
    );
}

/// A list of `items` as the API server sends it.
fn list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items})
}

/// The API server as the controllers meet it: the lists of one GpuNode (node-a, new), two Nodes
/// (node-a, unlabelled; node-b, labelled by us and without GpuNode) and no pods; watches that
/// see no change; writes answered as [`ok`] does, and told to `writes` as they come.
fn cluster(
    writes: tokio::sync::mpsc::UnboundedSender<(String, String)>,
) -> impl Fn(&Sent) -> Option<(u16, Value)> {
    move |s| {
        let uri = s.uri.as_str();
        if s.method != "GET" {
            let _ = writes.send((s.method.clone(), uri.to_string()));
            return Some(ok(s));
        }
        if uri.contains("watch=true") {
            return None;
        }
        let items = if uri.starts_with("/apis/mockgpu.io/") {
            vec![serde_json::to_value(gpunode()).unwrap()]
        } else if uri.starts_with("/api/v1/nodes") {
            let node_a = node_value(
                &[("kubelet", "Update", &["kubernetes.io/hostname"])],
                &[("kubernetes.io/hostname", "node-a")],
            );
            let mut node_b = node_value(
                &[(CONTROLLER_MANAGER, "Apply", &[PROFILE])],
                &[(PROFILE, "gb300")],
            );
            node_b["metadata"]["name"] = json!("node-b");
            node_b["metadata"]["uid"] = json!("nb");
            vec![node_a, node_b]
        } else {
            Vec::new()
        };
        Some((200, list(items)))
    }
}

/// The controllers end to end on a mocked API server: once their caches are listed, the new
/// GpuNode's Node is labelled (with an Event), given its GPU-fault condition and its conditions
/// applied, and the sweep removes
/// our labels from the Node whose GpuNode is gone (with an Event on that Node).
#[tokio::test]
async fn the_controllers_label_a_new_node_and_sweep_an_orphaned_one() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (client, server) = api_server_holding(cluster(tx));
    let settings = context(client.clone()).settings;
    let recorder = recorder(client.clone(), "replica-0");
    let run = tokio::spawn(controllers(
        client,
        settings,
        None::<Arc<FakeSlurm>>,
        recorder,
        Metrics::default(),
        crate::slim::label_selector("app.kubernetes.io/name=slurmd").unwrap(),
        true,
    ));
    // the six writes, or what came of them by the deadline
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    for _ in 0..6 {
        if tokio::time::timeout_at(deadline, rx.recv()).await.is_err() {
            break;
        }
    }
    run.abort();
    let _ = run.await;
    let sent = server.sent().await;
    let node_b = "/api/v1/nodes/node-b?&force=true&fieldManager=mockgpu-controller";
    let mut want = vec![
        ("PATCH", NODE_APPLY),
        ("POST", EVENTS),
        ("PATCH", NODE_STATUS),
        ("PATCH", STATUS_APPLY),
        ("PATCH", node_b),
        ("POST", EVENTS),
    ];
    let mut got: Vec<_> = requests(&sent)
        .into_iter()
        .filter(|(m, _)| *m != "GET")
        .collect();
    want.sort_unstable();
    got.sort_unstable();
    assert_eq!(got, want);
    let body = |uri: &str| &sent.iter().find(|s| s.uri == uri).unwrap().body;
    assert_eq!(*body(node_b), {
        let mut b = node_apply(&BTreeMap::new());
        b["metadata"]["name"] = json!("node-b");
        b
    });
    let events: Vec<_> = sent.iter().filter(|s| s.uri == EVENTS).map(event).collect();
    let on_node_b = ev(
        "Normal",
        "LabelsRemoved",
        "the node's mockgpu labels were removed: its GpuNode is gone",
        "Node//node-b/nb",
    );
    assert!(events.contains(&on_node_b), "{events:?}");
}
