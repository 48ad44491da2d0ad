//! `mgtb-scenarios`: the node test bed's scenarios as named tests, one pass or fail line each
//! (libtest-mimic, so `--list`, a name filter and `--exact` work as with `cargo test`). They run
//! against a test bed that `testbed.sh` has brought up, in the order listed, one at a time (a
//! scenario may use what an earlier step left, such as the slurmd container); `testbed.sh` calls
//! each by name with `--exact`. A failure prints its error and the tails of the agent's and the
//! runtime's logs.

mod bed;
mod node;
mod slurm;

use std::process::ExitCode;

use anyhow::{Result, bail};
use libtest_mimic::{Arguments, Failed, Trial};

use crate::bed::Bed;

/// The scenarios, in the order they run.
const SCENARIOS: [&str; 11] = [
    "smoke-pod",
    "smoke-slurm",
    "seed-verification",
    "exec-slurmd",
    "only-gpu-containers",
    "consumers-lspci-hwloc",
    "live-change",
    "runtime-restart",
    "slurmrestd-delete-node",
    "constrain-devices",
    "isolation",
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
        "runtime-restart" => node::runtime_restart(bed).await,
        "slurmrestd-delete-node" => slurm::slurmrestd_delete_node(bed).await,
        "constrain-devices" => slurm::constrain_devices(bed).await,
        "isolation" => node::isolation(bed).await,
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
