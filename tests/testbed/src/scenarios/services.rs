//! Services and DNS: kube-proxy (nftables mode) and CoreDNS behind the `kube-dns` service, as a
//! pod on the pod network and one on the host's network (`ClusterFirstWithHostNet`) see them.

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::wait::conditions;
use serde_json::json;

use crate::bed::Bed;
use crate::cluster::{client, default_account, kubectl_exec, sleeper, wait_object};

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
