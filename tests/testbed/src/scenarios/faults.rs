//! GPU faults through Kubernetes, on the chart's agent and controller: `chart-gpu-faults` (a
//! GpuFault of Xid 79 takes a GPU off the node: the device plugin's allocatable, the GpuNode, the
//! Node condition, `nvidia-smi` and a go-nvml program in a GPU pod; ECC and thermal faults in
//! `nvidia-smi -q`; faults the node cannot have are refused; clearing brings all back) and
//! `chart-slinky-gpu-drain` (the controller drains the Slurm node through slurmrestd with the
//! GPU and the Xid as the reason, and resumes it when the fault is cleared).

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use mockgpu_api::{Fault, FaultKind, GpuFault, GpuFaultSpec, GpuNode};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::bed::{Bed, wait_for};
use crate::cluster::{
    NODE, RES, allocatable_is, api_message, client, create_namespace, delete_namespace, gpu_pod,
    helm, kubectl, kubectl_command, kubectl_exec, node_condition, pod_ready, pods_report,
    wait_object,
};
use crate::node::ms;
use crate::slinky;

/// The namespace of the GPU pod.
const NS: &str = "chart-faults";
/// The pod holding node0's four GPUs.
const POD: &str = "faults-4";
/// The Node condition the controller sets (its default type).
const CONDITION: &str = "GPUProblem";
/// The GPU taken off the bus.
const LOST: u32 = 1;
/// Where the go-nvml program goes in the pod.
const NVMLLIST: &str = "/tmp/nvmllist";

/// Creates the GpuFault `name` on `node`.
async fn inject(faults: &Api<GpuFault>, name: &str, node: &str, f: Fault) -> Result<()> {
    let obj = GpuFault::new(
        name,
        GpuFaultSpec {
            node_name: node.to_owned(),
            fault: f,
            expires: None,
        },
    );
    faults
        .create(&PostParams::default(), &obj)
        .await
        .map_err(|e| anyhow::anyhow!("creating GpuFault {name}: {}", api_message(&e)))?;
    Ok(())
}

/// The `Applied` condition of a GpuFault: `(status, message)`.
fn applied(f: Option<&GpuFault>) -> Option<(String, String)> {
    f.and_then(|f| f.status.as_ref())?
        .conditions
        .iter()
        .find(|c| c.type_ == mockgpu_api::fault::condition::APPLIED)
        .map(|c| (c.status.clone(), c.message.clone()))
}

/// Waits for the agent to have applied (`True`) or refused (`False`) GpuFault `name`: the
/// condition's message.
async fn wait_applied(faults: &Api<GpuFault>, name: &str, status: &str) -> Result<String> {
    let what = format!("GpuFault {name}: Applied={status}");
    let f = wait_object(faults, name, 60, &what, |f: Option<&GpuFault>| {
        applied(f).is_some_and(|(s, _)| s == status)
    })
    .await?;
    Ok(applied(Some(&f)).map(|(_, m)| m).unwrap_or_default())
}

/// The node's condition `CONDITION`: `(status, reason, message)`.
fn problem(n: Option<&Node>) -> Option<(String, String, String)> {
    n.and_then(|n| n.status.as_ref())?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION)
        .map(|c| {
            (
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

/// Every GpuFault deleted, and gone.
async fn clear(faults: &Api<GpuFault>) -> Result<()> {
    for f in faults.list(&Default::default()).await?.items {
        let name = f.metadata.name.unwrap_or_default();
        faults.delete(&name, &DeleteParams::default()).await.ok();
    }
    wait_for(30, "every GpuFault gone", || async {
        faults
            .list(&Default::default())
            .await
            .is_ok_and(|l| l.items.is_empty())
    })
    .await
}

/// The output of `nvidia-smi ARGS` in the pod, standard error included (where the real tool
/// writes what it cannot show).
fn smi(args: &str) -> Result<String> {
    let (out, _) = kubectl_exec(NS, POD, &["sh", "-c", &format!("nvidia-smi {args} 2>&1")])?;
    Ok(out)
}

/// The GPU pod: node0's four GPUs, with the go-nvml program copied in.
async fn gpu_pod_up(client: &Client) -> Result<()> {
    create_namespace(client, NS).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(&PostParams::default(), &gpu_pod(POD, NS, 4)?)
        .await?;
    let pod = match wait_object(&pods, POD, 120, "the 4-GPU pod Ready", pod_ready()).await {
        Ok(p) => p,
        Err(e) => bail!("{e:#}\n{}", pods_report(client, NS, "", 20).await),
    };
    let on = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
    ensure!(on == NODE, "the 4-GPU pod runs on {on}, want {NODE}");
    let bin = std::env::var("NVMLLIST").context("$NVMLLIST (the go-nvml program) is not set")?;
    let file = std::fs::File::open(&bin).with_context(|| bin.clone())?;
    let st = kubectl_command(&[
        "-n",
        NS,
        "exec",
        "-i",
        POD,
        "--",
        "sh",
        "-c",
        &format!("cat > {NVMLLIST} && chmod 755 {NVMLLIST}"),
    ])?
    .stdin(file)
    .status()?;
    ensure!(st.success(), "copying {bin} into {POD}: {st}");
    Ok(())
}

/// Xid 79 on one GPU of node0, ECC and thermal faults on others, two faults the node cannot
/// have, then every fault cleared.
pub async fn chart_gpu_faults(bed: &Bed) -> Result<()> {
    let client = client().await?;
    let faults: Api<GpuFault> = Api::all(client.clone());
    clear(&faults).await?;
    gpu_pod_up(&client).await?;
    let r = faults_on_node0(bed, &client, &faults).await;
    let c = clear(&faults).await;
    let d = delete_namespace(&client, NS, 60).await;
    r.and(c).and(d)
}

async fn faults_on_node0(bed: &Bed, client: &Client, faults: &Api<GpuFault>) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let gpunodes: Api<GpuNode> = Api::all(client.clone());
    let g = gpunodes.get(NODE).await?;
    let lost_gpu = g
        .spec
        .gpus
        .iter()
        .find(|g| g.index == LOST)
        .context("GpuNode node0 has no GPU 1")?
        .clone();
    let before = smi("-L")?;
    ensure!(
        before.lines().filter(|l| l.starts_with("GPU ")).count() == 4,
        "nvidia-smi -L before the fault: want 4 GPUs:\n{before}"
    );
    // go-nvml registers for Xid events on the four GPUs and waits
    // (a first wait of 100 ms ends in a timeout; by its line every GPU is registered)
    let mut waiter = kubectl_command(&[
        "-n",
        NS,
        "exec",
        POD,
        "--",
        NVMLLIST,
        "-wait-xid",
        "90",
        "100",
    ])?;
    waiter.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = tokio::process::Command::from(waiter)
        .kill_on_drop(true)
        .spawn()
        .context("kubectl exec nvmllist")?;
    let mut lines = BufReader::new(child.stdout.take().context("nvmllist's stdout")?).lines();
    let mut listed = Vec::new();
    while !listed
        .last()
        .is_some_and(|l: &String| l.starts_with("xid wait: "))
    {
        match tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await {
            Ok(Ok(Some(l))) => listed.push(l),
            other => bail!("nvmllist printed {listed:?}, then {other:?}"),
        }
    }
    let gpus = listed.iter().filter(|l| l.starts_with("gpu ")).count();
    ensure!(gpus == 4, "go-nvml lists {gpus} GPUs, want 4: {listed:?}");
    let t = Instant::now();
    inject(faults, "xid79", NODE, Fault::xid(LOST, 79)).await?;
    let m = wait_applied(faults, "xid79", "True").await?;
    println!("  GpuFault xid79 (node0, GPU 1, Xid 79): Applied ({m})");
    let three = allocatable_is("3");
    wait_object(&nodes, NODE, 60, &format!("allocatable {RES} = 3"), three).await?;
    bed.timing(
        "fault-allocatable",
        &format!("{} ms (Xid 79 to allocatable 3)", ms(t.elapsed())),
    );
    let g = wait_object(
        &gpunodes,
        NODE,
        60,
        "GpuNode node0 with 1 unhealthy GPU",
        |g: Option<&GpuNode>| {
            g.and_then(|g| g.status.as_ref())
                .is_some_and(|s| s.unhealthy_gpus == 1 && s.faults.len() == 1)
        },
    )
    .await?;
    let f = &g.status.unwrap_or_default().faults[0];
    ensure!(
        f.source == "GpuFault/xid79"
            && f.gpu == LOST
            && f.uuid == lost_gpu.uuid
            && f.xid == Some(79),
        "GpuNode node0's fault: {f:?}"
    );
    let n = wait_object(
        &nodes,
        NODE,
        60,
        &format!("condition {CONDITION}=True"),
        node_condition(CONDITION, "True"),
    )
    .await?;
    let (_, reason, message) = problem(Some(&n)).unwrap_or_default();
    ensure!(
        message.contains("Xid 79") && message.contains(&lost_gpu.uuid),
        "condition {CONDITION}'s message names neither Xid 79 nor {}: {message}",
        lost_gpu.uuid
    );
    println!("  node0 {CONDITION}=True {reason}: {message}");
    // the program's event
    let event = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(l) = lines.next_line().await? {
            if l.starts_with("xid ") {
                return Ok::<_, std::io::Error>(Some(l));
            }
        }
        Ok(None)
    })
    .await;
    let want = format!("xid 79 {}", lost_gpu.uuid);
    match event {
        Ok(Ok(Some(l))) if l == want => println!("  go-nvml: {l}"),
        other => bail!("go-nvml's Xid event: want {want:?}, got {other:?}"),
    }
    child.kill().await.ok();
    // nvidia-smi sees the GPU lost, the driver files lose it
    let smi_l = smi("-L")?;
    let listed: Vec<&str> = smi_l.lines().filter(|l| l.starts_with("GPU ")).collect();
    ensure!(
        listed.len() == 3 && smi_l.contains("GPU is lost") && !smi_l.contains(&lost_gpu.uuid),
        "nvidia-smi -L with GPU 1 off the bus: want 3 GPUs and GPU 1 lost:\n{smi_l}"
    );
    for l in smi_l.lines() {
        println!("  nvidia-smi -L: {l}");
    }
    let (dirs, _) = kubectl_exec(NS, POD, &["ls", "/proc/driver/nvidia/gpus"])?;
    ensure!(
        dirs.lines().count() == 3 && !dirs.lines().any(|d| d == lost_gpu.bus_id),
        "/proc/driver/nvidia/gpus with GPU 1 off the bus: {dirs:?}"
    );
    // ECC and thermal faults show in nvidia-smi -q
    inject(
        faults,
        "ecc",
        NODE,
        Fault {
            single_bit: Some(5),
            double_bit: Some(2),
            ..Fault::new(2, FaultKind::Ecc)
        },
    )
    .await?;
    inject(faults, "thermal", NODE, Fault::new(3, FaultKind::Thermal)).await?;
    wait_applied(faults, "ecc", "True").await?;
    wait_applied(faults, "thermal", "True").await?;
    let q = smi("-q -i 2")?;
    ensure!(
        q.lines()
            .any(|l| l.trim().starts_with("DRAM Uncorrectable") && l.trim_end().ends_with(": 2")),
        "nvidia-smi -q -i 2 with 2 double-bit errors:\n{q}"
    );
    let q3 = smi("-q -i 3")?;
    ensure!(
        q3.lines()
            .any(|l| l.contains("Thermal Slowdown") && l.contains("Active")),
        "nvidia-smi -q -i 3 with thermal slowdown:\n{q3}"
    );
    // ECC double-bit errors make GPU 2 unhealthy too
    let two = allocatable_is("2");
    wait_object(
        &nodes,
        NODE,
        60,
        &format!("allocatable {RES} = 2 (GPU 2's DBE)"),
        two,
    )
    .await?;
    for l in kubectl(&["get", "gpunodes"])?.lines() {
        println!("  {l}");
    }
    for l in kubectl(&["get", "gpufaults"])?.lines() {
        println!("  {l}");
    }
    // faults the node cannot have: refused, nothing else changes
    inject(faults, "gpu7", NODE, Fault::xid(7, 79)).await?;
    let m = wait_applied(faults, "gpu7", "False").await?;
    ensure!(
        m.contains("GPU 7"),
        "the refusal of GPU 7 does not name it: {m}"
    );
    println!("  GpuFault gpu7: refused: {m}");
    let e = inject(faults, "xid7", NODE, Fault::xid(0, 7)).await;
    let m = format!("{:#}", e.err().context("a GpuFault of Xid 7 was created")?);
    ensure!(
        m.contains('7') && m.contains("79"),
        "the refusal of Xid 7: {m}"
    );
    println!("  GpuFault xid7: refused by the API server: {m}");
    let s = gpunodes.get_status(NODE).await?.status.unwrap_or_default();
    ensure!(
        s.faults.len() == 3 && s.unhealthy_gpus == 2,
        "after the refused faults, GpuNode node0 has {} faults, {} unhealthy GPUs: want 3, 2",
        s.faults.len(),
        s.unhealthy_gpus
    );
    // cleared: all back
    let t = Instant::now();
    clear(faults).await?;
    let four = allocatable_is("4");
    wait_object(
        &nodes,
        NODE,
        60,
        &format!("allocatable {RES} = 4 again"),
        four,
    )
    .await?;
    wait_object(
        &nodes,
        NODE,
        60,
        &format!("condition {CONDITION}=False"),
        node_condition(CONDITION, "False"),
    )
    .await?;
    wait_object(
        &gpunodes,
        NODE,
        60,
        "GpuNode node0 without faults",
        |g: Option<&GpuNode>| {
            g.and_then(|g| g.status.as_ref())
                .is_some_and(|s| s.unhealthy_gpus == 0 && s.faults.is_empty())
        },
    )
    .await?;
    bed.timing(
        "fault-cleared",
        &format!("{} ms (cleared to allocatable 4)", ms(t.elapsed())),
    );
    let after = smi("-L")?;
    ensure!(
        after == before,
        "nvidia-smi -L after clearing:\n{after}\nwant as before:\n{before}"
    );
    println!("  cleared: allocatable 4, {CONDITION}=False, nvidia-smi -L lists the 4 GPUs again");
    Ok(())
}

/// With the controller's Slurm drain on: Xid 79 on node0's GPU 1 drains node0's Slurm node with
/// a reason naming the GPU and the Xid; clearing the fault resumes it. Then Slinky goes.
pub async fn chart_slinky_gpu_drain(bed: &Bed) -> Result<()> {
    let client = client().await?;
    let faults: Api<GpuFault> = Api::all(client.clone());
    let r = drain(bed, &client, &faults).await;
    let c = clear(&faults).await;
    let d = slinky::down(&client, false).await;
    r.and(c).and(d)
}

/// `sinfo -R`'s lines (`<node> <state> <reason>`) from slurmctld.
fn sinfo_r() -> Result<String> {
    Ok(
        slinky::ctld(&["sinfo", "-h", "-R", "-N", "-o", "%N %T %E"])?
            .trim_end()
            .to_owned(),
    )
}

async fn drain(bed: &Bed, client: &Client, faults: &Api<GpuFault>) -> Result<()> {
    let chart = format!("{}/charts/mockgpu", std::env::var("REPO").context("$REPO")?);
    helm(
        bed,
        &[
            "upgrade",
            "mockgpu",
            &chart,
            "--namespace",
            "mockgpu-system",
            "--reuse-values",
            "--set",
            DRAIN_VALUE,
            "--wait",
            "--timeout",
            "120s",
        ],
    )
    .context("helm upgrade with the Slurm drain on")?;
    let gpunodes: Api<GpuNode> = Api::all(client.clone());
    let uuid = gpunodes.get(NODE).await?.spec.gpus[LOST as usize]
        .uuid
        .clone();
    let name = slinky::slurm_name(NODE, false)?;
    let t = Instant::now();
    inject(faults, "xid79-drain", NODE, Fault::xid(LOST, 79)).await?;
    let drained = |s: &str| {
        s.lines().any(|l| {
            l.starts_with(&format!("{name} "))
                && l.contains("drain")
                && l.contains("Xid 79")
                && l.contains(&uuid)
        })
    };
    let r = wait_for(
        90,
        &format!("sinfo -R: {name} drained for Xid 79 on {uuid}"),
        || async { sinfo_r().is_ok_and(|s| drained(&s)) },
    )
    .await;
    if let Err(e) = r {
        let now = sinfo_r().unwrap_or_else(|e| format!("{e:#}"));
        bail!(
            "{e:#}; sinfo -R shows {now:?}\n{}",
            pods_report(
                client,
                "mockgpu-system",
                "app.kubernetes.io/component=controller",
                20
            )
            .await
        );
    }
    bed.timing(
        "fault-drained",
        &format!("{} ms (Xid 79 to Slurm drain)", ms(t.elapsed())),
    );
    for l in sinfo_r()?.lines() {
        println!("  sinfo -R: {l}");
    }
    let t = Instant::now();
    clear(faults).await?;
    wait_for(90, &format!("{name} resumed"), || async {
        slinky::sinfo().is_ok_and(|s| s.lines().any(|l| l.starts_with(&format!("{name} idle "))))
            && sinfo_r().is_ok_and(|s| !s.lines().any(|l| l.starts_with(&format!("{name} "))))
    })
    .await?;
    bed.timing(
        "fault-resumed",
        &format!("{} ms (cleared to idle)", ms(t.elapsed())),
    );
    println!("  cleared: {}", slinky::sinfo()?.replace('\n', "; "));
    Ok(())
}

/// The chart value that turns the controller's Slurm drain on.
const DRAIN_VALUE: &str = "controller.faults.drainSlurm=true";
