//! The controller's scale benchmark, driven by `bench/controller-scale.sh` against a real API
//! server: bulk creation of GpuNodes, their Nodes and a slurmd pod on each, and a full resync of all of them through kube-runtime's
//! `Controller` (the machinery `mockgpu-controller run` is built on) with a reconcile that only
//! counts, measured in the process itself: CPU time (getrusage) and resident memory (VmRSS)
//! once every listed object has been reconciled.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use mockgpu_api::GpuNode;
use mockgpu_api::gpunode::{AGENT_MANAGER, GpuNodeGpu, GpuNodeSpec, Mode, condition};
use tokio::sync::Notify;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create Nodes `<prefix>-00000`, ... (as a kubelet registers them), their GpuNodes with
    /// `--gpus` GPUs each (as an agent reports them) and a slurmd pod bound to each.
    Create {
        #[arg(long, default_value_t = 5000)]
        count: usize,
        #[arg(long, default_value_t = 8)]
        gpus: u32,
        /// Requests in flight.
        #[arg(long, default_value_t = 32)]
        parallel: usize,
        #[arg(long, default_value = "bench-node")]
        prefix: String,
    },
    /// Delete every GpuNode, Node and pod `create` made.
    DeleteAll,
    /// List and reconcile every GpuNode once; print the CPU time and RSS it took.
    Resync {
        /// The number of GpuNodes there must be.
        #[arg(long)]
        expect: usize,
        /// Drop each object's managedFields before the store keeps it (kube-runtime's `modify`).
        #[arg(long)]
        strip_managed_fields: bool,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
}

/// A GPU as the agent reports an 8-GPU HGX node: two sockets, four GPUs on each.
fn gpu(node: usize, i: u32, gpus: u32) -> GpuNodeGpu {
    let socket = if i < gpus / 2 { 0 } else { 1 };
    GpuNodeGpu {
        index: i,
        minor: i,
        uuid: format!("GPU-{node:08x}-{i:04x}-4d6f-636b-475055{i:06x}"),
        bus_id: format!("0000:{:02x}:00.0", 0x18 + i * 0x10),
        model: "NVIDIA H100 80GB HBM3".to_owned(),
        memory_mib: Some(81559),
        numa_node: i32::try_from(socket).unwrap_or(-1),
        local_cpulist: if socket == 0 {
            "0-55,112-167"
        } else {
            "56-111,168-223"
        }
        .to_owned(),
        socket,
    }
}

fn gpu_node(prefix: &str, node: usize, gpus: u32) -> GpuNode {
    let name = format!("{prefix}-{node:05}");
    let spec = GpuNodeSpec::new(
        &name,
        Mode::Mock,
        "h100",
        (0..gpus).map(|i| gpu(node, i, gpus)).collect(),
    );
    GpuNode::new(&name, spec)
}

/// The label on every Node and pod `create` makes (`delete-all` deletes them by it).
const BENCH_LABEL: &str = "bench.mockgpu.io/controller-scale";

/// The namespace of the slurmd pods.
const SLURM_NAMESPACE: &str = "bench-slurm";

/// A Node as a kubelet registers it (its labels and annotations; the status is not looked at:
/// the controller watches Nodes' metadata only).
fn node(name: &str) -> Node {
    let labels = [
        ("beta.kubernetes.io/arch", "amd64"),
        ("beta.kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("kubernetes.io/hostname", name),
        ("kubernetes.io/os", "linux"),
        (BENCH_LABEL, "true"),
    ];
    let annotations = [
        ("node.alpha.kubernetes.io/ttl", "0"),
        (
            "volumes.kubernetes.io/controller-managed-attach-detach",
            "true",
        ),
    ];
    let map = |kv: &[(&str, &str)]| {
        Some(
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    };
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: map(&labels),
            annotations: map(&annotations),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

/// A slurmd pod as a Slinky NodeSet makes it, bound to `node` (there is no scheduler, nor a
/// kubelet: it stays Pending, its containers never start) and asking for all its `gpus`.
fn slurmd_pod(node: &str, gpus: u32) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("slurm-worker-{node}"),
            "namespace": SLURM_NAMESPACE,
            "labels": {
                "app.kubernetes.io/name": "slurmd",
                "app.kubernetes.io/instance": "slurm-worker-bench",
                "app.kubernetes.io/component": "worker",
                BENCH_LABEL: "true",
            },
            "annotations": {"kubectl.kubernetes.io/default-container": "slurmd"},
        },
        "spec": {
            "nodeName": node,
            "hostname": node,
            "subdomain": "slurm-worker",
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "slurmd",
                "image": "ghcr.io/slinkyproject/slurmd:25.05-ubuntu24.04",
                "args": ["-Z", "--conf-server", "slurm-controller.slurm:6817"],
                "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "ports": [{"name": "slurmd", "containerPort": 6818, "protocol": "TCP"}],
                "resources": {"limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": gpus.to_string()}},
                "securityContext": {"privileged": true},
                "volumeMounts": [{"name": "slurm-config", "mountPath": "/etc/slurm"}],
            }],
            "volumes": [{"name": "slurm-config", "configMap": {"name": "slurm-config"}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    })
}

/// Creates the slurmd pods' namespace and its `default` service account (no controller-manager
/// makes it), if missing.
async fn slurm_namespace(client: &Client) -> anyhow::Result<()> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(SLURM_NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("default".into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    let pp = PostParams::default();
    let exists = |r: Result<(), kube::Error>| match r {
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        r => r,
    };
    exists(Api::all(client.clone()).create(&pp, &ns).await.map(drop))
        .context("creating the slurmd pods' namespace")?;
    exists(
        Api::namespaced(client.clone(), SLURM_NAMESPACE)
            .create(&pp, &sa)
            .await
            .map(drop),
    )
    .context("creating the slurmd pods' service account")
}

/// The status an agent reports for a fresh, healthy node (heartbeat now, `Ready`, nothing pinned).
fn agent_status(name: &str) -> serde_json::Value {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    serde_json::json!({
        "apiVersion": "mockgpu.io/v1alpha1",
        "kind": "GpuNode",
        "metadata": {"name": name},
        "status": {
            "agentVersion": "bench",
            "lastHeartbeat": now,
            "topologySince": now,
            "heldGpus": 0,
            "pinning": [],
            "conditions": [{
                "type": condition::READY, "status": "True", "reason": "Serving",
                "message": "the mock tree is mounted", "lastTransitionTime": now,
            }],
        },
    })
}

/// Creates the Nodes (as the kubelet's field manager), the GpuNodes, and applies their agent
/// status (two requests each, as an agent does); then a slurmd pod on each node, with the start
/// time a kubelet would report (after the agent's `topologySince`: not Drifted).
async fn create(
    client: Client,
    count: usize,
    gpus: u32,
    parallel: usize,
    prefix: &str,
) -> anyhow::Result<()> {
    let t = Instant::now();
    slurm_namespace(&client).await?;
    let (nodes, api): (Api<Node>, Api<GpuNode>) =
        (Api::all(client.clone()), Api::all(client.clone()));
    let pods: Api<Pod> = Api::namespaced(client, SLURM_NAMESPACE);
    let (pp, apply) = (PostParams::default(), PatchParams::apply(AGENT_MANAGER));
    let kubelet = PostParams {
        field_manager: Some("kubelet".into()),
        ..PostParams::default()
    };
    futures::stream::iter(0..count)
        .map(|i| {
            let (api, pp, apply, obj) = (&api, &pp, &apply, gpu_node(prefix, i, gpus));
            let (nodes, kubelet, pods) = (&nodes, &kubelet, &pods);
            async move {
                let name = obj.name_any();
                nodes
                    .create(kubelet, &node(&name))
                    .await
                    .with_context(|| format!("creating node {name}"))?;
                api.create(pp, &obj)
                    .await
                    .with_context(|| format!("creating {name}"))?;
                api.patch_status(&name, apply, &Patch::Apply(agent_status(&name)))
                    .await
                    .with_context(|| format!("status of {name}"))?;
                let pod: Pod = serde_json::from_value(slurmd_pod(&name, gpus))?;
                let pod = pods
                    .create(pp, &pod)
                    .await
                    .with_context(|| format!("creating the slurmd pod of {name}"))?;
                let started = serde_json::json!({"status": {"startTime": Time(k8s_openapi::jiff::Timestamp::now())}});
                pods.patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(started))
                    .await
                    .with_context(|| format!("status of the slurmd pod of {name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(parallel.max(1))
        .try_for_each(|_| async { Ok(()) })
        .await?;
    println!(
        "created nodes+gpunodes+slurmd_pods count={count} gpus={gpus} parallel={parallel} ms={}",
        t.elapsed().as_millis()
    );
    Ok(())
}

/// CPU time of this process so far (user, system).
fn cpu_time() -> (Duration, Duration) {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let d = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    (d(ru.ru_utime), d(ru.ru_stime))
}

/// This process's resident set, in KiB.
fn rss_kib() -> anyhow::Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS in /proc/self/status")
}

struct Counter {
    reconciled: AtomicUsize,
    changed: Notify,
}

/// Every `Controller::new` does, with a signal of its own at the end of the initial list: the
/// store's `wait_until_ready` cannot serve as one, since its oneshot keeps a single waker and the
/// controller's runner waits on it too (whichever polled first is never woken).
async fn resync(
    api: Api<GpuNode>,
    expect: usize,
    strip: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    let t = Instant::now();
    let ctx = Arc::new(Counter {
        reconciled: AtomicUsize::new(0),
        changed: Notify::new(),
    });
    let listed = Arc::new(Notify::new());
    let (reader, writer) = reflector::store();
    let signal = listed.clone();
    let events =
        watcher::watcher(api, watcher::Config::default()).modify(move |o: &mut GpuNode| {
            if strip {
                o.managed_fields_mut().clear();
            }
        });
    // after the reflector: the store holds the whole list when InitDone passes here
    let trigger = reflector(writer, events)
        .inspect_ok(move |e| {
            if matches!(e, watcher::Event::InitDone) {
                signal.notify_one();
            }
        })
        .applied_objects();
    let controller = Controller::for_stream(trigger, reader.clone());
    let run = controller.run(
        |_obj: Arc<GpuNode>, ctx: Arc<Counter>| async move {
            ctx.reconciled.fetch_add(1, Ordering::Relaxed);
            ctx.changed.notify_one();
            Ok::<_, kube::Error>(Action::await_change())
        },
        |_obj, _err, _ctx| Action::requeue(Duration::from_secs(1)),
        ctx.clone(),
    );
    tokio::spawn(run.for_each(|_| async {}));
    let done = async {
        listed.notified().await;
        let listed = t.elapsed();
        let n = reader.state().len();
        if n != expect {
            bail!("{n} GpuNodes listed, want {expect}");
        }
        while ctx.reconciled.load(Ordering::Relaxed) < n {
            ctx.changed.notified().await;
        }
        Ok(listed)
    };
    let listed = tokio::time::timeout(timeout, done)
        .await
        .with_context(|| format!("not all {expect} GpuNodes reconciled within {timeout:?}"))??;
    let (user, sys) = cpu_time();
    println!(
        "resync objects={expect} strip_managed_fields={strip} reconciled={} listed_ms={} reconciled_ms={} cpu_ms={} user_ms={} sys_ms={} rss_kib={}",
        ctx.reconciled.load(Ordering::Relaxed),
        listed.as_millis(),
        t.elapsed().as_millis(),
        (user + sys).as_millis(),
        user.as_millis(),
        sys.as_millis(),
        rss_kib()?
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let client = Client::try_default()
        .await
        .context("connecting to the API server")?;
    let api: Api<GpuNode> = Api::all(client.clone());
    match cli.command {
        Command::Create {
            count,
            gpus,
            parallel,
            prefix,
        } => create(client, count, gpus, parallel, &prefix).await,
        Command::DeleteAll => {
            let mine = ListParams::default().labels(BENCH_LABEL);
            api.delete_collection(&DeleteParams::default(), &ListParams::default())
                .await?;
            // no kubelet confirms a bound pod's deletion: at once
            Api::<Pod>::namespaced(client.clone(), SLURM_NAMESPACE)
                .delete_collection(&DeleteParams::default().grace_period(0), &mine)
                .await?;
            Api::<Node>::all(client)
                .delete_collection(&DeleteParams::default(), &mine)
                .await?;
            Ok(())
        }
        Command::Resync {
            expect,
            strip_managed_fields,
            timeout,
        } => {
            resync(
                api,
                expect,
                strip_managed_fields,
                Duration::from_secs(timeout),
            )
            .await
        }
    }
}
