//! Services and DNS: kube-proxy (nftables mode) and CoreDNS behind the `kube-dns` service, as a
//! pod on the pod network and one on the host's network (`ClusterFirstWithHostNet`) see them;
//! the second node, and a worker that leaves and comes back.

use std::time::Instant;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::wait::conditions;
use mockgpu_api::GpuNode;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use crate::apiserver::pids_below;
use crate::bed::{Bed, wait_for};
use crate::chart::{CHART_NS, agent_pod};
use crate::cluster::{
    NODE, client, default_account, kubectl_exec, node_condition, sleeper, wait_object,
};
use crate::controller::cond;
use crate::node::ms;

/// The `kubernetes` service's address (the first of the service range).
const API_SVC_IP: &str = "203.0.113.1";
/// The `kube-dns` service's address (the kubelet's clusterDNS).
const DNS_SVC_IP: &str = "203.0.113.10";

/// The first address `getent hosts <name>` gives in the pod, or an error with what it printed.
fn resolve(pod: &str, name: &str) -> Result<String> {
    let (out, rc) = kubectl_exec("default", pod, &["getent", "hosts", name])?;
    ensure!(
        rc == 0,
        "in {pod}: `getent hosts {name}` failed ({rc}): {out:?}"
    );
    Ok(out.split_whitespace().next().unwrap_or_default().to_owned())
}

/// Names resolve through CoreDNS and the `kubernetes` service answers, from both pods.
pub async fn services_dns(bed: &Bed) -> Result<()> {
    let client = client().await?;
    default_account(&client, "default").await?;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut host = sleeper("dns-hostnet", "default", "localhost/slurmd:1", json!({}))?;
    if let Some(spec) = host.spec.as_mut() {
        spec.host_network = Some(true);
        spec.dns_policy = Some("ClusterFirstWithHostNet".into());
    }
    let probes = [
        sleeper("dns-podnet", "default", "localhost/slurmd:1", json!({}))?,
        host,
    ];
    for pod in &probes {
        pods.create(&PostParams::default(), pod).await?;
    }
    let version = std::env::var("K8S_VERSION")?;
    for pod in ["dns-podnet", "dns-hostnet"] {
        wait_object(
            &pods,
            pod,
            120,
            &format!("{pod} running"),
            conditions::is_pod_running(),
        )
        .await?;
        let (conf, _) = kubectl_exec("default", pod, &["cat", "/etc/resolv.conf"])?;
        ensure!(
            conf.lines()
                .any(|l| l == format!("nameserver {DNS_SVC_IP}")),
            "{pod}'s resolv.conf does not name the kube-dns service {DNS_SVC_IP}:\n{conf}"
        );
        for (name, want) in [
            ("kubernetes.default.svc.cluster.local", API_SVC_IP),
            ("kubernetes.default", API_SVC_IP), // through the search path
            ("kube-dns.kube-system", DNS_SVC_IP),
        ] {
            let got = resolve(pod, name)?;
            ensure!(got == want, "in {pod}: {name} is {got:?}, want {want}");
        }
        // the API server through the service, its certificate checked against the service's name
        let (out, rc) = kubectl_exec(
            "default",
            pod,
            &[
                "wget",
                "-qO-",
                "--timeout=10",
                "--ca-certificate=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                "https://kubernetes.default.svc/version",
            ],
        )?;
        ensure!(
            rc == 0 && out.contains(&format!("\"gitVersion\": \"{version}\"")),
            "in {pod}: wget https://kubernetes.default.svc/version: exit {rc}, {out:?}"
        );
    }
    bed.timing(
        "services-dns",
        "both pods resolved and reached the API server",
    );
    println!(
        "  kubernetes.default -> {API_SVC_IP}, kube-dns.kube-system -> {DNS_SVC_IP}, /version {version}"
    );
    for pod in ["dns-podnet", "dns-hostnet"] {
        pods.delete(pod, &DeleteParams::default()).await?;
    }
    Ok(())
}

/// The test bed's second node (`NODES=2`), a worker.
const WORKER: &str = "node1";
/// The taint workers register with (Slinky's, which its slurmd pods tolerate).
const WORKER_TAINT_KEY: &str = "nodeset.slinky.slurm.net/worker";
/// node1's pod range is 198.51.100.128/25 (cluster.sh `worker_vars`).
const WORKER_POD_RANGE: &str = "198.51.100.1";

/// (two nodes) node1 joined Ready with Slinky's worker taint; a pod there (tolerating it) is on
/// node1's pod range, resolves and reaches the API server through the services; a pod on node0
/// reaches it across the link, by its IP and through a Service's DNS name.
pub async fn two_nodes(bed: &Bed) -> Result<()> {
    let client = client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let worker = wait_object(
        &nodes,
        WORKER,
        120,
        "node1 to be Ready",
        node_condition("Ready", "True"),
    )
    .await?;
    let taints = worker.spec.and_then(|s| s.taints).unwrap_or_default();
    ensure!(
        taints
            .iter()
            .any(|t| t.key == WORKER_TAINT_KEY && t.effect == "NoExecute"),
        "node1's taints {taints:?} lack {WORKER_TAINT_KEY}:NoExecute"
    );
    default_account(&client, "default").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let services: Api<Service> = Api::namespaced(client, "default");
    let web: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-node1", "namespace": "default", "labels": {"app": "web-node1"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": WORKER},
            "tolerations": [{"key": WORKER_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "localhost/busybox:1", "imagePullPolicy": "Never",
                "command": ["busybox", "httpd", "-f", "-p", "8080", "-h", "/etc"]}]
        }
    }))?;
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web-node1", "namespace": "default"},
        "spec": {"selector": {"app": "web-node1"}, "ports": [{"port": 80, "targetPort": 8080}]}
    }))?;
    let client_pod = sleeper("web-client", "default", "localhost/busybox:1", json!({}))?;
    pods.create(&PostParams::default(), &web).await?;
    pods.create(&PostParams::default(), &client_pod).await?;
    services.create(&PostParams::default(), &svc).await?;
    let web = wait_object(
        &pods,
        "web-node1",
        120,
        "web-node1 running",
        conditions::is_pod_running(),
    )
    .await?;
    let ip = web.status.and_then(|s| s.pod_ip).unwrap_or_default();
    let on = web.spec.and_then(|s| s.node_name).unwrap_or_default();
    ensure!(
        on == WORKER
            && ip.starts_with(WORKER_POD_RANGE)
            && ip
                .rsplit('.')
                .next()
                .and_then(|o| o.parse::<u8>().ok())
                .is_some_and(|o| o >= 128),
        "web-node1 runs on {on:?} with IP {ip:?}, want node1 and 198.51.100.128/25"
    );
    let client_pod = wait_object(
        &pods,
        "web-client",
        120,
        "web-client running",
        conditions::is_pod_running(),
    )
    .await?;
    let client_on = client_pod
        .spec
        .and_then(|s| s.node_name)
        .unwrap_or_default();
    ensure!(
        client_on == "node0",
        "web-client (no toleration) runs on {client_on:?}, want node0"
    );
    // across the link: by pod IP, and by the Service's name (CoreDNS on node0, kube-proxy)
    for url in [
        format!("http://{ip}:8080/hostname"),
        "http://web-node1.default.svc.cluster.local/hostname".into(),
    ] {
        let mut got = (String::new(), -1);
        wait_for(30, &format!("{url} from node0's pod"), || {
            got = kubectl_exec("default", "web-client", &["wget", "-qO-", "-T", "5", &url])
                .unwrap_or_default();
            let ok = got.1 == 0 && got.0.trim() == "web-node1";
            async move { ok }
        })
        .await
        .with_context(|| format!("last answer: exit {}, {:?}", got.1, got.0))?;
    }
    bed.timing(
        "two-nodes",
        &format!("web-node1 {ip} on node1 reached from node0"),
    );
    println!(
        "  node1 Ready with {WORKER_TAINT_KEY}:NoExecute; web-node1 {ip} on node1 answers node0's pod by IP and by service name"
    );
    services
        .delete("web-node1", &DeleteParams::default())
        .await?;
    for pod in ["web-node1", "web-client"] {
        pods.delete(pod, &DeleteParams::default()).await?;
    }
    Ok(())
}

/// The GpuNode heartbeat and staleness `chart-install` sets (chart.rs's `TB_VALUES`; the chart's
/// defaults are 30 s and 120 s), so that a worker that leaves is Stale within a minute.
pub(crate) const HEARTBEAT_S: u64 = 5;
/// See [`HEARTBEAT_S`].
pub(crate) const STALE_S: u64 = 20;

/// A worker that leaves and comes back, as a machine that stops and starts again: node1's
/// kubelet stopped and every process of its agent pod killed (no kubelet is there to restart
/// them), then the kubelet started again. node1's GpuNode turns `Stale` once its heartbeats stop
/// (node0's stays as it was), the kubelet restarts the agent pod, whose reports turn `Stale`
/// back to `False`, and the Node is `Ready` again.
pub async fn worker_leaves(bed: &Bed) -> Result<()> {
    let client = client().await?;
    let gpunodes: Api<GpuNode> = Api::all(client.clone());
    let stale = |want: &'static str| move |g: Option<&GpuNode>| cond(g, "Stale") == want;
    wait_object(
        &gpunodes,
        WORKER,
        60,
        "node1's GpuNode Stale=False",
        stale("False"),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), CHART_NS);
    let agent = agent_pod(&client, WORKER).await?;
    let uid = pods
        .get(&agent)
        .await?
        .metadata
        .uid
        .with_context(|| format!("{agent} has no UID"))?;
    let kubelet = bed.cmdline_of(&format!("kubelet@{WORKER}"))?;
    let t = Instant::now();
    bed.stop(Signal::SIGTERM, &[&format!("kubelet@{WORKER}")])
        .await?;
    let worker = bed.worker(WORKER);
    let killed = kill_pod(&worker, &uid)?;
    ensure!(
        killed > 0,
        "no process of the agent pod {agent} (pod{uid}) below {}",
        worker.cgroup_parent
    );
    let secs = STALE_S + 2 * HEARTBEAT_S + 15;
    wait_object(
        &gpunodes,
        WORKER,
        secs,
        "node1's GpuNode Stale=True",
        stale("True"),
    )
    .await
    .with_context(|| {
        format!("node1's kubelet stopped and its agent pod's {killed} processes killed")
    })?;
    let left = ms(t.elapsed());
    let node0 = cond(gpunodes.get_opt(NODE).await?.as_ref(), "Stale");
    ensure!(
        node0 == "False",
        "node0's GpuNode is Stale={node0:?} while only node1 left"
    );
    let t = Instant::now();
    let argv: Vec<&str> = kubelet.iter().map(String::as_str).collect();
    worker.spawn(&format!("kubelet@{WORKER}"), "kubelet.log", &argv)?;
    wait_object(
        &gpunodes,
        WORKER,
        120,
        "node1's GpuNode Stale=False again",
        stale("False"),
    )
    .await?;
    let back = ms(t.elapsed());
    let nodes: Api<Node> = Api::all(client.clone());
    wait_object(
        &nodes,
        WORKER,
        60,
        "node1 Ready again",
        node_condition("Ready", "True"),
    )
    .await?;
    let again = agent_pod(&client, WORKER).await?;
    bed.timing(
        "worker-leaves",
        &format!("Stale after {left} ms, back {back} ms after the kubelet started"),
    );
    println!(
        "  node1 left (kubelet stopped, {killed} processes of {agent} killed): its GpuNode Stale=True after {left} ms (heartbeat {HEARTBEAT_S} s, stale after {STALE_S} s), node0's Stale=False; kubelet started: agent pod {again} reports, Stale=False after {back} ms, node1 Ready"
    );
    Ok(())
}

/// SIGKILL to every process of the pod with `uid` below the worker's cgroup parent (in every
/// cgroup hierarchy): how many were killed.
fn kill_pod(worker: &Bed, uid: &str) -> Result<usize> {
    let mark = format!("pod{uid}");
    let mut n = 0;
    for pid in pids_below(&worker.cgroup_parent)? {
        let of_pod =
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(&mark));
        if of_pod && kill(Pid::from_raw(pid.parse()?), Signal::SIGKILL).is_ok() {
            n += 1;
        }
    }
    Ok(n)
}
