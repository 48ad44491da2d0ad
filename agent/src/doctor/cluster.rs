//! The checks of the Kubernetes side: the device plugin's registration with the kubelet, the
//! node's allocatable GPUs and the agent's GpuNode report.

use std::time::Duration;

use mockgpu_api::gpunode::condition;

use super::{Check, Facts, Node, Options, REAL_NODE, sample};
use crate::device_plugin::{KUBELET_SOCKET, PLUGIN_DIR};

/// A heartbeat counts as fresh this many periods (and a tenth) after it was reported.
pub(crate) const FRESH_HEARTBEATS: u32 = 3;

/// Reason given by the checks that need an API server when none is configured.
const NO_API: &str = "no Kubernetes API server configured (no service account, KUBECONFIG, \
                      ~/.kube/config or --kubeconfig)";

/// Whether the agent runs its device plugin (its metrics say), and how many GPUs it advertises
/// as healthy; `Err` with the reason to skip when the agent cannot tell.
fn device_plugin_metrics(facts: &Facts, opts: &Options) -> Result<Option<f64>, String> {
    match &facts.metrics {
        Ok(r) if r.status == 200 => Ok(sample(&r.body, "mockgpu_device_plugin_healthy_gpus")
            .filter(|_| sample(&r.body, "mockgpu_device_plugin_registrations_total").is_some())),
        _ => Err(format!("no agent answers at {} (see agent)", opts.health)),
    }
}

/// Whether the agent's device plugin stands down for another plugin (its metrics say).
fn stood_down(facts: &Facts) -> bool {
    facts
        .metrics
        .as_ref()
        .ok()
        .and_then(|r| sample(&r.body, "mockgpu_device_plugin_stood_down"))
        .is_some_and(|v| v >= 1.0)
}

/// The message of the GpuNode's `DevicePluginConflict` condition while it is True, if the
/// doctor can read the GpuNode.
fn conflict_message(facts: &Facts) -> Option<String> {
    let view = facts.cluster.as_ref()?.as_ref().ok()?;
    let status = view.gpunode.as_ref()?.status.as_ref()?;
    status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::DEVICE_PLUGIN_CONFLICT && c.status == "True")
        .map(|c| c.message.clone())
}

/// Our socket and the kubelet's in the kubelet's device plugin directory, and the agent's
/// registrations; a device plugin that stands down for another plugin fails.
pub(super) fn device_plugin<N: Node>(node: &N, opts: &Options, facts: &Facts) -> Check {
    const NAME: &str = "device-plugin";
    if !facts.mock {
        return Check::skip(NAME, REAL_NODE);
    }
    match device_plugin_metrics(facts, opts) {
        Err(why) => return Check::skip(NAME, why),
        Ok(None) => {
            return Check::skip(
                NAME,
                format!(
                    "the agent runs without --device-plugin: nothing advertises {} from it",
                    opts.resource_name
                ),
            );
        }
        Ok(Some(_)) => {}
    }
    if stood_down(facts) {
        let which = conflict_message(facts).map_or_else(
            || "the agent's log names it".to_string(),
            |m| format!("GpuNode {}: {m}", opts.node_name),
        );
        return Check::fail(
            NAME,
            format!(
                "the agent's device plugin stands down: another device plugin serves {} on this node ({which})",
                opts.resource_name
            ),
            "remove the other device plugin (the GPU Operator's: its devicePlugin.enabled=false) \
             and the agent's serves within a minute, or turn the agent's off \
             (agent.devicePlugin.enabled=false)",
        );
    }
    let dir = opts.kubelet_dir.join(PLUGIN_DIR);
    let kubelet = dir.join(KUBELET_SOCKET);
    let ours = dir.join(format!(
        "mockgpu-{}.sock",
        opts.resource_name.replace('/', "_")
    ));
    if !matches!(node.is_socket(&kubelet), Ok(true)) {
        return Check::fail(
            NAME,
            format!("no kubelet registration socket at {}", kubelet.display()),
            format!(
                "start the kubelet, or pass --kubelet-dir with the kubelet's --root-dir (now {})",
                opts.kubelet_dir.display()
            ),
        );
    }
    if !matches!(node.is_socket(&ours), Ok(true)) {
        return Check::fail(
            NAME,
            format!(
                "the agent's device plugin socket {} is missing",
                ours.display()
            ),
            "restart the agent: it serves the socket again and registers with the kubelet",
        );
    }
    let registrations = facts
        .metrics
        .as_ref()
        .ok()
        .and_then(|r| sample(&r.body, "mockgpu_device_plugin_registrations_total"))
        .unwrap_or(0.0);
    if registrations < 1.0 {
        return Check::fail(
            NAME,
            format!(
                "the agent serves {} but has not registered {} with the kubelet",
                ours.display(),
                opts.resource_name
            ),
            "see the agent's log (\"cannot register with the kubelet\") and the kubelet's",
        );
    }
    Check::ok(
        NAME,
        format!(
            "the agent's device plugin serves {} at {} and is registered with the kubelet ({} registrations)",
            opts.resource_name,
            ours.display(),
            registrations
        ),
    )
}

/// The Node's allocatable count of the resource, against the GPUs the agent advertises healthy.
pub(super) fn allocatable(opts: &Options, facts: &Facts) -> Check {
    const NAME: &str = "allocatable";
    if !facts.mock {
        return Check::skip(NAME, REAL_NODE);
    }
    let healthy = match device_plugin_metrics(facts, opts) {
        Err(why) => return Check::skip(NAME, why),
        Ok(None) => {
            return Check::skip(
                NAME,
                "the agent runs without --device-plugin (see device-plugin)",
            );
        }
        Ok(Some(_)) if stood_down(facts) => {
            return Check::skip(
                NAME,
                "the agent's device plugin stands down for another plugin (see device-plugin)",
            );
        }
        Ok(Some(healthy)) => healthy,
    };
    let view = match &facts.cluster {
        None => return Check::skip(NAME, NO_API),
        Some(Err(e)) => return api_failed(NAME, e),
        Some(Ok(view)) => view,
    };
    let res = &opts.resource_name;
    let node = &opts.node_name;
    let Some(allocatable) = &view.allocatable else {
        return Check::fail(
            NAME,
            format!("the API server has no node {node}"),
            "pass --node-name with the node's name in Kubernetes",
        );
    };
    let count = allocatable.get(res).and_then(|v| v.parse::<f64>().ok());
    match count {
        Some(n) if n == healthy => Check::ok(
            NAME,
            format!("node {node} has {n} {res} allocatable, the GPUs the agent advertises healthy"),
        ),
        Some(n) => Check::fail(
            NAME,
            format!(
                "node {node} has {n} {res} allocatable, the agent advertises {healthy} healthy GPUs"
            ),
            "the kubelet updates the node within seconds: run the doctor again; if it stays, see \
             the kubelet's log for the device plugin",
        ),
        None => Check::fail(
            NAME,
            format!("node {node} has no {res} allocatable"),
            "see the kubelet's log for the device plugin's registration; restarting the agent \
             registers it again",
        ),
    }
}

/// The agent's GpuNode: there, `Ready` True, its heartbeat fresh.
pub(super) fn gpunode(opts: &Options, facts: &Facts) -> Check {
    const NAME: &str = "gpunode";
    let view = match &facts.cluster {
        None => return Check::skip(NAME, NO_API),
        Some(Err(e)) => return api_failed(NAME, e),
        Some(Ok(view)) => view,
    };
    let node = &opts.node_name;
    let Some(object) = &view.gpunode else {
        return Check::fail(
            NAME,
            format!("no GpuNode {node} (or the GpuNode CRD is not installed)"),
            "install the chart's CRD (gpunodes.mockgpu.io) and run the agent with credentials \
             (--report auto: its service account or --kubeconfig); its log says why a report fails",
        );
    };
    let status = object.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::READY);
    match ready {
        Some(c) if c.status == "True" => {}
        Some(c) => {
            return Check::fail(
                NAME,
                format!("GpuNode {node} is not Ready ({}: {})", c.reason, c.message),
                "see the agent's log; restart it if it stopped",
            );
        }
        None => {
            return Check::fail(
                NAME,
                format!(
                    "GpuNode {node} has no Ready condition: the agent has not reported its status"
                ),
                "see the agent's log (\"cannot report the GpuNode\"), and its RBAC: gpunodes/status patch",
            );
        }
    }
    let limit = opts.heartbeat.mul_f64(f64::from(FRESH_HEARTBEATS) * 1.1);
    let age = status
        .last_heartbeat
        .as_ref()
        .map(|t| view.now.duration_since(t.0))
        .map(|d| Duration::try_from(d).unwrap_or(Duration::ZERO));
    let spec = &object.spec;
    match age {
        Some(age) if age <= limit => Check::ok(
            NAME,
            format!(
                "GpuNode {node} reported: {} {}, {} GPUs, {} held, Ready, last heartbeat {}s ago",
                match spec.mode {
                    mockgpu_api::gpunode::Mode::Mock => "mock",
                    mockgpu_api::gpunode::Mode::Real => "real",
                },
                spec.profile,
                spec.gpu_count,
                status.held_gpus,
                age.as_secs()
            ),
        ),
        Some(age) => Check::fail(
            NAME,
            format!(
                "GpuNode {node}'s last heartbeat is {}s old, more than {FRESH_HEARTBEATS} heartbeats of {}s",
                age.as_secs(),
                opts.heartbeat.as_secs()
            ),
            "the agent stopped reporting: see its log for API errors (it retries by itself), or \
             pass --heartbeat with the agent's",
        ),
        None => Check::fail(
            NAME,
            format!("GpuNode {node} has no heartbeat"),
            "see the agent's log (\"cannot report the GpuNode\")",
        ),
    }
}

fn api_failed(name: &'static str, error: &str) -> Check {
    Check::fail(
        name,
        format!("cannot read from the API server: {error}"),
        "check the credentials (the service account, --kubeconfig) and the RBAC: nodes get, \
         gpunodes get",
    )
}
