use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use mockgpu_controller::slurm::{NodeDeleted, SlurmNodes};
use mockgpu_controller::slurmrestd::{self, SecretKey, Slurmrestd};

/// mockgpu's central controller.
#[derive(Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the GpuNode CustomResourceDefinition (YAML) for `kubectl apply -f -`.
    Crd,
    /// Delete one node's Slurm record through slurmrestd, as remediation does (prints `deleted`
    /// or `already gone`); for trying the credentials and for doing it by hand.
    SlurmDeleteNode(SlurmDeleteNode),
}

#[derive(Args)]
struct SlurmDeleteNode {
    /// The Slurm node name.
    node: String,
    /// slurmrestd's base URL.
    #[arg(long, default_value = "http://slurm-restapi.slurm:6820")]
    slurmrestd_url: String,
    /// The Slurm user the token belongs to (X-SLURM-USER-NAME).
    #[arg(long, default_value = "slurm")]
    slurm_user: String,
    /// The JWT, from `<secret>/<key>` in --namespace (through the kubeconfig or the service account).
    #[arg(
        long,
        conflicts_with = "token_file",
        required_unless_present = "token_file"
    )]
    token_secret: Option<SecretKey>,
    /// The JWT, from a file (`scontrol token` output is accepted).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// The Secret's namespace.
    #[arg(long, default_value = "slurm")]
    namespace: String,
    /// Request timeout, in seconds.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
}

async fn slurm_delete_node(a: SlurmDeleteNode) -> anyhow::Result<()> {
    let token = if let Some(path) = &a.token_file {
        slurmrestd::read_token_file(path)?
    } else if let Some(secret) = &a.token_secret {
        let client = kube::Client::try_default()
            .await
            .context("connecting to the API server")?;
        slurmrestd::read_token(client, &a.namespace, secret).await?
    } else {
        anyhow::bail!("give --token-secret or --token-file");
    };
    let timeout = Duration::try_from_secs_f64(a.timeout).context("--timeout")?;
    let client = Slurmrestd::new(&a.slurmrestd_url, &a.slurm_user, &token, timeout)?;
    let outcome = client
        .delete_node(&a.node)
        .await
        .with_context(|| format!("deleting Slurm node {}", a.node))?;
    println!(
        "{}",
        match outcome {
            NodeDeleted::Deleted => "deleted",
            NodeDeleted::AlreadyGone => "already gone",
        }
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => print!("{}", mockgpu_controller::crd::yaml()?),
        Command::SlurmDeleteNode(a) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(slurm_delete_node(a))?,
    }
    Ok(())
}
