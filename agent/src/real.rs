//! Real GPU nodes: when the NVIDIA driver is loaded the agent mocks nothing and only reports
//! what the driver's own files say.

use std::fs;
use std::path::Path;

/// A GPU as the real driver describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RealGpu {
    /// PCI bus id (the directory name).
    pub bus_id: String,
    /// `Model:`.
    pub model: String,
    /// `GPU UUID:`.
    pub uuid: String,
    /// `Device Minor:`.
    pub minor: Option<u32>,
    /// `local_cpulist` of the PCI device, when readable.
    pub local_cpulist: Option<String>,
}

/// The GPUs of a loaded NVIDIA driver below `proc_root` (`/proc`) and `sys_root` (`/sys`);
/// `None` when no driver is loaded (no GPU directories).
pub fn detect(proc_root: &Path, sys_root: &Path) -> Option<Vec<RealGpu>> {
    let gpus_dir = proc_root.join("driver/nvidia/gpus");
    let mut gpus: Vec<RealGpu> = fs::read_dir(gpus_dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let bus_id = e.file_name().into_string().ok()?;
            let info = fs::read_to_string(e.path().join("information")).ok()?;
            let field = |key: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .map(|v| v.trim().to_string())
                    .unwrap_or_default()
            };
            let cpus = sys_root.join(format!("bus/pci/devices/{bus_id}/local_cpulist"));
            Some(RealGpu {
                model: field("Model:"),
                uuid: field("GPU UUID:"),
                minor: field("Device Minor:").parse().ok(),
                local_cpulist: fs::read_to_string(cpus).ok().map(|s| s.trim().to_string()),
                bus_id,
            })
        })
        .collect();
    if gpus.is_empty() {
        return None;
    }
    gpus.sort_by_key(|g| (g.minor, g.bus_id.clone()));
    Some(gpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_rendered_tree_as_if_it_were_real() {
        // A fake two-socket host (CPUs 0-3 and 4-7), never this machine's /sys.
        let sysfs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/two-socket");
        let host = crate::host::SysfsHost::new(sysfs).probe().unwrap();
        let profile = mockgpu_api::Profile::builtin("h100").unwrap();
        let topo = mockgpu_api::NodeTopology::build(&profile, "n", &host).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("t");
        crate::output::write_tree(&crate::render::driver_tree(&topo, &host), &out).unwrap();
        let gpus = detect(&out.join("proc"), &out.join("sys")).unwrap();
        assert_eq!(gpus.len(), 8);
        let minors: Vec<_> = gpus.iter().map(|g| g.minor).collect();
        assert_eq!(minors, (0..8).map(Some).collect::<Vec<_>>());
        assert_eq!(gpus[0].model, "NVIDIA H100 80GB HBM3");
        for (g, t) in gpus.iter().zip(&topo.gpus) {
            assert_eq!(g.uuid, t.uuid);
            assert_eq!(g.bus_id, t.bus_id.to_string());
        }
        // The h100 profile puts four GPUs on each socket.
        assert_eq!(gpus[0].local_cpulist.as_deref(), Some("0-3"));
        assert_eq!(gpus[7].local_cpulist.as_deref(), Some("4-7"));
        assert!(detect(dir.path(), dir.path()).is_none());
    }
}
