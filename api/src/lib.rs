//! The shared vocabulary of mockgpu: GPU profiles, the host's layout and the node's mock GPUs.
//!
//! Pure data and validation; no I/O. The agent, the NRI plugin and the controller depend on
//! this crate, never the other way round.

mod busid;
mod cpuset;
pub mod devices;
pub mod dra;
pub mod driver;
pub mod fault;
pub mod gpunode;
pub mod information;
pub mod layout;
pub mod nvml;
pub mod profile;
pub mod topology;

pub use busid::{BusId, BusIdError};
pub use cpuset::{CpuListError, CpuSet, MAX_CPUS};
pub use devices::{DeviceNode, DeviceNumbers, DevicesError, ProcDevices};
pub use driver::{DriverFiles, DriverGpu, TreeError};
pub use fault::{Fault, FaultKind, GpuFault, GpuFaultSpec, GpuState};
pub use gpunode::{
    GpuNode, GpuNodeFault, GpuNodeGpu, GpuNodeSpec, GpuNodeStatus, Mode, Pinning, PreparedClaim,
};
pub use information::{Information, InformationError};
pub use layout::{Layout, LayoutError};
pub use profile::{Arch, DriverVersion, Profile, ProfileError, ProfileSpec};
pub use topology::{
    Gpu, HostNumaNode, HostPciDevice, HostSocket, HostTopology, NodeTopology, TopologyError,
};
