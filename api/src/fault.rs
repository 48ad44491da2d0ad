//! GPU faults as data: what is broken on which GPU of a node, and what a real node shows for it.
//!
//! A [`Fault`] names a GPU (its index, as `nvidia-smi` numbers it) and a [`FaultKind`]. Faults come
//! from two places, with the same fields: the cluster-scoped [`GpuFault`] object
//! (`mockgpu.io/v1alpha1`) and the node's local file ([`FaultFile`], written by
//! `mockgpu-agent fault`). [`GpuState::of`] folds a GPU's faults into what the renderer, the mock
//! NVML and the device plugin show:
//!
//! | fault | driver files | NVML (`nvml/gpus/<bus>`) | device plugin |
//! |---|---|---|---|
//! | `Xid` | a line in [`XID_LOG_FILE`]; Xid 79 removes the GPU's `proc` and sysfs entries | an Xid event; 79: `GPU_IS_LOST`; 48, 94, 95: one double-bit error; 63: a row remapping pending; 64: a remapping failure | unhealthy for a [critical](Xid::critical) code |
//! | `Ecc` | | the error counters; double-bit errors leave a row remapping (retired page before Ampere) pending | unhealthy with double-bit errors |
//! | `Thermal` | | temperature above the slowdown threshold, thermal clock-event reasons | healthy |
//! | `NVLinkDown` | | that link inactive | healthy |
//! | `Excluded` | `GPU Excluded: Yes` in `information` | not enumerated (an excluded GPU) | unhealthy |
//!
//! Faults are reversible: removing one restores what it changed.

use std::fmt::Write as _;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{BusId, NodeTopology};

/// The kernel-log lines of the node's Xid errors, relative to the mock root: one line per Xid
/// fault, as the driver writes it to the kernel log (which mockgpu never touches).
pub const XID_LOG_FILE: &str = "log/nvidia-xid";

/// An Xid code mockgpu knows: its number, the driver's text, and whether NVIDIA's device plugin
/// counts it against the GPU's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Xid {
    /// The Xid number.
    pub code: u32,
    /// What the driver writes after the code.
    pub text: &'static str,
    /// `false` for the application errors NVIDIA's device plugin ignores (13, 31, 43, 45, 68).
    pub critical: bool,
}

/// The Xid codes a fault may name.
pub const XIDS: &[Xid] = &[
    xid(13, "Graphics Exception: ESR 0x404600=0x80000002", false),
    xid(
        31,
        "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f00_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
        false,
    ),
    xid(43, "Ch 00000008, engmask 00000101", false),
    xid(45, "Ch 00000008, engmask 00000101, intr 00000000", false),
    xid(
        48,
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0.",
        true,
    ),
    xid(
        61,
        "Internal micro-controller breakpoint/warning (PMU halt)",
        true,
    ),
    xid(62, "Internal micro-controller halt (PMU halt)", true),
    xid(
        63,
        "Row Remapper: New row marked for remapping, reset gpu to activate.",
        true,
    ),
    xid(64, "Row Remapper: Failed to mark row for remapping.", true),
    xid(68, "NVDEC0 Exception", false),
    xid(
        74,
        "NVLink: fatal error detected on link 0(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        true,
    ),
    xid(79, "GPU has fallen off the bus.", true),
    xid(92, "High single-bit ECC error rate", true),
    xid(94, "Contained: SM (0x1). RST: No, D-RST: No", true),
    xid(95, "Uncontained: FBHUB. RST: Yes, D-RST: No", true),
    xid(
        119,
        "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20800a4c 0x4).",
        true,
    ),
    xid(120, "GSP task exception", true),
];

const fn xid(code: u32, text: &'static str, critical: bool) -> Xid {
    Xid {
        code,
        text,
        critical,
    }
}

impl Xid {
    /// The known Xid `code`.
    pub fn of(code: u32) -> Option<&'static Xid> {
        XIDS.iter().find(|x| x.code == code)
    }

    /// The kernel-log line the driver writes for this Xid on `bus` (`NVRM: Xid (PCI:0000:06:00):
    /// 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.`).
    pub fn log_line(&self, bus: &BusId) -> String {
        format!(
            "NVRM: Xid (PCI:{:04x}:{:02x}:{:02x}): {}, pid='<unknown>', name=<unknown>, {}",
            bus.domain, bus.bus, bus.slot, self.code, self.text
        )
    }
}

/// The Xid of a GPU fallen off the bus.
pub const XID_FALLEN_OFF_THE_BUS: u32 = 79;

/// What is broken.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum FaultKind {
    /// An Xid error (`xid` names its code).
    Xid,
    /// ECC errors (`singleBit` corrected, `doubleBit` uncorrected).
    Ecc,
    /// Thermal slowdown: the GPU is over its slowdown temperature.
    Thermal,
    /// An NVLink (`link`) is down.
    #[serde(rename = "NVLinkDown")]
    NvLinkDown,
    /// The GPU is excluded by the driver.
    Excluded,
}

/// One fault on one GPU.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = fault_schema)]
pub struct Fault {
    /// The GPU's index (`nvidia-smi`'s, in minor order).
    pub gpu: u32,
    /// What is broken.
    pub kind: FaultKind,
    /// `Xid`: the code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid: Option<u32>,
    /// `Ecc`: corrected (single-bit) errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub single_bit: Option<u64>,
    /// `Ecc`: uncorrected (double-bit) errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub double_bit: Option<u64>,
    /// `NVLinkDown`: the link's number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<u32>,
}

/// A fault that does not fit the node, or does not say what it needs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultError {
    /// The node has no such GPU.
    #[error("GPU {gpu}: the node has {count} GPUs (0 to {last})", last = count.saturating_sub(1))]
    UnknownGpu {
        /// The index named.
        gpu: u32,
        /// The node's GPU count.
        count: usize,
    },
    /// An Xid mockgpu does not know.
    #[error("unknown Xid {code}: known are {known}", known = known_xids())]
    UnknownXid {
        /// The code named.
        code: u32,
    },
    /// A field the kind needs is missing, or one it does not take is set.
    #[error("a {kind:?} fault {what}")]
    Fields {
        /// The kind.
        kind: FaultKind,
        /// What is wrong (`needs \`xid\``).
        what: String,
    },
    /// The GPU has no such NVLink.
    #[error("GPU {gpu} has no NVLink {link} ({links} links)")]
    UnknownLink {
        /// The GPU.
        gpu: u32,
        /// The link named.
        link: u32,
        /// The GPU's link count.
        links: usize,
    },
}

/// The API server refuses what [`Fault::validate`] can tell without the node: an unknown Xid
/// (the schema's enum names the known ones) and a kind without the field it needs.
fn fault_schema(schema: &mut schemars::Schema) {
    crate::gpunode::kubernetes_formats(schema);
    let codes: Vec<serde_json::Value> = XIDS.iter().map(|x| x.code.into()).collect();
    if let Some(xid) = schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("xid"))
        .and_then(|x| x.as_object_mut())
    {
        xid.insert("enum".into(), codes.into());
    }
    let rules: Vec<serde_json::Value> = [
        ("self.kind != 'Xid' || has(self.xid)", "a Xid fault needs `xid`"),
        ("self.kind != 'NVLinkDown' || has(self.link)", "a NVLinkDown fault needs `link`"),
        (
            "self.kind != 'Ecc' || (has(self.singleBit) && self.singleBit > 0) || (has(self.doubleBit) && self.doubleBit > 0)",
            "an Ecc fault needs `singleBit` or `doubleBit` above 0",
        ),
    ]
    .iter()
    .map(|(rule, message)| serde_json::json!({ "rule": rule, "message": message }))
    .collect();
    schema.insert("x-kubernetes-validations".into(), rules.into());
}

fn known_xids() -> String {
    let codes: Vec<String> = XIDS.iter().map(|x| x.code.to_string()).collect();
    codes.join(", ")
}

impl Fault {
    /// A fault of `kind` on GPU `gpu`, none of the kinds' fields set.
    pub fn new(gpu: u32, kind: FaultKind) -> Fault {
        Fault {
            gpu,
            kind,
            xid: None,
            single_bit: None,
            double_bit: None,
            link: None,
        }
    }

    /// Xid `code` on GPU `gpu`.
    pub fn xid(gpu: u32, code: u32) -> Fault {
        Fault {
            xid: Some(code),
            ..Fault::new(gpu, FaultKind::Xid)
        }
    }

    /// Checks the fault against the node's GPUs: the GPU exists, the kind has exactly the fields
    /// it needs, the Xid is known, the link exists.
    pub fn validate(&self, topo: &NodeTopology) -> Result<(), FaultError> {
        let Some(gpu) = topo.gpus.iter().find(|g| g.index == self.gpu) else {
            return Err(FaultError::UnknownGpu {
                gpu: self.gpu,
                count: topo.gpus.len(),
            });
        };
        let fields = |what: &str| FaultError::Fields {
            kind: self.kind,
            what: what.to_string(),
        };
        let set = [
            ("xid", self.xid.is_some()),
            ("singleBit", self.single_bit.is_some()),
            ("doubleBit", self.double_bit.is_some()),
            ("link", self.link.is_some()),
        ];
        let allowed: &[&str] = match self.kind {
            FaultKind::Xid => &["xid"],
            FaultKind::Ecc => &["singleBit", "doubleBit"],
            FaultKind::NvLinkDown => &["link"],
            FaultKind::Thermal | FaultKind::Excluded => &[],
        };
        if let Some((name, _)) = set.iter().find(|(n, s)| *s && !allowed.contains(n)) {
            return Err(fields(&format!("takes no `{name}`")));
        }
        match self.kind {
            FaultKind::Xid => {
                let code = self.xid.ok_or_else(|| fields("needs `xid`"))?;
                Xid::of(code).ok_or(FaultError::UnknownXid { code })?;
            }
            FaultKind::Ecc => {
                if self.single_bit.unwrap_or(0) == 0 && self.double_bit.unwrap_or(0) == 0 {
                    return Err(fields("needs `singleBit` or `doubleBit` above 0"));
                }
            }
            FaultKind::NvLinkDown => {
                let link = self.link.ok_or_else(|| fields("needs `link`"))?;
                let links = crate::nvml::nvlink_remotes(topo, gpu).len();
                if usize::try_from(link).map_or(true, |l| l >= links) {
                    return Err(FaultError::UnknownLink {
                        gpu: self.gpu,
                        link,
                        links,
                    });
                }
            }
            FaultKind::Thermal | FaultKind::Excluded => {}
        }
        Ok(())
    }

    /// One line for people: `GPU 1: Xid 79 (GPU has fallen off the bus.)`.
    pub fn describe(&self) -> String {
        let mut s = format!("GPU {}: ", self.gpu);
        match self.kind {
            FaultKind::Xid => {
                let code = self.xid.unwrap_or(0);
                let _ = write!(s, "Xid {code}");
                if let Some(x) = Xid::of(code) {
                    let _ = write!(s, " ({})", x.text);
                }
            }
            FaultKind::Ecc => {
                let _ = write!(
                    s,
                    "ECC errors: {} single-bit, {} double-bit",
                    self.single_bit.unwrap_or(0),
                    self.double_bit.unwrap_or(0)
                );
            }
            FaultKind::Thermal => s.push_str("thermal slowdown"),
            FaultKind::NvLinkDown => {
                let _ = write!(s, "NVLink {} down", self.link.unwrap_or(0));
            }
            FaultKind::Excluded => s.push_str("excluded"),
        }
        s
    }
}

/// What one GPU shows under its faults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuState {
    /// Fallen off the bus (Xid 79).
    pub lost: bool,
    /// Excluded by the driver.
    pub excluded: bool,
    /// Over the slowdown temperature.
    pub thermal: bool,
    /// NVLinks down, ascending.
    pub links_down: Vec<u32>,
    /// Corrected ECC errors.
    pub single_bit: u64,
    /// Uncorrected ECC errors.
    pub double_bit: u64,
    /// A row remapping (a page retirement before Ampere) waits for a reset.
    pub remap_pending: bool,
    /// A row remapping failed.
    pub remap_failure: bool,
    /// The Xid codes raised, in the faults' order.
    pub xids: Vec<u32>,
}

impl GpuState {
    /// The state of GPU `gpu` under `faults` (faults of other GPUs are ignored).
    pub fn of<'a>(faults: impl IntoIterator<Item = &'a Fault>, gpu: u32) -> GpuState {
        let mut s = GpuState::default();
        for f in faults.into_iter().filter(|f| f.gpu == gpu) {
            match f.kind {
                FaultKind::Xid => {
                    let code = f.xid.unwrap_or(0);
                    s.xids.push(code);
                    match code {
                        XID_FALLEN_OFF_THE_BUS => s.lost = true,
                        48 | 94 | 95 => {
                            s.double_bit += 1;
                            s.remap_pending = true;
                        }
                        63 => s.remap_pending = true,
                        64 => s.remap_failure = true,
                        _ => {}
                    }
                }
                FaultKind::Ecc => {
                    s.single_bit += f.single_bit.unwrap_or(0);
                    let dbe = f.double_bit.unwrap_or(0);
                    s.double_bit += dbe;
                    s.remap_pending |= dbe > 0;
                }
                FaultKind::Thermal => s.thermal = true,
                FaultKind::NvLinkDown => s.links_down.extend(f.link),
                FaultKind::Excluded => s.excluded = true,
            }
        }
        s.links_down.sort_unstable();
        s.links_down.dedup();
        s
    }

    /// Whether the device plugin advertises the GPU as healthy: not lost, not excluded, no
    /// critical Xid and no double-bit error (thermal slowdown and a link down leave it usable,
    /// as NVIDIA's device plugin does).
    pub fn healthy(&self) -> bool {
        !self.lost
            && !self.excluded
            && self.double_bit == 0
            && !self
                .xids
                .iter()
                .any(|&c| Xid::of(c).is_none_or(|x| x.critical))
    }

    /// Whether the GPU has any fault.
    pub fn is_faulty(&self) -> bool {
        *self != GpuState::default()
    }
}

/// The content of [`XID_LOG_FILE`] for `faults` on `topo`'s GPUs, in the faults' order.
pub fn xid_log<'a>(topo: &NodeTopology, faults: impl IntoIterator<Item = &'a Fault>) -> String {
    let mut s = String::new();
    for f in faults {
        let gpu = topo.gpus.iter().find(|g| g.index == f.gpu);
        if let (FaultKind::Xid, Some(code), Some(gpu)) = (f.kind, f.xid, gpu)
            && let Some(x) = Xid::of(code)
        {
            s.push_str(&x.log_line(&gpu.bus_id));
            s.push('\n');
        }
    }
    s
}

/// A node's local faults (`mockgpu-agent fault`), as the agent reads them from the layout's
/// faults file: JSON, `{"faults": [{"name": …, "gpu": …, "kind": …, …}]}`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FaultFile {
    /// The faults, in the order they were added.
    pub faults: Vec<NamedFault>,
}

/// A fault with a name to remove it by.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NamedFault {
    /// Unique within its source.
    pub name: String,
    /// The fault.
    #[serde(flatten)]
    pub fault: Fault,
}

/// The fault's condition types on a [`GpuFault`].
pub mod condition {
    /// The node's agent applied the fault (`True`), or refused it (`False`, with the reason
    /// `Invalid` and a message naming what is wrong).
    pub const APPLIED: &str = "Applied";
}

/// A fault injected into one GPU of one node: cluster-scoped, written by whoever may write
/// GpuNodes' controller side; the node's agent applies it and reports in its status.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "mockgpu.io",
    version = "v1alpha1",
    kind = "GpuFault",
    plural = "gpufaults",
    singular = "gpufault",
    status = "GpuFaultStatus",
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.nodeName"}"#,
    printcolumn = r#"{"name":"GPU","type":"integer","jsonPath":".spec.gpu"}"#,
    printcolumn = r#"{"name":"Kind","type":"string","jsonPath":".spec.kind"}"#,
    printcolumn = r#"{"name":"Xid","type":"integer","jsonPath":".spec.xid"}"#,
    printcolumn = r#"{"name":"Applied","type":"string","jsonPath":".status.conditions[?(@.type==\"Applied\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::gpunode::kubernetes_formats)]
pub struct GpuFaultSpec {
    /// The node.
    pub node_name: String,
    /// The fault.
    #[serde(flatten)]
    pub fault: Fault,
    /// When the fault ends by itself (the agent stops applying it; the object stays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<Time>,
}

/// What the node's agent made of the fault.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuFaultStatus {
    /// `Applied`.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Profile;
    use crate::topology::tests::host;

    fn gb300() -> NodeTopology {
        let p = Profile::builtin("gb300").unwrap();
        NodeTopology::build(&p, "node-a", &host(&[(0, 0..72)], &[(0, 0..72)])).unwrap()
    }

    fn xid_fault(gpu: u32, code: u32) -> Fault {
        Fault::xid(gpu, code)
    }

    #[test]
    fn faults_are_checked_against_the_node() {
        let t = gb300();
        assert_eq!(xid_fault(1, 79).validate(&t), Ok(()));
        let e = xid_fault(4, 79).validate(&t).unwrap_err();
        assert_eq!(e.to_string(), "GPU 4: the node has 4 GPUs (0 to 3)");
        let e = xid_fault(0, 7).validate(&t).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("unknown Xid 7: known are 13, 31,"),
            "{e}"
        );
        let mut f = xid_fault(0, 79);
        f.xid = None;
        assert_eq!(
            f.validate(&t).unwrap_err().to_string(),
            "a Xid fault needs `xid`"
        );
        f.kind = FaultKind::Thermal;
        f.link = Some(0);
        assert_eq!(
            f.validate(&t).unwrap_err().to_string(),
            "a Thermal fault takes no `link`"
        );
        f.kind = FaultKind::NvLinkDown;
        assert_eq!(f.validate(&t), Ok(()));
        f.link = Some(18);
        assert_eq!(
            f.validate(&t).unwrap_err().to_string(),
            "GPU 0 has no NVLink 18 (18 links)"
        );
        let ecc = Fault {
            kind: FaultKind::Ecc,
            xid: None,
            ..f
        };
        assert!(ecc.validate(&t).is_err(), "an ECC fault without errors");
    }

    #[test]
    fn the_state_follows_the_faults_of_its_gpu() {
        let lost = xid_fault(1, 79);
        let app = xid_fault(1, 13);
        assert!(GpuState::of([&lost], 1).lost);
        assert!(!GpuState::of([&lost], 1).healthy());
        assert!(GpuState::of([&lost], 0).healthy());
        assert!(!GpuState::of([&lost], 0).is_faulty());
        let s = GpuState::of([&app], 1);
        assert!(
            s.healthy() && s.is_faulty(),
            "Xid 13 is an application error"
        );
        let dbe = GpuState::of([&xid_fault(2, 48)], 2);
        assert_eq!((dbe.double_bit, dbe.remap_pending), (1, true));
    }

    #[test]
    fn the_xid_log_has_the_drivers_line() {
        let t = gb300();
        let bus = t.gpus[1].bus_id;
        let log = xid_log(&t, [&xid_fault(1, 79)]);
        assert_eq!(
            log,
            format!(
                "NVRM: Xid (PCI:{:04x}:{:02x}:{:02x}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n",
                bus.domain, bus.bus, bus.slot
            )
        );
    }

    #[test]
    fn the_fault_file_and_the_crd_share_the_fields() {
        let file: FaultFile =
            serde_json::from_str(r#"{"faults":[{"name":"a","gpu":1,"kind":"Xid","xid":79}]}"#)
                .unwrap();
        assert_eq!(file.faults[0].fault, xid_fault(1, 79));
        let e =
            serde_json::from_str::<FaultFile>(r#"{"faults":[{"name":"a","gpu":1,"kind":"Xyz"}]}"#)
                .unwrap_err();
        assert!(e.to_string().contains("Xyz"), "{e}");
        let spec: GpuFaultSpec =
            serde_json::from_str(r#"{"nodeName":"n","gpu":0,"kind":"NVLinkDown","link":2}"#)
                .unwrap();
        assert_eq!(
            (spec.fault.kind, spec.fault.link),
            (FaultKind::NvLinkDown, Some(2))
        );
    }

    #[test]
    fn the_crd_lists_the_known_xids_and_the_rules_of_each_kind() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(GpuFault::crd()).unwrap();
        assert_eq!(crd["spec"]["scope"], "Cluster");
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let codes = spec["properties"]["xid"]["enum"].as_array().unwrap();
        assert_eq!(codes.len(), XIDS.len());
        assert!(codes.contains(&79.into()) && !codes.contains(&7.into()));
        assert_eq!(spec["properties"]["gpu"]["format"], "int64");
        let rules = spec["x-kubernetes-validations"].as_array().unwrap();
        assert!(
            rules
                .iter()
                .any(|r| r["rule"] == "self.kind != 'Xid' || has(self.xid)")
        );
    }
}
