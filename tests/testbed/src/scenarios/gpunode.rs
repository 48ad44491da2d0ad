//! The GpuNode the host agent reports (cluster mode, after `gpunode-setup` gave it credentials):
//! who writes it and what it says, the GPUs held, a topology change, its recreation and its
//! heartbeat.

use std::time::Instant;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::DeleteParams;
use kube::{Api, ResourceExt};
use mockgpu_api::GpuNode;

use crate::bed::{Bed, wait_for};
use crate::cluster::{DP_NS, NODE, client, kubectl, kubectl_exec, wait_object};
use crate::node::write_profile;

/// The agent's kubeconfig (a bound token), a node path.
const AGENT_KUBECONFIG: &str = "/etc/kubernetes/mockgpu-agent.kubeconfig";

/// Whether the GpuNode's `Ready` condition is True.
pub(crate) fn ready(g: Option<&GpuNode>) -> bool {
    g.and_then(|g| g.status.as_ref()).is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

async fn gpunodes() -> Result<Api<GpuNode>> {
    Ok(Api::all(client().await?))
}

/// The agent applies the GpuNode and its status (server-side, as `mockgpu-agent`), the Node owns
/// it, `kubectl get gpunodes` shows its columns, and `doctor` with the agent's credentials agrees.
pub async fn gpunode_reported(bed: &Bed) -> Result<()> {
    let api = gpunodes().await?;
    let t = Instant::now();
    let g = wait_object(&api, NODE, 30, "the GpuNode to be Ready", ready).await?;
    bed.timing(
        "gpunode-ready",
        &format!("{} ms after the agent's restart", t.elapsed().as_millis()),
    );
    let managers: Vec<String> = g
        .managed_fields()
        .iter()
        .map(|m| {
            let f = |s: &Option<String>| s.clone().unwrap_or_default();
            format!(
                "{}/{}/{}",
                f(&m.manager),
                f(&m.operation),
                f(&m.subresource)
            )
        })
        .collect();
    for want in ["mockgpu-agent/Apply/", "mockgpu-agent/Apply/status"] {
        ensure!(
            managers.iter().any(|m| m == want),
            "managedFields {managers:?}: no {want}"
        );
    }
    let node = Api::<Node>::all(client().await?).get(NODE).await?;
    let owner = g
        .owner_references()
        .first()
        .context("the GpuNode has no ownerReference")?;
    let got = (
        owner.api_version.as_str(),
        owner.kind.as_str(),
        owner.name.as_str(),
        Some(&owner.uid),
    );
    ensure!(
        got == ("v1", "Node", NODE, node.metadata.uid.as_ref()),
        "ownerReference {got:?}, want the Node {NODE} (uid {:?})",
        node.metadata.uid
    );
    let table = kubectl(&["get", "gpunodes"])?;
    for line in table.lines() {
        println!("  {line}");
    }
    let words = |l: &str| l.split_whitespace().collect::<Vec<_>>().join(" ");
    let header = table.lines().next().map(words).unwrap_or_default();
    ensure!(
        header == "NAME MODE PROFILE GPUS HELD READY AGE",
        "columns: {header}"
    );
    let row = table
        .lines()
        .map(words)
        .find(|l| l.split(' ').next() == Some(NODE))
        .with_context(|| format!("kubectl get gpunodes lists no {NODE}"))?;
    let cells: Vec<&str> = row.split(' ').skip(1).take(5).collect();
    ensure!(
        cells == ["mock", "gb300", "4", "0", "True"],
        "GpuNode row {row:?}, want mock gb300 4 0 True"
    );
    println!("  managedFields: {managers:?}; owner: the Node");
    let mut doctor = bed.innode(&[
        "/opt/mockgpu/mockgpu-agent",
        "doctor",
        "--kubeconfig",
        AGENT_KUBECONFIG,
        "--node-name",
        NODE,
        "--heartbeat",
        "3",
        "--nri-socket",
        "/run/nri/nri.sock",
    ])?;
    let out = doctor.output().context("doctor")?;
    let report =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    for check in ["device-plugin", "allocatable", "gpunode"] {
        let ok = report
            .lines()
            .find(|l| l.starts_with(&format!("ok   {check}: ")));
        let line = ok.with_context(|| format!("doctor's {check} check is not ok:\n{report}"))?;
        println!("  doctor: {line}");
    }
    Ok(())
}

/// The device plugin's pod holds 2 GPUs: the GpuNode counts them and lists the pod's pinning.
pub async fn gpunode_held(bed: &Bed) -> Result<()> {
    let api = gpunodes().await?;
    let t = Instant::now();
    let held = |g: Option<&GpuNode>| {
        g.and_then(|g| g.status.as_ref())
            .is_some_and(|s| s.held_gpus == 2)
    };
    let g = wait_object(&api, NODE, 15, "heldGpus 2", held).await?;
    bed.timing(
        "gpunode-held",
        &format!("{} ms after the pod was checked", t.elapsed().as_millis()),
    );
    let (vis, _) = kubectl_exec(
        DP_NS,
        "gpu-2",
        &["sh", "-c", "echo \"$NVIDIA_VISIBLE_DEVICES\""],
    )?;
    let vis: Vec<String> = vis.trim().split(',').map(str::to_owned).collect();
    let pod = Api::<Pod>::namespaced(client().await?, DP_NS)
        .get("gpu-2")
        .await?;
    let uid = pod.metadata.uid.unwrap_or_default();
    let pinning = g.status.map(|s| s.pinning).unwrap_or_default();
    ensure!(
        pinning.iter().any(|p| p.namespace == DP_NS
            && p.pod == "gpu-2"
            && p.pod_uid == uid
            && p.container == "c"
            && p.gpus == vis),
        "pinning {pinning:?} does not list {DP_NS}/gpu-2 ({uid}) container c with {vis:?}"
    );
    println!("  HELD 2; pinning: {DP_NS}/gpu-2/c {vis:?}");
    Ok(())
}

fn gpu_count_is(n: u32) -> impl Fn(Option<&GpuNode>) -> bool {
    move |g: Option<&GpuNode>| g.is_some_and(|g| g.spec.gpu_count == n)
}

/// A profile change (4 GPUs to 2): a new topology hash and a later `topologySince`; back to 4:
/// the first hash again.
pub async fn gpunode_topology(bed: &Bed) -> Result<()> {
    let api = gpunodes().await?;
    let before = api.get(NODE).await?;
    let since = |g: &GpuNode| g.status.as_ref().and_then(|s| s.topology_since.clone());
    let (h0, s0) = (before.spec.topology_hash.clone(), since(&before));
    // (times have whole seconds: a change within the second of the last one could not be later)
    if let Some(s) = &s0 {
        let past = || async { k8s_openapi::jiff::Timestamp::now().as_second() > s.0.as_second() };
        wait_for(5, "the clock to leave the second of topologySince", past).await?;
    }
    let t = Instant::now();
    write_profile(bed, 2, None)?;
    // the agent applies the object and its status in two requests: wait for both
    let changed = |g: Option<&GpuNode>| g.is_some_and(|g| g.spec.gpu_count == 2 && since(g) > s0);
    let after = wait_object(
        &api,
        NODE,
        30,
        "gpuCount 2 and a later topologySince",
        changed,
    )
    .await;
    // the profile goes back whatever happened, so that the next steps find 4 GPUs
    write_profile(bed, 4, None)?;
    let after = after?;
    bed.timing(
        "gpunode-topology",
        &format!("{} ms to gpuCount 2", t.elapsed().as_millis()),
    );
    let (h1, s1) = (after.spec.topology_hash.clone(), since(&after));
    ensure!(h1 != h0, "topologyHash unchanged ({h0})");
    println!("  topologyHash {h0} -> {h1}; topologySince {s0:?} -> {s1:?}");
    let back = wait_object(
        &api,
        NODE,
        30,
        "gpuCount 4 after the change back",
        gpu_count_is(4),
    )
    .await?;
    ensure!(
        back.spec.topology_hash == h0,
        "topologyHash {} after the change back, want {h0}",
        back.spec.topology_hash
    );
    Ok(())
}

/// A deleted GpuNode comes back with the next heartbeat, and the agent says so.
pub async fn gpunode_recreated(bed: &Bed) -> Result<()> {
    let api = gpunodes().await?;
    let u0 = api.get(NODE).await?.metadata.uid.unwrap_or_default();
    let lines = bed.log_lines("agent.log");
    api.delete(NODE, &DeleteParams::default()).await?;
    let t = Instant::now();
    let anew = |g: Option<&GpuNode>| {
        g.is_some_and(|g| g.metadata.uid.as_deref() != Some(u0.as_str())) && ready(g)
    };
    let g = wait_object(&api, NODE, 15, "a new, Ready GpuNode", anew).await?;
    bed.timing(
        "gpunode-recreated",
        &format!("{} ms", t.elapsed().as_millis()),
    );
    wait_for(10, "the agent's log of the recreation", || async {
        bed.logged_since("agent.log", lines, "GpuNode recreated")
    })
    .await?;
    println!(
        "  uid {u0} -> {}, Ready",
        g.metadata.uid.unwrap_or_default()
    );
    Ok(())
}

/// `lastHeartbeat` advances (the agent beats every 3 s here).
pub async fn gpunode_heartbeat(bed: &Bed) -> Result<()> {
    let api = gpunodes().await?;
    let beat = |g: &GpuNode| g.status.as_ref().and_then(|s| s.last_heartbeat.clone());
    let b0 = beat(&api.get(NODE).await?);
    let t = Instant::now();
    let later = |g: Option<&GpuNode>| g.is_some_and(|g| beat(g) > b0);
    let g = wait_object(&api, NODE, 15, "a later lastHeartbeat", later).await?;
    bed.timing(
        "gpunode-heartbeat",
        &format!("{} ms", t.elapsed().as_millis()),
    );
    let version = g
        .status
        .as_ref()
        .and_then(|s| s.agent_version.clone())
        .unwrap_or_default();
    println!("  lastHeartbeat {b0:?} -> {:?} (agent {version})", beat(&g));
    Ok(())
}
