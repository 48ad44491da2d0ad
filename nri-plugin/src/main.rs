//! `mockgpu-nri`: the NRI plugin as a standalone process, for runtimes that launch pre-installed
//! plugins from `/opt/nri/plugins` (descriptor 3) or as an external plugin on the NRI socket.

use std::{fs::OpenOptions, net::SocketAddr, path::PathBuf, sync::Arc};

use anyhow::{Context, Result};
use clap::Parser;
use mockgpu_health::{HealthServer, Registry};
use mockgpu_nri::{Config, DriverTreeInventory, Inventory, PinningEvent, Plugin};
use tokio::signal::unix::{SignalKind, signal};
use tracing_subscriber::EnvFilter;

/// Log file used when launched by the runtime (stdout and stderr go to /dev/null there).
const PREINSTALLED_LOG: &str = "/var/log/mockgpu-nri.log";

/// NRI plugin that gives GPU-holding containers mockgpu's driver tree.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// YAML configuration file (flags override it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// NRI socket of the external mode.
    #[arg(long, env = "MOCKGPU_NRI_SOCKET")]
    socket: Option<PathBuf>,
    /// Plugin name.
    #[arg(long, env = "NRI_PLUGIN_NAME")]
    name: Option<String>,
    /// Plugin index (two digits).
    #[arg(long, env = "NRI_PLUGIN_IDX")]
    index: Option<String>,
    /// Descriptor of a socket inherited from the runtime (pre-installed mode; the runtime sets
    /// NRI_PLUGIN_SOCKET, NRI_PLUGIN_NAME and NRI_PLUGIN_IDX).
    #[arg(long, env = "NRI_PLUGIN_SOCKET")]
    inherited_fd: Option<i32>,
    /// Host directory mounted into GPU-holding containers.
    #[arg(long, env = "MOCKGPU_DIR")]
    host_dir: Option<PathBuf>,
    /// Mount point of that directory inside containers.
    #[arg(long, env = "MOCKGPU_CONTAINER_DIR")]
    container_dir: Option<PathBuf>,
    /// Namespaces whose pods may claim GPUs by NVIDIA_VISIBLE_DEVICES or the inject annotation
    /// (comma-separated; default none: only GPU devices granted by Kubernetes count).
    #[arg(long, env = "MOCKGPU_TRUSTED_NAMESPACES", value_delimiter = ',')]
    trusted_namespaces: Option<Vec<String>>,
    /// Where procfs is mounted (checked for a real NVIDIA driver, which means: inject nothing).
    #[arg(long, default_value = "/proc", hide = true)]
    procfs: PathBuf,
    /// Driver tree read for the GPU inventory (default: `<host-dir>/fs`); differs from it when
    /// the runtime resolves paths inside another root than this process.
    #[arg(long)]
    driver_tree: Option<PathBuf>,
    /// Create GPU-holding containers without the mock while the driver tree is not ready.
    #[arg(long)]
    fail_open: bool,
    /// Do not bind `<host-dir>/ld.so.preload` onto `/etc/ld.so.preload`.
    #[arg(long)]
    no_ld_so_preload: bool,
    /// Serve /healthz, /readyz and /metrics on this address.
    #[arg(long)]
    health_listen: Option<SocketAddr>,
    /// Log file (default: stderr, or /var/log/mockgpu-nri.log when launched by the runtime).
    #[arg(long)]
    log_file: Option<PathBuf>,
    /// Log filter, e.g. `info` or `mockgpu_nri=debug`.
    #[arg(long, default_value = "info")]
    log_level: String,
}

impl Args {
    fn config(&self) -> Result<Config> {
        let mut config = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        set(&mut config.socket, &self.socket);
        set(&mut config.name, &self.name);
        set(&mut config.index, &self.index);
        set(&mut config.injection.host_dir, &self.host_dir);
        set(&mut config.injection.container_dir, &self.container_dir);
        set(
            &mut config.injection.trusted_namespaces,
            &self.trusted_namespaces,
        );
        config.injection.fail_open |= self.fail_open;
        config.injection.ld_so_preload &= !self.no_ld_so_preload;
        let origin = match &self.config {
            Some(path) => format!("{} (with command-line overrides)", path.display()),
            None => "the command line".into(),
        };
        config.validate(&origin)?;
        Ok(config)
    }
}

/// Replaces `target` with the flag's value when the flag was given.
fn set<T: Clone>(target: &mut T, value: &Option<T>) {
    if let Some(value) = value {
        target.clone_from(value);
    }
}

fn init_logging(args: &Args) -> Result<()> {
    let filter = EnvFilter::try_new(&args.log_level)
        .with_context(|| format!("invalid --log-level {:?}", args.log_level))?;
    let file = match (&args.log_file, args.inherited_fd) {
        (Some(path), _) => Some(path.clone()),
        (None, Some(_)) => Some(PathBuf::from(PREINSTALLED_LOG)),
        (None, None) => None,
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match file {
        Some(path) => {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .with_context(|| format!("cannot open log file {}", path.display()))?;
            builder.with_ansi(false).with_writer(Arc::new(file)).init();
        }
        None => builder.with_writer(std::io::stderr).init(),
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    init_logging(&args)?;
    let config = args.config()?;
    let tree = args
        .driver_tree
        .clone()
        .unwrap_or_else(|| config.injection.host_dir.join("fs"));
    let inventory = Arc::new(DriverTreeInventory::new(tree, args.procfs.clone()));
    if inventory.real_driver() {
        tracing::info!("real NVIDIA driver found: injecting nothing");
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<PinningEvent>();
    tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            tracing::info!(?event, "pinning");
        }
    });
    let plugin = Plugin::new(config, inventory, Arc::new(tx))?;
    if let Some(addr) = args.health_listen {
        let server = HealthServer::bind(addr).await?;
        if let Ok(addr) = server.local_addr() {
            tracing::info!(%addr, "health endpoint listening");
        }
        let mut registry = Registry::default();
        plugin.status().register(&mut registry);
        tokio::spawn(server.serve(plugin.status(), registry, std::future::pending()));
    }
    let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("shutting down");
    };
    match args.inherited_fd {
        Some(fd) => plugin.run_inherited(fd, shutdown).await?,
        None => plugin.run(shutdown).await?,
    }
    Ok(())
}
