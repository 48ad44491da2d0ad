//! The cluster mode's scenarios of the API server itself and of what runs on it before the
//! agent reports: a CRD with a ValidatingAdmissionPolicy, Helm, every value set of the chart as a
//! server-side dry run, the product images as pods; and the node's isolation at the end.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, LogParams, Patch, PatchParams,
    PostParams,
};
use serde_json::{Value, json};

use crate::bed::{Bed, stdout_of, wait_for};
use crate::cluster::{
    TB_MANAGER, api_message, apply, apply_crd, client, default_account, helm, kubectl, wait_object,
};
use crate::node::no_image_pulled;

fn repo() -> Result<PathBuf> {
    Ok(std::env::var("REPO").context("$REPO")?.into())
}

/// The widgets' CRD of the admission policy's scenario.
const WIDGETS: &str = "widgets.testbed.mockgpu.io";
/// The policy (and its binding).
const WIDGET_POLICY: &str = "widget-gpus";
/// What the policy says when it denies.
const WIDGET_DENIED: &str = "a widget has at most 4 GPUs";

/// A widget with `gpus` GPUs.
fn widget(name: &str, gpus: u32) -> Value {
    json!({
        "apiVersion": "testbed.mockgpu.io/v1", "kind": "Widget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"gpus": gpus}
    })
}

/// A CRD and a ValidatingAdmissionPolicy on it, enforced by the API server: a widget with 2 GPUs
/// is accepted, one with 8 denied with the policy's message.
pub async fn crd_admission_policy(_bed: &Bed) -> Result<()> {
    let client = client().await?;
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": WIDGETS},
        "spec": {
            "group": "testbed.mockgpu.io",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"gpus": {"type": "integer"}}}}}}}]
        }
    }))?;
    apply_crd(&client, &crd).await?;
    let pp = PatchParams::apply(TB_MANAGER).force();
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": WIDGET_POLICY},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["testbed.mockgpu.io"],
                "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                "resources": ["widgets"]}]},
            "validations": [{"expression": "object.spec.gpus <= 4", "message": WIDGET_DENIED}]
        }
    }))?;
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    apply(&policies, &policy).await?;
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": WIDGET_POLICY},
        "spec": {"policyName": WIDGET_POLICY, "validationActions": ["Deny"]}
    }))?;
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    apply(&bindings, &binding).await?;
    let gvk = GroupVersionKind::gvk("testbed.mockgpu.io", "v1", "Widget");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    // (the CRD's endpoint serves a moment after it is Established)
    let last = RefCell::new(String::new());
    let small = widget("small", 2);
    let accepted = wait_for(30, "a widget with 2 GPUs to be accepted", || {
        let (widgets, pp, small, last) = (&widgets, &pp, &small, &last);
        async move {
            let r = widgets.patch("small", pp, &Patch::Apply(small)).await;
            r.map_err(|e| *last.borrow_mut() = api_message(&e)).is_ok()
        }
    })
    .await;
    accepted.with_context(|| format!("the last refusal: {}", last.borrow()))?;
    // the policy takes effect a moment after it is created: until it denies, remove what got in
    let big: DynamicObject = serde_json::from_value(widget("big", 8))?;
    let denial = RefCell::new(String::new());
    let denied = wait_for(30, "the policy to deny a widget with 8 GPUs", || {
        let (widgets, big, denial) = (&widgets, &big, &denial);
        async move {
            match widgets.create(&PostParams::default(), big).await {
                Ok(_) => {
                    *denial.borrow_mut() = "created (the policy let it in)".into();
                    widgets.delete("big", &DeleteParams::default()).await.ok();
                    false
                }
                Err(e) => {
                    *denial.borrow_mut() = api_message(&e);
                    true
                }
            }
        }
    })
    .await;
    let denial = denial.into_inner();
    denied.with_context(|| format!("the widget with 8 GPUs, at the last try: {denial}"))?;
    ensure!(
        denial.contains(WIDGET_DENIED) && denial.contains(WIDGET_POLICY),
        "the ValidatingAdmissionPolicy {WIDGET_POLICY} did not deny the widget with 8 GPUs \
         with {WIDGET_DENIED:?}: {denial}"
    );
    println!("  denied: {denial}");
    let dp = DeleteParams::default();
    bindings.delete(WIDGET_POLICY, &dp).await?;
    policies.delete(WIDGET_POLICY, &dp).await?;
    Api::<CustomResourceDefinition>::all(client)
        .delete(WIDGETS, &dp)
        .await?;
    Ok(())
}

/// Helm installs a chart made on the spot (`--set` over its values) against the real API
/// server, which then holds its ConfigMap; uninstall removes it.
pub async fn helm_chart(bed: &Bed) -> Result<()> {
    let home = bed.state.join("helm");
    if home.exists() {
        std::fs::remove_dir_all(&home).with_context(|| home.display().to_string())?;
    }
    let chart = home.join("chart");
    std::fs::create_dir_all(chart.join("templates"))?;
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: mgtb-probe\nversion: 0.1.0\n",
    )?;
    std::fs::write(chart.join("values.yaml"), "gpus: 4\n")?;
    std::fs::write(
        chart.join("templates/cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: {{ .Release.Name }}-probe}\ndata: {gpus: \"{{ .Values.gpus }}\"}\n",
    )?;
    let path = chart.display().to_string();
    let ns = ["--namespace", "default"];
    helm(
        bed,
        &[
            &["install", "probe", &path],
            &ns[..],
            &["--set", "gpus=2", "--wait", "--timeout", "60s"],
        ]
        .concat(),
    )?;
    let maps: Api<ConfigMap> = Api::namespaced(client().await?, "default");
    let cm = maps
        .get_opt("probe-probe")
        .await?
        .context("helm install made no ConfigMap probe-probe")?;
    let gpus = cm.data.unwrap_or_default().remove("gpus");
    ensure!(
        gpus.as_deref() == Some("2"),
        "the chart's ConfigMap has gpus={gpus:?}, want 2 (from --set)"
    );
    let version = helm(bed, &["version", "--short"])?;
    let list = helm(bed, &[&["list", "--short"], &ns[..]].concat())?;
    ensure!(
        list.lines().any(|l| l == "probe"),
        "helm list does not name the release probe: {list:?}"
    );
    println!(
        "  {}: {} installed, ConfigMap gpus=2",
        version.trim(),
        list.trim()
    );
    helm(bed, &[&["uninstall", "probe", "--wait"], &ns[..]].concat())?;
    ensure!(
        maps.get_opt("probe-probe").await?.is_none(),
        "helm uninstall left the ConfigMap probe-probe"
    );
    Ok(())
}

/// The namespace of the chart's dry runs (of its own: one being deleted does not get in the way
/// of a real install later).
const DRY_NS: &str = "chart-dry-run";

/// What a server-side dry run must have accepted among the chart's objects, whatever the values.
const DRY_MUST: [&str; 2] = [
    "customresourcedefinition.apiextensions.k8s.io/gpunodes.mockgpu.io",
    "validatingadmissionpolicy.admissionregistration.k8s.io/mg-mockgpu-agent-own-gpunode",
];

/// Every value set of `tests/chart.sh` (the defaults and `charts/mockgpu/ci/*-values.yaml`)
/// rendered with the CRDs and applied with `--dry-run=server`: the real API server validates each
/// object (its schema, unknown fields, the admission policy's CEL) and keeps none.
pub async fn chart_dry_run(bed: &Bed) -> Result<()> {
    let client = client().await?;
    let ns = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DRY_NS}}),
    )?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    apply(&namespaces, &ns).await?;
    // (the helm test pod runs as the agent's service account, which a dry run does not create:
    // Helm creates test pods after the release's objects)
    let sa = serde_json::from_value(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "mg-mockgpu-agent", "namespace": DRY_NS}}))?;
    apply(
        &Api::<ServiceAccount>::namespaced(client.clone(), DRY_NS),
        &sa,
    )
    .await?;
    let chart = repo()?.join("charts/mockgpu");
    let mut sets: Vec<(String, Option<PathBuf>)> = vec![("default".into(), None)];
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart.join("ci"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with("-values.yaml"))
        .collect();
    files.sort();
    for f in files {
        let name = f
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix("-values.yaml"))
            .context("a values file's name")?
            .to_owned();
        sets.push((name, Some(f)));
    }
    ensure!(sets.len() > 1, "no charts/mockgpu/ci/*-values.yaml");
    let chart = chart.display().to_string();
    for (name, file) in &sets {
        let mut args = vec![
            "template",
            "mg",
            &chart,
            "--namespace",
            DRY_NS,
            "--include-crds",
        ];
        let f = file.as_ref().map(|f| f.display().to_string());
        if let Some(f) = &f {
            args.extend(["-f", f]);
        }
        let yaml = helm(bed, &args).with_context(|| format!("chart values {name}"))?;
        let rendered = bed.state.join(format!("chart-{name}.yaml"));
        std::fs::write(&rendered, &yaml)?;
        let docs: Vec<Value> = serde_saphyr::from_multiple(&yaml)
            .with_context(|| format!("chart values {name}: the rendered YAML"))?;
        // kubectl's "<kind>.<group>/<name> <verb> (server dry run)" of each object rendered
        let want: BTreeSet<String> = docs
            .iter()
            .filter(|d| !d.is_null())
            .map(|d| {
                let kind = d["kind"].as_str().unwrap_or_default().to_lowercase();
                let group = d["apiVersion"]
                    .as_str()
                    .and_then(|v| v.rsplit_once('/'))
                    .map_or(String::new(), |(g, _)| format!(".{g}"));
                let name = d["metadata"]["name"].as_str().unwrap_or_default();
                format!("{kind}{group}/{name}")
            })
            .collect();
        let count = docs.iter().filter(|d| !d.is_null()).count();
        let out = kubectl(&[
            "apply",
            "--dry-run=server",
            "-f",
            &rendered.display().to_string(),
        ])
        .with_context(|| format!("chart values {name}: the API server rejects"))?;
        let accepted: Vec<&str> = out
            .lines()
            .filter_map(|l| l.strip_suffix(" (server dry run)"))
            .collect();
        let got: BTreeSet<String> = accepted
            .iter()
            .filter_map(|l| l.rsplit_once(' ').map(|(o, _)| o.to_owned()))
            .collect();
        ensure!(
            got == want && accepted.len() == count,
            "chart values {name}: {} of {count} objects accepted; not accepted: {:?}; \
             unexpected: {:?}; kubectl: {out}",
            accepted.len(),
            want.difference(&got).collect::<Vec<_>>(),
            got.difference(&want).collect::<Vec<_>>()
        );
        for must in DRY_MUST {
            let line = format!("{must} created");
            ensure!(
                accepted.contains(&line.as_str()),
                "chart values {name}: no {line:?} (server dry run) among: {accepted:?}"
            );
        }
        println!("  {name}: {} objects accepted", accepted.len());
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    ensure!(
        crds.get_opt("gpunodes.mockgpu.io").await?.is_none(),
        "a dry run left the GpuNode CRD behind"
    );
    namespaces.delete(DRY_NS, &DeleteParams::default()).await?;
    Ok(())
}

/// `tests/images.sh <what> <Dockerfile>`: what an image is made of, read from its Dockerfile.
fn images_sh(what: &str, dockerfile: &Path) -> Result<String> {
    let script = repo()?.join("tests/images.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(what)
        .arg(dockerfile)
        .output()
        .with_context(|| script.display().to_string())?;
    stdout_of(
        &format!("tests/images.sh {what} {}", dockerfile.display()),
        out,
    )
}

/// A pod of `image` in `default` that runs once, its container's fields (command, args) in
/// `run`.
fn once_pod(name: &str, image: &str, run: Value) -> Result<Pod> {
    let mut c = json!({"name": "c", "image": image, "imagePullPolicy": "Never"});
    if let (Some(c), Some(run)) = (c.as_object_mut(), run.as_object()) {
        c.extend(run.clone());
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [c]}
    }))?)
}

/// Waits for a pod that runs once to end; its log, or an error with its phase, its container's
/// state and its log.
async fn ran_ok(pods: &Api<Pod>, name: &str, what: &str) -> Result<String> {
    let phase = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.clone())
            .unwrap_or_default()
    };
    let ended = |p: Option<&Pod>| matches!(phase(p).as_str(), "Succeeded" | "Failed");
    let pod = wait_object(pods, name, 60, &format!("{name} to end"), ended).await?;
    let log = pods
        .logs(name, &LogParams::default())
        .await
        .unwrap_or_else(|e| format!("(no log: {e})"));
    let got = phase(Some(&pod));
    if got != "Succeeded" {
        let state = pod
            .status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.into_iter().next())
            .and_then(|c| c.state);
        bail!("{what}: pod {name} {got}, want Succeeded; its container: {state:?}; its log: {log}");
    }
    Ok(log)
}

/// The test bed's images hold what the Dockerfiles install (each file, with its mode), run as
/// the Dockerfile's `USER`, and their entry points answer `--version`.
pub async fn product_images(_bed: &Bed) -> Result<()> {
    let client = client().await?;
    default_account(&client, "default").await?;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut dockerfiles: Vec<PathBuf> = std::fs::read_dir(repo()?.join("images"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "Dockerfile"))
        .collect();
    dockerfiles.sort();
    ensure!(!dockerfiles.is_empty(), "no images/*.Dockerfile");
    for f in &dockerfiles {
        let stem = f.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        let name = format!("mockgpu-{stem}");
        let image = format!("localhost/{name}:1");
        // "NAME PATH MODE" of each file the Dockerfile installs
        let installs: Vec<(String, String)> = images_sh("installs", f)?
            .lines()
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                Some((w.get(1)?.to_string(), w.get(2)?.to_string()))
            })
            .collect();
        ensure!(!installs.is_empty(), "{}: installs nothing", f.display());
        let checks: String = installs
            .iter()
            .map(|(dest, _)| format!("stat -c '%n %a' {dest}; "))
            .collect();
        let (files, entry) = (format!("{name}-files"), format!("{name}-entry"));
        let cmd = json!({"command": ["/bin/sh", "-c", format!("{checks}id -u")]});
        pods.create(&PostParams::default(), &once_pod(&files, &image, cmd)?)
            .await
            .with_context(|| format!("create pod {files}"))?;
        // the entry point as the Dockerfile sets it, with --version for arguments
        let version = json!({"args": ["--version"]});
        pods.create(&PostParams::default(), &once_pod(&entry, &image, version)?)
            .await
            .with_context(|| format!("create pod {entry}"))?;
        let out = ran_ok(&pods, &files, &format!("{image}: the file checks")).await?;
        let lines: Vec<&str> = out.lines().collect();
        for (dest, mode) in &installs {
            let want = format!("{dest} {mode}");
            ensure!(
                lines.contains(&want.as_str()),
                "{image}: want {dest} with mode {mode} (as {} installs it), got: {lines:?}",
                f.display()
            );
        }
        let config: Value = serde_json::from_str(&images_sh("config", f)?)
            .with_context(|| format!("{}: the image config (JSON)", f.display()))?;
        let user = config["User"].as_str().unwrap_or("0");
        let want_uid = user.split(':').next().unwrap_or(user);
        let uid = lines.last().copied().unwrap_or_default();
        ensure!(
            uid == want_uid,
            "{image} runs as uid {uid}, {} says USER {want_uid}",
            f.display()
        );
        let version = ran_ok(
            &pods,
            &entry,
            &format!("{image}: its entry point with --version"),
        )
        .await?;
        ensure!(
            !version.trim().is_empty(),
            "{image}: its entry point printed nothing for --version"
        );
        let listed = lines[..lines.len() - 1].join(" ");
        println!(
            "  {image}: {listed} uid {uid}; entry point --version: {}",
            version.trim()
        );
        for p in [&files, &entry] {
            pods.delete(p, &DeleteParams::default()).await?;
        }
    }
    Ok(())
}

/// Reads a process's namespace link (`net:[4026531840]`); `None` when it is gone.
fn ns_of(pid: &str, ns: &str) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).ok()
}

/// The PIDs in the cgroup directories below `dir` (all its `cgroup.procs`).
/// The processes in the cgroups below `parent`, in every hierarchy (cgroup v2, and each v1
/// controller's where the host has them).
pub(crate) fn pids_below(parent: &str) -> Result<BTreeSet<String>> {
    let parent = parent.trim_start_matches('/');
    let mut dirs = vec![PathBuf::from("/sys/fs/cgroup").join(parent)];
    for h in std::fs::read_dir("/sys/fs/cgroup")?.flatten() {
        dirs.push(h.path().join(parent));
    }
    let mut pids = BTreeSet::new();
    for d in dirs.iter().filter(|d| d.is_dir()) {
        cgroup_pids(d, &mut pids);
    }
    Ok(pids)
}

fn cgroup_pids(dir: &Path, pids: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            cgroup_pids(&p, pids);
        } else if e.file_name() == "cgroup.procs" {
            let procs = std::fs::read_to_string(&p).unwrap_or_default();
            pids.extend(procs.split_whitespace().map(str::to_owned));
        }
    }
}

/// (cluster mode's `isolation` step) Nothing reaches out of the node (its links are `lo`, the pod
/// bridge `cni0` and veths on it, and a veth to each other node of the test bed), nothing of the node or its pods is in the host's network
/// namespace, the kubelet's sysctl writes stayed in the node, nothing was pulled.
pub async fn cluster_isolation(bed: &Bed) -> Result<()> {
    let links = bed.in_node(&["ip", "-o", "link", "show"])?;
    let mut names = Vec::new();
    let mut bad = Vec::new();
    for line in links.lines() {
        let Some(name) = line
            .split(": ")
            .nth(1)
            .map(|n| n.split('@').next().unwrap_or(n))
        else {
            continue;
        };
        names.push(name.to_owned());
        match name {
            "lo" | "cni0" => {}
            veth if veth.starts_with("veth") => {
                if !line.contains("master cni0") {
                    bad.push(format!("{veth} (no master cni0)"));
                }
            }
            // the link to another node of the test bed (cluster.sh `nodes_link`), named after
            // it: a veth whose peer is in that node's network namespace
            peer if peer
                .strip_prefix("node")
                .is_some_and(|i| i.parse::<u32>().is_ok()) =>
            {
                if !line.contains("link-netns") {
                    bad.push(format!("{peer} (its peer is not in another namespace)"));
                }
            }
            other => bad.push(other.to_owned()),
        }
    }
    ensure!(
        bad.is_empty(),
        "the node's network namespace has links other than lo, the pod bridge and the other nodes: {bad:?} \
         (all: {names:?})"
    );
    // every process of the node (its mount namespace, its pods' cgroups) is outside the host's
    // network namespace, so whatever listens does so in the node's namespaces
    let host_net = std::env::var("MGTB_HOST_NETNS")
        .context("$MGTB_HOST_NETNS (the host's network namespace: testbed.sh's rust_scenario)")?;
    let host_net = PathBuf::from(host_net);
    let node = bed.node_pid()?.to_string();
    let node_mnt = ns_of(&node, "mnt").context("the node's mount namespace")?;
    ensure!(
        ns_of(&node, "net").as_ref() != Some(&host_net),
        "the node's holder (pid {node}) is in the host's network namespace {}",
        host_net.display()
    );
    let mut in_node = 0;
    for e in std::fs::read_dir("/proc")?.flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || ns_of(&pid, "mnt") != Some(node_mnt.clone())
        {
            continue;
        }
        in_node += 1;
        if ns_of(&pid, "net").as_ref() == Some(&host_net) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            bail!(
                "process {pid} ({}) of the node is in the host's network namespace",
                comm.trim()
            );
        }
    }
    let pids = pids_below(&bed.cgroup_parent)?;
    for pid in &pids {
        ensure!(
            ns_of(pid, "net").as_ref() != Some(&host_net),
            "pod process {pid} is in the host's network namespace"
        );
    }
    no_image_pulled(bed)?;
    // the kubelet's sysctl writes landed on the node's shadow files, not on the host
    let kept = std::fs::read_to_string(bed.state.join("host-sysctls"))
        .context("the host's sysctls as cluster-up found them")?;
    let mut node_values = Vec::new();
    for line in kept.lines() {
        let (name, was) = line
            .split_once('=')
            .with_context(|| format!("host-sysctls: {line:?}"))?;
        let now = std::fs::read_to_string(format!("/proc/sys/{name}"))?;
        ensure!(
            now.trim() == was,
            "the host's {name} is {}, was {was} (the kubelet's write reached the host)",
            now.trim()
        );
        let node = bed.in_node(&["cat", &format!("/proc/sys/{name}")])?;
        node_values.push(format!("{name}={}", node.trim()));
    }
    ensure!(!node_values.is_empty(), "host-sysctls names no sysctl");
    println!(
        "  host sysctls kept ({}); node (the kubelet's): {}",
        kept.lines().collect::<Vec<_>>().join(" "),
        node_values.join(" ")
    );
    println!(
        "  node links: {}; none of the node's {in_node} processes and {} pod processes in the \
         host's network namespace; no image pulled",
        names.join(" "),
        pids.len()
    );
    Ok(())
}
