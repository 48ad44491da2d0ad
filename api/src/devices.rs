//! The NVIDIA character device numbers and the `/dev` layout: the one owner of both.
//!
//! The real driver registers `nvidia` (the `nvidia-frontend` entry of `/proc/devices`) on major
//! 195, a static major reserved for NVIDIA, with minor N for `/dev/nvidia<N>`, 254 for
//! `nvidia-modeset` and 255 for `nvidiactl`. Its other modules take *dynamic* majors, which the
//! kernel hands out from 254 down to 234 and then from 511 down to 384, so on a busy host any
//! fixed guess belongs to some other driver. The mock therefore chooses each dynamic major among
//! the majors the host's `/proc/devices` does not list, deterministically (the lowest free ones
//! of 384..=511, the end the kernel reaches last), and publishes them the way the real driver
//! does: in a merged `/proc/devices` that consumers (the NRI inventory, Slurm, NVIDIA's tools)
//! read. A container is never given a device number that the host uses for something else.

use std::fmt::Write as _;

/// Static major of `/dev/nvidia<N>`, `nvidiactl` and `nvidia-modeset`.
pub const NVIDIA_MAJOR: u32 = 195;
/// Minor of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u32 = 255;
/// Minor of `/dev/nvidia-modeset`.
pub const MODESET_MINOR: u32 = 254;
/// The `/proc/devices` name of major 195.
pub const NVIDIA_NAME: &str = "nvidia-frontend";
/// The `/proc/devices` name of the unified-memory module's major.
pub const UVM_NAME: &str = "nvidia-uvm";
/// The `/proc/devices` name of the capabilities major.
pub const CAPS_NAME: &str = "nvidia-caps";
/// The `/proc/devices` name of the IMEX channels major.
pub const IMEX_NAME: &str = "nvidia-caps-imex-channels";

/// Where dynamic majors are chosen: the kernel's extended dynamic range, lowest first.
const DYNAMIC: std::ops::RangeInclusive<u32> = 384..=511;

/// `/proc/devices` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DevicesError {
    /// A line is neither a section header nor `<major> <name>`.
    #[error("/proc/devices line {line}: {text:?} is not `<major> <name>`")]
    Syntax {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
    /// The host already uses major 195: a real NVIDIA driver is loaded (or something else sits
    /// on NVIDIA's major), so mock device nodes would reach it.
    #[error(
        "major {NVIDIA_MAJOR} is in use on this host by {0:?}: a real NVIDIA driver (or another driver on NVIDIA's major) is loaded, so the mock will not hand out its device numbers"
    )]
    NvidiaMajorInUse(String),
    /// No free dynamic major is left.
    #[error("no free character major left in 384..=511 for {0}")]
    Exhausted(&'static str),
    /// A tree's `/proc/devices` lacks an entry the mock always writes.
    #[error("/proc/devices lists no {0} major")]
    Missing(&'static str),
}

/// The parsed `/proc/devices`: character and block majors with their names, in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcDevices {
    /// `Character devices:` entries.
    pub char: Vec<(u32, String)>,
    /// `Block devices:` entries.
    pub block: Vec<(u32, String)>,
}

impl ProcDevices {
    /// Parses the text of `/proc/devices`.
    pub fn parse(text: &str) -> Result<ProcDevices, DevicesError> {
        let mut devices = ProcDevices::default();
        let mut block = false;
        for (i, line) in text.lines().enumerate() {
            match line.trim() {
                "" => {}
                "Character devices:" => block = false,
                "Block devices:" => block = true,
                entry => {
                    let parsed = entry.split_once(' ').and_then(|(major, name)| {
                        let name = name.trim();
                        Some((major.parse::<u32>().ok()?, name.to_string()))
                            .filter(|_| !name.is_empty())
                    });
                    let Some(parsed) = parsed else {
                        return Err(DevicesError::Syntax {
                            line: i + 1,
                            text: line.to_string(),
                        });
                    };
                    if block {
                        devices.block.push(parsed);
                    } else {
                        devices.char.push(parsed);
                    }
                }
            }
        }
        Ok(devices)
    }

    /// The character major registered as `name`.
    pub fn char_major(&self, name: &str) -> Option<u32> {
        self.char.iter().find(|(_, n)| n == name).map(|(m, _)| *m)
    }

    fn char_user(&self, major: u32) -> Option<&str> {
        self.char
            .iter()
            .find(|(m, _)| *m == major)
            .map(|(_, n)| n.as_str())
    }

    /// The text as the kernel prints it (`%3d %s`, characters then blocks).
    pub fn render(&self) -> String {
        let mut out = String::from("Character devices:\n");
        for (major, name) in &self.char {
            let _ = writeln!(out, "{major:>3} {name}");
        }
        out.push_str("\nBlock devices:\n");
        for (major, name) in &self.block {
            let _ = writeln!(out, "{major:>3} {name}");
        }
        out
    }
}

/// The majors the mock gives NVIDIA's modules on one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceNumbers {
    /// `nvidia-uvm` (minor 0 `/dev/nvidia-uvm`, minor 1 `/dev/nvidia-uvm-tools`).
    pub uvm: u32,
    /// `nvidia-caps` (`/dev/nvidia-caps/nvidia-cap<M>`).
    pub caps: u32,
    /// `nvidia-caps-imex-channels` (`/dev/nvidia-caps-imex-channels/channel<N>`).
    pub imex_channels: u32,
}

impl DeviceNumbers {
    /// Chooses the dynamic majors free on a host whose `/proc/devices` is `host`: the lowest
    /// unlisted majors of 384..=511, in the order uvm, caps, IMEX channels. Fails when the host
    /// uses major 195.
    pub fn choose(host: &ProcDevices) -> Result<DeviceNumbers, DevicesError> {
        if let Some(user) = host.char_user(NVIDIA_MAJOR) {
            return Err(DevicesError::NvidiaMajorInUse(user.to_string()));
        }
        let mut free = DYNAMIC.filter(|m| host.char_user(*m).is_none());
        let mut next = |name| free.next().ok_or(DevicesError::Exhausted(name));
        Ok(DeviceNumbers {
            uvm: next(UVM_NAME)?,
            caps: next(CAPS_NAME)?,
            imex_channels: next(IMEX_NAME)?,
        })
    }

    /// Whether every major is still unused by `host` (checked again on each reload: a module
    /// loaded since may have taken one).
    pub fn still_free(&self, host: &ProcDevices) -> bool {
        host.char_user(NVIDIA_MAJOR).is_none()
            && [self.uvm, self.caps, self.imex_channels]
                .iter()
                .all(|m| host.char_user(*m).is_none())
    }

    /// The numbers a tree published in its merged `/proc/devices`.
    pub fn published(tree: &ProcDevices) -> Result<DeviceNumbers, DevicesError> {
        let major = |name| tree.char_major(name).ok_or(DevicesError::Missing(name));
        if major(NVIDIA_NAME)? != NVIDIA_MAJOR {
            return Err(DevicesError::Missing(NVIDIA_NAME));
        }
        Ok(DeviceNumbers {
            uvm: major(UVM_NAME)?,
            caps: major(CAPS_NAME)?,
            imex_channels: major(IMEX_NAME)?,
        })
    }

    /// The host's `/proc/devices` with NVIDIA's four entries added in major order.
    pub fn merge_into(&self, host: &ProcDevices) -> ProcDevices {
        let mut merged = host.clone();
        for (major, name) in [
            (NVIDIA_MAJOR, NVIDIA_NAME),
            (self.uvm, UVM_NAME),
            (self.caps, CAPS_NAME),
            (self.imex_channels, IMEX_NAME),
        ] {
            let at = merged.char.partition_point(|(m, _)| *m <= major);
            merged.char.insert(at, (major, name.to_string()));
        }
        merged
    }

    /// The device nodes every GPU-holding container needs besides its GPUs: `nvidiactl` and
    /// the two unified-memory nodes.
    pub fn control_nodes(&self) -> [DeviceNode; 3] {
        [
            DeviceNode::new("/dev/nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR, 0o666),
            DeviceNode::new("/dev/nvidia-uvm", self.uvm, 0, 0o666),
            DeviceNode::new("/dev/nvidia-uvm-tools", self.uvm, 1, 0o666),
        ]
    }

    /// Every node of a driver with these GPU minors, as the real driver creates them.
    pub fn all_nodes(&self, minors: impl IntoIterator<Item = u32>) -> Vec<DeviceNode> {
        let mut nodes: Vec<DeviceNode> = minors.into_iter().map(DeviceNode::gpu).collect();
        nodes.extend(self.control_nodes());
        nodes.push(DeviceNode::new(
            "/dev/nvidia-modeset",
            NVIDIA_MAJOR,
            MODESET_MINOR,
            0o666,
        ));
        // nvidia-cap1 is mig/config (root only), nvidia-cap2 mig/monitor (readable).
        nodes.push(DeviceNode::new(
            "/dev/nvidia-caps/nvidia-cap1",
            self.caps,
            1,
            0o400,
        ));
        nodes.push(DeviceNode::new(
            "/dev/nvidia-caps/nvidia-cap2",
            self.caps,
            2,
            0o444,
        ));
        nodes
    }
}

/// One character device node of the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    /// Absolute path (`/dev/nvidia0`).
    pub path: String,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
    /// Permission bits.
    pub mode: u32,
}

impl DeviceNode {
    fn new(path: &str, major: u32, minor: u32, mode: u32) -> DeviceNode {
        DeviceNode {
            path: path.to_string(),
            major,
            minor,
            mode,
        }
    }

    /// `/dev/nvidia<minor>`, 195:minor.
    pub fn gpu(minor: u32) -> DeviceNode {
        DeviceNode::new(&format!("/dev/nvidia{minor}"), NVIDIA_MAJOR, minor, 0o666)
    }
}

/// The GPU minor of a `/dev/nvidia<N>` path; `None` for every other path (`nvidiactl`, …).
pub fn gpu_minor(path: &str) -> Option<u32> {
    let digits = path.strip_prefix("/dev/nvidia")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host that uses both the classic dynamic range and the start of the extended one, with
    /// majors 509 and 510 taken (where guesses of nvidia-uvm's major usually land).
    const BUSY_HOST: &str = "Character devices:\n  1 mem\n  4 /dev/vc/0\n  4 tty\n 10 misc\n234 ubi0\n254 gpiochip\n384 first\n385 second\n509 aux\n510 rpmb\n\nBlock devices:\n  7 loop\n259 blkext\n";

    #[test]
    fn parses_both_sections_and_renders_them_back() {
        let d = ProcDevices::parse(BUSY_HOST).unwrap();
        assert_eq!(d.char.len(), 10);
        assert_eq!(d.char[2], (4, "tty".to_string()));
        assert_eq!(d.block, [(7, "loop".into()), (259, "blkext".into())]);
        assert_eq!(d.render(), BUSY_HOST);
    }

    #[test]
    fn bad_lines_are_named() {
        let e = ProcDevices::parse("Character devices:\n  1 mem\nbogus\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "/proc/devices line 3: \"bogus\" is not `<major> <name>`"
        );
        assert!(ProcDevices::parse("12\n").is_err());
        assert!(ProcDevices::parse("x y\n").is_err());
    }

    #[test]
    fn dynamic_majors_avoid_every_listed_major() {
        let host = ProcDevices::parse(BUSY_HOST).unwrap();
        let n = DeviceNumbers::choose(&host).unwrap();
        assert_eq!((n.uvm, n.caps, n.imex_channels), (386, 387, 388));
        for m in [n.uvm, n.caps, n.imex_channels] {
            assert!(!host.char.iter().any(|(major, _)| *major == m), "{m}");
        }
        assert!(n.still_free(&host));
        // The same host always gives the same numbers.
        assert_eq!(DeviceNumbers::choose(&host).unwrap(), n);
        // A module loaded later on one of them is noticed.
        let mut later = host.clone();
        later.char.push((387, "late".into()));
        assert!(!n.still_free(&later));
    }

    #[test]
    fn a_used_nvidia_major_is_refused() {
        let host = ProcDevices::parse("Character devices:\n195 nvidia-frontend\n").unwrap();
        let e = DeviceNumbers::choose(&host).unwrap_err();
        assert_eq!(e, DevicesError::NvidiaMajorInUse("nvidia-frontend".into()));
    }

    #[test]
    fn a_full_range_is_an_error() {
        let host = ProcDevices {
            char: DYNAMIC.map(|m| (m, format!("d{m}"))).collect(),
            block: vec![],
        };
        assert!(matches!(
            DeviceNumbers::choose(&host),
            Err(DevicesError::Exhausted(UVM_NAME))
        ));
    }

    #[test]
    fn merged_file_lists_the_host_and_nvidia_in_major_order() {
        let host = ProcDevices::parse(BUSY_HOST).unwrap();
        let n = DeviceNumbers::choose(&host).unwrap();
        let merged = n.merge_into(&host).render();
        assert!(merged.starts_with("Character devices:\n  1 mem\n  4 /dev/vc/0\n  4 tty\n 10 misc\n195 nvidia-frontend\n234 ubi0\n254 gpiochip\n384 first\n385 second\n386 nvidia-uvm\n387 nvidia-caps\n388 nvidia-caps-imex-channels\n509 aux\n"), "{merged}");
        assert!(merged.ends_with("\nBlock devices:\n  7 loop\n259 blkext\n"));
        let back = ProcDevices::parse(&merged).unwrap();
        assert_eq!(DeviceNumbers::published(&back).unwrap(), n);
        assert_eq!(
            DeviceNumbers::published(&host),
            Err(DevicesError::Missing(NVIDIA_NAME))
        );
    }

    #[test]
    fn nodes_use_the_chosen_majors() {
        let n = DeviceNumbers {
            uvm: 386,
            caps: 387,
            imex_channels: 388,
        };
        let nodes: Vec<(String, u32, u32)> = n
            .all_nodes([0, 1])
            .into_iter()
            .map(|d| (d.path, d.major, d.minor))
            .collect();
        let want = [
            ("/dev/nvidia0", 195, 0),
            ("/dev/nvidia1", 195, 1),
            ("/dev/nvidiactl", 195, 255),
            ("/dev/nvidia-uvm", 386, 0),
            ("/dev/nvidia-uvm-tools", 386, 1),
            ("/dev/nvidia-modeset", 195, 254),
            ("/dev/nvidia-caps/nvidia-cap1", 387, 1),
            ("/dev/nvidia-caps/nvidia-cap2", 387, 2),
        ];
        assert_eq!(nodes.len(), want.len());
        for (got, want) in nodes.iter().zip(want) {
            assert_eq!((got.0.as_str(), got.1, got.2), want);
        }
    }

    #[test]
    fn gpu_device_paths() {
        assert_eq!(gpu_minor("/dev/nvidia12"), Some(12));
        assert_eq!(gpu_minor("/dev/nvidiactl"), None);
        assert_eq!(gpu_minor("/dev/nvidia-uvm"), None);
        assert_eq!(gpu_minor("/dev/nvidia"), None);
        assert_eq!(gpu_minor("/dev/nvidia99999999999"), None);
    }
}
