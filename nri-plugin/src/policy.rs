//! The injection policy: which containers hold GPUs, and what they get. Pure functions.

use std::path::Path;

use crate::{
    config::{DEFAULT_DIR, InjectionConfig},
    inventory::{Gpu, GpuInventory, Inventory},
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

/// Major number of the NVIDIA GPU and control device nodes.
pub const NVIDIA_MAJOR: i64 = 195;
/// Minor number of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: i64 = 255;
/// Environment variable naming the GPUs a container may use.
pub const VISIBLE_DEVICES_ENV: &str = "NVIDIA_VISIBLE_DEVICES";
/// CDI kind of NVIDIA GPUs.
pub const CDI_GPU_PREFIX: &str = "nvidia.com/gpu=";
/// The shim, relative to the container mount point.
pub const SHIM_PATH: &str = "lib/libmockfs.so";

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

/// The GPUs a container asks for; empty when it holds none (or is filtered out or opted out).
pub fn claims(pod: &PodSandbox, container: &Container, config: &InjectionConfig) -> Vec<Claim> {
    if !config.namespaces.is_empty() && !config.namespaces.contains(&pod.namespace) {
        return Vec::new();
    }
    if !config.containers.is_empty() && !config.containers.contains(&container.name) {
        return Vec::new();
    }
    if pod
        .annotations
        .get(&config.skip_annotation)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    {
        return Vec::new();
    }
    let mut claims = Vec::new();
    let devices = container
        .linux
        .as_ref()
        .map(|l| l.devices.as_slice())
        .unwrap_or_default();
    for device in devices {
        if let Some(minor) = gpu_device_minor(&device.path) {
            claims.push(Claim {
                selector: Selector::Minor(minor),
                source_kind: "device",
            });
        }
    }
    for cdi in &container.CDI_devices {
        if let Some(name) = cdi.name.strip_prefix(CDI_GPU_PREFIX) {
            claims.push(Claim {
                selector: parse_selector(name),
                source_kind: "CDI device",
            });
        }
    }
    if let Some(value) = env_value(&container.env, VISIBLE_DEVICES_ENV) {
        let value = value.trim();
        if !matches!(value, "" | "void" | "none") {
            claims.extend(
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
        claims.push(Claim {
            selector: Selector::All,
            source_kind: "annotation",
        });
    }
    claims
}

/// `/dev/nvidia<N>` → N.
fn gpu_device_minor(path: &str) -> Option<u32> {
    let digits = path.strip_prefix("/dev/nvidia")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
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
    if claims.is_empty() {
        return Ok(Decision::Untouched);
    }
    let inventory = inventory
        .snapshot()
        .map_err(|not_ready| PolicyError::NotReady {
            tree: config.host_dir.join("fs").display().to_string(),
            reason: not_ready.0,
        })?;
    let gpus: Vec<Gpu> = resolve(&claims, &inventory)?.into_iter().cloned().collect();
    let adjustment = adjustment(container, config, &gpus, inventory.uvm_major);
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
    uvm_major: u32,
) -> ContainerAdjustment {
    let dest = &config.container_dir;
    let mut adjust = ContainerAdjustment::new();
    adjust
        .mounts
        .push(mount(&config.host_dir, dest, &["rbind", "rslave", "ro"]));
    if config.ld_so_preload {
        adjust.mounts.push(mount(
            &config.host_dir.join("ld.so.preload"),
            Path::new("/etc/ld.so.preload"),
            &["bind", "ro"],
        ));
    }
    let shim = dest.join(SHIM_PATH).display().to_string();
    let existing = env_value(&container.env, "LD_PRELOAD");
    // Remove first, then set: this overrides an earlier plugin's value without an ownership
    // conflict (the runtime's merge clears the claim on removal).
    adjust.env.push(key_value("-LD_PRELOAD", ""));
    adjust
        .env
        .push(key_value("LD_PRELOAD", &preload_value(existing, &shim)));
    if dest != Path::new(DEFAULT_DIR) {
        adjust.env.push(key_value(
            "MOCKFS_ROOT",
            &dest.join("fs").display().to_string(),
        ));
    }
    let present: Vec<&str> = container
        .linux
        .as_ref()
        .map(|l| l.devices.iter().map(|d| d.path.as_str()).collect())
        .unwrap_or_default();
    let mut devices: Vec<LinuxDevice> = gpus
        .iter()
        .map(|g| {
            char_device(
                &format!("/dev/nvidia{}", g.minor),
                NVIDIA_MAJOR,
                g.minor.into(),
            )
        })
        .collect();
    let uvm = i64::from(uvm_major);
    devices.push(char_device("/dev/nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR));
    devices.push(char_device("/dev/nvidia-uvm", uvm, 0));
    devices.push(char_device("/dev/nvidia-uvm-tools", uvm, 1));
    devices.retain(|d| !present.contains(&d.path.as_str()));
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

fn key_value(key: &str, value: &str) -> KeyValue {
    let mut kv = KeyValue::new();
    kv.key = key.into();
    kv.value = value.into();
    kv
}

fn char_device(path: &str, major: i64, minor: i64) -> LinuxDevice {
    let mut device = LinuxDevice::new();
    device.path = path.into();
    device.type_ = "c".into();
    device.major = major;
    device.minor = minor;
    let mut mode = OptionalFileMode::new();
    mode.value = 0o666;
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

    fn inventory() -> Fixed {
        Fixed(Ok(GpuInventory {
            gpus: (0..4)
                .map(|i| Gpu {
                    index: i,
                    minor: i,
                    uuid: format!("GPU-{i}"),
                    bus_id: format!("0000:0{i}:00.0"),
                })
                .collect(),
            uvm_major: 510,
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

    fn cfg() -> InjectionConfig {
        InjectionConfig::default()
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
        let a = adjustment(&c, &cfg(), gpus, 510);
        assert_eq!(a.mounts.len(), 2);
        assert_eq!(
            (
                a.mounts[0].source.as_str(),
                a.mounts[0].destination.as_str(),
                a.mounts[0].type_.as_str()
            ),
            ("/run/mockgpu", "/run/mockgpu", "bind")
        );
        assert_eq!(a.mounts[0].options, ["rbind", "rslave", "ro"]);
        assert_eq!(a.mounts[1].source, "/run/mockgpu/ld.so.preload");
        assert_eq!(a.mounts[1].destination, "/etc/ld.so.preload");
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
                ("/dev/nvidia-uvm", 510, 0),
                ("/dev/nvidia-uvm-tools", 510, 1)
            ]
        );
        assert!(
            a.linux
                .devices
                .iter()
                .all(|d| d.type_ == "c" && d.file_mode.value == 0o666)
        );
    }

    #[test]
    fn custom_destination_sets_mockfs_root_and_preload_file_is_optional() {
        let mut config = cfg();
        config.container_dir = "/opt/mock".into();
        config.host_dir = "/var/lib/mock".into();
        config.ld_so_preload = false;
        let a = adjustment(&container("c", &[], &[], &[]), &config, &[], 511);
        assert_eq!(a.mounts.len(), 1);
        assert_eq!(a.mounts[0].source, "/var/lib/mock");
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
    fn gpu_device_paths() {
        assert_eq!(gpu_device_minor("/dev/nvidia12"), Some(12));
        assert_eq!(gpu_device_minor("/dev/nvidiactl"), None);
        assert_eq!(gpu_device_minor("/dev/nvidia-uvm"), None);
        assert_eq!(gpu_device_minor("/dev/nvidia"), None);
    }
}
