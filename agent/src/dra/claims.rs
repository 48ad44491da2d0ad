//! What preparing a claim means on this node: the devices of its allocation that are this
//! driver's and this node's, the CDI spec that gives them to containers, and the record the
//! GpuNode lists; and the prepared claims, kept in a checkpoint file so that a restarted agent
//! still knows them (the kubelet unprepares a claim only once).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use k8s_openapi::api::resource::v1::{DeviceAllocationConfiguration, ResourceClaim};
use mockgpu_api::dra::{self, ChannelConfig};
use mockgpu_api::{DeviceNode, NodeTopology, PreparedClaim};
use tokio::sync::watch;

use super::cdi::{self, Edits, Spec};
use super::proto::dra as api;

/// One of the two drivers the agent serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Driver {
    /// `gpu.nvidia.com`: a device per GPU.
    Gpu,
    /// `compute-domain.nvidia.com`: the node's IMEX channels.
    Channel,
}

impl Driver {
    /// The driver's name.
    pub fn name(self) -> &'static str {
        match self {
            Driver::Gpu => dra::GPU_DRIVER,
            Driver::Channel => dra::CHANNEL_DRIVER,
        }
    }

    /// The CDI vendor of its claim specs, NVIDIA's.
    pub fn cdi_vendor(self) -> &'static str {
        match self {
            Driver::Gpu => "k8s.gpu.nvidia.com",
            Driver::Channel => "k8s.compute-domain.nvidia.com",
        }
    }
}

/// A claim this node cannot prepare.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    /// The node's GPUs are not served yet.
    #[error("the node's GPUs are not served yet (the driver tree is not mounted)")]
    NotReady,
    /// The claim read is another object than the kubelet's.
    #[error("claim {namespace}/{name} has UID {found}, the kubelet asked for {wanted}")]
    Uid {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The UID read.
        found: String,
        /// The UID asked for.
        wanted: String,
    },
    /// The claim has no allocation.
    #[error("claim {0} is not allocated")]
    NotAllocated(String),
    /// A device the allocation names is none of this node's.
    #[error(
        "claim {claim}: device {device} of pool {pool} is not one of {driver}'s devices on this node ({known})"
    )]
    UnknownDevice {
        /// The claim.
        claim: String,
        /// The device.
        device: String,
        /// Its pool.
        pool: String,
        /// The driver.
        driver: &'static str,
        /// The devices there are.
        known: String,
    },
    /// A channel request without a ComputeDomain's configuration.
    #[error(
        "claim {0}: its channel request has no ComputeDomainChannelConfig (a ComputeDomain's ResourceClaimTemplate carries one)"
    )]
    NoChannelConfig(String),
    /// Channel 0 is another claim's.
    #[error("claim {claim}: the node's IMEX channels are held by claim {holder}")]
    ChannelsHeld {
        /// The claim.
        claim: String,
        /// The claim that holds them.
        holder: String,
    },
    /// The API server did not give the claim.
    #[error("cannot read claim {claim}: {reason}")]
    Read {
        /// The claim.
        claim: String,
        /// Why.
        reason: String,
    },
    /// A file could not be written.
    #[error("cannot write {path}: {reason}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// What preparing one claim comes to.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// What the GpuNode lists.
    pub record: PreparedClaim,
    /// The kubelet's answer.
    pub devices: Vec<api::Device>,
    /// The CDI spec.
    pub spec: Spec,
}

/// `namespace/name` of a claim.
fn claim_name(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Whether a configuration applies to the allocation result of `request` (a subrequest's
/// result, `req/sub`, takes its request's configuration).
fn applies(config: &DeviceAllocationConfiguration, request: &str) -> bool {
    let parent = request.split('/').next().unwrap_or(request);
    config
        .requests
        .as_ref()
        .is_none_or(|r| r.is_empty() || r.iter().any(|r| r == request || r == parent))
}

/// Plans `claim` for `driver` on `topo`'s node, with `held` the claims prepared already.
pub fn plan(
    driver: Driver,
    topo: &NodeTopology,
    claim: &ResourceClaim,
    held: &[PreparedClaim],
) -> Result<Plan, PrepareError> {
    let name = claim_name(claim);
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let allocation = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .ok_or_else(|| PrepareError::NotAllocated(name.clone()))?;
    let ours = allocation
        .results
        .iter()
        .flatten()
        .filter(|r| r.driver == driver.name() && r.pool == topo.node_name);
    let vendor = driver.cdi_vendor();
    let mut record = PreparedClaim {
        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
        name: claim.metadata.name.clone().unwrap_or_default(),
        uid: uid.clone(),
        driver: driver.name().into(),
        devices: Vec::new(),
        gpus: Vec::new(),
        domain: None,
        channels: None,
    };
    let (mut devices, mut cdi_devices) = (Vec::new(), Vec::new());
    for result in ours {
        let nodes = match driver {
            Driver::Gpu => {
                let gpu = topo
                    .gpus
                    .iter()
                    .find(|g| dra::gpu_device_name(g) == result.device)
                    .ok_or_else(|| unknown(driver, &name, result, topo))?;
                record.gpus.push(gpu.uuid.clone());
                vec![DeviceNode::gpu(gpu.minor)]
            }
            Driver::Channel => {
                if result.device != dra::channel_device_name(0) {
                    return Err(unknown(driver, &name, result, topo));
                }
                if let Some(holder) = held
                    .iter()
                    .find(|h| h.driver == driver.name() && h.uid != uid)
                {
                    return Err(PrepareError::ChannelsHeld {
                        claim: name,
                        holder: format!("{}/{}", holder.namespace, holder.name),
                    });
                }
                let config = allocation
                    .config
                    .iter()
                    .flatten()
                    .filter(|c| applies(c, &result.request))
                    .filter_map(|c| c.opaque.as_ref())
                    .filter(|o| o.driver == driver.name())
                    .find_map(|o| ChannelConfig::from_parameters(&o.parameters.0))
                    .ok_or_else(|| PrepareError::NoChannelConfig(name.clone()))?;
                // NVIDIA's driver gives a node off an NVLink fabric no channel
                let channels: Vec<u32> = if dra::clique_id(topo).is_empty() {
                    Vec::new()
                } else {
                    config.allocation_mode.channels().collect()
                };
                record.domain = Some(config.domain_id);
                record.channels = Some(channels.len() as u32);
                channels
                    .into_iter()
                    .map(|id| channel_node(topo, id))
                    .collect()
            }
        };
        record.devices.push(result.device.clone());
        let (cdi_name, qualified) = cdi::device_names(vendor, &uid, &result.device);
        cdi_devices.push(cdi::Device {
            name: cdi_name,
            container_edits: Edits {
                device_nodes: nodes.iter().map(cdi::Node::from).collect(),
                ..Default::default()
            },
        });
        devices.push(api::Device {
            request_names: vec![result.request.clone()],
            pool_name: result.pool.clone(),
            device_name: result.device.clone(),
            cdi_device_ids: vec![qualified],
            share_id: None,
        });
    }
    // What every GPU container needs besides its GPUs; NVIDIA's sets NVIDIA_VISIBLE_DEVICES=void
    // so that a runtime hook injects nothing more.
    let common = match driver {
        Driver::Gpu if !devices.is_empty() => Edits {
            env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
            device_nodes: topo
                .devices
                .control_nodes()
                .iter()
                .map(cdi::Node::from)
                .collect(),
        },
        _ => Edits::default(),
    };
    Ok(Plan {
        record,
        devices,
        spec: Spec::new(vendor, cdi_devices, common),
    })
}

fn unknown(
    driver: Driver,
    claim: &str,
    result: &k8s_openapi::api::resource::v1::DeviceRequestAllocationResult,
    topo: &NodeTopology,
) -> PrepareError {
    let known = match driver {
        Driver::Gpu => topo
            .gpus
            .iter()
            .map(dra::gpu_device_name)
            .collect::<Vec<_>>()
            .join(", "),
        Driver::Channel => dra::channel_device_name(0),
    };
    PrepareError::UnknownDevice {
        claim: claim.into(),
        device: result.device.clone(),
        pool: result.pool.clone(),
        driver: driver.name(),
        known,
    }
}

/// `/dev/nvidia-caps-imex-channels/channel<id>` with the node's IMEX major.
fn channel_node(topo: &NodeTopology, id: u32) -> DeviceNode {
    DeviceNode {
        path: format!("/dev/nvidia-caps-imex-channels/channel{id}"),
        major: topo.devices.imex_channels,
        minor: id,
        mode: 0o666,
    }
}

/// The claims prepared on this node, by driver and UID, kept in a checkpoint file and
/// published for the GpuNode.
pub struct Prepared {
    checkpoint: PathBuf,
    claims: Mutex<BTreeMap<(String, String), PreparedClaim>>,
    report: watch::Sender<Vec<PreparedClaim>>,
}

impl Prepared {
    /// The claims of the checkpoint at `checkpoint` (none when it does not exist). An
    /// unreadable checkpoint is kept aside as `<file>.unreadable`, not overwritten.
    pub fn load(checkpoint: &Path) -> Prepared {
        let claims: Vec<PreparedClaim> = match fs::read(checkpoint) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                let aside = checkpoint.with_extension("json.unreadable");
                tracing::warn!(file = %checkpoint.display(), error = %e, aside = %aside.display(), "the prepared claims' checkpoint is unreadable: kept aside, starting without it");
                let _ = fs::rename(checkpoint, &aside);
                Vec::new()
            }),
            Err(e) => {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(file = %checkpoint.display(), error = %e, "cannot read the prepared claims' checkpoint");
                }
                Vec::new()
            }
        };
        let claims: BTreeMap<_, _> = claims
            .into_iter()
            .map(|c| ((c.driver.clone(), c.uid.clone()), c))
            .collect();
        let report = watch::Sender::new(claims.values().cloned().collect());
        Prepared {
            checkpoint: checkpoint.to_path_buf(),
            claims: Mutex::new(claims),
            report,
        }
    }

    /// Follows the prepared claims.
    pub fn subscribe(&self) -> watch::Receiver<Vec<PreparedClaim>> {
        self.report.subscribe()
    }

    /// Every prepared claim.
    pub fn list(&self) -> Vec<PreparedClaim> {
        self.lock().values().cloned().collect()
    }

    /// Records `claim` (replacing an earlier record of it).
    pub fn insert(&self, claim: PreparedClaim) -> io::Result<()> {
        self.change(|claims| {
            claims.insert((claim.driver.clone(), claim.uid.clone()), claim);
        })
    }

    /// Forgets claim `uid` of `driver`; whether it was known.
    pub fn remove(&self, driver: Driver, uid: &str) -> io::Result<bool> {
        let mut known = false;
        self.change(|claims| {
            known = claims
                .remove(&(driver.name().to_string(), uid.to_string()))
                .is_some();
        })?;
        Ok(known)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), PreparedClaim>> {
        self.claims.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `edit`, writes the checkpoint (whole: a temporary file renamed over it) and
    /// publishes the claims.
    fn change(
        &self,
        edit: impl FnOnce(&mut BTreeMap<(String, String), PreparedClaim>),
    ) -> io::Result<()> {
        let mut claims = self.lock();
        edit(&mut claims);
        let list: Vec<PreparedClaim> = claims.values().cloned().collect();
        if let Some(dir) = self.checkpoint.parent() {
            fs::create_dir_all(dir)?;
        }
        let tmp = self.checkpoint.with_extension("json.tmp");
        fs::write(&tmp, serde_json::to_vec(&list).map_err(io::Error::other)?)?;
        fs::rename(&tmp, &self.checkpoint)?;
        self.report.send_replace(list);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
        OpaqueDeviceConfiguration, ResourceClaimStatus,
    };
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
    use mockgpu_api::dra::AllocationMode;
    use mockgpu_api::{HostTopology, Profile};

    use super::*;

    fn topo(profile: &str) -> NodeTopology {
        let host = HostTopology {
            cpus: mockgpu_api::CpuSet::from_ids(0..4),
            nr_cpu_ids: 4,
            ..Default::default()
        };
        NodeTopology::build(&Profile::builtin(profile).unwrap(), "node0", &host).unwrap()
    }

    fn result(driver: &str, device: &str, request: &str) -> DeviceRequestAllocationResult {
        DeviceRequestAllocationResult {
            driver: driver.into(),
            pool: "node0".into(),
            device: device.into(),
            request: request.into(),
            ..Default::default()
        }
    }

    fn claim(
        results: Vec<DeviceRequestAllocationResult>,
        config: Vec<DeviceAllocationConfiguration>,
    ) -> ResourceClaim {
        let mut c = ResourceClaim::default();
        c.metadata.namespace = Some("ns".into());
        c.metadata.name = Some("c".into());
        c.metadata.uid = Some("u-1".into());
        c.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: Some(config),
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        c
    }

    fn channel_config(mode: AllocationMode) -> DeviceAllocationConfiguration {
        DeviceAllocationConfiguration {
            source: "FromClaim".into(),
            requests: Some(vec!["channel".into()]),
            opaque: Some(OpaqueDeviceConfiguration {
                driver: dra::CHANNEL_DRIVER.into(),
                parameters: RawExtension(
                    serde_json::to_value(ChannelConfig::new("cd-uid", mode)).unwrap(),
                ),
            }),
        }
    }

    #[test]
    fn gpus_get_their_nodes_and_the_control_nodes() {
        let t = topo("gb300");
        let c = claim(
            vec![
                result(dra::GPU_DRIVER, "gpu-1", "gpus"),
                result(dra::GPU_DRIVER, "gpu-3", "gpus"),
                // another driver's, and another node's: not this plan's
                result(dra::CHANNEL_DRIVER, "channel-0", "channel"),
                DeviceRequestAllocationResult {
                    pool: "node9".into(),
                    ..result(dra::GPU_DRIVER, "gpu-0", "gpus")
                },
            ],
            vec![],
        );
        let p = plan(Driver::Gpu, &t, &c, &[]).unwrap();
        assert_eq!(p.record.devices, ["gpu-1", "gpu-3"]);
        assert_eq!(
            p.record.gpus,
            [t.gpus[1].uuid.clone(), t.gpus[3].uuid.clone()]
        );
        let ids: Vec<&str> = p
            .devices
            .iter()
            .map(|d| d.cdi_device_ids[0].as_str())
            .collect();
        assert_eq!(
            ids,
            [
                "k8s.gpu.nvidia.com/claim=u-1-gpu-1",
                "k8s.gpu.nvidia.com/claim=u-1-gpu-3"
            ]
        );
        assert_eq!(p.devices[0].request_names, ["gpus"]);
        let json = serde_json::to_value(&p.spec).unwrap();
        assert_eq!(
            json["devices"][1]["containerEdits"]["deviceNodes"][0]["path"],
            "/dev/nvidia3"
        );
        let common: Vec<&str> = json["containerEdits"]["deviceNodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            common,
            ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        );
        assert_eq!(
            json["containerEdits"]["env"][0],
            "NVIDIA_VISIBLE_DEVICES=void"
        );
    }

    #[test]
    fn what_cannot_be_prepared_is_named() {
        let t = topo("gb300");
        let c = claim(vec![result(dra::GPU_DRIVER, "gpu-9", "gpus")], vec![]);
        assert_eq!(
            plan(Driver::Gpu, &t, &c, &[]).unwrap_err().to_string(),
            "claim ns/c: device gpu-9 of pool node0 is not one of gpu.nvidia.com's devices on this node (gpu-0, gpu-1, gpu-2, gpu-3)"
        );
        let mut c = claim(vec![], vec![]);
        c.status = None;
        assert_eq!(
            plan(Driver::Gpu, &t, &c, &[]).unwrap_err(),
            PrepareError::NotAllocated("ns/c".into())
        );
        let c = claim(
            vec![result(dra::CHANNEL_DRIVER, "channel-0", "channel")],
            vec![],
        );
        assert_eq!(
            plan(Driver::Channel, &t, &c, &[]).unwrap_err(),
            PrepareError::NoChannelConfig("ns/c".into())
        );
    }

    #[test]
    fn channels_follow_the_domains_allocation_mode() {
        let t = topo("gb300");
        let results = vec![result(dra::CHANNEL_DRIVER, "channel-0", "channel")];
        let all = claim(results.clone(), vec![channel_config(AllocationMode::All)]);
        let p = plan(Driver::Channel, &t, &all, &[]).unwrap();
        assert_eq!(p.record.domain.as_deref(), Some("cd-uid"));
        assert_eq!(p.record.channels, Some(2048));
        let nodes = &p.spec.devices[0].container_edits.device_nodes;
        assert_eq!(nodes.len(), 2048);
        let last = serde_json::to_value(&nodes[2047]).unwrap();
        assert_eq!(last["path"], "/dev/nvidia-caps-imex-channels/channel2047");
        assert_eq!(last["major"], t.devices.imex_channels);
        assert_eq!(last["minor"], 2047);
        assert_eq!(
            p.devices[0].cdi_device_ids,
            ["k8s.compute-domain.nvidia.com/claim=u-1-channel-0"]
        );
        // no GPU environment on a channel claim
        assert!(p.spec.container_edits.env.is_empty());
        let single = claim(
            results.clone(),
            vec![channel_config(AllocationMode::Single)],
        );
        let p = plan(Driver::Channel, &t, &single, &[]).unwrap();
        assert_eq!(p.spec.devices[0].container_edits.device_nodes.len(), 1);
        // Another claim holds the node's channels.
        let other = PreparedClaim {
            uid: "u-2".into(),
            namespace: "ns".into(),
            name: "other".into(),
            ..p.record.clone()
        };
        assert_eq!(
            plan(Driver::Channel, &t, &single, &[other])
                .unwrap_err()
                .to_string(),
            "claim ns/c: the node's IMEX channels are held by claim ns/other"
        );
        // Off an NVLink fabric: prepared, without channels (as NVIDIA's driver does).
        let p = plan(Driver::Channel, &topo("h100"), &all, &[]).unwrap();
        assert_eq!(p.record.channels, Some(0));
        assert!(p.spec.devices[0].container_edits.device_nodes.is_empty());
    }

    #[test]
    fn the_checkpoint_keeps_claims_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("claims.json");
        let t = topo("gb300");
        let c = claim(vec![result(dra::GPU_DRIVER, "gpu-0", "gpus")], vec![]);
        let record = plan(Driver::Gpu, &t, &c, &[]).unwrap().record;
        let prepared = Prepared::load(&file);
        let mut follow = prepared.subscribe();
        prepared.insert(record.clone()).unwrap();
        assert!(follow.has_changed().unwrap());
        assert_eq!(*follow.borrow_and_update(), std::slice::from_ref(&record));
        let again = Prepared::load(&file);
        assert_eq!(again.list(), std::slice::from_ref(&record));
        assert!(again.remove(Driver::Gpu, "u-1").unwrap());
        assert!(!again.remove(Driver::Gpu, "u-1").unwrap());
        assert!(Prepared::load(&file).list().is_empty());
        // An unreadable checkpoint is kept aside.
        fs::write(&file, "{not json").unwrap();
        assert!(Prepared::load(&file).list().is_empty());
        assert_eq!(
            fs::read_to_string(dir.path().join("claims.json.unreadable")).unwrap(),
            "{not json"
        );
    }
}
