//! `mgtb-cri`: the test bed's stand-in for a kubelet (see `tests/testbed/README.md`).

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use mockgpu_testbed::client::Cri;
use mockgpu_testbed::spec::{self, ContainerSpec, DeviceSpec, MountSpec, PodSpec};
use mockgpu_testbed::stats;

#[derive(Parser)]
#[command(version, about = "CRI client for the mockgpu node test bed")]
struct Cli {
    /// The runtime's CRI socket (a host path)
    #[arg(long, env = "CRI_SOCKET")]
    socket: PathBuf,
    /// Bound on every CRI request, seconds
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the runtime's version
    Version,
    /// Run a host-network pod (or reuse the ready one of that name) and a container in it;
    /// prints POD=, CTR=, PID=, CREATE_MS=, START_MS=
    Up(UpArgs),
    /// ExecSync a command in a container (id, id prefix or unique running name); relays its
    /// output and exits with its exit code (125 when the runtime could not run it)
    Exec {
        #[arg(long, default_value_t = 60)]
        timeout: i64,
        /// Retries when the runtime fails to start the exec (runc's rare "init-p" races)
        #[arg(long, default_value_t = 2)]
        retries: u32,
        container: String,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Print the host PID of a running container
    Pid { container: String },
    /// List containers: ID POD NAME STATE
    Ps,
    /// Stop and remove one container
    Rm {
        /// Seconds between SIGTERM and SIGKILL
        #[arg(long, default_value_t = 0)]
        grace: i64,
        container: String,
    },
    /// Stop and remove pods by name or id prefix (all pods when none is named)
    Down { pods: Vec<String> },
    /// Median/p90 of the CreateContainer round trip over N creations in one pod (each container
    /// is removed again, never started)
    CreateLatency {
        #[arg(short = 'n', default_value_t = 20)]
        n: usize,
        /// Creations before the measured ones (warm caches)
        #[arg(long, default_value_t = 2)]
        warmup: usize,
        /// Also print every sample, one `sample_ms <value>` line each
        #[arg(long)]
        raw: bool,
        #[command(flatten)]
        shape: Shape,
    },
}

#[derive(Args)]
struct UpArgs {
    /// Do not start the container (create only)
    #[arg(long)]
    no_start: bool,
    #[command(flatten)]
    shape: Shape,
    /// Command (default: the image's)
    #[arg(last = true)]
    cmd: Vec<String>,
}

/// What the pod and the container look like.
#[derive(Args)]
struct Shape {
    /// Pod name
    #[arg(long, default_value = "testpod")]
    pod: String,
    /// Container name
    #[arg(long, default_value = "main")]
    name: String,
    #[arg(long, default_value = "localhost/busybox:1")]
    image: String,
    #[arg(long)]
    privileged: bool,
    /// KEY=VALUE
    #[arg(long, value_parser = spec::parse_kv)]
    env: Vec<(String, String)>,
    /// HOST[:CONTAINER[:PERMISSIONS]] (node paths)
    #[arg(long, value_parser = spec::parse_device)]
    device: Vec<DeviceSpec>,
    /// CDI device name, e.g. nvidia.com/gpu=0
    #[arg(long)]
    cdi: Vec<String>,
    /// HOST:CONTAINER[:ro][:rslave|:rshared] (node paths)
    #[arg(long, value_parser = spec::parse_mount)]
    mount: Vec<MountSpec>,
    /// Container label KEY=VALUE
    #[arg(long, value_parser = spec::parse_kv)]
    label: Vec<(String, String)>,
    /// Container annotation KEY=VALUE
    #[arg(long, value_parser = spec::parse_kv)]
    annotation: Vec<(String, String)>,
    /// Pod label KEY=VALUE
    #[arg(long, value_parser = spec::parse_kv)]
    pod_label: Vec<(String, String)>,
    /// Pod annotation KEY=VALUE
    #[arg(long, value_parser = spec::parse_kv)]
    pod_annotation: Vec<(String, String)>,
    /// Cgroup parent of every pod (cgroupfs)
    #[arg(long, env = "MGTB_CGROUP_PARENT", default_value = "/mgtb")]
    cgroup_parent: String,
}

impl Shape {
    fn specs(&self, cmd: &[String]) -> (PodSpec, ContainerSpec) {
        let map = |v: &[(String, String)]| v.iter().cloned().collect::<HashMap<_, _>>();
        let pod = PodSpec {
            name: self.pod.clone(),
            namespace: "default".into(),
            labels: map(&self.pod_label),
            annotations: map(&self.pod_annotation),
            cgroup_parent: self.cgroup_parent.clone(),
        };
        let c = ContainerSpec {
            name: self.name.clone(),
            image: self.image.clone(),
            command: cmd.to_vec(),
            privileged: self.privileged,
            env: self.env.clone(),
            devices: self.device.clone(),
            cdi_devices: self.cdi.clone(),
            mounts: self.mount.clone(),
            labels: map(&self.label),
            annotations: map(&self.annotation),
        };
        (pod, c)
    }
}

/// Exit code when the CRI client itself fails (as `docker exec` does for runtime errors).
const EXIT_CLIENT_ERROR: i32 = 125;

fn main() {
    let cli = Cli::parse();
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(run(cli)));
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("mgtb-cri: {e:#}");
            std::process::exit(EXIT_CLIENT_ERROR)
        }
    }
}

async fn run(cli: Cli) -> Result<i32> {
    let mut cri = Cri::connect(&cli.socket, Duration::from_secs(cli.timeout))
        .await
        .with_context(|| format!("CRI socket {}", cli.socket.display()))?;
    match cli.cmd {
        Cmd::Version => println!("{}", cri.version().await?),
        Cmd::Up(a) => {
            let (pod, c) = a.shape.specs(&a.cmd);
            let s = cri
                .up(&pod, &c, !a.no_start)
                .await
                .with_context(|| format!("up {}/{}", pod.name, c.name))?;
            println!("POD={}\nCTR={}\nPID={}", s.pod_id, s.container_id, s.pid);
            println!(
                "CREATE_MS={:.2}\nSTART_MS={:.2}",
                s.create.as_secs_f64() * 1e3,
                s.start.as_secs_f64() * 1e3
            );
        }
        Cmd::Exec {
            timeout,
            retries,
            container,
            cmd,
        } => {
            let id = cri.resolve(&container).await?;
            let mut attempt = 0;
            let out = loop {
                match cri.exec(&id, &cmd, timeout).await {
                    Ok(out) => break out,
                    Err(e) if attempt < retries => {
                        eprintln!("mgtb-cri: exec in {id} failed, retrying: {e}");
                        attempt += 1;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => return Err(e).with_context(|| format!("exec in {id}")),
                }
            };
            std::io::stdout().write_all(&out.stdout)?;
            std::io::stderr().write_all(&out.stderr)?;
            return Ok(out.exit_code);
        }
        Cmd::Pid { container } => {
            let id = cri.resolve(&container).await?;
            println!("{}", cri.pid(&id).await?);
        }
        Cmd::Ps => {
            for c in cri.list_containers(None).await? {
                println!(
                    "{} {} {} {}",
                    &c.id[..c.id.len().min(13)],
                    &c.pod_id[..c.pod_id.len().min(13)],
                    c.name,
                    c.state.as_str_name()
                );
            }
        }
        Cmd::Rm { grace, container } => {
            let id = cri.resolve(&container).await?;
            cri.remove_container(&id, grace).await?;
        }
        Cmd::Down { pods } => {
            let n = cri.down(&pods).await?;
            println!("removed {n} pod(s)");
        }
        Cmd::CreateLatency {
            n,
            warmup,
            raw,
            shape,
        } => {
            if n == 0 {
                bail!("-n must be at least 1");
            }
            let (mut pod, c) = shape.specs(&[]);
            pod.name = format!("{}-lat-{}", pod.name, std::process::id());
            let sample = cri.create_latency(&pod, &c, warmup, n).await?;
            let s = stats::summarize(&sample).context("empty sample")?;
            println!("{s}");
            if raw {
                for d in &sample {
                    println!("sample_ms {:.3}", d.as_secs_f64() * 1e3);
                }
            }
        }
    }
    Ok(0)
}
