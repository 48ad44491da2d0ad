//! GPU pods through the kubelet (cluster mode): the kubelet's device-plugin socket, a privileged
//! pod holding the GPU nodes and one asking by environment only, and a pod given 2 GPUs by the
//! agent's device plugin.

use std::time::Instant;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use mockgpu_testbed::client::Cri;
use serde_json::json;

use crate::bed::{Bed, Ctr, wait_for};
use crate::cluster::{
    DP_NS, GPU_NS, NODE, RES, allocatable_is, client, create_namespace, gpu_pod, kubectl_exec,
    node_condition, pod_ready, sleeper, wait_object,
};
use crate::node::{ALL_MINORS, assert_injected, assert_untouched, gpu_uuids};
use crate::slurm::{Gres, write_conf};

/// The kubelet serves its device-plugin registration socket.
pub async fn device_plugin_socket(bed: &Bed) -> Result<()> {
    let s = bed.node_path("/var/lib/kubelet/device-plugins/kubelet.sock");
    let what = "the kubelet's device-plugin registration socket";
    wait_for(30, what, || async {
        std::fs::metadata(&s).is_ok_and(|m| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_socket()
        })
    })
    .await?;
    println!(
        "  {} (node path /var/lib/kubelet/device-plugins/kubelet.sock)",
        s.display()
    );
    Ok(())
}

/// The pod's (first) container, as the runtime knows it.
async fn pod_container(cri: &mut Cri, pod: &Pod) -> Result<Ctr> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.container_id.as_deref())
        .and_then(|id| id.strip_prefix("containerd://"))
        .with_context(|| format!("pod {name} has no container id"))?
        .to_owned();
    let pid = cri
        .pid(&id)
        .await
        .with_context(|| format!("pod {name}'s container {id}"))?;
    Ok(Ctr {
        id,
        pid,
        create: Default::default(),
        start: Default::default(),
    })
}

/// kubelet → containerd → NRI: a privileged pod holding `/dev/nvidia0-3` is injected; a pod that
/// only sets `NVIDIA_VISIBLE_DEVICES`, in a namespace the agent does not trust, is not; the first
/// reads the driver files and `slurmd -C` finds the GPUs.
pub async fn gpu_pod_injected(bed: &Bed) -> Result<()> {
    write_conf(bed, Gres::Nvidia, false)?;
    let client = client().await?;
    create_namespace(&client, GPU_NS).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), GPU_NS);
    let gpu: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "gpu-0", "namespace": GPU_NS},
        "spec": {
            // `sleep` as PID 1 ignores SIGTERM: without this the namespace's deletion (waited
            // for by gpunode-setup) waits out the default 30 s
            "hostNetwork": true, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "slurmd", "image": "localhost/slurmd:1", "imagePullPolicy": "Never",
                "command": ["/bin/sleep", "infinity"], "securityContext": {"privileged": true},
                "volumeMounts": [{"name": "slurm", "mountPath": "/etc/slurm", "readOnly": true}]}],
            "volumes": [{"name": "slurm", "hostPath": {"path": "/etc/slurm", "type": "Directory"}}]
        }
    }))?;
    let env_only = sleeper(
        "env-only",
        GPU_NS,
        "localhost/busybox:1",
        json!({"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}),
    )?;
    pods.create(&PostParams::default(), &gpu).await?;
    pods.create(&PostParams::default(), &env_only).await?;
    let t = Instant::now();
    let gpu = wait_object(&pods, "gpu-0", 120, "gpu-0 to be ready", pod_ready()).await?;
    let env_only = wait_object(&pods, "env-only", 120, "env-only to be ready", pod_ready()).await?;
    bed.timing("gpu-pod-ready", &format!("{} ms", t.elapsed().as_millis()));
    let mut cri = bed.cri().await?;
    let gpu_ctr = pod_container(&mut cri, &gpu).await?;
    let env_ctr = pod_container(&mut cri, &env_only).await?;
    assert_injected(&mut cri, "gpu-0", &gpu_ctr, &ALL_MINORS).await?;
    // NVIDIA_VISIBLE_DEVICES counts only in trusted namespaces
    assert_untouched(&mut cri, "env-only", &env_ctr).await?;
    println!(
        "  privileged pod holding /dev/nvidia0-3 injected; env-only pod in {GPU_NS} untouched"
    );
    let (info, rc) = kubectl_exec(
        GPU_NS,
        "gpu-0",
        &["sh", "-c", "cat /proc/driver/nvidia/gpus/*/information"],
    )?;
    ensure!(rc == 0, "the information files are not readable in gpu-0");
    let models: Vec<&str> = info.lines().filter(|l| l.starts_with("Model:")).collect();
    ensure!(
        models.len() == 4,
        "want 4 GPUs' information, got {}: {info}",
        models.len()
    );
    println!("  {}", models[0]);
    let (c, rc) = kubectl_exec(GPU_NS, "gpu-0", &["slurmd", "-C"])?;
    ensure!(rc == 0, "slurmd -C in the pod exited {rc}");
    println!("  slurmd -C: {}", c.lines().next().unwrap_or_default());
    ensure!(
        c.contains(" Gres=gpu:nvidia_gb300:4"),
        "slurmd -C in the pod does not find gpu:nvidia_gb300:4: {c}"
    );
    Api::<Namespace>::all(client)
        .delete(GPU_NS, &DeleteParams::default())
        .await?;
    Ok(())
}

/// Two GPUs from the kubelet (the agent's device plugin): two device nodes, their UUIDs in
/// `NVIDIA_VISIBLE_DEVICES`, the NRI injection of exactly those, the driver files of the node.
pub async fn dp_pod_2_gpus(bed: &Bed) -> Result<()> {
    let client = client().await?;
    create_namespace(&client, DP_NS).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), DP_NS);
    let pod = gpu_pod("gpu-2", DP_NS, 2)?;
    pods.create(&PostParams::default(), &pod).await?;
    let t = Instant::now();
    let pod = wait_object(&pods, "gpu-2", 120, "gpu-2 to be ready", pod_ready()).await?;
    bed.timing("dp-pod-ready", &format!("{} ms", t.elapsed().as_millis()));
    let (dev, _) = kubectl_exec(DP_NS, "gpu-2", &["ls", "/dev"])?;
    let mut minors: Vec<u32> = dev
        .lines()
        .filter_map(|l| l.strip_prefix("nvidia")?.parse().ok())
        .collect();
    minors.sort();
    ensure!(
        minors.len() == 2,
        "want two /dev/nvidia<N> in the pod, got minors {minors:?}"
    );
    let (vis, _) = kubectl_exec(
        DP_NS,
        "gpu-2",
        &["sh", "-c", "echo \"$NVIDIA_VISIBLE_DEVICES\""],
    )?;
    let vis: Vec<&str> = vis.trim().split(',').collect();
    let is_uuid = |u: &str| {
        u.strip_prefix("GPU-")
            .is_some_and(|h| h.len() == 36 && h.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'))
    };
    ensure!(
        vis.len() == 2 && vis.iter().all(|u| is_uuid(u)),
        "NVIDIA_VISIBLE_DEVICES={vis:?}, want two GPU UUIDs"
    );
    // the UUIDs are those of the allocated minors in the agent's tree
    let uuids = gpu_uuids(bed)?;
    for m in &minors {
        let u = uuids
            .iter()
            .find(|(x, _)| x == m)
            .map(|(_, u)| u.as_str())
            .unwrap_or_default();
        ensure!(
            vis.contains(&u),
            "/dev/nvidia{m} is GPU {u}, not in NVIDIA_VISIBLE_DEVICES={vis:?}"
        );
    }
    ensure!(
        bed.logged_since("agent.log", 0, "GPUs allocated to a container"),
        "the agent logged no allocation"
    );
    let mut cri = bed.cri().await?;
    let ctr = pod_container(&mut cri, &pod).await?;
    assert_injected(&mut cri, "gpu-2", &ctr, &minors).await?;
    let (gpus, _) = kubectl_exec(DP_NS, "gpu-2", &["ls", "/proc/driver/nvidia/gpus"])?;
    let want = bed.in_node(&["ls", "/run/mockgpu/fs/proc/driver/nvidia/gpus"])?;
    ensure!(
        !want.is_empty() && gpus == want,
        "ls /proc/driver/nvidia/gpus in the pod: {gpus:?}, the node's: {want:?}"
    );
    println!(
        "  devices: nvidia{minors:?}; NVIDIA_VISIBLE_DEVICES={vis:?}; injected; /proc/driver/nvidia/gpus: {}",
        gpus.replace('\n', " ")
    );
    Ok(())
}

/// A restarted kubelet: the agent's plugin registers again by itself, the GPUs are allocatable
/// again, and a new pod with a GPU runs.
pub async fn dp_kubelet_restart(bed: &Bed) -> Result<()> {
    let (agent_from, kubelet_from) = (bed.log_lines("agent.log"), bed.log_lines("kubelet.log"));
    let args = bed.cmdline_of("kubelet")?;
    let t = Instant::now();
    bed.stop(nix::sys::signal::Signal::SIGTERM, &["kubelet"])
        .await?;
    bed.timing(
        "dp-kubelet-stopped",
        &format!("{} ms", t.elapsed().as_millis()),
    );
    let t = Instant::now();
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    bed.spawn("kubelet", "kubelet.log", &argv)?;
    wait_for(
        60,
        "the agent to register with the restarted kubelet",
        || async { bed.logged_since("agent.log", agent_from, "registered with the kubelet") },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", bed.log_tails(&["agent.log"], 10)))?;
    bed.timing(
        "dp-reregistered",
        &format!("{} ms after the kubelet restart", t.elapsed().as_millis()),
    );
    let kubelet = std::fs::read_to_string(bed.logs.join("kubelet.log")).unwrap_or_default();
    ensure!(
        kubelet
            .lines()
            .skip(kubelet_from)
            .any(|l| l.contains("Got registration request from device plugin") && l.contains(RES)),
        "the restarted kubelet logged no registration request for {RES}"
    );
    let client = client().await?;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let four = allocatable_is("4");
    wait_object(
        &nodes,
        NODE,
        60,
        &format!("allocatable {RES} = 4 after the kubelet restart"),
        four,
    )
    .await?;
    wait_object(
        &nodes,
        NODE,
        120,
        "the node to be Ready after the kubelet restart",
        node_condition("Ready", "True"),
    )
    .await?;
    // only a registered plugin's devices are allocated: a new pod with a GPU runs
    let ns = format!("{DP_NS}-restart");
    create_namespace(&client, &ns).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = gpu_pod("gpu-1", &ns, 1)?;
    pods.create(&PostParams::default(), &pod).await?;
    let t = Instant::now();
    wait_object(
        &pods,
        "gpu-1",
        120,
        "a pod with 1 GPU to start after the kubelet restart",
        pod_ready(),
    )
    .await?;
    bed.timing(
        "dp-pod-after-restart",
        &format!("{} ms", t.elapsed().as_millis()),
    );
    Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await?;
    println!(
        "  re-registered with the restarted kubelet; allocatable {RES} 4; a pod with 1 GPU ran"
    );
    Ok(())
}
