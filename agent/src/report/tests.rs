//! The reporter's loop against a fake API server, on paused (virtual) time: tokio advances the
//! clock whenever every task waits, so heartbeats and retries take no real time.

use std::sync::{Arc, Mutex};

use mockgpu_api::gpunode::{GpuNodeSpec, condition};
use mockgpu_api::{NodeTopology, Profile};
use mockgpu_nri::PodRef;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::time::Instant;

use super::*;

/// The heartbeat period of the tests' reporter (serve's default).
const HEARTBEAT: Duration = Duration::from_secs(30);

/// The requests the fake answered (or failed), in order, with their times.
type Calls = UnboundedReceiver<(Instant, Result<Call, ApiError>)>;

/// One request the fake answered.
#[derive(Debug, Clone, PartialEq)]
enum Call {
    NodeUid,
    Get,
    Apply(Box<ObjectMeta>, Box<GpuNodeSpec>),
    ApplyStatus(GpuNodeStatus),
    /// An apply at a resourceVersion the object no longer has.
    Refused,
}

#[derive(Default)]
struct Server {
    /// The stored object.
    object: Option<GpuNode>,
    node_uid: String,
    /// Requests still to fail.
    failing: u32,
    /// Objects created so far (each gets a new uid).
    created: u32,
    /// Writes so far: the stored object's resourceVersion.
    writes: u32,
    /// A status another agent applies right after the next read.
    after_read: Option<GpuNodeStatus>,
}

impl Server {
    fn stored(&mut self, mut object: GpuNode) {
        self.writes += 1;
        object.metadata.resource_version = Some(self.writes.to_string());
        self.object = Some(object);
    }

    fn store_status(&mut self, status: &GpuNodeStatus) {
        if let Some(mut o) = self.object.take() {
            o.status = Some(status.clone());
            self.stored(o);
        }
    }
}

/// A fake API server: one GpuNode, one Node; every request is sent to the test as it comes.
#[derive(Clone)]
struct Fake {
    server: Arc<Mutex<Server>>,
    calls: UnboundedSender<(Instant, Result<Call, ApiError>)>,
}

impl Fake {
    fn new() -> (Fake, Calls) {
        let (calls, rx) = unbounded_channel();
        let server = Server {
            node_uid: "node-uid-1".into(),
            ..Default::default()
        };
        (
            Fake {
                server: Arc::new(Mutex::new(server)),
                calls,
            },
            rx,
        )
    }

    fn server(&self) -> std::sync::MutexGuard<'_, Server> {
        self.server.lock().unwrap()
    }

    /// Records `call`, or fails it while failures are due.
    fn answer<T>(&self, call: Call, ok: impl FnOnce(&mut Server) -> T) -> Result<T, ApiError> {
        let mut server = self.server();
        let result = if server.failing > 0 {
            server.failing -= 1;
            Err(ApiError("connection refused".into()))
        } else {
            Ok(ok(&mut server))
        };
        let record = result.as_ref().map(|_| call).map_err(Clone::clone);
        let _ = self.calls.send((Instant::now(), record));
        result
    }
}

impl GpuNodes for Fake {
    async fn node_uid(&self, _name: &str) -> Result<String, ApiError> {
        self.answer(Call::NodeUid, |s| s.node_uid.clone())
    }

    async fn get(&self, _name: &str) -> Result<Option<GpuNode>, ApiError> {
        self.answer(Call::Get, |s| {
            let read = s.object.clone();
            if let Some(status) = s.after_read.take() {
                s.store_status(&status);
            }
            read
        })
    }

    async fn apply(&self, object: &GpuNode) -> Result<String, ApiError> {
        self.answer(
            Call::Apply(
                Box::new(object.metadata.clone()),
                Box::new(object.spec.clone()),
            ),
            |s| {
                let status = s.object.as_ref().and_then(|o| o.status.clone());
                let uid = match &s.object {
                    Some(o) => o.metadata.uid.clone().unwrap(),
                    None => {
                        s.created += 1;
                        format!("gpunode-uid-{}", s.created)
                    }
                };
                let mut stored = object.clone();
                stored.metadata.uid = Some(uid.clone());
                stored.status = status;
                s.stored(stored);
                uid
            },
        )
    }

    async fn apply_status(
        &self,
        _name: &str,
        status: &GpuNodeStatus,
        resource_version: Option<&str>,
    ) -> Result<bool, ApiError> {
        let current = self.server().writes.to_string();
        if resource_version.is_some_and(|v| v != current) {
            return self.answer(Call::Refused, |_| false);
        }
        self.answer(Call::ApplyStatus(status.clone()), |s| {
            s.store_status(status);
            true
        })
    }
}

fn topology(profile: &str) -> NodeTopology {
    let sysfs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/two-socket");
    let host = crate::host::SysfsHost::new(sysfs).probe().unwrap();
    NodeTopology::build(&Profile::builtin(profile).unwrap(), "node-a", &host).unwrap()
}

fn config() -> Config {
    Config {
        node_name: "node-a".into(),
        heartbeat: HEARTBEAT,
        credentials: Credentials::Infer,
    }
}

/// A running reporter and its inputs.
struct Running {
    fake: Fake,
    calls: Calls,
    served: watch::Sender<Option<NodeTopology>>,
    pinning: UnboundedSender<PinningEvent>,
    standing: watch::Sender<Standing>,
    faults: watch::Sender<FaultReport>,
    claims: watch::Sender<Vec<PreparedClaim>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

fn start_with(fake: Fake, calls: Calls, served: Option<NodeTopology>) -> Running {
    let (served_tx, served_rx) = watch::channel(served);
    let (pin_tx, pin_rx) = unbounded_channel();
    let (standing_tx, standing_rx) = watch::channel(Standing::Starting);
    let (faults_tx, faults_rx) = watch::channel(FaultReport::default());
    let (claims_tx, claims_rx) = watch::channel(Vec::new());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let api = fake.clone();
    let task = tokio::spawn(async move {
        let stop = async move {
            let _ = stop_rx.await;
        };
        run(
            api,
            &config(),
            served_rx,
            (Some(pin_rx), Some(faults_rx), Some(claims_rx)),
            Some(standing_rx),
            stop,
        )
        .await;
    });
    Running {
        fake,
        calls,
        served: served_tx,
        pinning: pin_tx,
        standing: standing_tx,
        faults: faults_tx,
        claims: claims_tx,
        stop: Some(stop_tx),
        task,
    }
}

fn start(served: Option<NodeTopology>) -> Running {
    let (fake, calls) = Fake::new();
    start_with(fake, calls, served)
}

impl Running {
    async fn next(&mut self) -> (Instant, Result<Call, ApiError>) {
        self.calls.recv().await.expect("the reporter runs")
    }

    /// The next status applied (skipping the other requests), and when.
    async fn next_status(&mut self) -> (Instant, GpuNodeStatus) {
        loop {
            if let (t, Ok(Call::ApplyStatus(s))) = self.next().await {
                return (t, s);
            }
        }
    }

    async fn stop(mut self) -> Vec<Call> {
        self.stop.take().unwrap().send(()).unwrap();
        self.task.await.unwrap();
        let mut rest = Vec::new();
        while let Ok((_, call)) = self.calls.try_recv() {
            rest.push(call.unwrap());
        }
        rest
    }
}

fn ready(s: &GpuNodeStatus) -> (&str, &str) {
    let c = s
        .conditions
        .iter()
        .find(|c| c.type_ == condition::READY)
        .unwrap();
    (c.status.as_str(), c.reason.as_str())
}

fn pinned(id: &str, uuids: &[String]) -> PinningEvent {
    let uuids: Vec<&str> = uuids.iter().map(String::as_str).collect();
    super::status::tests::pinned(id, &format!("pod-{id}"), &uuids)
}

#[tokio::test(start_paused = true)]
async fn applies_the_gpunode_owned_by_its_node_then_beats() {
    let topo = topology("gb300");
    let mut r = start(Some(topo.clone()));
    let t0 = Instant::now();
    assert_eq!(r.next().await.1, Ok(Call::NodeUid));
    assert_eq!(r.next().await.1, Ok(Call::Get));
    let Ok(Call::Apply(metadata, spec)) = r.next().await.1 else {
        panic!("apply expected");
    };
    assert_eq!(metadata.name.as_deref(), Some("node-a"));
    assert_eq!(*spec, GpuNodeSpec::mock(&topo));
    let owner = &metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str()
        ),
        ("v1", "Node", "node-a", "node-uid-1")
    );
    let (t1, first) = r.next_status().await;
    assert_eq!(t1, t0, "the first report is immediate");
    assert_eq!(ready(&first), ("True", "TreeMounted"));
    assert_eq!(first.held_gpus, 0);
    assert_eq!(
        first.agent_version.as_deref(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    assert!(first.topology_since.is_some() && first.last_heartbeat.is_some());
    // the heartbeat: 30 s give or take 3, the object read only once
    let mut at = t1;
    for _ in 0..3 {
        assert!(matches!(r.next().await.1, Ok(Call::Apply(..))));
        let (t, beat) = r.next_status().await;
        let gap = t - at;
        assert!(
            gap >= Duration::from_secs(27) && gap < Duration::from_secs(33),
            "{gap:?}"
        );
        assert_eq!(beat.topology_since, first.topology_since);
        at = t;
    }
    // stopping reports Ready False, in the status alone
    let rest = r.stop().await;
    let Some(Call::ApplyStatus(last)) = rest.last() else {
        panic!("no last status in {rest:?}");
    };
    assert_eq!(ready(last), ("False", "AgentStopped"));
    assert!(
        !rest.iter().any(|c| matches!(c, Call::Apply(..))),
        "{rest:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stopping_agent_leaves_a_successors_report_alone() {
    let mut r = start(Some(topology("gb300")));
    let (_, first) = r.next_status().await;
    let mine = first.agent_instance.clone().expect("an agentInstance");
    // a rollout's successor, with another profile, has reported since
    let fake = r.fake.clone();
    let successor = {
        let mut s = fake.server();
        let object = s.object.as_mut().unwrap();
        object.spec.topology_hash = "successor-hash".into();
        object.status.as_mut().unwrap().agent_instance = Some("successor".into());
        object.clone()
    };
    let rest = r.stop().await;
    assert_eq!(rest, [Call::Get], "only the read, no last report");
    let stored = fake.server().object.clone().unwrap();
    assert_eq!(
        (&stored.spec, &stored.status),
        (&successor.spec, &successor.status)
    );
    // each start has an instance of its own
    let mut again = start(Some(topology("gb300")));
    let (_, s) = again.next_status().await;
    assert_ne!(s.agent_instance, Some(mine));
    again.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_successor_reporting_between_the_read_and_the_write_is_kept() {
    let mut r = start(Some(topology("gb300")));
    r.next_status().await;
    let mut successor = r.fake.server().object.clone().unwrap().status.unwrap();
    successor.agent_instance = Some("successor".into());
    r.fake.server().after_read = Some(successor.clone());
    let fake = r.fake.clone();
    let rest = r.stop().await;
    assert_eq!(rest, [Call::Get, Call::Refused]);
    let stored = fake.server().object.clone().unwrap();
    assert_eq!(stored.status, Some(successor));
}

#[tokio::test(start_paused = true)]
async fn errors_back_off_doubling_and_read_again() {
    let (fake, calls) = Fake::new();
    fake.server().failing = 4;
    let mut r = start_with(fake, calls, Some(topology("gb300")));
    let mut times = Vec::new();
    for _ in 0..4 {
        let (t, call) = r.next().await;
        assert!(call.is_err());
        times.push(t);
    }
    let gaps: Vec<u64> = times.windows(2).map(|w| (w[1] - w[0]).as_secs()).collect();
    assert_eq!(gaps, [1, 2, 4]);
    // the fifth try, 8 s later, starts from the Node and the object again, and succeeds
    let (t, call) = r.next().await;
    assert_eq!((t - times[3]).as_secs(), 8);
    assert_eq!(call, Ok(Call::NodeUid));
    assert_eq!(r.next().await.1, Ok(Call::Get));
    let (_, s) = r.next_status().await;
    assert_eq!(ready(&s), ("True", "TreeMounted"));
    // after a success the heartbeat is back to 30 s
    r.fake.server().failing = 1;
    let (t1, _) = r.next().await;
    let (t2, _) = r.next().await;
    assert_eq!((t2 - t1).as_secs(), 1, "the backoff starts again at 1 s");
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_deleted_gpunode_comes_back_on_the_next_beat() {
    let mut r = start(Some(topology("gb300")));
    let (_, first) = r.next_status().await;
    r.fake.server().object = None;
    let Ok(Call::Apply(_, again)) = r.next().await.1 else {
        panic!("apply expected");
    };
    assert_eq!(again.gpu_count, 4);
    // recreated: the Node's uid is checked again
    assert_eq!(r.next().await.1, Ok(Call::NodeUid));
    let (_, s) = r.next_status().await;
    assert_eq!(s.topology_since, first.topology_since);
    assert_eq!(r.fake.server().created, 2);
    assert!(r.fake.server().object.as_ref().unwrap().status.is_some());
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_node_registered_again_is_owned_anew() {
    let mut r = start(Some(topology("gb300")));
    r.next_status().await;
    {
        let mut s = r.fake.server();
        s.object = None;
        s.node_uid = "node-uid-2".into();
    }
    let mut owners = Vec::new();
    loop {
        match r.next().await.1 {
            Ok(Call::Apply(m, _)) => owners.push(m.owner_references.unwrap()[0].uid.clone()),
            Ok(Call::ApplyStatus(_)) => break,
            _ => {}
        }
    }
    assert_eq!(owners, ["node-uid-1", "node-uid-2"]);
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn faults_are_reported_within_the_debounce() {
    use crate::faults::{Checked, Sourced};
    use mockgpu_api::{Fault, FaultKind};
    let topo = topology("gb300");
    let mut r = start(Some(topo.clone()));
    let (_, s) = r.next_status().await;
    assert_eq!((s.faults.len(), s.unhealthy_gpus), (0, 0));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let t0 = Instant::now();
    let candidates = [
        Sourced {
            source: "local/lost".into(),
            fault: Fault::xid(1, 79),
        },
        Sourced {
            source: "GpuFault/hot".into(),
            fault: Fault::new(2, FaultKind::Thermal),
        },
    ];
    r.faults
        .send_replace(Checked::of(&topo, &candidates).report(&topo));
    let (t, s) = r.next_status().await;
    assert_eq!(t - t0, DEBOUNCE, "not only at the next heartbeat");
    assert_eq!(s.unhealthy_gpus, 1, "thermal slowdown leaves GPU 2 healthy");
    let sources: Vec<&str> = s.faults.iter().map(|f| f.source.as_str()).collect();
    assert_eq!(sources, ["local/lost", "GpuFault/hot"]);
    assert_eq!(s.faults[0].uuid, topo.gpus[1].uuid);
    assert_eq!((s.faults[0].gpu, s.faults[0].xid), (1, Some(79)));
    assert_eq!(s.faults[1].message, "GPU 2: thermal slowdown");
    // cleared
    r.faults.send_replace(FaultReport::default());
    let (_, s) = r.next_status().await;
    assert_eq!((s.faults.len(), s.unhealthy_gpus), (0, 0));
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn prepared_claims_are_reported_within_the_debounce() {
    let topo = topology("gb300");
    let mut r = start(Some(topo.clone()));
    let (_, s) = r.next_status().await;
    assert!(s.claims.is_empty());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let t0 = Instant::now();
    let claim = PreparedClaim {
        namespace: "ns".into(),
        name: "two".into(),
        uid: "u-1".into(),
        driver: "gpu.nvidia.com".into(),
        devices: vec!["gpu-0".into(), "gpu-2".into()],
        gpus: vec![topo.gpus[0].uuid.clone(), topo.gpus[2].uuid.clone()],
        domain: None,
        channels: None,
    };
    r.claims.send_replace(vec![claim.clone()]);
    let (t, s) = r.next_status().await;
    assert_eq!(t - t0, DEBOUNCE, "not only at the next heartbeat");
    assert_eq!(s.claims, [claim]);
    // unprepared
    r.claims.send_replace(Vec::new());
    let (_, s) = r.next_status().await;
    assert!(s.claims.is_empty());
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_pinning_change_is_reported_within_the_debounce() {
    let topo = topology("gb300");
    let uuids: Vec<String> = topo.gpus.iter().map(|g| g.uuid.clone()).collect();
    let mut r = start(Some(topo));
    r.next_status().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let t0 = Instant::now();
    r.pinning.send(pinned("a", &uuids[0..2])).unwrap();
    r.pinning.send(pinned("b", &uuids[1..3])).unwrap();
    let (t, s) = r.next_status().await;
    assert_eq!(
        t - t0,
        DEBOUNCE,
        "both events in one report, half a second later"
    );
    assert_eq!(s.held_gpus, 3);
    assert_eq!(s.pinning.len(), 2);
    assert_eq!(s.pinning[0].gpus, uuids[0..2]);
    r.pinning
        .send(PinningEvent::Unpinned {
            pod: PodRef {
                namespace: "jobs".into(),
                name: "pod-a".into(),
                uid: "uid-a".into(),
            },
            container_name: "c".into(),
            container_id: "a".into(),
        })
        .unwrap();
    let (_, s) = r.next_status().await;
    assert_eq!((s.held_gpus, s.pinning.len()), (2, 1));
    // a replay of what is pinned changes nothing, so nothing is reported before the heartbeat
    let t1 = Instant::now();
    r.pinning.send(pinned("b", &uuids[1..3])).unwrap();
    let (t, _) = r.next_status().await;
    assert!(t - t1 >= Duration::from_secs(20), "{:?}", t - t1);
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_device_plugin_standing_down_is_reported_within_the_debounce() {
    let mut r = start(Some(topology("gb300")));
    let (_, first) = r.next_status().await;
    assert_eq!(first.conditions.len(), 1, "nothing while the plugin starts");
    let conflict = |s: &GpuNodeStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == condition::DEVICE_PLUGIN_CONFLICT)
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    let t0 = Instant::now();
    r.standing
        .send_replace(Standing::StoodDown(crate::device_plugin::Conflict {
            resource: "nvidia.com/gpu".into(),
            socket: "/k/device-plugins/nvidia-gpu.sock".into(),
            ids: vec!["GPU-x".into()],
        }));
    let (t, s) = r.next_status().await;
    assert_eq!(t - t0, DEBOUNCE);
    assert_eq!(
        conflict(&s),
        Some(("True".into(), "AnotherPluginServes".into()))
    );
    assert_eq!(
        ready(&s),
        ("True", "TreeMounted"),
        "the tree is still served"
    );
    r.standing.send_replace(Standing::Serving);
    let (_, s) = r.next_status().await;
    assert_eq!(conflict(&s), Some(("False".into(), "Serving".into())));
    // the last report keeps it
    let rest = r.stop().await;
    let Some(Call::ApplyStatus(last)) = rest.last() else {
        panic!("no last status in {rest:?}");
    };
    assert_eq!(conflict(last), Some(("False".into(), "Serving".into())));
}

#[tokio::test(start_paused = true)]
async fn a_topology_change_moves_topology_since() {
    let mut r = start(Some(topology("gb300")));
    let (_, first) = r.next_status().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    r.served.send_replace(Some(topology("h100")));
    let Ok(Call::Apply(_, spec)) = r.next().await.1 else {
        panic!("apply expected");
    };
    assert_eq!(spec.gpu_count, 8);
    let (_, s) = r.next_status().await;
    assert_ne!(s.topology_since, first.topology_since);
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_existing_objects_topology_since_is_kept() {
    let topo = topology("gb300");
    let (fake, calls) = Fake::new();
    let since = Time(Timestamp::from_second(1_600_000_000).unwrap());
    let mut existing = gpunode(GpuNodeSpec::mock(&topo), "node-uid-1");
    existing.metadata.uid = Some("gpunode-uid-0".into());
    existing.status = Some(GpuNodeStatus {
        topology_since: Some(since.clone()),
        ..Default::default()
    });
    fake.server().object = Some(existing.clone());
    let mut r = start_with(fake, calls, Some(topo));
    let (_, s) = r.next_status().await;
    assert_eq!(s.topology_since, Some(since));
    // an object with another topology: now
    r.stop().await;
    let (fake, calls) = Fake::new();
    existing.spec.topology_hash = "other".into();
    fake.server().object = Some(existing);
    let mut r = start_with(fake, calls, Some(topology("gb300")));
    let (_, s) = r.next_status().await;
    assert_ne!(s.topology_since.unwrap().0.as_second(), 1_600_000_000);
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn nothing_is_reported_before_the_gpus_are_served() {
    let mut r = start(None);
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(r.calls.try_recv().is_err(), "a request before the topology");
    let t0 = Instant::now();
    r.served.send_replace(Some(topology("gb300")));
    let (t, _) = r.next_status().await;
    assert!(t - t0 <= DEBOUNCE);
    // a stopping agent that has reported says it is not Ready; one that never did, nothing
    let rest = r.stop().await;
    assert!(
        rest.iter()
            .any(|c| matches!(c, Call::ApplyStatus(s) if ready(s).1 == "AgentStopped"))
    );
    let r = start(None);
    assert!(r.stop().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn real_gpus_are_reported_as_real() {
    let (fake, mut calls) = Fake::new();
    let (_tx, rx) = watch::channel(Some(RealGpus(Vec::new())));
    drop(_tx);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        run(fake, &config(), rx, (None, None, None), None, async move {
            let _ = stop_rx.await;
        })
        .await;
    });
    let status = loop {
        if let Ok(Call::ApplyStatus(s)) = calls.recv().await.unwrap().1 {
            break s;
        }
    };
    assert_eq!(ready(&status), ("False", "DriverUnreadable"));
    // a closed topology channel and no pinning do not stop the heartbeat
    let t0 = Instant::now();
    loop {
        if let Ok(Call::ApplyStatus(_)) = calls.recv().await.unwrap().1 {
            break;
        }
    }
    assert!(Instant::now() - t0 >= Duration::from_secs(27));
    stop_tx.send(()).unwrap();
    task.await.unwrap();
}
