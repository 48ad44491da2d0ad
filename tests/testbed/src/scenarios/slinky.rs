//! Slinky's shape of Slurm on the cluster (cluster mode, Slurm 25.11 and later): slurmctld,
//! slurmrestd and a slurmd DaemonSet as the real operator builds them (its Secrets, ConfigMap,
//! labels, the slurmd pod with its logfile sidecar), on the pod network. Slurm needs every daemon
//! to reach every other one directly, which pod IPs on the bridge do; Slinky names slurmctld
//! through a Service that nothing answers here (no kube-proxy, no DNS), so slurm.conf and slurmd's
//! `--conf-server` carry the controller pod's IP instead.
//!
//! `slinky-slurm` runs this on the host agent (gres.conf `AutoDetect=nvml`, `ConstrainDevices=yes`);
//! `chart-slinky-remediation` (chart.rs) on the chart's agent and controller.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::bed::{Bed, wait_for};
use crate::cluster::{
    NODE, RES, apply, client, create_namespace, daemonset_rolled_out, delete_namespace, kubectl,
    label, pod_ready, pods_report, wait_object,
};
use crate::node::{gpu_uuids, ms};
use crate::slurm::{OPEN_GPUS, gres_sockets};

/// Slinky's namespace.
pub(crate) const SLINKY_NS: &str = "slurm";
/// The NodeSet: the slurmd pods' instance label, their Features, slurm.conf's NodeSet.
const NODESET: &str = "gpu";
/// Slinky's controller pod (StatefulSet slurm-controller, ordinal 0).
pub(crate) const CTLD: &str = "slurm-controller-0";
/// Slinky's slurmrestd (a Deployment and Service of that name).
const RESTAPI: &str = "slurm-restapi";
/// slurmrestd's port.
pub(crate) const RESTAPI_PORT: u16 = 6820;
/// The label the slurmd pods select nodes by (the controller sets it on GPU nodes).
pub(crate) const PCI_LABEL: &str = "feature.node.kubernetes.io/pci-10de.present";
/// The slurmd pods' selector.
const SLURMD_PODS: &str = "app.kubernetes.io/name=slurmd,app.kubernetes.io/instance=gpu";

/// The uid and gid of `slurm` in the slurmd image, as in Slinky's images (testbed.sh's `SLURM_UID`).
fn slurm_uid() -> Result<String> {
    std::env::var("SLURM_UID").context("$SLURM_UID is not set (testbed.sh's rust_scenario)")
}

/// The start of the containers' scripts: the executables the pods start. Debian's package
/// installs `<name>-wlm` and its maintainer scripts (update-alternatives) make the usual names;
/// an image assembled from extracted packages has to make them itself.
fn need(uid: &str) -> String {
    format!(
        r#"set -e; need() {{ for n; do [ -x "/usr/sbin/$n" ] || {{ echo "slurmd image: no /usr/sbin/$n (the Debian package installs $n-wlm; its maintainer scripts make $n with update-alternatives, which an image from extracted packages must recreate)" >&2; exit 1; }}; done; [ "$(id -u slurm):$(id -g slurm)" = "{uid}:{uid}" ] || {{ echo "slurmd image: slurm is $(id -u slurm):$(id -g slurm), Slinky uses {uid}:{uid}" >&2; exit 1; }}; }}"#
    )
}

/// Slinky's cgroup.conf where Slurm's cgroup/v2 can work, or why not; `constrain` adds
/// `ConstrainDevices=yes` (a user's addition).
fn cgroup_conf(bed: &Bed, constrain: bool) -> Result<String> {
    let fs = bed.in_node(&["stat", "-fc", "%T", "/sys/fs/cgroup"])?;
    let mut conf = if fs.trim() == "cgroup2fs" {
        "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n".to_owned()
    } else if constrain {
        // a cgroup v1 host (v1 controllers, an empty cgroup2 at /sys/fs/cgroup/unified): Slurm's
        // cgroup/v2 refuses it (below); its cgroup/v1 confines devices through the v1 controller
        "CgroupPlugin=cgroup/v1\n".to_owned()
    } else {
        // slurmd's cgroup/v2 plugin stops at start on a v1 host, whatever CgroupMountpoint says:
        // "fatal: Hybrid mode is not supported. Mounted cgroups are: ..." (it reads the v1 lines
        // of /proc/self/cgroup). Slurm then runs without cgroups (proctrack/linuxproc)
        "CgroupPlugin=disabled\n".to_owned()
    };
    if constrain {
        conf.push_str("ConstrainDevices=yes\n");
    }
    Ok(conf)
}

/// The partitions of the README's values for Slinky's chart (examples/slinky-values.yaml), as the
/// operator writes them: the chart defines none by default, and without one srun fails.
fn partitions() -> Result<String> {
    let repo = std::env::var("REPO").context("$REPO")?;
    let path = std::path::Path::new(&repo).join("examples/slinky-values.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let values: Value =
        serde_saphyr::from_str(&text).with_context(|| path.display().to_string())?;
    let mut out = String::new();
    if let Some(parts) = values.get("partitions").and_then(Value::as_object) {
        for (name, p) in parts {
            if p.get("enabled").and_then(Value::as_bool) == Some(true) {
                out.push_str(&format!(
                    "PartitionName={name} Nodes=ALL Default=YES MaxTime=UNLIMITED\n"
                ));
            }
        }
    }
    ensure!(
        !out.is_empty(),
        "{}: no enabled partition (srun needs one)",
        path.display()
    );
    Ok(out)
}

/// slurm.conf as Slinky's operator generates it (`@CTLD_ADDR@`: the controller's pod IP).
fn slurm_conf(cgroup: &str) -> Result<String> {
    let mut conf = format!(
        "ClusterName=slinky
SlurmUser=slurm
SlurmctldHost={CTLD}(@CTLD_ADDR@)
SlurmctldPort=6817
StateSaveLocation=/var/spool/slurmctld
SlurmdUser=root
SlurmdPort=6818
SlurmdSpoolDir=/var/spool/slurmd
MaxNodeCount=1024
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AuthType=auth/slurm
CredType=cred/slurm
AuthInfo=use_client_ids
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=/etc/slurm/jwt_hs256.key
SlurmctldParameters=enable_configless,reconfig_on_restart
AccountingStorageType=accounting_storage/none
GresTypes=gpu
NodeSet={NODESET} Feature={NODESET}
"
    );
    conf.push_str(&partitions()?);
    if cgroup.lines().any(|l| l == "CgroupPlugin=disabled") {
        conf.push_str("ProctrackType=proctrack/linuxproc\n");
    }
    if cgroup.lines().any(|l| l == "ConstrainDevices=yes") {
        conf.push_str("TaskPlugin=task/cgroup\n");
    }
    Ok(conf)
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(SLINKY_NS.to_owned()),
        ..ObjectMeta::default()
    }
}

/// `n` random bytes (a key).
fn random(n: usize) -> Result<ByteString> {
    let mut b = vec![0; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(ByteString(b))
}

/// A Secret of one key.
fn secret(name: &str, key: &str, value: ByteString) -> Secret {
    Secret {
        metadata: meta(name),
        data: Some(BTreeMap::from([(key.to_owned(), value)])),
        ..Secret::default()
    }
}

/// A command in the slurmctld container: its standard output, or an error with its standard error.
pub(crate) fn ctld(args: &[&str]) -> Result<String> {
    let mut all = vec!["-n", SLINKY_NS, "exec", CTLD, "-c", "slurmctld", "--"];
    all.extend_from_slice(args);
    kubectl(&all)
}

/// `sinfo -N`: `<node> <state> <gres>` a line, from slurmctld.
pub(crate) fn sinfo() -> Result<String> {
    Ok(ctld(&["sinfo", "-h", "-N", "-o", "%N %T %G"])?
        .trim_end()
        .to_owned())
}

/// `srun -D / -N1 ARGS` from slurmctld, bounded to 60 s: its standard output.
pub(crate) fn srun(args: &[&str]) -> Result<String> {
    let mut all = vec!["timeout", "60", "srun", "-D", "/", "-N1"];
    all.extend_from_slice(args);
    ctld(&all)
}

/// The `CUDA_VISIBLE_DEVICES=` line of `srun --gres=gpu:2 env`.
pub(crate) fn srun_cuda_visible() -> Result<String> {
    let out = srun(&["--gres=gpu:2", "env"])?;
    out.lines()
        .find(|l| l.starts_with("CUDA_VISIBLE_DEVICES="))
        .map(str::to_owned)
        .context("srun -N1 --gres=gpu:2 env: the job has no CUDA_VISIBLE_DEVICES")
}

/// What helps when a Slinky step fails: sinfo, the pods (their events, the slurmd logfile
/// sidecar's and container's logs), slurmctld's log.
pub(crate) async fn logs(client: &Client) -> String {
    let mut s = String::from("--- sinfo:\n");
    match ctld(&["sinfo", "-N", "-o", "%N %T %G %E"]) {
        Ok(o) => s.push_str(&o),
        Err(e) => s.push_str(&format!("{e:#}\n")),
    }
    s.push_str(&pods_report(client, SLINKY_NS, "", 20).await);
    s.push_str("--- slurmctld.log:\n");
    match ctld(&["tail", "-20", "/var/log/slurm/slurmctld.log"]) {
        Ok(o) => s.push_str(&o),
        Err(e) => s.push_str(&format!("{e:#}\n")),
    }
    s
}

/// An error with the Slinky logs appended.
pub(crate) async fn with_logs(client: &Client, e: anyhow::Error) -> anyhow::Error {
    anyhow!("{e:#}\n{}", logs(client).await)
}

/// `Err(what + the Slinky logs)` unless `ok`.
pub(crate) async fn check(client: &Client, ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(with_logs(client, anyhow!(what())).await)
    }
}

/// Waits for a pod of the namespace to be Ready; its events and logs when it is not.
async fn wait_ready(client: &Client, name: &str) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SLINKY_NS);
    match wait_object(
        &pods,
        name,
        120,
        &format!("{name} to be Ready"),
        pod_ready(),
    )
    .await
    {
        Ok(p) => Ok(p),
        Err(e) => Err(anyhow!(
            "{e:#}\n{}",
            pods_report(client, SLINKY_NS, "", 20).await
        )),
    }
}

fn pod_ip(p: &Pod) -> Result<String> {
    p.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .with_context(|| {
            format!(
                "pod {} has no IP",
                p.metadata.name.as_deref().unwrap_or_default()
            )
        })
}

/// The slurm.key and JWT key Secrets, the config ConfigMap (gres.conf `AutoDetect=<autodetect>`,
/// cgroup.conf), the slurmctld pod; its IP once slurmctld answers.
pub(crate) async fn controller_up(
    client: &Client,
    bed: &Bed,
    autodetect: &str,
    constrain: bool,
) -> Result<String> {
    let cgroup = cgroup_conf(bed, constrain)?;
    create_namespace(client, SLINKY_NS).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SLINKY_NS);
    apply(
        &secrets,
        &secret("slurm-auth-slurm", "slurm.key", random(1024)?),
    )
    .await?;
    apply(
        &secrets,
        &secret("slurm-auth-jwths256", "jwt_hs256.key", random(32)?),
    )
    .await?;
    let config = ConfigMap {
        metadata: meta("slurm-config"),
        data: Some(BTreeMap::from([
            ("slurm.conf".to_owned(), slurm_conf(&cgroup)?),
            ("cgroup.conf".to_owned(), cgroup),
            ("gres.conf".to_owned(), format!("AutoDetect={autodetect}\n")),
        ])),
        ..ConfigMap::default()
    };
    apply(&Api::namespaced(client.clone(), SLINKY_NS), &config).await?;
    // Slinky's controller copies its configuration and key into /etc/slurm (the key owned by
    // SlurmUser, 0600); slurmctld starts as root and runs as SlurmUser
    let script = format!(
        r#"{}
need slurmctld
sed "s/@CTLD_ADDR@/$POD_IP/" /mnt/slurm/slurm.conf > /etc/slurm/slurm.conf
cp /mnt/slurm/cgroup.conf /mnt/slurm/gres.conf /etc/slurm/
install -o slurm -g slurm -m 600 /mnt/slurm-key/slurm.key /etc/slurm/slurm.key
install -o slurm -g slurm -m 600 /mnt/jwt-key/jwt_hs256.key /etc/slurm/jwt_hs256.key
install -d -o slurm -g slurm /var/spool/slurmctld /var/log/slurm
exec slurmctld -D
"#,
        need(&slurm_uid()?)
    );
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": CTLD, "namespace": SLINKY_NS, "labels": {
            "app.kubernetes.io/name": "slurmctld", "app.kubernetes.io/instance": "slurm",
            "app.kubernetes.io/component": "controller"}},
        "spec": {
            "automountServiceAccountToken": false, "enableServiceLinks": false,
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "slurmctld", "image": "localhost/slurmd:1", "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c"], "args": [script],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                "volumeMounts": [
                    {"name": "slurm-config", "mountPath": "/mnt/slurm", "readOnly": true},
                    {"name": "slurm-key", "mountPath": "/mnt/slurm-key", "readOnly": true},
                    {"name": "jwt-key", "mountPath": "/mnt/jwt-key", "readOnly": true}]
            }],
            "volumes": [
                {"name": "slurm-config", "configMap": {"name": "slurm-config"}},
                {"name": "slurm-key", "secret": {"secretName": "slurm-auth-slurm", "defaultMode": 0o600}},
                {"name": "jwt-key", "secret": {"secretName": "slurm-auth-jwths256", "defaultMode": 0o600}}]
        }
    }))?;
    apply(&Api::namespaced(client.clone(), SLINKY_NS), &pod).await?;
    let pod = wait_ready(client, CTLD).await?;
    if let Err(e) = wait_for(60, "slurmctld to answer scontrol ping", || async {
        ctld(&["scontrol", "ping"]).is_ok()
    })
    .await
    {
        return Err(with_logs(client, e).await);
    }
    pod_ip(&pod)
}

/// slurmrestd as Slinky runs it, against the controller at `ctld_ip`: JWT only, and
/// `SLURM_JWT=daemon` (each request reaches slurmctld with its client's token). It refuses to
/// run as root, SlurmUser or nobody: a user of its own. Its IP.
pub(crate) async fn restapi_up(client: &Client, ctld_ip: &str) -> Result<String> {
    let script = format!(
        r#"set -e
sed "s/@CTLD_ADDR@/$CTLD_ADDR/" /mnt/slurm/slurm.conf > /etc/slurm/slurm.conf
echo 'slurmrestd:x:65532:65532::/nonexistent:/usr/sbin/nologin' >> /etc/passwd
echo 'slurmrestd:x:65532:' >> /etc/group
exec slurmrestd -s openapi/slurmctld -a rest_auth/jwt -u slurmrestd -g slurmrestd 0.0.0.0:{RESTAPI_PORT}
"#
    );
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": RESTAPI, "namespace": SLINKY_NS, "labels": {
            "app.kubernetes.io/name": "slurmrestd", "app.kubernetes.io/instance": "slurm",
            "app.kubernetes.io/component": "restapi"}},
        "spec": {
            "automountServiceAccountToken": false, "enableServiceLinks": false,
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "slurmrestd", "image": "localhost/slurmd:1", "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c"], "args": [script],
                "env": [{"name": "SLURM_JWT", "value": "daemon"}, {"name": "CTLD_ADDR", "value": ctld_ip}],
                "ports": [{"name": "slurmrestd", "containerPort": RESTAPI_PORT}],
                "readinessProbe": {"tcpSocket": {"port": RESTAPI_PORT}, "periodSeconds": 2},
                "volumeMounts": [{"name": "slurm-config", "mountPath": "/mnt/slurm", "readOnly": true}]
            }],
            "volumes": [{"name": "slurm-config", "configMap": {"name": "slurm-config"}}]
        }
    }))?;
    apply(&Api::namespaced(client.clone(), SLINKY_NS), &pod).await?;
    pod_ip(&wait_ready(client, RESTAPI).await?)
}

/// The slurmd DaemonSet in Slinky's pod shape, against the controller at `ctld_ip`; waits for it
/// to roll out and for slurmd to be idle in sinfo. The time it took.
pub(crate) async fn nodeset_up(client: &Client, ctld_ip: &str) -> Result<std::time::Duration> {
    let t = Instant::now();
    let script = format!(
        "{}\nneed slurmd slurmstepd\nmkdir -p /var/spool/slurmd\nexec slurmd -D -Z --conf-server {ctld_ip}:6817 --conf 'Features={NODESET}'\n",
        need(&slurm_uid()?)
    );
    let ds: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": NODESET, "namespace": SLINKY_NS},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "slurmd", "app.kubernetes.io/instance": NODESET}},
            "template": {
                "metadata": {
                    "labels": {"app.kubernetes.io/name": "slurmd", "app.kubernetes.io/instance": NODESET,
                        "app.kubernetes.io/component": "worker", "slinky.slurm.net/cluster": "slurm"},
                    "annotations": {"kubectl.kubernetes.io/default-container": "slurmd"}
                },
                "spec": {
                    // Slinky's DaemonSet mode names each pod's host after its node (the Slurm
                    // node name); a Kubernetes DaemonSet has one template, which on this
                    // one-node test bed can say it
                    "hostname": NODE,
                    "nodeSelector": {PCI_LABEL: "true"},
                    "automountServiceAccountToken": false, "enableServiceLinks": false,
                    "terminationGracePeriodSeconds": 5,
                    // a native sidecar (musl-style static busybox, as Slinky's alpine)
                    "initContainers": [{
                        "name": "logfile", "image": "localhost/busybox:1", "imagePullPolicy": "Never",
                        "restartPolicy": "Always",
                        "command": ["/bin/sh", "-c", "touch /var/log/slurm/slurmd.log && exec tail -n +1 -F /var/log/slurm/slurmd.log"],
                        "volumeMounts": [{"name": "slurm-logfile", "mountPath": "/var/log/slurm"}]
                    }],
                    // (Slinky's supervisord keeps slurmd in the foreground: -D)
                    "containers": [{
                        "name": "slurmd", "image": "localhost/slurmd:1", "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", script],
                        "ports": [{"name": "slurmd", "containerPort": 6818}],
                        "securityContext": {"privileged": true,
                            "capabilities": {"add": ["BPF", "NET_ADMIN", "SYS_ADMIN", "SYS_NICE"]}},
                        "resources": {"limits": {RES: "4"}},
                        "volumeMounts": [
                            {"name": "slurm-etc", "mountPath": "/etc/slurm", "readOnly": true},
                            {"name": "slurm-logfile", "mountPath": "/var/log/slurm"}]
                    }],
                    "volumes": [
                        {"name": "slurm-etc", "projected": {"defaultMode": 0o600, "sources": [
                            {"secret": {"name": "slurm-auth-slurm", "items": [{"key": "slurm.key", "path": "slurm.key"}]}}]}},
                        {"name": "slurm-logfile", "emptyDir": {}}]
                }
            }
        }
    }))?;
    let sets: Api<DaemonSet> = Api::namespaced(client.clone(), SLINKY_NS);
    apply(&sets, &ds).await?;
    let what = "the slurmd DaemonSet to roll out";
    if let Err(e) = wait_object(&sets, NODESET, 120, what, daemonset_rolled_out).await {
        return Err(with_logs(client, e).await);
    }
    let prefix = format!("{NODE} idle ");
    let idle = wait_for(60, &format!("slurmd {NODE} idle in sinfo"), || async {
        sinfo().is_ok_and(|s| s.lines().any(|l| l.starts_with(&prefix)))
    })
    .await;
    if let Err(e) = idle {
        return Err(with_logs(client, e).await);
    }
    Ok(t.elapsed())
}

/// The slurmd pod.
pub(crate) async fn slurmd_pod(client: &Client) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SLINKY_NS);
    let list = pods
        .list(&ListParams::default().labels(SLURMD_PODS))
        .await?;
    list.items
        .into_iter()
        .next()
        .with_context(|| format!("no slurmd pod ({SLURMD_PODS}) in {SLINKY_NS}"))
}

/// Waits up to `secs` for sinfo to show `NODE idle <gres>`; the Slinky logs when it does not.
pub(crate) async fn wait_gres(client: &Client, secs: u64, gres: &str) -> Result<()> {
    let want = format!("{NODE} idle {gres}");
    let r = wait_for(secs, &format!("sinfo: {want}"), || async {
        sinfo().is_ok_and(|s| s == want)
    })
    .await;
    match r {
        Ok(()) => Ok(()),
        Err(e) => {
            let now = sinfo().unwrap_or_else(|e| format!("{e:#}"));
            Err(with_logs(client, anyhow!("{e:#}; sinfo shows {now:?}")).await)
        }
    }
}

/// `(mockgpu mounts, LD_PRELOAD of PID 1, nvidia devices, /proc/driver/nvidia present)` seen
/// from inside a container of the slurmd pod.
async fn injection(client: &Client, container: &str) -> Result<(u32, u32, u32, bool)> {
    let pod = slurmd_pod(client).await?;
    let name = pod.metadata.name.unwrap_or_default();
    let script = r#"m=$(grep -cE " (/run/mockgpu|/etc/ld.so.preload) " /proc/1/mountinfo || true)
p=$(tr "\0" "\n" < /proc/1/environ | grep -c "^LD_PRELOAD=.*libmockfs" || true)
d=$(ls /dev | grep -c "^nvidia" || true)
if [ -e /proc/driver/nvidia ]; then n=present; else n=absent; fi
echo "$m $p $d $n""#;
    let out = kubectl(&[
        "-n", SLINKY_NS, "exec", &name, "-c", container, "--", "/bin/sh", "-c", script,
    ])?;
    let f: Vec<&str> = out.split_whitespace().collect();
    let num = |i: usize| -> Result<u32> {
        f.get(i).and_then(|s| s.parse().ok()).with_context(|| {
            format!("{container}: not '<mounts> <preload> <devices> <present|absent>': {out:?}")
        })
    };
    Ok((num(0)?, num(1)?, num(2)?, f.get(3) == Some(&"present")))
}

/// The namespace and its pods gone; the label removed if the step set it.
pub(crate) async fn down(client: &Client, labelled: bool) -> Result<()> {
    let gone = delete_namespace(client, SLINKY_NS, 90).await;
    if labelled {
        let nodes: Api<Node> = Api::all(client.clone());
        let unlabel = json!({"metadata": {"labels": {PCI_LABEL: null}}});
        nodes
            .patch(NODE, &PatchParams::default(), &Patch::Merge(&unlabel))
            .await
            .with_context(|| format!("removing the label {PCI_LABEL} from {NODE}"))?;
    }
    gone
}

/// Slinky's slurmctld and slurmd pods find the agent's GPUs, and jobs get them (gres.conf
/// `AutoDetect=nvml`: Slurm's NVML plugin over the mock libnvidia-ml.so.1 the slurmd container is
/// given; `ConstrainDevices=yes`: a job lists and opens only its own GPUs); the slurmd container is
/// injected, its logfile sidecar is not. chart-slinky-remediation runs the README's
/// `AutoDetect=nvidia`.
pub async fn slinky_slurm(bed: &Bed) -> Result<()> {
    let client = client().await?;
    // the controller labels GPU nodes; until it runs here, the step labels the node itself (and
    // removes the label again)
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(NODE).await?;
    let labelled = label(Some(&node), PCI_LABEL).is_empty();
    if labelled {
        let set = json!({"metadata": {"labels": {PCI_LABEL: "true"}}});
        nodes
            .patch(NODE, &PatchParams::default(), &Patch::Merge(&set))
            .await
            .with_context(|| format!("labelling {NODE} {PCI_LABEL}=true"))?;
    }
    // a failed step leaves the node as it found it too
    let r = slinky_slurm_on(bed, &client).await;
    let d = down(&client, labelled).await;
    r.and(d)
}

async fn slinky_slurm_on(bed: &Bed, client: &Client) -> Result<()> {
    let version = bed.in_node(&["slurmd", "-V"])?;
    let fs = bed.in_node(&["stat", "-fc", "%T", "/sys/fs/cgroup"])?;
    println!(
        "  {}; cgroup.conf: {}(/sys/fs/cgroup is {})",
        version.trim(),
        cgroup_conf(bed, true)?.replace('\n', " "),
        fs.trim()
    );
    let t = Instant::now();
    let ip = controller_up(client, bed, "nvml", true).await?;
    bed.timing("slinky-slurmctld-ready", &format!("{} ms", ms(t.elapsed())));
    let s = ctld(&[
        "sh",
        "-c",
        r#"readlink -f /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/slurmstepd | tr "\n" " "; id slurm"#,
    ])?;
    println!("  slurmctld at {ip}; {}", s.trim());
    let uid = slurm_uid()?;
    ensure!(
        s.contains(&format!("uid={uid}(slurm) gid={uid}(slurm)")),
        "the slurmd image's slurm user is not {uid}:{uid}: {s}"
    );
    let owner = ctld(&["stat", "-c", "%u", "/etc/slurm/slurm.key"])?;
    ensure!(
        owner.trim() == uid,
        "slurm.key in slurmctld is owned by {}, want slurm ({uid})",
        owner.trim()
    );
    let took = nodeset_up(client, &ip).await?;
    bed.timing("slinky-slurmd-idle", &format!("{} ms", ms(took)));
    let sockets = gres_sockets(bed)?;
    ensure!(!sockets.is_empty(), "no socket found for the served GPUs");
    let s = sinfo()?;
    println!("  gres.conf AutoDetect=nvml: sinfo -N -o '%N %T %G': {s}");
    let want = format!("{NODE} idle gpu:nvidia_gb300:4(S:{sockets})");
    check(client, s == want, || {
        format!("sinfo: want {want:?}, got {s:?}")
    })
    .await?;
    let s = match srun_cuda_visible() {
        Ok(s) => s,
        Err(e) => return Err(with_logs(client, e).await),
    };
    println!("  srun -N1 --gres=gpu:2 env: {s}");
    ensure!(
        s == "CUDA_VISIBLE_DEVICES=0,1",
        "srun -N1 --gres=gpu:2 env: want CUDA_VISIBLE_DEVICES=0,1, got {s}"
    );
    // the README's verification with ConstrainDevices=yes: exactly the two GPUs Slurm gave the
    // job (their UUIDs); in the job (uid 401, as Slinky's), the other two nodes refuse to open
    let uuids = gpu_uuids(bed)?;
    let uuid = |minor: u32| {
        uuids
            .iter()
            .find(|(m, _)| *m == minor)
            .map_or("", |(_, u)| u.as_str())
    };
    let s = match srun(&[
        "--gres=gpu:2",
        "bash",
        "-c",
        r#"echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; nvidia-smi -L"#,
    ]) {
        Ok(s) => s,
        Err(e) => return Err(with_logs(client, e.context("srun nvidia-smi -L")).await),
    };
    let s = s.trim_end();
    for l in s.lines() {
        println!("  ConstrainDevices=yes: srun --gres=gpu:2 nvidia-smi -L: {l}");
    }
    let want = format!(
        "CUDA_VISIBLE_DEVICES=0,1\nGPU 0: NVIDIA GB300 (UUID: {})\nGPU 1: NVIDIA GB300 (UUID: {})",
        uuid(0),
        uuid(1)
    );
    ensure!(
        s == want,
        "the README's verification with ConstrainDevices=yes: want\n{want}\ngot\n{s}"
    );
    let s =
        srun(&["--gres=gpu:2", "sh", "-c", OPEN_GPUS]).context("srun: opening the GPU nodes")?;
    let s = s.trim_end();
    println!("  open in a job with gpu:2: {}", s.replace('\n', ";"));
    ensure!(
        s == "0 ok\n1 ok\n2 Operation not permitted\n3 Operation not permitted",
        "opening the GPU nodes in a job: want 0 and 1 to open, EPERM for 2 and 3; got\n{s}"
    );
    let s = match srun(&["ls", "/proc/driver/nvidia/gpus"]) {
        Ok(s) => s,
        Err(e) => return Err(with_logs(client, e).await),
    };
    println!(
        "  job: ls /proc/driver/nvidia/gpus: {}",
        s.split_whitespace().collect::<Vec<_>>().join(" ")
    );
    let n = s.lines().filter(|l| crate::slurm::is_bus_id(l)).count();
    ensure!(
        n == 4,
        "the job sees {n} GPUs in /proc/driver/nvidia/gpus, want 4: {s}"
    );
    // the slurmd container is injected (mockgpu mounts, the shim, GPU devices), its sidecar is not
    let inj = injection(client, "slurmd").await?;
    let side = injection(client, "logfile").await?;
    println!(
        "  mockgpu mounts, LD_PRELOAD, /dev/nvidia*, /proc/driver/nvidia: slurmd {inj:?}; logfile sidecar {side:?}"
    );
    let (m, p, d, _) = inj;
    ensure!(
        m >= 2 && p == 1 && d >= 4,
        "the slurmd container is not injected: {m} mockgpu mounts (want 2 or more), LD_PRELOAD {p} (want 1), {d} nvidia devices (want 4 or more)"
    );
    ensure!(
        side == (0, 0, 0, false),
        "the logfile sidecar got an injection: mounts, LD_PRELOAD, devices, /proc/driver/nvidia = {side:?}"
    );
    Ok(())
}
