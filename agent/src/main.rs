//! `mockgpu-agent`: command-line entry point. Parses arguments, sets up logging and calls the
//! library.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand, ValueEnum};
use mockgpu_agent::dra::Driver;
use mockgpu_agent::output;
use mockgpu_agent::profile::{self, ProfileSource};
use mockgpu_agent::serve::{self, ServeConfig};
use mockgpu_agent::tree::Tree;
use mockgpu_api::NodeTopology;

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
    /// Serve the driver tree over FUSE (the DaemonSet entry point); optionally run the NRI plugin.
    Serve(ServeArgs),
    /// Run one command as if this machine had the profile's GPUs (FUSE + the shim), e.g.
    /// `exec -- slurmd -C` or `exec -- lspci -d 10de:`.
    Exec(ExecArgs),
    /// Check this node (mode, FUSE tree, shim, mount propagation, NRI, device plugin, GpuNode,
    /// Slurm) and say what is wrong and how to fix it; exit status 1 when a check fails.
    Doctor(DoctorArgs),
    /// Inject GPU faults into this node's mock GPUs, clear them, list them.
    ///
    /// Faults live in the node's fault file, <dir>/faults.json (JSON; written whole, through a
    /// temporary file and a rename). A running `serve` applies a change within its
    /// --reload-interval: an Xid line in the mock root's log/nvidia-xid; Xid 79 removes the GPU
    /// from /proc/driver/nvidia/gpus and PCI; the mock NVML shows the errors; the device plugin
    /// advertises a GPU the faults leave unhealthy as Unhealthy; the GpuNode lists the faults.
    /// `exec` gives its command MOCKGPU_FAULTS, the fault file of that exec, which `fault`
    /// edits instead (with the profile `exec` was given). A fault is checked against the node's
    /// GPUs (the profile options, as for `serve`) and refused, changing nothing, when it names
    /// a GPU or an NVLink the node lacks or an unknown Xid. The cluster-wide way is a GpuFault
    /// object (see docs/faults.md).
    Fault(FaultArgs),
    /// Hold the driver tree's FUSE connection while agents restart (root only).
    ///
    /// The keeper mounts /dev/fuse at <dir>/fs; agents connect on <dir>-keeper/keeper.sock
    /// (beside <dir>, which containers see). Where the kernel can resend requests (Linux 6.9 and
    /// later), each agent gets the device and reads it itself; when one crashes or restarts, the
    /// keeper asks the kernel to resend what it left unanswered, and the next agent reads it.
    /// Otherwise (and with --relay) the keeper relays every request to the agent and every reply
    /// back, and gives what an agent left unanswered to the next one. While no agent is
    /// connected, the kernel queues requests and readers wait. A keeper started while another one runs takes the
    /// connection over from it (the old one exits without unmounting), so the keeper itself can
    /// be upgraded too. `serve` starts a keeper by itself when none runs; in Kubernetes it is a
    /// native sidecar of the agent's pod. SIGTERM detaches the mount and ends the keeper.
    Keeper(KeeperArgs),
    /// Read the mounted driver tree and hold it in the kernel's caches until standard input
    /// closes (started by `serve`, which writes the entries on standard input).
    #[command(hide = true)]
    PinTree(PinTreeArgs),
}

#[derive(Args)]
struct FaultArgs {
    #[command(subcommand)]
    action: FaultAction,
    /// The agent's directory (serve --dir): the fault file is faults.json in it.
    #[arg(long, env = "MOCKGPU_DIR", default_value = mockgpu_api::layout::DEFAULT_DIR, global = true)]
    dir: PathBuf,
    /// The fault file itself, instead of <dir>/faults.json (`exec` sets MOCKGPU_FAULTS for its
    /// command).
    #[arg(long, env = mockgpu_agent::faults::FAULTS_ENV, global = true)]
    file: Option<PathBuf>,
}

#[derive(Subcommand)]
enum FaultAction {
    /// Add a fault to one GPU (exactly one of --xid, --ecc-single-bit/--ecc-double-bit,
    /// --thermal, --nvlink-down, --excluded).
    Add(FaultAddArgs),
    /// Clear faults: the one named, every fault of a GPU (--gpu) or all of them (--all).
    Clear(FaultClearArgs),
    /// List the node's local faults (name, then what each does).
    List,
}

#[derive(Args)]
struct FaultAddArgs {
    /// The GPU's index, as nvidia-smi numbers it.
    #[arg(long)]
    gpu: u32,
    /// An Xid error (e.g. 79: the GPU has fallen off the bus; 48: a double-bit ECC error; 13:
    /// an application error, which leaves the GPU healthy).
    #[arg(long)]
    xid: Option<u32>,
    /// ECC errors: this many corrected (single-bit) ones.
    #[arg(long)]
    ecc_single_bit: Option<u64>,
    /// ECC errors: this many uncorrected (double-bit) ones (the GPU turns unhealthy).
    #[arg(long)]
    ecc_double_bit: Option<u64>,
    /// Thermal slowdown (the GPU stays healthy).
    #[arg(long)]
    thermal: bool,
    /// This NVLink down (the GPU stays healthy).
    #[arg(long, value_name = "LINK")]
    nvlink_down: Option<u32>,
    /// The GPU excluded by the driver (unhealthy).
    #[arg(long)]
    excluded: bool,
    /// The fault's name, to clear it by [default: gpu<N>-<kind>, e.g. gpu1-xid79].
    #[arg(long)]
    name: Option<String>,
    #[command(flatten)]
    profile: ProfileArgs,
}

#[derive(Args)]
#[group(required = true, multiple = false)]
struct FaultClearArgs {
    /// The fault's name.
    name: Option<String>,
    /// Every fault of this GPU.
    #[arg(long)]
    gpu: Option<u32>,
    /// Every fault.
    #[arg(long)]
    all: bool,
}

#[derive(Args)]
struct PinTreeArgs {
    /// The mount point the entries' paths are relative to.
    mountpoint: PathBuf,
}

#[derive(Args)]
struct KeeperArgs {
    /// The agent's directory (serve --dir): the mount point is fs/ below it, the socket
    /// keeper.sock in <dir>-keeper beside it.
    #[arg(long, env = "MOCKGPU_DIR", default_value = mockgpu_api::layout::DEFAULT_DIR)]
    dir: PathBuf,
    /// After handing the connection over to a new keeper, stay (idle) until SIGTERM instead of
    /// exiting, so that a container runtime does not restart this keeper, which would take the
    /// connection back.
    #[arg(long)]
    idle_after_handover: bool,
    /// Relay every request and reply, even where agents could read the device themselves.
    #[arg(long)]
    relay: bool,
}

/// Whether `serve` uses a keeper.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum KeeperMode {
    /// Through the running keeper, starting one when none runs (root only; otherwise off).
    Auto,
    /// Through a keeper that relays every request (the data path of kernels before 6.9);
    /// a keeper already running keeps its own.
    Relay,
    /// Mount /dev/fuse in the agent itself: an agent restart unmounts the tree.
    Off,
}

#[derive(Args)]
struct DoctorArgs {
    /// The agent's directory (serve --dir).
    #[arg(long, env = "MOCKGPU_DIR", default_value = mockgpu_api::layout::DEFAULT_DIR)]
    dir: PathBuf,
    /// Where containers see the agent's directory (serve --container-dir).
    #[arg(long, env = "MOCKGPU_CONTAINER_DIR", default_value = mockgpu_api::layout::DEFAULT_DIR)]
    container_dir: PathBuf,
    /// The agent's health endpoint (serve --listen).
    #[arg(long, env = "MOCKGPU_LISTEN", default_value = "127.0.0.1:9464")]
    health: std::net::SocketAddr,
    /// The runtime's NRI socket [default: containerd's socket_path, else /var/run/nri/nri.sock].
    #[arg(long, env = "MOCKGPU_NRI_SOCKET")]
    nri_socket: Option<PathBuf>,
    /// containerd's configuration file.
    #[arg(long, default_value = "/etc/containerd/config.toml")]
    containerd_config: PathBuf,
    /// Slurm's configuration file (skipped when it cannot be read).
    #[arg(long, env = "SLURM_CONF", default_value = "/etc/slurm/slurm.conf")]
    slurm_conf: PathBuf,
    /// One JSON object per check (name, status ok/fail/skip, message, fix), one per line.
    #[arg(long)]
    json: bool,
    /// Where sysfs is mounted (read for a real NVIDIA driver).
    #[arg(long, default_value = "/sys", hide = true)]
    sysfs: PathBuf,
    /// Where procfs is mounted (read for a real NVIDIA driver).
    #[arg(long, default_value = "/proc", hide = true)]
    procfs: PathBuf,
    /// The kubelet's root directory (serve --kubelet-dir).
    #[arg(long, env = "MOCKGPU_KUBELET_DIR", default_value = mockgpu_agent::device_plugin::DEFAULT_KUBELET_DIR)]
    kubelet_dir: PathBuf,
    /// The device plugin's resource name (serve --resource-name).
    #[arg(long, env = "MOCKGPU_RESOURCE_NAME", default_value = mockgpu_agent::device_plugin::DEFAULT_RESOURCE)]
    resource_name: String,
    /// The node's name in Kubernetes [default: this host's name].
    #[arg(long, env = "MOCKGPU_NODE_NAME")]
    node_name: Option<String>,
    #[command(flatten)]
    api: ApiArgs,
}

#[derive(Args)]
struct ExecArgs {
    #[command(flatten)]
    profile: ProfileArgs,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<std::ffi::OsString>,
}

/// Which GPUs to mock.
#[derive(Args, Clone)]
struct ProfileArgs {
    /// Built-in profile: gb300 (default), gb200, b200, h200, h100, a100, l40s, t4.
    #[arg(long, env = "MOCKGPU_PROFILE", default_value = mockgpu_api::profile::DEFAULT_PROFILE, conflicts_with = "profile_file")]
    profile: String,
    /// A profile YAML file (complete, or `base: <built-in>` plus overrides).
    #[arg(long, env = "MOCKGPU_PROFILE_FILE")]
    profile_file: Option<PathBuf>,
    /// Node name, part of the GPUs' identity [default: this host's name].
    #[arg(long, env = "MOCKGPU_NODE_NAME")]
    node_name: Option<String>,
    /// Where sysfs is mounted (read for the host's CPUs, NUMA nodes and PCI devices).
    #[arg(long, default_value = "/sys", hide = true)]
    sysfs: PathBuf,
    /// Where procfs is mounted (read for the device majors in use, `devices`, and checked for a
    /// real NVIDIA driver).
    #[arg(long, default_value = "/proc", hide = true)]
    procfs: PathBuf,
}

#[derive(Args)]
struct RenderArgs {
    #[command(flatten)]
    profile: ProfileArgs,
    /// Output directory; must be absent or empty.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    profile: ProfileArgs,
    /// The agent's directory: made a shared mount; receives the FUSE tree at fs/,
    /// lib/libmockfs.so and ld.so.preload.
    #[arg(long, env = "MOCKGPU_DIR", default_value = mockgpu_api::layout::DEFAULT_DIR)]
    dir: PathBuf,
    /// Where containers see the agent's directory (the NRI mount destination).
    #[arg(long, env = "MOCKGPU_CONTAINER_DIR", default_value = mockgpu_api::layout::DEFAULT_DIR)]
    container_dir: PathBuf,
    /// Address of /healthz, /readyz and /metrics (port 0: any free port, logged at start).
    #[arg(long, env = "MOCKGPU_LISTEN", default_value = "127.0.0.1:9464")]
    listen: std::net::SocketAddr,
    /// Seconds between checks of --profile-file for changes.
    #[arg(long, default_value_t = 2.0)]
    reload_interval: f64,
    /// Run the NRI plugin in-process, connected to the runtime's NRI socket.
    #[arg(long)]
    nri: bool,
    /// The runtime's NRI socket (implies --nri).
    #[arg(long, env = "MOCKGPU_NRI_SOCKET")]
    nri_socket: Option<PathBuf>,
    /// NRI plugin configuration file (YAML; implies --nri).
    #[arg(long, env = "MOCKGPU_NRI_CONFIG")]
    nri_config: Option<PathBuf>,
    /// Namespaces whose pods may claim GPUs by NVIDIA_VISIBLE_DEVICES or the mockgpu.io/inject
    /// annotation (comma-separated; implies --nri). Default: none, so only containers that hold
    /// GPU devices granted by Kubernetes get the mock.
    #[arg(long, env = "MOCKGPU_TRUSTED_NAMESPACES", value_delimiter = ',')]
    trusted_namespaces: Option<Vec<String>>,
    /// Advertise the GPUs to the kubelet as an extended resource (the kubelet device plugin).
    /// While another plugin serves the resource on the node (the GPU Operator's) it stands
    /// down, says so in the log, the metrics and the GpuNode, and checks again every 30 s.
    #[arg(long, env = "MOCKGPU_DEVICE_PLUGIN")]
    device_plugin: bool,
    /// The device plugin's resource name.
    #[arg(long, env = "MOCKGPU_RESOURCE_NAME", default_value = mockgpu_agent::device_plugin::DEFAULT_RESOURCE)]
    resource_name: String,
    /// The kubelet's root directory (its device-plugins/ holds the device plugin's registration
    /// socket, plugins_registry/ and plugins/ the DRA driver's).
    #[arg(long, env = "MOCKGPU_KUBELET_DIR", default_value = mockgpu_agent::device_plugin::DEFAULT_KUBELET_DIR)]
    kubelet_dir: PathBuf,
    /// Serve the GPUs through DRA as NVIDIA's driver `gpu.nvidia.com` does: a ResourceSlice with
    /// a device per GPU, claims prepared through CDI. Needs an API server; not with
    /// --device-plugin.
    #[arg(long, env = "MOCKGPU_DRA_GPUS", conflicts_with = "device_plugin")]
    dra_gpus: bool,
    /// Serve IMEX channels through DRA as NVIDIA's driver `compute-domain.nvidia.com` does, for
    /// ComputeDomains' channel claims. Needs an API server; works beside either GPU plugin.
    #[arg(long, env = "MOCKGPU_DRA_COMPUTE_DOMAINS")]
    dra_compute_domains: bool,
    /// Where the DRA driver writes its CDI specs (the runtime's CDI spec directory).
    #[arg(long, env = "MOCKGPU_CDI_DIR", default_value = mockgpu_agent::dra::DEFAULT_CDI_DIR)]
    cdi_dir: PathBuf,
    /// Report this node's GpuNode to the API server: auto (when in a cluster or a kubeconfig is
    /// present) or off.
    #[arg(long, env = "MOCKGPU_REPORT", value_enum, default_value_t = Report::Auto)]
    report: Report,
    /// Serve through a keeper (see `mockgpu-agent keeper --help`), so that no read fails while
    /// the agent restarts.
    #[arg(long, env = "MOCKGPU_KEEPER", value_enum, default_value_t = KeeperMode::Auto)]
    keeper: KeeperMode,
    #[command(flatten)]
    api: ApiArgs,
}

/// Whether `serve` reports its GpuNode.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Report {
    /// When the pod's service account, KUBECONFIG, ~/.kube/config or --kubeconfig names an API
    /// server.
    Auto,
    /// Never.
    Off,
}

/// The API server and the GpuNode's heartbeat (serve's reporter, doctor's cluster checks).
#[derive(Args)]
struct ApiArgs {
    /// A kubeconfig file for the API server [default: the pod's service account, KUBECONFIG or
    /// ~/.kube/config].
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Seconds between the GpuNode's heartbeats (each jittered by a tenth).
    #[arg(long, env = "MOCKGPU_HEARTBEAT", default_value_t = 30.0)]
    heartbeat: f64,
}

impl ApiArgs {
    fn heartbeat(&self) -> Result<std::time::Duration> {
        if !(1.0..=3600.0).contains(&self.heartbeat) {
            anyhow::bail!("--heartbeat must be between 1 and 3600 seconds");
        }
        Ok(std::time::Duration::from_secs_f64(self.heartbeat))
    }

    fn credentials(&self) -> Option<mockgpu_agent::report::Credentials> {
        mockgpu_agent::report::credentials_from_env(self.kubeconfig.as_deref())
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // `exec` shares the terminal with the command it runs, and `doctor` prints its own report:
    // only warnings by default.
    let default_level = if matches!(cli.command, Command::Exec(_) | Command::Doctor(_)) {
        "warn"
    } else {
        "info"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_level.into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    match run(cli.command) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mockgpu-agent: {e}");
            // Like env(1): 127 when the command to exec does not exist, 126 when it cannot run.
            match e.downcast_ref::<mockgpu_agent::exec::ExecError>() {
                Some(mockgpu_agent::exec::ExecError::Spawn { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    std::process::ExitCode::from(127)
                }
                Some(mockgpu_agent::exec::ExecError::Spawn { .. }) => {
                    std::process::ExitCode::from(126)
                }
                _ => std::process::ExitCode::FAILURE,
            }
        }
    }
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Render(args) => {
            let (topo, tree) = topology(&args.profile)?;
            let written = output::write_tree(&tree, &args.out)?;
            for dev in &written.skipped_devices {
                tracing::warn!(
                    device = dev,
                    "device node skipped: creating it needs CAP_MKNOD"
                );
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
        Command::Serve(args) => serve(args)?,
        Command::Exec(args) => {
            let (profile, _) = profile_source(&args.profile).load()?;
            let node_name = node_name(&args.profile)?;
            let (sysfs, procfs) = (&args.profile.sysfs, &args.profile.procfs);
            let (topo, host) = profile::place(&profile, &node_name, sysfs, procfs)?;
            let tree = mockgpu_agent::render::driver_tree(&topo, &host);
            tracing::info!(profile = %topo.profile.name, gpus = topo.gpus.len(), "running with mock GPUs");
            let follow = mockgpu_agent::exec::Follow {
                env: profile_env(&args.profile, &node_name),
                topo,
                host,
            };
            let (code, backing) = mockgpu_agent::exec::run(&tree, &args.command, Some(follow))?;
            tracing::debug!(code, ?backing, "command finished");
            std::process::exit(code);
        }
        Command::Doctor(args) => {
            if !doctor(args)? {
                std::process::exit(1);
            }
        }
        Command::Fault(args) => fault(args)?,
        Command::Keeper(args) => keeper(args)?,
        Command::PinTree(args) => {
            // `ps` shows the executable's name otherwise: `exe`, for `/proc/self/exe pin-tree`.
            let _ = nix::sys::prctl::set_name(c"mockgpu-pinner");
            mockgpu_agent::pinner::run(
                &args.mountpoint,
                std::io::stdin().lock(),
                std::io::stdout().lock(),
            )?;
        }
    }
    Ok(())
}

/// Prints every check; whether all passed or were skipped.
fn doctor(args: DoctorArgs) -> Result<bool> {
    use mockgpu_agent::doctor::{self, Options};
    let opts = Options {
        layout: mockgpu_api::Layout::new(&args.dir, &args.container_dir)?,
        health: args.health,
        nri_socket: args.nri_socket,
        containerd_config: args.containerd_config,
        slurm_conf: args.slurm_conf,
        procfs: args.procfs,
        sysfs: args.sysfs,
        kubelet_dir: args.kubelet_dir,
        resource_name: args.resource_name,
        node_name: or_hostname(args.node_name)?,
        heartbeat: args.api.heartbeat()?,
        credentials: args.api.credentials(),
    };
    let checks = doctor::run(&doctor::Live, &opts);
    // Written, not printed: a closed pipe (`doctor | head`) is an error, not a panic.
    let mut out = std::io::stdout().lock();
    for check in &checks {
        if args.json {
            writeln!(out, "{}", serde_json::to_string(check)?)?;
        } else {
            writeln!(out, "{check}")?;
        }
    }
    Ok(!doctor::failed(&checks))
}

/// `fault add|clear|list`: edits the fault file (or lists it).
fn fault(args: FaultArgs) -> Result<()> {
    use mockgpu_agent::faults::{self, Clear};
    use mockgpu_api::{Fault, FaultKind};
    let path = match args.file {
        Some(f) => f,
        None => mockgpu_api::Layout::new(&args.dir, &args.dir)?.faults_file(),
    };
    let mut file = faults::read_file(&path)?;
    match args.action {
        FaultAction::List => {
            let mut out = std::io::stdout().lock();
            for f in &file.faults {
                writeln!(out, "{}\t{}", f.name, f.fault.describe())?;
            }
            return Ok(());
        }
        FaultAction::Add(a) => {
            let ecc = a.ecc_single_bit.is_some() || a.ecc_double_bit.is_some();
            let kinds = [
                (a.xid.is_some(), FaultKind::Xid),
                (ecc, FaultKind::Ecc),
                (a.thermal, FaultKind::Thermal),
                (a.nvlink_down.is_some(), FaultKind::NvLinkDown),
                (a.excluded, FaultKind::Excluded),
            ];
            let chosen: Vec<FaultKind> = kinds.iter().filter(|k| k.0).map(|k| k.1).collect();
            let &[kind] = &chosen[..] else {
                anyhow::bail!(
                    "give exactly one of --xid, --ecc-single-bit/--ecc-double-bit, --thermal, --nvlink-down, --excluded"
                );
            };
            let fault = Fault {
                gpu: a.gpu,
                kind,
                xid: a.xid,
                single_bit: a.ecc_single_bit,
                double_bit: a.ecc_double_bit,
                link: a.nvlink_down,
            };
            let topo = fault_topology(&a.profile)?;
            let name = faults::add(&mut file, a.name.as_deref(), fault.clone(), &topo)?;
            faults::write_file(&path, &file)?;
            println!("{name}\t{}", fault.describe());
        }
        FaultAction::Clear(c) => {
            let which = match (c.name, c.gpu) {
                (Some(n), _) => Clear::Name(n),
                (None, Some(g)) => Clear::Gpu(g),
                (None, None) => Clear::All,
            };
            let removed = faults::clear(&mut file, &which)?;
            if !removed.is_empty() {
                faults::write_file(&path, &file)?;
            }
            for f in removed {
                println!("cleared {}\t{}", f.name, f.fault.describe());
            }
        }
    }
    Ok(())
}

/// The GPUs a fault is checked against: the profile placed on this host, or, where the host
/// cannot take it (under `exec`, whose shim shows the mock's own device numbers and PCI
/// devices), on a bare host; the GPU indices and NVLinks are the profile's either way.
fn fault_topology(args: &ProfileArgs) -> Result<NodeTopology> {
    let (profile, _) = profile_source(args).load()?;
    let node_name = node_name(args)?;
    match profile::place(&profile, &node_name, &args.sysfs, &args.procfs) {
        Ok((topo, _)) => Ok(topo),
        Err(e) => {
            tracing::debug!(error = %e, "the profile does not fit this host; checking on a bare one");
            let host = mockgpu_api::HostTopology {
                cpus: mockgpu_api::CpuSet::from_ids(0..2),
                nr_cpu_ids: 2,
                ..Default::default()
            };
            Ok(NodeTopology::build(&profile, &node_name, &host)?)
        }
    }
}

/// The variables that give `fault` run by `exec`'s command the profile `exec` serves.
fn profile_env(
    args: &ProfileArgs,
    node_name: &str,
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    let mut env = vec![("MOCKGPU_NODE_NAME".into(), node_name.into())];
    match &args.profile_file {
        Some(f) => {
            let f = std::path::absolute(f).unwrap_or_else(|_| f.clone());
            env.push(("MOCKGPU_PROFILE_FILE".into(), f.into_os_string()));
        }
        None => env.push(("MOCKGPU_PROFILE".into(), args.profile.clone().into())),
    }
    env
}

fn keeper(args: KeeperArgs) -> Result<()> {
    use mockgpu_agent::keeper::{self, DataPath, Outcome};
    let layout = mockgpu_api::Layout::new(&args.dir, &args.dir)?;
    let path = if args.relay {
        DataPath::Relay
    } else {
        DataPath::Auto
    };
    if keeper::run(&layout, path)? == Outcome::HandedOver && args.idle_after_handover {
        // SIGTERM and SIGINT are still blocked (the keeper read them from a signalfd).
        let mut signals = nix::sys::signal::SigSet::empty();
        signals.add(nix::sys::signal::Signal::SIGTERM);
        signals.add(nix::sys::signal::Signal::SIGINT);
        signals.wait()?;
    }
    Ok(())
}

fn serve(args: ServeArgs) -> Result<()> {
    let layout = mockgpu_api::Layout::new(&args.dir, &args.container_dir)?;
    let nri = if args.nri
        || args.nri_socket.is_some()
        || args.nri_config.is_some()
        || args.trusted_namespaces.is_some()
    {
        let mut config = match &args.nri_config {
            Some(path) => mockgpu_nri::Config::load(path)?,
            None => mockgpu_nri::Config::default(),
        };
        if let Some(socket) = &args.nri_socket {
            config.socket = socket.clone();
        }
        if let Some(namespaces) = &args.trusted_namespaces {
            config.injection.trusted_namespaces = namespaces.clone();
        }
        // The plugin mounts the agent's directory (lib/, ld.so.preload, fs/) into containers.
        config.injection.host_dir = layout.host_dir().to_path_buf();
        config.injection.container_dir = layout.container_dir().to_path_buf();
        Some(config)
    } else {
        None
    };
    if !(0.05..=3600.0).contains(&args.reload_interval) {
        anyhow::bail!("--reload-interval must be between 0.05 and 3600 seconds");
    }
    let device_plugin = args
        .device_plugin
        .then(|| {
            mockgpu_agent::device_plugin::Config::new(
                &args.resource_name,
                &args.kubelet_dir,
                &layout,
            )
        })
        .transpose()?;
    let node_name = node_name(&args.profile)?;
    let heartbeat = args.api.heartbeat()?;
    let report = match (args.report, args.api.credentials()) {
        (Report::Off, _) => None,
        (Report::Auto, None) => {
            tracing::info!("no Kubernetes API server configured: not reporting");
            None
        }
        (Report::Auto, Some(credentials)) => Some(mockgpu_agent::report::Config {
            node_name: node_name.clone(),
            heartbeat,
            credentials,
        }),
    };
    let drivers: Vec<Driver> = [
        (args.dra_gpus, Driver::Gpu),
        (args.dra_compute_domains, Driver::Channel),
    ]
    .into_iter()
    .filter_map(|(on, driver)| on.then_some(driver))
    .collect();
    let dra = if drivers.is_empty() {
        None
    } else if report.is_none() {
        anyhow::bail!(
            "--dra-gpus and --dra-compute-domains need an API server (in a cluster, or with --kubeconfig) and --report auto: the DRA driver publishes ResourceSlices and reads ResourceClaims"
        );
    } else {
        Some(mockgpu_agent::dra::Config::new(
            drivers,
            &args.kubelet_dir,
            &args.cdi_dir,
        )?)
    };
    let cfg = ServeConfig {
        profile: profile_source(&args.profile),
        node_name,
        sysfs: args.profile.sysfs.clone(),
        procfs: args.profile.procfs.clone(),
        layout,
        listen: args.listen,
        reload_interval: std::time::Duration::from_secs_f64(args.reload_interval),
        nri,
        device_plugin,
        dra,
        report,
        keeper: match args.keeper {
            KeeperMode::Auto => Some(mockgpu_agent::keeper::DataPath::Auto),
            KeeperMode::Relay => Some(mockgpu_agent::keeper::DataPath::Relay),
            KeeperMode::Off => None,
        },
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        serve::run(cfg, shutdown).await?;
        anyhow::Ok(())
    })
}

fn node_name(args: &ProfileArgs) -> Result<String> {
    or_hostname(args.node_name.clone())
}

/// `name`, else this host's name.
fn or_hostname(name: Option<String>) -> Result<String> {
    Ok(match name {
        Some(n) => n,
        None => nix::unistd::gethostname()?.to_string_lossy().into_owned(),
    })
}

/// The profile's GPUs placed onto this host, and their driver tree.
fn topology(args: &ProfileArgs) -> Result<(NodeTopology, Tree)> {
    let (profile, _) = profile_source(args).load()?;
    Ok(profile::build(
        &profile,
        &node_name(args)?,
        &args.sysfs,
        &args.procfs,
    )?)
}

fn profile_source(args: &ProfileArgs) -> ProfileSource {
    match &args.profile_file {
        Some(path) => ProfileSource::File(path.clone()),
        None => ProfileSource::Builtin(args.profile.clone()),
    }
}
