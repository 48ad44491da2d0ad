//! Real GPU nodes: when the NVIDIA driver is loaded the agent mocks nothing and only reports
//! what the driver's own files say.

use std::path::Path;

use mockgpu_api::driver::{self, DriverGpu, TreeError};
use mockgpu_nri::StdFiles;

/// The GPUs of a loaded NVIDIA driver below `proc_root` (`/proc`) and `sys_root` (`/sys`),
/// read by the same parser that reads the mock's tree; `None` when no driver lists a GPU.
/// A driver whose files cannot be read still means report-only mode (never mock a real node):
/// the error is logged and no GPU is reported.
pub fn detect(proc_root: &Path, sys_root: &Path) -> Option<Vec<DriverGpu>> {
    if !real_driver_loaded(proc_root) {
        return None;
    }
    match read_gpus(proc_root, sys_root) {
        Ok(gpus) => Some(gpus),
        Err(e) => {
            tracing::error!(error = %e, "a real NVIDIA driver is loaded but its files cannot be read");
            Some(Vec::new())
        }
    }
}

/// Whether the real NVIDIA driver below `proc_root` (`/proc`) lists any GPU.
pub(crate) fn real_driver_loaded(proc_root: &Path) -> bool {
    driver::real_driver_loaded(&StdFiles, proc_root)
}

/// The GPUs of the driver tree below `proc_root` and `sys_root` (see [`driver::read_gpus`]).
pub(crate) fn read_gpus(proc_root: &Path, sys_root: &Path) -> Result<Vec<DriverGpu>, TreeError> {
    driver::read_gpus(&StdFiles, proc_root, sys_root)
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
        let minors: Vec<_> = gpus.iter().map(|g| g.gpu.minor).collect();
        assert_eq!(minors, (0..8).collect::<Vec<_>>());
        assert_eq!(gpus[0].information.model, "NVIDIA H100 80GB HBM3");
        for (g, t) in gpus.iter().zip(&topo.gpus) {
            assert_eq!(g.gpu.uuid, t.uuid);
            assert_eq!(g.gpu.bus_id, t.bus_id);
            assert_eq!(g.gpu.numa_node, t.numa_node);
        }
        // The h100 profile puts four GPUs on each socket.
        assert_eq!(gpus[0].gpu.cpus.to_list(), "0-3");
        assert_eq!(gpus[7].gpu.cpus.to_list(), "4-7");
        assert!(detect(dir.path(), dir.path()).is_none());
    }
}
