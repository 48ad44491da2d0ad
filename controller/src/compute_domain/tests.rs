//! The pure parts (status, template, Events, finalizers, addresses, membership), and the
//! reconcile and the controller against a mocked API server.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::PartialObjectMetaExt;
use mockgpu_api::dra::AllocationMode;
use mockgpu_api::gpunode::Fabric;
use mockgpu_api::{GpuNode, GpuNodeSpec, GpuNodeStatus, Mode, PreparedClaim};
use serde_json::Value;

use super::*;
use crate::metrics::WriteLabels;
use crate::mock_api::{Sent, api_server, api_server_holding, requests, status as answer_status};
use crate::slim::tests::slim;
use crate::write::recorder;
use crate::write::tests::{APPLY_PATCH, ev, event};

const UID: &str = "cd-uid";
const DOMAIN: &str = "/apis/resource.nvidia.com/v1beta1/namespaces/ns/computedomains/cd";
const FINALIZERS: &str = "/apis/resource.nvidia.com/v1beta1/namespaces/ns/computedomains/cd?&fieldManager=mockgpu-controller";
const STATUS_APPLY: &str = "/apis/resource.nvidia.com/v1beta1/namespaces/ns/computedomains/cd/status?&force=true&fieldManager=mockgpu-controller";
const TEMPLATE_APPLY: &str = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaimtemplates/imex?&force=true&fieldManager=mockgpu-controller";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events?";
const NODE_A: &str = "/api/v1/nodes/node-a";
const NODE_B: &str = "/api/v1/nodes/node-b";
const ON_DOMAIN: &str = "ComputeDomain/ns/cd/cd-uid";

/// GpuNode `name` as the controller caches it: claims of `domains`, its agent Ready or not, on
/// fabric clique `clique` (`<cluster>.<clique>`) if any.
fn gpunode(name: &str, domains: &[&str], ready: bool, clique: Option<&str>) -> SlimGpuNode {
    let mut g = GpuNode::new(
        name,
        GpuNodeSpec::new(name, Mode::Mock, "gb300", Vec::new()),
    );
    g.spec.fabric = clique.map(|c| {
        let (cluster, clique) = c.split_once('.').unwrap();
        Fabric {
            cluster_uuid: cluster.into(),
            clique_id: clique.into(),
        }
    });
    let claims = domains.iter().map(|d| PreparedClaim {
        namespace: "ns".into(),
        name: format!("{name}-channel"),
        uid: format!("{name}-claim"),
        driver: CHANNEL_DRIVER.into(),
        devices: vec!["channel-0".into()],
        gpus: Vec::new(),
        domain: Some(d.to_string()),
        channels: Some(1),
    });
    g.status = Some(GpuNodeStatus {
        claims: claims.collect(),
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            reason: "R".into(),
            message: "m".into(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }],
        ..GpuNodeStatus::default()
    });
    slim(&g)
}

fn member(name: &str, ready: bool, clique: Option<&str>) -> Arc<SlimGpuNode> {
    Arc::new(gpunode(name, &[UID], ready, clique))
}

/// ComputeDomain `ns/cd` (UID [`UID`], resource version 7) of `num_nodes` and `mode`, with
/// template `imex`.
fn domain(num_nodes: u32, mode: AllocationMode) -> ComputeDomain {
    serde_json::from_value(json!({
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
        "metadata": {"name": "cd", "namespace": "ns", "uid": UID, "resourceVersion": "7"},
        "spec": {"numNodes": num_nodes,
            "channel": {"resourceClaimTemplate": {"name": "imex"}, "allocationMode": mode}},
    }))
    .unwrap()
}

fn ips(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(n, ip)| (n.to_string(), ip.to_string()))
        .collect()
}

/// Nodes in name order, whatever the order of the members; the addresses given, the clique of
/// the fabric (empty off one), each node's readiness; one node not ready leaves the domain not
/// ready.
#[test]
fn the_status_lists_the_members_in_name_order() {
    let members = [
        member("node-b", true, Some("6f3e.32766")),
        member("node-a", false, None),
    ];
    let s = status(1, &members, &ips(&[("node-a", "10.0.0.1")]));
    assert_eq!(
        serde_json::to_value(&s).unwrap(),
        json!({"status": "NotReady", "nodes": [
            {"name": "node-a", "ipAddress": "10.0.0.1", "cliqueID": "", "index": 0,
                "status": "NotReady"},
            {"name": "node-b", "ipAddress": "", "cliqueID": "6f3e.32766", "index": 1,
                "status": "Ready"},
        ]})
    );
}

/// Ready once at least numNodes nodes are in and all are ready: numNodes 0 with no nodes is
/// Ready, but not with a node that is not; numNodes 2 needs two.
#[test]
fn the_domain_is_ready_with_enough_ready_nodes() {
    let (a, b, c) = (
        member("node-a", true, None),
        member("node-b", true, None),
        member("node-c", false, None),
    );
    let cases: [(u32, Vec<Arc<SlimGpuNode>>, &str); 6] = [
        (0, vec![], READY),
        (0, vec![c.clone()], NOT_READY),
        (2, vec![], NOT_READY),
        (2, vec![a.clone()], NOT_READY),
        (2, vec![a.clone(), b.clone()], READY),
        (2, vec![a, b, c], NOT_READY),
    ];
    for (num_nodes, members, want) in cases {
        let s = status(num_nodes, &members, &HashMap::new());
        assert_eq!(
            s.status,
            want,
            "numNodes {num_nodes}, {} nodes",
            members.len()
        );
    }
}

/// The template NVIDIA's controller makes, exactly, for both allocation modes.
#[test]
fn the_template_is_nvidias() {
    for (mode, name) in [
        (AllocationMode::Single, "Single"),
        (AllocationMode::All, "All"),
    ] {
        let cd = domain(2, mode);
        let t = template(&cd, cd.controller_owner_ref(&()).unwrap());
        assert_eq!(
            serde_json::to_value(&t).unwrap(),
            json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {
                    "name": "imex", "namespace": "ns",
                    "labels": {
                        "resource.nvidia.com/computeDomain": UID,
                        "resource.nvidia.com/computeDomainTarget": "Workload",
                    },
                    "ownerReferences": [{"apiVersion": "resource.nvidia.com/v1beta1",
                        "kind": "ComputeDomain", "name": "cd", "uid": UID, "controller": true}],
                },
                "spec": {"spec": {"devices": {
                    "requests": [{"name": "channel",
                        "exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"}}],
                    "config": [{"requests": ["channel"], "opaque": {
                        "driver": "compute-domain.nvidia.com",
                        "parameters": {"apiVersion": "resource.nvidia.com/v1beta1",
                            "kind": "ComputeDomainChannelConfig", "domainID": UID,
                            "allocationMode": name},
                    }}],
                }}},
            }),
            "{name}"
        );
    }
}

/// An Event only when the readiness changes; no status yet counts as not ready.
#[test]
fn readiness_changes_are_events() {
    let ready = status(0, &[], &HashMap::new());
    let not_ready = status(2, &[member("node-a", true, None)], &HashMap::new());
    assert_eq!(transition(None, &not_ready, 2), None);
    assert_eq!(transition(Some(&ready), &ready, 0), None);
    assert_eq!(
        transition(None, &ready, 0),
        Some((
            EventType::Normal,
            "ComputeDomainReady",
            "0 of 0 nodes ready, 0 needed".into()
        ))
    );
    assert_eq!(
        transition(Some(&ready), &not_ready, 2),
        Some((
            EventType::Warning,
            "ComputeDomainNotReady",
            "1 of 1 nodes ready, 2 needed".into()
        ))
    );
}

/// Ours is added after the others, and removed leaving them.
#[test]
fn our_finalizer_leaves_the_others() {
    let mut cd = domain(0, AllocationMode::Single);
    assert_eq!(finalizers(&cd, true), [FINALIZER]);
    cd.metadata.finalizers = Some(vec!["other".into(), FINALIZER.into()]);
    assert_eq!(finalizers(&cd, false), ["other"]);
    assert_eq!(finalizers(&cd, true), ["other", FINALIZER]);
}

/// A Node's InternalIP, not another address; none: empty.
#[test]
fn a_node_is_at_its_internal_ip() {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "node-a"},
        "status": {"addresses": [
            {"type": "Hostname", "address": "node-a"},
            {"type": "ExternalIP", "address": "203.0.113.1"},
            {"type": "InternalIP", "address": "10.0.0.1"},
        ]},
    }))
    .unwrap();
    assert_eq!(internal_ip(&node), "10.0.0.1");
    assert_eq!(internal_ip(&Node::default()), "");
}

/// A store of `gpunodes`, and its writer for later events.
fn gpunode_store(
    gpunodes: &[SlimGpuNode],
) -> (Store<SlimGpuNode>, reflector::store::Writer<SlimGpuNode>) {
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for g in gpunodes {
        writer.apply_watcher_event(&watcher::Event::InitApply(g.clone()));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    (store, writer)
}

/// What `rx` holds now.
fn drained(rx: &mut mpsc::UnboundedReceiver<String>) -> Vec<String> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

/// Membership follows the GpuNode watch: a list tells every domain; a node's change tells the
/// domains it was and is in; a deletion those it was in; `of` finds a domain's nodes by name.
#[test]
fn membership_follows_the_gpunodes() {
    let a = gpunode("node-a", &["d1", "d2"], true, None);
    let b = gpunode("node-b", &["d1"], true, None);
    let c = gpunode("node-c", &[], true, None);
    let (store, mut writer) = gpunode_store(&[b.clone(), a.clone(), c.clone()]);
    let (members, mut rx) = Members::new(store);
    let names =
        |uid: &str| -> Vec<String> { members.of(uid).iter().map(|g| g.name_any()).collect() };
    members.apply(&watcher::Event::InitDone);
    assert_eq!(drained(&mut rx), ["d1", "d2"]);
    assert_eq!(names("d1"), ["node-a", "node-b"]);
    assert_eq!(names("d2"), ["node-a"]);
    assert_eq!(names("d3"), Vec::<String>::new());
    // node-a leaves d2 for d3
    let moved = gpunode("node-a", &["d1", "d3"], false, None);
    let e = watcher::Event::Apply(moved);
    writer.apply_watcher_event(&e);
    members.apply(&e);
    assert_eq!(drained(&mut rx), ["d1", "d2", "d3"]);
    assert_eq!(names("d2"), Vec::<String>::new());
    assert_eq!(names("d3"), ["node-a"]);
    // a node in no domain tells none
    let e = watcher::Event::Apply(c);
    members.apply(&e);
    assert_eq!(drained(&mut rx), Vec::<String>::new());
    let e = watcher::Event::Delete(b);
    writer.apply_watcher_event(&e);
    members.apply(&e);
    assert_eq!(drained(&mut rx), ["d1"]);
    assert_eq!(names("d1"), ["node-a"]);
}

/// The mocked API server's answer: the ComputeDomain to its patches, the template to its apply,
/// Node node-a at 10.0.0.1 and no node-b, the Event created.
fn ok(s: &Sent) -> (u16, Value) {
    let uri = s.uri.as_str();
    match &*s.method {
        "PATCH" if uri.starts_with(DOMAIN) => (
            200,
            serde_json::to_value(domain(2, AllocationMode::Single)).unwrap(),
        ),
        "PATCH" if uri.starts_with(TEMPLATE_APPLY) => (200, s.body.clone()),
        "GET" if uri == NODE_A => (
            200,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
                "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}}),
        ),
        "POST" if uri == EVENTS => (201, s.body.clone()),
        _ => answer_status(404, "NotFound"),
    }
}

/// The reconciles' context over `client`: `gpunodes` cached, the template `imex` of [`UID`]
/// cached if `template`.
fn context(client: Client, gpunodes: &[SlimGpuNode], template: bool) -> Arc<Domains> {
    let (store, _) = gpunode_store(gpunodes);
    let (members, _) = Members::new(store);
    members.apply(&watcher::Event::InitDone);
    let (templates, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    if template {
        let meta = ObjectMeta {
            name: Some("imex".into()),
            namespace: Some("ns".into()),
            labels: Some(BTreeMap::from([(
                DOMAIN_LABEL.to_string(),
                UID.to_string(),
            )])),
            ..ObjectMeta::default()
        };
        let t = meta.into_response_partial::<ResourceClaimTemplate>();
        writer.apply_watcher_event(&watcher::Event::InitApply(t));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let metrics = Metrics::default();
    Arc::new(Domains {
        events: Events::new(recorder(client.clone(), "replica-0"), metrics.clone()),
        client,
        metrics,
        members,
        templates,
        synced: Synced::new(async { true }),
    })
}

/// Reconciles `cd` against [`ok`] with `gpunodes` cached (and the template if `template`): the
/// action, what was sent, and the writes counted of each kind.
async fn reconciled(
    cd: ComputeDomain,
    gpunodes: &[SlimGpuNode],
    template: bool,
) -> (Action, Vec<Sent>, [u64; 3]) {
    let (client, server) = api_server(ok);
    let ctx = context(client, gpunodes, template);
    let action = reconcile(Arc::new(cd), ctx.clone()).await.unwrap();
    let writes = [
        "compute_domain_finalizer",
        "resource_claim_template",
        "compute_domain_status",
    ]
    .map(|kind| {
        ctx.metrics
            .writes
            .get_or_create(&WriteLabels { kind })
            .get()
    });
    drop(ctx);
    (action, server.sent().await, writes)
}

/// node-a (not ready, no fabric) and node-b (ready, on a fabric) in the domain, node-c in
/// another.
fn three_nodes() -> [SlimGpuNode; 3] {
    [
        gpunode("node-b", &[UID], true, Some("6f3e.32766")),
        gpunode("node-a", &[UID], false, None),
        gpunode("node-c", &["other"], true, None),
    ]
}

/// A new domain gets our finalizer (on its resource version), its template (applied), and its
/// status, the members' addresses read from their Nodes; not ready, it has no Event.
#[tokio::test]
async fn a_new_domain_gets_its_finalizer_template_and_status() {
    let cd = domain(2, AllocationMode::All);
    let want_template = serde_json::to_value(template(&cd, cd.controller_owner_ref(&()).unwrap()));
    let (action, sent, writes) = reconciled(cd, &three_nodes(), false).await;
    assert_eq!(action, Action::await_change());
    assert_eq!(
        requests(&sent),
        [
            ("PATCH", FINALIZERS),
            ("PATCH", TEMPLATE_APPLY),
            ("GET", NODE_A),
            ("GET", NODE_B),
            ("PATCH", STATUS_APPLY),
        ]
    );
    assert_eq!(sent[0].content_type, "application/merge-patch+json");
    assert_eq!(
        sent[0].body,
        json!({"metadata": {"resourceVersion": "7", "finalizers": [FINALIZER]}})
    );
    assert_eq!(
        (&*sent[1].content_type, &*sent[4].content_type),
        (APPLY_PATCH, APPLY_PATCH)
    );
    assert_eq!(sent[1].body, want_template.unwrap());
    assert_eq!(
        sent[1].body["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["allocationMode"],
        "All"
    );
    assert_eq!(
        sent[4].body,
        json!({
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
            "metadata": {"name": "cd", "namespace": "ns"},
            "status": {"status": "NotReady", "nodes": [
                {"name": "node-a", "ipAddress": "10.0.0.1", "cliqueID": "", "index": 0,
                    "status": "NotReady"},
                {"name": "node-b", "ipAddress": "", "cliqueID": "6f3e.32766", "index": 1,
                    "status": "Ready"},
            ]},
        })
    );
    assert_eq!(writes, [1, 1, 1]);
}

/// A domain as the controller left it (finalizer, template, status with the addresses) is
/// written nothing, and no Node is read.
#[tokio::test]
async fn a_domain_in_place_is_left_alone() {
    let nodes = three_nodes();
    let mut cd = domain(2, AllocationMode::Single);
    cd.metadata.finalizers = Some(vec![FINALIZER.into()]);
    let members: Vec<_> = nodes[..2].iter().cloned().map(Arc::new).collect();
    let ips = ips(&[("node-a", "10.0.0.1"), ("node-b", "10.0.0.2")]);
    cd.status = Some(status(2, &members, &ips));
    let (action, sent, writes) = reconciled(cd, &nodes, true).await;
    assert_eq!(action, Action::await_change());
    assert_eq!(requests(&sent), []);
    assert_eq!(writes, [0, 0, 0]);
}

/// A domain whose last node becomes ready: its status, with the Event of its readiness; the
/// address it lists is kept, not read again.
#[tokio::test]
async fn a_domain_that_becomes_ready_says_so() {
    let mut nodes = three_nodes();
    let mut cd = domain(2, AllocationMode::Single);
    cd.metadata.finalizers = Some(vec![FINALIZER.into()]);
    let members: Vec<_> = nodes[..2].iter().cloned().map(Arc::new).collect();
    cd.status = Some(status(2, &members, &ips(&[("node-a", "10.0.0.9")])));
    nodes[1] = gpunode("node-a", &[UID], true, None);
    let (_, sent, writes) = reconciled(cd, &nodes, true).await;
    assert_eq!(
        requests(&sent),
        [("GET", NODE_B), ("PATCH", STATUS_APPLY), ("POST", EVENTS)]
    );
    let s = &sent[1].body["status"];
    assert_eq!(
        (&s["status"], &s["nodes"][0]["ipAddress"]),
        (&json!("Ready"), &json!("10.0.0.9"))
    );
    assert_eq!(
        event(&sent[2]),
        ev(
            "Normal",
            "ComputeDomainReady",
            "2 of 2 nodes ready, 2 needed",
            ON_DOMAIN
        )
    );
    assert_eq!(writes, [0, 0, 1]);
}

fn deleted(finalizers: &[&str]) -> ComputeDomain {
    let mut cd = domain(2, AllocationMode::Single);
    cd.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
    cd.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    cd
}

/// A deleted domain keeps our finalizer while nodes hold its channels, says which, and looks
/// again in 5 s; without them, our finalizer goes (the others stay).
#[tokio::test]
async fn a_deleted_domain_waits_for_its_channels() {
    let (action, sent, writes) = reconciled(deleted(&[FINALIZER]), &three_nodes(), true).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(5)));
    assert_eq!(requests(&sent), [("POST", EVENTS)]);
    let note =
        "nodes node-a, node-b still hold its channels: it goes once their claims are released";
    assert_eq!(
        event(&sent[0]),
        ev("Normal", "WaitingForChannels", note, ON_DOMAIN)
    );
    assert_eq!(writes, [0, 0, 0]);

    let elsewhere = [gpunode("node-c", &["other"], true, None)];
    let (action, sent, writes) = reconciled(deleted(&["other", FINALIZER]), &elsewhere, true).await;
    assert_eq!(action, Action::await_change());
    assert_eq!(requests(&sent), [("PATCH", FINALIZERS)]);
    assert_eq!(
        sent[0].body,
        json!({"metadata": {"resourceVersion": "7", "finalizers": ["other"]}})
    );
    assert_eq!(writes, [1, 0, 0]);

    // someone else's finalizer only: nothing to do
    let (action, sent, _) = reconciled(deleted(&["other"]), &elsewhere, true).await;
    assert_eq!((action, requests(&sent)), (Action::await_change(), vec![]));
}

/// A failed write fails the reconcile (it is tried again).
#[tokio::test]
async fn a_failed_write_is_an_error() {
    let (client, server) = api_server(|_: &Sent| answer_status(500, "InternalError"));
    let ctx = context(client, &three_nodes(), true);
    let r = reconcile(Arc::new(domain(2, AllocationMode::Single)), ctx).await;
    assert!(
        matches!(&r, Err(ReconcileError::Write(WriteError::Kube { what, .. }))
            if what == "setting the finalizers of ComputeDomain ns/cd"),
        "{r:?}"
    );
    assert_eq!(requests(&server.sent().await), [("PATCH", FINALIZERS)]);
}

/// The CRD or `resource.k8s.io/v1` not served (404), or not to be listed (403): off, after one
/// look each; served, or an answer that tells nothing (500): on.
#[tokio::test]
async fn the_controller_is_off_where_the_cluster_lacks_compute_domains() {
    const CRD: &str = "/apis/resource.nvidia.com/v1beta1/computedomains?&limit=1";
    const V1: &str = "/apis/resource.k8s.io/v1/resourceclaimtemplates?&limit=1";
    let empty = json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": []});
    for (crd, v1, want, asked) in [
        (404, 200, false, &[CRD][..]),
        (403, 200, false, &[CRD][..]),
        (200, 404, false, &[CRD, V1][..]),
        (200, 200, true, &[CRD, V1][..]),
        (500, 200, true, &[CRD, V1][..]),
    ] {
        let empty = empty.clone();
        let (client, server) = api_server(move |s: &Sent| {
            let code = if s.uri.starts_with("/apis/resource.nvidia.com/") {
                crd
            } else {
                v1
            };
            match code {
                200 => (200, empty.clone()),
                code => answer_status(code, "Answer"),
            }
        });
        assert_eq!(served(&client).await, want, "{crd} {v1}");
        drop(client);
        let sent = server.sent().await;
        let uris: Vec<&str> = sent.iter().map(|s| s.uri.as_str()).collect();
        assert_eq!(uris, asked, "{crd} {v1}");
    }
}

/// The controller end to end on a mocked API server: the listed domain is reconciled once the
/// caches are (its finalizer, template, Node read, status), and again when a member changes.
#[tokio::test]
async fn the_controller_reconciles_listed_domains_and_member_changes() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (client, server) = api_server_holding(move |s: &Sent| {
        let uri = s.uri.as_str();
        if uri.contains("watch=true") {
            return None;
        }
        if s.method == "GET" && uri.starts_with("/apis/") {
            let items = if uri.starts_with("/apis/resource.nvidia.com/") {
                vec![serde_json::to_value(domain(1, AllocationMode::Single)).unwrap()]
            } else {
                Vec::new()
            };
            let list = json!({"apiVersion": "v1", "kind": "List",
                "metadata": {"resourceVersion": "1"}, "items": items});
            return Some((200, list));
        }
        let _ = tx.send((s.method.clone(), s.uri.clone()));
        Some(ok(s))
    });
    let (store, mut writer) = gpunode_store(&[gpunode("node-a", &[UID], false, None)]);
    let (members, changed) = Members::new(store);
    members.apply(&watcher::Event::InitDone);
    let metrics = Metrics::default();
    let events = Events::new(recorder(client.clone(), "replica-0"), metrics.clone());
    let run = tokio::spawn(run(
        client,
        events,
        metrics,
        members.clone(),
        changed,
        Synced::new(async { true }),
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut writes = Vec::new();
    let mut next = async || {
        let w = tokio::time::timeout_at(deadline, rx.recv()).await;
        w.ok().flatten().map(|(m, u)| format!("{m} {u}"))
    };
    for _ in 0..4 {
        writes.extend(next().await);
    }
    // node-a's agent becomes ready
    let e = watcher::Event::Apply(gpunode("node-a", &[UID], true, None));
    writer.apply_watcher_event(&e);
    members.apply(&e);
    while let Some(w) = next().await {
        let status = w.starts_with("PATCH") && w.contains("/status?");
        writes.push(w);
        if status {
            break;
        }
    }
    run.abort();
    let _ = run.await;
    let sent = server.sent().await;
    let first = [
        format!("PATCH {FINALIZERS}"),
        format!("PATCH {TEMPLATE_APPLY}"),
        format!("GET {NODE_A}"),
        format!("PATCH {STATUS_APPLY}"),
    ];
    assert_eq!(writes[..4], first);
    // the cache never saw its own writes (the watch holds), so the second reconcile writes
    // again: what matters is that it came, with node-a ready
    assert_eq!(writes.last(), Some(&format!("PATCH {STATUS_APPLY}")));
    let status = sent.iter().rev().find(|s| s.uri == STATUS_APPLY).unwrap();
    assert_eq!(status.body["status"]["status"], "Ready");
}
