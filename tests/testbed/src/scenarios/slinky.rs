//! Slinky's shape of Slurm on the cluster (cluster mode, Slurm 25.11 and later): slurmctld,
//! slurmrestd and slurmd as SchedMD's operator builds them (its Secrets, ConfigMap, Services,
//! labels, the slurmd pods with their logfile sidecar), on the pod network. The daemons find each
//! other as the operator's do: through its Services and cluster DNS (kube-proxy and CoreDNS run
//! in cluster mode): `SlurmctldHost=slurm-controller-0(slurm-controller.slurm)`, slurmd's
//! `--conf-server slurm-controller.slurm:6817`, slurmrestd at `http://slurm-restapi.slurm:6820`,
//! and each slurmd pod named `<node>` in the headless `slurm-workers-slurm` Service.
//!
//! `slinky-slurm` runs this on the host agent (gres.conf `AutoDetect=nvml`, `ConstrainDevices=yes`),
//! on node0 only (the host agent serves node0 alone); `chart-slinky-remediation` (chart.rs) on the
//! chart's agent and controller, on every node the chart's controller labelled (node0 and, with
//! `NODES=2`, node1).

use std::collections::BTreeMap;
use std::io::Read as _;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::bed::{Bed, wait_for};
use crate::cluster::{
    NODE, RES, apply, client, create_namespace, daemonset_rolled_out, delete_namespace, kubectl,
    label, pod_ready, pods_report, wait_object,
};
use crate::node::ms;
use crate::slurm::{OPEN_GPUS, VERIFY, check_open, check_verify, gres_sockets};

/// Slinky's namespace.
pub(crate) const SLINKY_NS: &str = "slurm";
/// The NodeSet's name in slurm.conf: the slurmd pods' Features.
const NODESET: &str = "gpu";
/// The operator's name for the NodeSet's objects (`slurm-worker-<nodeset>`): the slurmd pods'
/// instance label.
const INSTANCE: &str = "slurm-worker-gpu";
/// Slinky's controller pod (StatefulSet slurm-controller, ordinal 0).
pub(crate) const CTLD: &str = "slurm-controller-0";
/// The operator's Service in front of slurmctld.
const CTLD_SVC: &str = "slurm-controller";
/// Slinky's slurmrestd (a Deployment and Service of that name).
const RESTAPI: &str = "slurm-restapi";
/// slurmrestd's port.
const RESTAPI_PORT: u16 = 6820;
/// The operator's headless Service of the slurmd pods (their `subdomain`).
const WORKERS_SVC: &str = "slurm-workers-slurm";
/// The label the slurmd pods select nodes by (the controller sets it on GPU nodes).
pub(crate) const PCI_LABEL: &str = "feature.node.kubernetes.io/pci-10de.present";
/// The slurmd pods' selector.
const SLURMD_PODS: &str =
    "app.kubernetes.io/name=slurmd,app.kubernetes.io/instance=slurm-worker-gpu";
/// Slinky's worker taint (cluster.sh's `WORKER_TAINT`: the workers register with it).
const WORKER_TAINT_KEY: &str = "nodeset.slinky.slurm.net/worker";

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

/// The slurmd container's entrypoint after `need`: supervisord as PID 1 with slurmd, sshd and
/// sssd (a local domain, as Slinky's image has one configured), the arguments as SLURMD_OPTIONS.
const SUPERVISED: &str = r#"need slurmd slurmstepd sshd sssd
command -v supervisord > /dev/null || { echo "slurmd image: no supervisord (Debian's supervisor)" >&2; exit 1; }
mkdir -p /var/spool/slurmd /run/sshd
printf '[sssd]\nservices = nss\ndomains = local\n[domain/local]\nid_provider = proxy\nproxy_lib_name = files\nauth_provider = none\n' > /etc/sssd/sssd.conf
chmod 600 /etc/sssd/sssd.conf
export SLURMD_OPTIONS="$*"
cat > /run/supervisord.conf << 'EOF'
[supervisord]
nodaemon=true
user=root
logfile=/dev/null
logfile_maxbytes=0
pidfile=/run/supervisord.pid
[program:slurmd]
command=bash -xc "exec slurmd -D %(ENV_SLURMD_OPTIONS)s"
stdout_logfile=/dev/stdout
stdout_logfile_maxbytes=0
redirect_stderr=true
[program:sshd]
command=/usr/sbin/sshd -D -e
stdout_logfile=/dev/stdout
stdout_logfile_maxbytes=0
redirect_stderr=true
[program:sssd]
command=/usr/sbin/sssd -i --logger=stderr
stdout_logfile=/dev/stdout
stdout_logfile_maxbytes=0
redirect_stderr=true
EOF
exec supervisord -c /run/supervisord.conf
"#;

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

/// slurm.conf as Slinky's operator generates it: slurmctld by its Service's name.
fn slurm_conf(cgroup: &str) -> Result<String> {
    let mut conf = format!(
        "ClusterName=slurm_slurm
SlurmUser=slurm
SlurmctldHost={CTLD}({CTLD_SVC}.{SLINKY_NS})
SlurmctldPort=6817
StateSaveLocation={STATESAVE}
SlurmdUser=root
SlurmdPort=6818
SlurmdSpoolDir=/var/spool/slurmd
MaxNodeCount=1024
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmSchedLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AuthType=auth/slurm
CredType=cred/slurm
AuthInfo=use_client_ids
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=/etc/slurm/jwt.key
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

/// slurmctld's StateSaveLocation (`/var/spool/slurmctld/<ClusterName>`, a volume of its own).
const STATESAVE: &str = "/var/spool/slurmctld/slurm_slurm";

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

/// `srun -D / -N1 -w node0 ARGS` from slurmctld (as slurm, the pod's user), bounded to 60 s:
/// its standard output.
pub(crate) fn srun(args: &[&str]) -> Result<String> {
    let mut all = vec!["timeout", "60", "srun", "-D", "/", "-N1", "-w", NODE];
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

/// The operator's probes of slurmctld and slurmd: HTTP `GET /livez` (startup, liveness) and
/// `/readyz` (readiness) on the daemon's own port (Slurm 25.11 and later answer them there), every
/// 2 s instead of the operator's 10 s (so that the steps do not wait for a period).
fn http_probes(port: &str) -> Value {
    let get = |path: &str, failures: u32| {
        json!({"httpGet": {"path": path, "port": port, "scheme": "HTTP"},
            "periodSeconds": 2, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": failures})
    };
    json!({"startupProbe": get("/livez", 6), "livenessProbe": get("/livez", 6),
        "readinessProbe": get("/readyz", 3)})
}

/// Merges the object `extra` into the object `v`.
fn merge(v: &mut Value, extra: Value) {
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
}

/// The operator's Services: `slurm-controller` and `slurm-restapi` (ClusterIP, by the pods' named
/// ports) and the slurmd pods' headless `slurm-workers-slurm` (their `subdomain`, with the
/// addresses of pods not yet ready).
async fn services_up(client: &Client) -> Result<()> {
    let svcs: Api<Service> = Api::namespaced(client.clone(), SLINKY_NS);
    let labels = |name: &str, component: &str| {
        json!({"app.kubernetes.io/name": name, "app.kubernetes.io/instance": "slurm",
            "app.kubernetes.io/component": component})
    };
    for v in [
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": CTLD_SVC, "namespace": SLINKY_NS, "labels": labels("slurmctld", "controller")},
            "spec": {"type": "ClusterIP",
                "selector": {"app.kubernetes.io/instance": "slurm", "app.kubernetes.io/name": "slurmctld"},
                "ports": [{"name": "slurmctld", "port": 6817, "protocol": "TCP", "targetPort": "slurmctld"}]}}),
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": RESTAPI, "namespace": SLINKY_NS, "labels": labels("slurmrestd", "restapi")},
            "spec": {"type": "ClusterIP",
                "selector": {"app.kubernetes.io/instance": "slurm", "app.kubernetes.io/name": "slurmrestd"},
                "ports": [{"name": "slurmrestd", "port": RESTAPI_PORT, "protocol": "TCP", "targetPort": "slurmrestd"}]}}),
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": WORKERS_SVC, "namespace": SLINKY_NS},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": true,
                "selector": {"app.kubernetes.io/name": "slurmd", "slinky.slurm.net/cluster": "slurm"},
                "ports": [{"name": "slurmd", "port": 6818, "protocol": "TCP", "targetPort": "slurmd"}]}}),
    ] {
        let svc: Service = serde_json::from_value(v)?;
        apply(&svcs, &svc).await?;
    }
    Ok(())
}

/// The slurm.key and JWT key Secrets, the config ConfigMap (gres.conf `AutoDetect=<autodetect>`,
/// cgroup.conf; `extra` lines appended to slurm.conf, as the chart's `extraConfMap`), the
/// operator's Services, the slurmctld pod as the operator's StatefulSet runs it
/// (uid, gid and fsGroup 401, runAsNonRoot); returns once slurmctld answers.
pub(crate) async fn controller_up(
    client: &Client,
    bed: &Bed,
    autodetect: &str,
    constrain: bool,
    extra: &str,
) -> Result<()> {
    let cgroup = cgroup_conf(bed, constrain)?;
    create_namespace(client, SLINKY_NS).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SLINKY_NS);
    apply(
        &secrets,
        &secret("slurm-auth-slurm", "slurm.key", random(1024)?),
    )
    .await?;
    apply(&secrets, &secret("slurm-auth-jwt", "jwt.key", random(32)?)).await?;
    let config = ConfigMap {
        metadata: meta("slurm-config"),
        data: Some(BTreeMap::from([
            ("slurm.conf".to_owned(), slurm_conf(&cgroup)? + extra),
            ("cgroup.conf".to_owned(), cgroup),
            ("gres.conf".to_owned(), format!("AutoDetect={autodetect}\n")),
        ])),
        ..ConfigMap::default()
    };
    apply(&Api::namespaced(client.clone(), SLINKY_NS), &config).await?;
    services_up(client).await?;
    // the operator's slurmctld runs as slurm (401) from the start (a projected /etc/slurm, group
    // 401 through fsGroup); here the pod copies the files into an emptyDir, so that the keys are
    // the user's own, mode 0600, as slurmctld wants them. The state directory is the operator's
    // volume claim; an emptyDir is world-writable (slurmctld warns), so it gets one of its own, 0700
    let uid = slurm_uid()?;
    let script = format!(
        r#"{}
need slurmctld
[ "$(id -u):$(id -g)" = "{uid}:{uid}" ] || {{ echo "slurmctld runs as $(id -u):$(id -g), want {uid}:{uid} (the pod's runAsUser/runAsGroup)" >&2; exit 1; }}
cp /mnt/slurm/slurm.conf /mnt/slurm/cgroup.conf /mnt/slurm/gres.conf /etc/slurm/
mkdir -p -m 700 {STATESAVE}
install -m 600 /mnt/slurm-key/slurm.key /etc/slurm/slurm.key
install -m 600 /mnt/jwt-key/jwt.key /etc/slurm/jwt.key
exec slurmctld -D
"#,
        need(&uid)
    );
    let id: i64 = uid.parse().context("$SLURM_UID")?;
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": CTLD, "namespace": SLINKY_NS, "labels": {
            "app.kubernetes.io/name": "slurmctld", "app.kubernetes.io/instance": "slurm",
            "app.kubernetes.io/component": "controller", "app.kubernetes.io/part-of": "slurm"},
            "annotations": {"kubectl.kubernetes.io/default-container": "slurmctld"}},
        "spec": {
            "automountServiceAccountToken": false, "enableServiceLinks": false,
            "terminationGracePeriodSeconds": 5,
            "securityContext": {"fsGroup": id, "runAsGroup": id, "runAsNonRoot": true, "runAsUser": id},
            "containers": [{
                "name": "slurmctld", "image": "localhost/slurmd:1", "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c"], "args": [script],
                "ports": [{"name": "slurmctld", "containerPort": 6817, "protocol": "TCP"}],
                "securityContext": {"runAsGroup": id, "runAsNonRoot": true, "runAsUser": id},
                "volumeMounts": [
                    {"name": "slurm-etc", "mountPath": "/etc/slurm"},
                    {"name": "run", "mountPath": "/run"},
                    {"name": "statesave", "mountPath": "/var/spool/slurmctld"},
                    {"name": "slurm-authsocket", "mountPath": "/run/slurmctld"},
                    {"name": "slurm-logfile", "mountPath": "/var/log/slurm"},
                    {"name": "slurm-config", "mountPath": "/mnt/slurm", "readOnly": true},
                    {"name": "slurm-key", "mountPath": "/mnt/slurm-key", "readOnly": true},
                    {"name": "jwt-key", "mountPath": "/mnt/jwt-key", "readOnly": true}]
            }],
            "volumes": [
                {"name": "slurm-etc", "emptyDir": {"medium": "Memory"}},
                {"name": "run", "emptyDir": {"medium": "Memory"}},
                {"name": "statesave", "emptyDir": {}},
                {"name": "slurm-authsocket", "emptyDir": {}},
                {"name": "slurm-logfile", "emptyDir": {"medium": "Memory"}},
                {"name": "slurm-config", "configMap": {"name": "slurm-config"}},
                {"name": "slurm-key", "secret": {"secretName": "slurm-auth-slurm", "defaultMode": 0o600}},
                {"name": "jwt-key", "secret": {"secretName": "slurm-auth-jwt", "defaultMode": 0o600}}]
        }
    });
    merge(&mut pod["spec"]["containers"][0], http_probes("slurmctld"));
    let pod: Pod = serde_json::from_value(pod)?;
    apply(&Api::namespaced(client.clone(), SLINKY_NS), &pod).await?;
    wait_ready(client, CTLD).await?;
    if let Err(e) = wait_for(60, "slurmctld to answer scontrol ping", || async {
        ctld(&["scontrol", "ping"]).is_ok()
    })
    .await
    {
        return Err(with_logs(client, e).await);
    }
    Ok(())
}

/// slurmrestd as Slinky runs it: JWT only, and `SLURM_JWT=daemon` (each request reaches slurmctld
/// with its client's token). It refuses to run as root, SlurmUser or nobody: a user of its own.
/// Returns once its Service's name answers from the slurmctld pod.
pub(crate) async fn restapi_up(client: &Client) -> Result<()> {
    let script = format!(
        r#"set -e
cp /mnt/slurm/slurm.conf /etc/slurm/slurm.conf
echo 'slurmrestd:x:65532:65532::/nonexistent:/usr/sbin/nologin' >> /etc/passwd
echo 'slurmrestd:x:65532:' >> /etc/group
exec slurmrestd -s openapi/slurmctld -a rest_auth/jwt -u slurmrestd -g slurmrestd 0.0.0.0:{RESTAPI_PORT}
"#
    );
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": RESTAPI, "namespace": SLINKY_NS, "labels": {
            "app.kubernetes.io/name": "slurmrestd", "app.kubernetes.io/instance": "slurm",
            "app.kubernetes.io/component": "restapi", "app.kubernetes.io/part-of": "slurm"}},
        "spec": {
            "automountServiceAccountToken": false, "enableServiceLinks": false,
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "slurmrestd", "image": "localhost/slurmd:1", "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c"], "args": [script],
                "env": [{"name": "SLURM_JWT", "value": "daemon"}],
                "ports": [{"name": "slurmrestd", "containerPort": RESTAPI_PORT, "protocol": "TCP"}],
                "readinessProbe": {"tcpSocket": {"port": "slurmrestd"}, "periodSeconds": 2},
                "volumeMounts": [{"name": "slurm-config", "mountPath": "/mnt/slurm", "readOnly": true}]
            }],
            "volumes": [{"name": "slurm-config", "configMap": {"name": "slurm-config"}}]
        }
    }))?;
    apply(&Api::namespaced(client.clone(), SLINKY_NS), &pod).await?;
    wait_ready(client, RESTAPI).await?;
    // the name the README gives the chart's controller, from another pod
    let name = format!("{RESTAPI}.{SLINKY_NS}");
    let connect = format!("exec 3<>/dev/tcp/{name}/{RESTAPI_PORT}");
    let r = wait_for(30, &format!("{name}:{RESTAPI_PORT} to answer"), || async {
        ctld(&["bash", "-c", &connect]).is_ok()
    })
    .await;
    if let Err(e) = r {
        let why = ctld(&["bash", "-c", &connect]).err();
        return Err(with_logs(client, anyhow!("{e:#}: {why:?}")).await);
    }
    Ok(())
}

/// The nodes carrying [`PCI_LABEL`]`=true`, by name.
pub(crate) async fn labelled_nodes(client: &Client) -> Result<Vec<String>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut names: Vec<String> = nodes
        .list(&ListParams::default().labels(&format!("{PCI_LABEL}=true")))
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    names.sort();
    Ok(names)
}

/// The slurmd pods of the NodeSet in DaemonSet mode, as the operator makes them: one per node,
/// named after it (`hostname`, in the `subdomain` of the headless Service), pinned to it
/// (`matchFields metadata.name`, one slurmd per node by anti-affinity), tolerating the worker
/// taint, the arguments re-parsed by a shell (the `--conf` value arrives with its quotes). A
/// Kubernetes DaemonSet has one template, so the test bed makes one per node (each pod keeps the
/// operator's spec, and a deleted pod comes back as the operator's would). `host_network`: the
/// user guide's "Host Network" option (`hostNetwork`, `ClusterFirstWithHostNet`, the node's name).
/// `claim_template`: the slurmd container also gets a claim of that ResourceClaimTemplate, as the
/// Slinky chart's `nodesets.<name>.slurmd.resources.claims` gives it (NVIDIA's ComputeDomain
/// channels). Waits for them to roll out and for every node to be idle in sinfo: the time it took.
pub(crate) async fn nodeset_up(
    client: &Client,
    nodes: &[String],
    host_network: bool,
    claim_template: Option<&str>,
) -> Result<std::time::Duration> {
    let t = Instant::now();
    ensure!(!nodes.is_empty(), "no node for the slurmd pods");
    // Slinky's process tree: its entrypoint starts supervisord as PID 1, which runs slurmd as
    // `bash -xc "exec slurmd --systemd $SLURMD_OPTIONS"` (that shell takes the quotes off
    // `'Features=gpu'`; -D here: no systemd to notify), sshd and sssd beside it
    let script = format!("{}\n{SUPERVISED}", need(&slurm_uid()?));
    let sets: Api<DaemonSet> = Api::namespaced(client.clone(), SLINKY_NS);
    // the operator's app.kubernetes.io/version: the Slurm release of the image ("26.05")
    let v = ctld(&["slurmctld", "-V"])?;
    let version = v
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.rsplit_once('.'))
        .map(|(major_minor, _)| major_minor.to_owned())
        .with_context(|| format!("slurmctld -V: {v:?}"))?;
    for node in nodes {
        let mut spec = json!({
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                    "labelSelector": {"matchExpressions": [
                        {"key": "app.kubernetes.io/name", "operator": "In", "values": ["slurmd"]}]},
                    "topologyKey": "kubernetes.io/hostname"}]}
            },
            "tolerations": [{"key": WORKER_TAINT_KEY, "operator": "Equal", "effect": "NoExecute"}],
            "nodeSelector": {PCI_LABEL: "true", "kubernetes.io/os": "linux"},
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
                "command": ["/bin/sh", "-c", script, "entrypoint"],
                "args": ["-Z", "--conf-server", format!("{CTLD_SVC}.{SLINKY_NS}:6817"),
                    "--conf", format!("'Features={NODESET}'")],
                "env": [
                    {"name": "POD_TOPOLOGY", "valueFrom": {"fieldRef": {"apiVersion": "v1",
                        "fieldPath": "metadata.annotations['topology.slinky.slurm.net/spec']"}}},
                    {"name": "POD_CPUS", "value": "0"},
                    {"name": "POD_MEMORY", "value": "0"}],
                "ports": [{"name": "slurmd", "containerPort": 6818, "protocol": "TCP"}],
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
                {"name": "slurm-logfile", "emptyDir": {"medium": "Memory"}}]
        });
        merge(&mut spec["containers"][0], http_probes("slurmd"));
        if let Some(template) = claim_template {
            spec["resourceClaims"] = json!([{"name": "compute-domain-channel",
                "resourceClaimTemplateName": template}]);
            spec["containers"][0]["resources"]["claims"] =
                json!([{"name": "compute-domain-channel"}]);
        }
        // the operator's preStop: Slurm takes the node down before slurmd stops
        spec["containers"][0]["lifecycle"] = json!({"preStop": {"exec": {"command": ["/usr/bin/sh", "-c",
            "scontrol update nodename=$(hostname) state=down reason='slurm-operator: Pod is terminating';"]}}});
        let net = if host_network {
            json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"})
        } else {
            json!({"hostname": node, "subdomain": WORKERS_SVC, "dnsPolicy": "ClusterFirst",
                "dnsConfig": {"searches": [format!("{WORKERS_SVC}.{SLINKY_NS}.svc.cluster.local")]}})
        };
        merge(&mut spec, net);
        let ds: DaemonSet = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": format!("{INSTANCE}-{node}"), "namespace": SLINKY_NS},
            "spec": {
                "selector": {"matchLabels": {"app.kubernetes.io/name": "slurmd",
                    "app.kubernetes.io/instance": INSTANCE, "nodeset.slinky.slurm.net/pod-hostname": node}},
                "template": {
                    "metadata": {
                        "labels": {"app.kubernetes.io/name": "slurmd", "app.kubernetes.io/instance": INSTANCE,
                            "app.kubernetes.io/component": "worker", "app.kubernetes.io/part-of": "slurm",
                            "app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/version": version,
                            "helm.sh/chart": SLINKY_CHART,
                            "controller.kubernetes.io/hash": template_hash(&spec)?,
                            "nodeset.slinky.slurm.net/pod-hostname": node,
                            "nodeset.slinky.slurm.net/scaling-mode": "DaemonSet",
                            "slinky.slurm.net/cluster": "slurm"},
                        "annotations": {"kubectl.kubernetes.io/default-container": "slurmd",
                            "meta.helm.sh/release-name": "slurm", "meta.helm.sh/release-namespace": SLINKY_NS,
                            // the guide's values configure neither: the hash of nothing
                            "slinky.slurm.net/sshd-conf-hash": EMPTY_SHA256,
                            "slinky.slurm.net/sssd-conf-hash": EMPTY_SHA256}
                    },
                    "spec": spec
                }
            }
        }))?;
        apply(&sets, &ds).await?;
    }
    for node in nodes {
        let what = format!("the slurmd DaemonSet of {node} to roll out");
        let name = format!("{INSTANCE}-{node}");
        if let Err(e) = wait_object(&sets, &name, 120, &what, daemonset_rolled_out).await {
            return Err(with_logs(client, e).await);
        }
    }
    let names = nodes
        .iter()
        .map(|n| slurm_name(n, host_network))
        .collect::<Result<Vec<_>>>()?;
    let idle = wait_for(60, &format!("slurmd {names:?} idle in sinfo"), || async {
        sinfo().is_ok_and(|s| {
            names.iter().all(|n| {
                let prefix = format!("{n} idle ");
                s.lines().any(|l| l.starts_with(&prefix))
            })
        })
    })
    .await;
    if let Err(e) = idle {
        let now = sinfo().unwrap_or_else(|e| format!("{e:#}"));
        return Err(with_logs(client, anyhow!("{e:#}; sinfo shows {now:?}")).await);
    }
    // slurmctld records a dynamic node at the address it registered from: the pod's own, unless
    // something on the way (kube-proxy's masquerading) rewrote it, and then nothing reaches slurmd
    for node in nodes.iter().filter(|_| !host_network) {
        let ip = slurmd_pod_on(client, node)
            .await?
            .status
            .and_then(|s| s.pod_ip)
            .unwrap_or_default();
        let show = ctld(&["scontrol", "show", "node", node])?;
        let addr = show
            .split_whitespace()
            .find_map(|w| w.strip_prefix("NodeAddr="))
            .unwrap_or_default();
        check(client, addr == ip, || {
            format!("slurmctld has {node} at NodeAddr={addr}, want its slurmd pod's IP {ip} (a masqueraded registration: kube-proxy's masqueradeAll)")
        })
        .await?;
    }
    Ok(t.elapsed())
}

/// In the slurmd pod, the operator's Service names (`slurm-controller.slurm`, which slurmd's
/// `--conf-server` names, and `slurm-restapi.slurm`) resolve through cluster DNS to the
/// Services' cluster IPs.
async fn resolves_services(client: &Client, pod: &str) -> Result<()> {
    let svcs: Api<Service> = Api::namespaced(client.clone(), SLINKY_NS);
    for svc in [CTLD_SVC, RESTAPI] {
        let ip = svcs
            .get(svc)
            .await?
            .spec
            .and_then(|s| s.cluster_ip)
            .with_context(|| format!("Service {svc} has no cluster IP"))?;
        let name = format!("{svc}.{SLINKY_NS}");
        let out = kubectl(&[
            "-n", SLINKY_NS, "exec", pod, "-c", "slurmd", "--", "getent", "hosts", &name,
        ])
        .with_context(|| format!("getent hosts {name} in {pod}"))?;
        println!("  slurmd pod: getent hosts {name}: {}", out.trim());
        let addr = out.split_whitespace().next().unwrap_or_default();
        check(client, addr == ip, || {
            format!("getent hosts {name} in {pod}: {addr:?}, want the Service's cluster IP {ip}")
        })
        .await?;
    }
    Ok(())
}

/// Slinky's chart that creates the operator's objects (`helm.sh/chart`).
const SLINKY_CHART: &str = "slurm-1.2.1";
/// SHA-256 of nothing: the operator's `*-conf-hash` of a configuration the values leave empty.
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// `rand.SafeEncodeString`'s alphabet: no vowels, no look-alikes.
const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// The operator's `controller.kubernetes.io/hash` of a pod template, as Kubernetes' controllers
/// compute theirs: FNV-1a (32 bits) of the template, its decimal digits encoded in
/// [`SAFE_ALPHABET`].
fn template_hash(spec: &Value) -> Result<String> {
    Ok(fnv1a32(&serde_json::to_vec(spec)?)
        .to_string()
        .bytes()
        .map(|d| char::from(SAFE_ALPHABET[usize::from(d) % SAFE_ALPHABET.len()]))
        .collect())
}

/// FNV-1a, 32 bits.
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |h: u32, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// The status line of `GET <path>` on `port` of the pod, from its container (bash's /dev/tcp).
fn http_status(pod: &str, container: &str, port: u16, path: &str) -> Result<String> {
    let script = format!(
        r#"exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' >&3 && timeout 5 head -1 <&3"#
    );
    let out = kubectl(&[
        "-n", SLINKY_NS, "exec", pod, "-c", container, "--", "bash", "-c", &script,
    ])?;
    Ok(out.trim().to_owned())
}

/// The name slurmd on `node` registers under: its host name, the pod's `hostname` (the node's
/// name) on the pod network; on the host network the node's host name, which on this test bed is
/// the machine's (the nodes have no UTS namespace of their own).
pub(crate) fn slurm_name(node: &str, host_network: bool) -> Result<String> {
    if host_network {
        let h = std::fs::read_to_string("/proc/sys/kernel/hostname")?;
        Ok(h.trim().to_owned())
    } else {
        Ok(node.to_owned())
    }
}

/// The slurmd pod on `node`.
pub(crate) async fn slurmd_pod_on(client: &Client, node: &str) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SLINKY_NS);
    let sel = format!("{SLURMD_PODS},nodeset.slinky.slurm.net/pod-hostname={node}");
    let list = pods.list(&ListParams::default().labels(&sel)).await?;
    let mut live: Vec<Pod> = list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    ensure!(
        live.len() == 1,
        "{} slurmd pods ({sel}) in {SLINKY_NS}, want 1",
        live.len()
    );
    Ok(live.remove(0))
}

/// The slurmd pod on node0.
pub(crate) async fn slurmd_pod(client: &Client) -> Result<Pod> {
    slurmd_pod_on(client, NODE).await
}

/// Waits up to `secs` for sinfo to show `<node> idle <gres>` for each of `nodes` and nothing
/// else; the Slinky logs when it does not.
pub(crate) async fn wait_gres(
    client: &Client,
    secs: u64,
    nodes: &[String],
    gres: &str,
) -> Result<()> {
    let want = nodes
        .iter()
        .map(|n| format!("{n} idle {gres}"))
        .collect::<Vec<_>>()
        .join("\n");
    let r = wait_for(secs, &format!("sinfo: {want:?}"), || async {
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

/// What a container of the slurmd pod shows of the injection.
#[derive(Debug, Default, PartialEq)]
struct Injection {
    /// mockgpu's mounts in PID 1's mount table
    mounts: u32,
    /// whether PID 1's LD_PRELOAD names the shim (0 or 1)
    preload: u32,
    /// `/dev/nvidia*` entries
    devices: u32,
    /// whether `/proc/driver/nvidia` is there
    driver: bool,
    /// PID 1's command name
    init: String,
    /// the daemons of Slinky's process tree (slurmd, sshd, sssd) running with the shim loaded
    shimmed: Vec<String>,
}

impl Injection {
    /// The slurmd container as Slinky's: supervisord as PID 1, the mock's mounts, the shim in
    /// PID 1's environment and loaded in slurmd, sshd and sssd, the GPU devices and driver files.
    fn check_slurmd(&self, what: &str) -> Result<()> {
        ensure!(
            self.mounts >= 2 && self.preload == 1 && self.devices >= 4 && self.driver,
            "{what}: the slurmd container is not injected: {} mockgpu mounts (want 2 or more), LD_PRELOAD {} (want 1), {} nvidia devices (want 4 or more), /proc/driver/nvidia {}",
            self.mounts,
            self.preload,
            self.devices,
            if self.driver { "present" } else { "absent" }
        );
        ensure!(
            self.init == "supervisord",
            "{what}: PID 1 of the slurmd container is {:?}, want supervisord (Slinky's process tree)",
            self.init
        );
        let missing: Vec<&str> = ["slurmd", "sshd", "sssd"]
            .into_iter()
            .filter(|d| !self.shimmed.iter().any(|s| s == d))
            .collect();
        ensure!(
            missing.is_empty(),
            "{what}: {missing:?} not running with the shim loaded in the slurmd container (with it: {:?})",
            self.shimmed
        );
        Ok(())
    }
}

/// What a container of the slurmd pod shows of the injection, seen from inside it.
async fn injection(client: &Client, container: &str) -> Result<Injection> {
    let pod = slurmd_pod(client).await?;
    let name = pod.metadata.name.unwrap_or_default();
    let script = r#"m=$(grep -cE " (/run/mockgpu|/etc/ld.so.preload) " /proc/1/mountinfo || true)
p=$(tr "\0" "\n" < /proc/1/environ | grep -c "^LD_PRELOAD=.*libmockfs" || true)
d=$(ls /dev | grep -c "^nvidia" || true)
if [ -e /proc/driver/nvidia ]; then n=present; else n=absent; fi
s=
for q in /proc/[0-9]*; do
  c=$(cat "$q/comm" 2> /dev/null) || continue
  case $c in slurmd|sshd|sssd) ! grep -q libmockfs "$q/maps" 2> /dev/null || s="$s,$c" ;; esac
done
echo "$m $p $d $n $(cat /proc/1/comm) ${s#,}""#;
    let out = kubectl(&[
        "-n", SLINKY_NS, "exec", &name, "-c", container, "--", "/bin/sh", "-c", script,
    ])?;
    let f: Vec<&str> = out.split_whitespace().collect();
    let bad = || {
        format!(
            "{container}: not '<mounts> <preload> <devices> <present|absent> <PID 1> <daemons>': {out:?}"
        )
    };
    let num = |i: usize| -> Result<u32> { f.get(i).and_then(|s| s.parse().ok()).with_context(bad) };
    let mut shimmed: Vec<String> = f
        .get(5)
        .map(|s| s.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    shimmed.sort();
    shimmed.dedup();
    Ok(Injection {
        mounts: num(0)?,
        preload: num(1)?,
        devices: num(2)?,
        driver: f.get(3) == Some(&"present"),
        init: f.get(4).with_context(bad)?.to_string(),
        shimmed,
    })
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
    controller_up(client, bed, "nvml", true, "").await?;
    bed.timing("slinky-slurmctld-ready", &format!("{} ms", ms(t.elapsed())));
    let s = ctld(&[
        "sh",
        "-c",
        r#"readlink -f /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/slurmstepd | tr "\n" " "; id slurm; id -u"#,
    ])?;
    println!("  slurmctld: {}", s.trim().replace('\n', "; "));
    let uid = slurm_uid()?;
    ensure!(
        s.contains(&format!("uid={uid}(slurm) gid={uid}(slurm)")),
        "the slurmd image's slurm user is not {uid}:{uid}: {s}"
    );
    ensure!(
        s.lines().last() == Some(uid.as_str()),
        "kubectl exec into slurmctld runs as uid {:?}, want {uid} (runAsUser)",
        s.lines().last()
    );
    let owner = ctld(&["stat", "-c", "%u", "/etc/slurm/slurm.key"])?;
    ensure!(
        owner.trim() == uid,
        "slurm.key in slurmctld is owned by {}, want slurm ({uid})",
        owner.trim()
    );
    for path in ["/livez", "/readyz"] {
        let st = http_status(CTLD, "slurmctld", 6817, path);
        println!("  slurmctld GET {path} on 6817: {st:?}");
    }
    let took = nodeset_up(client, &[NODE.to_owned()], false, None).await?;
    bed.timing("slinky-slurmd-idle", &format!("{} ms", ms(took)));
    let pod = slurmd_pod(client).await?;
    let (labels, notes) = (&pod.metadata.labels, &pod.metadata.annotations);
    for (map, key) in [
        (labels, "app.kubernetes.io/managed-by"),
        (labels, "controller.kubernetes.io/hash"),
        (labels, "app.kubernetes.io/version"),
        (notes, "slinky.slurm.net/sshd-conf-hash"),
        (notes, "slinky.slurm.net/sssd-conf-hash"),
    ] {
        ensure!(
            map.as_ref()
                .and_then(|m| m.get(key))
                .is_some_and(|v| !v.is_empty()),
            "the slurmd pod lacks the operator's {key}"
        );
    }
    let pod = pod.metadata.name.unwrap_or_default();
    for path in ["/livez", "/readyz"] {
        let st = http_status(&pod, "slurmd", 6818, path);
        println!("  slurmd GET {path} on 6818: {st:?}");
    }
    resolves_services(client, &pod).await?;
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
    // jobs run as the submitting user: slurm (401), slurmctld's user, as in Slinky
    let who = match srun(&["sh", "-c", "echo $(id -u):$(id -g)"]) {
        Ok(s) => s,
        Err(e) => return Err(with_logs(client, e.context("srun id")).await),
    };
    println!("  srun from slurmctld: the job runs as {}", who.trim());
    ensure!(
        who.trim() == format!("{uid}:{uid}"),
        "srun from slurmctld: the job runs as {}, want {uid}:{uid} (slurm, slurmctld's user)",
        who.trim()
    );
    // the README's verification with ConstrainDevices=yes: exactly the two GPUs Slurm gave the
    // job (their UUIDs); in the job (uid 401, as Slinky's), the other two nodes refuse to open
    let s = match srun(&["--gres=gpu:2", "sh", "-c", VERIFY]) {
        Ok(s) => s,
        Err(e) => return Err(with_logs(client, e.context("srun nvidia-smi -L")).await),
    };
    check_verify(
        bed,
        &s,
        "ConstrainDevices=yes: srun --gres=gpu:2 nvidia-smi -L",
    )?;
    let s =
        srun(&["--gres=gpu:2", "sh", "-c", OPEN_GPUS]).context("srun: opening the GPU nodes")?;
    check_open(&s)?;
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
    // the slurmd container is injected (mockgpu mounts, the shim in every daemon of its process
    // tree, GPU devices), its sidecar is not
    let inj = injection(client, "slurmd").await?;
    let side = injection(client, "logfile").await?;
    println!("  slurmd container: {inj:?}; logfile sidecar: {side:?}");
    inj.check_slurmd("pod network")?;
    let init = side.init.clone();
    ensure!(
        side == Injection {
            init,
            ..Default::default()
        },
        "the logfile sidecar got an injection: {side:?}"
    );
    host_network_variant(bed, client, &sockets).await
}

/// The user guide's "Host Network" option: the slurmd pod on the node's network
/// (`hostNetwork`, `ClusterFirstWithHostNet`) is injected and registers its GPUs as the
/// pod-network one does, under the node's host name.
async fn host_network_variant(bed: &Bed, client: &Client, sockets: &str) -> Result<()> {
    let sets: Api<DaemonSet> = Api::namespaced(client.clone(), SLINKY_NS);
    let name = format!("{INSTANCE}-{NODE}");
    sets.delete(&name, &Default::default()).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), SLINKY_NS);
    let gone = wait_for(60, "the pod-network slurmd pod gone", || async {
        pods.list(&ListParams::default().labels(SLURMD_PODS))
            .await
            .is_ok_and(|l| l.items.is_empty())
    })
    .await;
    if let Err(e) = gone {
        return Err(with_logs(client, e).await);
    }
    ctld(&["scontrol", "delete", &format!("nodename={NODE}")])
        .context("scontrol delete nodename (the pod-network slurmd's record)")?;
    let t = Instant::now();
    nodeset_up(client, &[NODE.to_owned()], true, None).await?;
    bed.timing(
        "slinky-hostnet-slurmd-idle",
        &format!("{} ms", ms(t.elapsed())),
    );
    let host = slurm_name(NODE, true)?;
    let want = format!("{host} idle gpu:nvidia_gb300:4(S:{sockets})");
    let s = sinfo()?;
    check(client, s == want, || {
        format!("host network: sinfo: want {want:?}, got {s:?}")
    })
    .await?;
    let pod = slurmd_pod(client).await?;
    let on_host = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
    let inj = injection(client, "slurmd").await?;
    let job = ctld(&[
        "timeout",
        "60",
        "srun",
        "-D",
        "/",
        "-N1",
        "-w",
        &host,
        "--gres=gpu:2",
        "sh",
        "-c",
        r#"echo "$CUDA_VISIBLE_DEVICES $(ls /proc/driver/nvidia/gpus | wc -l)""#,
    ]);
    let job = match job {
        Ok(j) => j,
        Err(e) => return Err(with_logs(client, e.context("host network: srun")).await),
    };
    println!(
        "  host network (hostNetwork {on_host}, ClusterFirstWithHostNet): sinfo {s}; injection {inj:?}; srun -w {host} --gres=gpu:2: CUDA_VISIBLE_DEVICES and GPUs {}",
        job.trim()
    );
    ensure!(
        on_host,
        "host network: the slurmd pod is not on the host's network"
    );
    inj.check_slurmd("host network")?;
    ensure!(
        job.trim() == "0,1 4",
        "host network: srun --gres=gpu:2: want \"0,1 4\" (CUDA_VISIBLE_DEVICES, GPUs in /proc/driver/nvidia/gpus), got {:?}",
        job.trim()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{SAFE_ALPHABET, fnv1a32, template_hash};

    #[test]
    fn fnv1a_matches_its_reference_vectors() {
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn template_hashes_differ_with_the_template_and_use_the_safe_alphabet() {
        let a = template_hash(&serde_json::json!({"hostname": "node0"})).unwrap();
        let b = template_hash(&serde_json::json!({"hostname": "node1"})).unwrap();
        assert_ne!(a, b);
        for h in [&a, &b] {
            assert!(
                !h.is_empty() && h.bytes().all(|c| SAFE_ALPHABET.contains(&c)),
                "{h}"
            );
        }
    }
}
