//! GPU profiles: the YAML schema, the built-in boards, overrides and validation.
//!
//! A profile file is either complete or names a built-in `base` and overrides some of its
//! fields. Unknown keys and impossible values are rejected with an error naming the source
//! and the field.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::BusId;
use crate::nvml::{Nvml, NvmlSpec};

/// The built-in profiles, by name; the first is the default.
pub const BUILTIN: &[(&str, &str)] = &[
    ("gb300", include_str!("../profiles/gb300.yaml")),
    ("gb200", include_str!("../profiles/gb200.yaml")),
    ("b200", include_str!("../profiles/b200.yaml")),
    ("h200", include_str!("../profiles/h200.yaml")),
    ("h100", include_str!("../profiles/h100.yaml")),
    ("a100", include_str!("../profiles/a100.yaml")),
    ("l40s", include_str!("../profiles/l40s.yaml")),
    ("t4", include_str!("../profiles/t4.yaml")),
];

/// The default profile's name.
pub const DEFAULT_PROFILE: &str = "gb300";

/// Most GPUs a profile may put on one node.
pub const MAX_GPUS: u32 = 64;

/// A profile that cannot be used, with where it came from and which field is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("profile {origin}: {}{message}", field.as_ref().map(|f| format!("field `{f}`: ")).unwrap_or_default())]
pub struct ProfileError {
    /// Where the profile came from (a file path, or `built-in NAME`).
    pub origin: String,
    /// The offending field, when one can be named.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

/// A driver version such as `580.173.02`, ordered numerically.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DriverVersion {
    parts: Vec<u32>,
    text: String,
}

impl DriverVersion {
    /// Whether this version is at least `major.minor`.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        let own = (self.major(), self.parts.get(1).copied().unwrap_or(0));
        own >= (major, minor)
    }

    /// The driver branch (`580` for `580.173.02`).
    pub fn major(&self) -> u32 {
        self.parts.first().copied().unwrap_or(0)
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for DriverVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Option<Vec<u32>> = s
            .split('.')
            .map(|p| {
                (!p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| p.parse().ok())
                    .flatten()
            })
            .collect();
        match parts {
            Some(parts) if (2..=3).contains(&parts.len()) && parts[0] >= 100 => Ok(Self {
                parts,
                text: s.to_string(),
            }),
            _ => Err(format!(
                "{s:?} is not a driver version like 580.173.02 (branch >= 100, 2 or 3 numbers)"
            )),
        }
    }
}

/// CPU architecture the driver is built for (it appears in `/proc/driver/nvidia/version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    /// 64-bit x86.
    #[default]
    X86_64,
    /// 64-bit Arm (Grace).
    Aarch64,
}

impl Arch {
    /// The name the driver prints.
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }
}

/// A profile as written in YAML: every field optional, so that overrides can be partial.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileSpec {
    /// Built-in profile to start from.
    pub base: Option<String>,
    /// Profile name; part of the GPUs' identity.
    pub name: Option<String>,
    /// Model string as the kernel module prints it (`Model:`); Slurm's GRES type derives from it.
    pub model: Option<String>,
    /// Number of GPUs on the node.
    pub gpus: Option<u32>,
    /// GPUs per CPU socket, in socket order; the sum must equal `gpus`.
    pub sockets: Option<Vec<u32>>,
    /// PCI device id.
    pub pci_device: Option<u16>,
    /// PCI subsystem vendor id (default NVIDIA, 0x10de).
    pub subsystem_vendor: Option<u16>,
    /// PCI subsystem device id.
    pub subsystem_device: Option<u16>,
    /// PCI class code (default 0x030200, 3D controller).
    pub class: Option<u32>,
    /// PCI revision (default 0xa1).
    pub revision: Option<u8>,
    /// Bus ids of the GPUs in minor order; missing ones are generated after the last.
    pub bus_ids: Option<Vec<BusId>>,
    /// Video BIOS version (`97.10.4A.00.1A`).
    pub vbios: Option<String>,
    /// Driver version; file formats follow its branch.
    pub driver_version: Option<String>,
    /// Memory per GPU in MiB.
    pub memory_mib: Option<u64>,
    /// PCIe generation of the link (3..=6).
    pub pcie_gen: Option<u8>,
    /// PCIe link width (default 16).
    pub pcie_width: Option<u8>,
    /// Architecture of the driver build (default x86_64).
    pub arch: Option<Arch>,
    /// Whether the open kernel module is loaded (default true) or the proprietary one.
    pub open_kernel_module: Option<bool>,
    /// Whether GPU memory is coherent with the CPU (GB200/GB300 class).
    pub coherent_memory: Option<bool>,
    /// Render `numa_status` (only with `coherent_memory`; off by default because hwloc removes
    /// the NUMA node it names).
    pub numa_status: Option<bool>,
    /// Indices of GPUs that have failed: still rendered, but reported unhealthy (the device
    /// plugin advertises them as `Unhealthy`, so the kubelet stops counting them).
    pub failed_gpus: Option<Vec<u32>>,
    /// What only NVML reports (clocks, power, temperatures, NVLink, …); see [`crate::nvml`].
    pub nvml: Option<NvmlSpec>,
}

/// A complete, validated profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// Profile name.
    pub name: String,
    /// Model string (`NVIDIA GB300`).
    pub model: String,
    /// GPUs per socket; the sum is the GPU count.
    pub sockets: Vec<u32>,
    /// PCI device id.
    pub pci_device: u16,
    /// PCI subsystem vendor id.
    pub subsystem_vendor: u16,
    /// PCI subsystem device id.
    pub subsystem_device: u16,
    /// PCI class code.
    pub class: u32,
    /// PCI revision.
    pub revision: u8,
    /// Requested bus ids, one per GPU.
    pub bus_ids: Vec<BusId>,
    /// Video BIOS version, uppercase as NVML prints it.
    pub vbios: String,
    /// Driver version.
    pub driver_version: DriverVersion,
    /// Memory per GPU in MiB.
    pub memory_mib: u64,
    /// PCIe generation.
    pub pcie_gen: u8,
    /// PCIe link width.
    pub pcie_width: u8,
    /// Driver architecture.
    pub arch: Arch,
    /// Open kernel module or proprietary.
    pub open_kernel_module: bool,
    /// Coherent CPU-GPU memory.
    pub coherent_memory: bool,
    /// Render `numa_status`.
    pub numa_status: bool,
    /// Indices of failed GPUs, ascending and below the GPU count (not part of the GPUs'
    /// identity: a GPU keeps its UUID when it fails).
    pub failed_gpus: Vec<u32>,
    /// What only NVML reports.
    pub nvml: Nvml,
}

impl Profile {
    /// The number of GPUs.
    pub fn gpu_count(&self) -> u32 {
        self.sockets.iter().sum()
    }

    /// A built-in profile by name.
    pub fn builtin(name: &str) -> Result<Profile, ProfileError> {
        let text = builtin_text(name).ok_or_else(|| ProfileError {
            origin: format!("built-in {name}"),
            field: None,
            message: format!(
                "no such built-in profile (known: {})",
                BUILTIN
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })?;
        Profile::from_yaml(text, &format!("built-in {name}"))
    }

    /// Parses and validates a profile document; `source` names it in errors.
    pub fn from_yaml(text: &str, source: &str) -> Result<Profile, ProfileError> {
        let spec = parse_spec(text, source)?;
        match spec.base.clone() {
            None => spec.resolve(source),
            Some(base) => {
                let base_text = builtin_text(&base).ok_or_else(|| ProfileError {
                    origin: source.to_string(),
                    field: Some("base".into()),
                    message: format!("no built-in profile named {base:?}"),
                })?;
                let base_spec = parse_spec(base_text, &format!("built-in {base}"))?;
                base_spec.overlay(spec).resolve(source)
            }
        }
    }
}

fn builtin_text(name: &str) -> Option<&'static str> {
    BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// Parses one profile document. Only the YAML 1.2 booleans (`true`, `false`) are booleans, and
/// errors are one line ending in `at line L, column C` (no excerpt of the file: they are logged).
/// serde-saphyr's default budget bounds hostile input (alias bombs, deep nesting).
fn parse_spec(text: &str, source: &str) -> Result<ProfileSpec, ProfileError> {
    let options = serde_saphyr::options! {
        strict_booleans: true,
        with_snippet: false,
    };
    serde_saphyr::from_str_with_options(text, options).map_err(|e| ProfileError {
        origin: source.to_string(),
        field: None,
        message: e.to_string(),
    })
}

impl ProfileSpec {
    /// `self` with every field that `over` sets replaced. When `over` changes the GPU count but
    /// not the socket layout, the GPUs are spread evenly over the same number of sockets.
    fn overlay(self, over: ProfileSpec) -> ProfileSpec {
        let sockets = match (&over.sockets, over.gpus, &self.sockets) {
            (None, Some(gpus), Some(base)) if !base.is_empty() => {
                let n = base.len() as u32;
                Some((0..n).map(|i| gpus / n + u32::from(i < gpus % n)).collect())
            }
            _ => over.sockets.or(self.sockets),
        };
        ProfileSpec {
            base: over.base,
            name: over.name.or(self.name),
            model: over.model.or(self.model),
            gpus: over.gpus.or(self.gpus),
            sockets,
            pci_device: over.pci_device.or(self.pci_device),
            subsystem_vendor: over.subsystem_vendor.or(self.subsystem_vendor),
            subsystem_device: over.subsystem_device.or(self.subsystem_device),
            class: over.class.or(self.class),
            revision: over.revision.or(self.revision),
            bus_ids: over.bus_ids.or(self.bus_ids),
            vbios: over.vbios.or(self.vbios),
            driver_version: over.driver_version.or(self.driver_version),
            memory_mib: over.memory_mib.or(self.memory_mib),
            pcie_gen: over.pcie_gen.or(self.pcie_gen),
            pcie_width: over.pcie_width.or(self.pcie_width),
            arch: over.arch.or(self.arch),
            open_kernel_module: over.open_kernel_module.or(self.open_kernel_module),
            coherent_memory: over.coherent_memory.or(self.coherent_memory),
            numa_status: over.numa_status.or(self.numa_status),
            failed_gpus: over.failed_gpus.or(self.failed_gpus),
            nvml: match (self.nvml, over.nvml) {
                (Some(base), Some(over)) => Some(base.overlay(over)),
                (base, over) => over.or(base),
            },
        }
    }

    fn resolve(self, source: &str) -> Result<Profile, ProfileError> {
        let err = |field: &str, message: String| ProfileError {
            origin: source.to_string(),
            field: Some(field.to_string()),
            message,
        };
        let missing = |field: &str| err(field, "is required (or name a built-in `base`)".into());

        let name = self.name.ok_or_else(|| missing("name"))?;
        if name.is_empty()
            || name.len() > 63
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        {
            return Err(err(
                "name",
                format!("{name:?} must be 1-63 characters of [A-Za-z0-9._-]"),
            ));
        }
        let model = self.model.ok_or_else(|| missing("model"))?;
        if model.trim().is_empty() || model.len() > 96 {
            return Err(err("model", format!("{model:?} must be 1-96 characters")));
        }
        if let Some(c) = model.chars().find(|c| c.is_control()) {
            return Err(err(
                "model",
                format!("{model:?} contains the control character {c:?}"),
            ));
        }
        let gpus = self.gpus.ok_or_else(|| missing("gpus"))?;
        if !(1..=MAX_GPUS).contains(&gpus) {
            return Err(err(
                "gpus",
                format!("{gpus} is out of range (1 to {MAX_GPUS})"),
            ));
        }
        let sockets = self.sockets.unwrap_or_else(|| vec![gpus]);
        let placed: u64 = sockets.iter().map(|&s| u64::from(s)).sum();
        if sockets.is_empty() || sockets.len() > 16 || placed != u64::from(gpus) {
            return Err(err(
                "sockets",
                format!(
                    "{sockets:?} places {placed} GPUs on {} sockets, but gpus is {gpus} (need 1 to 16 sockets whose GPU counts add up to gpus)",
                    sockets.len()
                ),
            ));
        }
        let driver_version: DriverVersion = self
            .driver_version
            .ok_or_else(|| missing("driver_version"))?
            .parse()
            .map_err(|m| err("driver_version", m))?;
        let vbios = self.vbios.ok_or_else(|| missing("vbios"))?;
        let vbios_ok = vbios.split('.').count() == 5
            && vbios
                .split('.')
                .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()));
        if !vbios_ok {
            return Err(err(
                "vbios",
                format!("{vbios:?} is not five dot-separated hex bytes like 97.10.4A.00.1A"),
            ));
        }
        let memory_mib = self.memory_mib.ok_or_else(|| missing("memory_mib"))?;
        if !(1..=16 * 1024 * 1024).contains(&memory_mib) {
            return Err(err("memory_mib", format!("{memory_mib} is out of range")));
        }
        let pcie_gen = self.pcie_gen.ok_or_else(|| missing("pcie_gen"))?;
        if !(1..=6).contains(&pcie_gen) {
            return Err(err("pcie_gen", format!("{pcie_gen} is not 1 to 6")));
        }
        let pcie_width = self.pcie_width.unwrap_or(16);
        if ![1, 2, 4, 8, 16, 32].contains(&pcie_width) {
            return Err(err(
                "pcie_width",
                format!("{pcie_width} is not 1, 2, 4, 8, 16 or 32"),
            ));
        }
        let mut bus_ids = self.bus_ids.unwrap_or_default();
        for (i, id) in bus_ids.iter().enumerate() {
            if bus_ids[..i].contains(id) {
                return Err(err("bus_ids", format!("{id} is listed twice")));
            }
            if id.function != 0 {
                return Err(err(
                    "bus_ids",
                    format!("{id}: a GPU is function 0 of its slot"),
                ));
            }
        }
        extend_bus_ids(&mut bus_ids, gpus as usize);
        let coherent_memory = self.coherent_memory.unwrap_or(false);
        let numa_status = self.numa_status.unwrap_or(false);
        if numa_status && !coherent_memory {
            return Err(err(
                "numa_status",
                "only coherent-memory boards (coherent_memory: true) have numa_status".into(),
            ));
        }
        let mut failed_gpus = self.failed_gpus.unwrap_or_default();
        failed_gpus.sort_unstable();
        if let Some(&index) = failed_gpus.iter().find(|&&i| i >= gpus) {
            return Err(err(
                "failed_gpus",
                format!(
                    "GPU {index} does not exist (the profile has {gpus} GPUs, 0 to {})",
                    gpus - 1
                ),
            ));
        }
        if let Some(pair) = failed_gpus.windows(2).find(|p| p[0] == p[1]) {
            return Err(err(
                "failed_gpus",
                format!("GPU {} is listed twice", pair[0]),
            ));
        }
        let pci_device = self.pci_device.ok_or_else(|| missing("pci_device"))?;
        let nvml = self
            .nvml
            .unwrap_or_default()
            .resolve(pci_device, &driver_version, memory_mib)
            .map_err(|(field, message)| err(&field, message))?;
        Ok(Profile {
            name,
            model,
            sockets,
            pci_device,
            subsystem_vendor: self.subsystem_vendor.unwrap_or(0x10de),
            subsystem_device: self
                .subsystem_device
                .ok_or_else(|| missing("subsystem_device"))?,
            class: self.class.unwrap_or(0x030200),
            revision: self.revision.unwrap_or(0xa1),
            bus_ids,
            vbios: vbios.to_ascii_uppercase(),
            driver_version,
            memory_mib,
            pcie_gen,
            pcie_width,
            arch: self.arch.unwrap_or_default(),
            open_kernel_module: self.open_kernel_module.unwrap_or(true),
            coherent_memory,
            numa_status,
            failed_gpus,
            nvml,
        })
    }
}

/// Truncates or extends `ids` to `n` entries; new ones take the next free bus after the last.
fn extend_bus_ids(ids: &mut Vec<BusId>, n: usize) {
    ids.truncate(n);
    let mut next = ids.last().copied().unwrap_or(BusId {
        domain: 0,
        bus: 0x17,
        slot: 0,
        function: 0,
    });
    while ids.len() < n {
        next = crate::topology::next_bus(next);
        if !ids.contains(&next) {
            ids.push(next);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_loads() {
        for (name, _) in BUILTIN {
            let p = Profile::builtin(name).unwrap();
            assert_eq!(&p.name, name);
            assert_eq!(p.bus_ids.len() as u32, p.gpu_count());
        }
        let gb300 = Profile::builtin(DEFAULT_PROFILE).unwrap();
        assert_eq!(gb300.model, "NVIDIA GB300");
        assert_eq!(gb300.sockets, vec![2, 2]);
        assert_eq!(gb300.pci_device, 0x31c2);
    }

    #[test]
    fn override_spreads_gpus_over_sockets() {
        let p = Profile::from_yaml("base: gb300\ngpus: 2\n", "t.yaml").unwrap();
        assert_eq!(p.sockets, vec![1, 1]);
        assert_eq!(p.bus_ids.len(), 2);
        let p = Profile::from_yaml("base: t4\ngpus: 3\n", "t.yaml").unwrap();
        assert_eq!(p.bus_ids.len(), 3);
        assert_eq!(p.bus_ids[1].to_string(), "0000:01:00.0");
    }

    fn error_of(yaml: &str) -> ProfileError {
        Profile::from_yaml(yaml, "bad.yaml").unwrap_err()
    }

    #[test]
    fn bad_profiles_name_the_field() {
        let e = error_of("base: gb300\ngpuz: 4\n");
        assert!(e.to_string().contains("unknown field `gpuz`"), "{e}");
        assert!(e.to_string().contains("bad.yaml"), "{e}");
        assert!(e.message.ends_with("at line 2, column 1"), "{e}");
        let e = error_of("base: gb300\nsockets: [2, two]\n");
        assert!(e.message.ends_with("at line 2, column 14"), "{e}");
        assert_eq!(
            error_of("base: gb300\ngpus: 0\n").field.as_deref(),
            Some("gpus")
        );
        assert_eq!(
            error_of("base: gb300\ngpus: 1000\n").field.as_deref(),
            Some("gpus")
        );
        let e = error_of("base: gb300\ngpus: 4\nsockets: [3, 3]\n");
        assert_eq!(e.field.as_deref(), Some("sockets"), "{e}");
        let e = error_of("base: gb300\nmodel: \"NVIDIA\\nGB300\"\n");
        assert_eq!(e.field.as_deref(), Some("model"), "{e}");
        assert_eq!(error_of("base: nope\n").field.as_deref(), Some("base"));
        assert_eq!(
            error_of("base: gb300\ndriver_version: banana\n")
                .field
                .as_deref(),
            Some("driver_version")
        );
        assert_eq!(error_of("name: x\n").field.as_deref(), Some("model"));
        let e = error_of("base: gb300\n  gpus: [\n");
        assert!(
            e.field.is_none() && e.to_string().contains("bad.yaml"),
            "{e}"
        );
        assert!(e.message.ends_with("at line 2, column 7"), "{e}");
        let e = error_of("base: gb300\ncoherent_memory: yes\n");
        assert!(e.message.ends_with("at line 2, column 18"), "{e}");
        assert_eq!(
            error_of("base: h100\nnuma_status: true\n").field.as_deref(),
            Some("numa_status")
        );
        assert_eq!(
            error_of("base: h100\nbus_ids: [\"0000:53:00.0\", \"0000:53:00.0\"]\n")
                .field
                .as_deref(),
            Some("bus_ids")
        );
    }

    #[test]
    fn failed_gpus_are_validated_and_sorted() {
        let p = Profile::from_yaml("base: gb300\nfailed_gpus: [3, 1]\n", "t.yaml").unwrap();
        assert_eq!(p.failed_gpus, [1, 3]);
        assert!(Profile::builtin("gb300").unwrap().failed_gpus.is_empty());
        let e = error_of("base: gb300\nfailed_gpus: [4]\n");
        assert_eq!(e.field.as_deref(), Some("failed_gpus"), "{e}");
        assert!(
            e.message
                .contains("GPU 4 does not exist (the profile has 4 GPUs, 0 to 3)"),
            "{e}"
        );
        let e = error_of("base: gb300\nfailed_gpus: [2, 2]\n");
        assert_eq!(e.message, "GPU 2 is listed twice");
    }

    #[test]
    fn hostile_documents_are_refused_at_a_bound() {
        let deep = format!("sockets: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
        let e = error_of(&deep);
        assert!(
            e.message.contains("recursion limit exceeded at line 1"),
            "{e}"
        );
        // 60,000 aliases: each is one small value, but the count is past the alias budget.
        let flood = format!("gpus: &g 1\nsockets: [{}]\n", ["*g"; 60_000].join(", "));
        let e = error_of(&flood);
        assert!(e.message.contains("budget breached"), "{e}");
        assert!(e.message.contains("at line 2"), "{e}");
    }

    #[test]
    fn driver_versions_order_numerically() {
        let v: DriverVersion = "580.173.02".parse().unwrap();
        assert!(v.at_least(580, 65));
        assert!(!v.at_least(590, 44));
        assert!(
            "595.91.07"
                .parse::<DriverVersion>()
                .unwrap()
                .at_least(590, 44)
        );
        assert!("1.2".parse::<DriverVersion>().is_err());
    }
}
