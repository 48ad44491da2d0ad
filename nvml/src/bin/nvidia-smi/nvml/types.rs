//! The codes and values NVML answers with, as this program shows them.

/// An `nvmlReturn_t` other than `NVML_SUCCESS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ret(pub u32);

impl Ret {
    pub const INVALID_ARGUMENT: Ret = Ret(2);
    pub const NOT_SUPPORTED: Ret = Ret(3);
    pub const NOT_FOUND: Ret = Ret(6);
    pub const INSUFFICIENT_SIZE: Ret = Ret(7);
    pub const DRIVER_NOT_LOADED: Ret = Ret(9);
    pub const FUNCTION_NOT_FOUND: Ret = Ret(13);
    pub const GPU_IS_LOST: Ret = Ret(15);

    /// `nvmlErrorString`'s text for this code.
    pub fn message(self) -> &'static str {
        match self.0 {
            1 => "Uninitialized",
            2 => "Invalid Argument",
            3 => "Not Supported",
            4 => "Insufficient Permissions",
            5 => "Already Initialized",
            6 => "Not Found",
            7 => "Insufficient Size",
            8 => "Insufficient External Power",
            9 => "Driver Not Loaded",
            10 => "Timeout",
            11 => "Interrupt request issue",
            12 => "NVML Shared Library Not Found",
            13 => "Function Not Found",
            14 => "Corrupted infoROM",
            15 => "GPU is lost",
            16 => "GPU requires restart",
            17 => "The operating system has blocked the request.",
            18 => "RM has detected an NVML/RM version mismatch.",
            20 => "Insufficient Memory",
            21 => "No data",
            26 => "Requested functionality has been deprecated",
            _ => "Unknown Error",
        }
    }

    /// What the real tool prints for a value NVML did not give: `N/A` when the device or the
    /// library does not support it, the error's text otherwise.
    pub fn na(self) -> &'static str {
        match self {
            Ret::NOT_SUPPORTED | Ret::FUNCTION_NOT_FOUND | Ret::NOT_FOUND => "N/A",
            other => other.message(),
        }
    }
}

/// PCI identity of a device, from `nvmlDeviceGetPciInfo_v3`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pci {
    pub bus_id: String,
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub device_id: u32,
    pub sub_system_id: u32,
}

/// Frame buffer memory in bytes; `reserved` is absent where only `nvmlDeviceGetMemoryInfo` works.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    pub total: u64,
    pub reserved: Option<u64>,
    pub used: u64,
    pub free: u64,
}

/// BAR1 memory in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bar1 {
    pub total: u64,
    pub used: u64,
    pub free: u64,
}

/// A process holding a compute context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    pub used_memory: u64,
}

/// `nvmlGpuFabricInfo_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fabric {
    pub cluster_uuid: [u8; 16],
    pub status: u32,
    pub clique_id: u32,
    pub state: u8,
}

/// Remapped rows, from `nvmlDeviceGetRemappedRows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failure: bool,
}

/// `nvmlClockType_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    Graphics = 0,
    Sm = 1,
    Memory = 2,
    Video = 3,
}

/// `nvmlTemperatureThresholds_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threshold {
    Shutdown = 0,
    Slowdown = 1,
    MemoryMax = 2,
    GpuMax = 3,
}

/// `nvmlMemoryErrorType_t` and `nvmlEccCounterType_t` with the location of
/// `nvmlDeviceGetMemoryErrorCounter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EccCounter {
    pub uncorrected: bool,
    pub aggregate: bool,
    pub sram: bool,
}

/// `nvmlPageRetirementCause_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetireCause {
    MultipleSingleBit = 0,
    DoubleBit = 1,
}
