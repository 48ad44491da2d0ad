//! Parses rendered trees the way Slurm's gpu/nvidia plugin does (docs/driver-files.md), with a
//! parser written here independently of the renderer, and checks what Slurm would detect.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// What slurmd's AutoDetect=nvidia derives from one GPU directory.
#[derive(Debug)]
struct Detected {
    gres_type: String,
    minor: u32,
    cpus: BTreeSet<u32>,
}

/// Slurm's rules: `Model:` lowercased with spaces turned into `_`, `Device Minor:`, keys matched
/// case-sensitively at the start of a line; `local_cpulist` parsed as a CPU list, last line wins.
fn detect(root: &Path) -> Vec<Detected> {
    let gpus = root.join("proc/driver/nvidia/gpus");
    let mut found = Vec::new();
    for entry in fs::read_dir(&gpus).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.len() < 5 {
            continue;
        }
        let info = fs::read_to_string(gpus.join(&name).join("information")).unwrap();
        let mut gres_type = None;
        let mut minor = None;
        for line in info.lines() {
            if let Some(v) = line.strip_prefix("Model:") {
                gres_type = Some(
                    v.trim_start_matches([' ', '\t'])
                        .to_lowercase()
                        .replace(' ', "_"),
                );
            } else if let Some(v) = line.strip_prefix("Device Minor:") {
                minor = Some(v.trim().parse::<u32>().unwrap());
            }
        }
        let cpulist = fs::read_to_string(
            root.join("sys/bus/pci/drivers/nvidia")
                .join(&name)
                .join("local_cpulist"),
        )
        .unwrap();
        let last = cpulist.lines().last().unwrap_or("");
        let mut cpus = BTreeSet::new();
        for part in last.split(',').filter(|p| !p.is_empty()) {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            cpus.extend(a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap());
        }
        found.push(Detected {
            gres_type: gres_type.unwrap(),
            minor: minor.unwrap(),
            cpus,
        });
    }
    found.sort_by_key(|d| d.minor);
    found
}

#[test]
fn slurm_detects_the_profiles_gpus() {
    let socket0: BTreeSet<u32> = (0..4).collect();
    let socket1: BTreeSet<u32> = (4..8).collect();
    let cases = [
        ("gb300", "nvidia_gb300", 4),
        ("gb200", "nvidia_gb200", 4),
        ("b200", "nvidia_b200", 8),
        ("h200", "nvidia_h200", 8),
        ("h100", "nvidia_h100_80gb_hbm3", 8),
        ("a100", "nvidia_a100-sxm4-40gb", 8),
        ("l40s", "nvidia_l40s", 1),
        ("t4", "tesla_t4", 1),
    ];
    for (profile, gres_type, count) in cases {
        let (_, tree) = common::fixed_tree(profile);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        mockgpu_agent::output::write_tree(&tree, &root).unwrap();
        let found = detect(&root);
        assert_eq!(found.len(), count, "{profile}");
        for (i, d) in found.iter().enumerate() {
            assert_eq!(d.gres_type, gres_type, "{profile}");
            assert_eq!(d.minor, i as u32, "{profile}");
            // Each GPU's CPUs are exactly one whole host socket: the first half of the GPUs on
            // socket 0, the second half on socket 1 (single-GPU boards on socket 0).
            let want = if i < count.div_ceil(2) {
                &socket0
            } else {
                &socket1
            };
            assert_eq!(&d.cpus, want, "{profile} GPU {i}");
        }
    }
}
