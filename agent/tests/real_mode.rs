//! Real-GPU mode reads the driver's files with the one parser that also reads what the renderer
//! writes: a rendered tree, read as if a real driver had written it, gives back the profile's
//! topology (identity and placement) for every built-in profile on the fake hosts.

use std::path::Path;

use mockgpu_agent::host::SysfsHost;
use mockgpu_agent::{output, real, render};
use mockgpu_api::{NodeTopology, Profile};

#[test]
fn a_rendered_tree_reads_back_as_the_profiles_topology() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for host_name in ["two-socket", "four-numa"] {
        let sysfs = fixtures.join(host_name);
        let host = SysfsHost::new(&sysfs).probe().unwrap();
        for (name, _) in mockgpu_api::profile::BUILTIN {
            let profile = Profile::builtin(name).unwrap();
            let topo = NodeTopology::build(&profile, "node-0", &host).unwrap();
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().join("tree");
            output::write_tree(&render::driver_tree(&topo, &host), &root).unwrap();
            // A real /sys has the CPU topology beside the PCI devices.
            std::os::unix::fs::symlink(
                sysfs.join("devices/system"),
                root.join("sys/devices/system"),
            )
            .unwrap();
            let read = real::detect(&root.join("proc"), &root.join("sys"))
                .unwrap_or_else(|| panic!("{name} on {host_name}: no GPUs read"));
            let gpus: Vec<_> = read.iter().map(|g| g.gpu.clone()).collect();
            assert_eq!(gpus, topo.gpus, "{name} on {host_name}");
            for g in &read {
                assert_eq!(g.information.model, profile.model, "{name}");
                assert!(!g.information.excluded);
            }
        }
    }
}
