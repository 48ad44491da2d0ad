//! `mockgpu-agent`: command-line entry point. Parses arguments, sets up logging and calls the
//! library.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use mockgpu_agent::{host::SysfsHost, output, render};
use mockgpu_api::{NodeTopology, Profile};

/// Makes this node look like an NVIDIA GPU node at the driver-file level.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write the mock driver tree as plain files (for debugging and diffing).
    Render(RenderArgs),
}

/// Which GPUs to mock.
#[derive(Args, Clone)]
struct ProfileArgs {
    /// Built-in profile: gb300 (default), gb200, b200, h200, h100, a100, l40s, t4.
    #[arg(long, default_value = mockgpu_api::profile::DEFAULT_PROFILE, conflicts_with = "profile_file")]
    profile: String,
    /// A profile YAML file (complete, or `base: <built-in>` plus overrides).
    #[arg(long, env = "MOCKGPU_PROFILE_FILE")]
    profile_file: Option<PathBuf>,
    /// Node name, part of the GPUs' identity [default: this host's name].
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Where sysfs is mounted (read for the host's CPUs, NUMA nodes and PCI devices).
    #[arg(long, default_value = "/sys", hide = true)]
    sysfs: PathBuf,
}

#[derive(Args)]
struct RenderArgs {
    #[command(flatten)]
    profile: ProfileArgs,
    /// Output directory; must be absent or empty.
    #[arg(long)]
    out: PathBuf,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Render(args) => {
            let topo = topology(&args.profile)?;
            let host = SysfsHost::new(&args.profile.sysfs).probe()?;
            let tree = render::driver_tree(&topo, &host);
            let written = output::write_tree(&tree, &args.out)?;
            for dev in &written.skipped_devices {
                tracing::warn!(device = dev, "device node skipped: creating it needs CAP_MKNOD");
            }
            println!(
                "rendered {} GPUs ({}) for node {} into {} ({} entries)",
                topo.gpus.len(),
                topo.profile.name,
                topo.node_name,
                args.out.display(),
                written.entries
            );
        }
    }
    Ok(())
}

fn topology(args: &ProfileArgs) -> Result<NodeTopology> {
    let profile = match &args.profile_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read profile file {}", path.display()))?;
            Profile::from_yaml(&text, &path.display().to_string())?
        }
        None => Profile::builtin(&args.profile)?,
    };
    let node = match &args.node_name {
        Some(n) => n.clone(),
        None => nix::unistd::gethostname()?.to_string_lossy().into_owned(),
    };
    let host = SysfsHost::new(&args.sysfs).probe()?;
    Ok(NodeTopology::build(&profile, &node, &host)?)
}
