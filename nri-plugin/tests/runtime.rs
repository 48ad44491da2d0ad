//! The plugin against the mock runtime: external socket mode, in-process connection, and the
//! pre-installed mode (the built binary on descriptor 3).

mod common;

use std::{
    os::{fd::AsRawFd, unix::process::CommandExt},
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};

use common::*;
use mockgpu_health::{Probe, Registry};
use mockgpu_nri::{
    Config, DriverTreeInventory, NotReady, PinningEvent, Plugin, PluginStatus,
    plugin::EVENT_MASK,
    proto::api::{ContainerAdjustment, ContainerState, CreateContainerResponse, Event},
};
use tokio::{
    net::{UnixListener, UnixStream},
    sync::mpsc,
};

const SHIM: &str = "/run/mockgpu/lib/libmockfs.so";

fn env_of(adjust: &ContainerAdjustment) -> Vec<(String, String)> {
    adjust
        .env
        .iter()
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect()
}

fn devices_of(adjust: &ContainerAdjustment) -> Vec<(String, i64, i64)> {
    adjust
        .linux
        .devices
        .iter()
        .map(|d| (d.path.clone(), d.major, d.minor))
        .collect()
}

fn dev(path: &str, major: i64, minor: i64) -> (String, i64, i64) {
    (path.into(), major, minor)
}

fn injected(reply: &CreateContainerResponse) -> &ContainerAdjustment {
    assert!(reply.adjust.is_some(), "expected an adjustment");
    &reply.adjust
}

/// The mounts of `adjust`: (source, destination, type, options).
fn mounts_of(adjust: &ContainerAdjustment) -> Vec<(String, String, String, String)> {
    adjust
        .mounts
        .iter()
        .map(|m| {
            (
                m.source.clone(),
                m.destination.clone(),
                m.type_.clone(),
                m.options.join(","),
            )
        })
        .collect()
}

/// A bind mount of `source` at `destination` with `options`, after its removal.
fn bind(source: &str, destination: &str, options: &str) -> [(String, String, String, String); 2] {
    [
        (
            String::new(),
            format!("-{destination}"),
            String::new(),
            String::new(),
        ),
        (
            source.into(),
            destination.into(),
            "bind".into(),
            options.into(),
        ),
    ]
}

/// The tree, `ld.so.preload`, the mock NVML where the loader of Debian, Ubuntu (the multiarch
/// directory) and RHEL-family images (`/usr/lib64`) finds it by either name, and nvidia-smi.
fn assert_mounts(adjust: &ContainerAdjustment) {
    let nvml = "/run/mockgpu/lib/libnvidia-ml.so.1";
    let multiarch = format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH);
    let lib_dirs = [multiarch.as_str(), "/usr/lib64"];
    let libs = lib_dirs.iter().flat_map(|dir| {
        ["libnvidia-ml.so.1", "libnvidia-ml.so"]
            .map(|name| bind(nvml, &format!("{dir}/{name}"), "bind,ro"))
    });
    let expected: Vec<_> = [
        bind("/run/mockgpu", "/run/mockgpu", "rbind,rslave,ro"),
        bind(
            "/run/mockgpu/ld.so.preload",
            "/etc/ld.so.preload",
            "bind,ro",
        ),
    ]
    .into_iter()
    .chain(libs)
    .chain([bind(
        "/run/mockgpu/bin/nvidia-smi",
        "/usr/bin/nvidia-smi",
        "bind,ro",
    )])
    .flatten()
    .collect();
    assert_eq!(mounts_of(adjust), expected);
}

async fn next_event(rx: &mut mpsc::UnboundedReceiver<PinningEvent>) -> PinningEvent {
    within("pinning event", rx.recv())
        .await
        .expect("pinning channel open")
}

fn pinned_minors(event: &PinningEvent) -> (String, Vec<u32>) {
    match event {
        PinningEvent::Pinned {
            container_id, gpus, ..
        } => (container_id.clone(), gpus.iter().map(|g| g.minor).collect()),
        other => panic!("expected Pinned, got {other:?}"),
    }
}

/// The plugin's metrics as its health endpoint serves them.
fn metrics_of(status: &PluginStatus) -> String {
    let mut registry = Registry::default();
    status.register(&mut registry);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    out
}

fn unpinned_id(event: &PinningEvent) -> String {
    match event {
        PinningEvent::Unpinned { container_id, .. } => container_id.clone(),
        other => panic!("expected Unpinned, got {other:?}"),
    }
}

#[tokio::test]
async fn external_mode_lifecycle_adjustments_pinning_and_reconnect() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let runtime = MockRuntime::bind(&socket);
    let config = Config {
        socket: socket.clone(),
        index: "05".into(),
        ..trusted_config()
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let plugin = Arc::new(Plugin::new(config, FixedInventory::gpus(4), Arc::new(tx)).unwrap());
    let status = plugin.status();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = {
        let plugin = Arc::clone(&plugin);
        tokio::spawn(async move {
            plugin
                .run(async {
                    let _ = stopped.await;
                })
                .await
        })
    };

    // A pre-existing GPU container (found by a split Synchronize) is reported as pinned;
    // a stopped one and a plain one are not.
    let old = pod("old", &[]);
    let mut stopped_gpu = container(&old, "done", &["NVIDIA_VISIBLE_DEVICES=all"], &[], &[]);
    stopped_gpu.state = ContainerState::CONTAINER_STOPPED.into();
    let hs = Handshake {
        pods: vec![old.clone()],
        containers: vec![
            container(&old, "plain", &["A=1"], &[], &[]),
            stopped_gpu,
            container(&old, "trainer", &["NVIDIA_VISIBLE_DEVICES=2,3"], &[], &[]),
        ],
        split: Some(1),
        ..Handshake::default()
    };
    let conn = runtime.accept(&hs).await;
    assert_eq!(conn.sync_calls, 3);
    assert_eq!(
        (
            conn.registration.plugin_name.as_str(),
            conn.registration.plugin_idx.as_str()
        ),
        ("mockgpu", "05")
    );
    assert_eq!(conn.events, EVENT_MASK);
    assert_eq!(
        pinned_minors(&next_event(&mut rx).await),
        ("old-trainer".into(), vec![2, 3])
    );
    within("ready", async {
        while status.ready().is_err() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;

    // slurmd-like: privileged, every /dev/nvidia<N> already present.
    let slurm = pod("slurm", &[]);
    let slurmd = container(
        &slurm,
        "slurmd",
        &["PATH=/usr/bin"],
        &[
            "/dev/null",
            "/dev/nvidia0",
            "/dev/nvidia1",
            "/dev/nvidia2",
            "/dev/nvidia3",
        ],
        &[],
    );
    let reply = conn.create(&slurm, &slurmd).await.unwrap();
    let adjust = injected(&reply);
    assert_mounts(adjust);
    assert_eq!(
        env_of(adjust),
        [
            ("-LD_PRELOAD".into(), String::new()),
            ("LD_PRELOAD".into(), SHIM.into())
        ]
    );
    assert_eq!(
        devices_of(adjust),
        [
            dev("/dev/nvidiactl", 195, 255),
            dev("/dev/nvidia-uvm", 386, 0),
            dev("/dev/nvidia-uvm-tools", 386, 1)
        ]
    );
    assert_eq!(
        pinned_minors(&next_event(&mut rx).await),
        ("slurm-slurmd".into(), vec![0, 1, 2, 3])
    );

    // A GPU container with an existing LD_PRELOAD keeps it, after the shim.
    let app = pod("app", &[]);
    let preload = container(
        &app,
        "cuda",
        &[
            "LD_PRELOAD=/usr/lib/libjemalloc.so",
            "NVIDIA_VISIBLE_DEVICES=1",
        ],
        &[],
        &[],
    );
    let reply = conn.create(&app, &preload).await.unwrap();
    let adjust = injected(&reply);
    assert_eq!(
        env_of(adjust),
        [
            ("-LD_PRELOAD".into(), String::new()),
            (
                "LD_PRELOAD".into(),
                format!("{SHIM}:/usr/lib/libjemalloc.so")
            )
        ]
    );
    assert_eq!(
        devices_of(adjust),
        [
            dev("/dev/nvidia1", 195, 1),
            dev("/dev/nvidiactl", 195, 255),
            dev("/dev/nvidia-uvm", 386, 0),
            dev("/dev/nvidia-uvm-tools", 386, 1)
        ]
    );
    assert_eq!(
        pinned_minors(&next_event(&mut rx).await),
        ("app-cuda".into(), vec![1])
    );

    // CDI only, by UUID.
    let cdi = container(
        &app,
        "cdi",
        &[],
        &[],
        &["nvidia.com/gpu=GPU-00000002-1111-2222-3333-444444444444"],
    );
    let reply = conn.create(&app, &cdi).await.unwrap();
    assert_mounts(injected(&reply));
    assert_eq!(devices_of(injected(&reply))[0], dev("/dev/nvidia2", 195, 2));
    assert_eq!(
        pinned_minors(&next_event(&mut rx).await),
        ("app-cdi".into(), vec![2])
    );

    // A plain container and the musl sidecar of an opted-in pod get the empty adjustment.
    let plain = container(
        &app,
        "plain",
        &["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"],
        &["/dev/null"],
        &["vendor.com/x=1"],
    );
    assert_eq!(
        conn.create(&app, &plain).await.unwrap(),
        CreateContainerResponse::new()
    );
    let opted = pod("opted", &[("mockgpu.io/inject", "slurmd")]);
    let sidecar = container(&opted, "logfile", &[], &[], &[]);
    assert_eq!(
        conn.create(&opted, &sidecar).await.unwrap(),
        CreateContainerResponse::new()
    );
    let opted_slurmd = container(&opted, "slurmd", &[], &[], &[]);
    assert!(
        conn.create(&opted, &opted_slurmd)
            .await
            .unwrap()
            .adjust
            .is_some()
    );
    assert_eq!(
        pinned_minors(&next_event(&mut rx).await),
        ("opted-slurmd".into(), vec![0, 1, 2, 3])
    );

    // Removal through every path: dedicated RPCs and StateChange.
    conn.remove(&app, &preload).await;
    assert_eq!(unpinned_id(&next_event(&mut rx).await), "app-cuda");
    conn.state_change(Event::REMOVE_CONTAINER, &app, &cdi).await;
    assert_eq!(unpinned_id(&next_event(&mut rx).await), "app-cdi");
    conn.stop(&opted, &opted_slurmd).await;
    assert_eq!(unpinned_id(&next_event(&mut rx).await), "opted-slurmd");
    conn.state_change(Event::POST_START_CONTAINER, &slurm, &slurmd)
        .await; // unsubscribed kinds are harmless
    conn.remove_pod(&slurm).await;
    assert_eq!(unpinned_id(&next_event(&mut rx).await), "slurm-slurmd");
    conn.remove(&app, &plain).await; // never pinned: no event
    conn.state_change(Event::REMOVE_POD_SANDBOX, &old, &plain)
        .await;
    assert_eq!(unpinned_id(&next_event(&mut rx).await), "old-trainer");
    assert!(rx.try_recv().is_err(), "unexpected extra pinning event");

    // Every frame the plugin sent fits the Go reader.
    conn.assert_frames_fit();

    // The runtime goes away and comes back on the same path: the plugin re-registers.
    conn.close().await;
    drop(runtime);
    within("not ready after close", async {
        while status.ready().is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // The runtime is still restarting: its socket accepts and closes at once. The plugin's
    // attempt there shows that it retries while the runtime is away.
    let _ = std::fs::remove_file(&socket);
    let restarting = UnixListener::bind(&socket).unwrap();
    let (attempt, _) = within("a retry while the runtime is away", restarting.accept())
        .await
        .unwrap();
    drop((attempt, restarting));
    let runtime = MockRuntime::bind(&socket);
    let conn = runtime.accept(&Handshake::default()).await;
    assert_eq!(status.registrations(), 2);
    let again = container(&app, "again", &["NVIDIA_VISIBLE_DEVICES=0"], &[], &[]);
    assert!(conn.create(&app, &again).await.unwrap().adjust.is_some());
    assert_eq!(
        pinned_minors(&next_event(&mut rx).await),
        ("app-again".into(), vec![0])
    );
    conn.assert_frames_fit();
    let metrics = metrics_of(&status);
    assert!(
        metrics.contains("mockgpu_nri_injections_total 5\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("mockgpu_nri_registrations_total 2\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("mockgpu_nri_events_total{event=\"create_container\"} 7\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("mockgpu_nri_create_container_duration_seconds_count 7\n"),
        "{metrics}"
    );

    stop.send(()).unwrap();
    within("plugin shutdown", task).await.unwrap().unwrap();
}

/// Runs the plugin over one in-process socket pair and handshakes with `hs`.
async fn connect_in_process(
    plugin: Arc<Plugin>,
    hs: &Handshake,
) -> (
    Result<Connected, String>,
    tokio::task::JoinHandle<mockgpu_nri::Result<()>>,
) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let task =
        tokio::spawn(async move { plugin.run_connection(ours, std::future::pending()).await });
    (Connected::handshake(theirs, hs).await, task)
}

#[tokio::test]
async fn many_gpus_give_a_multi_frame_response_in_small_frames() {
    let (tx, _rx) = mpsc::unbounded_channel();
    let plugin =
        Arc::new(Plugin::new(trusted_config(), FixedInventory::gpus(128), Arc::new(tx)).unwrap());
    let (conn, task) = connect_in_process(plugin, &Handshake::default()).await;
    let conn = conn.unwrap();
    let p = pod("big", &[]);
    let reply = conn
        .create(
            &p,
            &container(&p, "all", &["NVIDIA_VISIBLE_DEVICES=all"], &[], &[]),
        )
        .await
        .unwrap();
    assert_eq!(reply.adjust.linux.devices.len(), 128 + 3);
    let sizes = conn.assert_frames_fit();
    assert!(
        sizes.iter().filter(|s| **s == GO_FRAME_LIMIT).count() >= 1,
        "response was not split: {sizes:?}"
    );
    conn.close().await;
    within("connection end", task).await.unwrap().unwrap();
}

#[tokio::test]
async fn not_ready_fails_closed_by_default_and_open_by_configuration() {
    let broken = Arc::new(FixedInventory(Err(NotReady(
        "no GPUs under /run/mockgpu/fs/proc/driver/nvidia/gpus".into(),
    ))));
    let p = pod("p", &[]);
    let gpu = container(&p, "slurmd", &["NVIDIA_VISIBLE_DEVICES=all"], &[], &[]);
    let plain = container(&p, "plain", &[], &[], &[]);

    let (tx, mut rx) = mpsc::unbounded_channel();
    let plugin = Arc::new(Plugin::new(trusted_config(), broken.clone(), Arc::new(tx)).unwrap());
    let (conn, _task) = connect_in_process(Arc::clone(&plugin), &Handshake::default()).await;
    let conn = conn.unwrap();
    let ttrpc::Error::RpcStatus(status) = conn.create(&p, &gpu).await.unwrap_err() else {
        panic!("expected an error status");
    };
    assert_eq!(status.code(), ttrpc::Code::FAILED_PRECONDITION);
    assert!(
        status.message().starts_with("mockgpu: driver tree not ready on this node (agent not serving /run/mockgpu/fs): no GPUs under"),
        "{}",
        status.message()
    );
    assert_eq!(
        conn.create(&p, &plain).await.unwrap(),
        CreateContainerResponse::new()
    );
    assert!(rx.try_recv().is_err());
    conn.close().await;

    // fail_open through the runtime's configuration (the pre-installed plugin's drop-in file).
    let hs = Handshake {
        config: "injection:\n  fail_open: true\n".into(),
        ..Handshake::default()
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let plugin = Arc::new(Plugin::new(trusted_config(), broken, Arc::new(tx)).unwrap());
    let (conn, _task) = connect_in_process(Arc::clone(&plugin), &hs).await;
    let conn = conn.unwrap();
    assert_eq!(
        conn.create(&p, &gpu).await.unwrap(),
        CreateContainerResponse::new()
    );
    assert!(rx.try_recv().is_err());
    let metrics = metrics_of(&plugin.status());
    assert!(
        metrics.contains("mockgpu_nri_errors_total{outcome=\"fail_open\"} 1\n"),
        "{metrics}"
    );
    conn.close().await;
}

#[tokio::test]
async fn a_real_driver_gets_a_gpu_container_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // A served mock tree, and a real driver listing GPUs in this host's procfs.
    write_tree(&dir.path().join("mock"), 2);
    write_tree(&dir.path().join("real"), 2);
    let inventory =
        DriverTreeInventory::new(dir.path().join("mock/fs"), dir.path().join("real/fs/proc"));
    let p = pod("p", &[]);
    let gpu = container(&p, "slurmd", &[], &["/dev/nvidia0"], &[]);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let plugin =
        Arc::new(Plugin::new(trusted_config(), Arc::new(inventory), Arc::new(tx)).unwrap());
    let (conn, _task) = connect_in_process(plugin, &Handshake::default()).await;
    let conn = conn.unwrap();
    // no mount (the tree, the NVML, nvidia-smi), no variable, no device
    assert_eq!(
        conn.create(&p, &gpu).await.unwrap(),
        CreateContainerResponse::new()
    );
    assert!(rx.try_recv().is_err());
    conn.close().await;
}

#[tokio::test]
async fn pinned_gauge_follows_the_pin_table_when_a_pin_changes() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let plugin =
        Arc::new(Plugin::new(trusted_config(), FixedInventory::gpus(4), Arc::new(tx)).unwrap());
    let pinned = || {
        let metrics = metrics_of(&plugin.status());
        let line = metrics
            .lines()
            .find_map(|l| l.strip_prefix("mockgpu_nri_pinned_containers "))
            .unwrap_or_else(|| panic!("no pinned gauge in\n{metrics}"));
        line.parse::<i64>().unwrap()
    };
    let (conn, task) = connect_in_process(Arc::clone(&plugin), &Handshake::default()).await;
    let conn = conn.unwrap();
    let p = pod("train", &[]);
    let worker = container(&p, "worker", &["NVIDIA_VISIBLE_DEVICES=0"], &[], &[]);
    assert!(conn.create(&p, &worker).await.unwrap().adjust.is_some());
    assert_eq!(
        pinned_minors(&next_event(&mut rx).await),
        ("train-worker".into(), vec![0])
    );
    assert_eq!(pinned(), 1);
    // The same container with other GPUs: a second Pinned event, still one pinned container.
    let moved = container(&p, "worker", &["NVIDIA_VISIBLE_DEVICES=2,3"], &[], &[]);
    assert!(conn.create(&p, &moved).await.unwrap().adjust.is_some());
    assert_eq!(
        pinned_minors(&next_event(&mut rx).await),
        ("train-worker".into(), vec![2, 3])
    );
    assert_eq!(pinned(), 1);
    conn.remove(&p, &moved).await;
    assert_eq!(unpinned_id(&next_event(&mut rx).await), "train-worker");
    assert_eq!(pinned(), 0);
    conn.close().await;
    within("connection end", task).await.unwrap().unwrap();
}

#[tokio::test]
async fn invalid_runtime_configuration_is_rejected_at_configure() {
    let (tx, _rx) = mpsc::unbounded_channel();
    let plugin =
        Arc::new(Plugin::new(trusted_config(), FixedInventory::gpus(1), Arc::new(tx)).unwrap());
    let hs = Handshake {
        config: "injection:\n  fail_opn: true\n".into(),
        ..Handshake::default()
    };
    let (conn, _task) = connect_in_process(plugin, &hs).await;
    let err = conn.err().expect("Configure must fail");
    assert!(
        err.contains("Configure failed") && err.contains("fail_opn"),
        "{err}"
    );
}

/// One HTTP GET against the plugin's health endpoint.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    within("health request", async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: plugin\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    })
    .await
}

#[tokio::test]
async fn preinstalled_binary_on_fd_3() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host");
    write_tree(&host, 2);
    let log = dir.path().join("plugin.log");
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let fd = theirs.as_raw_fd();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mockgpu-nri"));
    cmd.env_clear()
        .env("NRI_PLUGIN_SOCKET", "3")
        .env("NRI_PLUGIN_NAME", "mockgpu-test")
        .env("NRI_PLUGIN_IDX", "07")
        .arg("--log-file")
        .arg(&log)
        // As on the node test bed: the runtime resolves the mount source in its own root, while
        // this process reads the driver tree elsewhere.
        .arg("--host-dir")
        .arg("/srv/mockgpu")
        .arg("--driver-tree")
        .arg(host.join("fs"))
        .args(["--trusted-namespaces", "slurm"])
        .args(["--health-listen", "127.0.0.1:0"])
        .arg("--log-level")
        .arg("debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if fd == 3 {
                let flags = libc::fcntl(3, libc::F_GETFD);
                libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            } else if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(theirs);
    ours.set_nonblocking(true).unwrap();
    let stream = UnixStream::from_std(ours).unwrap();
    let conn = Connected::handshake(stream, &Handshake::default())
        .await
        .unwrap();
    assert_eq!(
        (
            conn.registration.plugin_name.as_str(),
            conn.registration.plugin_idx.as_str()
        ),
        ("mockgpu-test", "07")
    );
    let p = pod("slurm", &[]);
    let slurmd = container(&p, "slurmd", &[], &["/dev/nvidia0", "/dev/nvidia1"], &[]);
    let reply = conn.create(&p, &slurmd).await.unwrap();
    let adjust = injected(&reply);
    assert_eq!(adjust.mounts[1].source, "/srv/mockgpu");
    assert_eq!(adjust.mounts[3].source, "/srv/mockgpu/ld.so.preload");
    assert_eq!(adjust.mounts[1].destination, "/run/mockgpu");
    assert_eq!(devices_of(adjust)[0], dev("/dev/nvidiactl", 195, 255));
    conn.assert_frames_fit();
    // The plugin bound port 0 and logged the address it got.
    let health: std::net::SocketAddr = within("the health address in the log", async {
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(addr) = text.lines().find_map(|l| {
                let rest = l.split("health endpoint listening").nth(1)?;
                rest.split("addr=")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            }) {
                return addr;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let ready = http_get(health, "/readyz").await;
    assert!(ready.starts_with("HTTP/1.1 200 OK"), "{ready}");
    let metrics = http_get(health, "/metrics").await;
    assert!(
        metrics.contains("\nmockgpu_nri_injections_total 1\n"),
        "{metrics}"
    );

    // The runtime closes the socket: a launched plugin exits (the runtime relaunches it).
    conn.close().await;
    let status = within("plugin exit", async {
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status:?}\n{text}");
    assert!(
        text.contains("registered with the NRI runtime") && text.contains("injected the mock"),
        "{text}"
    );
}
