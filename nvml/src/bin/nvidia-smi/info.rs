//! What the formats print, collected from NVML into plain structs: formatting never calls NVML.

use crate::nvml::{
    Bar1, Clock, Device, EccCounter, Fabric, Memory, Nvml, Pci, RemappedRows, Ret, RetireCause,
    Threshold, Val,
};

/// The system-wide values every format's header shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct System {
    pub driver: Val<String>,
    pub nvml: Val<String>,
    /// NVML's encoding: `1000 * major + 10 * minor`.
    pub cuda: Val<i32>,
    pub count: Val<u32>,
}

impl System {
    pub fn collect(nvml: &Nvml) -> Self {
        System {
            driver: nvml.driver_version(),
            nvml: nvml.nvml_version(),
            cuda: nvml.cuda_version(),
            count: nvml.count(),
        }
    }

    /// The driver's major version (`580` of `580.173.02`), which picks the table's layout.
    pub fn driver_major(&self) -> Option<u32> {
        self.driver.as_ref().ok()?.split('.').next()?.parse().ok()
    }
}

/// One GPU's entry of `-L`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub index: u32,
    pub name: Val<String>,
    pub uuid: Val<String>,
}

impl Listed {
    pub fn collect(nvml: &Nvml, index: u32, d: Device) -> Self {
        Listed {
            index,
            name: nvml.name(d),
            uuid: nvml.uuid(d),
        }
    }
}

/// Volatile and aggregate ECC counts of one location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EccErrors {
    pub sram_corrected: Val<u64>,
    pub sram_uncorrected: Val<u64>,
    pub dram_corrected: Val<u64>,
    pub dram_uncorrected: Val<u64>,
}

impl EccErrors {
    fn collect(nvml: &Nvml, d: Device, aggregate: bool) -> Self {
        let count = |sram, uncorrected| {
            nvml.memory_errors(
                d,
                EccCounter {
                    uncorrected,
                    aggregate,
                    sram,
                },
            )
        };
        EccErrors {
            sram_corrected: count(true, false),
            sram_uncorrected: count(true, true),
            dram_corrected: count(false, false),
            dram_uncorrected: count(false, true),
        }
    }
}

/// The four clocks NVML reports, MHz.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clocks {
    pub graphics: Val<u32>,
    pub sm: Val<u32>,
    pub memory: Val<u32>,
    pub video: Val<u32>,
}

impl Clocks {
    fn collect(get: impl Fn(Clock) -> Val<u32>) -> Self {
        Clocks {
            graphics: get(Clock::Graphics),
            sm: get(Clock::Sm),
            memory: get(Clock::Memory),
            video: get(Clock::Video),
        }
    }
}

/// A process with a compute context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRow {
    pub pid: u32,
    pub name: Val<String>,
    pub used_memory: u64,
}

/// Everything `-q`, the summary table and `--query-gpu` show of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub index: u32,
    pub name: Val<String>,
    pub brand: Val<u32>,
    pub architecture: Val<u32>,
    pub uuid: Val<String>,
    pub serial: Val<String>,
    pub vbios: Val<String>,
    pub board_part_number: Val<String>,
    pub inforom_image: Val<String>,
    pub minor: Val<u32>,
    pub compute_capability: Val<(i32, i32)>,
    pub pci: Val<Pci>,
    pub pcie_generation: Val<u32>,
    pub max_pcie_generation: Val<u32>,
    pub gpu_max_pcie_generation: Val<u32>,
    pub pcie_width: Val<u32>,
    pub max_pcie_width: Val<u32>,
    pub display_mode: Val<u32>,
    pub display_active: Val<u32>,
    pub persistence_mode: Val<u32>,
    pub mig_mode: Val<(u32, u32)>,
    pub fan_speed: Val<u32>,
    pub performance_state: Val<u32>,
    /// `nvmlClocksEventReason*` bits: active now, and those the GPU reports.
    pub clocks_event_reasons: Val<u64>,
    pub supported_clocks_event_reasons: Val<u64>,
    pub memory: Val<Memory>,
    pub bar1: Val<Bar1>,
    pub compute_mode: Val<u32>,
    /// (gpu, memory), %.
    pub utilization: Val<(u32, u32)>,
    pub ecc_mode: Val<(u32, u32)>,
    pub ecc_volatile: EccErrors,
    pub ecc_aggregate: EccErrors,
    /// Uncorrected errors since the driver loaded, over the whole device.
    pub ecc_volatile_uncorrected: Val<u64>,
    pub retired_single_bit: Val<u32>,
    pub retired_double_bit: Val<u32>,
    pub retired_pending: Val<bool>,
    pub remapped_rows: Val<RemappedRows>,
    pub temperature: Val<u32>,
    pub shutdown_temperature: Val<u32>,
    pub slowdown_temperature: Val<u32>,
    pub max_operating_temperature: Val<u32>,
    pub memory_max_temperature: Val<u32>,
    /// mW.
    pub power_draw: Val<u32>,
    pub power_limit: Val<u32>,
    pub enforced_power_limit: Val<u32>,
    pub default_power_limit: Val<u32>,
    pub power_limit_range: Val<(u32, u32)>,
    pub clocks: Clocks,
    pub applications_clocks: Clocks,
    pub default_applications_clocks: Clocks,
    pub max_clocks: Clocks,
    pub max_boost_graphics: Val<u32>,
    pub fabric: Val<Fabric>,
    pub processes: Val<Vec<ProcessRow>>,
}

impl Gpu {
    pub fn collect(nvml: &Nvml, index: u32, d: Device) -> Self {
        let processes = nvml.compute_processes(d).map(|ps| {
            ps.into_iter()
                .map(|p| ProcessRow {
                    pid: p.pid,
                    name: nvml.process_name(p.pid),
                    used_memory: p.used_memory,
                })
                .collect()
        });
        Gpu {
            index,
            name: nvml.name(d),
            brand: nvml.brand(d),
            architecture: nvml.architecture(d),
            uuid: nvml.uuid(d),
            serial: nvml.serial(d),
            vbios: nvml.vbios(d),
            board_part_number: nvml.board_part_number(d),
            inforom_image: nvml.inforom_image(d),
            minor: nvml.minor(d),
            compute_capability: nvml.compute_capability(d),
            pci: nvml.pci(d),
            pcie_generation: nvml.pcie_generation(d),
            max_pcie_generation: nvml.max_pcie_generation(d),
            gpu_max_pcie_generation: nvml.gpu_max_pcie_generation(d),
            pcie_width: nvml.pcie_width(d),
            max_pcie_width: nvml.max_pcie_width(d),
            display_mode: nvml.display_mode(d),
            display_active: nvml.display_active(d),
            persistence_mode: nvml.persistence_mode(d),
            mig_mode: nvml.mig_mode(d),
            fan_speed: nvml.fan_speed(d),
            performance_state: nvml.performance_state(d),
            clocks_event_reasons: nvml.clocks_event_reasons(d),
            supported_clocks_event_reasons: nvml.supported_clocks_event_reasons(d),
            memory: nvml.memory(d),
            bar1: nvml.bar1(d),
            compute_mode: nvml.compute_mode(d),
            utilization: nvml.utilization(d),
            ecc_mode: nvml.ecc_mode(d),
            ecc_volatile: EccErrors::collect(nvml, d, false),
            ecc_aggregate: EccErrors::collect(nvml, d, true),
            ecc_volatile_uncorrected: nvml.total_ecc_errors(d, true, false),
            retired_single_bit: nvml.retired_pages(d, RetireCause::MultipleSingleBit),
            retired_double_bit: nvml.retired_pages(d, RetireCause::DoubleBit),
            retired_pending: nvml.retired_pages_pending(d),
            remapped_rows: nvml.remapped_rows(d),
            temperature: nvml.temperature(d),
            shutdown_temperature: nvml.temperature_threshold(d, Threshold::Shutdown),
            slowdown_temperature: nvml.temperature_threshold(d, Threshold::Slowdown),
            max_operating_temperature: nvml.temperature_threshold(d, Threshold::GpuMax),
            memory_max_temperature: nvml.temperature_threshold(d, Threshold::MemoryMax),
            power_draw: nvml.power_usage(d),
            power_limit: nvml.power_limit(d),
            enforced_power_limit: nvml.enforced_power_limit(d),
            default_power_limit: nvml.default_power_limit(d),
            power_limit_range: nvml.power_limit_constraints(d),
            clocks: Clocks::collect(|c| nvml.clock(d, c)),
            applications_clocks: Clocks::collect(|c| nvml.applications_clock(d, c)),
            default_applications_clocks: Clocks::collect(|c| nvml.default_applications_clock(d, c)),
            max_clocks: Clocks::collect(|c| nvml.max_clock(d, c)),
            max_boost_graphics: nvml.max_customer_boost_clock(d, Clock::Graphics),
            fabric: nvml.fabric(d),
            processes,
        }
    }

    /// Whether the clocks event reason `bit` is active (`NOT_SUPPORTED` when the GPU does not
    /// report it).
    pub fn event_reason(&self, bit: u64) -> Val<bool> {
        if self.supported_clocks_event_reasons? & bit == 0 {
            return Err(Ret::NOT_SUPPORTED);
        }
        Ok(self.clocks_event_reasons? & bit != 0)
    }

    /// The bus id NVML reports (`00000008:06:00.0`), which heads the GPU's `-q` block.
    pub fn bus_id(&self) -> Val<&str> {
        self.pci.as_ref().map(|p| p.bus_id.as_str()).map_err(|e| *e)
    }
}

/// A GPU's place in `topo -m`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopoGpu {
    pub cpus: Val<Vec<u32>>,
    pub numa_nodes: Val<Vec<u32>>,
    pub numa_id: Val<u32>,
}

/// How two GPUs connect: by this many NVLinks, or through PCIe up to a topology level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Nvlinks(u32),
    /// `nvmlGpuTopologyLevel_t`.
    Pcie(u32),
    Unknown(Ret),
}

/// Everything `topo -m` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub gpus: Vec<TopoGpu>,
    /// `links[i][j]`, `i != j`.
    pub links: Vec<Vec<Link>>,
}

impl Topology {
    pub fn collect(nvml: &Nvml, devices: &[Device]) -> Self {
        let bus_ids: Vec<Option<String>> = devices
            .iter()
            .map(|&d| nvml.pci(d).ok().map(|p| p.bus_id.to_ascii_lowercase()))
            .collect();
        // Each GPU's active links, by the bus id at their far end.
        let remotes: Vec<Vec<String>> = devices
            .iter()
            .map(|&d| {
                (0..crate::nvml::NVLINK_MAX_LINKS)
                    .filter(|&l| nvml.nvlink_active(d, l).unwrap_or(false))
                    .filter_map(|l| nvml.nvlink_remote_pci(d, l).ok())
                    .map(|p| p.bus_id.to_ascii_lowercase())
                    .collect()
            })
            .collect();
        let links = devices
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                devices
                    .iter()
                    .enumerate()
                    .map(|(j, &b)| {
                        let nvlinks = match &bus_ids[j] {
                            Some(id) if i != j => {
                                remotes[i].iter().filter(|r| *r == id).count() as u32
                            }
                            _ => 0,
                        };
                        if nvlinks > 0 {
                            Link::Nvlinks(nvlinks)
                        } else if i == j {
                            Link::Pcie(0)
                        } else {
                            match nvml.common_ancestor(a, b) {
                                Ok(level) => Link::Pcie(level),
                                Err(e) => Link::Unknown(e),
                            }
                        }
                    })
                    .collect()
            })
            .collect();
        let gpus = devices
            .iter()
            .map(|&d| TopoGpu {
                cpus: nvml.cpu_affinity(d),
                numa_nodes: nvml.memory_affinity(d),
                numa_id: nvml.numa_node(d),
            })
            .collect();
        Topology { gpus, links }
    }
}

/// The GPU of a public `nvidia-smi` capture (an H200 on driver 580.173.02), which the formats'
/// tests print and compare with what the real tool printed.
#[cfg(test)]
pub mod sample {
    use super::*;
    use crate::nvml::{Fabric, Ret};

    const MIB: u64 = 1024 * 1024;

    pub fn system() -> System {
        System {
            driver: Ok("580.173.02".to_string()),
            nvml: Ok("12.580.173.02".to_string()),
            cuda: Ok(13000),
            count: Ok(1),
        }
    }

    fn clocks(graphics: u32, sm: u32, memory: u32, video: u32) -> Clocks {
        Clocks {
            graphics: Ok(graphics),
            sm: Ok(sm),
            memory: Ok(memory),
            video: Ok(video),
        }
    }

    fn zero_ecc() -> EccErrors {
        EccErrors {
            sram_corrected: Ok(0),
            sram_uncorrected: Ok(0),
            dram_corrected: Ok(0),
            dram_uncorrected: Ok(0),
        }
    }

    pub fn h200() -> Gpu {
        let na = Err(Ret::NOT_SUPPORTED);
        Gpu {
            index: 0,
            name: Ok("NVIDIA H200".to_string()),
            brand: Ok(14),
            architecture: Ok(9),
            uuid: Ok("GPU-00000000-0000-0000-0000-000000000000".to_string()),
            serial: Ok("0000000000000".to_string()),
            vbios: Ok("96.00.A5.00.03".to_string()),
            board_part_number: Ok("695-2G520-0280-001".to_string()),
            inforom_image: Ok("G520.0280.02.02".to_string()),
            minor: Ok(0),
            compute_capability: Ok((9, 0)),
            pci: Ok(Pci {
                bus_id: "00000000:83:00.0".to_string(),
                domain: 0,
                bus: 0x83,
                device: 0,
                device_id: 0x2335_10DE,
                sub_system_id: 0x18BE_10DE,
            }),
            pcie_generation: Ok(5),
            max_pcie_generation: Ok(5),
            gpu_max_pcie_generation: Ok(5),
            pcie_width: Ok(16),
            max_pcie_width: Ok(16),
            display_mode: Ok(0),
            display_active: Ok(0),
            persistence_mode: Ok(1),
            mig_mode: Ok((0, 0)),
            fan_speed: na,
            performance_state: Ok(0),
            clocks_event_reasons: Ok(1),
            supported_clocks_event_reasons: Ok(0x1ff),
            memory: Ok(Memory {
                total: 143_771 * MIB,
                reserved: Some(616 * MIB),
                used: 0,
                free: 143_156 * MIB,
            }),
            bar1: Ok(Bar1 {
                total: 262_144 * MIB,
                used: MIB,
                free: 262_143 * MIB,
            }),
            compute_mode: Ok(0),
            utilization: Ok((0, 0)),
            ecc_mode: Ok((1, 1)),
            ecc_volatile: zero_ecc(),
            ecc_aggregate: zero_ecc(),
            ecc_volatile_uncorrected: Ok(0),
            retired_single_bit: na,
            retired_double_bit: na,
            retired_pending: Err(Ret::NOT_SUPPORTED),
            remapped_rows: Ok(RemappedRows {
                correctable: 0,
                uncorrectable: 0,
                pending: false,
                failure: false,
            }),
            temperature: Ok(37),
            shutdown_temperature: Ok(92),
            slowdown_temperature: Ok(89),
            max_operating_temperature: Ok(87),
            memory_max_temperature: Ok(95),
            power_draw: Ok(85_120),
            power_limit: Ok(700_000),
            enforced_power_limit: Ok(700_000),
            default_power_limit: Ok(700_000),
            power_limit_range: Ok((200_000, 700_000)),
            clocks: clocks(345, 345, 3201, 765),
            applications_clocks: clocks(1980, 0, 3201, 0),
            default_applications_clocks: clocks(1980, 0, 3201, 0),
            max_clocks: clocks(1980, 1980, 3201, 1545),
            max_boost_graphics: Ok(1980),
            fabric: Ok(Fabric {
                cluster_uuid: [0; 16],
                status: 0,
                clique_id: 0,
                state: 3,
            }),
            processes: Ok(Vec::new()),
        }
    }
}
