//! The controller's scenarios (cluster mode): two replicas as host processes in the node's
//! network namespace, with a service account's token and the least privilege the chart grants;
//! a fake Node of our own (`mgtb-gpu1`, no kubelet) with a GpuNode whose heartbeats the steps
//! write as an agent would (the agent's GpuNode of node0 is the agent's business).
//!
//! What a step leaves for the next: `controller.kubeconfig` and `controller.leader` in the
//! state directory, the replicas (kinds `controller-ctl-a`, `controller-ctl-b` in the PID list,
//! logs `controller-<identity>.log`), the Node and its GpuNode.

use std::fs::OpenOptions;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use mockgpu_api::{GpuNode, GpuNodeGpu, GpuNodeSpec, Mode};
use nix::sys::signal::Signal;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::bed::{Bed, wait_for};
use crate::cluster::{
    GPU_NS, NODE, TB_MANAGER, account_token, apply_crd, chart_rbac, client, label,
    token_kubeconfig, wait_object,
};

/// The controller's namespace (its service account, the lease).
const CTL_NS: &str = "mockgpu-system";
/// The controller's service account, as a user.
const CTL_SA: &str = "system:serviceaccount:mockgpu-system:mockgpu-controller";
/// A Node object without a kubelet, ours to label.
const CTL_NODE: &str = "mgtb-gpu1";
/// MOCKGPU_STALE_AFTER of the replicas (s).
const CTL_STALE: u64 = 20;
/// The lease's duration (the controller's default, s).
const CTL_LEASE_S: u64 = 15;
/// The lease the replicas elect their leader with.
const LEASE: &str = "mockgpu-controller";
/// The labels the controller sets (and removes).
const GPU_LABELS: [&str; 4] = [
    "nvidia.com/gpu.present",
    "nvidia.com/gpu.count",
    "nvidia.com/gpu.product",
    "feature.node.kubernetes.io/pci-10de.present",
];

fn env(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("${name} is not set (testbed.sh's rust_scenario)"))
}

fn ms(t: Instant) -> u128 {
    t.elapsed().as_millis()
}

/// The other replica.
fn ctl_other(id: &str) -> &'static str {
    if id == "ctl-a" { "ctl-b" } else { "ctl-a" }
}

/// A replica's HTTP port (/readyz, /metrics).
fn ctl_port(id: &str) -> u16 {
    if id == "ctl-a" { 18080 } else { 18081 }
}

/// Starts a replica (kind `controller-<id>`, log `controller-<id>.log`): a host process in the
/// node's network namespace (the one this binary runs in), in a session of its own, with the
/// service account's kubeconfig; kept in the PID list so that `Bed::stop` and teardown find it.
fn ctl_start(bed: &Bed, id: &str) -> Result<()> {
    let bin = env("CONTROLLER_BIN")?;
    let kind = format!("controller-{id}");
    let log = OpenOptions::new()
        .append(true)
        .create(true)
        .open(bed.logs.join(format!("{kind}.log")))?;
    let kcfg = bed.state.join("controller.kubeconfig");
    let child = Command::new("setsid")
        .arg(&bin)
        .arg("run")
        .arg("--kubeconfig")
        .arg(&kcfg)
        .env_remove("KUBECONFIG")
        .env("POD_NAMESPACE", CTL_NS)
        .env("POD_NAME", id)
        .env(
            "MOCKGPU_CONTROLLER_LISTEN",
            format!("127.0.0.1:{}", ctl_port(id)),
        )
        .env("MOCKGPU_STALE_AFTER", CTL_STALE.to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("spawn {kind}: {bin}"))?;
    // (setsid execs the controller: the PID is the replica's)
    bed.track(&kind, child.id())
}

/// An HTTP/1.0 GET of a replica's endpoint: its body when the status is 200.
async fn ctl_get(id: &str, path: &str) -> Result<String> {
    let port = ctl_port(id);
    let get = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(
            format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        anyhow::Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    let raw = tokio::time::timeout(Duration::from_secs(5), get)
        .await
        .map_err(|_| anyhow!("GET {path} of {id} (port {port}): no answer in 5 s"))?
        .with_context(|| format!("GET {path} of {id} (port {port})"))?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.lines().next().unwrap_or_default();
    ensure!(
        status.split(' ').nth(1) == Some("200"),
        "GET {path} of {id} (port {port}): {status:?}"
    );
    Ok(body.to_owned())
}

/// Waits for a replica's /readyz to answer 200.
async fn ctl_ready(id: &str, secs: u64) -> Result<()> {
    wait_for(secs, &format!("{id} ready"), || async {
        ctl_get(id, "/readyz").await.is_ok()
    })
    .await
}

fn leases(client: &Client) -> Api<Lease> {
    Api::namespaced(client.clone(), CTL_NS)
}

/// The lease's holder (empty when none holds it).
async fn ctl_holder(client: &Client) -> String {
    leases(client)
        .get_opt(LEASE)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .unwrap_or_default()
}

fn holder(l: Option<&Lease>) -> &str {
    l.and_then(|l| l.spec.as_ref())
        .and_then(|s| s.holder_identity.as_deref())
        .unwrap_or_default()
}

/// Waits up to `secs` for one of `ids` to hold the lease; the holder.
async fn wait_holder_in(client: &Client, secs: u64, ids: &[&str], what: &str) -> Result<String> {
    let lease = wait_object(&leases(client), LEASE, secs, what, |l: Option<&Lease>| {
        ids.contains(&holder(l))
    })
    .await?;
    Ok(holder(Some(&lease)).to_owned())
}

/// A label of our Node, now.
async fn ctl_label(client: &Client, key: &str) -> String {
    let nodes: Api<Node> = Api::all(client.clone());
    label(nodes.get_opt(CTL_NODE).await.ok().flatten().as_ref(), key)
}

/// Waits up to `secs` for our Node's label `key` to be `want` (empty: absent).
async fn wait_label(client: &Client, secs: u64, key: &str, want: &str, what: &str) -> Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let r = wait_object(&nodes, CTL_NODE, secs, what, |n: Option<&Node>| {
        n.is_some() && label(n, key) == want
    })
    .await;
    match r {
        Ok(n) => Ok(n),
        Err(e) => {
            let now = ctl_label(client, key).await;
            Err(e.context(format!("label {key} is '{now}', want '{want}'")))
        }
    }
}

/// A condition's status on a GpuNode (empty when it has none).
pub(crate) fn cond(g: Option<&GpuNode>, kind: &str) -> String {
    g.and_then(|g| g.status.as_ref())
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == kind))
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

fn gpunodes(client: &Client) -> Api<GpuNode> {
    Api::all(client.clone())
}

/// A condition's status on our GpuNode, now.
async fn ctl_cond(client: &Client, kind: &str) -> String {
    cond(
        gpunodes(client)
            .get_opt(CTL_NODE)
            .await
            .ok()
            .flatten()
            .as_ref(),
        kind,
    )
}

/// Waits up to `secs` for our GpuNode's condition `kind` to be `want`.
async fn wait_cond(client: &Client, secs: u64, kind: &str, want: &str) -> Result<()> {
    let what = format!("{kind}={want} on GpuNode {CTL_NODE}");
    wait_object(
        &gpunodes(client),
        CTL_NODE,
        secs,
        &what,
        |g: Option<&GpuNode>| cond(g, kind) == want,
    )
    .await
    .map(drop)
}

/// The agent's server-side apply.
fn agent_apply() -> PatchParams {
    PatchParams::apply(mockgpu_api::gpunode::AGENT_MANAGER).force()
}

/// Our GpuNode's heartbeat: its status as an agent would write it (`topologySince` now too).
async fn ctl_heartbeat(client: &Client) -> Result<()> {
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let status = json!({
        "apiVersion": "mockgpu.io/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": CTL_NODE},
        "status": {"lastHeartbeat": now, "topologySince": now, "heldGpus": 0}
    });
    gpunodes(client)
        .patch_status(CTL_NODE, &agent_apply(), &Patch::Apply(&status))
        .await
        .with_context(|| format!("the heartbeat of GpuNode {CTL_NODE}"))?;
    Ok(())
}

/// A GpuNode as an agent would report it: `gpus` GPUs of `model`, profile `profile`.
pub(crate) fn gpunode(name: &str, profile: &str, gpus: u32, model: &str) -> GpuNode {
    let list = (0..gpus)
        .map(|i| GpuNodeGpu {
            index: i,
            minor: i,
            uuid: format!("GPU-0000000{i}-0000-0000-0000-000000000000"),
            bus_id: format!("0000:0{i}:00.0"),
            model: model.to_owned(),
            memory_mib: None,
            numa_node: 0,
            local_cpulist: "0-7".to_owned(),
            socket: 0,
        })
        .collect();
    GpuNode::new(
        name,
        GpuNodeSpec {
            node_name: name.to_owned(),
            mode: Mode::Mock,
            profile: profile.to_owned(),
            topology_hash: format!("{profile}-{gpus}"),
            gpu_count: gpus,
            gpus: list,
            fabric: None,
        },
    )
}

/// Applies our GpuNode (its spec) as the agent.
async fn ctl_gpunode(client: &Client, profile: &str, gpus: u32, model: &str) -> Result<()> {
    let g = gpunode(CTL_NODE, profile, gpus, model);
    gpunodes(client)
        .patch(CTL_NODE, &agent_apply(), &Patch::Apply(&g))
        .await
        .with_context(|| format!("apply GpuNode {CTL_NODE} ({profile}, {gpus} GPUs)"))?;
    Ok(())
}

/// Whether an event of `reason` about our Node / GpuNode is in `default`.
async fn ctl_event(client: &Client, reason: &str) -> Result<()> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let lp =
        ListParams::default().fields(&format!("involvedObject.name={CTL_NODE},reason={reason}"));
    // the controller records its events after the change they describe, and asynchronously
    wait_for(
        10,
        &format!("a {reason} event on node {CTL_NODE}"),
        || async { events.list(&lp).await.is_ok_and(|l| !l.items.is_empty()) },
    )
    .await
}

/// The tails of the replicas' logs, for a failure.
fn ctl_logs(bed: &Bed) -> String {
    bed.log_tails(&["controller-ctl-a.log", "controller-ctl-b.log"], 5)
}

/// `kubectl auth can-i --as=<the controller's service account>`, as a SubjectAccessReview.
async fn can_i(client: &Client, check: &Check) -> Result<bool> {
    let sar: SubjectAccessReview = serde_json::from_value(json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": CTL_SA, "resourceAttributes": {
            "verb": check.verb, "group": check.group, "resource": check.resource,
            "subresource": check.subresource, "namespace": check.namespace}}
    }))?;
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let r = api.create(&PostParams::default(), &sar).await?;
    Ok(r.status.is_some_and(|s| s.allowed))
}

/// One `can-i` check: want, verb, group, resource, subresource, namespace.
struct Check {
    want: bool,
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    subresource: &'static str,
    namespace: &'static str,
}

const fn check(
    want: bool,
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    subresource: &'static str,
    namespace: &'static str,
) -> Check {
    Check {
        want,
        verb,
        group,
        resource,
        subresource,
        namespace,
    }
}

/// What the controller's service account may do, and what not.
const CHECKS: [Check; 12] = [
    check(true, "patch", "", "nodes", "", ""),
    check(true, "delete", "", "pods", "", GPU_NS),
    check(true, "patch", "mockgpu.io", "gpunodes", "status", ""),
    check(true, "update", "coordination.k8s.io", "leases", "", CTL_NS),
    check(true, "create", "events.k8s.io", "events", "", "default"),
    check(false, "delete", "", "nodes", "", ""),
    check(false, "patch", "mockgpu.io", "gpunodes", "", ""),
    check(false, "delete", "mockgpu.io", "gpunodes", "", ""),
    check(false, "create", "", "pods", "", GPU_NS),
    check(false, "get", "", "secrets", "", CTL_NS),
    check(
        false,
        "update",
        "coordination.k8s.io",
        "leases",
        "",
        "kube-system",
    ),
    check(false, "delete", "coordination.k8s.io", "leases", "", CTL_NS),
];

/// The CRD, the service account, its roles, a token kubeconfig; what the account may do.
pub async fn controller_rbac(bed: &Bed) -> Result<()> {
    let client = client().await?;
    let bin = env("CONTROLLER_BIN")?;
    let out = Command::new(&bin)
        .arg("crd")
        .output()
        .with_context(|| bin.clone())?;
    ensure!(out.status.success(), "{bin} crd: {}", out.status);
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&String::from_utf8(out.stdout)?)
        .context("the controller's CRD (YAML)")?;
    apply_crd(&client, &crd).await?;
    let kinds = chart_rbac(bed, &client, "controller", CTL_NS).await?;
    ensure!(
        kinds.len() == 5,
        "the chart's controller RBAC: {kinds:?}, want a service account, (cluster) roles and bindings"
    );
    let token = account_token(&client, CTL_NS, "mockgpu-controller", 7200).await?;
    token_kubeconfig(
        &bed.state.join("controller.kubeconfig"),
        "mockgpu-controller",
        &token,
    )?;
    let mut bad = String::new();
    for c in &CHECKS {
        let got = can_i(&client, c).await?;
        if got != c.want {
            let ns = if c.namespace.is_empty() {
                String::new()
            } else {
                format!(" -n {}", c.namespace)
            };
            let sub = if c.subresource.is_empty() {
                String::new()
            } else {
                format!(" --subresource={}", c.subresource)
            };
            let res = if c.group.is_empty() {
                c.resource.to_owned()
            } else {
                format!("{}.{}", c.resource, c.group)
            };
            let yn = |b: bool| if b { "yes" } else { "no" };
            bad.push_str(&format!(
                " [{} {res}{sub}{ns}: {}, want {}]",
                c.verb,
                yn(got),
                yn(c.want)
            ));
        }
    }
    ensure!(
        bad.is_empty(),
        "RBAC of the controller's service account:{bad}"
    );
    println!("  {CTL_SA}: granted exactly the listed verbs (12 can-i checks: 5 allowed, 7 denied)");
    Ok(())
}

/// Two replicas: one holds the lease and acts, both are ready.
pub async fn controller_leader(bed: &Bed) -> Result<()> {
    let client = client().await?;
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": CTL_NODE, "labels": {"kubernetes.io/hostname": CTL_NODE}}
    });
    Api::<Node>::all(client.clone())
        .patch(
            CTL_NODE,
            &PatchParams::apply(TB_MANAGER).force(),
            &Patch::Apply(&node),
        )
        .await
        .with_context(|| format!("apply Node {CTL_NODE}"))?;
    let t = Instant::now();
    // (logs are kept across runs)
    for id in ["ctl-a", "ctl-b"] {
        std::fs::write(bed.logs.join(format!("controller-{id}.log")), "")?;
    }
    ctl_start(bed, "ctl-a")?;
    ctl_start(bed, "ctl-b")?;
    let leader = wait_holder_in(
        &client,
        30,
        &["ctl-a", "ctl-b"],
        "a controller holds the lease",
    )
    .await
    .map_err(|e| anyhow!("{e:#}\n{}", ctl_logs(bed)))?;
    bed.timing(
        "controller-leader",
        &format!("{} ms to a lease holder", ms(t)),
    );
    let standby = ctl_other(&leader);
    ctl_ready(standby, 10).await?;
    ctl_ready(&leader, 10).await?;
    let metric = |body: &str, v: &str| {
        body.lines()
            .any(|l| l == format!("mockgpu_controller_leader {v}"))
    };
    ensure!(
        metric(&ctl_get(&leader, "/metrics").await?, "1"),
        "{leader}: metric leader is not 1"
    );
    ensure!(
        metric(&ctl_get(standby, "/metrics").await?, "0"),
        "{standby}: metric leader is not 0"
    );
    let leading = "leading: controllers started";
    ensure!(
        bed.logged_since(&format!("controller-{leader}.log"), 0, leading),
        "{leader} did not log leading"
    );
    ensure!(
        !bed.logged_since(&format!("controller-{standby}.log"), 0, leading),
        "{standby} started its controllers too"
    );
    std::fs::write(bed.state.join("controller.leader"), format!("{leader}\n"))?;
    println!(
        "  leader {leader}, standby {standby} (both /readyz 200; metric mockgpu_controller_leader 1 / 0)"
    );
    Ok(())
}

/// Whether the controller's field manager is among a node's managed fields.
fn managed_by_controller(n: &Node) -> bool {
    n.metadata.managed_fields.as_ref().is_some_and(|m| {
        m.iter()
            .any(|f| f.manager.as_deref() == Some(mockgpu_api::gpunode::CONTROLLER_MANAGER))
    })
}

/// A GpuNode: its Node gets the labels, only from the leader.
pub async fn controller_labels(bed: &Bed) -> Result<()> {
    let client = client().await?;
    let path = bed.state.join("controller.leader");
    let leader = std::fs::read_to_string(&path)
        .with_context(|| format!("{}: needs controller-leader", path.display()))?
        .trim()
        .to_owned();
    let standby = ctl_other(&leader);
    let t = Instant::now();
    ctl_gpunode(&client, "gb300", 4, "NVIDIA GB300").await?;
    ctl_heartbeat(&client).await?;
    let node = wait_label(
        &client,
        30,
        "mockgpu.io/profile",
        "gb300",
        &format!("node {CTL_NODE} labelled gb300"),
    )
    .await
    .map_err(|e| {
        anyhow!(
            "{e:#}\n{}",
            bed.log_tails(&[&format!("controller-{leader}.log")], 5)
        )
    })?;
    bed.timing(
        "controller-labels",
        &format!("{} ms from the GpuNode to the node's labels", ms(t)),
    );
    for (k, want) in [
        ("nvidia.com/gpu.present", "true"),
        ("nvidia.com/gpu.count", "4"),
        ("nvidia.com/gpu.product", "NVIDIA-GB300"),
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
    ] {
        let l = label(Some(&node), k);
        ensure!(l == want, "label {k}='{l}', want {want}");
    }
    ensure!(
        managed_by_controller(&node),
        "no managed fields of mockgpu-controller on {CTL_NODE}"
    );
    let nodes: Api<Node> = Api::all(client.clone());
    let node0 = nodes.get(NODE).await?;
    if managed_by_controller(&node0) {
        ensure!(
            gpunodes(&client).get_opt(NODE).await?.is_some(),
            "the controller touched {NODE}, which has no GpuNode"
        );
    }
    wait_cond(&client, 20, "Stale", "False").await?;
    let (drifted, missing) = (
        ctl_cond(&client, "Drifted").await,
        ctl_cond(&client, "InjectionMissing").await,
    );
    ensure!(
        drifted == "False" && missing == "False",
        "Drifted '{drifted}', InjectionMissing '{missing}'"
    );
    ctl_event(&client, "LabelsApplied").await?;
    ensure!(
        bed.logged_since(
            &format!("controller-{leader}.log"),
            0,
            "node labels applied"
        ),
        "the leader logged no label apply"
    );
    let standby_log = format!("controller-{standby}.log");
    ensure!(
        !bed.logged_since(&standby_log, 0, "node labels applied")
            && !bed.logged_since(&standby_log, 0, "conditions applied"),
        "the standby acted"
    );
    let node = nodes.get(CTL_NODE).await?;
    println!(
        "  {}",
        serde_json::to_string(&node.metadata.labels.unwrap_or_default())?
    );
    let conds: Vec<String> = gpunodes(&client)
        .get(CTL_NODE)
        .await?
        .status
        .map(|s| {
            s.conditions
                .iter()
                .map(|c| format!("{}={}", c.type_, c.status))
                .collect()
        })
        .unwrap_or_default();
    println!("  conditions: {}; only {leader} acted", conds.join(" "));
    Ok(())
}

/// No heartbeat for MOCKGPU_STALE_AFTER: Stale=True, an event; then back.
pub async fn controller_stale(bed: &Bed) -> Result<()> {
    let client = client().await?;
    ctl_heartbeat(&client).await?;
    let t = Instant::now();
    wait_cond(&client, 20, "Stale", "False").await?;
    let secs = CTL_STALE + 15;
    wait_cond(&client, secs, "Stale", "True")
        .await
        .with_context(|| format!("Stale is not True {secs} s after the last heartbeat"))?;
    bed.timing(
        "controller-stale",
        &format!(
            "{} ms from the last heartbeat to Stale=True (stale after {CTL_STALE} s)",
            ms(t)
        ),
    );
    ctl_event(&client, "HeartbeatLost").await?;
    let missing = ctl_cond(&client, "InjectionMissing").await;
    ensure!(
        missing == "Unknown",
        "InjectionMissing is '{missing}' on a stale node, want Unknown"
    );
    ctl_heartbeat(&client).await?;
    wait_cond(&client, 20, "Stale", "False")
        .await
        .context("Stale after a new heartbeat")?;
    println!(
        "  Stale=True after {} ms without heartbeats (event HeartbeatLost); a heartbeat: Stale=False",
        ms(t)
    );
    Ok(())
}

/// SIGTERM: the lease is released, handed over at once; SIGKILL: within the lease time.
pub async fn controller_failover(bed: &Bed) -> Result<()> {
    let client = client().await?;
    let leader = ctl_holder(&client).await;
    ensure!(!leader.is_empty(), "no controller holds the lease");
    let next = ctl_other(&leader);
    let t = Instant::now();
    let kind = format!("controller-{leader}");
    bed.stop(Signal::SIGTERM, &[kind.as_str()]).await?;
    wait_holder_in(&client, 10, &[next], &format!("{next} holds the lease"))
        .await
        .with_context(|| format!("after SIGTERM of {leader}"))?;
    bed.timing("controller-handover-sigterm", &format!("{} ms", ms(t)));
    ensure!(
        bed.logged_since(&format!("controller-{leader}.log"), 0, "lease released"),
        "{leader} did not release the lease"
    );
    ctl_start(bed, &leader)?; // back, as the standby
    let (leader, next) = (next, leader.as_str());
    ctl_ready(next, 10).await?;
    let t = Instant::now();
    let kind = format!("controller-{leader}");
    bed.stop(Signal::SIGKILL, &[kind.as_str()]).await?;
    wait_holder_in(
        &client,
        CTL_LEASE_S + 10,
        &[next],
        &format!("{next} holds the lease"),
    )
    .await
    .with_context(|| format!("after SIGKILL of {leader}"))?;
    let kill_ms = ms(t);
    bed.timing(
        "controller-handover-sigkill",
        &format!("{kill_ms} ms (lease {CTL_LEASE_S} s)"),
    );
    ensure!(
        kill_ms <= u128::from(CTL_LEASE_S * 1000 + 2000),
        "handover after SIGKILL took {kill_ms} ms, more than the lease ({CTL_LEASE_S} s) and one retry"
    );
    // the new leader acts
    ctl_gpunode(&client, "h100", 8, "NVIDIA H100 80GB HBM3").await?;
    let t = Instant::now();
    let node = wait_label(
        &client,
        30,
        "mockgpu.io/profile",
        "h100",
        "the label follows (h100)",
    )
    .await
    .context("after the handover")?;
    let product = label(Some(&node), "nvidia.com/gpu.product");
    ensure!(
        product == "NVIDIA-H100-80GB-HBM3",
        "product label '{product}'"
    );
    bed.timing("controller-label-after-handover", &format!("{} ms", ms(t)));
    ctl_start(bed, leader)?;
    println!(
        "  SIGTERM: lease released, {leader} took over; SIGKILL of {leader}: {next} took over in {kill_ms} ms; labels follow (h100, 8)"
    );
    Ok(())
}

/// Whether the API server's /readyz answers ok.
async fn api_ready(client: &Client) -> bool {
    let Ok(req) = http::Request::get("/readyz").body(Vec::new()) else {
        return false;
    };
    client.request_text(req).await.is_ok_and(|s| s == "ok")
}

/// The watches survive a restarted API server.
pub async fn controller_apiserver_restart(bed: &Bed) -> Result<()> {
    let args = bed.cmdline_of("kube-apiserver")?;
    let t = Instant::now();
    // (as cluster.sh's stop_kinds: up to 10 s for it to end; it stops listening at once but may
    // drain its watches' connections for up to a minute, beside its successor)
    if let Err(e) = bed.stop(Signal::SIGTERM, &["kube-apiserver"]).await {
        println!("  {e:#}: the old API server still drains; the new one starts beside it");
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    bed.spawn("kube-apiserver", "kube-apiserver.log", &argv)?;
    let client = client().await?;
    wait_for(120, "kube-apiserver /readyz", || api_ready(&client))
        .await
        .map_err(|e| anyhow!("{e:#}\n{}", bed.log_tails(&["kube-apiserver.log"], 20)))?;
    bed.timing(
        "controller-apiserver-restart",
        &format!("{} ms to /readyz", ms(t)),
    );
    wait_holder_in(
        &client,
        CTL_LEASE_S + 10,
        &["ctl-a", "ctl-b"],
        "a controller holds the lease",
    )
    .await
    .context("no lease holder after the restart")?;
    ctl_heartbeat(&client).await?;
    ctl_gpunode(&client, "b200", 8, "NVIDIA B200").await?;
    let t = Instant::now();
    let node = wait_label(
        &client,
        60,
        "mockgpu.io/profile",
        "b200",
        "the label follows (b200)",
    )
    .await
    .map_err(|e| anyhow!("{e:#} after the API server restart\n{}", ctl_logs(bed)))?;
    bed.timing(
        "controller-label-after-apiserver-restart",
        &format!("{} ms", ms(t)),
    );
    println!(
        "  after the restart: leader {}; labels follow (b200, {} GPUs)",
        ctl_holder(&client).await,
        label(Some(&node), "nvidia.com/gpu.count")
    );
    Ok(())
}

/// No GpuNode: our labels go, the node's own stay; SIGTERM releases the lease.
pub async fn controller_gpunode_deleted(bed: &Bed) -> Result<()> {
    let client = client().await?;
    gpunodes(&client)
        .delete(CTL_NODE, &DeleteParams::default())
        .await?;
    let t = Instant::now();
    let node = wait_label(
        &client,
        30,
        "mockgpu.io/profile",
        "",
        "the profile label removed",
    )
    .await
    .context("after the GpuNode was deleted")?;
    bed.timing("controller-labels-removed", &format!("{} ms", ms(t)));
    for k in GPU_LABELS {
        ensure!(
            label(Some(&node), k).is_empty(),
            "label {k} left on {CTL_NODE}"
        );
    }
    let host = label(Some(&node), "kubernetes.io/hostname");
    ensure!(host == CTL_NODE, "the node's own label is gone ('{host}')");
    ctl_event(&client, "LabelsRemoved").await?;
    bed.stop(Signal::SIGTERM, &["controller-ctl-a", "controller-ctl-b"])
        .await?;
    let h = ctl_holder(&client).await;
    ensure!(
        h.is_empty(),
        "the lease is still held by '{h}' after both replicas stopped"
    );
    Api::<Node>::all(client.clone())
        .delete(CTL_NODE, &DeleteParams::default())
        .await?;
    println!(
        "  labels removed, kubernetes.io/hostname kept; both replicas stopped, the lease released"
    );
    Ok(())
}
