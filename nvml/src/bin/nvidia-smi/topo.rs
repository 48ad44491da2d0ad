//! `nvidia-smi topo -m`: the tab-separated matrix of GPU connections and the legend.

use std::fmt::Write as _;

use crate::info::{Link, Topology};
use crate::words::{or_na, ranges};

const LEGEND: &str = "\
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
";

/// The matrix's word for a link (`nvmlGpuTopologyLevel_t` for PCIe paths).
fn link(l: Link) -> String {
    match l {
        Link::Nvlinks(n) => format!("NV{n}"),
        Link::Pcie(0 | 10) => "PIX".to_string(),
        Link::Pcie(20) => "PXB".to_string(),
        Link::Pcie(30) => "PHB".to_string(),
        Link::Pcie(40) => "NODE".to_string(),
        Link::Pcie(_) => "SYS".to_string(),
        Link::Unknown(e) => e.na().to_string(),
    }
}

pub fn render(t: &Topology) -> String {
    let mut out = String::new();
    for i in 0..t.gpus.len() {
        let _ = write!(out, "\tGPU{i}");
    }
    let _ = writeln!(out, "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID");
    for (i, g) in t.gpus.iter().enumerate() {
        let _ = write!(out, "GPU{i}");
        for (j, &l) in t.links[i].iter().enumerate() {
            let cell = if i == j { " X ".to_string() } else { link(l) };
            let _ = write!(out, "\t{cell}");
        }
        let cpus = or_na(&g.cpus, |c| ranges(c));
        let nodes = match &g.numa_nodes {
            Ok(n) if !n.is_empty() => ranges(n),
            Ok(_) => "N/A".to_string(),
            Err(e) => e.na().to_string(),
        };
        let id = or_na(&g.numa_id, u32::to_string);
        let _ = writeln!(out, "\t{cpus}\t{nodes}\t\t{id}");
    }
    let _ = write!(out, "\n{LEGEND}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::info::TopoGpu;
    use crate::nvml::Ret;

    fn gpu(cpus: std::ops::Range<u32>, node: u32) -> TopoGpu {
        TopoGpu {
            cpus: Ok(cpus.collect()),
            numa_nodes: Ok(vec![node]),
            numa_id: Err(Ret::NOT_SUPPORTED),
        }
    }

    /// A GB200-shaped tray: four GPUs on NVLink, two per Grace socket.
    #[test]
    fn nvlink_matrix_as_the_real_tool_prints_it() {
        let nv = Link::Nvlinks(18);
        let t = Topology {
            gpus: vec![
                gpu(0..72, 0),
                gpu(0..72, 0),
                gpu(72..144, 1),
                gpu(72..144, 1),
            ],
            links: (0..4)
                .map(|i| {
                    (0..4)
                        .map(|j| if i == j { Link::Pcie(0) } else { nv })
                        .collect()
                })
                .collect(),
        };
        let out = render(&t);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
        );
        assert_eq!(lines[1], "GPU0\t X \tNV18\tNV18\tNV18\t0-71\t0\t\tN/A");
        assert_eq!(lines[4], "GPU3\tNV18\tNV18\tNV18\t X \t72-143\t1\t\tN/A");
        assert_eq!(lines[5], "");
        assert_eq!(lines[6], "Legend:");
        assert!(out.ends_with("  NV#  = Connection traversing a bonded set of # NVLinks\n"));
    }

    #[test]
    fn pcie_levels_are_named() {
        assert_eq!(link(Link::Pcie(10)), "PIX");
        assert_eq!(link(Link::Pcie(20)), "PXB");
        assert_eq!(link(Link::Pcie(30)), "PHB");
        assert_eq!(link(Link::Pcie(40)), "NODE");
        assert_eq!(link(Link::Pcie(50)), "SYS");
        assert_eq!(link(Link::Unknown(Ret::NOT_SUPPORTED)), "N/A");
    }
}
