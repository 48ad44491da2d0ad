//! The chart as a user installs it (the README's commands, taken from README.md), with the test
//! bed's images, in place of the host agent: `chart-install` (the agent's GpuNode, the
//! controller's labels, a GPU pod, `helm test`, the admission policy with real service-account
//! tokens), `chart-slinky-remediation` (Slinky on the chart's agent and controller, then the
//! README's profile change by `helm upgrade` with remediation on), `chart-uninstall` (nothing
//! left behind).

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use mockgpu_api::GpuNode;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::bed::{Bed, mounts, wait_for};
use crate::cluster::{
    NODE, RES, account_token, allocatable_is, api_error, api_message, apply, client, client_of,
    create_namespace, daemonset_rolled_out, delete_namespace, gpu_pod, guide, kubectl,
    kubectl_exec, label, pod_ready, pods_report, readme_line, token_kubeconfig, wait_object,
};
use crate::controller::gpunode;
use crate::gpunode::ready;
use crate::node::ms;
use crate::slinky::{self, PCI_LABEL, srun, srun_cuda_visible};
use crate::slurm::{gres_sockets, uuids_in};

/// The chart's namespace (the README's `--namespace`).
pub(crate) const CHART_NS: &str = "mockgpu-system";
/// The chart's agent DaemonSet (release mockgpu, profile `default`).
const AGENT_DS: &str = "mockgpu-agent-default";
/// The agent's service account.
const AGENT_SA: &str = "mockgpu-agent";
/// What the test bed adds to the README's install: its own images (the pods reach the API server
/// through the `kubernetes` service, as in any cluster), one controller replica, and heartbeats
/// and staleness in seconds (`worker-leaves`).
const TB_VALUES: [&str; 18] = [
    "--set",
    "agent.image.repository=localhost/mockgpu-agent",
    "--set-string",
    "agent.image.tag=1",
    "--set",
    "agent.image.pullPolicy=Never",
    "--set",
    "controller.image.repository=localhost/mockgpu-controller",
    "--set-string",
    "controller.image.tag=1",
    "--set",
    "controller.image.pullPolicy=Never",
    "--set",
    "controller.replicas=1",
    "--set",
    "agent.heartbeatSeconds=5",
    "--set",
    "controller.staleAfterSeconds=20",
];
/// The labels the chart's controller sets (and `helm uninstall` removes).
const CHART_LABELS: [&str; 5] = [
    "mockgpu.io/profile",
    "nvidia.com/gpu.present",
    "nvidia.com/gpu.count",
    "nvidia.com/gpu.product",
    PCI_LABEL,
];
/// A Node object with no kubelet behind it (the admission policy's other node).
const VAP_NODE: &str = "mgtb-elsewhere";
/// A pod of the agent's service account there (it never runs).
const VAP_POD: &str = "agent-token-probe";
/// The chart's admission policy.
const VAP: &str = "mockgpu-agent-own-gpunode";

/// What helps when a rollout of the chart fails: its pods, their events and logs.
async fn chart_logs(client: &Client) -> String {
    pods_report(client, CHART_NS, "", 25).await
}

/// The mount points of mockgpu's FUSE mounts in the node.
fn mockgpu_mounts(bed: &Bed) -> Result<Vec<String>> {
    let path = format!("/proc/{}/mountinfo", bed.node_pid()?);
    let text = std::fs::read_to_string(&path).with_context(|| path.clone())?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut r = right.split(' ');
            let (fstype, source) = (r.next()?, r.next()?);
            (fstype.starts_with("fuse") && source == "mockgpu")
                .then(|| left.split(' ').nth(4).unwrap_or_default().to_owned())
        })
        .collect())
}

/// The PIDs of the keepers the host agent started (`<exe> keeper --dir /run/mockgpu`).
fn host_keepers() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect();
        args.windows(3)
            .any(|w| w[0] == "keeper" && w[1] == "--dir" && w[2] == "/run/mockgpu")
            .then_some(pid)
    })
    .collect()
}

/// A JWT's claims (its payload).
fn jwt_claims(token: &str) -> Result<Value> {
    use base64::Engine as _;
    let payload = token.split('.').nth(1).context("not a JWT")?;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .context("the JWT's payload is not base64url")?;
    serde_json::from_slice(&raw).context("the JWT's payload is not JSON")
}

/// The node a token is bound to (its `kubernetes.io` claim), or what the claim holds.
fn token_node(token: &str) -> Result<String> {
    let claims = jwt_claims(token)?;
    claims
        .pointer("/kubernetes.io/node/name")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("no node claim: {}", claims["kubernetes.io"]))
}

/// A token of the agent's service account bound to the pod `name` (its `uid`), so to its node.
async fn pod_token(client: &Client, name: &str, uid: &str) -> Result<String> {
    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": [], "expirationSeconds": 600,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": name, "uid": uid}}
    }))?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), CHART_NS);
    let r = accounts
        .create_token_request(AGENT_SA, &PostParams::default(), &request)
        .await
        .map_err(|e| {
            anyhow!(
                "a token of {AGENT_SA} bound to pod {name}: {}",
                api_message(&e)
            )
        })?;
    Ok(r.status.context("the TokenRequest has no status")?.token)
}

/// A server-side dry run of GpuNode `name`'s apply as the agent, with `token` (a kubeconfig of
/// it in the state directory): the API server's answer.
async fn vap_try(bed: &Bed, token: &str, name: &str) -> Result<Result<(), kube::Error>> {
    let kcfg = bed.state.join("vap.kubeconfig");
    token_kubeconfig(&kcfg, AGENT_SA, token)?;
    let gpunodes: Api<GpuNode> = Api::all(client_of(&kcfg).await?);
    let pp = PatchParams::apply(mockgpu_api::gpunode::AGENT_MANAGER).dry_run();
    let g = gpunode(name, "gb300", 4, "gb300");
    Ok(gpunodes.patch(name, &pp, &Patch::Apply(&g)).await.map(drop))
}

async fn vap_allows(bed: &Bed, what: &str, token: &str, name: &str) -> Result<()> {
    if let Err(e) = vap_try(bed, token, name).await? {
        bail!(
            "{what}: writing GpuNode {name} was refused: {}",
            api_message(&e)
        );
    }
    println!("  {what}, GpuNode {name}: allowed (server dry run)");
    Ok(())
}

async fn vap_denies(bed: &Bed, what: &str, token: &str, name: &str, says: &str) -> Result<()> {
    let e = match vap_try(bed, token, name).await? {
        Ok(()) => bail!("{what}: writing GpuNode {name} was allowed"),
        Err(e) => api_message(&e),
    };
    ensure!(
        e.contains(&format!("ValidatingAdmissionPolicy '{VAP}'")),
        "{what}, GpuNode {name}: not refused by the policy {VAP}: {e}"
    );
    ensure!(
        e.contains(says),
        "{what}, GpuNode {name}: the refusal does not say {says:?}: {e}"
    );
    println!("  {what}, GpuNode {name}: denied ({says})");
    Ok(())
}

/// The probe pod and its Node gone (the agent's DaemonSet tolerates every taint, so it placed a
/// pod there too, never started).
async fn vap_down(client: &Client) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), CHART_NS);
    let lp = ListParams::default().fields(&format!("spec.nodeName={VAP_NODE}"));
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for p in pods.list(&lp).await?.items {
        if let Some(name) = p.metadata.name {
            pods.delete(&name, &now).await.ok();
        }
    }
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.delete(VAP_NODE, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(e) if api_error(&e, 404) => Ok(()),
        Err(e) => bail!("deleting node {VAP_NODE}: {}", api_message(&e)),
    }
}

/// The name of the chart's agent pod on `node` (the DaemonSet runs one on every node).
pub(crate) async fn agent_pod(client: &Client, node: &str) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), CHART_NS);
    let on = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let prefix = format!("{AGENT_DS}-");
    pods.list(&on)
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .find(|n| n.starts_with(&prefix))
        .with_context(|| format!("no pod of DaemonSet {AGENT_DS} on node {node}"))
}

/// The admission policy with real service-account tokens of the agent: the agent pod's own (bound
/// to it, so to this node), one bound to a pod on another node, and one bound to nothing.
async fn admission_policy(bed: &Bed, client: &Client) -> Result<()> {
    let agent = agent_pod(client, NODE).await?;
    let own = kubectl(&[
        "-n",
        CHART_NS,
        "exec",
        &agent,
        "-c",
        "agent",
        "--",
        "cat",
        "/var/run/secrets/kubernetes.io/serviceaccount/token",
    ])
    .context("reading the agent pod's service-account token")?;
    let own = own.trim();
    let n = token_node(own).context("the agent pod's token")?;
    ensure!(
        n == NODE,
        "the agent pod's token names node {n}, want {NODE}"
    );
    // a Node object with no kubelet; the probe pod is bound to it and tolerates its taint
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": VAP_NODE},
        "spec": {"taints": [{"key": "mockgpu.io/token-probe", "effect": "NoExecute"}]}
    }))?;
    apply(&Api::all(client.clone()), &node).await?;
    let probe: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": VAP_POD, "namespace": CHART_NS},
        "spec": {
            "serviceAccountName": AGENT_SA, "nodeName": VAP_NODE,
            "tolerations": [{"key": "mockgpu.io/token-probe", "operator": "Exists"}],
            "containers": [{"name": "probe", "image": "localhost/busybox:1", "imagePullPolicy": "Never"}]
        }
    }))?;
    let probe = apply(&Api::namespaced(client.clone(), CHART_NS), &probe).await?;
    let uid = probe.metadata.uid.unwrap_or_default();
    let other = pod_token(client, VAP_POD, &uid).await?;
    let n = token_node(&other).context("the probe pod's token")?;
    ensure!(
        n == VAP_NODE,
        "the probe pod's token names node {n}, want {VAP_NODE}"
    );
    let unbound = account_token(client, CHART_NS, AGENT_SA, 600).await?;
    let pod_own = "the agent pod's token";
    vap_allows(bed, pod_own, own, NODE).await?;
    vap_denies(
        bed,
        pod_own,
        own,
        VAP_NODE,
        &format!("the mockgpu agent on node {NODE} may write only GpuNode {NODE}, not {VAP_NODE}"),
    )
    .await?;
    let elsewhere = format!("a token bound to a pod on {VAP_NODE}");
    vap_allows(bed, &elsewhere, &other, VAP_NODE).await?;
    vap_denies(
        bed,
        &elsewhere,
        &other,
        NODE,
        &format!(
            "the mockgpu agent on node {VAP_NODE} may write only GpuNode {VAP_NODE}, not {NODE}"
        ),
    )
    .await?;
    vap_denies(
        bed,
        "a token bound to no pod",
        &unbound,
        NODE,
        "no authentication.kubernetes.io/node-name claim",
    )
    .await
}

/// Runs the README's command that starts with `prefix` (with `extra`), its output kept in
/// `<state>/<file>`; on failure, that output and the chart's pods.
async fn guide_kept(
    bed: &Bed,
    client: &Client,
    prefix: &str,
    extra: &[&str],
    file: &str,
) -> Result<String> {
    match guide(bed, prefix, extra) {
        Ok(out) => {
            std::fs::write(bed.state.join(file), &out)?;
            Ok(out)
        }
        Err(e) => {
            std::fs::write(bed.state.join(file), format!("{e:#}"))?;
            Err(anyhow!("{e:#}\n{}", chart_logs(client).await))
        }
    }
}

/// The README's `helm install` (with the test bed's images) in place of the host agent: the
/// agent's DaemonSet rolls out, its GpuNode is Ready, the controller labels the node, the device
/// plugin serves 4 GPUs (the README's `kubectl get gpunodes` and node columns show them), a pod
/// asking for 2 GPUs gets them and the driver files, `helm test` passes, and the admission policy
/// lets each agent write only its own node's GpuNode.
pub async fn chart_install(bed: &Bed) -> Result<()> {
    let client = client().await?;
    // the steps before left a host agent with the keeper it started, and objects of the same
    // names as the chart's
    bed.stop(Signal::SIGTERM, &["agent"]).await?;
    for k in host_keepers() {
        kill(Pid::from_raw(k), Signal::SIGTERM).ok();
    }
    let gone = wait_for(30, "the host agent's FUSE mount gone", || async {
        mockgpu_mounts(bed).is_ok_and(|m| m.is_empty())
    })
    .await;
    if let Err(e) = gone {
        bail!("{e:#}: the host agent left {:?}", mockgpu_mounts(bed)?);
    }
    delete_namespace(&client, CHART_NS, 120).await?;
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let roles: Api<ClusterRole> = Api::all(client.clone());
    for name in ["mockgpu-agent", "mockgpu-controller"] {
        bindings.delete(name, &DeleteParams::default()).await.ok();
        roles.delete(name, &DeleteParams::default()).await.ok();
    }
    let t = Instant::now();
    let mut extra = TB_VALUES.to_vec();
    extra.extend(["--timeout", "180s"]);
    let out = guide_kept(
        bed,
        &client,
        "helm install mockgpu ",
        &extra,
        "helm-install.txt",
    )
    .await
    .context("helm install of charts/mockgpu")?;
    bed.timing(
        "chart-install",
        &format!("{} ms (helm install --wait)", ms(t.elapsed())),
    );
    ensure!(
        out.contains("kubectl get gpunodes"),
        "helm install printed no NOTES (what to check next): {out}"
    );
    let sets = Api::namespaced(client.clone(), CHART_NS);
    let what = "the agent DaemonSet to roll out";
    if let Err(e) = wait_object(&sets, AGENT_DS, 60, what, daemonset_rolled_out).await {
        bail!("{e:#}\n{}", chart_logs(&client).await);
    }
    let gpunodes: Api<GpuNode> = Api::all(client.clone());
    let g = match wait_object(&gpunodes, NODE, 60, &format!("GpuNode {NODE} Ready"), ready).await {
        Ok(g) => g,
        Err(e) => bail!(
            "no Ready GpuNode from the chart's agent: {e:#}\n{}",
            pods_report(&client, CHART_NS, "app.kubernetes.io/component=agent", 20).await
        ),
    };
    for l in guide(bed, "kubectl get gpunodes", &[])?.lines() {
        println!("  {l}");
    }
    let spec = serde_json::to_value(&g.spec)?;
    let got = format!(
        "{}/{}/{}",
        spec["mode"].as_str().unwrap_or_default(),
        spec["profile"].as_str().unwrap_or_default(),
        spec["gpuCount"]
    );
    ensure!(
        got == "mock/gb300/4",
        "GpuNode {NODE} spec mode/profile/gpuCount: {got}, want mock/gb300/4"
    );
    let nodes: Api<Node> = Api::all(client.clone());
    let what = format!("label {PCI_LABEL}=true");
    let labelled = |n: Option<&Node>| label(n, PCI_LABEL) == "true";
    if let Err(e) = wait_object(&nodes, NODE, 60, &what, labelled).await {
        bail!(
            "the controller did not label the node: {e:#}\n{}",
            pods_report(
                &client,
                CHART_NS,
                "app.kubernetes.io/component=controller",
                20
            )
            .await
        );
    }
    let four = allocatable_is("4");
    let what = format!("allocatable {RES} = 4 with the chart's agent");
    let node = wait_object(&nodes, NODE, 60, &what, four).await?;
    // the workers' too: `helm test`'s doctor may run on any of them and checks its node's
    for name in bed_nodes()?.iter().filter(|n| *n != NODE) {
        wait_object(&nodes, name, 60, &format!("{name}: {what}"), four).await?;
    }
    let cols = guide(bed, "kubectl get nodes -o custom-columns", &[])
        .context("the README's kubectl get nodes")?;
    for l in cols.lines() {
        println!("  {l}");
    }
    let row = cols
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.first() == Some(&NODE));
    ensure!(
        row.as_ref()
            .is_some_and(|f| f.get(1..3) == Some(&["4", "true"][..])),
        "the README's node columns: want {NODE} 4 true, got:\n{cols}"
    );
    let labels: Vec<String> = node
        .metadata
        .labels
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.contains("mockgpu") || k.contains("nvidia") || k.contains("pci-10de"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!("  labels: {}", labels.join(" "));
    // the user's path: a pod asking for GPUs gets them and the driver files
    let ns = "chart-jobs";
    create_namespace(&client, ns).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &gpu_pod("gpu-2", ns, 2)?)
        .await?;
    if let Err(e) = wait_object(&pods, "gpu-2", 120, "gpu-2 (2 GPUs) Ready", pod_ready()).await {
        bail!(
            "a pod with 2 GPUs did not start: {e:#}\n{}",
            pods_report(&client, ns, "", 20).await
        );
    }
    let (out, rc) = kubectl_exec(ns, "gpu-2", &["ls", "/proc/driver/nvidia/gpus"])?;
    let gpus = out.lines().count();
    ensure!(
        rc == 0 && gpus == 4,
        "the pod with 2 GPUs sees {gpus} GPUs in /proc/driver/nvidia/gpus (exit {rc}), want the node's 4"
    );
    Api::<Namespace>::all(client.clone())
        .delete(ns, &DeleteParams::default())
        .await?;
    let t = Instant::now();
    let out = guide_kept(bed, &client, "helm test mockgpu ", &[], "helm-test.txt")
        .await
        .context("helm test (mockgpu-agent doctor)")?;
    bed.timing("chart-helm-test", &format!("{} ms", ms(t.elapsed())));
    for l in out.lines().skip_while(|l| !l.contains("POD LOGS")).take(30) {
        println!("  {l}");
    }
    let r = admission_policy(bed, &client).await;
    let d = vap_down(&client).await;
    r.and(d)
}

/// `reason count; ...` of the GpuNode's events.
fn event_counts(reasons: &[String]) -> String {
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for r in reasons {
        *counts.entry(r).or_default() += 1;
    }
    counts
        .iter()
        .map(|(r, n)| format!("{r} {n}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Whether a line is `GPU <0-3>: NVIDIA GB300 (UUID: GPU-<hex and ->)`.
fn gb300_line(l: &str) -> bool {
    let Some(rest) = l.strip_prefix("GPU ") else {
        return false;
    };
    let Some((i, rest)) = rest.split_once(": NVIDIA GB300 (UUID: GPU-") else {
        return false;
    };
    matches!(i, "0" | "1" | "2" | "3")
        && rest.strip_suffix(')').is_some_and(|u| {
            !u.is_empty()
                && u.bytes()
                    .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f' | b'-'))
        })
}

/// The GpuNode's events: each reason as many times as it was counted.
async fn gpunode_events_of(client: &Client, node: &str) -> Result<Vec<String>> {
    let events: Api<Event> = Api::all(client.clone());
    let lp = ListParams::default().fields(&format!(
        "involvedObject.kind=GpuNode,involvedObject.name={node}"
    ));
    let mut out = Vec::new();
    for e in events.list(&lp).await?.items {
        let n = e.count.unwrap_or(1).max(1);
        if let Some(r) = e.reason {
            out.extend(std::iter::repeat_n(r, n as usize));
        }
    }
    Ok(out)
}

/// The test bed's nodes (`NODES`): node0, node1, ...
fn bed_nodes() -> Result<Vec<String>> {
    let n: usize = std::env::var("NODES")
        .unwrap_or_else(|_| "1".into())
        .parse()
        .context("$NODES")?;
    Ok((0..n.max(1)).map(|i| format!("node{i}")).collect())
}

/// `type=status` of the GpuNode's conditions.
async fn conditions_of(gpunodes: &Api<GpuNode>, node: &str) -> Result<Vec<String>> {
    Ok(gpunodes
        .get(node)
        .await?
        .status
        .map(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .map(|c| format!("{}={}", c.type_, c.status))
        .collect())
}

/// Slinky on the chart's agent and controller, on every node of the test bed (the chart's agent
/// runs on each, node1's tolerating Slinky's worker taint), then the README's profile change by
/// `helm upgrade` with remediation on: the controller sees the slurmd pods predate the new
/// topology (Drifted), deletes the nodes' Slurm records through slurmrestd and the pods, and the
/// recreated pods' slurmd register the new GPUs.
pub async fn chart_slinky_remediation(bed: &Bed) -> Result<()> {
    let client = client().await?;
    // the chart's controller labels the nodes; the step does not
    let nodes: Api<Node> = Api::all(client.clone());
    for name in bed_nodes()? {
        let what = format!("the chart's controller to label {name} {PCI_LABEL}=true");
        let labelled = |n: Option<&Node>| label(n, PCI_LABEL) == "true";
        wait_object(&nodes, &name, 60, &what, labelled).await?;
    }
    // Slinky stays for chart-slinky-gpu-drain, which takes it down
    remediation(bed, &client).await
}

async fn remediation(bed: &Bed, client: &Client) -> Result<()> {
    let names = bed_nodes()?;
    let labelled = slinky::labelled_nodes(client).await?;
    ensure!(
        labelled == names,
        "the nodes labelled {PCI_LABEL}=true are {labelled:?}, want {names:?}"
    );
    // the chart's agent on each node: a GpuNode of its own, with GPUs of its own
    let gpunodes: Api<GpuNode> = Api::all(client.clone());
    let mut seen: Vec<String> = Vec::new();
    for name in &names {
        let g = wait_object(
            &gpunodes,
            name,
            60,
            &format!("the chart's agent's GpuNode {name}"),
            |g: Option<&GpuNode>| g.is_some_and(|g| g.spec.gpu_count == 4),
        )
        .await?;
        let uuids: Vec<String> = g.spec.gpus.iter().map(|g| g.uuid.clone()).collect();
        ensure!(
            uuids.len() == 4 && uuids.iter().all(|u| !seen.contains(u)),
            "GpuNode {name}'s GPUs {uuids:?}: want 4, none of another node's ({seen:?})"
        );
        println!("  GpuNode {name}: {}", uuids.join(" "));
        seen.extend(uuids);
    }
    slinky::controller_up(client, bed, "nvidia", false, "").await?;
    slinky::restapi_up(client).await?;
    let took = slinky::nodeset_up(client, &names, false, None).await?;
    bed.timing(
        "chart-slinky-slurmd-idle",
        &format!("{} ms ({} nodes)", ms(took), names.len()),
    );
    let sockets = gres_sockets(bed)?;
    ensure!(!sockets.is_empty(), "no socket found for the served GPUs");
    let gres = format!("gpu:nvidia_gb300:4(S:{sockets})");
    let want = names
        .iter()
        .map(|n| format!("{n} idle {gres}"))
        .collect::<Vec<_>>()
        .join("\n");
    let s = slinky::sinfo()?;
    slinky::check(client, s == want, || format!("sinfo: {s:?}, want {want:?}")).await?;
    println!("  sinfo -N -o '%N %T %G': {}", s.replace('\n', "; "));
    // a job on every node, each with its four GPUs
    let n = names.len().to_string();
    let out = match slinky::ctld(&[
        "timeout",
        "60",
        "srun",
        "-D",
        "/",
        "-N",
        &n,
        "--gres=gpu:4",
        "sh",
        "-c",
        r#"echo "$(hostname) $(ls /proc/driver/nvidia/gpus | wc -l) $CUDA_VISIBLE_DEVICES""#,
    ]) {
        Ok(s) => s,
        Err(e) => return Err(slinky::with_logs(client, e.context("srun -N on every node")).await),
    };
    let mut got: Vec<&str> = out.lines().collect();
    got.sort_unstable();
    let want: Vec<String> = names.iter().map(|n| format!("{n} 4 0,1,2,3")).collect();
    ensure!(
        got == want,
        "srun -N{n} --gres=gpu:4 (hostname, GPUs in /proc/driver/nvidia/gpus, CUDA_VISIBLE_DEVICES): want {want:?}, got {got:?}"
    );
    println!("  srun -N{n} --gres=gpu:4: {}", got.join("; "));
    let cuda = match srun_cuda_visible() {
        Ok(c) => c,
        Err(e) => return Err(slinky::with_logs(client, e).await),
    };
    ensure!(
        cuda == "CUDA_VISIBLE_DEVICES=0,1",
        "srun --gres=gpu:2 on the chart's agent: {cuda}, want CUDA_VISIBLE_DEVICES=0,1"
    );
    println!("  srun -w {NODE} --gres=gpu:2: {cuda}");
    // the README's verification: nvidia-smi in the job, through the libnvidia-ml.so.1 the NRI
    // plugin bound into the slurmd container; without ConstrainDevices (Slinky's default
    // cgroup.conf) a job sees all four GPUs, as on a real node, with the driver files' UUIDs (the
    // node test bed's constrain-devices step confines jobs). The job runs as slurm (401), the
    // user of slurmctld's pod.
    let smi = match srun(&[
        "--gres=gpu:2",
        "bash",
        "-c",
        r#"echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; nvidia-smi -L; id -u"#,
    ]) {
        Ok(s) => s,
        Err(e) => return Err(slinky::with_logs(client, e.context("srun nvidia-smi -L")).await),
    };
    for l in smi.lines() {
        println!("  srun nvidia-smi -L; id -u: {l}");
    }
    ensure!(
        smi.lines().next() == Some("CUDA_VISIBLE_DEVICES=0,1"),
        "the README's srun: want CUDA_VISIBLE_DEVICES=0,1 first, got:\n{smi}"
    );
    let uid = std::env::var("SLURM_UID").context("$SLURM_UID")?;
    ensure!(
        smi.lines().last() == Some(uid.as_str()),
        "the README's srun ran as uid {:?}, want slurm ({uid})",
        smi.lines().last()
    );
    let n = smi.lines().filter(|l| gb300_line(l)).count();
    ensure!(
        n == 4,
        "srun nvidia-smi -L: {n} NVIDIA GB300 lines, want 4:\n{smi}"
    );
    let files = srun(&[
        "sh",
        "-c",
        r#"sed -n "s/^GPU UUID:[[:space:]]*//p" /proc/driver/nvidia/gpus/*/information"#,
    ])?;
    let mut want: Vec<String> = files.lines().map(str::to_owned).collect();
    want.sort();
    let mut got = uuids_in(&smi);
    got.sort();
    ensure!(
        got == want,
        "nvidia-smi -L's UUIDs {got:?} are not the driver files' {want:?}"
    );
    recreated_same_gpus(client, &gpunodes, &names, &gres).await?;
    let mut uids0 = Vec::new();
    for name in &names {
        uids0.push(slinky::slurmd_pod_on(client, name).await?.metadata.uid);
    }
    // the README's token Secret and profile change, slurmrestd by its Service's name
    guide(
        bed,
        "kubectl -n mockgpu-system create secret generic slurm-token",
        &[],
    )
    .context("the README's slurm-token Secret")?;
    let url = readme_line("helm upgrade mockgpu ")?;
    ensure!(
        url.contains("controller.remediation.slurmrestdUrl=http://slurm-restapi.slurm:6820 "),
        "the README's helm upgrade does not name slurmrestd's Service: {url}"
    );
    let t = Instant::now();
    guide_kept(
        bed,
        client,
        "helm upgrade mockgpu ",
        &["--timeout", "120s"],
        "helm-upgrade.txt",
    )
    .await
    .context("helm upgrade (profile gb200, remediation on)")?;
    bed.timing(
        "chart-upgrade",
        &format!("{} ms (helm upgrade --wait)", ms(t.elapsed())),
    );
    let gb200 = |g: Option<&GpuNode>| g.is_some_and(|g| g.spec.profile == "gb200");
    for name in &names {
        wait_object(
            &gpunodes,
            name,
            60,
            &format!("GpuNode {name} with profile gb200"),
            gb200,
        )
        .await?;
    }
    let remediated = wait_for(
        120,
        &format!("the controller's remediation of {names:?} (events SlurmNodeDeleted, PodDeleted)"),
        || async {
            let mut all = true;
            for name in &names {
                all &= gpunode_events_of(client, name).await.is_ok_and(|r| {
                    r.iter().any(|r| r == "SlurmNodeDeleted") && r.iter().any(|r| r == "PodDeleted")
                });
            }
            all
        },
    )
    .await;
    if let Err(e) = remediated {
        let mut s = String::new();
        for name in &names {
            let events = gpunode_events_of(client, name).await?;
            let conditions = conditions_of(&gpunodes, name).await?;
            s.push_str(&format!(
                "GpuNode {name}'s events: {}; its conditions: {}\n",
                event_counts(&events),
                conditions.join(" ")
            ));
        }
        bail!(
            "no remediation after the profile change: {e:#}\n{s}{}",
            pods_report(
                client,
                CHART_NS,
                "app.kubernetes.io/component=controller",
                20
            )
            .await
        );
    }
    for name in &names {
        let events = gpunode_events_of(client, name).await?;
        println!("  GpuNode {name}'s events: {}", event_counts(&events));
        ensure!(
            events.iter().any(|r| r == "Drifted"),
            "GpuNode {name}: no Drifted event before the remediation: {}",
            event_counts(&events)
        );
    }
    let sockets = gres_sockets(bed)?;
    ensure!(!sockets.is_empty(), "no socket found for the served GPUs");
    slinky::wait_gres(
        client,
        120,
        &names,
        &format!("gpu:nvidia_gb200:4(S:{sockets})"),
    )
    .await
    .context("Slurm did not take the new GPUs")?;
    bed.timing(
        "chart-remediated",
        &format!(
            "{} ms from helm upgrade to slurmd idle with the new GPUs ({} nodes)",
            ms(t.elapsed()),
            names.len()
        ),
    );
    for (name, uid0) in names.iter().zip(&uids0) {
        let uid = slinky::slurmd_pod_on(client, name).await?.metadata.uid;
        ensure!(
            uid.is_some() && uid != *uid0,
            "the slurmd pod on {name} was not recreated (uid {uid:?}, was {uid0:?})"
        );
    }
    let cuda = match srun_cuda_visible() {
        Ok(c) => c,
        Err(e) => {
            let e = e.context("srun --gres=gpu:2 after the remediation");
            return Err(slinky::with_logs(client, e).await);
        }
    };
    ensure!(
        cuda == "CUDA_VISIBLE_DEVICES=0,1",
        "srun --gres=gpu:2 after the remediation: {cuda}"
    );
    let models = srun(&[
        "sh",
        "-c",
        r#"grep -h "^Model:" /proc/driver/nvidia/gpus/*/information"#,
    ])
    .context("srun reading the GPUs' information")?;
    let gb200 = models
        .lines()
        .filter(|l| l.strip_prefix("Model:").map(str::trim) == Some("NVIDIA GB200"))
        .count();
    ensure!(
        gb200 == 4 && models.lines().count() == 4,
        "the job sees, want 4 NVIDIA GB200:\n{models}"
    );
    let sinfo = guide(
        bed,
        "kubectl -n slurm exec slurm-controller-0 -c slurmctld -- sinfo",
        &[],
    )?;
    println!(
        "  after helm upgrade: {}; slurmd pods recreated; srun --gres=gpu:2: {cuda}; the job: 4 x NVIDIA GB200",
        sinfo.lines().skip(1).collect::<Vec<_>>().join("; ")
    );
    for name in &names {
        let conditions = conditions_of(&gpunodes, name).await?;
        println!("  GpuNode {name}'s conditions: {}", conditions.join(" "));
    }
    Ok(())
}

/// A slurmd pod deleted (the last node's) comes back on its node, its slurmd registers again
/// (a new SlurmdStartTime); the node is down with the operator's preStop reason until resumed,
/// then idle with the same GPUs, and the controller sees no drift: no new Drifted event on the
/// GpuNode, no Drifted condition.
async fn recreated_same_gpus(
    client: &Client,
    gpunodes: &Api<GpuNode>,
    names: &[String],
    gres: &str,
) -> Result<()> {
    let node = names.last().context("no node")?;
    let start = |s: &str| {
        s.split_whitespace()
            .find_map(|w| w.strip_prefix("SlurmdStartTime="))
            .map(str::to_owned)
    };
    let before = start(&slinky::ctld(&["scontrol", "show", "node", node])?);
    let drifted = |e: &[String]| e.iter().filter(|r| *r == "Drifted").count();
    let drifted0 = drifted(&gpunode_events_of(client, node).await?);
    let pod = slinky::slurmd_pod_on(client, node).await?;
    let (name, uid0) = (
        pod.metadata.name.clone().unwrap_or_default(),
        pod.metadata.uid.clone(),
    );
    let t = Instant::now();
    let pods: Api<Pod> = Api::namespaced(client.clone(), slinky::SLINKY_NS);
    pods.delete(&name, &DeleteParams::default()).await?;
    let back = wait_for(
        90,
        &format!("a new slurmd pod on {node}, Ready"),
        || async {
            slinky::slurmd_pod_on(client, node).await.is_ok_and(|p| {
                p.metadata.uid != uid0
                    && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str())
                    && kube::runtime::wait::Condition::matches_object(&pod_ready(), Some(&p))
            })
        },
    )
    .await;
    if let Err(e) = back {
        return Err(slinky::with_logs(client, e).await);
    }
    let again = wait_for(
        60,
        &format!("slurmd on {node} to register again"),
        || async {
            slinky::ctld(&["scontrol", "show", "node", node])
                .is_ok_and(|s| start(&s).is_some() && start(&s) != before)
        },
    )
    .await;
    if let Err(e) = again {
        return Err(slinky::with_logs(client, e).await);
    }
    // the operator's preStop took the node down before slurmd stopped, and a registration does
    // not bring a node an administrator set down back (ReturnToService): something must resume
    // it, as an administrator would (the test bed has no operator to do it)
    let show = slinky::ctld(&["scontrol", "show", "node", node])?;
    let state = show
        .split_whitespace()
        .find_map(|w| w.strip_prefix("State="))
        .unwrap_or_default()
        .to_owned();
    // (Reason=<text with spaces> [<user>@<time>], a line of its own)
    let reason = show
        .lines()
        .find_map(|l| l.trim().strip_prefix("Reason="))
        .unwrap_or_default()
        .to_owned();
    slinky::check(
        client,
        state.starts_with("DOWN") && reason.starts_with("slurm-operator: Pod is terminating"),
        || format!("{node} after its slurmd pod's preStop: State={state} Reason={reason}, want DOWN with the preStop's reason"),
    )
    .await?;
    slinky::ctld(&[
        "scontrol",
        "update",
        &format!("nodename={node}"),
        "state=resume",
    ])?;
    slinky::wait_gres(client, 60, names, gres).await?;
    let events = gpunode_events_of(client, node).await?;
    let conditions = conditions_of(gpunodes, node).await?;
    ensure!(
        drifted(&events) == drifted0 && !conditions.iter().any(|c| c == "Drifted=True"),
        "GpuNode {node} after its slurmd pod was recreated: Drifted events {} (were {drifted0}), conditions {}",
        drifted(&events),
        conditions.join(" ")
    );
    println!(
        "  slurmd pod {name} on {node} deleted: recreated and registered again ({state}, {reason:?} after the preStop; resumed) in {} ms, {node} idle {gres}; no Drifted (conditions: {})",
        ms(t.elapsed()),
        conditions.join(" ")
    );
    Ok(())
}

/// Character devices below a directory.
fn char_devices(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            out.extend(char_devices(&e.path()));
        } else if ft.is_char_device() {
            out.push(e.path().display().to_string());
        }
    }
    out
}

/// The README's `helm uninstall` leaves no FUSE mount, device node or label behind.
pub async fn chart_uninstall(bed: &Bed) -> Result<()> {
    let client = client().await?;
    for (m, _) in mounts(bed.node_pid()?)? {
        if m.starts_with("/run/mockgpu") {
            println!("  mount before uninstall: {m}");
        }
    }
    let t = Instant::now();
    guide(bed, "helm uninstall mockgpu ", &["--timeout", "180s"]).context("helm uninstall")?;
    bed.timing("chart-uninstall", &format!("{} ms", ms(t.elapsed())));
    let gone = wait_for(60, "no mockgpu FUSE mount in the node", || async {
        mockgpu_mounts(bed).is_ok_and(|m| m.is_empty())
    })
    .await;
    if let Err(e) = gone {
        bail!("{e:#}: helm uninstall left {:?}", mockgpu_mounts(bed)?);
    }
    let devices = char_devices(&bed.node_path("/run/mockgpu"));
    ensure!(
        devices.is_empty(),
        "helm uninstall left device nodes: {devices:?}"
    );
    let nodes: Api<Node> = Api::all(client);
    let node = nodes.get(NODE).await?;
    for k in CHART_LABELS {
        let v = label(Some(&node), k);
        ensure!(v.is_empty(), "helm uninstall left the label {k}={v}");
    }
    println!(
        "  uninstalled: no FUSE mount, no device node under /run/mockgpu, no mockgpu label on {NODE}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::TB_VALUES;
    use crate::services::{HEARTBEAT_S, STALE_S};

    #[test]
    fn the_install_sets_the_heartbeat_and_staleness_worker_leaves_waits_for() {
        for want in [
            format!("agent.heartbeatSeconds={HEARTBEAT_S}"),
            format!("controller.staleAfterSeconds={STALE_S}"),
        ] {
            assert!(
                TB_VALUES.contains(&want.as_str()),
                "{want} not in {TB_VALUES:?}"
            );
        }
    }
}
