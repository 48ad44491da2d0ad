//! The node test bed's scenarios that need no Slurm and no agent restart: the containers that
//! get the mock and those that do not, the consumers, a live profile change, the node's isolation.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use mockgpu_testbed::client::Cri;
use mockgpu_testbed::spec::{self, ContainerSpec};
use nix::sys::signal::Signal;

use crate::bed::{Bed, Ctr, alive, environ, exec, exec_ok, mounts, wait_for};

/// The pod of the Slinky-shaped slurmd container (seed-verification's `slurmd`).
pub(crate) const SLURMD_POD: &str = "slurm-0";
/// The built-in profile the agent's profile file is based on.
const GPU_PROFILE: &str = "gb300";
/// The GPUs of that profile.
pub(crate) const ALL_MINORS: [u32; 4] = [0, 1, 2, 3];
/// The shim, as the plugin injects it.
const SHIM: &str = "/run/mockgpu/lib/libmockfs.so";

/// A busybox container that sleeps.
pub(crate) fn sleeper(name: &str) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        image: "localhost/busybox:1".into(),
        command: vec!["/bin/sleep".into(), "3600".into()],
        ..ContainerSpec::default()
    }
}

pub(crate) fn ms(d: std::time::Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// Pod create, exec (output and exit code), cgroup and network namespace, removal: the
/// infrastructure alone, without mockgpu.
pub async fn smoke_pod(bed: &Bed) -> Result<()> {
    let mut cri = bed.cri().await?;
    let mut c = sleeper("main");
    c.labels = HashMap::from([("app".into(), "smoke".into())]);
    let ctr = bed.up(&mut cri, &bed.pod("smoke"), &c).await?;
    let hello = exec_ok(&mut cri, &ctr, &["echo", "hello"]).await?;
    ensure!(hello == "hello\n", "exec echo hello printed {hello:?}");
    let rc = exec(&mut cri, &ctr, &["sh", "-c", "exit 7"])
        .await?
        .exit_code;
    ensure!(rc == 7, "exec exit code: {rc}, want 7");
    let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", ctr.pid))?;
    ensure!(
        cgroup.contains(&format!("{}/", bed.cgroup_parent)),
        "the container is not below {}: {cgroup}",
        bed.cgroup_parent
    );
    let netns = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/net"));
    ensure!(
        netns(ctr.pid)? == netns(bed.node_pid()?)?,
        "the pod is not in the node's network namespace"
    );
    bed.timing(
        "smoke-container-create",
        &format!("{} ms (start {} ms)", ms(ctr.create), ms(ctr.start)),
    );
    cri.down(&["smoke".into()]).await?;
    wait_for(
        10,
        "the container's process to end with its pod",
        || async { !alive(ctr.pid) },
    )
    .await
}

/// The node reaches nothing but loopback, and no image was ever pulled.
pub async fn isolation(bed: &Bed) -> Result<()> {
    let links = bed.in_node(&["busybox", "ip", "-o", "link", "show"])?;
    let names: Vec<&str> = links.lines().filter_map(|l| l.split(": ").nth(1)).collect();
    ensure!(
        names == ["lo"],
        "the node's network namespace has more than lo: {names:?}"
    );
    no_image_pulled(bed)?;
    println!("  node network: lo only; no image pulled");
    Ok(())
}

/// containerd's log shows no image pull (every image is imported).
pub(crate) fn no_image_pulled(bed: &Bed) -> Result<()> {
    let log = std::fs::read_to_string(bed.logs.join("containerd.log"))?;
    let pulled = log.lines().find(|l| {
        let l = l.to_lowercase();
        l.contains("pullimage") || l.contains("pulling image")
    });
    ensure!(pulled.is_none(), "containerd pulled an image: {pulled:?}");
    Ok(())
}

/// The plugin's adjustment is in the container: the shim preloaded, `/run/mockgpu` mounted rslave,
/// `/etc/ld.so.preload`, and exactly the device nodes of `minors`.
pub(crate) async fn assert_injected(
    cri: &mut Cri,
    name: &str,
    ctr: &Ctr,
    minors: &[u32],
) -> Result<()> {
    let env = environ(ctr.pid)?;
    ensure!(
        env.iter().any(|l| l
            .strip_prefix("LD_PRELOAD=")
            .is_some_and(|v| v.split(':').any(|p| p == SHIM))),
        "{name}: no LD_PRELOAD={SHIM} in /proc/{}/environ",
        ctr.pid
    );
    let m = mounts(ctr.pid)?;
    let opt = |point: &str| m.iter().find(|(p, _)| p == point).map(|(_, o)| o.as_str());
    let run =
        opt("/run/mockgpu").with_context(|| format!("{name}: /run/mockgpu is not mounted"))?;
    ensure!(
        run.contains("master:"),
        "{name}: /run/mockgpu is not rslave ({run:?})"
    );
    ensure!(
        opt("/etc/ld.so.preload").is_some(),
        "{name}: /etc/ld.so.preload is not mounted"
    );
    let wanted = minors.iter().map(|m| format!("nvidia{m}"));
    for d in wanted.chain(["nvidiactl".into(), "nvidia-uvm".into()]) {
        let rc = exec(cri, ctr, &["test", "-c", &format!("/dev/{d}")])
            .await?
            .exit_code;
        ensure!(rc == 0, "{name}: /dev/{d} is not a character device");
    }
    for m in ALL_MINORS.iter().filter(|m| !minors.contains(m)) {
        let rc = exec(cri, ctr, &["test", "-e", &format!("/dev/nvidia{m}")])
            .await?
            .exit_code;
        ensure!(
            rc != 0,
            "{name}: /dev/nvidia{m} was injected, but the container holds GPUs {minors:?} only"
        );
    }
    Ok(())
}

/// The container is as the runtime made it: no shim, no `MOCKFS_*`, no mount, no device.
pub(crate) async fn assert_untouched(cri: &mut Cri, name: &str, ctr: &Ctr) -> Result<()> {
    let env = environ(ctr.pid)?;
    ensure!(
        !env.iter().any(|l| l.starts_with("LD_PRELOAD=")),
        "{name}: LD_PRELOAD was injected"
    );
    ensure!(
        !env.iter().any(|l| l.starts_with("MOCKFS")),
        "{name}: MOCKFS_* was injected"
    );
    let injected = mounts(ctr.pid)?
        .into_iter()
        .find(|(p, _)| p == "/run/mockgpu" || p == "/etc/ld.so.preload");
    ensure!(
        injected.is_none(),
        "{name}: a mockgpu mount was injected: {injected:?}"
    );
    let dev = exec_ok(cri, ctr, &["ls", "/dev"]).await?;
    let nodes: Vec<&str> = dev.lines().filter(|l| l.starts_with("nvidia")).collect();
    ensure!(
        nodes.is_empty(),
        "{name}: /dev/nvidia* was injected: {nodes:?}"
    );
    Ok(())
}

/// Only GPU containers get the mock: a sidecar of the slurmd pod, another pod's plain container
/// and one with `NVIDIA_VISIBLE_DEVICES=none` are untouched; the opt-in annotation injects; a
/// device-plugin-style container holding `/dev/nvidia1` gets GPU 1 only.
pub async fn only_gpu_containers(bed: &Bed) -> Result<()> {
    bed.container("slurmd")?;
    let mut cri = bed.cri().await?;
    let sidecar = bed
        .up(&mut cri, &bed.pod(SLURMD_POD), &sleeper("logfile"))
        .await?;
    let other = bed
        .up(&mut cri, &bed.pod("other-0"), &sleeper("main"))
        .await?;
    let mut none = sleeper("gpu");
    none.env = vec![("NVIDIA_VISIBLE_DEVICES".into(), "none".into())];
    let other_gpu = bed.up(&mut cri, &bed.pod("other-0"), &none).await?;
    assert_untouched(&mut cri, "sidecar", &sidecar).await?;
    assert_untouched(&mut cri, "other", &other).await?;
    assert_untouched(&mut cri, "other-gpu", &other_gpu).await?;
    let mut pod = bed.pod("annotated-0");
    pod.annotations = HashMap::from([("mockgpu.io/inject".into(), "worker".into())]);
    let annotated = bed.up(&mut cri, &pod, &sleeper("worker")).await?;
    assert_injected(&mut cri, "annotated", &annotated, &ALL_MINORS).await?;
    let mut gpu1 = sleeper("main");
    gpu1.devices = vec![spec::parse_device("/dev/null:/dev/nvidia1")?];
    let gpu1 = bed.up(&mut cri, &bed.pod("device-0"), &gpu1).await?;
    assert_injected(&mut cri, "gpu1", &gpu1, &[1]).await?;
    cri.down(&["other-0".into(), "annotated-0".into(), "device-0".into()])
        .await?;
    cri.remove_container(&sidecar.id, 0).await?;
    Ok(())
}

/// `lspci` and hwloc in the slurmd container list the four GPUs.
pub async fn consumers_lspci_hwloc(bed: &Bed) -> Result<()> {
    let slurmd = bed.container("slurmd")?;
    let mut cri = bed.cri().await?;
    let l = exec_ok(&mut cri, &slurmd, &["lspci", "-d", "10de:"]).await?;
    for line in l.lines() {
        println!("  lspci: {line}");
    }
    ensure!(
        l.lines().count() == 4,
        "lspci -d 10de: lists {} devices, want 4",
        l.lines().count()
    );
    let h = exec_ok(&mut cri, &slurmd, &["hwloc-ls"]).await?;
    let kept = bed.logs.join("hwloc-ls.txt");
    std::fs::write(&kept, &h)?;
    for bus in l.lines().filter_map(|line| line.split(' ').next()) {
        ensure!(
            h.contains(bus),
            "hwloc-ls does not list GPU {bus} (see {})",
            kept.display()
        );
    }
    let pci = h.lines().filter(|l| l.contains("PCI")).count();
    println!("  hwloc-ls: {pci} PCI lines, all 4 GPUs present");
    Ok(())
}

/// Writes the agent's profile file (a built-in base, a GPU count and an optional YAML line),
/// atomically, so that the agent never reads half a file.
pub(crate) fn write_profile(bed: &Bed, gpus: u32, extra: Option<&str>) -> Result<()> {
    let path = bed.node_path("/etc/mockgpu/profile.yaml");
    let tmp = path.with_extension("yaml.tmp");
    let mut text = format!("# test bed profile\nbase: {GPU_PROFILE}\ngpus: {gpus}\n");
    if let Some(line) = extra {
        text.push_str(line);
        text.push('\n');
    }
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path).with_context(|| format!("{}", path.display()))
}

async fn gpu_count(cri: &mut Cri, ctr: &Ctr) -> Result<usize> {
    let ls = exec_ok(cri, ctr, &["ls", "/proc/driver/nvidia/gpus"]).await?;
    Ok(ls.lines().count())
}

/// A profile change reaches a running container: 4 GPUs to 2 and back, without a restart.
pub async fn live_change(bed: &Bed) -> Result<()> {
    let slurmd = bed.container("slurmd")?;
    let mut cri = bed.cri().await?;
    ensure!(
        gpu_count(&mut cri, &slurmd).await? == 4,
        "want 4 GPUs before the change"
    );
    for (gpus, name) in [(2, "live-change-4-to-2"), (4, "live-change-2-to-4")] {
        let t = Instant::now();
        write_profile(bed, gpus, None)?;
        let what = format!("the container to see {gpus} GPUs");
        let cri = &mut cri;
        wait_for(30, &what, || {
            let mut c = cri.clone();
            let slurmd = slurmd.clone();
            async move {
                gpu_count(&mut c, &slurmd)
                    .await
                    .is_ok_and(|n| n == gpus as usize)
            }
        })
        .await?;
        bed.timing(name, &format!("{} ms", t.elapsed().as_millis()));
        let l = exec_ok(cri, &slurmd, &["lspci", "-d", "10de:"]).await?;
        ensure!(
            l.lines().count() == gpus as usize,
            "lspci does not follow the change: {l}"
        );
        ensure!(alive(slurmd.pid), "the container was restarted");
    }
    Ok(())
}

/// containerd restarted under a running agent: the plugin registers again by itself, a new GPU
/// container is injected, and the slurmd container keeps its GPUs.
pub async fn runtime_restart(bed: &Bed) -> Result<()> {
    let n0 = bed.log_lines("containerd.log");
    let t = Instant::now();
    bed.stop(Signal::SIGTERM, &["containerd"]).await?;
    bed.start_containerd().await?;
    wait_for(
        30,
        "the plugin to register with the restarted containerd",
        || async { bed.logged_since("containerd.log", n0, "registered as") },
    )
    .await?;
    bed.timing(
        "runtime-restart-to-plugin-registered",
        &format!("{} ms", t.elapsed().as_millis()),
    );
    let mut cri = bed.cri().await?;
    let mut gpu = sleeper("gpu");
    gpu.env = vec![("NVIDIA_VISIBLE_DEVICES".into(), "all".into())];
    let ctr = bed.up(&mut cri, &bed.pod("after-restart-0"), &gpu).await?;
    assert_injected(&mut cri, "after-restart", &ctr, &ALL_MINORS).await?;
    if let Ok(slurmd) = bed.container("slurmd") {
        let n = gpu_count(&mut cri, &slurmd).await?;
        ensure!(
            n == 4,
            "the slurmd container sees {n} GPUs after the runtime restart, want 4"
        );
    }
    cri.down(&["after-restart-0".into()]).await?;
    Ok(())
}

/// `(minor, UUID)` of every GPU the agent serves, by minor, from its tree in the node.
pub(crate) fn gpu_uuids(bed: &Bed) -> Result<Vec<(u32, String)>> {
    let listed = bed.in_node(&[
        "sh",
        "-c",
        r#"for f in /run/mockgpu/fs/proc/driver/nvidia/gpus/*/information; do
    printf "%s %s\n" "$(sed -n "s/^Device Minor:[[:space:]]*//p" "$f")" "$(sed -n "s/^GPU UUID:[[:space:]]*//p" "$f")"; done"#,
    ])?;
    let mut uuids = Vec::new();
    for l in listed.lines() {
        let parsed = l
            .split_once(' ')
            .and_then(|(m, u)| Some((m.parse().ok()?, u.to_owned())));
        uuids.push(parsed.with_context(|| format!("GPU minor and UUID: {l:?}"))?);
    }
    uuids.sort();
    Ok(uuids)
}
