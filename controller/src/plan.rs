//! The reconcile decision, as a pure function: from a GpuNode, its Node, the pods on the node and
//! the time, what to do ([`Plan`]). The executor (`reconcile`) carries it out.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use mockgpu_api::gpunode::GpuNodeFault;
use mockgpu_api::gpunode::condition::{self, GPU_PROBLEM};
use mockgpu_api::{FaultKind, Mode};

use crate::labels::{GPU_COUNT, GPU_PRESENT, GPU_PRODUCT, NodeLabels, PCI_NVIDIA, PROFILE};
use crate::slim::{SlimContainer, SlimGpuNode, SlimPod};
use crate::slurm::DRAIN_REASON_PREFIX;

/// What the decision depends on besides the objects.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Act on Drifted and InjectionMissing (delete Slurm node records and pods).
    pub remediation: bool,
    /// A GpuNode without a heartbeat for this long is Stale.
    pub stale_after: Duration,
    /// A GPU container is given this long to show up in the agent's pinning.
    pub injection_grace: Duration,
    /// The extended resource of GPUs (`nvidia.com/gpu`).
    pub gpu_resource: String,
    /// Drain the Slurm nodes of a node with GPU faults (and resume them once the faults clear).
    pub drain_slurm: bool,
    /// The type of the Node condition of GPU faults (default [`GPU_PROBLEM`]).
    pub node_condition_type: String,
}

/// The reasons of [`GPU_PROBLEM`]: faults among which an Xid error is; other faults only; none.
pub mod fault_reason {
    /// An Xid error is among the faults.
    pub const XID_ERROR: &str = "XidError";
    /// Faults, none an Xid error (ECC errors, thermal slowdown, NVLink down, excluded).
    pub const GPU_FAULT: &str = "GpuFault";
    /// No fault.
    pub const NO_GPU_FAULT: &str = "NoGpuFault";
}

/// Everything [`plan`] looks at.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    /// The GpuNode; `None` when it is gone (only our labels are removed then).
    pub gpunode: Option<&'a SlimGpuNode>,
    /// The node's labels of ours and who owns them; `None` when the Node is gone.
    pub node: Option<&'a NodeLabels>,
    /// The slurmd pods on the node.
    pub slurmd_pods: &'a [&'a SlimPod],
    /// The pods on the node (those requesting GPUs are looked at).
    pub pods: &'a [&'a SlimPod],
    /// The time of the decision.
    pub now: Timestamp,
    /// Settings.
    pub settings: &'a Settings,
}

/// A pod to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodAction {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (the deletion's precondition: a pod recreated under the same name is left alone).
    pub uid: String,
    /// Why: [`condition::DRIFTED`] or [`condition::INJECTION_MISSING`].
    pub why: &'static str,
}

/// An event to record on the GpuNode about a condition that became true.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// `PascalCase` reason.
    pub reason: &'static str,
    /// What happened, in words.
    pub note: String,
}

/// An Event about the node's GPU faults, recorded on the GpuNode and on the Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultEvent {
    /// A warning (faults appeared), else normal (they cleared).
    pub warning: bool,
    /// `GpuFault` or `GpuFaultCleared`.
    pub reason: &'static str,
    /// What happened, in words.
    pub note: String,
}

/// Slurm nodes to drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmDrain {
    /// Their names.
    pub nodes: Vec<String>,
    /// The reason (`mockgpu: ` and the faults).
    pub reason: String,
}

/// What to do.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Labels to apply to the Node with our field manager (empty: remove ours); `None`: leave the
    /// Node alone.
    pub labels: Option<BTreeMap<String, String>>,
    /// Our conditions to apply to the GpuNode status; `None`: unchanged.
    pub conditions: Option<Vec<Condition>>,
    /// The node's GPU-fault condition ([`GPU_PROBLEM`]) to set on the Node (under the configured
    /// type); `None`: unchanged.
    pub node_condition: Option<Condition>,
    /// The Event of the faults' appearance or clearing.
    pub fault_event: Option<FaultEvent>,
    /// Slurm nodes to drain (unless drained already, or by someone else): while there are
    /// faults, at every reconcile.
    pub slurm_drain: Option<SlurmDrain>,
    /// Slurm nodes to resume (if drained by us): once, as the faults clear (before the
    /// conditions are applied, so that a failure is tried again).
    pub slurm_resume: Vec<String>,
    /// Slurm node records to delete (before `delete_pods`).
    pub slurm_nodes: Vec<String>,
    /// Pods to delete.
    pub delete_pods: Vec<PodAction>,
    /// Warnings to record: conditions that became true.
    pub notices: Vec<Notice>,
    /// Reconcile again after this long (a heartbeat or a grace period runs out).
    pub requeue_after: Option<Duration>,
}

/// The decision.
pub fn plan(input: &Input<'_>) -> Plan {
    // a GpuNode being deleted counts as gone
    let gpunode = input
        .gpunode
        .filter(|g| g.metadata.deletion_timestamp.is_none());
    let labels = input.node.and_then(|node| {
        let wanted = gpunode.map(|g| wanted_labels(g, node));
        labels_to_apply(wanted, node)
    });
    let Some(g) = gpunode else {
        return Plan {
            labels,
            ..Plan::default()
        };
    };
    let mut p = Plan {
        labels,
        ..Plan::default()
    };
    let ctx = Ctx { g, input };
    let (stale, stale_at) = ctx.stale();
    let drifted = ctx.drifted();
    let is_stale = stale.status == "True";
    let missing = ctx.injection_missing(is_stale, &mut p.requeue_after);
    if let Some(at) = stale_at {
        requeue_at(&mut p.requeue_after, input.now, at);
    }
    let on_node = input.node.is_some();
    if input.settings.remediation && on_node {
        let node = g.metadata.name.as_deref().unwrap_or_default();
        for pod in &drifted {
            let name = slurm_node_name(pod, node);
            if !p.slurm_nodes.contains(&name) {
                p.slurm_nodes.push(name);
            }
        }
        let actions = drifted
            .iter()
            .map(|pod| pod_action(pod, condition::DRIFTED))
            .chain(
                missing
                    .iter()
                    .map(|(pod, _)| pod_action(pod, condition::INJECTION_MISSING)),
            );
        for a in actions {
            if !p.delete_pods.iter().any(|b| b.uid == a.uid) {
                p.delete_pods.push(a);
            }
        }
    }
    let wanted = [
        stale,
        ctx.drifted_condition(&drifted),
        ctx.missing_condition(&missing, is_stale),
    ];
    let current = g.status.as_ref().map(|s| &s.conditions[..]).unwrap_or(&[]);
    let mut next = Vec::with_capacity(wanted.len() + 1);
    let mut changed = false;
    for mut c in wanted {
        let old = current.iter().find(|o| o.type_ == c.type_);
        match old {
            Some(o) if o.status == c.status => {
                c.last_transition_time = o.last_transition_time.clone()
            }
            _ if c.status == "True" => p.notices.push(Notice {
                reason: notice_reason(&c.type_),
                note: c.message.clone(),
            }),
            _ => {}
        }
        changed |= old.is_none_or(|o| !unchanged(o, &c));
        next.push(c);
    }
    let old = current.iter().find(|o| o.type_ == GPU_PROBLEM);
    if on_node {
        let mut c = ctx.fault_condition();
        let was_true = old.is_some_and(|o| o.status == "True");
        match old {
            Some(o) if o.status == c.status => {
                c.last_transition_time = o.last_transition_time.clone()
            }
            _ if c.status == "True" => {
                p.fault_event = Some(FaultEvent {
                    warning: true,
                    reason: "GpuFault",
                    note: c.message.clone(),
                })
            }
            _ if was_true => {
                p.fault_event = Some(FaultEvent {
                    warning: false,
                    reason: "GpuFaultCleared",
                    note: "the node's GPU faults cleared".into(),
                })
            }
            _ => {}
        }
        if old.is_none_or(|o| !unchanged(o, &c)) {
            changed = true;
            p.node_condition = Some(Condition {
                type_: input.settings.node_condition_type.clone(),
                observed_generation: None,
                ..c.clone()
            });
        }
        if input.settings.drain_slurm {
            let node = g.metadata.name.as_deref().unwrap_or_default();
            let mut names: Vec<String> = Vec::new();
            for pod in input.slurmd_pods.iter().filter(|p| !p.deleting()) {
                let name = slurm_node_name(pod, node);
                if !names.contains(&name) {
                    names.push(name);
                }
            }
            if c.status == "True" {
                if !names.is_empty() {
                    p.slurm_drain = Some(SlurmDrain {
                        nodes: names,
                        reason: format!("{DRAIN_REASON_PREFIX} {}", c.message),
                    });
                }
            } else if was_true {
                p.slurm_resume = names;
            }
        }
        next.push(c);
    } else if let Some(o) = old {
        // no Node to set it on: kept as it is, until there is one
        next.push(o.clone());
    }
    if changed {
        p.conditions = Some(next);
    }
    p
}

/// One fault in words: `GPU 1 (GPU-…): Xid 79 (GPU has fallen off the bus.)`.
fn fault_line(f: &GpuNodeFault) -> String {
    let prefix = format!("GPU {}: ", f.gpu);
    let what = f.message.strip_prefix(&prefix).unwrap_or(&f.message);
    format!("GPU {} ({}): {what}", f.gpu, f.uuid)
}

/// Whether condition `new` would change nothing of `old`: all but the transition time (kept while
/// the status holds) is the same.
fn unchanged(old: &Condition, new: &Condition) -> bool {
    (
        &old.status,
        &old.reason,
        &old.message,
        old.observed_generation,
    ) == (
        &new.status,
        &new.reason,
        &new.message,
        new.observed_generation,
    )
}

/// The event reason of a condition that became true.
fn notice_reason(kind: &str) -> &'static str {
    match kind {
        condition::STALE => "HeartbeatLost",
        condition::DRIFTED => "Drifted",
        _ => "InjectionMissing",
    }
}

/// The decision's view of one GpuNode.
struct Ctx<'a> {
    g: &'a SlimGpuNode,
    input: &'a Input<'a>,
}

impl<'a> Ctx<'a> {
    fn condition(&self, kind: &str, status: &str, reason: &str, message: String) -> Condition {
        Condition {
            type_: kind.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            last_transition_time: Time(self.input.now),
            observed_generation: self.g.metadata.generation,
        }
    }

    /// Stale, and when it will be (`None`: already stale, or no heartbeat time at all).
    fn stale(&self) -> (Condition, Option<Timestamp>) {
        let after = self.input.settings.stale_after;
        let last = self
            .g
            .status
            .as_ref()
            .and_then(|s| s.last_heartbeat.as_ref())
            .or(self.g.metadata.creation_timestamp.as_ref())
            .map(|t| t.0);
        let Some(last) = last else {
            return (
                self.condition(
                    condition::STALE,
                    "Unknown",
                    "NoHeartbeat",
                    "the agent never reported".into(),
                ),
                None,
            );
        };
        let at = last + signed(after);
        if self.input.now >= at {
            let msg = format!(
                "no heartbeat since {last} (more than {} s)",
                after.as_secs()
            );
            (
                self.condition(condition::STALE, "True", "HeartbeatLost", msg),
                None,
            )
        } else {
            let msg = format!("the agent reports within {} s", after.as_secs());
            (
                self.condition(condition::STALE, "False", "Heartbeating", msg),
                Some(at),
            )
        }
    }

    /// The slurmd pods that started before the current topology was first reported: their
    /// slurmd registered other GPUs.
    fn drifted(&self) -> Vec<&'a SlimPod> {
        let Some(since) = self
            .g
            .status
            .as_ref()
            .and_then(|s| s.topology_since.as_ref())
        else {
            return Vec::new();
        };
        self.input
            .slurmd_pods
            .iter()
            .copied()
            .filter(|p| !p.deleting())
            .filter(|p| p.started.is_some_and(|t| t < since.0))
            .collect()
    }

    /// [`GPU_PROBLEM`]: True while the agent reports faults, naming each.
    fn fault_condition(&self) -> Condition {
        let faults = self.g.status.as_ref().map(|s| &s.faults[..]).unwrap_or(&[]);
        if faults.is_empty() {
            let msg = "no GPU faults".into();
            return self.condition(GPU_PROBLEM, "False", fault_reason::NO_GPU_FAULT, msg);
        }
        let reason = if faults.iter().any(|f| f.kind == FaultKind::Xid) {
            fault_reason::XID_ERROR
        } else {
            fault_reason::GPU_FAULT
        };
        let lines: Vec<String> = faults.iter().map(fault_line).collect();
        self.condition(GPU_PROBLEM, "True", reason, lines.join("; "))
    }

    fn drifted_condition(&self, drifted: &[&SlimPod]) -> Condition {
        if drifted.is_empty() {
            let msg = "no slurmd pod on the node predates its topology".into();
            return self.condition(condition::DRIFTED, "False", "InSync", msg);
        }
        let since = self
            .g
            .status
            .as_ref()
            .and_then(|s| s.topology_since.as_ref());
        let msg = format!(
            "slurmd pod(s) {} started before the topology changed ({})",
            names(drifted.iter().map(|p| pod_name(p))),
            since.map(|t| t.0.to_string()).unwrap_or_default()
        );
        self.condition(condition::DRIFTED, "True", "TopologyChanged", msg)
    }

    /// GPU containers that run for longer than the grace period without being in the pinning,
    /// as (pod, container). `requeue` is moved up to when a younger one's grace ends. Nothing
    /// while the agent is stale (its pinning is not current) or on a real-mode node.
    fn injection_missing(
        &self,
        stale: bool,
        requeue: &mut Option<Duration>,
    ) -> Vec<(&'a SlimPod, &'a str)> {
        if stale || self.g.spec.mode != Mode::Mock {
            return Vec::new();
        }
        let pinning = self
            .g
            .status
            .as_ref()
            .map(|s| &s.pinning[..])
            .unwrap_or(&[]);
        let grace = signed(self.input.settings.injection_grace);
        let mut out = Vec::new();
        for pod in self.input.pods.iter().copied() {
            if pod.deleting() {
                continue;
            }
            for (container, since) in gpu_containers(pod, &self.input.settings.gpu_resource) {
                if pinning
                    .iter()
                    .any(|p| p.pod_uid == pod.uid() && p.container == container)
                {
                    continue;
                }
                if self.input.now >= since + grace {
                    out.push((pod, container));
                } else {
                    requeue_at(requeue, self.input.now, since + grace);
                }
            }
        }
        out
    }

    fn missing_condition(&self, missing: &[(&SlimPod, &str)], stale: bool) -> Condition {
        if self.g.spec.mode != Mode::Mock {
            return self.condition(
                condition::INJECTION_MISSING,
                "False",
                "NotMocked",
                "the node's GPUs are real".into(),
            );
        }
        if stale {
            let msg = "the agent's pinning is not current".into();
            return self.condition(condition::INJECTION_MISSING, "Unknown", "AgentStale", msg);
        }
        if missing.is_empty() {
            let msg = "every running GPU container is in the pinning".into();
            return self.condition(condition::INJECTION_MISSING, "False", "AllInjected", msg);
        }
        let msg = format!(
            "running GPU container(s) without mockgpu's files: {}",
            names(missing.iter().map(|(p, c)| format!("{}/{c}", pod_name(p))))
        );
        self.condition(condition::INJECTION_MISSING, "True", "NotInjected", msg)
    }
}

/// A `std` duration as a signed one (saturating).
fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

/// Moves `requeue` up to `at` (at least one second from `now`).
fn requeue_at(requeue: &mut Option<Duration>, now: Timestamp, at: Timestamp) {
    let wait = Duration::try_from(at.duration_since(now))
        .unwrap_or_default()
        .max(Duration::from_secs(1));
    *requeue = Some(requeue.map_or(wait, |r| r.min(wait)));
}

/// The pod's running containers that request `resource`, with their start times.
fn gpu_containers<'p>(
    pod: &'p SlimPod,
    resource: &str,
) -> impl Iterator<Item = (&'p str, Timestamp)> {
    pod.containers
        .iter()
        .filter(move |c| asks_for(c, resource))
        .filter_map(|c| Some((&*c.name, c.running_since?)))
}

/// Whether the pod asks for `resource` in any container (the pods watched for InjectionMissing).
pub fn requests_resource(pod: &SlimPod, resource: &str) -> bool {
    pod.containers.iter().any(|c| asks_for(c, resource))
}

/// Whether the container's limits or requests ask for a non-zero amount of `resource`.
fn asks_for(c: &SlimContainer, resource: &str) -> bool {
    c.resources.iter().any(|r| &**r == resource)
}

/// The name a slurmd pod on `node` registered under in Slurm: slurmd's default, the host name
/// (the Kubernetes node's on the host network, otherwise the pod's `hostname` or name).
pub fn slurm_node_name(pod: &SlimPod, node: &str) -> String {
    if pod.host_network {
        return node.to_string();
    }
    pod.hostname.as_deref().unwrap_or(pod.name()).to_string()
}

fn pod_name(pod: &SlimPod) -> String {
    format!("{}/{}", pod.namespace(), pod.name())
}

fn pod_action(pod: &SlimPod, why: &'static str) -> PodAction {
    PodAction {
        namespace: pod.namespace().into(),
        name: pod.name().into(),
        uid: pod.uid().into(),
        why,
    }
}

fn names(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(", ")
}

/// The labels a node with GpuNode `g` should carry from us. A real-mode node gets only the
/// profile: the NVIDIA GPU stack labels real GPUs itself.
fn wanted_labels(g: &SlimGpuNode, node: &NodeLabels) -> BTreeMap<String, String> {
    let mut out = BTreeMap::from([(PROFILE.to_string(), label_value(&g.spec.profile))]);
    if g.spec.mode == Mode::Real {
        return out;
    }
    out.insert(GPU_COUNT.into(), g.spec.gpu_count.to_string());
    if let Some(model) = &g.spec.model {
        out.insert(GPU_PRESENT.into(), "true".into());
        out.insert(GPU_PRODUCT.into(), label_value(model));
        if !node.owned_by_another(PCI_NVIDIA) {
            out.insert(PCI_NVIDIA.into(), "true".into());
        }
    }
    out
}

/// What to apply to a node: `None` leaves it alone (our labels are in place with exactly the
/// wanted values and keys, or there is no GpuNode and no label of ours), `Some(set)` applies
/// `set` (empty: removes ours) with our field manager.
pub fn labels_to_apply(
    wanted: Option<BTreeMap<String, String>>,
    node: &NodeLabels,
) -> Option<BTreeMap<String, String>> {
    let want = match wanted {
        Some(w) => w,
        None if node.ours().next().is_none() => return None,
        None => BTreeMap::new(),
    };
    let in_place = want.iter().all(|(k, v)| node.has(k, v));
    (!(in_place && node.ours_are(want.keys()))).then_some(want)
}

/// A label value from free text: characters other than letters, digits, `-`, `_`, `.` become
/// `-`, at most 63 characters, starting and ending with a letter or digit.
fn label_value(text: &str) -> String {
    let mapped: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        Container, ContainerState, ContainerStateRunning, ContainerStatus, Pod, PodSpec, PodStatus,
        ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use mockgpu_api::gpunode::CONTROLLER_MANAGER;
    use mockgpu_api::{GpuNode, GpuNodeGpu, GpuNodeSpec, GpuNodeStatus, Pinning};

    use super::*;
    use crate::labels::tests::node_json as node;
    use crate::slim::SlimNode;
    // node(owners, labels): node-a, with managed-fields entries of (manager, operation, keys)
    use crate::slim::tests::{slim, slim_pod};

    /// Seconds after an arbitrary origin.
    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn settings(remediation: bool) -> Settings {
        Settings {
            remediation,
            stale_after: Duration::from_secs(90),
            injection_grace: Duration::from_secs(60),
            gpu_resource: "nvidia.com/gpu".into(),
            drain_slurm: false,
            node_condition_type: GPU_PROBLEM.into(),
        }
    }

    fn gpu(minor: u32) -> GpuNodeGpu {
        GpuNodeGpu {
            index: minor,
            minor,
            uuid: format!("GPU-{minor}"),
            bus_id: format!("0000:0{minor}:00.0"),
            model: "NVIDIA GB300".into(),
            memory_mib: Some(1),
            numa_node: 0,
            local_cpulist: "0-7".into(),
            socket: 0,
        }
    }

    /// A GpuNode with 4 GB300s, heartbeat at `hb`, topology since `since`.
    fn gpunode(hb: i64, since: i64) -> GpuNode {
        let mut g = GpuNode::new(
            "node-a",
            GpuNodeSpec::new("node-a", Mode::Mock, "gb300", (0..4).map(gpu).collect()),
        );
        g.metadata.creation_timestamp = Some(Time(t(-1000)));
        g.metadata.generation = Some(1);
        g.status = Some(GpuNodeStatus {
            last_heartbeat: Some(Time(t(hb))),
            topology_since: Some(Time(t(since))),
            ..Default::default()
        });
        g
    }

    /// The node as we leave it: our labels in place, owned by us.
    fn labelled_node() -> SlimNode {
        let ours = [
            (PROFILE, "gb300"),
            (GPU_PRESENT, "true"),
            (GPU_COUNT, "4"),
            (GPU_PRODUCT, "NVIDIA-GB300"),
            (PCI_NVIDIA, "true"),
        ];
        let keys: Vec<&str> = ours.iter().map(|(k, _)| *k).collect();
        node(&[(CONTROLLER_MANAGER, "Apply", &keys)], &ours)
    }

    /// A running pod `name` whose container `c` started at `started`, asking for `gpus` GPUs.
    fn pod(name: &str, started: i64, gpus: Option<&str>, host_network: bool) -> Pod {
        let resources = gpus.map(|n| ResourceRequirements {
            limits: Some([("nvidia.com/gpu".to_string(), Quantity(n.into()))].into()),
            ..Default::default()
        });
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("slurm".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("node-a".into()),
                host_network: Some(host_network),
                containers: vec![Container {
                    name: "c".into(),
                    resources,
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                start_time: Some(Time(t(started - 5))),
                container_statuses: Some(vec![ContainerStatus {
                    name: "c".into(),
                    state: Some(ContainerState {
                        running: Some(ContainerStateRunning {
                            started_at: Some(Time(t(started))),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn pinned(g: &mut GpuNode, pod: &str) {
        g.status.as_mut().unwrap().pinning.push(Pinning {
            namespace: "slurm".into(),
            pod: pod.into(),
            pod_uid: format!("uid-{pod}"),
            container: "c".into(),
            gpus: vec!["GPU-0".into()],
            since: Time(t(0)),
        });
    }

    struct Case<'a> {
        gpunode: Option<&'a GpuNode>,
        node: Option<&'a SlimNode>,
        slurmd: Vec<&'a Pod>,
        pods: Vec<&'a Pod>,
        now: i64,
        remediation: bool,
        drain: bool,
        condition_type: &'static str,
    }

    /// The plan of `c`, its objects as the caches keep them.
    fn run(c: &Case<'_>) -> Plan {
        let slurmd: Vec<SlimPod> = c.slurmd.iter().map(|p| slim_pod(p)).collect();
        let pods: Vec<SlimPod> = c.pods.iter().map(|p| slim_pod(p)).collect();
        plan(&Input {
            gpunode: c.gpunode.map(slim).as_ref(),
            node: c.node.map(|n| &n.labels),
            slurmd_pods: &slurmd.iter().collect::<Vec<_>>(),
            pods: &pods.iter().collect::<Vec<_>>(),
            now: t(c.now),
            settings: &Settings {
                drain_slurm: c.drain,
                node_condition_type: c.condition_type.into(),
                ..settings(c.remediation)
            },
        })
    }

    fn case<'a>(g: Option<&'a GpuNode>, n: Option<&'a SlimNode>) -> Case<'a> {
        Case {
            gpunode: g,
            node: n,
            slurmd: vec![],
            pods: vec![],
            now: 10,
            remediation: false,
            drain: false,
            condition_type: GPU_PROBLEM,
        }
    }

    /// Our conditions but GPUProblem as (type, status, reason).
    fn conds(p: &Plan) -> Vec<(String, String, String)> {
        p.conditions
            .iter()
            .flatten()
            .filter(|c| c.type_ != GPU_PROBLEM)
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect()
    }

    fn c3(stale: &str, drifted: &str, missing: &str) -> Vec<(String, String, String)> {
        [
            (condition::STALE, stale),
            (condition::DRIFTED, drifted),
            (condition::INJECTION_MISSING, missing),
        ]
        .iter()
        .map(|(k, v)| {
            let (s, r) = v.split_once(':').unwrap_or((v, ""));
            (k.to_string(), s.to_string(), r.to_string())
        })
        .collect()
    }

    /// The GpuNode with the plan's conditions written back (as the executor's apply would).
    fn applied(g: &GpuNode, p: &Plan) -> GpuNode {
        let mut g = g.clone();
        g.status.as_mut().unwrap().conditions = p.conditions.clone().unwrap();
        g
    }

    /// A change is told by all but the transition time; an odd status is none of ours.
    #[test]
    fn a_condition_change_is_all_but_its_transition_time() {
        let c = Condition {
            type_: condition::DRIFTED.into(),
            status: "True".into(),
            reason: "R".into(),
            message: "m".into(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: Some(2),
        };
        let same = Condition {
            last_transition_time: Time(Timestamp::from_second(1).unwrap()),
            ..c.clone()
        };
        assert!(unchanged(&c, &same));
        let changes = [
            Condition {
                status: "False".into(),
                ..c.clone()
            },
            Condition {
                reason: "Other".into(),
                ..c.clone()
            },
            Condition {
                message: "m2".into(),
                ..c.clone()
            },
            Condition {
                observed_generation: Some(3),
                ..c.clone()
            },
        ];
        for changed in &changes {
            assert!(!unchanged(&c, changed), "{changed:?}");
        }
        let odd = Condition {
            status: "Maybe".into(),
            ..c.clone()
        };
        for status in ["True", "False", "Unknown"] {
            let ours = Condition {
                status: status.into(),
                ..c.clone()
            };
            assert!(!unchanged(&odd, &ours), "{status}");
        }
    }

    #[test]
    fn a_new_node_gets_the_labels_and_healthy_conditions() {
        let g = gpunode(0, -500);
        let n = node(
            &[("kubelet", "Update", &["kubernetes.io/hostname"])],
            &[("kubernetes.io/hostname", "node-a")],
        );
        let p = run(&case(Some(&g), Some(&n)));
        let want: BTreeMap<String, String> = [
            (PROFILE, "gb300"),
            (GPU_PRESENT, "true"),
            (GPU_COUNT, "4"),
            (GPU_PRODUCT, "NVIDIA-GB300"),
            (PCI_NVIDIA, "true"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(p.labels, Some(want));
        assert_eq!(
            conds(&p),
            c3("False:Heartbeating", "False:InSync", "False:AllInjected")
        );
        assert!(p.notices.is_empty());
        // requeued when the heartbeat would turn stale: at 90 s after it, now is 10 s
        assert_eq!(p.requeue_after, Some(Duration::from_secs(80)));
        // applied: the next reconcile changes nothing
        let again = run(&case(Some(&applied(&g, &p)), Some(&labelled_node())));
        assert_eq!((again.labels, again.conditions), (None, None));
    }

    #[test]
    fn a_lost_heartbeat_makes_the_node_stale_once() {
        let g = gpunode(0, -500);
        let n = labelled_node();
        let fresh = run(&case(Some(&g), Some(&n)));
        let g = applied(&g, &fresh);
        let p = run(&Case {
            now: 91,
            ..case(Some(&g), Some(&n))
        });
        assert_eq!(
            conds(&p),
            c3("True:HeartbeatLost", "False:InSync", "Unknown:AgentStale")
        );
        assert_eq!(
            p.notices.iter().map(|n| n.reason).collect::<Vec<_>>(),
            ["HeartbeatLost"]
        );
        assert_eq!(p.requeue_after, None);
        let stale = applied(&g, &p);
        let again = run(&Case {
            now: 200,
            ..case(Some(&stale), Some(&n))
        });
        assert_eq!((again.conditions, again.notices), (None, vec![]));
        // the transition time is that of the change, kept while the status holds
        let when = |p: &Plan| p.conditions.as_ref().unwrap()[0].last_transition_time.0;
        assert_eq!(when(&p), t(91));
        // a heartbeat again: not stale, and the transition is recorded
        let mut beating = stale.clone();
        beating.status.as_mut().unwrap().last_heartbeat = Some(Time(t(299)));
        let back = run(&Case {
            now: 300,
            ..case(Some(&beating), Some(&n))
        });
        assert_eq!(when(&back), t(300));
        assert_eq!(conds(&back)[0], c3("False:Heartbeating", "", "")[0].clone());
    }

    #[test]
    fn a_topology_change_drifts_only_slurmd_pods_started_before_it() {
        let g = gpunode(0, -100);
        let n = labelled_node();
        let old = pod("slurmd-0", -200, None, true);
        let new = pod("slurmd-1", -50, None, false);
        // without slurmd pods: in sync
        let none = run(&case(Some(&g), Some(&n)));
        assert_eq!(conds(&none)[1], c3("", "False:InSync", "")[1].clone());
        // one started after the change: in sync
        let after = run(&Case {
            slurmd: vec![&new],
            ..case(Some(&g), Some(&n))
        });
        assert_eq!(conds(&after)[1].1, "False");
        // one started before it: drifted, remediation off: nothing deleted
        let p = run(&Case {
            slurmd: vec![&old, &new],
            ..case(Some(&g), Some(&n))
        });
        assert_eq!(conds(&p)[1], c3("", "True:TopologyChanged", "")[1].clone());
        assert!(
            p.conditions.as_ref().unwrap()[1]
                .message
                .contains("slurm/slurmd-0")
        );
        assert!(
            !p.conditions.as_ref().unwrap()[1]
                .message
                .contains("slurmd-1")
        );
        assert_eq!(
            p.notices.iter().map(|n| n.reason).collect::<Vec<_>>(),
            ["Drifted"]
        );
        assert!(p.slurm_nodes.is_empty() && p.delete_pods.is_empty());
    }

    #[test]
    fn remediation_deletes_the_slurm_record_and_the_drifted_slurmd_pods() {
        let g = gpunode(0, -100);
        let n = labelled_node();
        let host = pod("slurmd-0", -200, None, true);
        let own = pod("slurmd-1", -300, None, false);
        let fresh = pod("slurmd-2", -10, None, false);
        let p = run(&Case {
            slurmd: vec![&host, &own, &fresh],
            remediation: true,
            ..case(Some(&g), Some(&n))
        });
        // host network: the Kubernetes node's name; otherwise the pod's host name (its name)
        assert_eq!(p.slurm_nodes, ["node-a", "slurmd-1"]);
        let deleted: Vec<_> = p
            .delete_pods
            .iter()
            .map(|a| (a.name.as_str(), a.uid.as_str(), a.why))
            .collect();
        assert_eq!(
            deleted,
            [
                ("slurmd-0", "uid-slurmd-0", condition::DRIFTED),
                ("slurmd-1", "uid-slurmd-1", condition::DRIFTED)
            ]
        );
        // a pod already being deleted is not deleted again
        let mut going = host.clone();
        going.metadata.deletion_timestamp = Some(Time(t(5)));
        let p = run(&Case {
            slurmd: vec![&going],
            remediation: true,
            ..case(Some(&g), Some(&n))
        });
        assert!(p.delete_pods.is_empty() && p.slurm_nodes.is_empty());
    }

    #[test]
    fn a_gpu_container_missing_from_the_pinning_after_the_grace_period() {
        let mut g = gpunode(0, -500);
        pinned(&mut g, "injected");
        let n = labelled_node();
        let injected = pod("injected", -300, Some("2"), false);
        let missing = pod("missing", -300, Some("1"), false);
        let young = pod("young", -20, Some("1"), false);
        let cpu = pod("cpu-only", -300, None, false);
        let zero = pod("zero", -300, Some("0"), false);
        let c = Case {
            pods: vec![&injected, &missing, &young, &cpu, &zero],
            ..case(Some(&g), Some(&n))
        };
        let p = run(&c);
        assert_eq!(conds(&p)[2], c3("", "", "True:NotInjected")[2].clone());
        let msg = &p.conditions.as_ref().unwrap()[2].message;
        assert!(
            msg.contains("slurm/missing/c") && !msg.contains("young") && !msg.contains("injected"),
            "{msg}"
        );
        assert!(p.delete_pods.is_empty(), "remediation is off");
        // the young pod's grace ends 60 s after its start (-20): requeued at 40, now is 10
        assert_eq!(p.requeue_after, Some(Duration::from_secs(30)));
        let p = run(&Case {
            remediation: true,
            ..c
        });
        let deleted: Vec<_> = p
            .delete_pods
            .iter()
            .map(|a| (a.name.as_str(), a.why))
            .collect();
        assert_eq!(deleted, [("missing", condition::INJECTION_MISSING)]);
        assert!(p.slurm_nodes.is_empty());
    }

    #[test]
    fn nfd_owning_the_pci_label_keeps_it_out_of_ours() {
        let g = gpunode(0, -500);
        let n = node(
            &[("nfd-master", "Update", &[PCI_NVIDIA])],
            &[(PCI_NVIDIA, "true")],
        );
        let p = run(&case(Some(&g), Some(&n)));
        let labels = p.labels.unwrap();
        assert!(!labels.contains_key(PCI_NVIDIA));
        assert_eq!(
            labels.get(GPU_PRODUCT).map(String::as_str),
            Some("NVIDIA-GB300")
        );
    }

    #[test]
    fn a_deleted_gpunode_takes_our_labels_and_nothing_else() {
        let n = labelled_node();
        let p = run(&case(None, Some(&n)));
        assert_eq!(
            p,
            Plan {
                labels: Some(BTreeMap::new()),
                ..Plan::default()
            }
        );
        // one being deleted counts as gone
        let mut g = gpunode(0, -500);
        g.metadata.deletion_timestamp = Some(Time(t(1)));
        assert_eq!(run(&case(Some(&g), Some(&n))).labels, Some(BTreeMap::new()));
        // a node without a GpuNode and without our labels is never touched
        let other = node(&[("kubectl", "Apply", &[PROFILE])], &[(PROFILE, "mine")]);
        assert_eq!(run(&case(None, Some(&other))), Plan::default());
        // nor one we already cleaned
        let cleaned = node(&[], &[]);
        assert_eq!(run(&case(None, Some(&cleaned))), Plan::default());
    }

    #[test]
    fn a_deleted_node_is_not_labelled_and_nothing_is_deleted() {
        let g = gpunode(0, -100);
        let old = pod("slurmd-0", -200, None, true);
        let missing = pod("missing", -300, Some("1"), false);
        let p = run(&Case {
            slurmd: vec![&old],
            pods: vec![&missing],
            remediation: true,
            ..case(Some(&g), None)
        });
        assert_eq!(p.labels, None);
        assert!(p.slurm_nodes.is_empty() && p.delete_pods.is_empty());
        // its status still follows: Stale once heartbeats stop
        let p = run(&Case {
            now: 100,
            ..case(Some(&g), None)
        });
        assert_eq!(conds(&p)[0].1, "True");
    }

    #[test]
    fn a_changed_profile_relabels_and_a_real_node_gets_only_its_profile() {
        let mut g = gpunode(0, -500);
        g.spec = GpuNodeSpec::new("node-a", Mode::Mock, "h100", (0..8).map(gpu).collect());
        let p = run(&case(Some(&g), Some(&labelled_node())));
        let labels = p.labels.unwrap();
        assert_eq!(
            (labels[PROFILE].as_str(), labels[GPU_COUNT].as_str()),
            ("h100", "8")
        );
        g.spec = GpuNodeSpec::new("node-a", Mode::Real, "real", (0..2).map(gpu).collect());
        let p = run(&case(Some(&g), Some(&labelled_node())));
        assert_eq!(
            p.labels,
            Some([(PROFILE.to_string(), "real".to_string())].into())
        );
        assert_eq!(conds(&p)[2], c3("", "", "False:NotMocked")[2].clone());
    }

    /// An Xid 79 on GPU 1 and a thermal slowdown on GPU 2, as the agent reports them.
    fn faults() -> Vec<GpuNodeFault> {
        vec![
            GpuNodeFault {
                source: "GpuFault/xid".into(),
                gpu: 1,
                uuid: "GPU-1".into(),
                kind: FaultKind::Xid,
                xid: Some(79),
                message: "GPU 1: Xid 79 (GPU has fallen off the bus.)".into(),
            },
            GpuNodeFault {
                source: "local/hot".into(),
                gpu: 2,
                uuid: "GPU-2".into(),
                kind: FaultKind::Thermal,
                xid: None,
                message: "GPU 2: thermal slowdown".into(),
            },
        ]
    }

    const FAULTS_MSG: &str = "GPU 1 (GPU-1): Xid 79 (GPU has fallen off the bus.); \
                              GPU 2 (GPU-2): thermal slowdown";

    fn with_faults(g: &GpuNode, f: Vec<GpuNodeFault>) -> GpuNode {
        let mut g = g.clone();
        g.status.as_mut().unwrap().faults = f;
        g
    }

    /// The GPUProblem condition among the GpuNode conditions the plan applies.
    fn fault_cond(p: &Plan) -> Option<&Condition> {
        p.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == GPU_PROBLEM)
    }

    /// A node's first reconcile sets GPUProblem=False on the Node too (no Event); faults turn it
    /// True (reason XidError when an Xid is among them, each faulty GPU named), with a warning,
    /// once; cleared, it turns False with a normal Event, once.
    #[test]
    fn gpu_faults_set_the_node_condition_on_each_change_only() {
        let n = labelled_node();
        let g = gpunode(0, -500);
        let first = run(&case(Some(&g), Some(&n)));
        let nc = first
            .node_condition
            .clone()
            .expect("a first node condition");
        assert_eq!(
            (&*nc.type_, &*nc.status, &*nc.reason),
            (GPU_PROBLEM, "False", fault_reason::NO_GPU_FAULT)
        );
        assert_eq!(first.fault_event, None);
        assert_eq!(fault_cond(&first).map(|c| &*c.status), Some("False"));
        let g = applied(&g, &first);

        let faulty = with_faults(&g, faults());
        let p = run(&Case {
            now: 20,
            ..case(Some(&faulty), Some(&n))
        });
        let nc = p
            .node_condition
            .clone()
            .expect("the node condition turns True");
        assert_eq!(
            (&*nc.type_, &*nc.status, &*nc.reason, &*nc.message),
            (GPU_PROBLEM, "True", fault_reason::XID_ERROR, FAULTS_MSG)
        );
        assert_eq!(nc.last_transition_time, Time(t(20)));
        assert_eq!(
            p.fault_event,
            Some(FaultEvent {
                warning: true,
                reason: "GpuFault",
                note: FAULTS_MSG.into()
            })
        );
        // the GpuNode's own condition says the same (and is what tells a change later)
        assert_eq!(fault_cond(&p).map(|c| &*c.message), Some(FAULTS_MSG));
        assert_eq!(conds(&p), conds(&first), "the other conditions stay");
        assert!(p.notices.is_empty(), "{:?}", p.notices);
        // nothing is drained unless asked
        assert_eq!(
            (p.slurm_drain.clone(), p.slurm_resume.clone()),
            (None, vec![])
        );

        // applied: nothing changes while the faults stay
        let faulty = applied(&faulty, &p);
        let again = run(&Case {
            now: 30,
            ..case(Some(&faulty), Some(&n))
        });
        assert_eq!(
            (again.conditions, again.node_condition, again.fault_event),
            (None, None, None)
        );

        // a fault less: the message changes, the transition time stays, no Event
        let fewer = with_faults(&faulty, faults()[1..].to_vec());
        let p = run(&Case {
            now: 40,
            ..case(Some(&fewer), Some(&n))
        });
        let nc = p.node_condition.clone().expect("the message changes");
        assert_eq!(
            (&*nc.status, &*nc.reason, &*nc.message),
            (
                "True",
                fault_reason::GPU_FAULT,
                "GPU 2 (GPU-2): thermal slowdown"
            )
        );
        assert_eq!(nc.last_transition_time, Time(t(20)));
        assert_eq!(p.fault_event, None);
        let fewer = applied(&fewer, &p);

        // cleared
        let cleared = with_faults(&fewer, vec![]);
        let p = run(&Case {
            now: 50,
            ..case(Some(&cleared), Some(&n))
        });
        let nc = p
            .node_condition
            .clone()
            .expect("the node condition turns False");
        assert_eq!(
            (&*nc.status, &*nc.reason),
            ("False", fault_reason::NO_GPU_FAULT)
        );
        assert_eq!(nc.last_transition_time, Time(t(50)));
        assert_eq!(
            p.fault_event.as_ref().map(|e| (e.warning, e.reason)),
            Some((false, "GpuFaultCleared"))
        );
        let again = run(&Case {
            now: 60,
            ..case(Some(&applied(&cleared, &p)), Some(&n))
        });
        assert_eq!((again.node_condition, again.fault_event), (None, None));
    }

    /// The Node condition takes the configured type; the GpuNode's keeps its own.
    #[test]
    fn the_node_condition_type_is_configurable() {
        let g = with_faults(&gpunode(0, -500), faults());
        let p = run(&Case {
            condition_type: "example.com/GpuTrouble",
            ..case(Some(&g), Some(&labelled_node()))
        });
        assert_eq!(
            p.node_condition.clone().map(|c| (c.type_, c.status)),
            Some(("example.com/GpuTrouble".to_string(), "True".to_string()))
        );
        assert_eq!(fault_cond(&p).map(|c| &*c.status), Some("True"));
    }

    /// Without its Node, nothing is set and the GpuNode's condition is not recorded either: the
    /// Node gets it once it is there.
    #[test]
    fn no_node_no_node_condition() {
        let g = with_faults(&gpunode(0, -500), faults());
        let p = run(&Case {
            drain: true,
            ..case(Some(&g), None)
        });
        assert_eq!(
            (p.node_condition.clone(), p.fault_event.clone()),
            (None, None)
        );
        assert_eq!(fault_cond(&p), None);
        assert_eq!(p.slurm_drain, None);
        let later = run(&case(Some(&applied(&g, &p)), Some(&labelled_node())));
        assert_eq!(
            later.node_condition.map(|c| c.status),
            Some("True".to_string())
        );
    }

    /// With the drain on, a faulty node's Slurm nodes (named as slurmd registered them) are to be
    /// drained at every reconcile while the faults last, with `mockgpu: ` and the faults as the
    /// reason; once they clear, resumed once.
    #[test]
    fn the_drain_lasts_while_the_faults_do_and_resumes_once() {
        let n = labelled_node();
        let on_host = pod("slurmd-host", 0, None, true);
        let mut own = pod("slurmd-own", 0, None, false);
        own.spec.as_mut().unwrap().hostname = Some("gpu-a".into());
        let g = applied(
            &gpunode(0, -500),
            &run(&case(Some(&gpunode(0, -500)), Some(&n))),
        );
        let faulty = with_faults(&g, faults());
        let slurmd = [&on_host, &own];
        fn drain_case<'a>(g: &'a GpuNode, n: &'a SlimNode, slurmd: &[&'a Pod]) -> Case<'a> {
            Case {
                drain: true,
                slurmd: slurmd.to_vec(),
                ..case(Some(g), Some(n))
            }
        }
        let p = run(&drain_case(&faulty, &n, &slurmd));
        let want = SlurmDrain {
            nodes: vec!["node-a".into(), "gpu-a".into()],
            reason: format!("mockgpu: {FAULTS_MSG}"),
        };
        assert_eq!(p.slurm_drain, Some(want.clone()));
        assert!(p.slurm_resume.is_empty());
        let faulty = applied(&faulty, &p);
        // again, though nothing else changes
        let again = run(&drain_case(&faulty, &n, &slurmd));
        assert_eq!(again.conditions, None);
        assert_eq!(again.slurm_drain, Some(want));
        // off: never
        let off = run(&Case {
            drain: false,
            ..drain_case(&faulty, &n, &slurmd)
        });
        assert_eq!(off.slurm_drain, None);
        // cleared: resumed once
        let cleared = with_faults(&faulty, vec![]);
        let p = run(&drain_case(&cleared, &n, &slurmd));
        assert_eq!(p.slurm_drain, None);
        assert_eq!(p.slurm_resume, ["node-a", "gpu-a"]);
        let again = run(&drain_case(&applied(&cleared, &p), &n, &slurmd));
        assert_eq!((again.slurm_drain, again.slurm_resume), (None, vec![]));
        // a healthy node is never resumed
        let healthy = run(&drain_case(&g, &n, &slurmd));
        assert!(healthy.slurm_resume.is_empty());
    }
}

/// The label decisions.
#[cfg(test)]
mod label_tests {
    use mockgpu_api::gpunode::CONTROLLER_MANAGER;

    use super::*;
    use crate::labels::tests::node_json;

    #[test]
    fn label_values_are_valid() {
        assert_eq!(label_value("NVIDIA GB300"), "NVIDIA-GB300");
        assert_eq!(
            label_value("NVIDIA H100 80GB HBM3"),
            "NVIDIA-H100-80GB-HBM3"
        );
        assert_eq!(label_value(" (odd) "), "odd");
        assert_eq!(label_value(&"x".repeat(80)).len(), 63);
    }

    /// A node carrying `labels` (key, value), of which we own `ours` through apply.
    fn node(labels: &[(&str, &str)], ours: &[&str]) -> NodeLabels {
        node_json(&[(CONTROLLER_MANAGER, "Apply", ours)], labels).labels
    }

    fn set(labels: &[(&str, &str)]) -> BTreeMap<String, String> {
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A case of [`labels_to_apply`]: the labels wanted (`None`: no GpuNode), the node's labels and
    /// those of them we own, and whether anything is applied.
    struct Case<'a> {
        what: &'a str,
        wanted: Option<&'a [(&'a str, &'a str)]>,
        labels: &'a [(&'a str, &'a str)],
        ours: &'a [&'a str],
        write: bool,
    }

    /// A node whose labels are already what we want is not written; anything else is.
    #[test]
    fn only_a_change_is_applied() {
        let want = &[(PROFILE, "gb300"), (GPU_COUNT, "4")][..];
        let both = &[PROFILE, GPU_COUNT][..];
        let case = |what, wanted, labels, ours, write| Case {
            what,
            wanted,
            labels,
            ours,
            write,
        };
        let cases = [
            case("in place, owned", Some(want), want, both, false),
            case(
                "in place, not owned by us",
                Some(want),
                want,
                &[PROFILE],
                true,
            ),
            case(
                "a value differs",
                Some(want),
                &[(PROFILE, "h100"), (GPU_COUNT, "4")],
                both,
                true,
            ),
            case(
                "a label is missing",
                Some(want),
                &[(PROFILE, "gb300")],
                both,
                true,
            ),
            case(
                "we own one more",
                Some(want),
                want,
                &[PROFILE, GPU_COUNT, GPU_PRODUCT],
                true,
            ),
            case(
                "we own an old release's label",
                Some(want),
                want,
                &[PROFILE, GPU_COUNT, "old.mockgpu.io/x"],
                true,
            ),
            case("no GpuNode, ours present", None, want, both, true),
            case("no GpuNode, nothing of ours", None, want, &[], false),
            case("no GpuNode, already cleaned", None, &[], &[], false),
        ];
        for c in &cases {
            let got = labels_to_apply(c.wanted.map(set), &node(c.labels, c.ours));
            assert_eq!(got.is_some(), c.write, "{}: {got:?}", c.what);
            if let Some(got) = got {
                assert_eq!(got, c.wanted.map(set).unwrap_or_default(), "{}", c.what);
            }
        }
    }
}
