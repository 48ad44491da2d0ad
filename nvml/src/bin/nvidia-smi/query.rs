//! `nvidia-smi -q [-d …]`: the `NVSMI LOG`, one indented block per GPU.

use std::fmt::{Display as Show, Write as _};

use crate::info::{EccErrors, Gpu, System};
use crate::nvml::Val;
use crate::words::{
    EVENT_REASONS, Stamp, active, architecture, brand, cluster_uuid, compute_mode, cuda_version,
    enabled, fabric_state, fabric_status, mib, or_na, pstate, watts,
};

/// The groups `-d` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Display {
    Memory,
    Utilization,
    Ecc,
    Temperature,
    Power,
    Clock,
    Compute,
    Pids,
    Performance,
    PageRetirement,
    RowRemapper,
}

impl Display {
    /// Every group with the name `-d` takes.
    pub const ALL: [(&'static str, Display); 11] = [
        ("MEMORY", Display::Memory),
        ("UTILIZATION", Display::Utilization),
        ("ECC", Display::Ecc),
        ("TEMPERATURE", Display::Temperature),
        ("POWER", Display::Power),
        ("CLOCK", Display::Clock),
        ("COMPUTE", Display::Compute),
        ("PIDS", Display::Pids),
        ("PERFORMANCE", Display::Performance),
        ("PAGE_RETIREMENT", Display::PageRetirement),
        ("ROW_REMAPPER", Display::RowRemapper),
    ];

    pub fn parse(name: &str) -> Option<Display> {
        Display::ALL
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|&(_, d)| d)
    }
}

/// Lines of `key : value` with the key column of the driver's branch.
struct Doc {
    out: String,
    width: usize,
}

impl Doc {
    fn head(&mut self, depth: usize, name: &str) {
        let _ = writeln!(self.out, "{}{name}", "    ".repeat(depth));
    }

    fn kv(&mut self, depth: usize, key: &str, value: impl Show) {
        self.kv_in(self.width, depth, key, value);
    }

    fn kv_in(&mut self, width: usize, depth: usize, key: &str, value: impl Show) {
        let label = format!("{}{key}", "    ".repeat(depth));
        let _ = writeln!(self.out, "{label:<width$}: {value}");
    }

    fn val<T>(&mut self, depth: usize, key: &str, v: &Val<T>, f: impl FnOnce(&T) -> String) {
        self.kv(depth, key, or_na(v, f));
    }
}

fn with_unit<T: Show>(unit: &'static str) -> impl Fn(&T) -> String {
    move |v| format!("{v} {unit}")
}

fn yes_no(b: bool) -> String {
    if b { "Yes" } else { "No" }.to_string()
}

fn ecc_block(doc: &mut Doc, name: &str, e: &EccErrors) {
    doc.head(2, name);
    for (key, v) in [
        ("SRAM Correctable", &e.sram_corrected),
        ("SRAM Uncorrectable", &e.sram_uncorrected),
        ("DRAM Correctable", &e.dram_corrected),
        ("DRAM Uncorrectable", &e.dram_uncorrected),
    ] {
        doc.val(3, key, v, u64::to_string);
    }
}

fn clocks_block(doc: &mut Doc, name: &str, c: &crate::info::Clocks, all: bool) {
    doc.head(1, name);
    let mhz = with_unit::<u32>("MHz");
    doc.val(2, "Graphics", &c.graphics, &mhz);
    if all {
        doc.val(2, "SM", &c.sm, &mhz);
    }
    doc.val(2, "Memory", &c.memory, &mhz);
    if all {
        doc.val(2, "Video", &c.video, &mhz);
    }
}

fn identity(doc: &mut Doc, g: &Gpu) {
    let text = |s: &String| s.clone();
    doc.val(1, "Product Name", &g.name, text);
    doc.val(1, "Product Brand", &g.brand, |&b| brand(b).to_string());
    doc.val(1, "Product Architecture", &g.architecture, |&a| {
        architecture(a).to_string()
    });
    doc.val(1, "Display Mode", &g.display_mode, |&m| {
        enabled(m).to_string()
    });
    doc.val(1, "Display Active", &g.display_active, |&m| {
        enabled(m).to_string()
    });
    doc.val(1, "Persistence Mode", &g.persistence_mode, |&m| {
        enabled(m).to_string()
    });
    doc.head(1, "MIG Mode");
    doc.val(2, "Current", &g.mig_mode, |&(c, _)| enabled(c).to_string());
    doc.val(2, "Pending", &g.mig_mode, |&(_, p)| enabled(p).to_string());
    doc.val(1, "Serial Number", &g.serial, text);
    doc.val(1, "GPU UUID", &g.uuid, text);
    doc.val(1, "Minor Number", &g.minor, u32::to_string);
    doc.val(1, "VBIOS Version", &g.vbios, text);
    doc.val(1, "Board Part Number", &g.board_part_number, text);
    doc.head(1, "Inforom Version");
    doc.val(2, "Image Version", &g.inforom_image, text);
    doc.head(1, "PCI");
    doc.val(2, "Bus", &g.pci, |p| format!("0x{:02X}", p.bus));
    doc.val(2, "Device", &g.pci, |p| format!("0x{:02X}", p.device));
    doc.val(2, "Domain", &g.pci, |p| format!("0x{:04X}", p.domain));
    doc.val(2, "Device Id", &g.pci, |p| format!("0x{:08X}", p.device_id));
    doc.val(2, "Bus Id", &g.pci, |p| p.bus_id.clone());
    doc.val(2, "Sub System Id", &g.pci, |p| {
        format!("0x{:08X}", p.sub_system_id)
    });
    doc.head(2, "GPU Link Info");
    doc.head(3, "PCIe Generation");
    doc.val(4, "Max", &g.max_pcie_generation, u32::to_string);
    doc.val(4, "Current", &g.pcie_generation, u32::to_string);
    doc.val(4, "Device Max", &g.gpu_max_pcie_generation, u32::to_string);
    doc.head(3, "Link Width");
    doc.val(4, "Max", &g.max_pcie_width, |w| format!("{w}x"));
    doc.val(4, "Current", &g.pcie_width, |w| format!("{w}x"));
    doc.val(1, "Fan Speed", &g.fan_speed, with_unit("%"));
}

fn gpu_block(doc: &mut Doc, g: &Gpu, show: &dyn Fn(Display) -> bool, full: bool) {
    let bus_id = or_na(&g.bus_id().map(str::to_string), Clone::clone);
    doc.head(0, &format!("GPU {bus_id}"));
    if full {
        identity(doc, g);
    }
    if show(Display::Performance) {
        doc.val(1, "Performance State", &g.performance_state, |&p| pstate(p));
        doc.head(1, "Clocks Event Reasons");
        for (depth, label, bit) in EVENT_REASONS {
            doc.val(depth, label, &g.event_reason(bit), |&on| {
                active(on).to_string()
            });
        }
    }
    if show(Display::Memory) {
        let m = with_unit::<u64>("MiB");
        doc.head(1, "FB Memory Usage");
        doc.val(2, "Total", &g.memory, |x| m(&mib(x.total)));
        doc.val(
            2,
            "Reserved",
            &g.memory
                .and_then(|x| x.reserved.ok_or(crate::nvml::Ret::NOT_SUPPORTED)),
            |&r| m(&mib(r)),
        );
        doc.val(2, "Used", &g.memory, |x| m(&mib(x.used)));
        doc.val(2, "Free", &g.memory, |x| m(&mib(x.free)));
        doc.head(1, "BAR1 Memory Usage");
        doc.val(2, "Total", &g.bar1, |x| m(&mib(x.total)));
        doc.val(2, "Used", &g.bar1, |x| m(&mib(x.used)));
        doc.val(2, "Free", &g.bar1, |x| m(&mib(x.free)));
    }
    if show(Display::Compute) {
        doc.val(1, "Compute Mode", &g.compute_mode, |&c| {
            compute_mode(c).to_string()
        });
    }
    if show(Display::Utilization) {
        doc.head(1, "Utilization");
        doc.val(2, "GPU", &g.utilization, |(u, _)| format!("{u} %"));
        doc.val(2, "Memory", &g.utilization, |(_, u)| format!("{u} %"));
    }
    if show(Display::Ecc) {
        doc.head(1, "ECC Mode");
        doc.val(2, "Current", &g.ecc_mode, |&(c, _)| enabled(c).to_string());
        doc.val(2, "Pending", &g.ecc_mode, |&(_, p)| enabled(p).to_string());
        doc.head(1, "ECC Errors");
        ecc_block(doc, "Volatile", &g.ecc_volatile);
        ecc_block(doc, "Aggregate", &g.ecc_aggregate);
    }
    if show(Display::PageRetirement) {
        doc.head(1, "Retired Pages");
        doc.val(2, "Single Bit ECC", &g.retired_single_bit, u32::to_string);
        doc.val(2, "Double Bit ECC", &g.retired_double_bit, u32::to_string);
        doc.val(2, "Pending Page Blacklist", &g.retired_pending, |&p| {
            yes_no(p)
        });
    }
    if show(Display::RowRemapper) {
        match &g.remapped_rows {
            Ok(r) => {
                doc.head(1, "Remapped Rows");
                doc.kv(2, "Correctable Error", r.correctable);
                doc.kv(2, "Uncorrectable Error", r.uncorrectable);
                doc.kv(2, "Pending", yes_no(r.pending));
                doc.kv(2, "Remapping Failure Occurred", yes_no(r.failure));
            }
            Err(e) => doc.kv(1, "Remapped Rows", e.na()),
        }
    }
    if show(Display::Temperature) {
        let c = with_unit::<u32>("C");
        doc.head(1, "Temperature");
        doc.val(2, "GPU Current Temp", &g.temperature, &c);
        doc.val(2, "GPU Shutdown Temp", &g.shutdown_temperature, &c);
        doc.val(2, "GPU Slowdown Temp", &g.slowdown_temperature, &c);
        doc.val(
            2,
            "GPU Max Operating Temp",
            &g.max_operating_temperature,
            &c,
        );
        doc.val(
            2,
            "Memory Max Operating Temp",
            &g.memory_max_temperature,
            &c,
        );
    }
    if show(Display::Power) {
        let w = |&mw: &u32| format!("{} W", watts(mw));
        doc.head(1, "GPU Power Readings");
        doc.val(2, "Average Power Draw", &g.power_draw, w);
        doc.val(2, "Current Power Limit", &g.enforced_power_limit, w);
        doc.val(2, "Requested Power Limit", &g.power_limit, w);
        doc.val(2, "Default Power Limit", &g.default_power_limit, w);
        doc.val(2, "Min Power Limit", &g.power_limit_range, |(min, _)| {
            w(min)
        });
        doc.val(2, "Max Power Limit", &g.power_limit_range, |(_, max)| {
            w(max)
        });
    }
    if show(Display::Clock) {
        clocks_block(doc, "Clocks", &g.clocks, true);
        clocks_block(doc, "Applications Clocks", &g.applications_clocks, false);
        clocks_block(
            doc,
            "Default Applications Clocks",
            &g.default_applications_clocks,
            false,
        );
        clocks_block(doc, "Max Clocks", &g.max_clocks, true);
        doc.head(1, "Max Customer Boost Clocks");
        doc.val(2, "Graphics", &g.max_boost_graphics, with_unit("MHz"));
    }
    if full {
        doc.head(1, "Fabric");
        doc.val(2, "State", &g.fabric, |f| fabric_state(f).to_string());
        doc.val(2, "Status", &g.fabric, |f| fabric_status(f).to_string());
        doc.val(2, "CliqueId", &g.fabric, |f| f.clique_id.to_string());
        doc.val(2, "ClusterUUID", &g.fabric, cluster_uuid);
    }
    if show(Display::Pids) {
        match &g.processes {
            Ok(ps) if ps.is_empty() => doc.kv(1, "Processes", "None"),
            Ok(ps) => {
                doc.head(1, "Processes");
                for p in ps {
                    doc.kv_in(42, 2, "GPU instance ID", "N/A");
                    doc.kv_in(42, 2, "Compute instance ID", "N/A");
                    doc.kv_in(42, 2, "Process ID", p.pid);
                    doc.kv_in(42, 3, "Type", "C");
                    doc.kv_in(42, 3, "Name", or_na(&p.name, Clone::clone));
                    doc.kv_in(
                        42,
                        3,
                        "Used GPU Memory",
                        format!("{} MiB", mib(p.used_memory)),
                    );
                }
            }
            Err(e) => doc.kv(1, "Processes", e.na()),
        }
    }
    let _ = writeln!(doc.out);
}

/// The log of `gpus`, with only the groups of `display` when given.
pub fn render(sys: &System, gpus: &[Gpu], display: Option<&[Display]>, now: &Stamp) -> String {
    let width = if sys.driver_major().unwrap_or(580) >= 580 {
        55
    } else {
        42
    };
    let mut doc = Doc {
        out: String::from("\n==============NVSMI LOG==============\n\n"),
        width,
    };
    doc.kv(0, "Timestamp", now.ctime());
    doc.val(0, "Driver Version", &sys.driver, Clone::clone);
    doc.val(0, "CUDA Version", &sys.cuda, |&v| cuda_version(v));
    let _ = writeln!(doc.out);
    doc.val(0, "Attached GPUs", &sys.count, u32::to_string);
    let show = |d: Display| display.is_none_or(|ds| ds.contains(&d));
    for g in gpus {
        gpu_block(&mut doc, g, &show, display.is_none());
    }
    doc.out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::info::sample;
    use crate::words::tests::STAMP;

    #[test]
    fn memory_display_as_the_real_tool_prints_it() {
        let out = render(
            &sample::system(),
            &[sample::h200()],
            Some(&[Display::Memory]),
            &STAMP,
        );
        let want = "
==============NVSMI LOG==============

Timestamp                                              : Tue Sep  1 20:41:56 2026
Driver Version                                         : 580.173.02
CUDA Version                                           : 13.0

Attached GPUs                                          : 1
GPU 00000000:83:00.0
    FB Memory Usage
        Total                                          : 143771 MiB
        Reserved                                       : 616 MiB
        Used                                           : 0 MiB
        Free                                           : 143156 MiB
    BAR1 Memory Usage
        Total                                          : 262144 MiB
        Used                                           : 1 MiB
        Free                                           : 262143 MiB

";
        assert_eq!(out, want);
    }

    #[test]
    fn full_query_has_the_real_lines() {
        let out = render(&sample::system(), &[sample::h200()], None, &STAMP);
        for line in [
            "    Product Name                                       : NVIDIA H200",
            "    Product Brand                                      : NVIDIA",
            "    Product Architecture                               : Hopper",
            "    Persistence Mode                                   : Enabled",
            "        Current                                        : Disabled",
            "    GPU UUID                                           : GPU-00000000-0000-0000-0000-000000000000",
            "    VBIOS Version                                      : 96.00.A5.00.03",
            "        Device Id                                      : 0x233510DE",
            "        Bus Id                                         : 00000000:83:00.0",
            "        Sub System Id                                  : 0x18BE10DE",
            "                Max                                    : 5",
            "                Current                                : 16x",
            "    Fan Speed                                          : N/A",
            "    Performance State                                  : P0",
            "        Idle                                           : Active",
            "            HW Thermal Slowdown                        : Not Active",
            "    Compute Mode                                       : Default",
            "        GPU                                            : 0 %",
            "        Current                                        : Enabled",
            "        Single Bit ECC                                 : N/A",
            "        Pending                                        : No",
            "        GPU Current Temp                               : 37 C",
            "        Average Power Draw                             : 85.12 W",
            "        Min Power Limit                                : 200.00 W",
            "        Video                                          : 765 MHz",
            "        State                                          : Completed",
            "        ClusterUUID                                    : 00000000-0000-0000-0000-000000000000",
            "    Processes                                          : None",
        ] {
            assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
        }
        assert!(out.ends_with("    Processes                                          : None\n\n"));
    }

    #[test]
    fn older_branches_use_the_narrow_key_column() {
        let mut sys = sample::system();
        sys.driver = Ok("570.124.06".to_string());
        let out = render(&sys, &[sample::h200()], Some(&[Display::Compute]), &STAMP);
        assert!(out.contains("\n    Compute Mode                          : Default\n"));
    }

    #[test]
    fn display_names_parse_in_any_case() {
        assert_eq!(Display::parse("row_remapper"), Some(Display::RowRemapper));
        assert_eq!(Display::parse("VOLTAGE"), None);
    }
}
