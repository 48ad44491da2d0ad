//! A full resync of the controllers (`reconcile::controllers`) against a mocked API server, offline:
//! what a (re)start on a converged cluster costs in heap, resident memory and CPU, without the
//! test bed's API server (`bench/controller-scale.sh` measures the real thing).
//!
//!   cargo run --release -p mockgpu-controller --example resync -- gen /tmp/resync 5000
//!   cargo run --release -p mockgpu-controller --example resync -- run /tmp/resync
//!   cargo run --release -p mockgpu-controller --example resync -- sizes
//!
//! `gen` writes the list pages (500 objects each) of COUNT GpuNodes of 8 GPUs, their Nodes
//! (metadata) and a slurmd pod on each, shaped as `bench/controller-scale` creates them and as the
//! controller leaves them (converged: its labels and conditions in place, with their managed
//! fields). `run` serves them (watches held open; a write fails the run; EMPTY=nodes,pods serves
//! those kinds empty), runs the controllers until every GpuNode is reconciled and nothing changed
//! for a second, and prints the heap in use and its peak (a counting allocator, this binary's
//! only), VmRSS and VmHWM, and the CPU time since the controllers started. The heartbeats are
//! `gen`'s time and go stale after an hour (then the controllers write): `gen` again. `sizes`
//! prints the heap each slim object holds, beside its own size.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::{Request, Response};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::client::Body;
use mockgpu_api::GpuNode;
use mockgpu_api::gpunode::{GpuNodeGpu, GpuNodeSpec, Mode};

use mockgpu_controller::metrics::Metrics;
use mockgpu_controller::plan::{self, Input, Settings};
use mockgpu_controller::reconcile::controllers;
use mockgpu_controller::slim::{SlimGpuNode, SlimNode, SlimPod, label_selector};
use mockgpu_controller::slurm::NoSlurm;
use mockgpu_controller::write::recorder;
use serde_json::{Value, json};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let live = LIVE.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: System's, with counts on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, size: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, size) };
        if !q.is_null() {
            LIVE.fetch_sub(l.size(), Ordering::Relaxed);
            grew(size);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const PAGE: usize = 500;
const GPUS: u32 = 8;
const SELECTOR: &str = "app.kubernetes.io/name=slurmd";
const KINDS: [&str; 3] = ["gpunodes", "nodes", "pods"];

fn settings() -> Settings {
    Settings {
        remediation: false,
        stale_after: Duration::from_secs(3600),
        injection_grace: Duration::from_secs(60),
        gpu_resource: "nvidia.com/gpu".into(),
        drain_slurm: false,
        node_condition_type: mockgpu_api::gpunode::condition::GPU_PROBLEM.into(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match (args.get(1).map(String::as_str), args.get(2)) {
        (Some("gen"), Some(dir)) => {
            let count = args.get(3).map_or(5000, |c| c.parse().expect("a count"));
            generate(Path::new(dir), count);
        }
        (Some("run"), Some(dir)) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(run(PathBuf::from(dir))),
        (Some("sizes"), _) => sizes(),
        _ => panic!("usage: resync gen DIR [COUNT] | run DIR | sizes"),
    }
}

fn gpu(node: usize, i: u32) -> GpuNodeGpu {
    let socket = u32::from(i >= GPUS / 2);
    GpuNodeGpu {
        index: i,
        minor: i,
        uuid: format!("GPU-{node:08x}-{i:04x}-4d6f-636b-475055{i:06x}"),
        bus_id: format!("0000:{:02x}:00.0", 0x18 + i * 0x10),
        model: "NVIDIA H100 80GB HBM3".to_owned(),
        memory_mib: Some(81559),
        numa_node: socket as i32,
        local_cpulist: if socket == 0 {
            "0-55,112-167"
        } else {
            "56-111,168-223"
        }
        .to_owned(),
        socket,
    }
}

fn fields(manager: &str, operation: &str, sub: Option<&str>, f: Value) -> Value {
    let mut e = json!({"manager": manager, "operation": operation, "apiVersion": "v1",
        "time": "2026-12-02T20:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": f});
    if let Some(s) = sub {
        e["subresource"] = json!(s);
    }
    e
}

fn uid(kind: u32, i: usize) -> String {
    format!("{kind:08x}-{:04x}-4b1d-9c3e-{i:012x}", i % 65536)
}

/// The objects of node `i`: its GpuNode, Node (metadata) and slurmd pod, converged.
fn objects(i: usize) -> [Value; 3] {
    let name = format!("bench-node-{i:05}");
    let now = "2026-12-02T20:00:00Z";
    let spec = GpuNodeSpec::new(
        &name,
        Mode::Mock,
        "h100",
        (0..GPUS).map(|g| gpu(i, g)).collect(),
    );
    let mut g = serde_json::to_value(GpuNode::new(&name, spec)).unwrap();
    g["metadata"] = json!({"name": name, "uid": uid(1, i), "resourceVersion": format!("{}", 100_000 + i),
    "generation": 1, "creationTimestamp": now, "managedFields": [
        fields("controller-scale", "Update", None, json!({"f:spec": {".": {}, "f:gpuCount": {},
            "f:gpus": {}, "f:mode": {}, "f:nodeName": {}, "f:profile": {}}})),
        fields("mockgpu-agent", "Apply", Some("status"), json!({"f:status": {"f:agentVersion": {},
            "f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:lastTransitionTime": {},
            "f:message": {}, "f:reason": {}, "f:status": {}, "f:type": {}}}, "f:heldGpus": {},
            "f:lastHeartbeat": {}, "f:pinning": {}, "f:topologySince": {}}})),
    ]});
    g["status"] = json!({"agentVersion": "bench", "lastHeartbeat": Timestamp::now().to_string(),
        "topologySince": now, "heldGpus": 0, "pinning": [], "conditions": [{"type": "Ready",
        "status": "True", "reason": "Serving", "message": "the mock tree is mounted",
        "lastTransitionTime": now}]});
    let kubelet = [
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "kubernetes.io/arch",
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "bench.mockgpu.io/controller-scale",
    ];
    let mut n = json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": name, "uid": uid(2, i), "resourceVersion": format!("{}", 200_000 + i),
        "creationTimestamp": now,
        "labels": {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            "bench.mockgpu.io/controller-scale": "true"},
        "annotations": {"node.alpha.kubernetes.io/ttl": "0",
            "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        "managedFields": [fields("kubelet", "Update", None, json!({"f:metadata": {
            "f:annotations": {".": {}, "f:node.alpha.kubernetes.io/ttl": {},
                "f:volumes.kubernetes.io/controller-managed-attach-detach": {}},
            "f:labels": kubelet.iter().map(|k| (format!("f:{k}"), json!({}))).collect::<serde_json::Map<_, _>>()}}))]}});
    let p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": format!("slurm-worker-{name}"), "namespace": "bench-slurm", "uid": uid(3, i),
            "resourceVersion": format!("{}", 300_000 + i), "creationTimestamp": now,
            "labels": {"app.kubernetes.io/name": "slurmd", "app.kubernetes.io/instance": "slurm-worker-bench",
                "app.kubernetes.io/component": "worker", "bench.mockgpu.io/controller-scale": "true"},
            "annotations": {"kubectl.kubernetes.io/default-container": "slurmd"},
            "managedFields": [
                fields("controller-scale", "Update", None, json!({"f:metadata": {"f:annotations": {".": {},
                    "f:kubectl.kubernetes.io/default-container": {}}, "f:labels": {".": {},
                    "f:app.kubernetes.io/component": {}, "f:app.kubernetes.io/instance": {},
                    "f:app.kubernetes.io/name": {}, "f:bench.mockgpu.io/controller-scale": {}}},
                    "f:spec": {"f:automountServiceAccountToken": {}, "f:containers": {"k:{\"name\":\"slurmd\"}": {
                    ".": {}, "f:args": {}, "f:env": {}, "f:image": {}, "f:imagePullPolicy": {}, "f:name": {},
                    "f:ports": {}, "f:resources": {}, "f:securityContext": {}, "f:terminationMessagePath": {},
                    "f:terminationMessagePolicy": {}, "f:volumeMounts": {}}}, "f:dnsPolicy": {},
                    "f:enableServiceLinks": {}, "f:hostname": {}, "f:nodeName": {}, "f:restartPolicy": {},
                    "f:schedulerName": {}, "f:securityContext": {}, "f:subdomain": {},
                    "f:terminationGracePeriodSeconds": {}, "f:tolerations": {}, "f:volumes": {}}})),
                fields("controller-scale", "Update", Some("status"), json!({"f:status": {"f:startTime": {}}})),
            ]},
        "spec": {"nodeName": name, "hostname": name, "subdomain": "slurm-worker",
            "automountServiceAccountToken": false, "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst", "securityContext": {},
            "schedulerName": "default-scheduler", "priority": 0, "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority", "serviceAccountName": "default",
            "containers": [{"name": "slurmd", "image": "ghcr.io/slinkyproject/slurmd:25.05-ubuntu24.04",
                "args": ["-Z", "--conf-server", "slurm-controller.slurm:6817"],
                "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
                "ports": [{"name": "slurmd", "containerPort": 6818, "protocol": "TCP"}],
                "resources": {"limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "8"},
                    "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "8"}},
                "securityContext": {"privileged": true},
                "volumeMounts": [{"name": "slurm-config", "mountPath": "/etc/slurm"}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent"}],
            "volumes": [{"name": "slurm-config", "configMap": {"name": "slurm-config", "defaultMode": 420}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]},
        "status": {"phase": "Pending", "qosClass": "Burstable", "startTime": "2026-12-02T20:00:01Z"}});
    // converged: what the controller applies, in place
    let sg: SlimGpuNode = serde_json::from_value(g.clone()).unwrap();
    let nm: SlimNode = serde_json::from_value(n.clone()).unwrap();
    let sp: SlimPod = serde_json::from_value(p.clone()).unwrap();
    let st = settings();
    let plan = |sg: &SlimGpuNode, nm: &SlimNode| {
        plan::plan(&Input {
            gpunode: Some(sg),
            node: Some(&nm.labels),
            slurmd_pods: &[&sp],
            pods: &[&sp],
            now: Timestamp::now(),
            settings: &st,
        })
    };
    let first = plan(&sg, &nm);
    let labels = first.labels.expect("labels to apply");
    for (k, v) in &labels {
        n["metadata"]["labels"][k] = json!(v);
    }
    let ours: serde_json::Map<_, _> = labels
        .keys()
        .map(|k| (format!("f:{k}"), json!({})))
        .collect();
    n["metadata"]["managedFields"]
        .as_array_mut()
        .unwrap()
        .push(fields(
            "mockgpu-controller",
            "Apply",
            None,
            json!({"f:metadata": {"f:labels": ours}}),
        ));
    let conditions = first.conditions.expect("conditions to apply");
    let mut ours = serde_json::Map::new();
    for c in &conditions {
        g["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::to_value(c).unwrap());
        ours.insert(
            format!("k:{{\"type\":\"{}\"}}", c.type_),
            json!({".": {},
            "f:lastTransitionTime": {}, "f:message": {}, "f:observedGeneration": {}, "f:reason": {},
            "f:status": {}, "f:type": {}}),
        );
    }
    g["metadata"]["managedFields"]
        .as_array_mut()
        .unwrap()
        .push(fields(
            "mockgpu-controller",
            "Apply",
            Some("status"),
            json!({"f:status": {"f:conditions": ours}}),
        ));
    let again = plan(
        &serde_json::from_value(g.clone()).unwrap(),
        &serde_json::from_value(n.clone()).unwrap(),
    );
    assert!(
        again.labels.is_none() && again.conditions.is_none(),
        "not converged: {again:?}"
    );
    [g, n, p]
}

fn page_path(dir: &Path, kind: &str, i: usize) -> PathBuf {
    dir.join(format!("{kind}-{i}.json"))
}

fn generate(dir: &Path, count: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let pages = count.div_ceil(PAGE).max(1);
    let mut sizes = [0usize; 3];
    for page in 0..pages {
        let mut items: [Vec<Value>; 3] = Default::default();
        for i in page * PAGE..((page + 1) * PAGE).min(count) {
            for (k, o) in objects(i).into_iter().enumerate() {
                sizes[k] += serde_json::to_vec(&o).unwrap().len();
                items[k].push(o);
            }
        }
        for (k, items) in items.into_iter().enumerate() {
            let mut meta = json!({"resourceVersion": "999999"});
            if page + 1 < pages {
                meta["continue"] = json!(format!("{}", page + 1));
            }
            let list =
                json!({"apiVersion": "v1", "kind": "List", "metadata": meta, "items": items});
            std::fs::write(
                page_path(dir, KINDS[k], page),
                serde_json::to_vec(&list).unwrap(),
            )
            .unwrap();
        }
    }
    std::fs::write(dir.join("count"), count.to_string()).unwrap();
    for (k, s) in sizes.iter().enumerate() {
        println!("{}: {} bytes of JSON an object", KINDS[k], s / count.max(1));
    }
}

fn status_kib(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// This process's CPU time (user and system, /proc/self/stat; ticks of 10 ms).
fn cpu_ms() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = after
        .split(' ')
        .skip(11)
        .take(2)
        .map(|v| v.parse().unwrap())
        .collect();
    (f[0] + f[1]) * 10
}

fn query<'a>(uri: &'a str, key: &str) -> Option<&'a str> {
    let q = uri.split_once('?')?.1;
    q.split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

async fn run(dir: PathBuf) {
    let count: usize = std::fs::read_to_string(dir.join("count"))
        .unwrap()
        .parse()
        .unwrap();
    let pages = count.div_ceil(PAGE).max(1);
    let served: Vec<Vec<Bytes>> = KINDS
        .iter()
        .map(|k| {
            if std::env::var("EMPTY").is_ok_and(|e| e.split(',').any(|e| e == *k)) {
                return vec![Bytes::from_static(
                    br#"{"kind": "List", "metadata": {"resourceVersion": "1"}, "items": []}"#,
                )];
            }
            (0..pages)
                .map(|i| Bytes::from(std::fs::read(page_path(&dir, k, i)).unwrap()))
                .collect()
        })
        .collect();
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let writes = Arc::new(AtomicUsize::new(0));
    let w = writes.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some((req, reply)) = handle.next_request().await {
            let uri = req.uri().to_string();
            if req.method() != "GET" {
                eprintln!("a write: {} {uri}", req.method());
                w.fetch_add(1, Ordering::Relaxed);
                reply.send_error("no writes here");
                continue;
            }
            if query(&uri, "watch") == Some("true") {
                held.push(reply);
                continue;
            }
            let kind = KINDS
                .iter()
                .position(|k| uri.contains(&format!("/{k}?")))
                .expect(&uri);
            assert_eq!(
                query(&uri, "limit"),
                Some(PAGE.to_string().as_str()),
                "{uri}"
            );
            let page: usize = query(&uri, "continue").map_or(0, |c| c.parse().unwrap());
            reply.send_response(Response::new(Body::from(served[kind][page].clone())));
        }
    });
    let client = Client::new(service, "default");
    let metrics = Metrics::default();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let (cpu0, live0, rss0) = (cpu_ms(), LIVE.load(Ordering::Relaxed), status_kib("VmRSS:"));
    PEAK.store(live0, Ordering::Relaxed);
    let t = Instant::now();
    let slurmd = label_selector(SELECTOR).unwrap();
    let run = controllers(
        client.clone(),
        settings(),
        None::<Arc<NoSlurm>>,
        recorder(client, "resync"),
        metrics,
        slurmd,
        false,
    );
    let reconciled = || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("mockgpu_controller_reconcile_duration_seconds_count "))
            .map_or(0, |n| n.trim().parse::<usize>().unwrap())
    };
    let kib = |b: usize| b as f64 / 1024.0;
    let per = |b: f64| if count > 0 { b / count as f64 } else { 0.0 };
    // measured here, the controllers still running
    let watch = async {
        let (mut last, mut since) = (usize::MAX, Instant::now());
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let n = reconciled();
            if n != last {
                (last, since) = (n, Instant::now());
            }
            if n >= count && since.elapsed() >= Duration::from_secs(1) {
                break;
            }
        }
        let (live, peak, rss) = (
            LIVE.load(Ordering::Relaxed),
            PEAK.load(Ordering::Relaxed),
            status_kib("VmRSS:"),
        );
        println!(
            "resync count={count} reconciled={last} settled_ms={} cpu_ms={} heap_kib=+{:.0} ({:.2} a GpuNode) peak_heap_kib=+{:.0} rss_kib={rss} (+{}, {:.2} a GpuNode) hwm_kib={} writes={}",
            (since - t).as_millis(),
            cpu_ms() - cpu0,
            kib(live - live0),
            per(kib(live - live0)),
            kib(peak - live0),
            rss - rss0,
            per((rss - rss0) as f64),
            status_kib("VmHWM:"),
            writes.load(Ordering::Relaxed),
        );
    };
    tokio::select! {
        () = watch => {}
        () = run => panic!("the controllers ended"),
    }
}

/// Heap bytes held by what `f` returns.
fn held<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = LIVE.load(Ordering::Relaxed);
    let t = f();
    (t, LIVE.load(Ordering::Relaxed) - before)
}

fn sizes() {
    let [g, n, p] = objects(7).map(|o| o.to_string());
    let (_g, b) = held(|| serde_json::from_str::<SlimGpuNode>(&g).unwrap());
    println!(
        "SlimGpuNode: {b} bytes of heap + {}",
        size_of::<SlimGpuNode>()
    );
    let (_n, b) = held(|| serde_json::from_str::<SlimNode>(&n).unwrap());
    println!("SlimNode: {b} bytes of heap + {}", size_of::<SlimNode>());
    let (_p, b) = held(|| {
        // as the watch keeps it
        let mut p = serde_json::from_str::<SlimPod>(&p).unwrap();
        p.metadata.labels = None;
        p
    });
    println!("SlimPod: {b} bytes of heap + {}", size_of::<SlimPod>());
}
