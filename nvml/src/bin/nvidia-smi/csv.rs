//! `--query-gpu=… --format=csv[,noheader][,nounits]`: the fields the mock knows, with the real
//! tool's names, aliases, header units and `[N/A]` cells.

use std::fmt::Write as _;

use crate::info::{Clocks, Gpu, System};
use crate::nvml::{Ret, Val};
use crate::words::{
    Stamp, active, cluster_uuid, compute_mode, enabled, fabric_state, fabric_status, mib, pstate,
    watts,
};

/// What a field reads: the system, the moment, one GPU.
pub struct Ctx<'a> {
    pub sys: &'a System,
    pub now: &'a Stamp,
}

/// One queryable property.
pub struct Field {
    /// The name first, then its aliases.
    pub names: &'static [&'static str],
    /// Shown in the header as ` [unit]` and after each value unless `nounits`.
    pub unit: Option<&'static str>,
    pub help: &'static str,
    value: fn(&Ctx, &Gpu) -> Val<String>,
}

impl Field {
    pub fn name(&self) -> &'static str {
        self.names[0]
    }

    /// The column's header: the name, and the unit in brackets.
    pub fn header(&self) -> String {
        match self.unit {
            Some(u) => format!("{} [{u}]", self.name()),
            None => self.name().to_string(),
        }
    }

    /// The cell of one GPU: the value with its unit, or `[N/A]` and the like.
    pub fn cell(&self, ctx: &Ctx, g: &Gpu, units: bool) -> String {
        match (self.value)(ctx, g) {
            Ok(v) => match self.unit {
                Some(u) if units => format!("{v} {u}"),
                _ => v,
            },
            Err(e) => format!("[{}]", e.na()),
        }
    }
}

/// The field named `name` (or one of its aliases).
pub fn lookup(name: &str) -> Option<&'static Field> {
    FIELDS.iter().find(|f| f.names.contains(&name))
}

fn s(v: &Val<String>) -> Val<String> {
    v.clone()
}

fn n<T: ToString>(v: &Val<T>) -> Val<String> {
    v.as_ref().map(ToString::to_string).map_err(|e| *e)
}

fn mode(v: &Val<u32>) -> Val<String> {
    v.map(|m| enabled(m).to_string())
}

fn clock(c: &Clocks, which: fn(&Clocks) -> &Val<u32>) -> Val<String> {
    n(which(c))
}

fn power(v: &Val<u32>) -> Val<String> {
    v.map(watts)
}

fn fabric(g: &Gpu, f: fn(&crate::nvml::Fabric) -> String) -> Val<String> {
    g.fabric.as_ref().map(f).map_err(|e| *e)
}

const fn field(
    names: &'static [&'static str],
    unit: Option<&'static str>,
    help: &'static str,
    value: fn(&Ctx, &Gpu) -> Val<String>,
) -> Field {
    Field {
        names,
        unit,
        help,
        value,
    }
}

const MIB: Option<&str> = Some("MiB");
const MHZ: Option<&str> = Some("MHz");
const W: Option<&str> = Some("W");
const PCT: Option<&str> = Some("%");

/// Every field `--query-gpu` takes, in the order `--help-query-gpu` lists them.
pub static FIELDS: &[Field] = &[
    field(
        &["timestamp"],
        None,
        "The time of the query, \"YYYY/MM/DD HH:MM:SS.msec\".",
        |c, _| Ok(c.now.query()),
    ),
    field(
        &["driver_version"],
        None,
        "The version of the installed NVIDIA display driver.",
        |c, _| s(&c.sys.driver),
    ),
    field(
        &["count"],
        None,
        "The number of NVIDIA GPUs in the system.",
        |c, _| n(&c.sys.count),
    ),
    field(
        &["name", "gpu_name"],
        None,
        "The official product name of the GPU.",
        |_, g| s(&g.name),
    ),
    field(
        &["serial", "gpu_serial"],
        None,
        "The serial number printed on the board.",
        |_, g| s(&g.serial),
    ),
    field(
        &["uuid", "gpu_uuid"],
        None,
        "The globally unique identifier of the GPU.",
        |_, g| s(&g.uuid),
    ),
    field(
        &["pci.bus_id", "gpu_bus_id"],
        None,
        "PCI bus id as \"domain:bus:device.function\", in hex.",
        |_, g| g.bus_id().map(str::to_string),
    ),
    field(
        &["pci.domain"],
        None,
        "PCI domain number, in hex.",
        |_, g| {
            g.pci
                .as_ref()
                .map(|p| format!("0x{:04X}", p.domain))
                .map_err(|e| *e)
        },
    ),
    field(&["pci.bus"], None, "PCI bus number, in hex.", |_, g| {
        g.pci
            .as_ref()
            .map(|p| format!("0x{:02X}", p.bus))
            .map_err(|e| *e)
    }),
    field(
        &["pci.device"],
        None,
        "PCI device number, in hex.",
        |_, g| {
            g.pci
                .as_ref()
                .map(|p| format!("0x{:02X}", p.device))
                .map_err(|e| *e)
        },
    ),
    field(
        &["pci.device_id"],
        None,
        "PCI vendor device id, in hex.",
        |_, g| {
            g.pci
                .as_ref()
                .map(|p| format!("0x{:08X}", p.device_id))
                .map_err(|e| *e)
        },
    ),
    field(
        &["pci.sub_device_id"],
        None,
        "PCI Sub System id, in hex.",
        |_, g| {
            g.pci
                .as_ref()
                .map(|p| format!("0x{:08X}", p.sub_system_id))
                .map_err(|e| *e)
        },
    ),
    field(
        &["pcie.link.gen.current", "pcie.link.gen.gpucurrent"],
        None,
        "The current PCIe link generation.",
        |_, g| n(&g.pcie_generation),
    ),
    field(
        &["pcie.link.gen.max"],
        None,
        "The highest PCIe link generation of this GPU in this system.",
        |_, g| n(&g.max_pcie_generation),
    ),
    field(
        &["pcie.link.gen.gpumax"],
        None,
        "The highest PCIe link generation the GPU supports.",
        |_, g| n(&g.gpu_max_pcie_generation),
    ),
    field(
        &["pcie.link.width.current"],
        None,
        "The current PCIe link width.",
        |_, g| n(&g.pcie_width),
    ),
    field(
        &["pcie.link.width.max"],
        None,
        "The widest PCIe link of this GPU in this system.",
        |_, g| n(&g.max_pcie_width),
    ),
    field(&["index"], None, "Zero based index of the GPU.", |_, g| {
        Ok(g.index.to_string())
    }),
    field(
        &["display_mode"],
        None,
        "Whether a display may be initialized on the GPU.",
        |_, g| mode(&g.display_mode),
    ),
    field(
        &["display_active"],
        None,
        "Whether a display is initialized on the GPU.",
        |_, g| mode(&g.display_active),
    ),
    field(
        &["persistence_mode"],
        None,
        "Whether persistence mode is enabled.",
        |_, g| mode(&g.persistence_mode),
    ),
    field(
        &["vbios_version"],
        None,
        "The BIOS of the GPU board.",
        |_, g| s(&g.vbios),
    ),
    field(
        &["inforom.img", "inforom.image"],
        None,
        "Global version of the infoROM image.",
        |_, g| s(&g.inforom_image),
    ),
    field(
        &["fan.speed"],
        PCT,
        "The intended fan speed, percent of the maximum.",
        |_, g| n(&g.fan_speed),
    ),
    field(
        &["pstate"],
        None,
        "The current performance state, P0 (maximum) to P12 (minimum).",
        |_, g| g.performance_state.map(pstate),
    ),
    field(
        &[
            "clocks_event_reasons.supported",
            "clocks_throttle_reasons.supported",
        ],
        None,
        "Bitmask of the clocks event reasons the GPU reports.",
        |_, g| {
            g.supported_clocks_event_reasons
                .map(|r| format!("0x{r:016X}"))
        },
    ),
    field(
        &[
            "clocks_event_reasons.active",
            "clocks_throttle_reasons.active",
        ],
        None,
        "Bitmask of the clocks event reasons active now.",
        |_, g| g.clocks_event_reasons.map(|r| format!("0x{r:016X}")),
    ),
    field(
        &[
            "clocks_event_reasons.gpu_idle",
            "clocks_throttle_reasons.gpu_idle",
        ],
        None,
        "Nothing runs on the GPU: the clocks are idle.",
        |_, g| g.event_reason(0x1).map(|on| active(on).to_string()),
    ),
    field(
        &[
            "clocks_event_reasons.applications_clocks_setting",
            "clocks_throttle_reasons.applications_clocks_setting",
        ],
        None,
        "The applications clocks setting holds the clocks down.",
        |_, g| g.event_reason(0x2).map(|on| active(on).to_string()),
    ),
    field(
        &[
            "clocks_event_reasons.hw_thermal_slowdown",
            "clocks_throttle_reasons.hw_thermal_slowdown",
        ],
        None,
        "The hardware slows the clocks down: the GPU is too hot.",
        |_, g| g.event_reason(0x40).map(|on| active(on).to_string()),
    ),
    field(
        &[
            "clocks_event_reasons.sw_thermal_slowdown",
            "clocks_throttle_reasons.sw_thermal_slowdown",
        ],
        None,
        "The driver slows the clocks down: the GPU is over its slowdown temperature.",
        |_, g| g.event_reason(0x20).map(|on| active(on).to_string()),
    ),
    field(
        &["memory.total"],
        MIB,
        "Total installed GPU memory.",
        |_, g| g.memory.map(|m| mib(m.total).to_string()),
    ),
    field(
        &["memory.reserved"],
        MIB,
        "Memory reserved by the driver and firmware.",
        |_, g| {
            g.memory.and_then(|m| {
                m.reserved
                    .map(|r| mib(r).to_string())
                    .ok_or(Ret::NOT_SUPPORTED)
            })
        },
    ),
    field(
        &["memory.used"],
        MIB,
        "Memory allocated by active contexts.",
        |_, g| g.memory.map(|m| mib(m.used).to_string()),
    ),
    field(&["memory.free"], MIB, "Free memory.", |_, g| {
        g.memory.map(|m| mib(m.free).to_string())
    }),
    field(
        &["compute_mode"],
        None,
        "Whether one or several compute contexts may run.",
        |_, g| g.compute_mode.map(|m| compute_mode(m).to_string()),
    ),
    field(
        &["compute_cap"],
        None,
        "The CUDA compute capability, major.minor.",
        |_, g| g.compute_capability.map(|(a, b)| format!("{a}.{b}")),
    ),
    field(
        &["utilization.gpu"],
        PCT,
        "Percent of time one or more kernels ran.",
        |_, g| g.utilization.map(|(u, _)| u.to_string()),
    ),
    field(
        &["utilization.memory"],
        PCT,
        "Percent of time device memory was read or written.",
        |_, g| g.utilization.map(|(_, u)| u.to_string()),
    ),
    field(
        &["ecc.mode.current"],
        None,
        "The ECC mode the GPU runs under.",
        |_, g| g.ecc_mode.map(|(c, _)| enabled(c).to_string()),
    ),
    field(
        &["ecc.mode.pending"],
        None,
        "The ECC mode after the next reboot.",
        |_, g| g.ecc_mode.map(|(_, p)| enabled(p).to_string()),
    ),
    field(
        &[
            "ecc.errors.corrected.volatile.dram",
            "ecc.errors.corrected.volatile.device_memory",
        ],
        None,
        "Corrected DRAM errors since the driver loaded.",
        |_, g| n(&g.ecc_volatile.dram_corrected),
    ),
    field(
        &[
            "ecc.errors.uncorrected.volatile.dram",
            "ecc.errors.uncorrected.volatile.device_memory",
        ],
        None,
        "Uncorrected DRAM errors since the driver loaded.",
        |_, g| n(&g.ecc_volatile.dram_uncorrected),
    ),
    field(
        &[
            "ecc.errors.corrected.aggregate.dram",
            "ecc.errors.corrected.aggregate.device_memory",
        ],
        None,
        "Corrected DRAM errors over the GPU's life.",
        |_, g| n(&g.ecc_aggregate.dram_corrected),
    ),
    field(
        &[
            "ecc.errors.uncorrected.aggregate.dram",
            "ecc.errors.uncorrected.aggregate.device_memory",
        ],
        None,
        "Uncorrected DRAM errors over the GPU's life.",
        |_, g| n(&g.ecc_aggregate.dram_uncorrected),
    ),
    field(
        &["ecc.errors.uncorrected.volatile.total"],
        None,
        "Uncorrected errors since the driver loaded, whole chip.",
        |_, g| n(&g.ecc_volatile_uncorrected),
    ),
    field(
        &["retired_pages.single_bit_ecc.count", "retired_pages.sbe"],
        None,
        "Pages retired for multiple single bit errors.",
        |_, g| n(&g.retired_single_bit),
    ),
    field(
        &["retired_pages.double_bit.count", "retired_pages.dbe"],
        None,
        "Pages retired for a double bit error.",
        |_, g| n(&g.retired_double_bit),
    ),
    field(
        &["retired_pages.pending"],
        None,
        "Whether pages wait to be retired at the next reboot.",
        |_, g| {
            g.retired_pending
                .map(|p| if p { "Yes" } else { "No" }.to_string())
        },
    ),
    field(
        &["remapped_rows.correctable", "remapped_rows.sbe"],
        None,
        "Rows remapped for correctable errors.",
        |_, g| g.remapped_rows.map(|r| r.correctable.to_string()),
    ),
    field(
        &["remapped_rows.uncorrectable", "remapped_rows.dbe"],
        None,
        "Rows remapped for uncorrectable errors.",
        |_, g| g.remapped_rows.map(|r| r.uncorrectable.to_string()),
    ),
    field(
        &["remapped_rows.pending"],
        None,
        "Whether a remapping waits for a GPU reset.",
        |_, g| {
            g.remapped_rows
                .map(|r| if r.pending { "Yes" } else { "No" }.to_string())
        },
    ),
    field(
        &["remapped_rows.failure"],
        None,
        "Whether a remapping ever failed.",
        |_, g| {
            g.remapped_rows
                .map(|r| if r.failure { "Yes" } else { "No" }.to_string())
        },
    ),
    field(
        &["temperature.gpu"],
        None,
        "Core GPU temperature, degrees C.",
        |_, g| n(&g.temperature),
    ),
    field(
        &["power.draw"],
        W,
        "The last measured power draw of the board, W.",
        |_, g| power(&g.power_draw),
    ),
    field(
        &["power.limit", "gpu.power.requested_limit"],
        W,
        "The software power limit, W.",
        |_, g| power(&g.power_limit),
    ),
    field(
        &["enforced.power.limit", "gpu.power.current_limit"],
        W,
        "The power ceiling the power management enforces, W.",
        |_, g| power(&g.enforced_power_limit),
    ),
    field(
        &["power.default_limit", "gpu.power.default_limit"],
        W,
        "The default power limit, W.",
        |_, g| power(&g.default_power_limit),
    ),
    field(
        &["power.min_limit", "gpu.power.min_limit"],
        W,
        "The lowest power limit that may be set, W.",
        |_, g| g.power_limit_range.map(|(min, _)| watts(min)),
    ),
    field(
        &["power.max_limit", "gpu.power.max_limit"],
        W,
        "The highest power limit that may be set, W.",
        |_, g| g.power_limit_range.map(|(_, max)| watts(max)),
    ),
    field(
        &["clocks.current.graphics", "clocks.gr"],
        MHZ,
        "Current graphics clock.",
        |_, g| clock(&g.clocks, |c| &c.graphics),
    ),
    field(
        &["clocks.current.sm", "clocks.sm"],
        MHZ,
        "Current SM clock.",
        |_, g| clock(&g.clocks, |c| &c.sm),
    ),
    field(
        &["clocks.current.memory", "clocks.mem"],
        MHZ,
        "Current memory clock.",
        |_, g| clock(&g.clocks, |c| &c.memory),
    ),
    field(
        &["clocks.current.video", "clocks.video"],
        MHZ,
        "Current video clock.",
        |_, g| clock(&g.clocks, |c| &c.video),
    ),
    field(
        &["clocks.applications.graphics", "clocks.applications.gr"],
        MHZ,
        "Applications graphics clock.",
        |_, g| clock(&g.applications_clocks, |c| &c.graphics),
    ),
    field(
        &["clocks.applications.memory", "clocks.applications.mem"],
        MHZ,
        "Applications memory clock.",
        |_, g| clock(&g.applications_clocks, |c| &c.memory),
    ),
    field(
        &[
            "clocks.default_applications.graphics",
            "clocks.default_applications.gr",
        ],
        MHZ,
        "Default applications graphics clock.",
        |_, g| clock(&g.default_applications_clocks, |c| &c.graphics),
    ),
    field(
        &[
            "clocks.default_applications.memory",
            "clocks.default_applications.mem",
        ],
        MHZ,
        "Default applications memory clock.",
        |_, g| clock(&g.default_applications_clocks, |c| &c.memory),
    ),
    field(
        &["clocks.max.graphics", "clocks.max.gr"],
        MHZ,
        "Maximum graphics clock.",
        |_, g| clock(&g.max_clocks, |c| &c.graphics),
    ),
    field(&["clocks.max.sm"], MHZ, "Maximum SM clock.", |_, g| {
        clock(&g.max_clocks, |c| &c.sm)
    }),
    field(
        &["clocks.max.memory", "clocks.max.mem"],
        MHZ,
        "Maximum memory clock.",
        |_, g| clock(&g.max_clocks, |c| &c.memory),
    ),
    field(
        &["mig.mode.current"],
        None,
        "The MIG mode the GPU runs under.",
        |_, g| g.mig_mode.map(|(c, _)| enabled(c).to_string()),
    ),
    field(
        &["mig.mode.pending"],
        None,
        "The MIG mode after the next GPU reset.",
        |_, g| g.mig_mode.map(|(_, p)| enabled(p).to_string()),
    ),
    field(
        &["fabric.state"],
        None,
        "State of the GPU's fabric registration.",
        |_, g| fabric(g, |f| fabric_state(f).to_string()),
    ),
    field(
        &["fabric.status"],
        None,
        "Result of the fabric registration once completed.",
        |_, g| fabric(g, |f| fabric_status(f).to_string()),
    ),
    field(
        &["fabric.cliqueId"],
        None,
        "ID of the fabric clique of the GPU.",
        |_, g| fabric(g, |f| f.clique_id.to_string()),
    ),
    field(
        &["fabric.clusterUuid"],
        None,
        "UUID of the cluster of the GPU.",
        |_, g| fabric(g, cluster_uuid),
    ),
];

/// The CSV of `fields` for `gpus`.
pub fn render(ctx: &Ctx, gpus: &[Gpu], fields: &[&Field], header: bool, units: bool) -> String {
    let mut out = String::new();
    if header {
        let names: Vec<String> = fields.iter().map(|f| f.header()).collect();
        let _ = writeln!(out, "{}", names.join(", "));
    }
    for g in gpus {
        let cells: Vec<String> = fields.iter().map(|f| f.cell(ctx, g, units)).collect();
        let _ = writeln!(out, "{}", cells.join(", "));
    }
    out
}

/// `--help-query-gpu`: every field, its aliases and what it means.
pub fn help() -> String {
    let mut out =
        String::from("List of valid properties to query for the switch \"--query-gpu\":\n\n");
    for f in FIELDS {
        let names: Vec<String> = f.names.iter().map(|n| format!("\"{n}\"")).collect();
        let _ = writeln!(out, "{}\n{}\n", names.join(" or "), f.help);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::info::sample;
    use crate::words::tests::STAMP;

    const NAMES: &str = "index,name,uuid,pci.bus_id,driver_version,memory.total,memory.used,power.draw,power.limit,clocks.current.graphics,clocks.max.memory,temperature.gpu,fan.speed,utilization.gpu,compute_cap,pstate,persistence_mode,pcie.link.width.current,pci.device_id,count,timestamp";

    fn fields() -> Vec<&'static Field> {
        NAMES.split(',').map(|n| lookup(n).unwrap()).collect()
    }

    #[test]
    fn headers_and_values_as_the_real_tool_prints_them() {
        let sys = sample::system();
        let ctx = Ctx {
            sys: &sys,
            now: &STAMP,
        };
        let out = render(&ctx, &[sample::h200()], &fields(), true, true);
        let want = "index, name, uuid, pci.bus_id, driver_version, memory.total [MiB], memory.used [MiB], power.draw [W], power.limit [W], clocks.current.graphics [MHz], clocks.max.memory [MHz], temperature.gpu, fan.speed [%], utilization.gpu [%], compute_cap, pstate, persistence_mode, pcie.link.width.current, pci.device_id, count, timestamp
0, NVIDIA H200, GPU-00000000-0000-0000-0000-000000000000, 00000000:83:00.0, 580.173.02, 143771 MiB, 0 MiB, 85.12 W, 700.00 W, 345 MHz, 3201 MHz, 37, [N/A], 0 %, 9.0, P0, Enabled, 16, 0x233510DE, 1, 2026/09/01 20:41:56.941
";
        assert_eq!(out, want);
    }

    #[test]
    fn noheader_and_nounits() {
        let sys = sample::system();
        let ctx = Ctx {
            sys: &sys,
            now: &STAMP,
        };
        let out = render(&ctx, &[sample::h200()], &fields()[5..10], false, false);
        assert_eq!(out, "143771, 0, 85.12, 700.00, 345\n");
    }

    #[test]
    fn aliases_name_the_same_field() {
        assert_eq!(lookup("gpu_name").unwrap().name(), "name");
        assert_eq!(
            lookup("clocks.gr").unwrap().header(),
            "clocks.current.graphics [MHz]"
        );
        assert!(lookup("cuda_version").is_none());
        let names: Vec<&str> = FIELDS
            .iter()
            .flat_map(|f| f.names.iter().copied())
            .collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(names.len(), unique.len(), "a name is listed twice");
    }

    #[test]
    fn help_lists_every_field() {
        let h = help();
        assert!(
            FIELDS
                .iter()
                .all(|f| h.contains(&format!("\"{}\"", f.name())))
        );
    }
}
