//! The command line of `mockgpu-agent` (the binary's, not the library's): its subcommands and
//! their arguments, with what `--help` says of each.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand, ValueEnum};

/// Makes this node look like an NVIDIA GPU node at the driver-file level.
#[derive(Parser)]
#[command(version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
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
pub struct FaultArgs {
    #[command(subcommand)]
    pub action: FaultAction,
    /// The agent's directory (serve --dir): the fault file is faults.json in it.
    #[arg(long, env = "MOCKGPU_DIR", default_value = mockgpu_api::layout::DEFAULT_DIR, global = true)]
    pub dir: PathBuf,
    /// The fault file itself, instead of <dir>/faults.json (`exec` sets MOCKGPU_FAULTS for its
    /// command).
    #[arg(long, env = mockgpu_agent::faults::FAULTS_ENV, global = true)]
    pub file: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum FaultAction {
    /// Add a fault to one GPU (exactly one of --xid, --ecc-single-bit/--ecc-double-bit,
    /// --thermal, --nvlink-down, --excluded).
    Add(FaultAddArgs),
    /// Clear faults: the one named, every fault of a GPU (--gpu) or all of them (--all).
    Clear(FaultClearArgs),
    /// List the node's local faults (name, then what each does).
    List,
}

#[derive(Args)]
pub struct FaultAddArgs {
    /// The GPU's index, as nvidia-smi numbers it.
    #[arg(long)]
    pub gpu: u32,
    /// An Xid error (e.g. 79: the GPU has fallen off the bus; 48: a double-bit ECC error; 13:
    /// an application error, which leaves the GPU healthy).
    #[arg(long)]
    pub xid: Option<u32>,
    /// ECC errors: this many corrected (single-bit) ones.
    #[arg(long)]
    pub ecc_single_bit: Option<u64>,
    /// ECC errors: this many uncorrected (double-bit) ones (the GPU turns unhealthy).
    #[arg(long)]
    pub ecc_double_bit: Option<u64>,
    /// Thermal slowdown (the GPU stays healthy).
    #[arg(long)]
    pub thermal: bool,
    /// This NVLink down (the GPU stays healthy).
    #[arg(long, value_name = "LINK")]
    pub nvlink_down: Option<u32>,
    /// The GPU excluded by the driver (unhealthy).
    #[arg(long)]
    pub excluded: bool,
    /// The fault's name, to clear it by [default: gpu<N>-<kind>, e.g. gpu1-xid79].
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub profile: ProfileArgs,
}

#[derive(Args)]
#[group(required = true, multiple = false)]
pub struct FaultClearArgs {
    /// The fault's name.
    pub name: Option<String>,
    /// Every fault of this GPU.
    #[arg(long)]
    pub gpu: Option<u32>,
    /// Every fault.
    #[arg(long)]
    pub all: bool,
}

#[derive(Args)]
pub struct PinTreeArgs {
    /// The mount point the entries' paths are relative to.
    pub mountpoint: PathBuf,
}

#[derive(Args)]
pub struct KeeperArgs {
    /// The agent's directory (serve --dir): the mount point is fs/ below it, the socket
    /// keeper.sock in <dir>-keeper beside it.
    #[arg(long, env = "MOCKGPU_DIR", default_value = mockgpu_api::layout::DEFAULT_DIR)]
    pub dir: PathBuf,
    /// After handing the connection over to a new keeper, stay (idle) until SIGTERM instead of
    /// exiting, so that a container runtime does not restart this keeper, which would take the
    /// connection back.
    #[arg(long)]
    pub idle_after_handover: bool,
    /// Relay every request and reply, even where agents could read the device themselves.
    #[arg(long)]
    pub relay: bool,
}

/// Whether `serve` uses a keeper.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeeperMode {
    /// Through the running keeper, starting one when none runs (root only; otherwise off).
    Auto,
    /// Through a keeper that relays every request (the data path of kernels before 6.9);
    /// a keeper already running keeps its own.
    Relay,
    /// Mount /dev/fuse in the agent itself: an agent restart unmounts the tree.
    Off,
}

#[derive(Args)]
pub struct DoctorArgs {
    /// The agent's directory (serve --dir).
    #[arg(long, env = "MOCKGPU_DIR", default_value = mockgpu_api::layout::DEFAULT_DIR)]
    pub dir: PathBuf,
    /// Where containers see the agent's directory (serve --container-dir).
    #[arg(long, env = "MOCKGPU_CONTAINER_DIR", default_value = mockgpu_api::layout::DEFAULT_DIR)]
    pub container_dir: PathBuf,
    /// The agent's health endpoint (serve --listen).
    #[arg(long, env = "MOCKGPU_LISTEN", default_value = "127.0.0.1:9464")]
    pub health: std::net::SocketAddr,
    /// The runtime's NRI socket [default: containerd's socket_path, else /var/run/nri/nri.sock].
    #[arg(long, env = "MOCKGPU_NRI_SOCKET")]
    pub nri_socket: Option<PathBuf>,
    /// containerd's configuration file.
    #[arg(long, default_value = "/etc/containerd/config.toml")]
    pub containerd_config: PathBuf,
    /// Slurm's configuration file (skipped when it cannot be read).
    #[arg(long, env = "SLURM_CONF", default_value = "/etc/slurm/slurm.conf")]
    pub slurm_conf: PathBuf,
    /// One JSON object per check (name, status ok/fail/skip, message, fix), one per line.
    #[arg(long)]
    pub json: bool,
    /// Where sysfs is mounted (read for a real NVIDIA driver).
    #[arg(long, default_value = "/sys", hide = true)]
    pub sysfs: PathBuf,
    /// Where procfs is mounted (read for a real NVIDIA driver).
    #[arg(long, default_value = "/proc", hide = true)]
    pub procfs: PathBuf,
    /// The kubelet's root directory (serve --kubelet-dir).
    #[arg(long, env = "MOCKGPU_KUBELET_DIR", default_value = mockgpu_agent::device_plugin::DEFAULT_KUBELET_DIR)]
    pub kubelet_dir: PathBuf,
    /// The device plugin's resource name (serve --resource-name).
    #[arg(long, env = "MOCKGPU_RESOURCE_NAME", default_value = mockgpu_agent::device_plugin::DEFAULT_RESOURCE)]
    pub resource_name: String,
    /// The node's name in Kubernetes [default: this host's name].
    #[arg(long, env = "MOCKGPU_NODE_NAME")]
    pub node_name: Option<String>,
    #[command(flatten)]
    pub api: ApiArgs,
}

#[derive(Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub profile: ProfileArgs,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<std::ffi::OsString>,
}

/// Which GPUs to mock.
#[derive(Args, Clone)]
pub struct ProfileArgs {
    /// Built-in profile: gb300 (default), gb200, b200, h200, h100, a100, l40s, t4.
    #[arg(long, env = "MOCKGPU_PROFILE", default_value = mockgpu_api::profile::DEFAULT_PROFILE, conflicts_with = "profile_file")]
    pub profile: String,
    /// A profile YAML file (complete, or `base: <built-in>` plus overrides).
    #[arg(long, env = "MOCKGPU_PROFILE_FILE")]
    pub profile_file: Option<PathBuf>,
    /// Node name, part of the GPUs' identity [default: this host's name].
    #[arg(long, env = "MOCKGPU_NODE_NAME")]
    pub node_name: Option<String>,
    /// Where sysfs is mounted (read for the host's CPUs, NUMA nodes and PCI devices).
    #[arg(long, default_value = "/sys", hide = true)]
    pub sysfs: PathBuf,
    /// Where procfs is mounted (read for the device majors in use, `devices`, and checked for a
    /// real NVIDIA driver).
    #[arg(long, default_value = "/proc", hide = true)]
    pub procfs: PathBuf,
}

#[derive(Args)]
pub struct RenderArgs {
    #[command(flatten)]
    pub profile: ProfileArgs,
    /// Output directory; must be absent or empty.
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub profile: ProfileArgs,
    /// The agent's directory: made a shared mount; receives the FUSE tree at fs/,
    /// lib/libmockfs.so and ld.so.preload.
    #[arg(long, env = "MOCKGPU_DIR", default_value = mockgpu_api::layout::DEFAULT_DIR)]
    pub dir: PathBuf,
    /// Where containers see the agent's directory (the NRI mount destination).
    #[arg(long, env = "MOCKGPU_CONTAINER_DIR", default_value = mockgpu_api::layout::DEFAULT_DIR)]
    pub container_dir: PathBuf,
    /// Address of /healthz, /readyz and /metrics (port 0: any free port, logged at start).
    #[arg(long, env = "MOCKGPU_LISTEN", default_value = "127.0.0.1:9464")]
    pub listen: std::net::SocketAddr,
    /// Seconds between checks of --profile-file for changes.
    #[arg(long, default_value_t = 2.0)]
    pub reload_interval: f64,
    /// Run the NRI plugin in-process, connected to the runtime's NRI socket.
    #[arg(long)]
    pub nri: bool,
    /// The runtime's NRI socket (implies --nri).
    #[arg(long, env = "MOCKGPU_NRI_SOCKET")]
    pub nri_socket: Option<PathBuf>,
    /// NRI plugin configuration file (YAML; implies --nri).
    #[arg(long, env = "MOCKGPU_NRI_CONFIG")]
    pub nri_config: Option<PathBuf>,
    /// Namespaces whose pods may claim GPUs by NVIDIA_VISIBLE_DEVICES or the mockgpu.io/inject
    /// annotation (comma-separated; implies --nri). Default: none, so only containers that hold
    /// GPU devices granted by Kubernetes get the mock.
    #[arg(long, env = "MOCKGPU_TRUSTED_NAMESPACES", value_delimiter = ',')]
    pub trusted_namespaces: Option<Vec<String>>,
    /// Advertise the GPUs to the kubelet as an extended resource (the kubelet device plugin).
    /// While another plugin serves the resource on the node (the GPU Operator's) it stands
    /// down, says so in the log, the metrics and the GpuNode, and checks again every 30 s.
    #[arg(long, env = "MOCKGPU_DEVICE_PLUGIN")]
    pub device_plugin: bool,
    /// The device plugin's resource name.
    #[arg(long, env = "MOCKGPU_RESOURCE_NAME", default_value = mockgpu_agent::device_plugin::DEFAULT_RESOURCE)]
    pub resource_name: String,
    /// The kubelet's root directory (its device-plugins/ holds the device plugin's registration
    /// socket, plugins_registry/ and plugins/ the DRA driver's).
    #[arg(long, env = "MOCKGPU_KUBELET_DIR", default_value = mockgpu_agent::device_plugin::DEFAULT_KUBELET_DIR)]
    pub kubelet_dir: PathBuf,
    /// Serve the GPUs through DRA as NVIDIA's driver `gpu.nvidia.com` does: a ResourceSlice with
    /// a device per GPU, claims prepared through CDI. Needs an API server; not with
    /// --device-plugin.
    #[arg(long, env = "MOCKGPU_DRA_GPUS", conflicts_with = "device_plugin")]
    pub dra_gpus: bool,
    /// Serve IMEX channels through DRA as NVIDIA's driver `compute-domain.nvidia.com` does, for
    /// ComputeDomains' channel claims. Needs an API server; works beside either GPU plugin.
    #[arg(long, env = "MOCKGPU_DRA_COMPUTE_DOMAINS")]
    pub dra_compute_domains: bool,
    /// Where the DRA driver writes its CDI specs (the runtime's CDI spec directory).
    #[arg(long, env = "MOCKGPU_CDI_DIR", default_value = mockgpu_agent::dra::DEFAULT_CDI_DIR)]
    pub cdi_dir: PathBuf,
    /// Report this node's GpuNode to the API server: auto (when in a cluster or a kubeconfig is
    /// present) or off.
    #[arg(long, env = "MOCKGPU_REPORT", value_enum, default_value_t = Report::Auto)]
    pub report: Report,
    /// Serve through a keeper (see `mockgpu-agent keeper --help`), so that no read fails while
    /// the agent restarts.
    #[arg(long, env = "MOCKGPU_KEEPER", value_enum, default_value_t = KeeperMode::Auto)]
    pub keeper: KeeperMode,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// Whether `serve` reports its GpuNode.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Report {
    /// When the pod's service account, KUBECONFIG, ~/.kube/config or --kubeconfig names an API
    /// server.
    Auto,
    /// Never.
    Off,
}

/// The API server and the GpuNode's heartbeat (serve's reporter, doctor's cluster checks).
#[derive(Args)]
pub struct ApiArgs {
    /// A kubeconfig file for the API server [default: the pod's service account, KUBECONFIG or
    /// ~/.kube/config].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Seconds between the GpuNode's heartbeats (each jittered by a tenth).
    #[arg(long, env = "MOCKGPU_HEARTBEAT", default_value_t = 30.0)]
    pub heartbeat: f64,
}

impl ApiArgs {
    pub fn heartbeat(&self) -> Result<std::time::Duration> {
        if !(1.0..=3600.0).contains(&self.heartbeat) {
            anyhow::bail!("--heartbeat must be between 1 and 3600 seconds");
        }
        Ok(std::time::Duration::from_secs_f64(self.heartbeat))
    }

    pub fn credentials(&self) -> Option<mockgpu_agent::report::Credentials> {
        mockgpu_agent::report::credentials_from_env(self.kubeconfig.as_deref())
    }
}
