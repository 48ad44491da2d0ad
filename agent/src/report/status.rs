//! What the agent reports, as pure functions of what it knows: the pinning map, the status
//! built from it, the `topologySince` rule, and the heartbeat's and the retries' timing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use mockgpu_api::gpunode::{GpuNodeGpu, GpuNodeSpec, GpuNodeStatus, Mode, Pinning, condition};
use mockgpu_api::{DriverGpu, NodeTopology};
use mockgpu_nri::PinningEvent;

use crate::device_plugin::Standing;
use crate::faults::FaultReport;

/// The profile name reported in real mode.
pub(crate) const REAL_PROFILE: &str = "real";
/// The first retry's delay after an API error.
pub(crate) const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// The longest delay between retries.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// How far a heartbeat may stray from its period, either way (a tenth).
pub(crate) const JITTER: f64 = 0.1;

/// What the node serves, as the reporter needs it: mock GPUs (a [`NodeTopology`]) or a real
/// driver's ([`RealGpus`]).
pub trait Served: Clone + Send + Sync + 'static {
    /// The GpuNode's spec for `node_name`.
    fn spec(&self, node_name: &str) -> GpuNodeSpec;
    /// The `Ready` condition's status, reason and message.
    fn readiness(&self) -> Readiness;
}

/// The agent's `Ready` condition, before it has times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// Whether the GPUs are served (mock) or reported (real).
    pub ready: bool,
    /// A CamelCase reason.
    pub reason: &'static str,
    /// What it means, in words.
    pub message: String,
}

impl Served for NodeTopology {
    fn spec(&self, _node_name: &str) -> GpuNodeSpec {
        GpuNodeSpec::mock(self)
    }

    /// A topology is only published once its tree is mounted.
    fn readiness(&self) -> Readiness {
        Readiness {
            ready: true,
            reason: "TreeMounted",
            message: format!(
                "the mock driver tree of {} {} GPUs is mounted",
                self.gpus.len(),
                self.profile.name
            ),
        }
    }
}

/// The GPUs of a loaded NVIDIA driver (real mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RealGpus(pub Vec<DriverGpu>);

impl Served for RealGpus {
    fn spec(&self, node_name: &str) -> GpuNodeSpec {
        let gpus = self
            .0
            .iter()
            .map(|g| GpuNodeGpu::new(&g.gpu, &g.information.model, None))
            .collect();
        GpuNodeSpec::new(node_name, Mode::Real, REAL_PROFILE, gpus)
    }

    fn readiness(&self) -> Readiness {
        if self.0.is_empty() {
            Readiness {
                ready: false,
                reason: "DriverUnreadable",
                message: "a real NVIDIA driver is loaded but its files list no readable GPU".into(),
            }
        } else {
            Readiness {
                ready: true,
                reason: "RealGpusReported",
                message: format!("the NVIDIA driver's {} GPUs are reported", self.0.len()),
            }
        }
    }
}

/// The `Ready` condition of a stopping agent.
pub fn stopped() -> Readiness {
    Readiness {
        ready: false,
        reason: "AgentStopped",
        message: "the agent stopped".into(),
    }
}

/// The containers holding GPUs, by runtime container id, as the NRI plugin's events say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PinningMap {
    by_container: BTreeMap<String, Pinning>,
}

impl PinningMap {
    /// Applies `event` (at `now`); whether the map changed. A container pinned again to the
    /// same GPUs (Synchronize replays every pinned container) keeps its `since`.
    pub(crate) fn apply(&mut self, event: &PinningEvent, now: &Time) -> bool {
        match event {
            PinningEvent::Pinned {
                pod,
                container_name,
                container_id,
                gpus,
            } => {
                let pinning = Pinning {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    pod_uid: pod.uid.clone(),
                    container: container_name.clone(),
                    gpus: gpus.iter().map(|g| g.uuid.clone()).collect(),
                    since: now.clone(),
                };
                match self.by_container.get(container_id) {
                    Some(old)
                        if Pinning {
                            since: old.since.clone(),
                            ..pinning.clone()
                        } == *old =>
                    {
                        false
                    }
                    _ => {
                        self.by_container.insert(container_id.clone(), pinning);
                        true
                    }
                }
            }
            PinningEvent::Unpinned { container_id, .. } => {
                self.by_container.remove(container_id).is_some()
            }
        }
    }

    /// The pinned containers, ordered by namespace, pod and container.
    pub(crate) fn pinning(&self) -> Vec<Pinning> {
        let mut all: Vec<Pinning> = self.by_container.values().cloned().collect();
        all.sort_by(|a, b| {
            (&a.namespace, &a.pod, &a.container).cmp(&(&b.namespace, &b.pod, &b.container))
        });
        all
    }

    /// The GPUs held: distinct UUIDs (a GPU shared by two containers counts once).
    pub fn held(&self) -> u32 {
        let distinct: BTreeSet<&str> = self
            .by_container
            .values()
            .flat_map(|p| p.gpus.iter().map(String::as_str))
            .collect();
        u32::try_from(distinct.len()).unwrap_or(u32::MAX)
    }
}

/// What the reporter last reported (or read back from the object): the base of the next status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Previous {
    /// The reported `spec.topologyHash`.
    pub topology_hash: Option<String>,
    /// Its `status.topologySince`.
    pub topology_since: Option<Time>,
    /// The `Ready` condition.
    pub ready: Option<Condition>,
    /// The `DevicePluginConflict` condition.
    pub device_plugin: Option<Condition>,
}

impl Previous {
    /// What an existing GpuNode says (its spec's hash, its status' time and the agent's
    /// conditions).
    pub fn of(spec: &GpuNodeSpec, status: Option<&GpuNodeStatus>) -> Previous {
        let conditions = status.map_or(&[][..], |s| &s.conditions);
        Previous {
            topology_hash: Some(spec.topology_hash.clone()),
            topology_since: status.and_then(|s| s.topology_since.clone()),
            ready: find(conditions, condition::READY),
            device_plugin: find(conditions, condition::DEVICE_PLUGIN_CONFLICT),
        }
    }
}

/// The condition of type `type_` in `conditions`.
fn find(conditions: &[Condition], type_: &str) -> Option<Condition> {
    conditions.iter().find(|c| c.type_ == type_).cloned()
}

/// When the agent first reported `hash`: the previous `since` while the hash is the same,
/// else `now`.
pub(crate) fn topology_since(previous: &Previous, hash: &str, now: &Time) -> Time {
    match (&previous.topology_hash, &previous.topology_since) {
        (Some(h), Some(since)) if h == hash => since.clone(),
        _ => now.clone(),
    }
}

/// A condition of type `type_` whose transition time moves only when its status changes.
fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    previous: Option<&Condition>,
    now: &Time,
) -> Condition {
    let status = if status { "True" } else { "False" };
    let last_transition_time = match previous {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => now.clone(),
    };
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time,
        observed_generation: None,
    }
}

/// The `Ready` condition.
pub(crate) fn ready_condition(
    readiness: &Readiness,
    previous: Option<&Condition>,
    now: &Time,
) -> Condition {
    condition(
        condition::READY,
        readiness.ready,
        readiness.reason,
        readiness.message.clone(),
        previous,
        now,
    )
}

/// The `DevicePluginConflict` condition: True while the device plugin stands down for another
/// plugin, False while it serves; the previous one while it starts.
pub(crate) fn device_plugin_condition(
    standing: &Standing,
    previous: Option<&Condition>,
    now: &Time,
) -> Option<Condition> {
    let (conflict, reason, message) = match standing {
        Standing::Starting => return previous.cloned(),
        Standing::Serving => (
            false,
            "Serving",
            "no other device plugin serves the GPUs: the agent's does".to_string(),
        ),
        Standing::StoodDown(other) => (
            true,
            "AnotherPluginServes",
            format!("{other}: the agent's device plugin stands down"),
        ),
    };
    Some(condition(
        condition::DEVICE_PLUGIN_CONFLICT,
        conflict,
        reason,
        message,
        previous,
        now,
    ))
}

/// The agent's part of the status of a node whose spec hash is `hash` (the reporter adds its
/// `agentInstance`); `standing` is the device plugin's, when it runs.
pub fn status(
    hash: &str,
    readiness: &Readiness,
    standing: Option<&Standing>,
    pinning: &PinningMap,
    previous: &Previous,
    version: &str,
    now: &Time,
) -> GpuNodeStatus {
    let ready = ready_condition(readiness, previous.ready.as_ref(), now);
    let device_plugin =
        standing.and_then(|s| device_plugin_condition(s, previous.device_plugin.as_ref(), now));
    GpuNodeStatus {
        agent_version: Some(version.to_string()),
        agent_instance: None,
        last_heartbeat: Some(now.clone()),
        topology_since: Some(topology_since(previous, hash, now)),
        held_gpus: pinning.held(),
        pinning: pinning.pinning(),
        conditions: std::iter::once(ready).chain(device_plugin).collect(),
        // filled in by `with_faults`
        faults: Vec::new(),
        unhealthy_gpus: 0,
        // filled in by the reporter
        claims: Vec::new(),
    }
}

/// Puts the GPU faults applied into `status`: one entry per fault, and the GPUs they leave
/// unhealthy.
pub fn with_faults(status: &mut GpuNodeStatus, faults: &FaultReport) {
    status.faults = faults.status.clone();
    status.unhealthy_gpus = faults.unhealthy_gpus();
}

/// The previous state after reporting `status` for `hash`.
pub(crate) fn reported(hash: &str, status: &GpuNodeStatus) -> Previous {
    Previous {
        topology_hash: Some(hash.to_string()),
        topology_since: status.topology_since.clone(),
        ready: find(&status.conditions, condition::READY),
        device_plugin: find(&status.conditions, condition::DEVICE_PLUGIN_CONFLICT),
    }
}

/// `period` moved by up to [`JITTER`] either way: `unit` in `[0, 1)` maps onto
/// `[0.9, 1.1) × period`, so that agents started together do not beat together.
pub fn jittered(period: Duration, unit: f64) -> Duration {
    let unit = unit.clamp(0.0, 1.0);
    period.mul_f64(1.0 - JITTER + 2.0 * JITTER * unit)
}

/// The delay before retry number `failures` (1 after the first error): doubling from
/// [`BACKOFF_MIN`], at most [`BACKOFF_MAX`].
pub(crate) fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    BACKOFF_MIN.saturating_mul(1 << doublings).min(BACKOFF_MAX)
}

#[cfg(test)]
pub(super) mod tests {
    use k8s_openapi::jiff::Timestamp;
    use mockgpu_nri::{GpuRef, PodRef};

    use super::*;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(1_700_000_000 + secs).unwrap())
    }

    /// Container `id` of pod `pod` (namespace `jobs`) holding `uuids`.
    pub(crate) fn pinned(id: &str, pod: &str, uuids: &[&str]) -> PinningEvent {
        PinningEvent::Pinned {
            pod: PodRef {
                namespace: "jobs".into(),
                name: pod.into(),
                uid: format!("uid-{pod}"),
            },
            container_name: "c".into(),
            container_id: id.into(),
            gpus: uuids
                .iter()
                .enumerate()
                .map(|(i, u)| GpuRef {
                    minor: i as u32,
                    uuid: u.to_string(),
                })
                .collect(),
        }
    }

    fn unpinned(id: &str) -> PinningEvent {
        PinningEvent::Unpinned {
            pod: PodRef {
                namespace: "jobs".into(),
                name: "p".into(),
                uid: "u".into(),
            },
            container_name: "c".into(),
            container_id: id.into(),
        }
    }

    #[test]
    fn the_pinning_map_follows_pins_and_unpins() {
        let mut m = PinningMap::default();
        assert!(m.apply(&pinned("c2", "b", &["GPU-2", "GPU-3"]), &at(0)));
        assert!(m.apply(&pinned("c1", "a", &["GPU-0"]), &at(1)));
        assert_eq!(m.held(), 3);
        let pods: Vec<_> = m.pinning().iter().map(|p| p.pod.clone()).collect();
        assert_eq!(pods, ["a", "b"]);
        assert_eq!(m.pinning()[1].gpus, ["GPU-2", "GPU-3"]);
        assert_eq!(m.pinning()[1].pod_uid, "uid-b");
        // Synchronize replays what is pinned: nothing changes, `since` is kept
        assert!(!m.apply(&pinned("c2", "b", &["GPU-2", "GPU-3"]), &at(50)));
        assert_eq!(m.pinning()[1].since, at(0));
        assert!(m.apply(&unpinned("c2"), &at(60)));
        assert!(!m.apply(&unpinned("c2"), &at(61)));
        assert_eq!(m.held(), 1);
        assert!(!m.apply(&unpinned("never-seen"), &at(62)));
    }

    #[test]
    fn held_counts_distinct_gpus() {
        let mut m = PinningMap::default();
        m.apply(&pinned("c1", "a", &["GPU-0", "GPU-1"]), &at(0));
        m.apply(&pinned("c2", "b", &["GPU-1"]), &at(0));
        assert_eq!(m.held(), 2);
        assert_eq!(m.pinning().len(), 2);
        // other GPUs for the same container: replaced, with a new `since`
        assert!(m.apply(&pinned("c1", "a", &["GPU-3"]), &at(9)));
        assert_eq!(m.held(), 2);
        assert_eq!(m.pinning()[0].since, at(9));
    }

    #[test]
    fn topology_since_moves_only_with_the_hash() {
        let none = Previous::default();
        let same = Previous {
            topology_hash: Some("h1".into()),
            topology_since: Some(at(5)),
            ..Previous::default()
        };
        let no_since = Previous {
            topology_since: None,
            ..same.clone()
        };
        for (previous, hash, want) in [
            (&none, "h1", at(100)),
            (&same, "h1", at(5)),
            (&same, "h2", at(100)),
            (&no_since, "h1", at(100)),
        ] {
            assert_eq!(
                topology_since(previous, hash, &at(100)),
                want,
                "{previous:?} {hash}"
            );
        }
    }

    #[test]
    fn ready_keeps_its_transition_time_while_its_status_holds() {
        let up = Readiness {
            ready: true,
            reason: "TreeMounted",
            message: "m".into(),
        };
        let first = ready_condition(&up, None, &at(0));
        assert_eq!(
            (first.status.as_str(), first.reason.as_str()),
            ("True", "TreeMounted")
        );
        assert_eq!(first.last_transition_time, at(0));
        let again = ready_condition(&up, Some(&first), &at(30));
        assert_eq!(again.last_transition_time, at(0));
        let down = ready_condition(&stopped(), Some(&again), &at(40));
        assert_eq!(
            (down.status.as_str(), down.last_transition_time),
            ("False", at(40))
        );
    }

    #[test]
    fn the_status_gathers_pinning_heartbeat_and_ready() {
        let mut m = PinningMap::default();
        m.apply(&pinned("c1", "a", &["GPU-0", "GPU-1"]), &at(0));
        let readiness = RealGpus(Vec::new()).readiness();
        let s = status(
            "h",
            &readiness,
            None,
            &m,
            &Previous::default(),
            "0.1.0",
            &at(7),
        );
        assert_eq!(s.held_gpus, 2);
        assert_eq!(s.pinning.len(), 1);
        assert_eq!(s.last_heartbeat, Some(at(7)));
        assert_eq!(s.topology_since, Some(at(7)));
        assert_eq!(s.agent_version.as_deref(), Some("0.1.0"));
        assert_eq!(s.conditions.len(), 1);
        assert_eq!(
            (
                s.conditions[0].status.as_str(),
                s.conditions[0].reason.as_str()
            ),
            ("False", "DriverUnreadable")
        );
        let next = status(
            "h",
            &readiness,
            None,
            &m,
            &reported("h", &s),
            "0.1.0",
            &at(37),
        );
        assert_eq!(next.topology_since, Some(at(7)));
        assert_eq!(next.last_heartbeat, Some(at(37)));
        assert_eq!(next.conditions[0].last_transition_time, at(7));
    }

    #[test]
    fn the_device_plugins_condition_follows_its_standing() {
        let other = crate::device_plugin::Conflict {
            resource: "nvidia.com/gpu".into(),
            socket: "/var/lib/kubelet/device-plugins/nvidia-gpu.sock".into(),
            ids: vec!["GPU-x".into()],
        };
        let m = PinningMap::default();
        let up = RealGpus(Vec::new()).readiness();
        let report = |standing: Option<&Standing>, previous: &Previous, t: i64| {
            status("h", &up, standing, &m, previous, "0.1.0", &at(t))
        };
        let conflict = |s: &GpuNodeStatus| {
            s.conditions
                .iter()
                .find(|c| c.type_ == condition::DEVICE_PLUGIN_CONFLICT)
                .map(|c| {
                    (
                        c.status.clone(),
                        c.reason.clone(),
                        c.last_transition_time.clone(),
                    )
                })
        };
        // without a device plugin, and while it starts with nothing reported before: none
        assert_eq!(conflict(&report(None, &Previous::default(), 0)), None);
        let starting = report(Some(&Standing::Starting), &Previous::default(), 0);
        assert_eq!(starting.conditions.len(), 1);
        assert_eq!(conflict(&starting), None);
        // stood down: True, and the message names the other plugin
        let down = report(Some(&Standing::StoodDown(other)), &Previous::default(), 1);
        assert_eq!(
            conflict(&down),
            Some(("True".into(), "AnotherPluginServes".into(), at(1)))
        );
        let message = &down.conditions[1].message;
        assert!(
            message.contains("another device plugin serves nvidia.com/gpu on this node (socket /var/lib/kubelet/device-plugins/nvidia-gpu.sock, devices GPU-x)"),
            "{message}"
        );
        // a restarted agent, starting, keeps what the object says
        let previous = Previous::of(
            &GpuNodeSpec::new("n", Mode::Mock, "gb300", Vec::new()),
            Some(&down),
        );
        assert_eq!(
            conflict(&report(Some(&Standing::Starting), &previous, 2)),
            Some(("True".into(), "AnotherPluginServes".into(), at(1)))
        );
        // the other plugin gone: False, with a new transition time
        let serving = report(Some(&Standing::Serving), &reported("h", &down), 3);
        assert_eq!(
            conflict(&serving),
            Some(("False".into(), "Serving".into(), at(3)))
        );
        assert_eq!(serving.conditions[0].type_, condition::READY);
    }

    #[test]
    fn previous_reads_an_existing_object() {
        let spec = GpuNodeSpec::new("n", Mode::Real, REAL_PROFILE, Vec::new());
        let status = GpuNodeStatus {
            topology_since: Some(at(3)),
            conditions: vec![ready_condition(&stopped(), None, &at(4))],
            ..Default::default()
        };
        let p = Previous::of(&spec, Some(&status));
        assert_eq!(
            p.topology_hash.as_deref(),
            Some(spec.topology_hash.as_str())
        );
        assert_eq!(p.topology_since, Some(at(3)));
        assert_eq!(p.ready.unwrap().reason, "AgentStopped");
        assert_eq!(Previous::of(&spec, None).topology_since, None);
    }

    #[test]
    fn heartbeats_stay_within_a_tenth_of_the_period() {
        let period = Duration::from_secs(30);
        assert_eq!(jittered(period, 0.0), Duration::from_secs(27));
        assert_eq!(jittered(period, 0.5), period);
        assert!(jittered(period, 0.999_999) < Duration::from_secs(33));
        assert!(jittered(period, 0.999_999) > Duration::from_millis(32_999));
        // out-of-range units are clamped, never outside the bounds
        assert_eq!(jittered(period, -3.0), Duration::from_secs(27));
        assert_eq!(jittered(period, 7.0), Duration::from_secs(33));
    }

    #[test]
    fn backoff_doubles_from_one_second_to_five_minutes() {
        let secs: Vec<u64> = (1..=12).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(backoff(0), BACKOFF_MIN);
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
    }

    #[test]
    fn real_gpus_make_a_real_spec() {
        let sysfs =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/two-socket");
        let host = crate::host::SysfsHost::new(sysfs).probe().unwrap();
        let profile = mockgpu_api::Profile::builtin("h100").unwrap();
        let topo = NodeTopology::build(&profile, "n", &host).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("t");
        crate::output::write_tree(&crate::render::driver_tree(&topo, &host), &out).unwrap();
        let gpus = crate::real::detect(&out.join("proc"), &out.join("sys")).unwrap();
        let real = RealGpus(gpus);
        let spec = real.spec("node-r");
        assert_eq!(
            (
                spec.mode,
                spec.profile.as_str(),
                spec.node_name.as_str(),
                spec.gpu_count
            ),
            (Mode::Real, REAL_PROFILE, "node-r", 8)
        );
        assert_eq!(spec.gpus[0].memory_mib, None);
        assert_eq!(spec.gpus[0].model, "NVIDIA H100 80GB HBM3");
        let mock = topo.spec("ignored");
        assert_eq!(mock.mode, Mode::Mock);
        assert_eq!(mock.gpus[3].uuid, spec.gpus[3].uuid);
        assert!(real.readiness().ready);
        assert!(topo.readiness().ready);
    }
}
