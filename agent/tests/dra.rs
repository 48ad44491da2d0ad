//! The DRA driver's kubelet plugin against a test playing the kubelet: it finds the registration
//! sockets in a temporary kubelet directory, asks `GetInfo` as the kubelet's plugin watcher
//! does, dials the endpoint named and prepares and unprepares claims there. The claims come from
//! a fake API server (a map of ResourceClaims); what is checked is the gRPC answers, the CDI
//! spec files and the checkpoint.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult, OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use mockgpu_agent::dra::proto::dra::dra_plugin_client::DraPluginClient;
use mockgpu_agent::dra::proto::dra::{
    Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
};
use mockgpu_agent::dra::proto::registration::registration_client::RegistrationClient;
use mockgpu_agent::dra::proto::registration::{InfoRequest, RegistrationStatus};
use mockgpu_agent::dra::{self, ClaimSource, Config, Driver, Prepared};
use mockgpu_api::NodeTopology;
use mockgpu_api::dra::{AllocationMode, ChannelConfig};
use tokio::sync::{oneshot, watch};
use tonic::transport::{Channel, Endpoint};

/// Bound on every wait for the plugin.
const WAIT: Duration = Duration::from_secs(10);

/// ResourceClaims by `namespace/name`.
#[derive(Clone, Default)]
struct Claims(Arc<Mutex<BTreeMap<String, ResourceClaim>>>);

impl ClaimSource for Claims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        let key = format!("{namespace}/{name}");
        self.0
            .lock()
            .unwrap()
            .get(&key)
            .cloned()
            .ok_or_else(|| format!("resourceclaims \"{name}\" not found"))
    }
}

impl Claims {
    fn add(&self, claim: ResourceClaim) {
        let key = format!(
            "{}/{}",
            claim.metadata.namespace.as_deref().unwrap(),
            claim.metadata.name.as_deref().unwrap()
        );
        self.0.lock().unwrap().insert(key, claim);
    }
}

fn claim(
    name: &str,
    uid: &str,
    results: &[(&str, &str, &str)],
    config: Vec<DeviceAllocationConfiguration>,
) -> ResourceClaim {
    let mut c = ResourceClaim::default();
    c.metadata.namespace = Some("ns".into());
    c.metadata.name = Some(name.into());
    c.metadata.uid = Some(uid.into());
    let results = results
        .iter()
        .map(|(driver, device, request)| DeviceRequestAllocationResult {
            driver: (*driver).into(),
            pool: "node0".into(),
            device: (*device).into(),
            request: (*request).into(),
            ..Default::default()
        })
        .collect();
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

fn topology() -> NodeTopology {
    let (mut topo, _) = common::fixed_tree("gb300");
    topo.node_name = "node0".into();
    topo
}

async fn dial(socket: &Path) -> Channel {
    Endpoint::from_shared(format!("unix://{}", socket.display()))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn wait_for_socket(socket: &Path) {
    tokio::time::timeout(WAIT, async {
        while !socket.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no socket {}", socket.display()));
}

fn uid_claim(uid: &str, name: &str) -> Claim {
    Claim {
        namespace: "ns".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

#[tokio::test]
async fn the_kubelet_registers_the_drivers_and_prepares_claims_through_cdi() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = dir.path().join("kubelet");
    let cdi_dir = dir.path().join("cdi");
    let config = Config::new(vec![Driver::Gpu, Driver::Channel], &kubelet, &cdi_dir).unwrap();
    let topo = topology();
    let claims = Claims::default();
    let prepared = Arc::new(Prepared::load(&config.checkpoint()));
    let mut listed = prepared.subscribe();
    let (stop, stopped) = oneshot::channel::<()>();
    let plugins = tokio::spawn({
        let (config, claims, prepared) = (config.clone(), claims.clone(), prepared.clone());
        let topology = watch::channel(Some(topo.clone())).1;
        async move {
            dra::serve_plugins(&config, claims, topology, prepared, async {
                let _ = stopped.await;
            })
            .await
        }
    });

    // The plugin watcher's view: both drivers, each naming its own endpoint.
    for driver in [Driver::Gpu, Driver::Channel] {
        let reg = config.registration_socket(driver);
        wait_for_socket(&reg).await;
        let mut client = RegistrationClient::new(dial(&reg).await);
        let info = client.get_info(InfoRequest {}).await.unwrap().into_inner();
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, driver.name());
        assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
        assert_eq!(Path::new(&info.endpoint), config.plugin_socket(driver));
        client
            .notify_registration_status(RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            })
            .await
            .unwrap();
    }
    assert_eq!(
        config.registration_socket(Driver::Gpu),
        kubelet.join("plugins_registry/gpu.nvidia.com-reg.sock")
    );

    // Two GPUs by the GPU driver.
    claims.add(claim(
        "two",
        "u-1",
        &[
            ("gpu.nvidia.com", "gpu-0", "gpus"),
            ("gpu.nvidia.com", "gpu-2", "gpus"),
        ],
        vec![],
    ));
    let mut gpus = DraPluginClient::new(dial(&config.plugin_socket(Driver::Gpu)).await);
    let answer = gpus
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![uid_claim("u-1", "two"), uid_claim("u-x", "missing")],
        })
        .await
        .unwrap()
        .into_inner();
    let ok = &answer.claims["u-1"];
    assert_eq!(ok.error, "");
    let ids: Vec<&str> = ok
        .devices
        .iter()
        .map(|d| d.cdi_device_ids[0].as_str())
        .collect();
    assert_eq!(
        ids,
        [
            "k8s.gpu.nvidia.com/claim=u-1-gpu-0",
            "k8s.gpu.nvidia.com/claim=u-1-gpu-2"
        ]
    );
    assert_eq!(ok.devices[1].pool_name, "node0");
    assert_eq!(ok.devices[1].device_name, "gpu-2");
    // A claim the API server does not have is named in the error, the others still prepared.
    assert!(
        answer.claims["u-x"]
            .error
            .starts_with("cannot read claim ns/missing: resourceclaims \"missing\" not found"),
        "{}",
        answer.claims["u-x"].error
    );
    let spec_file = cdi_dir.join("k8s.gpu.nvidia.com-claim_u-1.json");
    let spec: serde_json::Value = serde_json::from_slice(&fs::read(&spec_file).unwrap()).unwrap();
    assert_eq!(spec["kind"], "k8s.gpu.nvidia.com/claim");
    assert_eq!(spec["devices"][1]["name"], "u-1-gpu-2");
    assert_eq!(
        spec["devices"][1]["containerEdits"]["deviceNodes"][0]["path"],
        format!("/dev/nvidia{}", topo.gpus[2].minor)
    );
    tokio::time::timeout(WAIT, listed.changed())
        .await
        .unwrap()
        .unwrap();
    let record = listed.borrow_and_update().clone();
    assert_eq!(record.len(), 1);
    assert_eq!(
        record[0].gpus,
        [topo.gpus[0].uuid.clone(), topo.gpus[2].uuid.clone()]
    );

    // A claim whose UID is not the kubelet's (recreated under the same name) is refused.
    let answer = gpus
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![uid_claim("u-old", "two")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.claims["u-old"].error,
        "claim ns/two has UID u-1, the kubelet asked for u-old"
    );

    // A ComputeDomain's channel claim, all channels.
    let parameters = serde_json::to_value(ChannelConfig::new("cd-1", AllocationMode::All)).unwrap();
    claims.add(claim(
        "channel",
        "u-2",
        &[("compute-domain.nvidia.com", "channel-0", "channel")],
        vec![DeviceAllocationConfiguration {
            source: "FromClass".into(),
            requests: Some(vec!["channel".into()]),
            opaque: Some(OpaqueDeviceConfiguration {
                driver: "compute-domain.nvidia.com".into(),
                parameters: RawExtension(parameters),
            }),
        }],
    ));
    let mut channels = DraPluginClient::new(dial(&config.plugin_socket(Driver::Channel)).await);
    let answer = channels
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![uid_claim("u-2", "channel")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims["u-2"].error, "");
    let spec: serde_json::Value = serde_json::from_slice(
        &fs::read(cdi_dir.join("k8s.compute-domain.nvidia.com-claim_u-2.json")).unwrap(),
    )
    .unwrap();
    let nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap();
    assert_eq!(nodes.len(), 2048);
    assert_eq!(nodes[5]["path"], "/dev/nvidia-caps-imex-channels/channel5");
    assert_eq!(nodes[5]["major"], topo.devices.imex_channels);

    // The checkpoint has both; a restarted agent reads them back.
    let again = Prepared::load(&config.checkpoint());
    let mut kept: Vec<(String, Option<String>)> = again
        .list()
        .into_iter()
        .map(|c| (c.uid, c.domain))
        .collect();
    kept.sort();
    assert_eq!(
        kept,
        [
            ("u-1".to_string(), None),
            ("u-2".to_string(), Some("cd-1".to_string()))
        ]
    );

    // Unprepare: the spec goes, the record too; twice is no error.
    for _ in 0..2 {
        let answer = gpus
            .node_unprepare_resources(NodeUnprepareResourcesRequest {
                claims: vec![uid_claim("u-1", "two")],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.claims["u-1"].error, "");
    }
    assert!(!spec_file.exists());
    assert_eq!(prepared.list().len(), 1);

    // A removed registration socket is served again (a kubelet's directory cleaned up).
    let reg = config.registration_socket(Driver::Gpu);
    fs::remove_file(&reg).unwrap();
    wait_for_socket(&reg).await;
    let mut client = RegistrationClient::new(dial(&reg).await);
    assert_eq!(
        client
            .get_info(InfoRequest {})
            .await
            .unwrap()
            .into_inner()
            .name,
        "gpu.nvidia.com"
    );

    // A successor (a rollout's surge agent) binds the channel driver's registration socket
    // anew, in one step (a rename over it, so the path is never missing).
    let successor = config.registration_socket(Driver::Channel);
    let fresh = dir.path().join("successor.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&fresh).unwrap();
    fs::rename(&fresh, &successor).unwrap();

    // Stopping removes the sockets, so the kubelet sees the plugins go; not the successor's.
    stop.send(()).unwrap();
    tokio::time::timeout(WAIT, plugins)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    for driver in [Driver::Gpu, Driver::Channel] {
        assert!(!config.plugin_socket(driver).exists());
    }
    assert!(!config.registration_socket(Driver::Gpu).exists());
    assert!(successor.exists(), "the successor's socket was removed");
}

#[test]
fn relative_directories_are_refused() {
    let e = Config::new(
        vec![Driver::Gpu],
        Path::new("var/lib/kubelet"),
        Path::new("/c"),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "kubelet directory \"var/lib/kubelet\" must be an absolute path"
    );
}
