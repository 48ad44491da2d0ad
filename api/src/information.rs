//! `/proc/driver/nvidia/gpus/<bdf>/information`: the one writer and the one parser.
//!
//! The renderer writes it for mock GPUs; real-GPU mode and the NRI inventory read it back with
//! [`Information::parse`], from a real driver or from the mock's own tree.
//!
//! The driver prints `Key:` then tabs and a space, then the value (`Model: \t\t NVIDIA H100`);
//! `GPU Excluded:` is followed by one tab only. Slurm's `gpu/nvidia` plugin finds `Device Minor`
//! and `Bus Location` by their keys, so the order matters less than the exact keys.

use std::fmt::Write as _;

use crate::{BusId, Gpu, Profile};

/// An `information` file that cannot be read as a GPU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InformationError {
    /// A line the GPU needs is absent.
    #[error("no `{0}:` line")]
    Missing(&'static str),
    /// A value does not parse.
    #[error("`{key}:` has the value {value:?}, which is not {expected}")]
    Value {
        /// The key.
        key: &'static str,
        /// The value found.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
}

/// The fields of an `information` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Information {
    /// `Model:`.
    pub model: String,
    /// `IRQ:`.
    pub irq: Option<u32>,
    /// `GPU UUID:`.
    pub uuid: String,
    /// `Video BIOS:`.
    pub video_bios: Option<String>,
    /// `Bus Location:`.
    pub bus_location: BusId,
    /// `Device Minor:`.
    pub device_minor: u32,
    /// `GPU Firmware:` (absent before 590.44 on the proprietary module).
    pub gpu_firmware: Option<String>,
    /// `GPU Excluded: Yes`.
    pub excluded: bool,
}

impl Information {
    /// Parses the text of an `information` file.
    pub fn parse(text: &str) -> Result<Information, InformationError> {
        let field = |key: &'static str| {
            text.lines().find_map(|line| {
                let (k, v) = line.split_once(':')?;
                (k.trim() == key).then(|| v.trim().to_string())
            })
        };
        let required = |key| field(key).ok_or(InformationError::Missing(key));
        let value = |key, value: String, expected| InformationError::Value {
            key,
            value,
            expected,
        };
        let bus = required("Bus Location")?;
        let minor = required("Device Minor")?;
        let uuid = required("GPU UUID")?;
        if uuid.is_empty() {
            return Err(value("GPU UUID", uuid, "a GPU UUID"));
        }
        let irq = field("IRQ");
        Ok(Information {
            model: required("Model")?,
            irq: match irq {
                Some(v) => Some(v.parse().map_err(|_| value("IRQ", v, "a number"))?),
                None => None,
            },
            uuid,
            video_bios: field("Video BIOS"),
            bus_location: bus
                .parse()
                .map_err(|_| value("Bus Location", bus, "a PCI address"))?,
            device_minor: minor
                .parse()
                .map_err(|_| value("Device Minor", minor, "a number"))?,
            gpu_firmware: field("GPU Firmware"),
            excluded: field("GPU Excluded").is_some_and(|v| v.eq_ignore_ascii_case("yes")),
        })
    }
}

/// DMA address width: 52 bits from Hopper on (device ids from 0x2300), 47 before.
fn dma_bits(p: &Profile) -> u32 {
    if p.pci_device >= 0x2300 && p.pci_device < 0x2600 || p.pci_device >= 0x2900 {
        52
    } else {
        47
    }
}

/// The file for `gpu` of `p`, as the profile's driver branch prints it (`excluded`: `GPU
/// Excluded: Yes`).
pub fn render(p: &Profile, gpu: &Gpu, excluded: bool) -> String {
    let bits = dma_bits(p);
    let mut s = format!(
        "Model: \t\t {}\nIRQ:   \t\t {}\nGPU UUID: \t {}\nVideo BIOS: \t {}\nBus Type: \t PCIe\nDMA Size: \t {bits} bits\nDMA Mask: \t 0x{:x}\nBus Location: \t {}\nDevice Minor: \t {}\n",
        p.model,
        gpu.irq,
        gpu.uuid,
        p.vbios.to_ascii_lowercase(),
        (1u64 << bits) - 1,
        gpu.bus_id,
        gpu.minor,
    );
    // The open module always runs GSP firmware, whose version is the driver's.
    if p.open_kernel_module {
        let _ = writeln!(s, "GPU Firmware: \t {}", p.driver_version);
    } else if p.driver_version.at_least(590, 44) {
        s.push_str("GPU Firmware: \t N/A\n");
    }
    s.push_str(if excluded {
        "GPU Excluded:\t Yes\n"
    } else {
        "GPU Excluded:\t No\n"
    });
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeTopology;

    #[test]
    fn parses_what_it_renders_for_every_builtin() {
        let host = crate::topology::tests::host(&[(0, 0..2)], &[]);
        for (name, _) in crate::profile::BUILTIN {
            let p = Profile::builtin(name).unwrap();
            let topo = NodeTopology::build(&p, "n", &host).unwrap();
            for gpu in &topo.gpus {
                let info = Information::parse(&render(&p, gpu, false)).unwrap();
                assert_eq!(info.model, p.model, "{name}");
                assert_eq!(info.uuid, gpu.uuid);
                assert_eq!(info.bus_location, gpu.bus_id);
                assert_eq!(info.device_minor, gpu.minor);
                assert_eq!(info.irq, Some(gpu.irq));
                assert!(!info.excluded);
                let excluded = Information::parse(&render(&p, gpu, true)).unwrap();
                assert!(excluded.excluded, "{name}: GPU Excluded: Yes");
            }
        }
    }

    /// A file as a real 570 proprietary driver prints it (no GPU Firmware line).
    const REAL_570: &str = "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 1234\nGPU UUID: \t GPU-9d8e7f6a-5b4c-3d2e-1f0a-9b8c7d6e5f4a\nVideo BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t 0000:18:00.0\nDevice Minor: \t 3\nGPU Excluded:\t Yes\n";

    #[test]
    fn parses_a_real_file() {
        let info = Information::parse(REAL_570).unwrap();
        assert_eq!(info.model, "NVIDIA H100 80GB HBM3");
        assert_eq!(info.irq, Some(1234));
        assert_eq!(info.bus_location.to_string(), "0000:18:00.0");
        assert_eq!(info.device_minor, 3);
        assert_eq!(info.gpu_firmware, None);
        assert!(info.excluded);
    }

    #[test]
    fn broken_files_name_the_line() {
        let without = |key: &str| {
            REAL_570
                .lines()
                .filter(|l| !l.starts_with(key))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(
            Information::parse(&without("Device Minor")),
            Err(InformationError::Missing("Device Minor"))
        );
        assert_eq!(
            Information::parse(&without("GPU UUID")),
            Err(InformationError::Missing("GPU UUID"))
        );
        let bad = REAL_570.replace("0000:18:00.0", "18:00.0");
        assert_eq!(
            Information::parse(&bad).unwrap_err().to_string(),
            "`Bus Location:` has the value \"18:00.0\", which is not a PCI address"
        );
        let bad = REAL_570.replace("Minor: \t 3", "Minor: \t three");
        assert!(matches!(
            Information::parse(&bad),
            Err(InformationError::Value {
                key: "Device Minor",
                ..
            })
        ));
        assert!(Information::parse("").is_err());
    }
}
