//! The data only NVML has (clocks, power, temperatures, ECC, NVLink, fabric, …): the profile's
//! `nvml:` section, and the files the agent renders from it for the mock `libnvidia-ml.so.1`.
//!
//! Two files below the mock root, one `Key: value` per line (the key up to the first `: `, the
//! value the rest of the line; unknown keys are ignored, so keys can be added):
//! - [`SYSTEM_FILE`] (`nvml/system`): what is the same for every GPU.
//! - [`gpu_file`] (`nvml/gpus/<bus id>`): one per GPU. Absent keys mean "not supported" (a board
//!   without a fan has no `Fan Speed` line).
//!
//! Numbers are decimal; lists are comma-separated; memory is in bytes, power in milliwatts,
//! clocks in MHz, temperatures in °C. Identity (name, UUID, minor, VBIOS, bus id) and placement
//! (PCI ids, CPUs, NUMA node) are not repeated here: the library reads them from the driver files,
//! so the two never disagree.

use std::fmt::Write as _;

use serde::Deserialize;

use crate::{BusId, DriverVersion, Gpu, GpuState, NodeTopology, Profile};

/// The system file, relative to the mock root.
pub const SYSTEM_FILE: &str = "nvml/system";
/// The directory of the per-GPU files, relative to the mock root.
pub const GPUS_DIR: &str = "nvml/gpus";

/// The per-GPU file of `bus`, relative to the mock root.
pub fn gpu_file(bus: &BusId) -> String {
    format!("{GPUS_DIR}/{bus}")
}

/// Keys of the files (the library parses the same names).
pub mod key {
    /// System: the CUDA driver version as NVML encodes it (`1000 * major + 10 * minor`).
    pub const CUDA_DRIVER_VERSION: &str = "CUDA Driver Version";
    /// `nvmlDeviceArchitecture_t` value.
    pub const ARCHITECTURE: &str = "Architecture";
    /// `major.minor`.
    pub const COMPUTE_CAPABILITY: &str = "Compute Capability";
    /// `nvmlBrandType_t` value.
    pub const BRAND: &str = "Brand";
    /// Board serial number.
    pub const SERIAL: &str = "Serial";
    /// Board part number.
    pub const BOARD_PART_NUMBER: &str = "Board Part Number";
    /// InfoROM image version.
    pub const INFOROM_IMAGE: &str = "InfoROM Image";
    /// InfoROM OEM object version.
    pub const INFOROM_OEM: &str = "InfoROM OEM";
    /// InfoROM ECC object version.
    pub const INFOROM_ECC: &str = "InfoROM ECC";
    /// InfoROM power object version.
    pub const INFOROM_POWER: &str = "InfoROM Power";
    /// Bytes.
    pub const MEMORY_TOTAL: &str = "Memory Total";
    /// Bytes reserved by the driver and firmware.
    pub const MEMORY_RESERVED: &str = "Memory Reserved";
    /// Bytes.
    pub const BAR1_TOTAL: &str = "BAR1 Total";
    /// Milliwatts.
    pub const POWER_USAGE: &str = "Power Usage";
    /// Milliwatts (the enforced and the default limit).
    pub const POWER_LIMIT: &str = "Power Limit";
    /// Milliwatts.
    pub const POWER_MIN_LIMIT: &str = "Power Min Limit";
    /// Milliwatts.
    pub const POWER_MAX_LIMIT: &str = "Power Max Limit";
    /// °C.
    pub const TEMPERATURE: &str = "Temperature";
    /// °C.
    pub const TEMPERATURE_SLOWDOWN: &str = "Temperature Slowdown";
    /// °C.
    pub const TEMPERATURE_SHUTDOWN: &str = "Temperature Shutdown";
    /// °C.
    pub const TEMPERATURE_GPU_MAX: &str = "Temperature GPU Max";
    /// °C.
    pub const TEMPERATURE_MEMORY_MAX: &str = "Temperature Memory Max";
    /// Percent; absent on boards without a fan.
    pub const FAN_SPEED: &str = "Fan Speed";
    /// MHz (graphics and SM).
    pub const GRAPHICS_CLOCK_MAX: &str = "Graphics Clock Max";
    /// MHz: the default application clock (graphics and SM).
    pub const GRAPHICS_CLOCK_DEFAULT: &str = "Graphics Clock Default";
    /// MHz.
    pub const MEMORY_CLOCK: &str = "Memory Clock";
    /// MHz.
    pub const VIDEO_CLOCK_MAX: &str = "Video Clock Max";
    /// MHz, descending: the graphics clocks the board supports.
    pub const SUPPORTED_GRAPHICS_CLOCKS: &str = "Supported Graphics Clocks";
    /// `Enabled` or `Disabled`.
    pub const ECC: &str = "ECC";
    /// NVLink version (4 for Hopper, 5 for Blackwell); absent without NVLink.
    pub const NVLINK_VERSION: &str = "NVLink Version";
    /// Bus ids of the remote GPU of each link, in link order; absent without NVLink.
    pub const NVLINK_REMOTE: &str = "NVLink Remote";
    /// The fabric's cluster UUID (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`); absent off fabric.
    pub const FABRIC_CLUSTER_UUID: &str = "Fabric Cluster UUID";
    /// The fabric clique id.
    pub const FABRIC_CLIQUE_ID: &str = "Fabric Clique ID";

    // The keys below are written only while a fault ([`crate::fault`]) is on the GPU.

    /// `Yes`: the GPU fell off the bus (Xid 79); its driver files are gone, so this file also
    /// carries its minor and UUID.
    pub const FALLEN_OFF_THE_BUS: &str = "Fallen Off The Bus";
    /// The minor of a GPU fallen off the bus.
    pub const DEVICE_MINOR: &str = "Device Minor";
    /// The UUID of a GPU fallen off the bus.
    pub const UUID: &str = "GPU UUID";
    /// `Yes`: excluded by the driver (not enumerated).
    pub const EXCLUDED: &str = "GPU Excluded";
    /// Corrected (single-bit) ECC errors, volatile and aggregate alike.
    pub const ECC_CORRECTED: &str = "ECC Errors Corrected";
    /// Uncorrected (double-bit) ECC errors, volatile and aggregate alike.
    pub const ECC_UNCORRECTED: &str = "ECC Errors Uncorrected";
    /// Rows remapped for uncorrectable errors (Ampere and later) or, before Ampere, pages
    /// retired for double-bit errors.
    pub const RETIRED_UNCORRECTABLE: &str = "Retired Uncorrectable";
    /// `Yes`: a row remapping (a page retirement before Ampere) waits for a GPU reset.
    pub const RETIRED_PENDING: &str = "Retired Pending";
    /// `Yes`: a row remapping failed.
    pub const REMAP_FAILURE: &str = "Remap Failure";
    /// `Yes`: thermal slowdown (the temperature is above the slowdown threshold).
    pub const THERMAL_SLOWDOWN: &str = "Thermal Slowdown";
    /// The NVLinks that are down, comma-separated.
    pub const NVLINK_DOWN: &str = "NVLink Down";
}

/// `nvmlDeviceArchitecture_t` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    /// 6.
    Turing,
    /// 7.
    Ampere,
    /// 8.
    Ada,
    /// 9.
    Hopper,
    /// 10 (newer than the 12.4 header, which stops at Hopper; drivers report 10).
    Blackwell,
}

impl Architecture {
    /// The NVML value.
    pub fn value(self) -> u32 {
        match self {
            Architecture::Turing => 6,
            Architecture::Ampere => 7,
            Architecture::Ada => 8,
            Architecture::Hopper => 9,
            Architecture::Blackwell => 10,
        }
    }

    /// The architecture of a PCI device id, as NVIDIA numbers them.
    fn of_device(id: u16) -> Architecture {
        match id {
            0x2300..=0x23ff => Architecture::Hopper,
            0x2600..=0x28ff => Architecture::Ada,
            0x2000..=0x25ff => Architecture::Ampere,
            0x2900.. => Architecture::Blackwell,
            _ => Architecture::Turing,
        }
    }

    /// The first compute capability of the architecture.
    fn compute_capability(self) -> (u32, u32) {
        match self {
            Architecture::Turing => (7, 5),
            Architecture::Ampere => (8, 0),
            Architecture::Ada => (8, 9),
            Architecture::Hopper => (9, 0),
            Architecture::Blackwell => (10, 0),
        }
    }
}

/// `nvmlBrandType_t` values the profiles use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Brand {
    /// 2.
    Tesla,
    /// 14.
    Nvidia,
}

impl Brand {
    /// The NVML value.
    pub fn value(self) -> u32 {
        match self {
            Brand::Tesla => 2,
            Brand::Nvidia => 14,
        }
    }
}

/// The profile's `nvml:` section as written: every field optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvmlSpec {
    /// Default: from the PCI device id.
    pub architecture: Option<Architecture>,
    /// `major.minor`; default: the architecture's first.
    pub compute_capability: Option<String>,
    /// Default `nvidia`.
    pub brand: Option<Brand>,
    /// CUDA version of the driver (`13.0`); default: from the driver branch.
    pub cuda_version: Option<String>,
    /// Board part number.
    pub board_part_number: Option<String>,
    /// InfoROM image version.
    pub inforom_image: Option<String>,
    /// InfoROM OEM object version.
    pub inforom_oem: Option<String>,
    /// InfoROM ECC object version.
    pub inforom_ecc: Option<String>,
    /// InfoROM power object version.
    pub inforom_power: Option<String>,
    /// Memory the driver reserves, MiB (at most half of `memory_mib`).
    pub reserved_mib: Option<u64>,
    /// Power drawn when idle, W.
    pub power_idle_w: Option<u32>,
    /// Default (and enforced) power limit, W.
    pub power_limit_w: Option<u32>,
    /// Lowest settable power limit, W.
    pub power_min_w: Option<u32>,
    /// Highest settable power limit, W.
    pub power_max_w: Option<u32>,
    /// Idle GPU temperature, °C.
    pub temperature_c: Option<u32>,
    /// Slowdown threshold, °C.
    pub slowdown_c: Option<u32>,
    /// Shutdown threshold, °C.
    pub shutdown_c: Option<u32>,
    /// Maximum operating GPU temperature, °C.
    pub gpu_max_c: Option<u32>,
    /// Maximum operating memory temperature, °C.
    pub memory_max_c: Option<u32>,
    /// Fan speed in percent; absent: the board has no fan (passively cooled).
    pub fan_percent: Option<u32>,
    /// Highest graphics (and SM) clock, MHz.
    pub graphics_max_mhz: Option<u32>,
    /// Lowest supported graphics clock, MHz.
    pub graphics_min_mhz: Option<u32>,
    /// Default application graphics clock, MHz.
    pub graphics_default_mhz: Option<u32>,
    /// Memory clock, MHz.
    pub memory_mhz: Option<u32>,
    /// Highest video clock, MHz.
    pub video_max_mhz: Option<u32>,
    /// ECC enabled (default true).
    pub ecc: Option<bool>,
    /// NVLinks per GPU (0 to 18).
    pub nvlinks: Option<u32>,
    /// NVLink version (required with `nvlinks`).
    pub nvlink_version: Option<u32>,
    /// The NVLink fabric's cluster UUID (GB200/GB300 class).
    pub fabric_cluster_uuid: Option<String>,
    /// The NVLink fabric's clique id (with `fabric_cluster_uuid`).
    pub fabric_clique_id: Option<u32>,
}

macro_rules! overlay {
    ($base:ident, $over:ident; $($field:ident),* $(,)?) => {
        NvmlSpec { $($field: $over.$field.or($base.$field)),* }
    };
}

impl NvmlSpec {
    /// `self` with every field that `over` sets replaced.
    pub fn overlay(self, over: NvmlSpec) -> NvmlSpec {
        overlay!(self, over;
            architecture, compute_capability, brand, cuda_version, board_part_number,
            inforom_image, inforom_oem, inforom_ecc, inforom_power, reserved_mib, power_idle_w,
            power_limit_w, power_min_w, power_max_w, temperature_c, slowdown_c, shutdown_c,
            gpu_max_c, memory_max_c, fan_percent, graphics_max_mhz, graphics_min_mhz,
            graphics_default_mhz, memory_mhz, video_max_mhz, ecc, nvlinks, nvlink_version,
            fabric_cluster_uuid, fabric_clique_id)
    }
}

/// The NVLink fabric a GPU belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fabric {
    /// Cluster UUID, lowercase `8-4-4-4-12` hex.
    pub cluster_uuid: String,
    /// Clique id.
    pub clique_id: u32,
}

/// The resolved `nvml:` section: the NVML-only data of every GPU of the profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nvml {
    /// Architecture.
    pub architecture: Architecture,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Brand.
    pub brand: Brand,
    /// CUDA driver version (major, minor).
    pub cuda_version: (u32, u32),
    /// Board part number.
    pub board_part_number: String,
    /// InfoROM image, OEM, ECC and power versions.
    pub inforom: [String; 4],
    /// Reserved memory, MiB.
    pub reserved_mib: u64,
    /// Idle power, default limit, min and max limits, W.
    pub power_w: [u32; 4],
    /// Temperature, slowdown, shutdown, GPU max, memory max, °C.
    pub temperatures_c: [u32; 5],
    /// Fan speed, percent (`None`: no fan).
    pub fan_percent: Option<u32>,
    /// Graphics clocks: max, min, default application clock, MHz.
    pub graphics_mhz: [u32; 3],
    /// Memory clock, MHz.
    pub memory_mhz: u32,
    /// Highest video clock, MHz.
    pub video_max_mhz: u32,
    /// ECC enabled.
    pub ecc: bool,
    /// NVLinks per GPU and their version (`None`: no NVLink).
    pub nvlink: Option<(u32, u32)>,
    /// The NVLink fabric (`None`: not on one).
    pub fabric: Option<Fabric>,
}

/// Most NVLinks of one GPU (`NVML_NVLINK_MAX_LINKS`).
pub const MAX_NVLINKS: u32 = 18;

/// The CUDA version a driver branch ships.
fn cuda_of_branch(branch: u32) -> (u32, u32) {
    match branch {
        ..=549 => (12, 3),
        550..=554 => (12, 4),
        555..=559 => (12, 5),
        560..=564 => (12, 6),
        565..=569 => (12, 7),
        570..=574 => (12, 8),
        575..=579 => (12, 9),
        580..=589 => (13, 0),
        _ => (13, 1),
    }
}

/// `major.minor` with small numbers.
fn version_pair(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.split_once('.')?;
    let num = |p: &str| {
        (!p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse().ok())
            .flatten()
    };
    Some((num(a)?, num(b)?))
}

/// The 16 bytes of a `8-4-4-4-12` hex UUID.
pub fn uuid_bytes(s: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = s.split('-').collect();
    if groups.iter().map(|g| g.len()).collect::<Vec<_>>() != [8, 4, 4, 4, 12] {
        return None;
    }
    let hex: String = groups.concat();
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl NvmlSpec {
    /// Validates and fills defaults; errors are `(field, message)` with the field as
    /// `nvml.<name>`.
    pub(crate) fn resolve(
        self,
        pci_device: u16,
        driver: &DriverVersion,
        memory_mib: u64,
    ) -> Result<Nvml, (String, String)> {
        let err = |f: &str, m: String| (format!("nvml.{f}"), m);
        let architecture = self
            .architecture
            .unwrap_or_else(|| Architecture::of_device(pci_device));
        let compute_capability = match &self.compute_capability {
            Some(s) => version_pair(s)
                .ok_or_else(|| err("compute_capability", format!("{s:?} is not like 9.0")))?,
            None => architecture.compute_capability(),
        };
        let cuda_version = match &self.cuda_version {
            Some(s) => version_pair(s)
                .filter(|&(major, minor)| major >= 1 && minor < 100)
                .ok_or_else(|| err("cuda_version", format!("{s:?} is not like 13.0")))?,
            None => cuda_of_branch(driver.major()),
        };
        let text = |f: &str, v: Option<String>, default: &str, max: usize| {
            let v = v.unwrap_or_else(|| default.to_string());
            if v.is_empty() || v.len() >= max || !v.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(err(
                    f,
                    format!("{v:?} must be 1 to {} printable characters", max - 1),
                ));
            }
            Ok(v)
        };
        let inforom = [
            text("inforom_image", self.inforom_image, "G000.0000.00.01", 16)?,
            text("inforom_oem", self.inforom_oem, "2.1", 16)?,
            text("inforom_ecc", self.inforom_ecc, "7.0", 16)?,
            text("inforom_power", self.inforom_power, "N/A", 16)?,
        ];
        let board_part_number = text(
            "board_part_number",
            self.board_part_number,
            "900-2G000-0000-000",
            80,
        )?;
        // At most half the memory, so that a `memory_mib` override below the base's reserve
        // still gives a working board.
        let reserved_mib = self.reserved_mib.unwrap_or(512).min(memory_mib / 2);
        let limit = self.power_limit_w.unwrap_or(300);
        let power_w = [
            self.power_idle_w.unwrap_or(limit / 5),
            limit,
            self.power_min_w.unwrap_or(limit / 3),
            self.power_max_w.unwrap_or(limit),
        ];
        if !(power_w[2] <= power_w[1] && power_w[1] <= power_w[3] && power_w[0] <= power_w[3])
            || power_w[3] > 100_000
        {
            return Err(err(
                "power_limit_w",
                format!(
                    "power_min_w {} <= power_limit_w {} <= power_max_w {} (at most 100000) and power_idle_w {} <= power_max_w do not hold",
                    power_w[2], power_w[1], power_w[3], power_w[0]
                ),
            ));
        }
        let temperatures_c = [
            self.temperature_c.unwrap_or(35),
            self.slowdown_c.unwrap_or(90),
            self.shutdown_c.unwrap_or(95),
            self.gpu_max_c.unwrap_or(87),
            self.memory_max_c.unwrap_or(95),
        ];
        let [idle, slowdown, shutdown, ..] = temperatures_c;
        if !(idle < slowdown && slowdown < shutdown && shutdown <= 150) {
            return Err(err(
                "temperature_c",
                format!(
                    "temperature_c {idle} < slowdown_c {slowdown} < shutdown_c {shutdown} <= 150 does not hold"
                ),
            ));
        }
        if let Some(fan) = self.fan_percent.filter(|&f| f > 100) {
            return Err(err("fan_percent", format!("{fan} is over 100")));
        }
        let max = self.graphics_max_mhz.unwrap_or(1500);
        let graphics_mhz = [
            max,
            self.graphics_min_mhz.unwrap_or(210.min(max)),
            self.graphics_default_mhz.unwrap_or(max),
        ];
        if !(graphics_mhz[1] <= graphics_mhz[2] && graphics_mhz[2] <= max && max <= 10_000) {
            return Err(err(
                "graphics_max_mhz",
                format!(
                    "graphics_min_mhz {} <= graphics_default_mhz {} <= graphics_max_mhz {max} <= 10000 does not hold",
                    graphics_mhz[1], graphics_mhz[2]
                ),
            ));
        }
        let memory_mhz = self.memory_mhz.unwrap_or(1215);
        if !(1..=100_000).contains(&memory_mhz) {
            return Err(err("memory_mhz", format!("{memory_mhz} is out of range")));
        }
        let nvlink = match (self.nvlinks.unwrap_or(0), self.nvlink_version) {
            (0, _) => None,
            (n, _) if n > MAX_NVLINKS => {
                return Err(err("nvlinks", format!("{n} is over {MAX_NVLINKS}")));
            }
            (n, Some(v @ 1..=9)) => Some((n, v)),
            (_, v) => {
                return Err(err(
                    "nvlink_version",
                    format!("{v:?}: NVLinks need a version from 1 to 9"),
                ));
            }
        };
        let fabric = match (self.fabric_cluster_uuid, self.fabric_clique_id) {
            (None, None) => None,
            (Some(uuid), Some(clique_id)) if uuid_bytes(&uuid).is_some() => Some(Fabric {
                cluster_uuid: uuid.to_ascii_lowercase(),
                clique_id,
            }),
            (Some(uuid), Some(_)) => {
                return Err(err(
                    "fabric_cluster_uuid",
                    format!("{uuid:?} is not a UUID like 8e2a1f3c-0d4b-4c5e-9f60-718293a4b5c6"),
                ));
            }
            _ => {
                return Err(err(
                    "fabric_cluster_uuid",
                    "fabric_cluster_uuid and fabric_clique_id go together".into(),
                ));
            }
        };
        Ok(Nvml {
            architecture,
            compute_capability,
            brand: self.brand.unwrap_or(Brand::Nvidia),
            cuda_version,
            board_part_number,
            inforom,
            reserved_mib,
            power_w,
            temperatures_c,
            fan_percent: self.fan_percent,
            graphics_mhz,
            memory_mhz,
            video_max_mhz: self.video_max_mhz.unwrap_or(max),
            ecc: self.ecc.unwrap_or(true),
            nvlink,
            fabric,
        })
    }
}

/// BAR1 (the memory aperture): the memory size rounded up to a power of two, in bytes.
pub fn bar1_bytes(p: &Profile) -> u64 {
    (p.memory_mib << 20).next_power_of_two()
}

/// The board serial number of `gpu`: 13 digits from its UUID.
pub fn serial(gpu: &Gpu) -> String {
    let hex: String = gpu
        .uuid
        .bytes()
        .filter(u8::is_ascii_hexdigit)
        .take(15)
        .map(char::from)
        .collect();
    let n = u64::from_str_radix(&hex, 16).unwrap_or(0);
    format!("1{:012}", n % 1_000_000_000_000)
}

/// The graphics clocks the board supports, descending: from max down to min in 15 MHz steps
/// (the granularity of NVIDIA's clock tables), min included.
pub fn supported_graphics_clocks(n: &Nvml) -> Vec<u32> {
    let [max, min, _] = n.graphics_mhz;
    let mut clocks: Vec<u32> = (0..)
        .map(|i| max - 15 * i)
        .take_while(|&c| c > min)
        .take(512)
        .collect();
    clocks.push(min);
    clocks
}

/// The remote GPU of each NVLink of `gpu`: the links are spread round-robin over the other GPUs
/// of the node (none with a single GPU).
pub fn nvlink_remotes(topo: &NodeTopology, gpu: &Gpu) -> Vec<BusId> {
    let Some((links, _)) = topo.profile.nvml.nvlink else {
        return Vec::new();
    };
    let peers: Vec<BusId> = topo
        .gpus
        .iter()
        .filter(|g| g.index != gpu.index)
        .map(|g| g.bus_id)
        .collect();
    if peers.is_empty() {
        return Vec::new();
    }
    (0..links as usize)
        .map(|l| peers[l % peers.len()])
        .collect()
}

/// The system file.
pub fn render_system(p: &Profile) -> String {
    let (major, minor) = p.nvml.cuda_version;
    format!(
        "{}: {}\n",
        key::CUDA_DRIVER_VERSION,
        major * 1000 + minor * 10
    )
}

/// The file of `gpu`.
pub fn render_gpu(topo: &NodeTopology, gpu: &Gpu, state: &GpuState) -> String {
    use key::*;
    let p = &topo.profile;
    let n = &p.nvml;
    let mut s = String::new();
    let mut line = |k: &str, v: &dyn std::fmt::Display| {
        writeln!(s, "{k}: {v}").ok();
    };
    let (cc_major, cc_minor) = n.compute_capability;
    let yes = &"Yes";
    if state.lost {
        line(FALLEN_OFF_THE_BUS, yes);
        line(DEVICE_MINOR, &gpu.minor);
        line(UUID, &gpu.uuid);
    }
    if state.excluded {
        line(EXCLUDED, yes);
    }
    line(ARCHITECTURE, &n.architecture.value());
    line(COMPUTE_CAPABILITY, &format_args!("{cc_major}.{cc_minor}"));
    line(BRAND, &n.brand.value());
    line(SERIAL, &serial(gpu));
    line(BOARD_PART_NUMBER, &n.board_part_number);
    for (k, v) in [INFOROM_IMAGE, INFOROM_OEM, INFOROM_ECC, INFOROM_POWER]
        .iter()
        .zip(&n.inforom)
    {
        line(k, v);
    }
    line(MEMORY_TOTAL, &(p.memory_mib << 20));
    line(MEMORY_RESERVED, &(n.reserved_mib << 20));
    line(BAR1_TOTAL, &bar1_bytes(p));
    let [idle, limit, min, max] = n.power_w.map(|w| u64::from(w) * 1000);
    line(POWER_USAGE, &idle);
    line(POWER_LIMIT, &limit);
    line(POWER_MIN_LIMIT, &min);
    line(POWER_MAX_LIMIT, &max);
    let mut temperatures = n.temperatures_c;
    if state.thermal {
        // Past the slowdown threshold, below shutdown.
        temperatures[0] = temperatures[1]
            .saturating_add(3)
            .min(temperatures[2].saturating_sub(1));
        line(THERMAL_SLOWDOWN, yes);
    }
    for (k, v) in [
        TEMPERATURE,
        TEMPERATURE_SLOWDOWN,
        TEMPERATURE_SHUTDOWN,
        TEMPERATURE_GPU_MAX,
        TEMPERATURE_MEMORY_MAX,
    ]
    .iter()
    .zip(&temperatures)
    {
        line(k, v);
    }
    if let Some(fan) = n.fan_percent {
        line(FAN_SPEED, &fan);
    }
    line(GRAPHICS_CLOCK_MAX, &n.graphics_mhz[0]);
    line(GRAPHICS_CLOCK_DEFAULT, &n.graphics_mhz[2]);
    line(MEMORY_CLOCK, &n.memory_mhz);
    line(VIDEO_CLOCK_MAX, &n.video_max_mhz);
    let clocks: Vec<String> = supported_graphics_clocks(n)
        .iter()
        .map(u32::to_string)
        .collect();
    line(SUPPORTED_GRAPHICS_CLOCKS, &clocks.join(","));
    line(ECC, &if n.ecc { "Enabled" } else { "Disabled" });
    if state.single_bit > 0 {
        line(ECC_CORRECTED, &state.single_bit);
    }
    if state.double_bit > 0 {
        line(ECC_UNCORRECTED, &state.double_bit);
        line(RETIRED_UNCORRECTABLE, &state.double_bit);
    }
    if state.remap_pending {
        line(RETIRED_PENDING, yes);
    }
    if state.remap_failure {
        line(REMAP_FAILURE, yes);
    }
    let remotes = nvlink_remotes(topo, gpu);
    if let (Some((_, version)), false) = (n.nvlink, remotes.is_empty()) {
        line(NVLINK_VERSION, &version);
        let list: Vec<String> = remotes.iter().map(BusId::to_string).collect();
        line(NVLINK_REMOTE, &list.join(","));
        if !state.links_down.is_empty() {
            let down: Vec<String> = state.links_down.iter().map(u32::to_string).collect();
            line(NVLINK_DOWN, &down.join(","));
        }
    }
    if let Some(f) = &n.fabric {
        line(FABRIC_CLUSTER_UUID, &f.cluster_uuid);
        line(FABRIC_CLIQUE_ID, &f.clique_id);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo(name: &str) -> NodeTopology {
        let host = crate::topology::tests::host(&[(0, 0..2)], &[]);
        NodeTopology::build(&Profile::builtin(name).unwrap(), "n", &host).unwrap()
    }

    fn value<'a>(file: &'a str, k: &str) -> Option<&'a str> {
        file.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(": "))
    }

    #[test]
    fn every_builtin_renders_its_values() {
        for (name, _) in crate::profile::BUILTIN {
            let t = topo(name);
            let p = &t.profile;
            for gpu in &t.gpus {
                let f = render_gpu(&t, gpu, &GpuState::default());
                assert_eq!(
                    value(&f, key::MEMORY_TOTAL),
                    Some((p.memory_mib << 20).to_string().as_str()),
                    "{name}"
                );
                assert_eq!(value(&f, key::SERIAL).unwrap().len(), 13);
                let links = value(&f, key::NVLINK_REMOTE).map_or(0, |l| l.split(',').count());
                assert_eq!(links as u32, p.nvml.nvlink.map_or(0, |(n, _)| n), "{name}");
                let clocks = value(&f, key::SUPPORTED_GRAPHICS_CLOCKS).unwrap();
                assert!(clocks.starts_with(&p.nvml.graphics_mhz[0].to_string()));
                assert!(clocks.ends_with(&p.nvml.graphics_mhz[1].to_string()));
            }
            let serials: std::collections::BTreeSet<_> = t.gpus.iter().map(serial).collect();
            assert_eq!(serials.len(), t.gpus.len(), "{name}: serials are unique");
        }
        let gb300 = topo("gb300");
        let f = render_gpu(&gb300, &gb300.gpus[0], &GpuState::default());
        assert!(value(&f, key::FABRIC_CLIQUE_ID).is_some());
        assert_eq!(
            render_system(&gb300.profile),
            "CUDA Driver Version: 13000\n"
        );
    }

    #[test]
    fn links_spread_over_the_other_gpus() {
        let t = topo("gb300");
        let remotes = nvlink_remotes(&t, &t.gpus[0]);
        assert_eq!(remotes.len(), 18);
        for peer in &t.gpus[1..] {
            assert_eq!(remotes.iter().filter(|&&b| b == peer.bus_id).count(), 6);
        }
        assert!(!remotes.contains(&t.gpus[0].bus_id));
    }

    fn error_of(yaml: &str) -> crate::ProfileError {
        Profile::from_yaml(yaml, "bad.yaml").unwrap_err()
    }

    #[test]
    fn bad_values_name_the_field() {
        let field = |yaml: &str| error_of(yaml).field;
        assert_eq!(
            field("base: h100\nnvml:\n  compute_capability: nine\n").as_deref(),
            Some("nvml.compute_capability")
        );
        assert_eq!(
            field("base: h100\nnvml:\n  power_min_w: 900\n").as_deref(),
            Some("nvml.power_limit_w")
        );
        assert_eq!(
            field("base: h100\nnvml:\n  nvlinks: 19\n").as_deref(),
            Some("nvml.nvlinks")
        );
        assert_eq!(
            field("base: t4\nnvml:\n  nvlinks: 2\n").as_deref(),
            Some("nvml.nvlink_version")
        );
        assert_eq!(
            field("base: gb300\nnvml:\n  fabric_cluster_uuid: x\n").as_deref(),
            Some("nvml.fabric_cluster_uuid")
        );
        assert_eq!(
            field("base: t4\nnvml:\n  fan_percent: 101\n").as_deref(),
            Some("nvml.fan_percent")
        );
        let e = error_of("base: t4\nnvml:\n  fans: 1\n");
        assert!(e.to_string().contains("unknown field `fans`"), "{e}");
    }

    #[test]
    fn profiles_without_the_section_get_defaults() {
        let yaml = crate::profile::BUILTIN[7]
            .1
            .lines()
            .filter(|l| !l.starts_with("nvml") && !l.starts_with("  "))
            .collect::<Vec<_>>()
            .join("\n");
        let p = Profile::from_yaml(&yaml, "t.yaml").unwrap();
        assert_eq!(p.nvml.architecture, Architecture::Turing);
        assert_eq!(p.nvml.compute_capability, (7, 5));
        assert_eq!(p.nvml.cuda_version, (13, 1));
        assert_eq!(p.nvml.nvlink, None);
        // An override keeps the base's other values.
        let p = Profile::from_yaml("base: h100\nnvml:\n  power_limit_w: 600\n", "t").unwrap();
        assert_eq!(p.nvml.power_w[1], 600);
        assert_eq!(p.nvml.nvlink, Some((18, 4)));
    }
}
