//! The kubelet device plugin against a fake kubelet: the test serves the kubelet's
//! `Registration` service on a temporary `device-plugins/kubelet.sock`, records what the plugin
//! registers, and dials the plugin's socket as the kubelet does. The plugin creates real
//! character devices in a temporary directory (the tests need root, for mknod; the last one
//! also mounts the agent's FUSE tree, in a private mount namespace).

mod common;

use std::fs;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use mockgpu_agent::device_plugin::proto::device_plugin_client::DevicePluginClient;
use mockgpu_agent::device_plugin::proto::registration_server::{Registration, RegistrationServer};
use mockgpu_agent::device_plugin::proto::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Device,
    DeviceSpec, Empty, ListAndWatchResponse, PreferredAllocationRequest, RegisterRequest,
};
use mockgpu_agent::device_plugin::{
    self, CHECKPOINT, Config, DevicePluginError, Metrics, Standing,
};
use mockgpu_agent::faults::{Checked, FaultReport, Sourced};
use mockgpu_agent::sys::Linux;
use mockgpu_api::{Fault, Layout, NodeTopology, Profile};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::codec::Streaming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status};

/// Bound on every wait for the plugin.
const WAIT: Duration = Duration::from_secs(10);

/// The kubelet's registration service, recording each request.
struct Recorder(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for Recorder {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let _ = self.0.send(request.into_inner());
        Ok(Response::new(Empty {}))
    }
}

/// A fake kubelet serving `Registration` on `<dir>/kubelet.sock`; dropping it stops serving.
struct Kubelet {
    registrations: mpsc::UnboundedReceiver<RegisterRequest>,
    _stop: oneshot::Sender<()>,
}

impl Kubelet {
    /// Serves a fresh `kubelet.sock` in `dir` (a new file, as a restarted kubelet makes).
    fn start(dir: &Path) -> Kubelet {
        fs::create_dir_all(dir).unwrap();
        let socket = dir.join(device_plugin::KUBELET_SOCKET);
        let _ = fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).unwrap();
        let (tx, registrations) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(
            Server::builder()
                .add_service(RegistrationServer::new(Recorder(tx)))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                }),
        );
        Kubelet {
            registrations,
            _stop: stop,
        }
    }

    /// The next registration.
    async fn registered(&mut self) -> RegisterRequest {
        tokio::time::timeout(WAIT, self.registrations.recv())
            .await
            .expect("timed out waiting for the plugin to register")
            .expect("the kubelet's service ended")
    }

    /// The next registration, by `plugin`: when the plugin ends first (a device node it may not
    /// create), its error at once rather than a timeout.
    async fn registered_by(
        &mut self,
        plugin: &mut JoinHandle<Result<(), DevicePluginError>>,
    ) -> RegisterRequest {
        tokio::select! {
            request = self.registered() => request,
            result = plugin => match result.expect("the plugin does not panic") {
                Ok(()) => panic!("the plugin ended before registering"),
                Err(e) => panic!("the plugin ended before registering: {e}"),
            },
        }
    }
}

/// A node's temporary kubelet and agent directories.
struct Node {
    root: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        Node {
            root: tempfile::tempdir().unwrap(),
        }
    }

    fn layout(&self) -> Layout {
        let run = self.root.path().join("run");
        Layout::new(&run, &run).unwrap()
    }

    fn config(&self, resource: &str) -> Config {
        let mut config =
            Config::new(resource, &self.root.path().join("kubelet"), &self.layout()).unwrap();
        config.poll_interval = Duration::from_millis(20);
        config
    }

    fn plugin_dir(&self) -> PathBuf {
        self.root
            .path()
            .join("kubelet")
            .join(device_plugin::PLUGIN_DIR)
    }
}

/// A running plugin: publish topologies through `topology`, faults through `faults`; dropping
/// it shuts it down.
struct Plugin {
    topology: watch::Sender<Option<NodeTopology>>,
    faults: watch::Sender<FaultReport>,
    task: JoinHandle<Result<(), DevicePluginError>>,
    _stop: oneshot::Sender<()>,
    metrics: Metrics,
    standing: watch::Receiver<Standing>,
}

fn start(config: Config, topo: NodeTopology) -> Plugin {
    let (topology, rx) = watch::channel(Some(topo));
    let (faults, faults_rx) = watch::channel(FaultReport::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let metrics = Metrics::default();
    let (standing_tx, standing) = watch::channel(Standing::default());
    let task = tokio::spawn(device_plugin::run(
        config,
        Linux,
        rx,
        faults_rx,
        metrics.clone(),
        standing_tx,
        async {
            let _ = stopped.await;
        },
    ));
    Plugin {
        topology,
        faults,
        task,
        _stop: stop,
        metrics,
        standing,
    }
}

impl Plugin {
    /// Its standing, once `settled` holds of it.
    async fn standing_when(&mut self, settled: impl FnMut(&Standing) -> bool) -> Standing {
        tokio::time::timeout(WAIT, self.standing.wait_for(settled))
            .await
            .expect("timed out waiting for the plugin's standing")
            .expect("the plugin's standing is sent")
            .clone()
    }
}

/// The gb300 profile (4 GPUs: 0 and 1 on NUMA node 0, 2 and 3 on node 1) with `extra` YAML.
fn gb300(extra: &str, node: &str) -> NodeTopology {
    let profile = Profile::from_yaml(&format!("base: gb300\n{extra}"), "test.yaml").unwrap();
    let host = common::fixed_host();
    NodeTopology::build(&profile, node, &host).unwrap()
}

async fn dial(socket: &Path) -> DevicePluginClient<Channel> {
    let channel = Endpoint::from_shared(format!("unix://{}", socket.display()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    DevicePluginClient::new(channel)
}

/// The result the plugin ended with.
async fn ended(task: JoinHandle<Result<(), DevicePluginError>>) -> Result<(), DevicePluginError> {
    tokio::time::timeout(WAIT, task)
        .await
        .expect("timed out waiting for the plugin to end")
        .expect("the plugin does not panic")
}

/// Opens `ListAndWatch` as the kubelet does after a registration.
async fn list_and_watch(
    client: &mut DevicePluginClient<Channel>,
) -> Streaming<ListAndWatchResponse> {
    client.list_and_watch(Empty {}).await.unwrap().into_inner()
}

async fn next(stream: &mut Streaming<ListAndWatchResponse>) -> Vec<Device> {
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("timed out waiting for a device list")
        .expect("the stream ended")
        .expect("the stream failed")
        .devices
}

fn health(devices: &[Device]) -> Vec<(String, String)> {
    devices
        .iter()
        .map(|d| (d.id.clone(), d.health.clone()))
        .collect()
}

fn metrics_text(metrics: &Metrics) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    out
}

#[tokio::test]
async fn registers_lists_and_allocates() {
    let node = Node::new();
    let mut kubelet = Kubelet::start(&node.plugin_dir());
    let topo = gb300("", "node-0");
    let uuids: Vec<String> = topo.gpus.iter().map(|g| g.uuid.clone()).collect();
    let mut plugin = start(node.config("nvidia.com/gpu"), topo.clone());

    let request = kubelet.registered_by(&mut plugin.task).await;
    assert_eq!(request.version, "v1beta1");
    assert_eq!(request.endpoint, "mockgpu-nvidia.com_gpu.sock");
    assert_eq!(request.resource_name, "nvidia.com/gpu");
    let options = request.options.unwrap();
    assert!(options.get_preferred_allocation_available);
    assert!(!options.pre_start_required);

    let socket = node.plugin_dir().join(&request.endpoint);
    let mut client = dial(&socket).await;
    let mut stream = list_and_watch(&mut client).await;
    let devices = next(&mut stream).await;
    let listed: Vec<(String, String, Vec<i64>)> = devices
        .iter()
        .map(|d| {
            let numa = d
                .topology
                .as_ref()
                .unwrap()
                .nodes
                .iter()
                .map(|n| n.id)
                .collect();
            (d.id.clone(), d.health.clone(), numa)
        })
        .collect();
    let want: Vec<(String, String, Vec<i64>)> = uuids
        .iter()
        .zip([0, 0, 1, 1])
        .map(|(u, numa)| (u.clone(), "Healthy".into(), vec![numa]))
        .collect();
    assert_eq!(listed, want);
    assert!(metrics_text(&plugin.metrics).contains("mockgpu_device_plugin_healthy_gpus 4\n"));

    // A profile change marks GPU 1 failed: the stream sends the new list.
    plugin
        .topology
        .send_replace(Some(gb300("failed_gpus: [1]\n", "node-0")));
    let devices = next(&mut stream).await;
    let mut want = Vec::new();
    for (i, u) in uuids.iter().enumerate() {
        let h = if i == 1 { "Unhealthy" } else { "Healthy" };
        want.push((u.clone(), h.into()));
    }
    assert_eq!(health(&devices), want);
    // The UUIDs stay: a failed GPU is the same device.
    assert!(metrics_text(&plugin.metrics).contains("mockgpu_device_plugin_healthy_gpus 3\n"));

    // GPUs 3 and 0, in any order: minor order in the answer.
    let response = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![uuids[3].clone(), uuids[0].clone()],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let container = &response.container_responses[0];
    let dev = node.layout().dev_dir();
    let uvm = topo.devices.uvm;
    let want: Vec<(String, PathBuf, u64)> = [
        ("nvidia0", 195, 0),
        ("nvidia3", 195, 3),
        ("nvidiactl", 195, 255),
        ("nvidia-uvm", uvm, 0),
        ("nvidia-uvm-tools", uvm, 1),
    ]
    .iter()
    .map(|&(name, major, minor)| {
        (
            format!("/dev/{name}"),
            dev.join(name),
            nix::sys::stat::makedev(major.into(), minor),
        )
    })
    .collect();
    let got: Vec<(String, PathBuf, u64)> = container
        .devices
        .iter()
        .map(|d: &DeviceSpec| {
            assert_eq!(d.permissions, "rw");
            let meta = fs::metadata(&d.host_path).unwrap();
            assert!(meta.file_type().is_char_device(), "{}", d.host_path);
            (
                d.container_path.clone(),
                PathBuf::from(&d.host_path),
                meta.rdev(),
            )
        })
        .collect();
    assert_eq!(got, want);
    assert_eq!(
        container.envs.get("NVIDIA_VISIBLE_DEVICES"),
        Some(&format!("{},{}", uuids[0], uuids[3]))
    );
    let text = metrics_text(&plugin.metrics);
    assert!(
        text.contains("mockgpu_device_plugin_allocations_total 1\n"),
        "{text}"
    );
    assert!(
        text.contains("mockgpu_device_plugin_allocated_gpus_total 2\n"),
        "{text}"
    );

    // Bad input: unknown IDs and more GPUs than the node has.
    let refused = |ids: Vec<String>| {
        let mut client = client.clone();
        async move {
            client
                .allocate(AllocateRequest {
                    container_requests: vec![ContainerAllocateRequest { devices_ids: ids }],
                })
                .await
                .unwrap_err()
        }
    };
    let e = refused(vec![uuids[0].clone(), "GPU-nope".into()]).await;
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(e.message(), "unknown device IDs: GPU-nope");
    let mut five = uuids.clone();
    five.push("GPU-fifth".into());
    let e = refused(five.clone()).await;
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(
        e.message(),
        format!(
            "allocation of 5 devices ({}) is larger than the node's 4 GPUs",
            five.join(", ")
        )
    );
    assert!(metrics_text(&plugin.metrics).contains("mockgpu_device_plugin_allocations_total 1\n"));

    // The preferred allocation for two GPUs including GPU 2 stays on its NUMA node.
    let preferred = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: uuids.clone(),
                must_include_device_i_ds: vec![uuids[2].clone()],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        preferred.container_responses[0].device_i_ds,
        [uuids[2].clone(), uuids[3].clone()]
    );

    drop(plugin._stop);
    ended(plugin.task).await.unwrap();
    assert!(!socket.exists(), "the plugin removes its socket");
}

/// Xid `code` on GPU `gpu`, applied on `topo` as the agent applies a local fault.
fn xid_on(topo: &NodeTopology, gpu: u32, code: u32) -> FaultReport {
    let fault = Fault::xid(gpu, code);
    let sourced = Sourced {
        source: "local/t".into(),
        fault,
    };
    Checked::of(topo, &[sourced]).report(topo)
}

#[tokio::test]
async fn a_gpu_lost_to_a_fault_is_unhealthy_until_the_fault_is_cleared() {
    let node = Node::new();
    let mut kubelet = Kubelet::start(&node.plugin_dir());
    let topo = gb300("", "node-0");
    let mut plugin = start(node.config("nvidia.com/gpu"), topo.clone());
    let request = kubelet.registered_by(&mut plugin.task).await;
    let mut client = dial(&node.plugin_dir().join(&request.endpoint)).await;
    let mut stream = list_and_watch(&mut client).await;
    let healthy = |d: &[Device]| d.iter().filter(|d| d.health == "Healthy").count();
    assert_eq!(healthy(&next(&mut stream).await), 4);

    // Xid 79 on GPU 2: it has fallen off the bus, the kubelet's allocatable drops to 3.
    plugin.faults.send_replace(xid_on(&topo, 2, 79));
    let devices = next(&mut stream).await;
    assert_eq!(devices.len(), 4, "the lost GPU stays listed");
    assert_eq!(devices[2].health, "Unhealthy");
    assert_eq!(healthy(&devices), 3);
    assert!(metrics_text(&plugin.metrics).contains("mockgpu_device_plugin_healthy_gpus 3\n"));

    // Xid 13 (an application error) leaves GPU 2 healthy: back to 4.
    plugin.faults.send_replace(xid_on(&topo, 2, 13));
    assert_eq!(healthy(&next(&mut stream).await), 4);
    plugin.faults.send_replace(xid_on(&topo, 1, 48));
    let devices = next(&mut stream).await;
    assert_eq!(devices[1].health, "Unhealthy", "a double-bit error");
    // Cleared.
    plugin.faults.send_replace(FaultReport::default());
    assert_eq!(healthy(&next(&mut stream).await), 4);
    assert!(metrics_text(&plugin.metrics).contains("mockgpu_device_plugin_healthy_gpus 4\n"));
}

#[tokio::test]
async fn a_restarted_kubelet_gets_a_new_registration() {
    let node = Node::new();
    let mut kubelet = Kubelet::start(&node.plugin_dir());
    let mut plugin = start(node.config("nvidia.com/gpu"), gb300("", "node-0"));
    let first = kubelet.registered_by(&mut plugin.task).await;
    let socket = node.plugin_dir().join(&first.endpoint);

    // A kubelet restart: the old one stops, the plugins' sockets are deleted, kubelet.sock is
    // made anew.
    drop(kubelet);
    fs::remove_file(&socket).unwrap();
    let mut kubelet = Kubelet::start(&node.plugin_dir());
    let again = kubelet.registered_by(&mut plugin.task).await;
    assert_eq!(again, first);
    let mut stream = list_and_watch(&mut dial(&socket).await).await;
    assert_eq!(next(&mut stream).await.len(), 4);

    // Only kubelet.sock recreated (the plugin's socket left in place): registered again too.
    drop(kubelet);
    let mut kubelet = Kubelet::start(&node.plugin_dir());
    assert_eq!(kubelet.registered_by(&mut plugin.task).await, first);
    // The plugin counts a registration once the kubelet has answered it.
    let counted = async {
        while !metrics_text(&plugin.metrics)
            .contains("mockgpu_device_plugin_registrations_total 3\n")
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(WAIT, counted)
        .await
        .expect("three registrations counted");
}

#[tokio::test]
async fn a_successor_waits_for_the_first_plugin_to_stop() {
    let node = Node::new();
    let mut kubelet = Kubelet::start(&node.plugin_dir());
    let Plugin {
        task: mut first,
        _stop: stop_first,
        ..
    } = start(node.config("nvidia.com/gpu"), gb300("", "node-0"));
    let registered = kubelet.registered_by(&mut first).await;
    let socket = node.plugin_dir().join(&registered.endpoint);
    let before = fs::metadata(&socket).unwrap().ino();

    // A rollout: the next agent starts while the first one still serves. It neither registers
    // (the kubelet refuses a socket path that is connected) nor touches the first one's socket.
    let mut second = start(node.config("nvidia.com/gpu"), gb300("", "node-0"));
    let early = tokio::time::timeout(Duration::from_millis(400), kubelet.registered()).await;
    assert!(
        early.is_err(),
        "the successor registered while the first plugin served"
    );
    assert_eq!(fs::metadata(&socket).unwrap().ino(), before);

    // The first one stops (removing its socket and device nodes); the successor serves, makes
    // the nodes again and registers.
    drop(stop_first);
    ended(first).await.unwrap();
    // (the new socket may get the old one's inode number: the first one ended, and the
    // successor's socket answers below)
    assert_eq!(kubelet.registered_by(&mut second.task).await, registered);
    let dev = node.layout().dev_dir();
    let nodes_back = async {
        while !["nvidia0", "nvidia3", "nvidiactl"]
            .iter()
            .all(|n| dev.join(n).exists())
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(WAIT, nodes_back)
        .await
        .expect("the successor's device nodes");
    let mut stream = list_and_watch(&mut dial(&socket).await).await;
    assert_eq!(next(&mut stream).await.len(), 4);
}

#[tokio::test]
async fn stands_down_while_a_foreign_plugin_named_by_the_kubelets_checkpoint_serves() {
    let node = Node::new();
    let mut kubelet = Kubelet::start(&node.plugin_dir());
    // Another plugin, on a socket of its own, whose devices the checkpoint records under
    // nvidia.com/gpu (as after it registered nvidia.com/gpu).
    let other = gb300("", "other-node");
    let mut other_plugin = start(node.config("example.com/gpu"), other.clone());
    let other_socket = node
        .plugin_dir()
        .join(kubelet.registered_by(&mut other_plugin.task).await.endpoint);
    let ids: Vec<String> = other
        .gpus
        .iter()
        .map(|g| format!("\"{}\"", g.uuid))
        .collect();
    fs::write(
        node.plugin_dir().join(CHECKPOINT),
        format!(
            r#"{{"Data":{{"PodDeviceEntries":null,"RegisteredDevices":{{"nvidia.com/gpu":[{}]}}}},"Checksum":1}}"#,
            ids.join(",")
        ),
    )
    .unwrap();
    let mut config = node.config("nvidia.com/gpu");
    config.recheck_interval = Duration::from_millis(50);
    let mut ours = start(config, gb300("", "node-0"));
    let Standing::StoodDown(conflict) = ours
        .standing_when(|s| matches!(s, Standing::StoodDown(_)))
        .await
    else {
        unreachable!()
    };
    assert_eq!(
        conflict.to_string(),
        format!(
            "another device plugin serves nvidia.com/gpu on this node (socket {}, devices {})",
            other_socket.display(),
            other
                .gpus
                .iter()
                .map(|g| g.uuid.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    );
    let text = metrics_text(&ours.metrics);
    assert!(
        text.contains("mockgpu_device_plugin_stood_down 1\n"),
        "{text}"
    );
    // It checks again every 50 ms (each check sends its standing anew); three checks later it
    // still stands down, has not ended, serves no socket and has not registered.
    let own_socket = node
        .plugin_dir()
        .join(node.config("nvidia.com/gpu").endpoint());
    for _ in 0..3 {
        tokio::time::timeout(WAIT, ours.standing.changed())
            .await
            .expect("timed out waiting for the plugin to check again")
            .unwrap();
        assert!(matches!(*ours.standing.borrow(), Standing::StoodDown(_)));
    }
    assert!(
        !ours.task.is_finished(),
        "the plugin ended: {:?}",
        ours.task
    );
    assert!(!own_socket.exists(), "it serves {}", own_socket.display());
    assert!(kubelet.registrations.try_recv().is_err(), "it registered");

    // The other plugin stops: the checkpoint still lists its devices, but nothing serves them
    // (a stale checkpoint is no conflict), so this one serves and registers.
    drop(other_plugin);
    assert_eq!(
        kubelet.registered_by(&mut ours.task).await.resource_name,
        "nvidia.com/gpu"
    );
    assert_eq!(
        ours.standing_when(|s| *s == Standing::Serving).await,
        Standing::Serving
    );
    let text = metrics_text(&ours.metrics);
    assert!(
        text.contains("mockgpu_device_plugin_stood_down 0\n"),
        "{text}"
    );
    let mut stream = list_and_watch(&mut dial(&own_socket).await).await;
    assert_eq!(next(&mut stream).await.len(), 4);
}

/// Sends SIGTERM to the agent; kills it when dropped, so that a failed assertion leaves no
/// agent running.
struct Agent(std::process::Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Agent {
    /// Its exit status, once it has exited.
    async fn exited(&mut self) -> std::process::ExitStatus {
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[test]
fn serve_advertises_the_gpus_and_follows_profile_changes() {
    let node = Node::new();
    let root = node.root.path();
    let proc = root.join("proc");
    fs::create_dir_all(&proc).unwrap();
    fs::write(proc.join("devices"), common::HOST_DEVICES).unwrap();
    let profile = root.join("profile.yaml");
    fs::write(&profile, "base: gb300\n").unwrap();
    let log = root.join("agent.log");
    common::in_private_namespace(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut kubelet = Kubelet::start(&node.plugin_dir());
            let mut agent = Agent(
                std::process::Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
                    .arg("serve")
                    // never report to a cluster that a developer's kubeconfig names
                    .env("MOCKGPU_REPORT", "off")
                    // The agent mounts by itself: a keeper would outlive the test (tests/handover.rs covers it).
                    .env("MOCKGPU_KEEPER", "off")
                    .args(["--node-name", "node-0", "--reload-interval", "0.05"])
                    .arg("--profile-file")
                    .arg(&profile)
                    .arg("--dir")
                    .arg(node.layout().host_dir())
                    .arg("--sysfs")
                    .arg(common::fixture("two-socket"))
                    .arg("--procfs")
                    .arg(&proc)
                    .args(["--listen", "127.0.0.1:0", "--device-plugin"])
                    .arg("--kubelet-dir")
                    .arg(root.join("kubelet"))
                    .stderr(fs::File::create(&log).unwrap())
                    .spawn()
                    .unwrap(),
            );
            // An agent that ends first (its device plugin failed) shows why at once.
            let request = tokio::select! {
                request = kubelet.registered() => request,
                status = agent.exited() => panic!(
                    "the agent exited ({status}) before registering: {}",
                    fs::read_to_string(&log).unwrap_or_default()
                ),
            };
            assert_eq!(request.resource_name, "nvidia.com/gpu");
            let socket = node.plugin_dir().join(&request.endpoint);
            let mut client = dial(&socket).await;
            let mut stream = list_and_watch(&mut client).await;
            let first = next(&mut stream).await;
            assert_eq!(first.len(), 4);
            assert!(first.iter().all(|d| d.health == "Healthy"), "{first:?}");

            // The profile marks GPU 2 failed: the agent's reload reaches the kubelet's stream.
            fs::write(&profile, "base: gb300\nfailed_gpus: [2]\n").unwrap();
            let second = next(&mut stream).await;
            let mut want = health(&first);
            want[2].1 = "Unhealthy".into();
            assert_eq!(health(&second), want);

            let response = client
                .allocate(AllocateRequest {
                    container_requests: vec![ContainerAllocateRequest {
                        devices_ids: vec![first[1].id.clone()],
                    }],
                })
                .await
                .unwrap()
                .into_inner();
            let gpu = &response.container_responses[0].devices[0];
            assert_eq!(gpu.container_path, "/dev/nvidia1");
            let meta = fs::metadata(&gpu.host_path).unwrap();
            assert!(meta.file_type().is_char_device());
            assert_eq!(meta.rdev(), nix::sys::stat::makedev(195, 1));

            let pid = nix::unistd::Pid::from_raw(agent.0.id() as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
            let status = tokio::time::timeout(WAIT, agent.exited())
                .await
                .expect("the agent exits");
            assert!(status.success(), "{status}");
            assert!(!socket.exists(), "the agent removes its socket");
            assert!(
                !std::path::Path::new(&gpu.host_path).exists(),
                "the agent removes its device nodes"
            );
        });
    });
}
