//! The GpuNode the host agent reports (cluster mode): its credentials (`gpunode-setup`: the CRD,
//! the chart's RBAC of the agent, a token, the agent restarted with them), who writes it and
//! what it says, the GPUs held, a topology change, its recreation, its heartbeat and a stopping
//! agent's last report.

use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use mockgpu_api::GpuNode;
use nix::sys::signal::Signal;
use serde_json::json;

use crate::bed::{Bed, wait_for};
use crate::cluster::{
    DP_NS, GPU_NS, NODE, RES, account_token, allocatable_is, api_error, api_message, apply_crd,
    chart_rbac, client, client_of, kubectl, kubectl_exec, token_kubeconfig, wait_deleted,
    wait_object,
};
use crate::node::write_profile;

/// The agent's kubeconfig (a bound token), a node path.
const AGENT_KUBECONFIG: &str = "/etc/kubernetes/mockgpu-agent.kubeconfig";
/// The agent's service account ...
const AGENT_SA: &str = "mockgpu-agent";
/// ... in this namespace.
const AGENT_SA_NS: &str = "mockgpu-system";
/// The agent's log.
const AGENT_LOG: &str = "agent.log";

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
        header == "NAME MODE PROFILE GPUS HELD UNHEALTHY READY AGE",
        "columns: {header}"
    );
    let row = table
        .lines()
        .map(words)
        .find(|l| l.split(' ').next() == Some(NODE))
        .with_context(|| format!("kubectl get gpunodes lists no {NODE}"))?;
    let cells: Vec<&str> = row.split(' ').skip(1).take(6).collect();
    ensure!(
        cells == ["mock", "gb300", "4", "0", "0", "True"],
        "GpuNode row {row:?}, want mock gb300 4 0 0 True"
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

/// Starts the host agent with its credentials (and a heartbeat of 3 s); waits for it to be
/// ready and for its GPUs to be allocatable again.
async fn start_reporting_agent(bed: &Bed) -> Result<()> {
    let n0 = bed.log_lines("containerd.log");
    bed.start_agent_with(&["--kubeconfig", AGENT_KUBECONFIG, "--heartbeat", "3"])?;
    bed.wait_agent_ready(n0, "the agent with credentials to be ready")
        .await?;
    let nodes: Api<Node> = Api::all(client().await?);
    let four = allocatable_is("4");
    let what = format!("allocatable {RES} = 4 after the agent's restart");
    wait_object(&nodes, NODE, 60, &what, four).await?;
    Ok(())
}

/// The CRD, the agent's service account and RBAC (the chart's, rendered by `helm template`), a
/// token kubeconfig that may read its node and write GpuNodes and nothing else; the agent
/// (which said once that it does not report) restarted with them.
pub async fn gpunode_setup(bed: &Bed) -> Result<()> {
    // the agent so far had no credentials: it said so once (the log is kept across runs: count
    // from the start before the one of this agent, which logs the line just before it listens)
    let log = std::fs::read_to_string(bed.logs.join(AGENT_LOG)).context(AGENT_LOG)?;
    let lines: Vec<&str> = log.lines().collect();
    let starts: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("health endpoint listening"))
        .map(|(i, _)| i)
        .collect();
    let from = starts.len().checked_sub(2).map_or(0, |i| starts[i] + 1);
    let said = lines[from..]
        .iter()
        .filter(|l| l.contains("no Kubernetes API server configured: not reporting"))
        .count();
    ensure!(
        said == 1,
        "the agent without credentials logged 'not reporting' {said} times, want once"
    );
    let client = client().await?;
    // the GPU pods of the earlier steps gone, HELD counts only this test's pods
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let what = format!("namespace {GPU_NS} to be deleted");
    wait_deleted(&namespaces, GPU_NS, 90, &what).await?;
    let path = std::path::PathBuf::from(std::env::var("REPO").context("$REPO")?)
        .join("charts/mockgpu/crds/gpunodes.mockgpu.io.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(&text).with_context(|| path.display().to_string())?;
    apply_crd(&client, &crd).await?;
    let kinds = chart_rbac(bed, &client, "agent", AGENT_SA_NS).await?;
    for want in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"] {
        ensure!(
            kinds.iter().any(|k| k == want),
            "the chart's agent RBAC: {kinds:?}, no {want}"
        );
    }
    let token = account_token(&client, AGENT_SA_NS, AGENT_SA, 7200).await?;
    let kubeconfig = bed.node_path(AGENT_KUBECONFIG);
    token_kubeconfig(&kubeconfig, AGENT_SA, &token)?;
    // real RBAC: the token may read its node and write GpuNodes, nothing else
    let agent = client_of(&kubeconfig).await?;
    let nodes: Api<Node> = Api::all(agent.clone());
    let last = std::cell::RefCell::new(String::new());
    let may_get = wait_for(30, &format!("the agent's token to get node {NODE}"), || {
        let (nodes, last) = (&nodes, &last);
        async move {
            let r = nodes.get(NODE).await;
            r.map_err(|e| *last.borrow_mut() = api_message(&e)).is_ok()
        }
    })
    .await;
    may_get.with_context(|| format!("the last refusal: {}", last.borrow()))?;
    match Api::<Pod>::all(agent.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(l) => bail!("the agent's token lists pods ({} of them)", l.items.len()),
        Err(e) if api_error(&e, 403) => {}
        Err(e) => bail!(
            "listing pods as the agent: {}, want Forbidden",
            api_message(&e)
        ),
    }
    match Api::<GpuNode>::all(agent)
        .delete("nothing-here", &DeleteParams::default())
        .await
    {
        Ok(_) => bail!("the agent's token deletes GpuNodes"),
        Err(e) if api_error(&e, 403) => {}
        Err(e) => bail!(
            "deleting a GpuNode as the agent: {}, want Forbidden",
            api_message(&e)
        ),
    }
    println!(
        "  CRD gpunodes.mockgpu.io established; system:serviceaccount:{AGENT_SA_NS}:{AGENT_SA} \
         may get nodes and write gpunodes; listing pods, deleting gpunodes: Forbidden"
    );
    bed.stop(Signal::SIGTERM, &["agent"]).await?;
    let t = Instant::now();
    start_reporting_agent(bed).await?;
    bed.timing(
        "agent-ready-reporting",
        &format!("{} ms", t.elapsed().as_millis()),
    );
    Ok(())
}

/// The agent instance the GpuNode's status names.
fn instance(g: Option<&GpuNode>) -> String {
    g.and_then(|g| g.status.as_ref())
        .and_then(|s| s.agent_instance.clone())
        .unwrap_or_default()
}

/// The status and reason of the GpuNode's `Ready` condition ("" when it has none).
fn ready_is(g: Option<&GpuNode>) -> (String, String) {
    g.and_then(|g| g.status.as_ref())
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| (c.status.clone(), c.reason.clone()))
        .unwrap_or_default()
}

/// The GpuNode's status, for an error.
fn status_of(g: Option<&GpuNode>) -> String {
    g.and_then(|g| serde_json::to_string(&g.status).ok())
        .unwrap_or_else(|| "(no GpuNode)".into())
}

/// Waits for a report of an agent instance other than `old`: Ready True TreeMounted; its
/// instance.
async fn reported_anew(api: &Api<GpuNode>, old: &[&str], what: &str) -> Result<String> {
    let anew = |g: Option<&GpuNode>| {
        let i = instance(g);
        !i.is_empty()
            && !old.contains(&i.as_str())
            && ready_is(g) == ("True".into(), "TreeMounted".into())
    };
    let what = format!("GpuNode {NODE} reported by {what} (Ready True TreeMounted, not {old:?})");
    let g = wait_object(api, NODE, 30, &what, anew).await?;
    Ok(instance(Some(&g)))
}

/// A stopping agent's last report in the agent's log after line `from`: whether it left the
/// GpuNode to another agent (or else reported it not Ready).
async fn last_report(bed: &Bed, from: usize) -> Result<bool> {
    const LEFT: &str = "another agent reports the GpuNode now";
    const NOT_READY: &str = "GpuNode reported not Ready";
    // (the log may trail the process that stop waited for by a few milliseconds)
    let logged = wait_for(10, "the stopping agent's last report", || async {
        bed.logged_since(AGENT_LOG, from, LEFT) || bed.logged_since(AGENT_LOG, from, NOT_READY)
    })
    .await;
    logged.map_err(|e| anyhow::anyhow!("{e}\n{}", bed.log_tails(&[AGENT_LOG], 5)))?;
    Ok(bed.logged_since(AGENT_LOG, from, LEFT))
}

/// A stopping agent reports Ready False (AgentStopped), unless a successor (a rollout's new
/// agent) has reported since: then it leaves the GpuNode to it. Its status apply carries the
/// resourceVersion it read: the API server refuses a stale one.
pub async fn gpunode_last_report(bed: &Bed) -> Result<()> {
    let api = gpunodes().await?;
    let first = instance(api.get_opt(NODE).await?.as_ref());
    ensure!(
        !first.is_empty(),
        "the GpuNode's status names no agentInstance"
    );
    bed.stop(Signal::SIGTERM, &["agent"]).await?;
    let g = api.get_opt(NODE).await?;
    ensure!(
        ready_is(g.as_ref()) == ("False".into(), "AgentStopped".into()),
        "Ready after the agent stopped: {:?}, want False AgentStopped; status {}",
        ready_is(g.as_ref()),
        status_of(g.as_ref())
    );
    start_reporting_agent(bed).await?;
    let mut second = reported_anew(&api, &[&first], "a new agent").await?;
    // a rollout's successor has reported (as the agent's field manager); then the old agent
    // stops. The running agent may report once more in between (a heartbeat, its device
    // plugin's change): then it is the reporter again and says so at its stop; that race is the
    // test's, so it retries
    let apply = PatchParams::apply(mockgpu_api::gpunode::AGENT_MANAGER).force();
    for attempt in 1..=3 {
        let now = k8s_openapi::jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let successor = json!({
            "apiVersion": "mockgpu.io/v1alpha1", "kind": "GpuNode",
            "metadata": {"name": NODE},
            "status": {"agentInstance": "mgtb-successor", "conditions": [{"type": "Ready",
                "status": "True", "reason": "Successor", "message": "a rollout's new agent",
                "lastTransitionTime": now}]}
        });
        api.patch_status(NODE, &apply, &Patch::Apply(&successor))
            .await
            .context("the successor's status apply")?;
        let l0 = bed.log_lines(AGENT_LOG);
        bed.stop(Signal::SIGTERM, &["agent"]).await?;
        if last_report(bed, l0).await? {
            break;
        }
        ensure!(
            attempt < 3,
            "the stopping agent did not see the successor, {attempt} times:\n{}",
            bed.log_tails(&[AGENT_LOG], 5)
        );
        println!(
            "  try {attempt}: the agent reported again between the successor's report and its \
             stop; once more"
        );
        let again = instance(api.get_opt(NODE).await?.as_ref());
        start_reporting_agent(bed).await?;
        second = reported_anew(&api, &[&first, &again], "a new agent").await?;
    }
    let g = api.get_opt(NODE).await?;
    ensure!(
        instance(g.as_ref()) == "mgtb-successor"
            && ready_is(g.as_ref()) == ("True".into(), "Successor".into()),
        "the stopping agent overwrote its successor's report: {}",
        status_of(g.as_ref())
    );
    // the stopping agent applies at the resourceVersion it read: the API server refuses a stale one
    let rv = g
        .and_then(|g| g.metadata.resource_version)
        .context("the GpuNode has no resourceVersion")?;
    let touch = |v: serde_json::Value| {
        Patch::Merge(json!({"metadata": {"annotations": {"mockgpu.io/testbed-touch": v}}}))
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos()
        .to_string();
    api.patch(NODE, &PatchParams::default(), &touch(json!(nanos)))
        .await?;
    let stale = json!({
        "apiVersion": "mockgpu.io/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": NODE, "resourceVersion": rv},
        "status": {"agentInstance": "mgtb-stale"}
    });
    let refused = api.patch_status(NODE, &apply, &Patch::Apply(&stale)).await;
    api.patch(NODE, &PatchParams::default(), &touch(json!(null)))
        .await?;
    match refused {
        Ok(_) => bail!("a status apply at the stale resourceVersion {rv} was accepted"),
        Err(e) if api_error(&e, 409) && e.to_string().contains("the object has been modified") => {}
        Err(e) => bail!(
            "a status apply at a stale resourceVersion: {}, want 409 Conflict",
            api_message(&e)
        ),
    }
    println!(
        "  alone, the stopping agent reported Ready False AgentStopped; after a successor's \
         report it left the GpuNode to it; a status apply at a stale resourceVersion is refused \
         (409)"
    );
    start_reporting_agent(bed).await?;
    reported_anew(&api, &[&first, &second, "mgtb-successor"], "the next agent").await?;
    Ok(())
}
