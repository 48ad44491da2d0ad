//! The driver's text files byte for byte, against literal text written from what the kernel
//! module prints (field order, tabs and spaces, per driver branch), not from the renderer's
//! output: the golden files only show that the output did not change, these that it is right.

mod common;

use mockgpu_api::Profile;

const PROC: &str = "proc/driver/nvidia";

/// A built-in profile with some fields overridden.
fn profile(base: &str, overrides: &str) -> Profile {
    Profile::from_yaml(&format!("base: {base}\n{overrides}"), "test").unwrap()
}

/// `information` of GPU `index` of `profile` on the fixed host, and that GPU's UUID.
fn information(profile: &Profile, index: usize) -> (String, String) {
    let (topo, tree) = common::profile_tree(profile);
    let gpu = &topo.gpus[index];
    let path = format!("{PROC}/gpus/{}/information", gpu.bus_id);
    (common::text(&tree, &path), gpu.uuid.clone())
}

fn top_file(profile: &Profile, name: &str) -> String {
    common::text(&common::profile_tree(profile).1, &format!("{PROC}/{name}"))
}

/// `power` of the first GPU.
fn power(profile: &Profile) -> String {
    let (topo, tree) = common::profile_tree(profile);
    common::text(&tree, &format!("{PROC}/gpus/{}/power", topo.gpus[0].bus_id))
}

/// `information` as the driver prints it, one literal line per field.
struct Information<'a> {
    model: &'a str,
    irq: u32,
    vbios: &'a str,
    dma_bits: u32,
    dma_mask: &'a str,
    bus: &'a str,
    minor: u32,
    /// The `GPU Firmware:` value, when the line is printed.
    firmware: Option<&'a str>,
}

impl Information<'_> {
    fn text(&self, uuid: &str) -> String {
        let firmware = self
            .firmware
            .map(|f| format!("GPU Firmware: \t {f}\n"))
            .unwrap_or_default();
        format!(
            "Model: \t\t {}\n\
             IRQ:   \t\t {}\n\
             GPU UUID: \t {uuid}\n\
             Video BIOS: \t {}\n\
             Bus Type: \t PCIe\n\
             DMA Size: \t {} bits\n\
             DMA Mask: \t {}\n\
             Bus Location: \t {}\n\
             Device Minor: \t {}\n\
             {firmware}\
             GPU Excluded:\t No\n",
            self.model, self.irq, self.vbios, self.dma_bits, self.dma_mask, self.bus, self.minor
        )
    }
}

#[test]
fn information_of_the_proprietary_module_says_firmware_na_only_from_590_44() {
    for (driver, firmware) in [
        ("580.105.08", None),
        ("590.43.02", None),
        ("590.44.01", Some("N/A")),
        ("595.91.07", Some("N/A")),
    ] {
        let p = profile(
            "t4",
            &format!("open_kernel_module: false\ndriver_version: {driver}\n"),
        );
        let (got, uuid) = information(&p, 0);
        // The T4's usual 0000:00:1e.0 is a real device on the fixed host: the GPU moves to bus 1.
        let want = Information {
            model: "Tesla T4",
            irq: 180,
            vbios: "90.04.96.00.02",
            dma_bits: 47,
            dma_mask: "0x7fffffffffff",
            bus: "0000:01:00.0",
            minor: 0,
            firmware,
        };
        assert_eq!(got, want.text(&uuid), "{driver}");
    }
}

#[test]
fn information_of_the_open_module_names_the_gsp_firmware() {
    // The open module always runs GSP firmware, whose version is the driver's, on every branch.
    for driver in ["570.148.08", "580.105.08", "595.91.07"] {
        let p = profile("h100", &format!("driver_version: {driver}\n"));
        let (got, uuid) = information(&p, 3);
        let want = Information {
            model: "NVIDIA H100 80GB HBM3",
            irq: 228,
            vbios: "96.00.99.00.01",
            dma_bits: 52,
            dma_mask: "0xfffffffffffff",
            bus: "0000:86:00.0",
            minor: 3,
            firmware: Some(driver),
        };
        assert_eq!(got, want.text(&uuid), "{driver}");
    }
}

#[test]
fn information_prints_the_vbios_in_lowercase_and_the_domain_in_four_digits() {
    let (got, uuid) = information(&Profile::builtin("gb300").unwrap(), 1);
    let want = Information {
        model: "NVIDIA GB300",
        irq: 196,
        vbios: "97.10.4a.00.1a",
        dma_bits: 52,
        dma_mask: "0xfffffffffffff",
        bus: "0009:06:00.0",
        minor: 1,
        firmware: Some("580.173.02"),
    };
    assert_eq!(got, want.text(&uuid));
    // The UUID line is `GPU-` and 8-4-4-4-12 lowercase hex digits.
    let groups: Vec<_> = uuid.strip_prefix("GPU-").unwrap().split('-').collect();
    let lens: Vec<_> = groups.iter().map(|g| g.len()).collect();
    assert_eq!(lens, [8, 4, 4, 4, 12], "{uuid}");
    assert!(
        groups
            .concat()
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{uuid}"
    );
}

/// Checks a `version` file: the NVRM line's fields separated by two spaces, the GCC line ending
/// in a space, nothing else.
fn check_version(got: &str, module: &str, driver: &str) {
    let lines: Vec<_> = got.split_inclusive('\n').collect();
    assert_eq!(lines.len(), 2, "{got:?}");
    let nvrm: Vec<_> = lines[0].trim_end_matches('\n').split("  ").collect();
    assert_eq!(nvrm.len(), 5, "{:?}", lines[0]);
    assert_eq!(nvrm[0], format!("NVRM version: {module}"));
    assert_eq!(nvrm[1], driver);
    assert_eq!(nvrm[2], "Release Build");
    assert!(
        nvrm[3].starts_with('(') && nvrm[3].ends_with(')'),
        "builder {:?}",
        nvrm[3]
    );
    assert!(nvrm[4].ends_with(" UTC 2025"), "date {:?}", nvrm[4]);
    assert!(
        lines[1].starts_with("GCC version:  gcc version ") && lines[1].ends_with(") \n"),
        "{:?}",
        lines[1]
    );
}

#[test]
fn version_names_the_module_and_the_architecture() {
    let cases = [
        (
            "t4",
            "",
            "NVIDIA UNIX Open Kernel Module for x86_64",
            "595.91.07",
        ),
        (
            "t4",
            "open_kernel_module: false\n",
            "NVIDIA UNIX x86_64 Kernel Module",
            "595.91.07",
        ),
        (
            "gb300",
            "",
            "NVIDIA UNIX Open Kernel Module for aarch64",
            "580.173.02",
        ),
        (
            "gb300",
            "open_kernel_module: false\n",
            "NVIDIA UNIX aarch64 Kernel Module",
            "580.173.02",
        ),
    ];
    for (base, overrides, module, driver) in cases {
        let got = top_file(&profile(base, overrides), "version");
        check_version(&got, module, driver);
    }
}

/// The string parameters, quoted, after every numeric one.
const STRING_PARAMS: &str = "RegistryDwords: \"\"\n\
    RegistryDwordsPerDevice: \"\"\n\
    RmMsg: \"\"\n\
    GpuBlacklist: \"\"\n\
    TemporaryFilePath: \"\"\n\
    ExcludedGpus: \"\"\n";

#[test]
fn params_print_numbers_then_quoted_strings() {
    for (driver, coherent) in [
        ("570.148.08", false),
        ("575.64.05", false),
        ("580.65.06", true),
        ("595.91.07", true),
    ] {
        let got = top_file(
            &profile("a100", &format!("driver_version: {driver}\n")),
            "params",
        );
        let want_tail = if coherent {
            format!("CoherentGPUMemoryMode: \"\"\n{STRING_PARAMS}")
        } else {
            STRING_PARAMS.to_string()
        };
        let head = got
            .strip_suffix(&want_tail)
            .unwrap_or_else(|| panic!("{driver}: params do not end in {want_tail:?}:\n{got}"));
        assert_eq!(
            got.matches("CoherentGPUMemoryMode").count(),
            usize::from(coherent)
        );
        // Everything before is `Name: <u32>`, names without the NVreg_ prefix, starting with
        // the parameters the driver prints first.
        assert!(
            head.starts_with(
                "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\n\
                 DeviceFileUID: 0\nDeviceFileGID: 0\nDeviceFileMode: 438\n"
            ),
            "{driver}:\n{head}"
        );
        assert!(head.contains("\nEnableMSI: 1\n"), "{driver}:\n{head}");
        for line in head.lines() {
            let (name, value) = line.split_once(": ").unwrap_or_else(|| panic!("{line:?}"));
            assert!(
                !name.is_empty()
                    && !name.starts_with("NVreg_")
                    && name.bytes().all(|b| b.is_ascii_alphanumeric()),
                "{line:?}"
            );
            assert!(value.parse::<u32>().is_ok(), "{line:?}");
        }
    }
}

const POWER_525_TO_550: &str = "Runtime D3 status:          Disabled by default\n\
    Video Memory:               Active\n\
    \n\
    GPU Hardware Support:\n \
    Video Memory Self Refresh: Not Supported\n \
    Video Memory Off:          Supported\n";

const POWER_S0IX: &str = "\n\
    S0ix Power Management:\n \
    Platform Support:          Not Supported\n \
    Status:                    Disabled\n\
    \n\
    Notebook Dynamic Boost:     Not Supported\n";

#[test]
fn power_follows_the_three_driver_branches() {
    let power_of = |driver: &str| power(&profile("a100", &format!("driver_version: {driver}\n")));
    for driver in ["525.147.05", "550.54.15", "554.99"] {
        assert_eq!(power_of(driver), POWER_525_TO_550, "{driver}");
    }
    for driver in ["555.42.02", "570.148.08", "580.173.02", "590.43.02"] {
        assert_eq!(
            power_of(driver),
            format!("{POWER_525_TO_550}{POWER_S0IX}"),
            "{driver}"
        );
    }
    let tegra = "Runtime D3 status:          Disabled by default\n\
        Tegra iGPU Rail-Gating:     Disabled\n";
    let from_590_44 = format!(
        "{tegra}{}{POWER_S0IX}",
        POWER_525_TO_550
            .strip_prefix("Runtime D3 status:          Disabled by default\n")
            .unwrap()
    );
    for driver in ["590.44.01", "595.91.07"] {
        assert_eq!(power_of(driver), from_590_44, "{driver}");
    }
}
