//! Loading the served tree at `nvmlInit`, and the devices the handles point to.

use alloc::boxed::Box;
use alloc::vec::Vec;

use crate::ffi::{self, Ret};
use crate::parse::{self, BusId};
use crate::sys::{self, Access, Lock};

/// One GPU: what the driver files and `nvml/gpus/<bus>` say, and what callers set.
#[derive(Default)]
pub struct Device {
    pub index: u32,
    pub minor: u32,
    pub name: Vec<u8>,
    pub uuid: Vec<u8>,
    pub vbios: Vec<u8>,
    pub bus: BusId,
    /// `device << 16 | vendor`.
    pub pci_device_id: u32,
    /// `subsystem device << 16 | subsystem vendor`.
    pub pci_subsystem_id: u32,
    pub class: u32,
    pub numa_node: i32,
    pub cpus: Vec<u32>,
    pub architecture: u32,
    pub compute_capability: (u32, u32),
    pub brand: u32,
    pub serial: Vec<u8>,
    pub board_part_number: Vec<u8>,
    /// Image, OEM, ECC, power.
    pub inforom: [Vec<u8>; 4],
    pub memory_total: u64,
    pub memory_reserved: u64,
    pub bar1_total: u64,
    /// Usage, limit (default), min, max; mW.
    pub power: [u32; 4],
    /// Current, slowdown, shutdown, GPU max, memory max; °C.
    pub temperatures: [u32; 5],
    pub fan_speed: Option<u32>,
    pub graphics_max: u32,
    pub graphics_default: u32,
    pub memory_clock: u32,
    pub video_max: u32,
    pub supported_graphics: Vec<u32>,
    pub ecc: bool,
    pub nvlink_version: Option<u32>,
    pub nvlink_remotes: Vec<BusId>,
    pub fabric: Option<([u8; 16], u32)>,
    /// Fallen off the bus when the tree was read: only its minor, UUID and bus id are known.
    pub lost: bool,
    /// Corrected and uncorrected ECC errors (volatile and aggregate alike).
    pub ecc_errors: [u64; 2],
    /// Rows remapped (before Ampere: pages retired) for uncorrectable errors.
    pub retired: u32,
    /// A remapping (retirement) waits for a reset.
    pub retired_pending: bool,
    pub remap_failure: bool,
    /// Over the slowdown temperature.
    pub thermal: bool,
    /// One bit per NVLink that is down.
    pub nvlink_down: u32,
    /// Settable: the application graphics clock and the locked clock range (MHz).
    pub app_graphics: u32,
    pub locked: Option<(u32, u32)>,
}

impl Device {
    /// The handle callers hold.
    pub fn handle(&self) -> ffi::Device {
        core::ptr::from_ref(self).cast_mut().cast()
    }

    /// Whether `h` is this device's handle.
    pub fn is(&self, h: ffi::Device) -> bool {
        core::ptr::addr_eq(self, h)
    }

    /// The graphics clock now: the locked range's top when locked, else the application clock.
    pub fn graphics_now(&self) -> u32 {
        self.locked
            .map_or(self.app_graphics, |(_, max)| max.min(self.app_graphics))
    }
}

/// What `nvmlInit` loaded.
pub struct Loaded {
    pub driver_version: Vec<u8>,
    /// `1000 * major + 10 * minor`.
    pub cuda_version: u32,
    /// Boxed: a handle is a device's address, which must not move.
    #[allow(clippy::vec_box)]
    pub devices: Vec<Box<Device>>,
    /// The GPUs the driver excluded (`GPU Excluded: Yes`): not enumerated, listed apart.
    pub excluded: Vec<Device>,
}

impl Loaded {
    /// The device a handle points to (compared by address; never dereferenced unchecked).
    pub fn device(&mut self, h: ffi::Device) -> Option<&mut Device> {
        self.devices.iter_mut().map(|d| &mut **d).find(|d| d.is(h))
    }
}

/// The library's state: how many `nvmlInit` calls are not yet shut down, and the tree.
pub struct State {
    refs: u32,
    pub loaded: Option<Loaded>,
}

pub static STATE: Lock<State> = Lock::new(State {
    refs: 0,
    loaded: None,
});

/// `nvmlInit*`: loads the tree on the first call, counts the others.
pub fn init(flags: u32) -> Ret {
    let mut s = STATE.lock();
    if s.loaded.is_none() {
        match load(flags) {
            Ok(l) => s.loaded = Some(l),
            Err(code) => return code,
        }
    }
    s.refs = s.refs.saturating_add(1);
    ffi::SUCCESS
}

/// `nvmlShutdown`: drops the tree with the last reference.
pub fn shutdown() -> Ret {
    let mut s = STATE.lock();
    if s.refs == 0 {
        return ffi::ERROR_UNINITIALIZED;
    }
    s.refs = s.refs.saturating_sub(1);
    if s.refs == 0 {
        s.loaded = None;
    }
    ffi::SUCCESS
}

/// Runs `f` on the loaded tree (`NVML_ERROR_UNINITIALIZED` before `nvmlInit`).
pub fn with_loaded(f: impl FnOnce(&mut Loaded) -> Ret) -> Ret {
    match STATE.lock().loaded.as_mut() {
        Some(l) => f(l),
        None => ffi::ERROR_UNINITIALIZED,
    }
}

/// Runs `f` on the device `h` points to (`NVML_ERROR_INVALID_ARGUMENT` for anything else,
/// `NVML_ERROR_GPU_IS_LOST` for a GPU fallen off the bus).
pub fn with_device(h: ffi::Device, f: impl FnOnce(&mut Device) -> Ret) -> Ret {
    with_any_device(h, |d| if d.lost { ffi::ERROR_GPU_IS_LOST } else { f(d) })
}

/// Runs `f` on the device `h` points to, lost or not.
pub fn with_any_device(h: ffi::Device, f: impl FnOnce(&mut Device) -> Ret) -> Ret {
    with_loaded(|l| l.device(h).map_or(ffi::ERROR_INVALID_ARGUMENT, f))
}

/// The mock root: `$MOCKFS_ROOT`, unset or empty meaning `/run/mockgpu/fs`.
pub fn root() -> &'static [u8] {
    sys::env(c"MOCKFS_ROOT")
        .filter(|r| !r.is_empty())
        .unwrap_or(b"/run/mockgpu/fs")
}

/// `root/rel`.
pub fn join(root: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut p = root.to_vec();
    for part in parts {
        if p.last() != Some(&b'/') {
            p.push(b'/');
        }
        p.extend_from_slice(part);
    }
    p
}

/// A malformed file: logged once, reported as `NVML_ERROR_UNKNOWN`.
fn malformed(path: &[u8], what: &[u8]) -> Ret {
    sys::log(&[path, b": ", what]);
    ffi::ERROR_UNKNOWN
}

/// The file at `path`, as a malformed tree when it is missing.
fn required_file(path: &[u8]) -> Result<Vec<u8>, Ret> {
    sys::read_file(path).ok_or_else(|| malformed(path, b"cannot be read"))
}

/// Reads the tree; `NVML_ERROR_DRIVER_NOT_LOADED` without one.
fn load(flags: u32) -> Result<Loaded, Ret> {
    let root = root();
    let version_path = join(root, &[b"proc/driver/nvidia/version"]);
    let version = sys::read_file(&version_path).ok_or(ffi::ERROR_DRIVER_NOT_LOADED)?;
    let driver_version = parse::driver_version(&version)
        .ok_or_else(|| malformed(&version_path, b"no driver version on the NVRM version line"))?
        .to_vec();
    let gpus_dir = join(root, &[b"proc/driver/nvidia/gpus"]);
    let names = sys::list_dir(&gpus_dir).ok_or(ffi::ERROR_DRIVER_NOT_LOADED)?;
    let system_path = join(root, &[SYSTEM_FILE]);
    let system = required_file(&system_path)?;
    let cuda_version = parse::Fields::new(&system)
        .get("CUDA Driver Version")
        .and_then(parse::number_u32)
        .ok_or_else(|| malformed(&system_path, b"no `CUDA Driver Version:` number"))?;
    let mut devices = Vec::with_capacity(names.len());
    let mut excluded = Vec::new();
    for name in &names {
        match load_device(root, name)? {
            (d, false) => devices.push(Box::new(d)),
            (d, true) => excluded.push(d),
        }
    }
    // A GPU fallen off the bus has left the driver's directory; its `nvml/` file remains.
    for name in sys::list_dir(&join(root, &[GPUS_DIR])).unwrap_or_default() {
        if !names.contains(&name) {
            devices.extend(load_lost(root, &name)?.map(Box::new));
        }
    }
    if devices.is_empty() && flags & ffi::INIT_FLAG_NO_GPUS == 0 {
        return Err(ffi::ERROR_DRIVER_NOT_LOADED);
    }
    devices.sort_by_key(|d| d.minor);
    excluded.sort_by_key(|d| d.minor);
    if sys::env(c"MOCKFS_DEV") != Some(b"1") {
        let access: Vec<Access> = devices
            .iter()
            .map(|d| sys::probe_device(alloc::format!("/dev/nvidia{}", d.minor).as_bytes()))
            .collect();
        let mut shown = access.iter().map(|&a| visible(&access, a));
        devices.retain(|_| shown.next().unwrap_or(true));
    }
    for (index, d) in (0u32..).zip(devices.iter_mut()) {
        d.index = index;
    }
    Ok(Loaded {
        driver_version,
        cuda_version,
        devices,
        excluded,
    })
}

/// Whether a GPU whose `/dev/nvidia<minor>` answered `access` is this process's, given how every
/// GPU's node answered (`all`): as on a real node, a GPU the device cgroup denies is not listed
/// (Slurm's `ConstrainDevices`), nor one whose node the container was not given, when it was given
/// some. With no node at all (a host's `/dev`, as under `exec` without the shim) every GPU is.
/// `MOCKFS_DEV=1` (`exec`: the shim serves `/dev/nvidia*` from the tree) skips the probe.
fn visible(all: &[Access], access: Access) -> bool {
    match access {
        Access::Allowed => true,
        Access::Denied => false,
        Access::Missing => all.iter().all(|&a| a == Access::Missing),
    }
}

/// Where the agent renders the NVML data (`mockgpu_api::nvml`; the keys below are that module's
/// `key`s: the integration tests render with it and read through this library).
const SYSTEM_FILE: &[u8] = b"nvml/system";
const GPUS_DIR: &[u8] = b"nvml/gpus";

/// The GPU of `nvml/gpus/<name>` when it fell off the bus (`Fallen Off The Bus: Yes`): its bus
/// id, minor and UUID.
fn load_lost(root: &[u8], name: &[u8]) -> Result<Option<Device>, Ret> {
    let path = join(root, &[GPUS_DIR, name]);
    let text = required_file(&path)?;
    let fields = parse::Fields::new(&text);
    if fields.get("Fallen Off The Bus") != Some(b"Yes") {
        return Ok(None);
    }
    let bad = |what: &[u8]| malformed(&path, what);
    Ok(Some(Device {
        minor: fields
            .get("Device Minor")
            .and_then(parse::number_u32)
            .ok_or_else(|| bad(b"no `Device Minor:` number"))?,
        uuid: fields
            .get("GPU UUID")
            .ok_or_else(|| bad(b"no `GPU UUID:` line"))?
            .to_vec(),
        bus: BusId::parse(name).ok_or_else(|| bad(b"is not named by a PCI address"))?,
        lost: true,
        ..Device::default()
    }))
}

/// One GPU from `proc/driver/nvidia/gpus/<name>/information`, its sysfs device and its
/// `nvml/gpus/<bus>` file, and whether the driver excluded it.
fn load_device(root: &[u8], name: &[u8]) -> Result<(Device, bool), Ret> {
    let info_path = join(root, &[b"proc/driver/nvidia/gpus", name, b"information"]);
    let info_text = required_file(&info_path)?;
    let info = parse::Fields::new(&info_text);
    let field = |key: &'static str| {
        info.get(key)
            .ok_or_else(|| malformed(&info_path, alloc::format!("no `{key}:` line").as_bytes()))
    };
    let bus_text = field("Bus Location")?;
    let bus = BusId::parse(bus_text)
        .ok_or_else(|| malformed(&info_path, b"`Bus Location:` is not a PCI address"))?;
    let minor = parse::number_u32(field("Device Minor")?)
        .ok_or_else(|| malformed(&info_path, b"`Device Minor:` is not a number"))?;
    let name_value = field("Model")?.to_vec();
    let uuid = field("GPU UUID")?.to_vec();
    let vbios = field("Video BIOS")?.to_ascii_uppercase();

    let sys_path = join(root, &[b"sys/bus/pci/devices", bus_text]);
    let sys_dir =
        sys::Dir::open(&sys_path).ok_or_else(|| malformed(&sys_path, b"cannot be opened"))?;
    let attr = |attr: &'static str| {
        let path = join(&sys_path, &[attr.as_bytes()]);
        sys_dir
            .read(attr.as_bytes())
            .map(|text| (path.clone(), text))
            .ok_or_else(|| malformed(&path, b"cannot be read"))
    };
    let id = |attr_name: &'static str| {
        let (path, text) = attr(attr_name)?;
        parse::number_u32(&text).ok_or_else(|| malformed(&path, b"not a number"))
    };
    let (vendor, device) = (id("vendor")?, id("device")?);
    let (sub_vendor, sub_device) = (id("subsystem_vendor")?, id("subsystem_device")?);
    let class = id("class")?;
    let (numa_path, numa_text) = attr("numa_node")?;
    let numa_node =
        parse::numa_node(&numa_text).ok_or_else(|| malformed(&numa_path, b"not a NUMA node"))?;
    let (cpus_path, cpus_text) = attr("local_cpulist")?;
    let cpus =
        parse::cpu_list(&cpus_text).ok_or_else(|| malformed(&cpus_path, b"not a CPU list"))?;

    let nvml_path = join(root, &[GPUS_DIR, bus_text]);
    let nvml_text = required_file(&nvml_path)?;
    let nvml = parse::Fields::new(&nvml_text);
    let text = |key: &'static str| {
        nvml.get(key)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| malformed(&nvml_path, alloc::format!("no `{key}:` line").as_bytes()))
    };
    let num64 = |key: &'static str| {
        let v = nvml
            .get(key)
            .ok_or_else(|| malformed(&nvml_path, alloc::format!("no `{key}:` line").as_bytes()))?;
        parse::number(v).ok_or_else(|| {
            malformed(
                &nvml_path,
                alloc::format!("`{key}:` is not a number").as_bytes(),
            )
        })
    };
    let num = |key: &'static str| {
        num64(key).and_then(|n| {
            u32::try_from(n).map_err(|_| {
                malformed(
                    &nvml_path,
                    alloc::format!("`{key}:` is too large").as_bytes(),
                )
            })
        })
    };
    let optional = |key: &'static str| nvml.get(key).is_some();
    let cc = text("Compute Capability")?;
    let compute_capability = cc
        .iter()
        .position(|&b| b == b'.')
        .and_then(|dot| {
            let major = parse::number_u32(cc.get(..dot)?)?;
            Some((major, parse::number_u32(cc.get(dot.saturating_add(1)..)?)?))
        })
        .ok_or_else(|| malformed(&nvml_path, b"`Compute Capability:` is not like 9.0"))?;
    let supported_graphics = parse::numbers(&text("Supported Graphics Clocks")?)
        .filter(|l| !l.is_empty())
        .ok_or_else(|| malformed(&nvml_path, b"`Supported Graphics Clocks:` is not a list"))?;
    let nvlink_remotes = match nvml.get("NVLink Remote") {
        None => Vec::new(),
        Some(list) => list
            .split(|&b| b == b',')
            .map(BusId::parse)
            .collect::<Option<Vec<_>>>()
            .filter(|l| l.len() <= ffi::NVLINK_MAX_LINKS as usize)
            .ok_or_else(|| {
                malformed(
                    &nvml_path,
                    b"`NVLink Remote:` is not a list of up to 18 PCI addresses",
                )
            })?,
    };
    let fabric = match nvml.get("Fabric Cluster UUID") {
        None => None,
        Some(u) => Some((
            parse::uuid_bytes(u)
                .ok_or_else(|| malformed(&nvml_path, b"`Fabric Cluster UUID:` is not a UUID"))?,
            num("Fabric Clique ID")?,
        )),
    };
    let graphics_default = num("Graphics Clock Default")?;
    let yes = |key: &'static str| nvml.get(key) == Some(b"Yes");
    let count = |key: &'static str| {
        if optional(key) { num64(key) } else { Ok(0) }
    };
    let mut nvlink_down = 0u32;
    if let Some(list) = nvml.get("NVLink Down") {
        for link in parse::numbers(list)
            .filter(|l| l.iter().all(|&n| (n as usize) < nvlink_remotes.len()))
            .ok_or_else(|| malformed(&nvml_path, b"`NVLink Down:` is not a list of links"))?
        {
            nvlink_down |= 1u32.checked_shl(link).unwrap_or(0);
        }
    }
    let excluded = info
        .get("GPU Excluded")
        .is_some_and(|v| v.eq_ignore_ascii_case(b"yes"));
    let device = Device {
        index: 0,
        minor,
        name: name_value,
        uuid,
        vbios,
        bus,
        pci_device_id: device.wrapping_shl(16) | vendor,
        pci_subsystem_id: sub_device.wrapping_shl(16) | sub_vendor,
        class,
        numa_node,
        cpus,
        architecture: num("Architecture")?,
        compute_capability,
        brand: num("Brand")?,
        serial: text("Serial")?,
        board_part_number: text("Board Part Number")?,
        inforom: [
            text("InfoROM Image")?,
            text("InfoROM OEM")?,
            text("InfoROM ECC")?,
            text("InfoROM Power")?,
        ],
        memory_total: num64("Memory Total")?,
        memory_reserved: num64("Memory Reserved")?,
        bar1_total: num64("BAR1 Total")?,
        power: [
            num("Power Usage")?,
            num("Power Limit")?,
            num("Power Min Limit")?,
            num("Power Max Limit")?,
        ],
        temperatures: [
            num("Temperature")?,
            num("Temperature Slowdown")?,
            num("Temperature Shutdown")?,
            num("Temperature GPU Max")?,
            num("Temperature Memory Max")?,
        ],
        fan_speed: if optional("Fan Speed") {
            Some(num("Fan Speed")?)
        } else {
            None
        },
        graphics_max: num("Graphics Clock Max")?,
        graphics_default,
        memory_clock: num("Memory Clock")?,
        video_max: num("Video Clock Max")?,
        supported_graphics,
        ecc: text("ECC")? == b"Enabled",
        nvlink_version: if nvlink_remotes.is_empty() {
            None
        } else {
            Some(num("NVLink Version")?)
        },
        nvlink_remotes,
        fabric,
        lost: false,
        ecc_errors: [
            count("ECC Errors Corrected")?,
            count("ECC Errors Uncorrected")?,
        ],
        retired: u32::try_from(count("Retired Uncorrectable")?)
            .map_err(|_| malformed(&nvml_path, b"`Retired Uncorrectable:` is too large"))?,
        retired_pending: yes("Retired Pending"),
        remap_failure: yes("Remap Failure"),
        thermal: yes("Thermal Slowdown"),
        nvlink_down,
        app_graphics: graphics_default,
        locked: None,
    };
    Ok((device, excluded))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Access::{Allowed, Denied, Missing};

    fn shown(all: &[Access]) -> Vec<bool> {
        all.iter().map(|&a| visible(all, a)).collect()
    }

    #[test]
    fn a_confined_job_sees_only_the_gpus_its_cgroup_allows() {
        assert_eq!(
            shown(&[Denied, Allowed, Denied, Allowed]),
            [false, true, false, true]
        );
        assert_eq!(shown(&[Denied; 4]), [false; 4]);
    }

    #[test]
    fn a_container_given_some_nodes_sees_only_those() {
        assert_eq!(
            shown(&[Allowed, Missing, Missing, Allowed]),
            [true, false, false, true]
        );
        assert_eq!(shown(&[Missing, Denied]), [false, false]);
    }

    #[test]
    fn without_any_node_every_gpu_shows() {
        assert_eq!(shown(&[Missing; 4]), [true; 4]);
        assert_eq!(shown(&[Allowed; 4]), [true; 4]);
    }
}
