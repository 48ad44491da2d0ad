//! `mgtb-scenarios`: the test bed's scenarios (node and cluster mode) as named tests, one pass or fail line each
//! (libtest-mimic, so `--list`, a name filter and `--exact` work as with `cargo test`). They run
//! against a test bed that `testbed.sh` has brought up, in the order listed, one at a time (a
//! scenario may use what an earlier step left, such as the slurmd container); `testbed.sh` calls
//! each by name with `--exact`. A failure prints its error and the tails of the agent's and the
//! runtime's logs.

mod agent;
mod apiserver;
mod bed;
mod chart;
mod cluster;
mod controller;
mod dra;
mod faults;
mod gpunode;
mod gpupods;
mod node;
mod services;
mod slinky;
mod slurm;

use std::process::ExitCode;

use anyhow::{Result, bail};
use libtest_mimic::{Arguments, Failed, Trial};

use crate::bed::Bed;

/// The scenarios, in the order they run.
const SCENARIOS: &[&str] = &[
    "smoke-pod",
    "smoke-slurm",
    "seed-verification",
    "exec-slurmd",
    "only-gpu-containers",
    "consumers-lspci-hwloc",
    "live-change",
    "agent-restart",
    "agent-surge",
    "runtime-restart",
    "slurmrestd-delete-node",
    "constrain-devices",
    "nri-latency",
    "isolation",
    // cluster mode
    "node-ready",
    "pod-daemonset-exec",
    "services-dns",
    "two-nodes",
    "crd-admission-policy",
    "helm",
    "chart-dry-run",
    "product-images",
    "device-plugin-socket",
    "gpu-pod-injected",
    "dp-registered",
    "gpunode-setup",
    "gpunode-reported",
    "dp-pod-2-gpus",
    "gpunode-held",
    "dp-pod-5-pending",
    "dp-failed-gpu",
    "dp-kubelet-restart",
    "gpunode-topology",
    "gpunode-recreated",
    "gpunode-heartbeat",
    "gpunode-last-report",
    "controller-rbac",
    "controller-leader",
    "controller-labels",
    "controller-stale",
    "controller-failover",
    "controller-apiserver-restart",
    "controller-gpunode-deleted",
    "slinky-slurm",
    "chart-install",
    "worker-leaves",
    "chart-gpu-faults",
    "chart-dra",
    "chart-slinky-remediation",
    "chart-slinky-gpu-drain",
    "chart-slinky-imex",
    "chart-uninstall",
    "cluster-isolation",
];

async fn scenario(name: &str, bed: &Bed) -> Result<()> {
    match name {
        "smoke-pod" => node::smoke_pod(bed).await,
        "smoke-slurm" => slurm::smoke_slurm(bed).await,
        "seed-verification" => slurm::seed_verification(bed).await,
        "exec-slurmd" => slurm::exec_slurmd(bed).await,
        "only-gpu-containers" => node::only_gpu_containers(bed).await,
        "consumers-lspci-hwloc" => node::consumers_lspci_hwloc(bed).await,
        "live-change" => node::live_change(bed).await,
        "agent-restart" => agent::agent_restart(bed).await,
        "agent-surge" => agent::agent_surge(bed).await,
        "runtime-restart" => node::runtime_restart(bed).await,
        "slurmrestd-delete-node" => slurm::slurmrestd_delete_node(bed).await,
        "constrain-devices" => slurm::constrain_devices(bed).await,
        "nri-latency" => agent::nri_latency(bed).await,
        "isolation" => node::isolation(bed).await,
        "node-ready" => cluster::node_ready(bed).await,
        "pod-daemonset-exec" => cluster::pod_daemonset_exec(bed).await,
        "services-dns" => services::services_dns(bed).await,
        "two-nodes" => services::two_nodes(bed).await,
        "worker-leaves" => services::worker_leaves(bed).await,
        "dp-registered" => cluster::dp_registered(bed).await,
        "device-plugin-socket" => gpupods::device_plugin_socket(bed).await,
        "gpu-pod-injected" => gpupods::gpu_pod_injected(bed).await,
        "dp-pod-2-gpus" => gpupods::dp_pod_2_gpus(bed).await,
        "dp-kubelet-restart" => gpupods::dp_kubelet_restart(bed).await,
        "dp-pod-5-pending" => cluster::dp_pod_5_pending(bed).await,
        "dp-failed-gpu" => cluster::dp_failed_gpu(bed).await,
        "gpunode-reported" => gpunode::gpunode_reported(bed).await,
        "gpunode-held" => gpunode::gpunode_held(bed).await,
        "gpunode-topology" => gpunode::gpunode_topology(bed).await,
        "gpunode-recreated" => gpunode::gpunode_recreated(bed).await,
        "gpunode-heartbeat" => gpunode::gpunode_heartbeat(bed).await,
        "controller-rbac" => controller::controller_rbac(bed).await,
        "controller-leader" => controller::controller_leader(bed).await,
        "controller-labels" => controller::controller_labels(bed).await,
        "controller-stale" => controller::controller_stale(bed).await,
        "controller-failover" => controller::controller_failover(bed).await,
        "controller-apiserver-restart" => controller::controller_apiserver_restart(bed).await,
        "controller-gpunode-deleted" => controller::controller_gpunode_deleted(bed).await,
        "slinky-slurm" => slinky::slinky_slurm(bed).await,
        "chart-install" => chart::chart_install(bed).await,
        "chart-slinky-remediation" => chart::chart_slinky_remediation(bed).await,
        "chart-gpu-faults" => faults::chart_gpu_faults(bed).await,
        "chart-dra" => dra::chart_dra(bed).await,
        "chart-slinky-imex" => dra::chart_slinky_imex(bed).await,
        "chart-slinky-gpu-drain" => faults::chart_slinky_gpu_drain(bed).await,
        "chart-uninstall" => chart::chart_uninstall(bed).await,
        "crd-admission-policy" => apiserver::crd_admission_policy(bed).await,
        "helm" => apiserver::helm_chart(bed).await,
        "chart-dry-run" => apiserver::chart_dry_run(bed).await,
        "product-images" => apiserver::product_images(bed).await,
        "cluster-isolation" => apiserver::cluster_isolation(bed).await,
        "gpunode-setup" => gpunode::gpunode_setup(bed).await,
        "gpunode-last-report" => gpunode::gpunode_last_report(bed).await,
        _ => bail!("no scenario {name}"),
    }
}

/// Runs one scenario; a failure carries what explains it.
fn run(name: &'static str) -> Result<(), Failed> {
    let bed = Bed::from_env().map_err(|e| Failed::from(format!("{e:#}")))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failed::from(format!("tokio runtime: {e}")))?;
    rt.block_on(scenario(name, &bed)).map_err(|e| {
        Failed::from(format!(
            "{e:#}\n{}",
            bed.log_tails(&["agent.log", "containerd.log"], 20)
        ))
    })
}

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    // one test bed: one scenario at a time
    args.test_threads = Some(1);
    let trials = SCENARIOS
        .iter()
        .map(|&name| Trial::test(name, move || run(name)))
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}
