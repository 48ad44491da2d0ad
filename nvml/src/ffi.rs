//! NVML's C ABI as `nvml.h` (CUDA 12.4) declares it: return codes, enum values and the structs
//! the library fills.

use core::ffi::c_char;

/// `nvmlReturn_t`.
pub type Ret = u32;
pub const SUCCESS: Ret = 0;
pub const ERROR_UNINITIALIZED: Ret = 1;
pub const ERROR_INVALID_ARGUMENT: Ret = 2;
pub const ERROR_NOT_SUPPORTED: Ret = 3;
pub const ERROR_NOT_FOUND: Ret = 6;
pub const ERROR_INSUFFICIENT_SIZE: Ret = 7;
pub const ERROR_DRIVER_NOT_LOADED: Ret = 9;
pub const ERROR_TIMEOUT: Ret = 10;
pub const ERROR_GPU_IS_LOST: Ret = 15;
pub const ERROR_ARGUMENT_VERSION_MISMATCH: Ret = 25;
pub const ERROR_UNKNOWN: Ret = 999;

/// `struct nvmlDevice_st`: opaque to callers (a handle is the address of one of the library's
/// loaded devices, compared, never dereferenced).
pub enum DeviceSt {}

/// `nvmlDevice_t`.
pub type Device = *mut DeviceSt;

/// `NVML_INIT_FLAG_NO_GPUS`.
pub const INIT_FLAG_NO_GPUS: u32 = 1;

/// `nvmlEnableState_t`.
pub const FEATURE_DISABLED: u32 = 0;
pub const FEATURE_ENABLED: u32 = 1;

/// `nvmlTemperatureThresholds_t`.
pub const TEMPERATURE_THRESHOLD_SHUTDOWN: u32 = 0;
pub const TEMPERATURE_THRESHOLD_SLOWDOWN: u32 = 1;
pub const TEMPERATURE_THRESHOLD_MEM_MAX: u32 = 2;
pub const TEMPERATURE_THRESHOLD_GPU_MAX: u32 = 3;
/// `nvmlTemperatureSensors_t`.
pub const TEMPERATURE_GPU: u32 = 0;

/// `nvmlClockType_t`.
pub const CLOCK_GRAPHICS: u32 = 0;
pub const CLOCK_SM: u32 = 1;
pub const CLOCK_MEM: u32 = 2;
pub const CLOCK_VIDEO: u32 = 3;
/// `nvmlClockId_t`.
pub const CLOCK_ID_CURRENT: u32 = 0;
pub const CLOCK_ID_APP_CLOCK_TARGET: u32 = 1;
pub const CLOCK_ID_APP_CLOCK_DEFAULT: u32 = 2;
pub const CLOCK_ID_CUSTOMER_BOOST_MAX: u32 = 3;
/// `nvmlClocksEventReasonGpuIdle`, `…ApplicationsClocksSetting`.
pub const CLOCKS_EVENT_REASON_GPU_IDLE: u64 = 1;
pub const CLOCKS_EVENT_REASON_APPLICATIONS_CLOCKS_SETTING: u64 = 2;
/// `nvmlClocksEventReasonSwThermalSlowdown`, `…HwThermalSlowdown`.
pub const CLOCKS_EVENT_REASON_SW_THERMAL_SLOWDOWN: u64 = 0x20;
pub const CLOCKS_EVENT_REASON_HW_THERMAL_SLOWDOWN: u64 = 0x40;

/// `NVML_PSTATE_0`.
pub const PSTATE_0: u32 = 0;
/// `NVML_COMPUTEMODE_DEFAULT`.
pub const COMPUTEMODE_DEFAULT: u32 = 0;

/// `nvmlEccCounterType_t` bound.
pub const ECC_COUNTER_TYPE_COUNT: u32 = 2;
/// `NVML_MEMORY_LOCATION_DRAM` (device memory) and `NVML_MEMORY_LOCATION_COUNT`.
pub const MEMORY_LOCATION_DRAM: u32 = 2;
pub const MEMORY_LOCATION_COUNT: u32 = 8;
/// `NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR`, `NVML_PAGE_RETIREMENT_CAUSE_COUNT`.
pub const PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: u32 = 1;
pub const PAGE_RETIREMENT_CAUSE_COUNT: u32 = 2;

/// `NVML_DEVICE_ARCH_AMPERE`: row remapping replaces page retirement from here on.
pub const DEVICE_ARCH_AMPERE: u32 = 7;

/// `nvmlInforomObject_t`.
pub const INFOROM_OEM: u32 = 0;
pub const INFOROM_ECC: u32 = 1;
pub const INFOROM_POWER: u32 = 2;

/// `nvmlGpuTopologyLevel_t`.
pub const TOPOLOGY_INTERNAL: u32 = 0;
pub const TOPOLOGY_NODE: u32 = 40;
pub const TOPOLOGY_SYSTEM: u32 = 50;

/// `nvmlAffinityScope_t`.
pub const AFFINITY_SCOPE_NODE: u32 = 0;
pub const AFFINITY_SCOPE_SOCKET: u32 = 1;

/// `nvmlNvLinkCapability_t` bound (`NVML_NVLINK_CAP_COUNT`) and the SLI bridge capability,
/// the one NVLink capability these boards lack.
pub const NVLINK_CAP_SLI_BRIDGE: u32 = 4;
pub const NVLINK_CAP_COUNT: u32 = 6;
/// `NVML_NVLINK_MAX_LINKS`.
pub const NVLINK_MAX_LINKS: u32 = 18;

/// `NVML_GPU_FABRIC_STATE_COMPLETED`.
pub const GPU_FABRIC_STATE_COMPLETED: u8 = 3;
/// `NVML_DEVICE_MIG_DISABLE`.
pub const DEVICE_MIG_DISABLE: u32 = 0;

/// `nvmlEventTypeXidCriticalError`: the one event kind sets accept.
pub const EVENT_TYPE_XID_CRITICAL_ERROR: u64 = 8;
/// The GPU and compute instance ids of an event outside MIG.
pub const INSTANCE_ID_NONE: u32 = 0xFFFF_FFFF;

/// `nvmlPciInfo_t` (v2 and v3; v1 is the same layout with the 16-byte `busIdLegacy` only).
#[repr(C)]
pub struct PciInfo {
    pub bus_id_legacy: [c_char; 16],
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub pci_device_id: u32,
    pub pci_sub_system_id: u32,
    pub bus_id: [c_char; 32],
}

/// `nvmlPciInfoExt_v1_t`.
#[repr(C)]
pub struct PciInfoExt {
    pub version: u32,
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub pci_device_id: u32,
    pub pci_sub_system_id: u32,
    pub base_class: u32,
    pub sub_class: u32,
    pub bus_id: [c_char; 32],
}

/// `nvmlExcludedDeviceInfo_t`.
#[repr(C)]
pub struct ExcludedDeviceInfo {
    pub pci: PciInfo,
    pub uuid: [c_char; DEVICE_UUID_BUFFER_SIZE],
}
/// `NVML_DEVICE_UUID_BUFFER_SIZE`.
pub const DEVICE_UUID_BUFFER_SIZE: usize = 80;

/// `nvmlMemory_t`.
#[repr(C)]
pub struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct MemoryV2 {
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlBAR1Memory_t`.
#[repr(C)]
pub struct Bar1Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct Utilization {
    pub gpu: u32,
    pub memory: u32,
}

/// `nvmlGpuFabricInfo_t`.
#[repr(C)]
pub struct GpuFabricInfo {
    pub cluster_uuid: [u8; 16],
    pub status: Ret,
    pub clique_id: u32,
    pub state: u8,
}

/// `nvmlGpuFabricInfo_v2_t` (`nvmlGpuFabricInfoV_t`).
#[repr(C)]
pub struct GpuFabricInfoV2 {
    pub version: u32,
    pub cluster_uuid: [u8; 16],
    pub status: Ret,
    pub clique_id: u32,
    pub state: u8,
    pub health_mask: u32,
}

/// `nvmlEventData_t`.
#[repr(C)]
pub struct EventData {
    pub device: Device,
    pub event_type: u64,
    pub event_data: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

/// `NVML_STRUCT_VERSION(name, ver)`: the size in the low bits, the version in the top byte.
pub const fn struct_version(size: usize, version: u32) -> u32 {
    // Struct sizes here are far below 2^24.
    (size as u32) | (version << 24)
}
pub const MEMORY_V2: u32 = struct_version(size_of::<MemoryV2>(), 2);
pub const PCI_INFO_EXT_V1: u32 = struct_version(size_of::<PciInfoExt>(), 1);
pub const GPU_FABRIC_INFO_V2: u32 = struct_version(size_of::<GpuFabricInfoV2>(), 2);

/// `nvmlErrorString`'s texts, as the real library returns them.
pub fn error_string(code: Ret) -> &'static core::ffi::CStr {
    match code {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt request issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request.",
        18 => c"RM has detected an NVML/RM version mismatch.",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        22 => c"The requested vgpu operation is not available on target device, becasue ECC is enabled",
        23 => c"Insufficient resources for request",
        24 => c"Ran out of critical resources, other than memory",
        25 => c"Argument version mismatch",
        26 => c"The requested functionality has been deprecated",
        27 => c"The system is not ready for the request",
        28 => c"No GPUs were found",
        29 => c"Resource not in correct state to perform requested operation",
        _ => c"Unknown Error",
    }
}
