//! DRA on the chart's agent (`chart-dra`): `helm upgrade` turns the GPU driver
//! (`gpu.nvidia.com`, in place of the device plugin) and the IMEX channel driver
//! (`compute-domain.nvidia.com`) on. Then a claim of 2 GPUs by a CEL selector on `productName`
//! gets exactly those 2 (their device nodes, `nvidia-smi -L`, the GpuNode's record); a claim no
//! GPU satisfies stays pending with the scheduler's reason; NVIDIA's ComputeDomain, applied as
//! the Slinky guide writes it, gets its ResourceClaimTemplate from the controller, a pod of it
//! gets every IMEX channel on the served major, and the domain turns Ready with the node. The
//! chart is set back to the device plugin at the end.

use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use mockgpu_api::GpuNode;
use mockgpu_api::dra::{ComputeDomain, READY};
use serde_json::json;

use crate::bed::Bed;
use crate::cluster::{
    NODE, allocatable_is, client, create_namespace, delete_namespace, helm, kubectl,
    kubectl_command, kubectl_exec, pod_ready, pods_report, sleeper, wait_deleted, wait_object,
};
use crate::node::ms;
use crate::slinky;

/// The namespace of the GPU claims.
const NS: &str = "dra-jobs";
/// The namespace of the ComputeDomain, as the Slinky guide has it.
const CD_NS: &str = "slurm";
/// The chart's release and namespace.
const RELEASE: [&str; 3] = ["mockgpu", "-n", "mockgpu-system"];
/// The Slinky guide's ComputeDomain, as written.
const COMPUTE_DOMAIN: &str = "apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata: {name: slurm-compute-domain, namespace: slurm}
spec:
  channel:
    allocationMode: All
    resourceClaimTemplate: {name: slurm-test-compute-domain}
  numNodes: 0
";

/// `helm upgrade` of the chart with DRA `on` or off (the device plugin back), waiting for it.
fn dra_values(bed: &Bed, on: bool) -> Result<()> {
    let repo = std::env::var("REPO").context("$REPO")?;
    let chart = format!("{repo}/charts/mockgpu");
    let gpus = format!("agent.dra.gpus={on}");
    let domains = format!("agent.dra.computeDomains={on}");
    let mut args = vec!["upgrade", RELEASE[0], &chart, RELEASE[1], RELEASE[2]];
    args.extend(["--reuse-values", "--set", &gpus, "--set", &domains]);
    args.extend(["--wait", "--timeout", "180s"]);
    helm(bed, &args)?;
    Ok(())
}

/// A pod of the slurmd image whose container uses claim `claim` (of `source`: a
/// `resourceClaimName` or a `resourceClaimTemplateName`).
fn claim_pod(name: &str, namespace: &str, source: serde_json::Value) -> Result<Pod> {
    let mut pod = sleeper(
        name,
        namespace,
        "localhost/slurmd:1",
        json!({"resources": {"claims": [{"name": "c"}]}}),
    )?;
    let mut claim = json!({"name": "c"});
    if let (Some(c), Some(s)) = (claim.as_object_mut(), source.as_object()) {
        c.extend(s.clone());
    }
    let spec = pod.spec.as_mut().context("a pod without a spec")?;
    spec.resource_claims = Some(vec![serde_json::from_value(claim)?]);
    Ok(pod)
}

/// A claim of `count` GPUs whose `productName` is `product`.
fn gpu_claim(name: &str, count: i64, product: &str) -> Result<ResourceClaim> {
    let cel = format!("device.attributes['gpu.nvidia.com'].productName == '{product}'");
    Ok(serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": count,
            "selectors": [{"cel": {"expression": cel}}]}}]}}
    }))?)
}

/// The chart's agent serves DRA; claims, pods and a ComputeDomain get what they ask for.
pub async fn chart_dra(bed: &Bed) -> Result<()> {
    let client = client().await?;
    let t = Instant::now();
    dra_values(bed, true).context("helm upgrade with DRA on")?;
    bed.timing(
        "dra-upgrade",
        &format!("{} ms (helm upgrade --wait, DRA on)", ms(t.elapsed())),
    );
    create_namespace(&client, NS).await?;
    let r = on_dra(bed, &client).await;
    let d = delete_namespace(&client, NS, 60).await;
    let back = dra_values(bed, false).context("helm upgrade back to the device plugin");
    let nodes = Api::all(client.clone());
    let four = wait_object(
        &nodes,
        NODE,
        60,
        "allocatable nvidia.com/gpu = 4 again",
        allocatable_is("4"),
    );
    r.and(d).and(back).and(four.await.map(|_| ()))
}

async fn on_dra(bed: &Bed, client: &Client) -> Result<()> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let gpu_slice = format!("{NODE}-gpu.nvidia.com");
    let four = |s: Option<&ResourceSlice>| {
        s.and_then(|s| s.spec.devices.as_ref())
            .is_some_and(|d| d.len() == 4)
    };
    if let Err(e) = wait_object(
        &slices,
        &gpu_slice,
        60,
        "the GPU slice with 4 devices",
        four,
    )
    .await
    {
        bail!(
            "{e:#}\n{}",
            pods_report(
                client,
                "mockgpu-system",
                "app.kubernetes.io/component=agent",
                30
            )
            .await
        );
    }
    let channel_slice = format!("{NODE}-compute-domain.nvidia.com");
    wait_object(
        &slices,
        &channel_slice,
        60,
        "the channel slice",
        |s: Option<&ResourceSlice>| s.is_some(),
    )
    .await?;
    let yaml = kubectl(&["get", "resourceslices", "-o", "yaml"])?;
    std::fs::write(bed.state.join("resourceslices.yaml"), &yaml)?;
    println!(
        "  kubectl get resourceslices: {}",
        kubectl(&["get", "resourceslices"])?
            .trim_end()
            .replace('\n', "\n  ")
    );
    two_gpus_by_product(client).await?;
    no_gpu_satisfies(client).await?;
    compute_domain(bed, client).await
}

/// A claim of 2 GB300s: the pod gets exactly 2 GPU device nodes, `nvidia-smi -L` lists those 2,
/// and the GpuNode records the claim with their UUIDs.
async fn two_gpus_by_product(client: &Client) -> Result<()> {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    claims
        .create(
            &PostParams::default(),
            &gpu_claim("two-gb300", 2, "NVIDIA GB300")?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod = claim_pod("dra-2", NS, json!({"resourceClaimName": "two-gb300"}))?;
    pods.create(&PostParams::default(), &pod).await?;
    if let Err(e) = wait_object(
        &pods,
        "dra-2",
        120,
        "the 2-GPU claim's pod Ready",
        pod_ready(),
    )
    .await
    {
        bail!("{e:#}\n{}", pods_report(client, NS, "", 20).await);
    }
    let claim = claims.get("two-gb300").await?;
    let allocated: Vec<String> = claim
        .status
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .map(|d| d.results.into_iter().flatten().map(|r| r.device).collect())
        .unwrap_or_default();
    ensure!(
        allocated.len() == 2,
        "claim two-gb300 allocated {allocated:?}, want 2 devices"
    );
    let (dev, _) = kubectl_exec(
        NS,
        "dra-2",
        &["sh", "-c", "ls /dev | grep -E '^nvidia[0-9]+$'"],
    )?;
    let mut minors: Vec<String> = dev
        .lines()
        .map(|l| format!("gpu-{}", &l["nvidia".len()..]))
        .collect();
    minors.sort();
    let mut want = allocated.clone();
    want.sort();
    ensure!(
        minors == want,
        "the pod's GPU device nodes {dev:?}: want those of {allocated:?}"
    );
    let gpunodes: Api<GpuNode> = Api::all(client.clone());
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let recorded = |g: Option<&GpuNode>| {
        g.and_then(|g| g.status.as_ref())
            .is_some_and(|s| s.claims.iter().any(|c| c.uid == uid && c.gpus.len() == 2))
    };
    let g = wait_object(
        &gpunodes,
        NODE,
        30,
        "the GpuNode to list claim two-gb300",
        recorded,
    )
    .await?;
    let record = g
        .status
        .unwrap_or_default()
        .claims
        .into_iter()
        .find(|c| c.uid == uid)
        .context("no record")?;
    let (smi, code) = kubectl_exec(NS, "dra-2", &["nvidia-smi", "-L"])?;
    let listed: Vec<&str> = smi.lines().filter(|l| l.starts_with("GPU ")).collect();
    ensure!(
        code == 0 && listed.len() == 2 && record.gpus.iter().all(|u| smi.contains(u.as_str())),
        "nvidia-smi -L in the pod (exit {code}): want the claim's 2 GPUs {:?}:\n{smi}",
        record.gpus
    );
    println!("  claim two-gb300 (2 x productName == 'NVIDIA GB300'): {allocated:?}");
    for l in listed {
        println!("  nvidia-smi -L: {l}");
    }
    println!(
        "  GpuNode {NODE} claims: {}/{} {:?} GPUs {:?}",
        record.namespace, record.name, record.devices, record.gpus
    );
    pods.delete("dra-2", &DeleteParams::default()).await?;
    wait_deleted(&pods, "dra-2", 60, "pod dra-2 to go").await?;
    let released = |g: Option<&GpuNode>| {
        g.and_then(|g| g.status.as_ref())
            .is_some_and(|s| !s.claims.iter().any(|c| c.uid == uid))
    };
    wait_object(
        &gpunodes,
        NODE,
        60,
        "the claim unprepared (gone from the GpuNode)",
        released,
    )
    .await?;
    Ok(())
}

/// A claim of a product the node does not have: its pod stays pending, with the scheduler's
/// reason.
async fn no_gpu_satisfies(client: &Client) -> Result<()> {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    claims
        .create(
            &PostParams::default(),
            &gpu_claim("h100", 1, "NVIDIA H100 80GB HBM3")?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &claim_pod("dra-none", NS, json!({"resourceClaimName": "h100"}))?,
    )
    .await?;
    let unschedulable = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.type_ == "PodScheduled" && c.status == "False")
            })
    };
    let p = wait_object(
        &pods,
        "dra-none",
        60,
        "pod dra-none unschedulable",
        unschedulable,
    )
    .await?;
    let message = p
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "PodScheduled"))
        .and_then(|c| c.message)
        .unwrap_or_default();
    ensure!(
        message.contains("cannot allocate all claims"),
        "pod dra-none's scheduling condition: want the scheduler's \"cannot allocate all claims\", got {message:?}"
    );
    println!("  claim h100 (productName == 'NVIDIA H100 80GB HBM3'): pending: {message}");
    Ok(())
}

/// The guide's ComputeDomain: its template, a pod of it with every channel, the domain Ready.
async fn compute_domain(bed: &Bed, client: &Client) -> Result<()> {
    // (the Slinky steps' namespace, made here when they have not made it, and then removed)
    let created = create_namespace(client, CD_NS).await.is_ok();
    let r = domain_pod(bed, client).await;
    let d = if created {
        delete_namespace(client, CD_NS, 90).await
    } else {
        Ok(())
    };
    r.and(d)
}

/// Applies the guide's ComputeDomain as written.
fn apply_guide_domain() -> Result<()> {
    let mut apply = kubectl_command(&["apply", "-f", "-"])?;
    apply
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = apply.spawn().context("kubectl apply")?;
    {
        use std::io::Write as _;
        child
            .stdin
            .take()
            .context("kubectl's stdin")?
            .write_all(COMPUTE_DOMAIN.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "kubectl apply of the guide's ComputeDomain: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(())
}

async fn domain_pod(bed: &Bed, client: &Client) -> Result<()> {
    apply_guide_domain()?;
    let domains: Api<ComputeDomain> = Api::namespaced(client.clone(), CD_NS);
    let cd = domains.get("slurm-compute-domain").await?;
    let cd_uid = cd.metadata.uid.clone().unwrap_or_default();
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), CD_NS);
    let t = wait_object(
        &templates,
        "slurm-test-compute-domain",
        60,
        "the controller's ResourceClaimTemplate",
        |t: Option<&ResourceClaimTemplate>| t.is_some(),
    )
    .await?;
    let spec = serde_json::to_value(&t.spec)?;
    ensure!(
        spec["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
            == "compute-domain-default-channel.nvidia.com"
            && spec["spec"]["devices"]["config"][0]["opaque"]["parameters"]["domainID"]
                == cd_uid.as_str()
            && spec["spec"]["devices"]["config"][0]["opaque"]["parameters"]["allocationMode"]
                == "All",
        "the ComputeDomain's ResourceClaimTemplate: {spec:#}"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), CD_NS);
    let pod = claim_pod(
        "imex",
        CD_NS,
        json!({"resourceClaimTemplateName": "slurm-test-compute-domain"}),
    )?;
    pods.create(&PostParams::default(), &pod).await?;
    let r = imex_pod(bed, client, &domains, &pods, &cd_uid).await;
    pods.delete("imex", &DeleteParams::default()).await.ok();
    let gone = wait_deleted(&pods, "imex", 60, "pod imex to go").await;
    domains
        .delete("slurm-compute-domain", &DeleteParams::default())
        .await
        .ok();
    let cd_gone = wait_deleted(
        &domains,
        "slurm-compute-domain",
        60,
        "the ComputeDomain to go (its finalizer removed)",
    )
    .await;
    r.and(gone).and(cd_gone)
}

async fn imex_pod(
    bed: &Bed,
    client: &Client,
    domains: &Api<ComputeDomain>,
    pods: &Api<Pod>,
    cd_uid: &str,
) -> Result<()> {
    if let Err(e) = wait_object(
        pods,
        "imex",
        120,
        "the channel claim's pod Ready",
        pod_ready(),
    )
    .await
    {
        bail!("{e:#}\n{}", pods_report(client, CD_NS, "", 20).await);
    }
    let (count, _) = kubectl_exec(
        CD_NS,
        "imex",
        &["sh", "-c", "ls /dev/nvidia-caps-imex-channels | wc -l"],
    )?;
    ensure!(
        count.trim() == "2048",
        "the pod has {} IMEX channels, want 2048 (allocationMode: All)",
        count.trim()
    );
    // (the pod holds no GPU, so it is not injected: the mock's /proc/devices is the agent's)
    let devices = bed.in_node(&["cat", "/run/mockgpu/fs/proc/devices"])?;
    let major = devices
        .lines()
        .find_map(|l| l.trim().strip_suffix(" nvidia-caps-imex-channels"))
        .context("the mock's /proc/devices lists no nvidia-caps-imex-channels")?
        .to_owned();
    let (stat, _) = kubectl_exec(
        CD_NS,
        "imex",
        &[
            "stat",
            "-c",
            "%F %t:%T",
            "/dev/nvidia-caps-imex-channels/channel5",
        ],
    )?;
    let hex_major = major
        .trim()
        .parse::<u32>()
        .map(|m| format!("{m:x}"))
        .unwrap_or_default();
    ensure!(
        stat.trim() == format!("character special file {hex_major}:5"),
        "channel5 in the pod: {stat:?}, want a character device {}:5 (the IMEX major of /proc/devices)",
        major.trim()
    );
    let ready = |d: Option<&ComputeDomain>| {
        d.and_then(|d| d.status.as_ref())
            .is_some_and(|s| s.status == READY && s.nodes.iter().any(|n| n.name == NODE))
    };
    let cd = wait_object(
        domains,
        "slurm-compute-domain",
        60,
        "the ComputeDomain Ready with node0",
        ready,
    )
    .await?;
    let node = cd
        .status
        .unwrap_or_default()
        .nodes
        .into_iter()
        .find(|n| n.name == NODE)
        .context("node0")?;
    ensure!(
        node.clique_id.ends_with(".32766"),
        "node0's cliqueID {:?}: want the gb300 profile's <cluster UUID>.32766",
        node.clique_id
    );
    let gpunodes: Api<GpuNode> = Api::all(client.clone());
    let recorded = |g: Option<&GpuNode>| {
        g.and_then(|g| g.status.as_ref()).is_some_and(|s| {
            s.claims
                .iter()
                .any(|c| c.domain.as_deref() == Some(cd_uid) && c.channels == Some(2048))
        })
    };
    wait_object(
        &gpunodes,
        NODE,
        30,
        "the GpuNode to list the channel claim",
        recorded,
    )
    .await?;
    println!(
        "  ComputeDomain slurm-compute-domain: Ready, node {} (cliqueID {}, {})",
        node.name, node.clique_id, node.ip_address
    );
    println!(
        "  its pod: 2048 channels, channel5 = {} (major {} of /proc/devices)",
        stat.trim(),
        major.trim()
    );
    Ok(())
}

/// One job's IMEX channel check, as NVIDIA's Slinky conformance check runs it: exactly one
/// channel device, printed, then a wait so that the two jobs overlap.
const CHANNEL_JOB: &str = r#"c=$(find /dev/nvidia-caps-imex-channels -maxdepth 1 -type c -name 'channel*' -print 2>/dev/null); n=$(printf '%s' "$c" | grep -c .); if [ "$n" != 1 ]; then echo "IMEX_CHANNEL_ERROR=expected exactly one channel, found $n: $c"; exit 1; fi; echo "IMEX_CHANNEL=$c"; sleep 10"#;

/// Each job's `srun`, as NVIDIA's check runs it: small enough (one CPU, 128 MiB, one GPU) that
/// the two run at once on one node, and given up when they cannot start within 30 s.
const SRUN: &str =
    "srun --immediate=30 --nodes=1 --ntasks=1 --cpus-per-task=1 --mem=128M --gres=gpu:1";

/// Slurm's `switch/nvidia_imex` in the Slinky shape (`chart-slinky-imex`): the guide's
/// ComputeDomain, slurmctld with `SwitchType=switch/nvidia_imex`, the NodeSet's slurmd with the
/// domain's channel claim (the device plugin still gives it the GPUs); two concurrent jobs each
/// see exactly one IMEX channel, and not the same one.
pub async fn chart_slinky_imex(bed: &Bed) -> Result<()> {
    let client = client().await?;
    let domains = "agent.dra.computeDomains=true";
    let repo = std::env::var("REPO").context("$REPO")?;
    let chart = format!("{repo}/charts/mockgpu");
    helm(
        bed,
        &[
            "upgrade",
            RELEASE[0],
            &chart,
            RELEASE[1],
            RELEASE[2],
            "--reuse-values",
            "--set",
            domains,
            "--wait",
            "--timeout",
            "180s",
        ],
    )
    .context("helm upgrade with the channel driver on")?;
    let r = slinky_imex(bed, &client).await;
    let down = slinky::down(&client, false).await;
    let back = dra_values(bed, false).context("helm upgrade back without DRA");
    r.and(down).and(back)
}

async fn slinky_imex(bed: &Bed, client: &Client) -> Result<()> {
    slinky::controller_up(
        client,
        bed,
        "nvidia",
        false,
        "SwitchType=switch/nvidia_imex\n",
    )
    .await?;
    apply_guide_domain()?;
    slinky::nodeset_up(
        client,
        &[NODE.to_owned()],
        false,
        Some("slurm-test-compute-domain"),
    )
    .await?;
    let script = format!(
        "{srun} sh -c '{job}' & a=$!; {srun} sh -c '{job}' & b=$!; wait $a; ra=$?; wait $b; rb=$?; echo \"exits $ra $rb\"",
        srun = SRUN,
        job = CHANNEL_JOB.replace('\'', "'\\''")
    );
    let out = slinky::ctld(&["bash", "-c", &script])?;
    let channels: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("IMEX_CHANNEL="))
        .collect();
    ensure!(
        out.contains("exits 0 0") && channels.len() == 2,
        "two concurrent jobs: want each to see exactly one IMEX channel:\n{out}"
    );
    ensure!(
        channels[0] != channels[1],
        "concurrent Slurm jobs received the same IMEX channel: {channels:?}"
    );
    for c in &channels {
        ensure!(
            c.strip_prefix("/dev/nvidia-caps-imex-channels/channel")
                .is_some_and(|n| !n.is_empty() && !n.contains('/')),
            "invalid IMEX channel path {c:?}"
        );
    }
    println!("  two concurrent srun --gres=gpu:1: IMEX channels {channels:?}");
    Ok(())
}
