//! The cluster mode's scenarios (`CLUSTER=1`): the real API server, scheduler and kubelet of the
//! node, through typed objects (kube, k8s-openapi) and waits on their conditions. The scenarios
//! binary runs in the node's network namespace, where the API server listens.

use std::collections::BTreeMap;
use std::fmt::{Debug, Write as _};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, LogParams, Patch, PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{Condition, await_condition, conditions};
use kube::{Api, Client, Config, Resource};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::bed::{Bed, wait_for};
use crate::node::write_profile;

/// The test bed's Kubernetes node (and Slurm node).
pub(crate) const NODE: &str = "node0";
/// The resource the agent's device plugin serves.
pub(crate) const RES: &str = "nvidia.com/gpu";
/// A namespace of GPU pods the agent does not trust (`--trusted-namespaces default`).
pub(crate) const GPU_NS: &str = "gpu-jobs";
/// The device plugin's pods' namespace (one the agent does not trust).
pub(crate) const DP_NS: &str = "dp-jobs";

/// The API server, as the test bed's admin.
pub async fn client() -> Result<Client> {
    let path = std::env::var("KUBECONFIG").context("$KUBECONFIG is not set (cluster mode only)")?;
    client_of(path.as_ref()).await
}

/// Waits up to `secs` for the named object to meet `cond`; on timeout an error naming `what`,
/// with the object's status as it was then.
pub(crate) async fn wait_object<K>(
    api: &Api<K>,
    name: &str,
    secs: u64,
    what: &str,
    cond: impl Condition<K>,
) -> Result<K>
where
    K: Clone + Debug + Send + DeserializeOwned + Resource + serde::Serialize + 'static,
{
    match tokio::time::timeout(
        Duration::from_secs(secs),
        await_condition(api.clone(), name, cond),
    )
    .await
    {
        Ok(Ok(Some(k))) => Ok(k),
        Ok(Ok(None)) => bail!("{what}: {name} was deleted"),
        Ok(Err(e)) => Err(e).with_context(|| format!("watching {name} for {what}")),
        Err(_) => {
            let now = api.get_opt(name).await.ok().flatten();
            let status = now
                .and_then(|k| serde_json::to_value(k).ok())
                .and_then(|v| v.get("status").cloned())
                .unwrap_or_default();
            bail!("timed out after {secs} s waiting for {what}; {name}'s status: {status:#}")
        }
    }
}

/// A condition of a node: `type` with `status`.
pub(crate) fn node_condition(kind: &'static str, status: &'static str) -> impl Condition<Node> {
    move |n: Option<&Node>| {
        n.and_then(|n| n.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == kind && c.status == status))
    }
}

fn quantity(q: Option<&BTreeMap<String, Quantity>>) -> Option<String> {
    q.and_then(|m| m.get(RES)).map(|q| q.0.clone())
}

/// The node's allocatable GPUs (`nvidia.com/gpu`).
pub(crate) fn allocatable(n: Option<&Node>) -> Option<String> {
    quantity(
        n.and_then(|n| n.status.as_ref())
            .and_then(|s| s.allocatable.as_ref()),
    )
}

/// The node's allocatable GPUs (`nvidia.com/gpu`) are `count`.
pub(crate) fn allocatable_is(count: &'static str) -> impl Condition<Node> + Copy {
    move |n: Option<&Node>| allocatable(n).as_deref() == Some(count)
}

/// The node becomes Ready, with the kubelet of the version built.
pub async fn node_ready(bed: &Bed) -> Result<()> {
    let nodes: Api<Node> = Api::all(client().await?);
    let t = Instant::now();
    let node = wait_object(
        &nodes,
        NODE,
        120,
        "the node to be Ready",
        node_condition("Ready", "True"),
    )
    .await?;
    bed.timing(
        "node-ready",
        &format!("{} ms after registration", t.elapsed().as_millis()),
    );
    let info = node
        .status
        .and_then(|s| s.node_info)
        .context("the node has no nodeInfo")?;
    let want = std::env::var("K8S_VERSION").context("$K8S_VERSION")?;
    ensure!(
        info.kubelet_version == want,
        "kubelet version {}, want {want}",
        info.kubelet_version
    );
    println!(
        "  kubelet {}, container runtime: {}",
        info.kubelet_version, info.container_runtime_version
    );
    Ok(())
}

/// A pod that sleeps (`sleep` as PID 1 ignores SIGTERM: a grace period of 1 s, not the default 30
/// waited out at every delete).
pub(crate) fn sleeper(
    name: &str,
    namespace: &str,
    image: &str,
    extra: serde_json::Value,
) -> Result<Pod> {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": image, "imagePullPolicy": "Never",
                "command": ["/bin/sleep", "infinity"]}]
        }
    });
    if let (Some(c), Some(extra)) = (pod.pointer_mut("/spec/containers/0"), extra.as_object()) {
        for (k, v) in extra {
            c[k] = v.clone();
        }
    }
    Ok(serde_json::from_value(pod)?)
}

/// The test bed's kubectl as its admin, with `args`.
pub(crate) fn kubectl_command(args: &[&str]) -> Result<std::process::Command> {
    let kubectl = std::env::var("KUBECTL").context("$KUBECTL")?;
    let kcfg = std::env::var("KUBECONFIG").context("$KUBECONFIG")?;
    let mut c = std::process::Command::new(kubectl);
    c.args(["--kubeconfig", &kcfg, "--request-timeout=30s"])
        .args(args);
    Ok(c)
}

/// kubectl's output, where what a user sees is the point (printer columns); an error with its
/// standard error when it fails.
pub(crate) fn kubectl(args: &[&str]) -> Result<String> {
    let out = kubectl_command(args)?.output().context("kubectl")?;
    ensure!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Helm's state (cache, config, data) under the test bed's state directory.
fn helm_state(bed: &Bed, c: &mut std::process::Command) {
    let home = bed.state.join("helm");
    c.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
}

/// Helm against the test bed's API server, with its state (cache, config, data) under the test
/// bed's state directory; its output, or an error with its standard error.
pub(crate) fn helm(bed: &Bed, args: &[&str]) -> Result<String> {
    let helm = std::env::var("HELM").context("$HELM")?;
    let kcfg = std::env::var("KUBECONFIG").context("$KUBECONFIG")?;
    let mut c = std::process::Command::new(&helm);
    helm_state(bed, &mut c);
    let out = c
        .args(["--kubeconfig", &kcfg])
        .args(args)
        .output()
        .with_context(|| helm.clone())?;
    ensure!(
        out.status.success(),
        "helm {args:?}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The README's first line that starts with `prefix`: the test bed runs the guide's commands as
/// the README writes them.
pub(crate) fn readme_line(prefix: &str) -> Result<String> {
    let repo = std::env::var("REPO").context("$REPO")?;
    let path = std::path::Path::new(&repo).join("README.md");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    text.lines()
        .find(|l| l.starts_with(prefix))
        .map(str::to_owned)
        .with_context(|| format!("README.md has no command line starting with {prefix:?}"))
}

/// The README's command line that starts with `prefix`, with `extra` arguments, as a shell runs
/// it from the repository root (its quoting, its `$(...)`), `helm` and `kubectl` being the test
/// bed's (its API server, helm's state under the state directory): its standard output (and
/// standard error), or an error with both.
pub(crate) fn guide(bed: &Bed, prefix: &str, extra: &[&str]) -> Result<String> {
    let line = readme_line(prefix)?;
    let first = line.split_whitespace().next().unwrap_or_default();
    ensure!(
        matches!(first, "helm" | "kubectl"),
        "README.md: {first:?} is not a command the test bed runs ({line})"
    );
    for v in ["HELM", "KUBECTL", "KUBECONFIG"] {
        std::env::var(v).with_context(|| format!("${v}"))?;
    }
    let script = r#"helm() { "$HELM" --kubeconfig "$KUBECONFIG" "$@"; }
kubectl() { "$KUBECTL" --kubeconfig "$KUBECONFIG" --request-timeout=30s "$@"; }
eval "$MGTB_LINE"' "$@"'"#;
    let mut c = std::process::Command::new("bash");
    helm_state(bed, &mut c);
    let out = c
        .current_dir(std::env::var("REPO").context("$REPO")?)
        .env("MGTB_LINE", &line)
        .args(["-euo", "pipefail", "-c", script, "bash"])
        .args(extra)
        .output()
        .context("bash")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        out.status.success(),
        "the README's `{line}` {extra:?}: {}:\n{}",
        out.status,
        text.trim_end()
    );
    Ok(text)
}

/// A pod of the slurmd image given `gpus` GPUs by the device plugin (`limits: nvidia.com/gpu`).
pub(crate) fn gpu_pod(name: &str, namespace: &str, gpus: u32) -> Result<Pod> {
    let limits = json!({"resources": {"limits": {RES: gpus.to_string()}}});
    sleeper(name, namespace, "localhost/slurmd:1", limits)
}

/// `kubectl exec` through the API server, the kubelet and the runtime: output and exit code.
pub(crate) fn kubectl_exec(namespace: &str, pod: &str, cmd: &[&str]) -> Result<(String, i32)> {
    let mut c = kubectl_command(&["-n", namespace, "exec", pod, "--"])?;
    let out = c.args(cmd).output().context("kubectl exec")?;
    Ok((
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.status.code().unwrap_or(-1),
    ))
}

/// All of the pod's containers are ready.
pub(crate) fn pod_ready() -> impl Condition<Pod> {
    |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    }
}

/// Creates a namespace and waits for its default service account.
pub(crate) async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    let ns: Namespace = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    )?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    default_account(client, name).await
}

/// A label of a node (empty when it has none).
pub(crate) fn label(n: Option<&Node>, key: &str) -> String {
    n.and_then(|n| n.metadata.labels.as_ref())
        .and_then(|l| l.get(key))
        .cloned()
        .unwrap_or_default()
}

/// Deletes a namespace (if there is one) and waits up to `secs` for it to be gone.
pub(crate) async fn delete_namespace(client: &Client, name: &str, secs: u64) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(e) if api_error(&e, 404) => return Ok(()),
        Err(e) => bail!("deleting namespace {name}: {}", api_message(&e)),
    }
    let what = format!("namespace {name} to be deleted");
    wait_deleted(&namespaces, name, secs, &what).await
}

/// Applies `obj` server-side as the test bed (field manager `mgtb`, forced).
pub(crate) async fn apply<K>(api: &Api<K>, obj: &K) -> Result<K>
where
    K: Clone + Debug + DeserializeOwned + Resource + serde::Serialize,
    K::DynamicType: Default,
{
    let name = obj
        .meta()
        .name
        .clone()
        .context("an object without a name")?;
    api.patch(
        &name,
        &PatchParams::apply(TB_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "applying {} {name}: {}",
            K::kind(&Default::default()),
            api_message(&e)
        )
    })
}

/// Whether a DaemonSet is rolled out (`kubectl rollout status`): its generation observed, every
/// scheduled pod updated and ready, and at least one.
pub(crate) fn daemonset_rolled_out(d: Option<&DaemonSet>) -> bool {
    let Some(d) = d else { return false };
    let generation = d.metadata.generation.unwrap_or_default();
    d.status.as_ref().is_some_and(|s| {
        s.observed_generation.unwrap_or_default() >= generation
            && s.desired_number_scheduled > 0
            && s.updated_number_scheduled.unwrap_or_default() == s.desired_number_scheduled
            && s.number_ready == s.desired_number_scheduled
    })
}

/// What explains a pod's trouble, for a failure: per pod of `namespace` matching `selector` (all
/// when empty), its phase and the conditions not True, its events, and the last `n` log lines of
/// each container (and of its previous run, after a restart).
pub(crate) async fn pods_report(
    client: &Client,
    namespace: &str,
    selector: &str,
    n: i64,
) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let list = match pods.list(&ListParams::default().labels(selector)).await {
        Ok(l) => l.items,
        Err(e) => return format!("--- pods of {namespace}: {e}\n"),
    };
    let mut out = format!("--- pods of {namespace} ({selector:?}): {}\n", list.len());
    for p in list {
        let name = p.metadata.name.clone().unwrap_or_default();
        let status = p.status.clone().unwrap_or_default();
        let conds: Vec<String> = status
            .conditions
            .iter()
            .flatten()
            .filter(|c| c.status != "True")
            .map(|c| {
                format!(
                    "{}={} {}",
                    c.type_,
                    c.status,
                    c.message.as_deref().unwrap_or_default()
                )
            })
            .collect();
        writeln!(
            out,
            "--- pod {name}: {} on {} ip {}; {}",
            status.phase.as_deref().unwrap_or("?"),
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or("-"),
            status.pod_ip.as_deref().unwrap_or("-"),
            conds.join("; ")
        )
        .ok();
        let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
        for e in events.list(&lp).await.map(|l| l.items).unwrap_or_default() {
            writeln!(
                out,
                "  event {} {}: {}",
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
            .ok();
        }
        let spec = p.spec.unwrap_or_default();
        let names = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .map(|c| c.name.clone());
        for c in names {
            for previous in [false, true] {
                let lp = LogParams {
                    container: Some(c.clone()),
                    tail_lines: Some(n),
                    previous,
                    ..LogParams::default()
                };
                match pods.logs(&name, &lp).await {
                    Ok(l) if !l.is_empty() => {
                        let when = if previous {
                            " (before its restart)"
                        } else {
                            ""
                        };
                        for line in l.lines() {
                            writeln!(out, "  {name}/{c}{when}: {line}").ok();
                        }
                    }
                    Ok(_) => {}
                    Err(e) if !previous => writeln!(out, "  {name}/{c}: no log: {e}").unwrap_or(()),
                    Err(_) => {}
                }
            }
        }
    }
    out
}

/// Waits for a namespace's default service account (pods cannot be created before it).
pub(crate) async fn default_account(client: &Client, namespace: &str) -> Result<()> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let what = format!("the default service account in {namespace}");
    wait_for(60, &what, || async {
        accounts.get_opt("default").await.is_ok_and(|a| a.is_some())
    })
    .await
}

/// A pod on the pod network and a host-network DaemonSet run; `kubectl exec` relays output and
/// exit code.
pub async fn pod_daemonset_exec(bed: &Bed) -> Result<()> {
    let client = client().await?;
    default_account(&client, "default").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let sets: Api<DaemonSet> = Api::namespaced(client.clone(), "default");
    let pod = sleeper("podnet", "default", "localhost/busybox:1", json!({}))?;
    pods.create(&PostParams::default(), &pod).await?;
    let template = sleeper("hostds", "default", "localhost/busybox:1", json!({}))?;
    let ds: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "hostds", "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": {"app": "hostds"}},
            "template": {"metadata": {"labels": {"app": "hostds"}},
                "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 1,
                    "containers": template.spec.map(|s| s.containers).unwrap_or_default()}}
        }
    }))?;
    sets.create(&PostParams::default(), &ds).await?;
    let t = Instant::now();
    let ready = wait_object(
        &pods,
        "podnet",
        120,
        "podnet to be running",
        conditions::is_pod_running(),
    )
    .await?;
    bed.timing("pod-ready", &format!("{} ms", t.elapsed().as_millis()));
    wait_object(
        &sets,
        "hostds",
        120,
        "the DaemonSet's pods to be ready",
        daemonset_rolled_out,
    )
    .await?;
    let ip = ready.status.and_then(|s| s.pod_ip).unwrap_or_default();
    ensure!(
        ip.starts_with("198.51.100."),
        "pod IP {ip:?} is not in the bridge's 198.51.100.0/24"
    );
    let (out, rc) = kubectl_exec("default", "podnet", &["sh", "-c", "echo exec-ok; exit 3"])?;
    ensure!(
        out == "exec-ok\n" && rc == 3,
        "kubectl exec: output {out:?}, exit {rc} (want exec-ok, 3)"
    );
    println!("  kubectl exec: output and exit code relayed; pod IP {ip}");
    sets.delete("hostds", &DeleteParams::default()).await?;
    let gone = pods.delete("podnet", &DeleteParams::default()).await?;
    if let Some(uid) = gone.left().and_then(|p| p.metadata.uid) {
        wait_object(
            &pods,
            "podnet",
            60,
            "podnet to be deleted",
            conditions::is_deleted(&uid),
        )
        .await
        .ok();
    }
    Ok(())
}

/// The agent's device plugin registers with the kubelet, and the node advertises the 4 GPUs.
pub async fn dp_registered(bed: &Bed) -> Result<()> {
    let nodes: Api<Node> = Api::all(client().await?);
    let t = Instant::now();
    let four = allocatable_is("4");
    let node = wait_object(&nodes, NODE, 60, &format!("allocatable {RES} = 4"), four)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", bed.log_tails(&["agent.log"], 10)))?;
    bed.timing(
        "dp-allocatable",
        &format!("{} ms after node-ready", t.elapsed().as_millis()),
    );
    ensure!(
        bed.logged_since("agent.log", 0, "registered with the kubelet"),
        "the agent logged no registration"
    );
    let request =
        format!("Got registration request from device plugin with resource name \"{RES}\"");
    let kubelet = std::fs::read_to_string(bed.logs.join("kubelet.log")).unwrap_or_default();
    ensure!(
        kubelet
            .lines()
            .any(|l| l.contains("Got registration request from device plugin") && l.contains(RES)),
        "the kubelet logged no registration request for {RES} ({request:?})"
    );
    let capacity = quantity(node.status.as_ref().and_then(|s| s.capacity.as_ref()));
    println!(
        "  allocatable {RES}: {:?}, capacity {capacity:?}",
        allocatable(Some(&node))
    );
    Ok(())
}

/// A pod asking for 5 GPUs on a node of 4 stays Pending, with the scheduler's reason.
pub async fn dp_pod_5_pending(_bed: &Bed) -> Result<()> {
    let client = client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), DP_NS);
    let pod = gpu_pod("gpu-5", DP_NS, 5)?;
    pods.create(&PostParams::default(), &pod).await?;
    let unschedulable = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.reason.as_deref() == Some("Unschedulable")
                        && c.message
                            .as_deref()
                            .is_some_and(|m| m.contains(&format!("Insufficient {RES}")))
                })
            })
    };
    let pod = wait_object(
        &pods,
        "gpu-5",
        60,
        &format!("gpu-5 unschedulable (Insufficient {RES})"),
        unschedulable,
    )
    .await?;
    let status = pod.status.unwrap_or_default();
    let phase = status.phase.unwrap_or_default();
    ensure!(phase == "Pending", "gpu-5 is {phase}, want Pending");
    let why = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .and_then(|c| c.message)
        .unwrap_or_default();
    println!("  gpu-5: {phase}, {why}");
    let namespaces: Api<Namespace> = Api::all(client);
    namespaces.delete(DP_NS, &DeleteParams::default()).await?;
    Ok(())
}

/// `failed_gpus: [3]` in the profile: allocatable drops to 3 while capacity stays 4; the GPU
/// back, allocatable is 4 again.
pub async fn dp_failed_gpu(bed: &Bed) -> Result<()> {
    let nodes: Api<Node> = Api::all(client().await?);
    write_profile(bed, 4, Some("failed_gpus: [3]"))?;
    let t = Instant::now();
    let three = allocatable_is("3");
    let node = wait_object(
        &nodes,
        NODE,
        30,
        &format!("allocatable {RES} = 3 after failed_gpus: [3]"),
        three,
    )
    .await;
    let back = Instant::now();
    // the GPU comes back whatever happened, so that the next steps find 4
    write_profile(bed, 4, None)?;
    let node = node?;
    bed.timing(
        "dp-failed-gpu",
        &format!("{} ms to allocatable 3", t.elapsed().as_millis()),
    );
    let cap = quantity(node.status.as_ref().and_then(|s| s.capacity.as_ref()));
    ensure!(
        cap.as_deref() == Some("4"),
        "capacity {RES} is {cap:?}, want 4 (the failed GPU stays listed)"
    );
    let four = allocatable_is("4");
    wait_object(
        &nodes,
        NODE,
        30,
        &format!("allocatable {RES} = 4 after the GPU came back"),
        four,
    )
    .await?;
    bed.timing(
        "dp-gpu-back",
        &format!("{} ms to allocatable 4", back.elapsed().as_millis()),
    );
    println!("  failed_gpus: [3] -> allocatable 3 (capacity {cap:?}); back -> 4");
    Ok(())
}

/// Waits up to `secs` for the named object to be gone (at once when there is none); on timeout
/// an error naming `what`, with the object's status as it was then.
pub(crate) async fn wait_deleted<K>(api: &Api<K>, name: &str, secs: u64, what: &str) -> Result<()>
where
    K: Clone + Debug + Send + DeserializeOwned + Resource + serde::Serialize + 'static,
{
    let Some(uid) = api.get_opt(name).await?.and_then(|k| k.meta().uid.clone()) else {
        return Ok(());
    };
    match tokio::time::timeout(
        Duration::from_secs(secs),
        await_condition(api.clone(), name, conditions::is_deleted(&uid)),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e).with_context(|| format!("watching {name} for {what}")),
        Err(_) => {
            let status = api
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|k| serde_json::to_value(k).ok())
                .and_then(|v| v.get("status").cloned())
                .unwrap_or_default();
            bail!("timed out after {secs} s waiting for {what}; {name}'s status: {status:#}")
        }
    }
}

/// The test bed's field manager for what it applies as the admin (or in an agent's stead).
pub(crate) const TB_MANAGER: &str = "mgtb";

/// Applies a CRD (server-side, as the test bed) and waits for it to be Established.
pub(crate) async fn apply_crd(client: &Client, crd: &CustomResourceDefinition) -> Result<()> {
    let name = crd.metadata.name.clone().context("the CRD has no name")?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        &name,
        &PatchParams::apply(TB_MANAGER).force(),
        &Patch::Apply(crd),
    )
    .await
    .with_context(|| format!("apply CRD {name}"))?;
    wait_object(
        &crds,
        &name,
        60,
        &format!("the CRD {name} to be Established"),
        conditions::is_crd_established(),
    )
    .await?;
    Ok(())
}

/// The chart's RBAC of `component` (`agent`, `controller`: `templates/<component>-rbac.yaml` of
/// release mockgpu in `namespace`, by `helm template`), applied as the admin, the namespace too:
/// the steps before chart-install run the binaries as host processes with the chart's own least
/// privilege. The kinds applied, in order.
pub(crate) async fn chart_rbac(
    bed: &Bed,
    client: &Client,
    component: &str,
    namespace: &str,
) -> Result<Vec<String>> {
    let chart = std::path::PathBuf::from(std::env::var("REPO").context("$REPO")?)
        .join("charts/mockgpu")
        .display()
        .to_string();
    let template = format!("templates/{component}-rbac.yaml");
    let yaml = helm(
        bed,
        &[
            "template",
            "mockgpu",
            &chart,
            "--namespace",
            namespace,
            "--show-only",
            &template,
        ],
    )
    .with_context(|| format!("helm template of the chart's {component} RBAC"))?;
    std::fs::write(bed.state.join(format!("{component}-rbac.yaml")), &yaml)?;
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&yaml)
        .with_context(|| format!("the chart's {component} RBAC (YAML)"))?;
    let ns = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
    )?;
    apply(&Api::<Namespace>::all(client.clone()), &ns).await?;
    let pp = PatchParams::apply(TB_MANAGER).force();
    let mut kinds = Vec::new();
    for doc in docs.into_iter().filter(|d| !d.is_null()) {
        let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
        let name = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let (ar, namespaced) = match kind.as_str() {
            "ServiceAccount" => (ApiResource::erase::<ServiceAccount>(&()), true),
            "Role" => (ApiResource::erase::<Role>(&()), true),
            "RoleBinding" => (ApiResource::erase::<RoleBinding>(&()), true),
            "ClusterRole" => (ApiResource::erase::<ClusterRole>(&()), false),
            "ClusterRoleBinding" => (ApiResource::erase::<ClusterRoleBinding>(&()), false),
            _ => bail!("the chart's {component} RBAC has a {kind:?} ({name})"),
        };
        let api: Api<DynamicObject> = if namespaced {
            Api::namespaced_with(client.clone(), namespace, &ar)
        } else {
            Api::all_with(client.clone(), &ar)
        };
        api.patch(&name, &pp, &Patch::Apply(&doc))
            .await
            .with_context(|| format!("apply {kind} {name}"))?;
        kinds.push(kind);
    }
    Ok(kinds)
}

/// A token of a service account (a TokenRequest), valid for `secs`.
pub(crate) async fn account_token(
    client: &Client,
    namespace: &str,
    account: &str,
    secs: i64,
) -> Result<String> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": [], "expirationSeconds": secs}
    }))?;
    Ok(accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .with_context(|| format!("a token of the service account {namespace}/{account}"))?
        .status
        .context("the TokenRequest has no status")?
        .token)
}

/// Writes a kubeconfig (mode 600) of a service account's `token` as user `user`, with the admin
/// kubeconfig's server and CA.
pub(crate) fn token_kubeconfig(path: &std::path::Path, user: &str, token: &str) -> Result<()> {
    let admin = std::env::var("KUBECONFIG").context("$KUBECONFIG")?;
    let kc = Kubeconfig::read_from(&admin).with_context(|| admin.clone())?;
    let ca = kc
        .clusters
        .iter()
        .find_map(|c| c.cluster.as_ref()?.certificate_authority_data.clone())
        .with_context(|| format!("{admin}: no certificate-authority-data"))?;
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: mgtb\n  cluster: {{server: \"https://127.0.0.1:6443\", certificate-authority-data: \"{ca}\"}}\nusers:\n- name: {user}\n  user: {{token: \"{token}\"}}\ncontexts:\n- name: mgtb\n  context: {{cluster: mgtb, user: {user}}}\ncurrent-context: mgtb\n"
    );
    std::fs::write(path, text).with_context(|| path.display().to_string())?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    Ok(())
}

/// A client with the credentials of a kubeconfig (a host path).
pub(crate) async fn client_of(path: &std::path::Path) -> Result<Client> {
    let what = path.display().to_string();
    let kc = Kubeconfig::read_from(path).with_context(|| what.clone())?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .with_context(|| what.clone())?;
    Ok(Client::try_from(config)?)
}

/// Whether a request failed with the API server's `code` (403 Forbidden, 409 Conflict ...).
pub(crate) fn api_error(r: &kube::Error, code: u16) -> bool {
    matches!(r, kube::Error::Api(s) if s.code == code)
}

/// A request's error as the API server said it (`<message> (<code> <reason>)`), or kube's.
pub(crate) fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({} {})", s.message, s.code, s.reason),
        e => e.to_string(),
    }
}
