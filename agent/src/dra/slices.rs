//! The node's ResourceSlices: one per driver, named `<node>-<driver>`, its pool named after the
//! node, owned by the Node. The GPU slice lists the GPUs that are healthy (a GPU a fault leaves
//! unhealthy is withdrawn, so no new claim gets it); the channel slice lists channel 0.
//!
//! Applied (server-side, field manager `mockgpu-agent`) whenever what they list changes, and
//! again when one is gone: the kubelet deletes a node's slices when it starts and when a
//! driver's plugin goes away.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourcePool, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use mockgpu_api::NodeTopology;
use mockgpu_api::dra;
use mockgpu_api::gpunode::AGENT_MANAGER;
use tokio::sync::watch;

use super::claims::Driver;
use crate::faults::FaultReport;

/// How often the slices are checked for having been deleted.
const CHECK: Duration = Duration::from_secs(5);

/// The devices of `driver` on `topo`'s node, without the GPUs in `unhealthy` (indices).
pub fn devices(driver: Driver, topo: &NodeTopology, unhealthy: &BTreeSet<u32>) -> Vec<Device> {
    match driver {
        Driver::Gpu => topo
            .gpus
            .iter()
            .filter(|g| {
                !unhealthy.contains(&g.index) && !topo.profile.failed_gpus.contains(&g.index)
            })
            .map(|g| dra::gpu_device(topo, g))
            .collect(),
        Driver::Channel => vec![dra::channel_device()],
    }
}

/// The slice of `driver` for node `node` (uid `node_uid`) listing `devices`.
pub fn slice(driver: Driver, node: &str, node_uid: &str, devices: Vec<Device>) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(dra::slice_name(node, driver.name())),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.into(),
                uid: node_uid.into(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: driver.name().into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation: 1,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..Default::default()
        },
    }
}

/// Keeps the slices of `drivers` for `node` until `stop` completes.
pub async fn publish(
    client: Client,
    node: String,
    drivers: Vec<Driver>,
    mut topology: watch::Receiver<Option<NodeTopology>>,
    mut faults: watch::Receiver<FaultReport>,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    let nodes: Api<Node> = Api::all(client.clone());
    let slices: Api<ResourceSlice> = Api::all(client);
    let mut node_uid = None;
    // what was applied last, by slice name
    let mut applied: Vec<(String, ResourceSlice)> = Vec::new();
    let mut failures = 0u32;
    loop {
        let topo = topology.borrow_and_update().clone();
        let unhealthy = faults.borrow_and_update().unhealthy.clone();
        if let Some(topo) = &topo {
            match sync(
                &nodes,
                &slices,
                &node,
                &mut node_uid,
                &drivers,
                topo,
                &unhealthy,
                &mut applied,
            )
            .await
            {
                Ok(()) => failures = 0,
                Err(e) => {
                    if failures == 0 {
                        tracing::warn!(error = %e, "cannot publish the ResourceSlices; retrying");
                    }
                    failures += 1;
                    applied.clear();
                }
            }
        }
        tokio::select! {
            _ = &mut stop => return,
            r = topology.changed() => if r.is_err() { return },
            _ = faults.changed() => {}
            _ = tokio::time::sleep(CHECK) => {}
        }
    }
}

/// Applies each slice that differs from what was applied last, or is gone.
#[allow(clippy::too_many_arguments)]
async fn sync(
    nodes: &Api<Node>,
    slices: &Api<ResourceSlice>,
    node: &str,
    node_uid: &mut Option<String>,
    drivers: &[Driver],
    topo: &NodeTopology,
    unhealthy: &BTreeSet<u32>,
    applied: &mut Vec<(String, ResourceSlice)>,
) -> Result<(), kube::Error> {
    let uid = match node_uid {
        Some(uid) => uid.clone(),
        None => {
            let uid = nodes.get(node).await?.metadata.uid.unwrap_or_default();
            *node_uid = Some(uid.clone());
            uid
        }
    };
    for driver in drivers {
        let want = slice(*driver, node, &uid, devices(*driver, topo, unhealthy));
        let name = dra::slice_name(node, driver.name());
        let same = applied.iter().any(|(n, s)| *n == name && *s == want);
        if same && slices.get_opt(&name).await?.is_some() {
            continue;
        }
        slices
            .patch(
                &name,
                &PatchParams::apply(AGENT_MANAGER).force(),
                &Patch::Apply(&want),
            )
            .await?;
        let count = want.spec.devices.as_ref().map_or(0, Vec::len);
        tracing::info!(slice = %name, devices = count, "ResourceSlice published");
        applied.retain(|(n, _)| *n != name);
        applied.push((name, want));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use mockgpu_api::{HostTopology, Profile};

    use super::*;

    #[test]
    fn unhealthy_gpus_are_withdrawn_and_the_slice_is_the_nodes_pool() {
        let host = HostTopology {
            cpus: mockgpu_api::CpuSet::from_ids(0..4),
            nr_cpu_ids: 4,
            ..Default::default()
        };
        let topo =
            NodeTopology::build(&Profile::builtin("gb300").unwrap(), "node0", &host).unwrap();
        let names = |d: &[Device]| d.iter().map(|d| d.name.clone()).collect::<Vec<_>>();
        let all = devices(Driver::Gpu, &topo, &BTreeSet::new());
        assert_eq!(names(&all), ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);
        let some = devices(Driver::Gpu, &topo, &BTreeSet::from([1]));
        assert_eq!(names(&some), ["gpu-0", "gpu-2", "gpu-3"]);
        assert_eq!(
            names(&devices(Driver::Channel, &topo, &BTreeSet::new())),
            ["channel-0"]
        );
        let s = slice(Driver::Gpu, "node0", "uid-0", all);
        assert_eq!(s.metadata.name.as_deref(), Some("node0-gpu.nvidia.com"));
        assert_eq!(s.spec.pool.name, "node0");
        assert_eq!(s.spec.node_name.as_deref(), Some("node0"));
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(json["kind"], "ResourceSlice");
        assert_eq!(json["metadata"]["ownerReferences"][0]["uid"], "uid-0");
        assert_eq!(
            json["spec"]["devices"][0]["attributes"]["productName"]["string"],
            "NVIDIA GB300"
        );
    }
}
