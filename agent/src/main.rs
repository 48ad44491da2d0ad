//! `mockgpu-agent`: command-line entry point. Parses arguments, sets up logging and calls the
//! library.

use std::io::Write as _;

use anyhow::Result;
use clap::Parser as _;
use mockgpu_agent::dra::Driver;
use mockgpu_agent::output;
use mockgpu_agent::profile::{self, ProfileSource};
use mockgpu_agent::serve::{self, ServeConfig};
use mockgpu_agent::tree::Tree;
use mockgpu_api::NodeTopology;

mod cli;

use cli::{
    Cli, Command, DoctorArgs, FaultAction, FaultArgs, KeeperArgs, KeeperMode, ProfileArgs, Report,
    ServeArgs,
};

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

/// The GPUs a fault is checked against ([`profile::place_for_faults`]).
fn fault_topology(args: &ProfileArgs) -> Result<NodeTopology> {
    let (profile, _) = profile_source(args).load()?;
    Ok(profile::place_for_faults(
        &profile,
        &node_name(args)?,
        &args.sysfs,
        &args.procfs,
    )?)
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
