//! The injection policy: which containers hold GPUs, and what they get. Pure functions.

use std::path::Path;

use mockgpu_api::Gpu;
use mockgpu_api::devices::{self, DeviceNode, DeviceNumbers};

use crate::{
    config::InjectionConfig,
    inventory::{GpuInventory, Inventory},
    proto::api::{
        Container, ContainerAdjustment, ContainerState, KeyValue, LinuxContainerAdjustment,
        LinuxDevice, Mount, OptionalFileMode, PodSandbox,
    },
};

/// Errors that keep a GPU-holding container from getting the mock.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The inventory has no GPUs to offer yet.
    #[error(
        "mockgpu: driver tree not ready on this node (agent not serving {tree}): {reason}; \
         check that the mockgpu agent runs on this node and has mounted its driver tree"
    )]
    NotReady {
        /// The tree containers would read, on the host.
        tree: String,
        /// Why, from the inventory.
        reason: String,
    },
    /// The container asks for a GPU the node does not have.
    #[error(
        "mockgpu: container asks for GPU {selector:?} (from {source_kind}) but this node has {available}"
    )]
    UnknownGpu {
        /// The GPU as named by the container.
        selector: String,
        /// Where the name came from.
        source_kind: &'static str,
        /// The node's GPUs, in words.
        available: String,
    },
}

/// Environment variable naming the GPUs a container may use.
pub const VISIBLE_DEVICES_ENV: &str = "NVIDIA_VISIBLE_DEVICES";
/// CDI kind of NVIDIA GPUs.
pub const CDI_GPU_PREFIX: &str = "nvidia.com/gpu=";

/// How a container names a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Every GPU of the node.
    All,
    /// By device minor (`/dev/nvidia<minor>`).
    Minor(u32),
    /// By index.
    Index(u32),
    /// By UUID (or any other name that must match a UUID).
    Uuid(String),
}

/// A GPU request together with where it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The GPU as named.
    pub selector: Selector,
    /// Where: `device`, `CDI device`, `NVIDIA_VISIBLE_DEVICES` or `annotation`.
    pub source_kind: &'static str,
}

/// The GPUs a container asks for, split by whether they count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claims {
    /// Claims that count: GPU devices the container holds (granted by Kubernetes: a device
    /// plugin, a privileged or hostPath device), and in trusted namespaces also
    /// `NVIDIA_VISIBLE_DEVICES` and the opt-in annotation.
    pub granted: Vec<Claim>,
    /// `NVIDIA_VISIBLE_DEVICES` or annotation claims of a pod outside the trusted namespaces:
    /// ignored, so that no pod can give itself device access it would not have had.
    pub untrusted: Vec<Claim>,
}

/// The GPUs a container asks for; none when it holds none (or is filtered out or opted out).
pub fn claims(pod: &PodSandbox, container: &Container, config: &InjectionConfig) -> Claims {
    let mut claims = Claims::default();
    if !config.namespaces.is_empty() && !config.namespaces.contains(&pod.namespace) {
        return claims;
    }
    if !config.containers.is_empty() && !config.containers.contains(&container.name) {
        return claims;
    }
    if pod
        .annotations
        .get(&config.skip_annotation)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    {
        return claims;
    }
    let devices = container
        .linux
        .as_ref()
        .map(|l| l.devices.as_slice())
        .unwrap_or_default();
    for device in devices {
        if let Some(minor) = devices::gpu_minor(&device.path) {
            claims.granted.push(Claim {
                selector: Selector::Minor(minor),
                source_kind: "device",
            });
        }
    }
    for cdi in &container.CDI_devices {
        if let Some(name) = cdi.name.strip_prefix(CDI_GPU_PREFIX) {
            claims.granted.push(Claim {
                selector: parse_selector(name),
                source_kind: "CDI device",
            });
        }
    }
    let mut asked = Vec::new();
    if let Some(value) = env_value(&container.env, VISIBLE_DEVICES_ENV) {
        let value = value.trim();
        if !matches!(value, "" | "void" | "none") {
            asked.extend(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| Claim {
                        selector: parse_selector(s),
                        source_kind: VISIBLE_DEVICES_ENV,
                    }),
            );
        }
    }
    let opted_in = pod
        .annotations
        .get(&config.inject_annotation)
        .is_some_and(|names| names.split(',').any(|n| n.trim() == container.name));
    if opted_in {
        asked.push(Claim {
            selector: Selector::All,
            source_kind: "annotation",
        });
    }
    if config.trusted_namespaces.contains(&pod.namespace) {
        claims.granted.extend(asked);
    } else {
        claims.untrusted = asked;
    }
    claims
}

fn parse_selector(name: &str) -> Selector {
    if name == "all" {
        Selector::All
    } else if let Ok(index) = name.parse() {
        Selector::Index(index)
    } else {
        Selector::Uuid(name.to_owned())
    }
}

/// The value of the last `KEY=value` entry for `key`.
fn env_value<'a>(env: &'a [String], key: &str) -> Option<&'a str> {
    env.iter()
        .rev()
        .find_map(|kv| kv.strip_prefix(key).and_then(|rest| rest.strip_prefix('=')))
}

/// Maps claims onto the inventory's GPUs, ordered by minor and without duplicates.
pub fn resolve<'a>(
    claims: &[Claim],
    inventory: &'a GpuInventory,
) -> Result<Vec<&'a Gpu>, PolicyError> {
    let mut gpus: Vec<&Gpu> = Vec::new();
    for claim in claims {
        let found: Vec<&Gpu> = match &claim.selector {
            Selector::All => inventory.gpus.iter().collect(),
            Selector::Minor(m) => inventory.gpus.iter().filter(|g| g.minor == *m).collect(),
            Selector::Index(i) => inventory.gpus.iter().filter(|g| g.index == *i).collect(),
            Selector::Uuid(u) => inventory.gpus.iter().filter(|g| &g.uuid == u).collect(),
        };
        if found.is_empty() {
            return Err(PolicyError::UnknownGpu {
                selector: match &claim.selector {
                    Selector::All => "all".into(),
                    Selector::Minor(m) => format!("/dev/nvidia{m}"),
                    Selector::Index(i) => i.to_string(),
                    Selector::Uuid(u) => u.clone(),
                },
                source_kind: claim.source_kind,
                available: describe(inventory),
            });
        }
        gpus.extend(found);
    }
    gpus.sort_by_key(|g| g.minor);
    gpus.dedup_by_key(|g| g.minor);
    Ok(gpus)
}

fn describe(inventory: &GpuInventory) -> String {
    let gpus: Vec<String> = inventory
        .gpus
        .iter()
        .map(|g| format!("{} (minor {}, {})", g.index, g.minor, g.uuid))
        .collect();
    format!("GPUs {}", gpus.join(", "))
}

/// What to do with one container.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Not a GPU holder: the empty adjustment.
    Untouched,
    /// A GPU holder: inject, and pin these GPUs.
    Inject {
        /// The adjustment for the runtime.
        adjustment: ContainerAdjustment,
        /// The GPUs the container holds, ordered by minor.
        gpus: Vec<Gpu>,
    },
}

/// Decides the adjustment for a container being created.
pub fn decide(
    pod: &PodSandbox,
    container: &Container,
    config: &InjectionConfig,
    inventory: &dyn Inventory,
) -> Result<Decision, PolicyError> {
    let claims = claims(pod, container, config);
    // (a container granted devices, by a device plugin for one, carries their
    // NVIDIA_VISIBLE_DEVICES too: only a request that would go without is worth a warning)
    if !claims.untrusted.is_empty() && claims.granted.is_empty() {
        let mut by: Vec<&str> = claims.untrusted.iter().map(|c| c.source_kind).collect();
        by.dedup();
        tracing::warn!(
            namespace = %pod.namespace, pod = %pod.name, container = %container.name, ?by,
            "GPU request ignored: the pod's namespace is not in trusted_namespaces"
        );
    }
    // A real driver serves real GPUs: the container gets them from their real owner.
    if claims.granted.is_empty() || inventory.real_driver() {
        return Ok(Decision::Untouched);
    }
    let inventory = inventory
        .snapshot()
        .map_err(|not_ready| PolicyError::NotReady {
            tree: config.layout().mount_point().display().to_string(),
            reason: not_ready.0,
        })?;
    let gpus: Vec<Gpu> = resolve(&claims.granted, &inventory)?
        .into_iter()
        .cloned()
        .collect();
    let adjustment = adjustment(container, config, &gpus, &inventory.devices);
    Ok(Decision::Inject { adjustment, gpus })
}

/// Whether a container found by Synchronize still runs (or is about to).
pub fn is_live(container: &Container) -> bool {
    !matches!(
        container.state.enum_value(),
        Ok(ContainerState::CONTAINER_STOPPED)
    )
}

/// Builds the adjustment for a GPU-holding container.
pub fn adjustment(
    container: &Container,
    config: &InjectionConfig,
    gpus: &[Gpu],
    numbers: &DeviceNumbers,
) -> ContainerAdjustment {
    let layout = config.layout();
    let mut adjust = ContainerAdjustment::new();
    set_mount(
        &mut adjust,
        mount(
            layout.host_dir(),
            layout.container_dir(),
            &["rbind", "rslave", "ro"],
        ),
    );
    if config.ld_so_preload {
        set_mount(
            &mut adjust,
            mount(
                &layout.ld_so_preload(),
                Path::new("/etc/ld.so.preload"),
                &["bind", "ro"],
            ),
        );
    }
    // The mock NVML and nvidia-smi where the NVIDIA container toolkit puts the driver's: every
    // glibc image's loader finds the library by name (docs/nri.md, "The NVML and nvidia-smi").
    for tool in layout.tool_mounts(std::env::consts::ARCH) {
        set_mount(
            &mut adjust,
            mount(&tool.source, &tool.destination, &["bind", "ro"]),
        );
    }
    let shim = layout.container_shim().display().to_string();
    let existing = env_value(&container.env, "LD_PRELOAD");
    set_env(&mut adjust, "LD_PRELOAD", &preload_value(existing, &shim));
    if !layout.container_root_is_default() {
        set_env(
            &mut adjust,
            "MOCKFS_ROOT",
            &layout.container_root().display().to_string(),
        );
    }
    // Devices need no removal: a later plugin sees an earlier one's devices in `container`
    // and adds none of them again.
    let present: Vec<&str> = container
        .linux
        .as_ref()
        .map(|l| l.devices.iter().map(|d| d.path.as_str()).collect())
        .unwrap_or_default();
    let devices: Vec<LinuxDevice> = gpus
        .iter()
        .map(|g| DeviceNode::gpu(g.minor))
        .chain(numbers.control_nodes())
        .filter(|node| !present.contains(&node.path.as_str()))
        .map(|node| char_device(&node))
        .collect();
    if !devices.is_empty() {
        let mut linux = LinuxContainerAdjustment::new();
        linux.devices = devices;
        adjust.linux = Some(linux).into();
    }
    adjust
}

/// `shim` first, then the existing entries (separated by `:` or spaces) without `shim`.
pub fn preload_value(existing: Option<&str>, shim: &str) -> String {
    let rest = existing
        .into_iter()
        .flat_map(|v| v.split([':', ' ']))
        .filter(|entry| !entry.is_empty() && *entry != shim);
    std::iter::once(shim)
        .chain(rest)
        .collect::<Vec<_>>()
        .join(":")
}

fn mount(source: &Path, destination: &Path, options: &[&str]) -> Mount {
    let mut m = Mount::new();
    m.source = source.display().to_string();
    m.destination = destination.display().to_string();
    m.type_ = "bind".into();
    m.options = options.iter().map(|o| (*o).to_owned()).collect();
    m
}

// Each mount and variable is removed first, then set: the runtime's merge clears the claim on
// removal, so a second plugin that sets the same one (the other agent's, while a rollout runs
// two) overrides it instead of failing the container's creation ("plugins ... both tried to set").

fn set_mount(adjust: &mut ContainerAdjustment, m: Mount) {
    let mut removal = Mount::new();
    removal.destination = format!("-{}", m.destination);
    adjust.mounts.push(removal);
    adjust.mounts.push(m);
}

fn set_env(adjust: &mut ContainerAdjustment, key: &str, value: &str) {
    adjust.env.push(key_value(&format!("-{key}"), ""));
    adjust.env.push(key_value(key, value));
}

fn key_value(key: &str, value: &str) -> KeyValue {
    let mut kv = KeyValue::new();
    kv.key = key.into();
    kv.value = value.into();
    kv
}

fn char_device(node: &DeviceNode) -> LinuxDevice {
    let mut device = LinuxDevice::new();
    device.path.clone_from(&node.path);
    device.type_ = "c".into();
    device.major = node.major.into();
    device.minor = node.minor.into();
    let mut mode = OptionalFileMode::new();
    mode.value = node.mode;
    device.file_mode = Some(mode).into();
    device
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{inventory::NotReady, proto::api::CDIDevice};

    struct Fixed(Result<GpuInventory, NotReady>);

    impl Inventory for Fixed {
        fn snapshot(&self) -> Result<GpuInventory, NotReady> {
            self.0.clone()
        }
    }

    /// The majors a host that lists 509 and 510 leaves for the mock.
    fn numbers() -> DeviceNumbers {
        let host = mockgpu_api::ProcDevices::parse(
            "Character devices:\n  1 mem\n384 a\n509 aux\n510 rpmb\n",
        )
        .unwrap();
        DeviceNumbers::choose(&host).unwrap()
    }

    fn inventory() -> Fixed {
        Fixed(Ok(GpuInventory {
            gpus: (0..4)
                .map(|i| Gpu {
                    index: i,
                    minor: i,
                    uuid: format!("GPU-{i}"),
                    bus_id: format!("0000:0{i}:00.0").parse().unwrap(),
                    irq: 0,
                    socket: 0,
                    numa_node: -1,
                    cpus: Default::default(),
                })
                .collect(),
            devices: numbers(),
        }))
    }

    fn pod(annotations: &[(&str, &str)]) -> PodSandbox {
        let mut pod = PodSandbox::new();
        pod.namespace = "slurm".into();
        pod.annotations = annotations
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        pod
    }

    fn container(name: &str, env: &[&str], devices: &[&str], cdi: &[&str]) -> Container {
        let mut c = Container::new();
        c.name = name.into();
        c.env = env.iter().map(|e| (*e).into()).collect();
        let mut linux = crate::proto::api::LinuxContainer::new();
        linux.devices = devices
            .iter()
            .map(|p| {
                let mut d = LinuxDevice::new();
                d.path = (*p).into();
                d
            })
            .collect();
        c.linux = Some(linux).into();
        c.CDI_devices = cdi
            .iter()
            .map(|n| {
                let mut d = CDIDevice::new();
                d.name = (*n).into();
                d
            })
            .collect();
        c
    }

    fn minors(d: &Decision) -> Vec<u32> {
        match d {
            Decision::Inject { gpus, .. } => gpus.iter().map(|g| g.minor).collect(),
            Decision::Untouched => vec![],
        }
    }

    /// The test pods' namespace is trusted.
    fn cfg() -> InjectionConfig {
        InjectionConfig {
            trusted_namespaces: vec!["slurm".into()],
            ..Default::default()
        }
    }

    #[test]
    fn visible_devices_values() {
        let p = pod(&[]);
        let run = |v: &str| decide(&p, &container("c", &[v], &[], &[]), &cfg(), &inventory());
        assert_eq!(
            run("NVIDIA_VISIBLE_DEVICES=void").unwrap(),
            Decision::Untouched
        );
        assert_eq!(
            run("NVIDIA_VISIBLE_DEVICES=none").unwrap(),
            Decision::Untouched
        );
        assert_eq!(run("NVIDIA_VISIBLE_DEVICES=").unwrap(), Decision::Untouched);
        assert_eq!(
            minors(&run("NVIDIA_VISIBLE_DEVICES=all").unwrap()),
            [0, 1, 2, 3]
        );
        assert_eq!(minors(&run("NVIDIA_VISIBLE_DEVICES=2,0").unwrap()), [0, 2]);
        assert_eq!(minors(&run("NVIDIA_VISIBLE_DEVICES=GPU-3").unwrap()), [3]);
        assert!(matches!(
            run("NVIDIA_VISIBLE_DEVICES=7"),
            Err(PolicyError::UnknownGpu {
                source_kind: VISIBLE_DEVICES_ENV,
                ..
            })
        ));
        // A similar-looking key is not the variable.
        assert_eq!(
            run("NVIDIA_VISIBLE_DEVICES_X=all").unwrap(),
            Decision::Untouched
        );
    }

    #[test]
    fn devices_cdi_and_annotations() {
        let inv = inventory();
        let p = pod(&[]);
        let dev = container(
            "slurmd",
            &[],
            &["/dev/nvidia1", "/dev/nvidiactl", "/dev/null"],
            &[],
        );
        assert_eq!(minors(&decide(&p, &dev, &cfg(), &inv).unwrap()), [1]);
        let cdi = container("c", &[], &[], &["nvidia.com/gpu=0", "vendor.com/x=1"]);
        assert_eq!(minors(&decide(&p, &cdi, &cfg(), &inv).unwrap()), [0]);
        let opt_in = pod(&[("mockgpu.io/inject", "slurmd, other")]);
        assert_eq!(
            minors(&decide(&opt_in, &container("slurmd", &[], &[], &[]), &cfg(), &inv).unwrap()),
            [0, 1, 2, 3]
        );
        // The annotation names containers, never the whole pod (the musl sidecar stays clean).
        assert_eq!(
            decide(&opt_in, &container("logfile", &[], &[], &[]), &cfg(), &inv).unwrap(),
            Decision::Untouched
        );
        let skip = pod(&[("mockgpu.io/skip", "true")]);
        assert_eq!(
            decide(&skip, &dev, &cfg(), &inv).unwrap(),
            Decision::Untouched
        );
    }

    #[test]
    fn namespace_and_container_filters() {
        let inv = inventory();
        let c = container("slurmd", &["NVIDIA_VISIBLE_DEVICES=all"], &[], &[]);
        let mut config = cfg();
        config.namespaces = vec!["other".into()];
        assert_eq!(
            decide(&pod(&[]), &c, &config, &inv).unwrap(),
            Decision::Untouched
        );
        config.namespaces = vec!["slurm".into()];
        config.containers = vec!["slurmd".into()];
        assert_ne!(
            decide(&pod(&[]), &c, &config, &inv).unwrap(),
            Decision::Untouched
        );
        config.containers = vec!["x".into()];
        assert_eq!(
            decide(&pod(&[]), &c, &config, &inv).unwrap(),
            Decision::Untouched
        );
    }

    #[test]
    fn not_ready_says_what_to_fix_and_plain_containers_do_not_ask() {
        let broken = Fixed(Err(NotReady("no GPUs under /x".into())));
        let plain = container("c", &["PATH=/bin"], &["/dev/null"], &[]);
        assert_eq!(
            decide(&pod(&[]), &plain, &cfg(), &broken).unwrap(),
            Decision::Untouched
        );
        let gpu = container("c", &["NVIDIA_VISIBLE_DEVICES=all"], &[], &[]);
        let msg = decide(&pod(&[]), &gpu, &cfg(), &broken)
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("mockgpu: driver tree not ready on this node (agent not serving /run/mockgpu/fs): no GPUs under /x"),
            "{msg}"
        );
    }

    #[test]
    fn adjustment_contents() {
        let c = container(
            "c",
            &["LD_PRELOAD=/other.so /run/mockgpu/lib/libmockfs.so"],
            &["/dev/nvidia0"],
            &[],
        );
        let inv = inventory().0.unwrap();
        let gpus = &inv.gpus[..2];
        let a = adjustment(&c, &cfg(), gpus, &numbers());
        let mounts: Vec<(&str, &str, &str)> = a
            .mounts
            .iter()
            .map(|m| (m.source.as_str(), m.destination.as_str(), m.type_.as_str()))
            .collect();
        // each removed first: another plugin's same mount is overridden, not a conflict
        assert_eq!(
            mounts[..4],
            [
                ("", "-/run/mockgpu", ""),
                ("/run/mockgpu", "/run/mockgpu", "bind"),
                ("", "-/etc/ld.so.preload", ""),
                ("/run/mockgpu/ld.so.preload", "/etc/ld.so.preload", "bind")
            ]
        );
        assert_eq!(a.mounts[1].options, ["rbind", "rslave", "ro"]);
        assert_eq!(a.mounts[3].options, ["bind", "ro"]);
        assert_eq!(tools(&a), expected_tools("/run/mockgpu"));
        let env: Vec<(&str, &str)> = a
            .env
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_str()))
            .collect();
        assert_eq!(
            env,
            [
                ("-LD_PRELOAD", ""),
                ("LD_PRELOAD", "/run/mockgpu/lib/libmockfs.so:/other.so")
            ]
        );
        let devices: Vec<(&str, i64, i64)> = a
            .linux
            .devices
            .iter()
            .map(|d| (d.path.as_str(), d.major, d.minor))
            .collect();
        assert_eq!(
            devices,
            [
                ("/dev/nvidia1", 195, 1),
                ("/dev/nvidiactl", 195, 255),
                ("/dev/nvidia-uvm", 385, 0),
                ("/dev/nvidia-uvm-tools", 385, 1)
            ]
        );
        assert!(
            a.linux
                .devices
                .iter()
                .all(|d| d.type_ == "c" && d.file_mode.value == 0o666)
        );
    }

    /// The mounts after the driver tree's and `ld.so.preload`'s: (source, destination, options),
    /// each checked to be preceded by its removal.
    fn tools(a: &ContainerAdjustment) -> Vec<(String, String, String)> {
        let start = a
            .mounts
            .iter()
            .position(|m| m.destination.starts_with("-/usr/"))
            .unwrap_or(a.mounts.len());
        a.mounts[start..]
            .chunks(2)
            .map(|pair| {
                assert_eq!(pair[0].destination, format!("-{}", pair[1].destination));
                assert_eq!(pair[1].type_, "bind");
                (
                    pair[1].source.clone(),
                    pair[1].destination.clone(),
                    pair[1].options.join(","),
                )
            })
            .collect()
    }

    /// The NVML under both names in Debian's multiarch directory of this architecture and in
    /// `/usr/lib64`, and nvidia-smi, read-only, from the host directory `host`.
    fn expected_tools(host: &str) -> Vec<(String, String, String)> {
        let multiarch = format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH);
        let lib = format!("{host}/lib/libnvidia-ml.so.1");
        let mut expected: Vec<(String, String, String)> = [multiarch.as_str(), "/usr/lib64"]
            .iter()
            .flat_map(|dir| {
                [
                    format!("{dir}/libnvidia-ml.so.1"),
                    format!("{dir}/libnvidia-ml.so"),
                ]
            })
            .map(|d| (lib.clone(), d, "bind,ro".to_owned()))
            .collect();
        expected.push((
            format!("{host}/bin/nvidia-smi"),
            "/usr/bin/nvidia-smi".into(),
            "bind,ro".into(),
        ));
        expected
    }

    #[test]
    fn the_nvml_and_nvidia_smi_reach_gpu_containers_only() {
        let inv = inventory();
        let gpu = container("c", &[], &["/dev/nvidia2"], &[]);
        let Decision::Inject { adjustment, .. } = decide(&pod(&[]), &gpu, &cfg(), &inv).unwrap()
        else {
            panic!("not injected")
        };
        assert_eq!(tools(&adjustment), expected_tools("/run/mockgpu"));
        let plain = container("c", &["NVIDIA_VISIBLE_DEVICES=void"], &["/dev/null"], &[]);
        assert_eq!(
            decide(&pod(&[]), &plain, &cfg(), &inv).unwrap(),
            Decision::Untouched
        );
        let skipped = pod(&[("mockgpu.io/skip", "true")]);
        assert_eq!(
            decide(&skipped, &gpu, &cfg(), &inv).unwrap(),
            Decision::Untouched
        );
    }

    #[test]
    fn custom_destination_sets_mockfs_root_and_preload_file_is_optional() {
        let mut config = cfg();
        config.container_dir = "/opt/mock".into();
        config.host_dir = "/var/lib/mock".into();
        config.ld_so_preload = false;
        let a = adjustment(&container("c", &[], &[], &[]), &config, &[], &numbers());
        assert_eq!(a.mounts[0].destination, "-/opt/mock");
        assert_eq!(a.mounts[1].source, "/var/lib/mock");
        // no ld.so.preload; the tools come from the host directory
        assert_eq!(tools(&a), expected_tools("/var/lib/mock"));
        assert_eq!(a.mounts.len(), 2 + 2 * expected_tools("/x").len());
        assert!(
            a.env
                .iter()
                .any(|kv| kv.key == "LD_PRELOAD" && kv.value == "/opt/mock/lib/libmockfs.so")
        );
        assert!(
            a.env
                .iter()
                .any(|kv| kv.key == "MOCKFS_ROOT" && kv.value == "/opt/mock/fs")
        );
        let keys: Vec<&str> = a.env.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(
            keys,
            ["-LD_PRELOAD", "LD_PRELOAD", "-MOCKFS_ROOT", "MOCKFS_ROOT"]
        );
    }

    #[test]
    fn a_second_plugin_after_the_first_adds_no_device_and_keeps_the_preload() {
        // the runtime hands the next plugin the container as the first one's adjustment left it
        let inv = inventory().0.unwrap();
        let gpus = &inv.gpus[..2];
        let first = adjustment(
            &container("c", &["LD_PRELOAD=/other.so"], &["/dev/nvidia0"], &[]),
            &cfg(),
            gpus,
            &numbers(),
        );
        let preload = |a: &ContainerAdjustment| {
            a.env
                .iter()
                .find(|kv| kv.key == "LD_PRELOAD")
                .map(|kv| format!("LD_PRELOAD={}", kv.value))
                .unwrap()
        };
        let mut devices = vec!["/dev/nvidia0"];
        devices.extend(first.linux.devices.iter().map(|d| d.path.as_str()));
        let merged = container("c", &[preload(&first).as_str()], &devices, &[]);
        let second = adjustment(&merged, &cfg(), gpus, &numbers());
        assert!(
            second.linux.devices.is_empty(),
            "{:?}",
            second.linux.devices
        );
        assert_eq!(preload(&second), preload(&first));
        assert_eq!(second.mounts, first.mounts);
    }

    #[test]
    fn preload_merging() {
        let shim = "/run/mockgpu/lib/libmockfs.so";
        assert_eq!(preload_value(None, shim), shim);
        assert_eq!(preload_value(Some(""), shim), shim);
        assert_eq!(
            preload_value(Some(&format!("a.so:{shim} b.so")), shim),
            format!("{shim}:a.so:b.so")
        );
    }

    #[test]
    fn host_majors_are_never_injected() {
        // The host lists 509 and 510 (where fixed guesses of nvidia-uvm's major land).
        let inv = inventory().0.unwrap();
        let c = container("c", &["NVIDIA_VISIBLE_DEVICES=all"], &[], &[]);
        let Decision::Inject { adjustment, .. } =
            decide(&pod(&[]), &c, &cfg(), &inventory()).unwrap()
        else {
            panic!("not injected")
        };
        let majors: Vec<i64> = adjustment.linux.devices.iter().map(|d| d.major).collect();
        assert_eq!(majors.len(), 7, "{majors:?}");
        for major in majors {
            assert!(
                major == 195 || major == i64::from(inv.devices.uvm),
                "{major}"
            );
            assert!(![1, 384, 509, 510].contains(&major), "{major}");
        }
    }

    #[test]
    fn a_real_driver_means_nothing_is_injected() {
        struct Real;
        impl Inventory for Real {
            fn snapshot(&self) -> Result<GpuInventory, NotReady> {
                Err(NotReady("no mock tree on a real node".into()))
            }
            fn real_driver(&self) -> bool {
                true
            }
        }
        let c = container("c", &[], &["/dev/nvidia0"], &[]);
        assert_eq!(
            decide(&pod(&[]), &c, &cfg(), &Real).unwrap(),
            Decision::Untouched
        );
    }

    #[test]
    fn untrusted_namespaces_get_nothing_from_env_or_annotation() {
        let inv = inventory();
        let mut p = pod(&[("mockgpu.io/inject", "slurmd")]);
        p.namespace = "tenant".into();
        let env_only = container("slurmd", &["NVIDIA_VISIBLE_DEVICES=all"], &[], &[]);
        assert_eq!(
            decide(&p, &env_only, &cfg(), &inv).unwrap(),
            Decision::Untouched
        );
        let claims = claims(&p, &env_only, &cfg());
        assert!(claims.granted.is_empty());
        assert_eq!(claims.untrusted.len(), 2);
        // The default trusts no namespace at all.
        let default = InjectionConfig::default();
        assert_eq!(
            decide(&pod(&[]), &env_only, &default, &inv).unwrap(),
            Decision::Untouched
        );
        // GPU devices granted by Kubernetes count everywhere; the env cannot widen them.
        let dev = container(
            "slurmd",
            &["NVIDIA_VISIBLE_DEVICES=all"],
            &["/dev/nvidia2"],
            &[],
        );
        assert_eq!(minors(&decide(&p, &dev, &cfg(), &inv).unwrap()), [2]);
        assert_eq!(minors(&decide(&p, &dev, &default, &inv).unwrap()), [2]);
    }
}
