use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, Parser, Subcommand};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::Selector;
use mockgpu_controller::lease::Timing;
use mockgpu_controller::plan::Settings;
use mockgpu_controller::run::{Config, run};
use mockgpu_controller::slim::label_selector;
use mockgpu_controller::slurm::{NoSlurm, NodeDeleted, SlurmNodes};
use mockgpu_controller::slurmrestd::{self, SecretKey, Slurmrestd, WithSecretToken};

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
    /// Run the controller: node labels and GpuNode conditions (Stale, Drifted, InjectionMissing)
    /// from the agents' GpuNodes, ComputeDomains, and opt-in remediation. Replicas elect a leader through a
    /// Lease; only the leader acts, the others stand by (all are ready).
    Run(Box<RunArgs>),
    /// Delete every GpuNode and remove mockgpu's labels from every node (the chart runs this
    /// after `helm uninstall`, when no controller is left to do it).
    Cleanup(CleanupArgs),
    /// Delete one node's Slurm record through slurmrestd, as remediation does (prints `deleted`
    /// or `already gone`); for trying the credentials and for doing it by hand.
    SlurmDeleteNode(SlurmDeleteNode),
}

#[derive(Args)]
struct RunArgs {
    /// Namespace of the leader-election Lease (and of the slurmrestd token's Secret).
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: String,
    /// This replica's identity in the Lease (unique per replica: the pod's name).
    #[arg(long, env = "POD_NAME")]
    identity: String,
    /// /healthz, /readyz and /metrics address.
    #[arg(
        long,
        env = "MOCKGPU_CONTROLLER_LISTEN",
        default_value = "0.0.0.0:8080"
    )]
    listen: SocketAddr,
    /// Name of the leader-election Lease.
    #[arg(long, env = "MOCKGPU_LEASE_NAME", default_value = "mockgpu-controller")]
    lease_name: String,
    /// Label selector of the slurmd pods (Drifted: one that started before the node's topology
    /// changed registered the old GPUs).
    #[arg(
        long,
        env = "MOCKGPU_SLURMD_SELECTOR",
        default_value = "app.kubernetes.io/name=slurmd",
        value_parser = label_selector
    )]
    slurmd_selector: Selector,
    /// Act on Drifted (delete the node's Slurm record, then its slurmd pods) and InjectionMissing
    /// (delete the pod, so that it is recreated with mockgpu's files).
    #[arg(long, env = "MOCKGPU_REMEDIATION", default_value_t = false, action = clap::ArgAction::Set)]
    remediation: bool,
    /// The type of the Node condition that tells the node's GPU faults (True with reason XidError
    /// or GpuFault, False with NoGpuFault): for Slinky's NodeSet `propagatedNodeConditions`.
    #[arg(
        long,
        env = "MOCKGPU_NODE_CONDITION_TYPE",
        default_value = mockgpu_api::gpunode::condition::GPU_PROBLEM,
        value_parser = condition_type
    )]
    node_condition_type: String,
    /// Drain the Slurm nodes of a node with GPU faults through slurmrestd (reason `mockgpu: ...`)
    /// and resume them when the faults clear (only a drain whose reason is still ours).
    #[arg(long, env = "MOCKGPU_DRAIN_SLURM", default_value_t = false, action = clap::ArgAction::Set)]
    drain_slurm: bool,
    /// slurmrestd's URL (drift remediation deletes Slurm node records through it; the fault
    /// drain drains and resumes nodes).
    #[arg(long, env = "MOCKGPU_SLURMRESTD_URL")]
    slurmrestd_url: Option<String>,
    /// The Secret key holding slurmrestd's JWT, as `<secret>/<key>` in the Lease's namespace.
    #[arg(
        long,
        env = "MOCKGPU_SLURMRESTD_TOKEN_SECRET",
        requires = "slurmrestd_url"
    )]
    slurmrestd_token_secret: Option<SecretKey>,
    /// The Slurm user the JWT belongs to (X-SLURM-USER-NAME).
    #[arg(long, env = "MOCKGPU_SLURMRESTD_USER", default_value = "slurm")]
    slurmrestd_user: String,
    /// Timeout of one slurmrestd request, in seconds.
    #[arg(long, env = "MOCKGPU_SLURMRESTD_TIMEOUT", default_value_t = 10.0)]
    slurmrestd_timeout: f64,
    /// Keep NVIDIA's ComputeDomains: their finalizer, their channels' ResourceClaimTemplate and
    /// their status (left alone, whatever this says, where the cluster does not serve the
    /// ComputeDomain CRD or resource.k8s.io/v1).
    #[arg(long, env = "MOCKGPU_COMPUTE_DOMAINS", default_value_t = true, action = clap::ArgAction::Set)]
    compute_domains: bool,
    /// Seconds without a heartbeat after which a GpuNode is Stale.
    #[arg(long, env = "MOCKGPU_STALE_AFTER", default_value_t = 90, value_parser = clap::value_parser!(u64).range(1..))]
    stale_after: u64,
    /// Kubeconfig file (default: in-cluster service account, else $KUBECONFIG or ~/.kube/config).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

#[derive(Args)]
struct CleanupArgs {
    /// Kubeconfig file (default: in-cluster service account, else $KUBECONFIG or ~/.kube/config).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

/// A GPU container gets this long to show up in the agent's pinning before it counts as
/// InjectionMissing (the agent reports pinning changes well within it).
const INJECTION_GRACE: Duration = Duration::from_secs(60);

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Crd => print!("{}", mockgpu_controller::crd::yaml()?),
        Command::Run(args) => {
            // one thread: the controller waits on the API server mostly; on two workers, half
            // of a full resync's CPU went to switching threads (bench/README.md)
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?
                .block_on(run_controller(*args))?
        }
        Command::Cleanup(a) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?
            .block_on(async {
                let done =
                    mockgpu_controller::cleanup::cleanup(client(a.kubeconfig.as_deref()).await?)
                        .await
                        .context("cleaning up")?;
                println!(
                    "deleted {} GpuNodes, removed mockgpu's labels from {} nodes",
                    done.gpunodes, done.nodes
                );
                anyhow::Ok(())
            })?,
        Command::SlurmDeleteNode(a) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?
            .block_on(slurm_delete_node(a))?,
    }
    Ok(())
}

/// A client from `kubeconfig`, else the in-cluster service account or the default kubeconfig.
async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Client> {
    Ok(match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?;
            Client::try_from(cfg)?
        }
        None => Client::try_from(
            kube::Config::infer()
                .await
                .context("no Kubernetes credentials (in-cluster or kubeconfig)")?,
        )?,
    })
}

async fn run_controller(args: RunArgs) -> anyhow::Result<()> {
    let client = client(args.kubeconfig.as_deref()).await?;
    let cfg = Config {
        namespace: args.namespace,
        identity: args.identity,
        lease_name: args.lease_name,
        timing: Timing::default(),
        slurmd_selector: args.slurmd_selector,
        listen: args.listen,
        settings: Settings {
            remediation: args.remediation,
            stale_after: Duration::from_secs(args.stale_after),
            injection_grace: INJECTION_GRACE,
            gpu_resource: "nvidia.com/gpu".into(),
            drain_slurm: args.drain_slurm,
            node_condition_type: args.node_condition_type,
        },
        compute_domains: args.compute_domains,
    };
    if args.drain_slurm && args.slurmrestd_url.is_none() {
        tracing::warn!(
            "MOCKGPU_DRAIN_SLURM is on but no slurmrestd is configured (MOCKGPU_SLURMRESTD_URL): \
             GPU faults set the node condition only"
        );
    }
    let slurm = match (&args.slurmrestd_url, &args.slurmrestd_token_secret) {
        (Some(url), Some(secret)) => {
            let token = slurmrestd::read_token(client.clone(), &cfg.namespace, secret).await?;
            let timeout = Duration::try_from_secs_f64(args.slurmrestd_timeout)
                .context("MOCKGPU_SLURMRESTD_TIMEOUT")?;
            let rest = Slurmrestd::new(url, &args.slurmrestd_user, &token, timeout)?;
            Some(WithSecretToken::new(
                rest,
                client.clone(),
                &cfg.namespace,
                secret.clone(),
            ))
        }
        (Some(url), None) => {
            bail!(
                "MOCKGPU_SLURMRESTD_URL={url} needs MOCKGPU_SLURMRESTD_TOKEN_SECRET (<secret>/<key>)"
            )
        }
        (None, _) => None,
    };
    match slurm {
        Some(slurm) => run(client, cfg, Some(slurm), shutdown()).await?,
        None => run(client, cfg, None::<NoSlurm>, shutdown()).await?,
    }
    Ok(())
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
        slurmrestd::read_token(client(None).await?, &a.namespace, secret).await?
    } else {
        bail!("give --token-secret or --token-file");
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

/// A Node condition type: a qualified name as Kubernetes' conditions take (`GPUProblem`,
/// `example.com/GPUProblem`).
fn condition_type(s: &str) -> Result<String, String> {
    let (prefix, name) = s.rsplit_once('/').unwrap_or(("", s));
    let ok_name = !name.is_empty()
        && name.len() <= 316
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    let ok_prefix = prefix.is_empty()
        || (prefix.len() <= 253
            && prefix
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-.".contains(c)));
    if ok_name && ok_prefix && !(s.contains('/') && prefix.is_empty()) {
        Ok(s.to_string())
    } else {
        Err(format!("not a condition type: {s:?}"))
    }
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(err) => {
            tracing::warn!(%err, "no SIGTERM handler; stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::condition_type;

    #[test]
    fn condition_types() {
        for good in ["GPUProblem", "example.com/GPUTrouble", "gpu-problem", "A"] {
            assert_eq!(condition_type(good).as_deref(), Ok(good), "{good}");
        }
        for bad in [
            "",
            "GPU Problem",
            "/GPUProblem",
            "Example.com/X",
            "x/",
            "-x",
            "x-",
        ] {
            assert!(condition_type(bad).is_err(), "{bad}");
        }
    }
}
