//! The words and numbers shared by every format: NVML's enums as the real tool names them,
//! units, CPU ranges and timestamps.

use crate::nvml::{Fabric, Val};

/// `f` of the value, or what the real tool prints in its place (`N/A`, or the error's text).
pub fn or_na<T>(v: &Val<T>, f: impl FnOnce(&T) -> String) -> String {
    match v {
        Ok(v) => f(v),
        Err(e) => e.na().to_string(),
    }
}

/// `nvmlEnableState_t`.
pub fn enabled(state: u32) -> &'static str {
    if state == 0 { "Disabled" } else { "Enabled" }
}

/// Whole MiB of a byte count, as NVML's consumers round.
pub fn mib(bytes: u64) -> u64 {
    bytes / (1024 * 1024)
}

/// Watts with two decimals of a milliwatt reading.
pub fn watts(milliwatts: u32) -> String {
    format!("{:.2}", f64::from(milliwatts) / 1000.0)
}

/// Whole watts, rounded, of a milliwatt reading (the summary table's).
pub fn whole_watts(milliwatts: u32) -> u32 {
    (milliwatts + 500) / 1000
}

/// `13.0` of NVML's `13000`.
pub fn cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, v % 1000 / 10)
}

/// The NVML version as `--version` shows it: `580.173` of `12.580.173.02` or `580.173.02`.
pub fn nvml_version(v: &str) -> String {
    let parts: Vec<&str> = v.split('.').collect();
    let parts = if parts.len() == 4 {
        &parts[1..]
    } else {
        &parts[..]
    };
    parts[..parts.len().min(2)].join(".")
}

/// `P0` … `P15`; `Unknown` for `NVML_PSTATE_UNKNOWN`.
pub fn pstate(p: u32) -> String {
    if p < 16 {
        format!("P{p}")
    } else {
        "Unknown".to_string()
    }
}

/// `nvmlBrandType_t`.
pub fn brand(b: u32) -> &'static str {
    match b {
        1 => "Quadro",
        2 => "Tesla",
        3 => "NVS",
        4 => "Grid",
        5 => "GeForce",
        6 => "Titan",
        7 => "NVIDIA Virtual Applications",
        8 => "NVIDIA Virtual PC",
        9 => "NVIDIA Virtual Compute Server",
        10 => "NVIDIA RTX Virtual Workstation",
        11 => "NVIDIA Cloud Gaming",
        12 => "Quadro RTX",
        13 => "NVIDIA RTX",
        14 => "NVIDIA",
        15 => "GeForce RTX",
        16 => "Titan RTX",
        _ => "Unknown",
    }
}

/// `nvmlDeviceArchitecture_t`.
pub fn architecture(a: u32) -> &'static str {
    match a {
        2 => "Kepler",
        3 => "Maxwell",
        4 => "Pascal",
        5 => "Volta",
        6 => "Turing",
        7 => "Ampere",
        8 => "Ada Lovelace",
        9 => "Hopper",
        10 => "Blackwell",
        _ => "Unknown",
    }
}

/// `nvmlComputeMode_t` as `-q` and `--query-gpu` name it.
pub fn compute_mode(m: u32) -> &'static str {
    match m {
        0 => "Default",
        1 => "Exclusive_Thread",
        2 => "Prohibited",
        3 => "Exclusive_Process",
        _ => "Unknown",
    }
}

/// `nvmlComputeMode_t` as the summary table abbreviates it.
pub fn compute_mode_short(m: u32) -> &'static str {
    match m {
        0 => "Default",
        1 => "E. Thread",
        2 => "Prohibited",
        3 => "E. Process",
        _ => "Unknown",
    }
}

/// `nvmlGpuFabricState_t`.
pub fn fabric_state(f: &Fabric) -> &'static str {
    match f.state {
        1 => "Not Started",
        2 => "In Progress",
        3 => "Completed",
        _ => "N/A",
    }
}

/// The registration's result, meaningful once the state is `Completed`.
pub fn fabric_status(f: &Fabric) -> &'static str {
    match (f.state, f.status) {
        (3, 0) => "Success",
        (3, code) => crate::nvml::Ret(code).message(),
        _ => "N/A",
    }
}

/// The cluster UUID in its usual 8-4-4-4-12 form.
pub fn cluster_uuid(f: &Fabric) -> String {
    let hex: String = f.cluster_uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Sorted ids as ranges: `0-71,144-215`.
pub fn ranges(ids: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let start = ids[i];
        let mut end = start;
        while i + 1 < ids.len() && ids[i + 1] == end + 1 {
            i += 1;
            end = ids[i];
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(",")
}

/// A local time broken down, as the headers print it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub year: i32,
    /// 1-12.
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub millisecond: u32,
    /// 0 = Sunday.
    pub weekday: u32,
}

impl Stamp {
    /// This moment in the local time zone.
    pub fn now() -> Self {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let secs = since.as_secs() as libc::time_t;
        // SAFETY: an all-zero tm is valid; localtime_r writes into it.
        let mut tm: libc::tm = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are to live values.
        unsafe { libc::localtime_r(&secs, &mut tm) };
        Stamp {
            year: tm.tm_year + 1900,
            month: (tm.tm_mon + 1) as u32,
            day: tm.tm_mday as u32,
            hour: tm.tm_hour as u32,
            minute: tm.tm_min as u32,
            second: tm.tm_sec as u32,
            millisecond: since.subsec_millis(),
            weekday: tm.tm_wday as u32,
        }
    }

    /// `Tue Sep  1 20:41:56 2026`, as `ctime` writes it.
    pub fn ctime(&self) -> String {
        const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        format!(
            "{} {} {:>2} {:02}:{:02}:{:02} {}",
            DAYS[self.weekday as usize % 7],
            MONTHS[(self.month as usize + 11) % 12],
            self.day,
            self.hour,
            self.minute,
            self.second,
            self.year
        )
    }

    /// `2026/09/01 20:41:56.941`, the `timestamp` field of `--query-gpu`.
    pub fn query(&self) -> String {
        format!(
            "{}/{:02}/{:02} {:02}:{:02}:{:02}.{:03}",
            self.year, self.month, self.day, self.hour, self.minute, self.second, self.millisecond
        )
    }
}

/// The clocks event reasons (`nvmlClocksEventReason*`) as `-q` lists them: depth, label, bit.
pub const EVENT_REASONS: [(usize, &str, u64); 9] = [
    (2, "Idle", 0x1),
    (2, "Applications Clocks Setting", 0x2),
    (2, "SW Power Cap", 0x4),
    (2, "HW Slowdown", 0x8),
    (3, "HW Thermal Slowdown", 0x40),
    (3, "HW Power Brake Slowdown", 0x80),
    (2, "Sync Boost", 0x10),
    (2, "SW Thermal Slowdown", 0x20),
    (2, "Display Clock Setting", 0x100),
];

/// An event reason's state.
pub fn active(on: bool) -> &'static str {
    if on { "Active" } else { "Not Active" }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::nvml::Ret;

    /// The moment of the public H200 capture the formats are checked against.
    pub const STAMP: Stamp = Stamp {
        year: 2026,
        month: 9,
        day: 1,
        hour: 20,
        minute: 41,
        second: 56,
        millisecond: 941,
        weekday: 2,
    };

    #[test]
    fn timestamps_are_written_as_the_real_tool_does() {
        assert_eq!(STAMP.ctime(), "Tue Sep  1 20:41:56 2026");
        assert_eq!(STAMP.query(), "2026/09/01 20:41:56.941");
    }

    #[test]
    fn ranges_join_runs() {
        assert_eq!(ranges(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(ranges(&[]), "");
    }

    #[test]
    fn units() {
        assert_eq!(watts(85_160), "85.16");
        assert_eq!(whole_watts(85_160), 85);
        assert_eq!(whole_watts(1_200_000), 1200);
        assert_eq!(cuda_version(13000), "13.0");
        assert_eq!(cuda_version(12040), "12.4");
        assert_eq!(mib(143_771 * 1024 * 1024 + 5), 143_771);
        assert_eq!(
            or_na(&Err::<u32, _>(Ret::NOT_SUPPORTED), |v| v.to_string()),
            "N/A"
        );
    }

    #[test]
    fn nvml_version_drops_the_cuda_prefix_and_the_build() {
        assert_eq!(nvml_version("12.580.173.02"), "580.173");
        assert_eq!(nvml_version("580.173.02"), "580.173");
    }

    #[test]
    fn cluster_uuid_is_dashed() {
        let f = Fabric {
            cluster_uuid: [0xb2, 0xda, 0xed, 0x23, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            status: 0,
            clique_id: 1,
            state: 3,
        };
        assert_eq!(cluster_uuid(&f), "b2daed23-0000-0000-0000-000000000001");
        assert_eq!(fabric_state(&f), "Completed");
        assert_eq!(fabric_status(&f), "Success");
    }
}
