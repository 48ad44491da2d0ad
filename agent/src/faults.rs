//! GPU faults in the agent (see `docs/faults.md`): the node's local fault file, which
//! `mockgpu-agent fault` edits; the faults the agent applies (the local ones and the GpuFault
//! objects naming the node), each checked against the node's GPUs; and what the applied faults
//! make of the device plugin's health and the GpuNode's status.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use mockgpu_api::fault::{FaultError, FaultFile, NamedFault, condition};
use mockgpu_api::{Fault, FaultKind, GpuFaultSpec, GpuNodeFault, GpuState, NodeTopology};

/// The variable that names the fault file `mockgpu-agent fault` edits, set by `exec` for its
/// command (and honoured by `fault` before `--dir`).
pub const FAULTS_ENV: &str = "MOCKGPU_FAULTS";
/// Largest fault file read (a few hundred faults fit in far less).
pub const MAX_FAULTS_BYTES: u64 = 1 << 20;
/// The source prefix of a local fault (`local/<name>`).
pub const LOCAL: &str = "local";
/// The source prefix of a GpuFault object's fault (`GpuFault/<name>`).
pub const CLUSTER: &str = "GpuFault";

/// Errors of reading, editing and writing the fault file.
#[derive(Debug, thiserror::Error)]
pub enum FaultFileError {
    /// The file could not be read.
    #[error("cannot read fault file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file is not a fault file.
    #[error("fault file {path} is invalid: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The file could not be written.
    #[error("cannot write fault file {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The fault does not fit the node.
    #[error(transparent)]
    Invalid(#[from] FaultError),
    /// The name is taken.
    #[error("a fault named {0:?} exists already (clear it first)")]
    Exists(String),
    /// No fault has the name.
    #[error("no fault named {0:?}")]
    NoSuch(String),
    /// The name cannot be used.
    #[error(
        "invalid fault name {0:?}: 1 to 63 letters, digits, '-', '_' or '.', starting with a letter or digit"
    )]
    Name(String),
}

/// Reads the fault file at `path`; an absent file has no faults. Strict: an entry that is not a
/// fault makes the whole file invalid (what `mockgpu-agent fault` needs before editing it).
pub fn read_file(path: &Path) -> Result<FaultFile, FaultFileError> {
    let raw = read_raw(path)?;
    if raw.iter().all(u8::is_ascii_whitespace) {
        return Ok(FaultFile::default());
    }
    serde_json::from_slice(&raw).map_err(|e| FaultFileError::Parse {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// The bytes of the fault file at `path` (none when it is absent), at most
/// [`MAX_FAULTS_BYTES`].
pub fn read_raw(path: &Path) -> Result<Vec<u8>, FaultFileError> {
    let err = |source| FaultFileError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(err(e)),
    };
    if !file.metadata().map_err(err)?.is_file() {
        return Err(err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    let mut raw = Vec::new();
    file.take(MAX_FAULTS_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(err)?;
    if raw.len() as u64 > MAX_FAULTS_BYTES {
        return Err(err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {MAX_FAULTS_BYTES} bytes"),
        )));
    }
    Ok(raw)
}

/// Writes `file` to `path` atomically: a temporary file beside it, synced, then renamed over it
/// (a reader sees the old faults or the new ones, never a part). Creates the directory.
pub fn write_file(path: &Path, file: &FaultFile) -> Result<(), FaultFileError> {
    let err = |source| FaultFileError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(err)?;
    let mut text = serde_json::to_string_pretty(file).expect("a fault file serializes");
    text.push('\n');
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written.map_err(err)
}

fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The name a fault gets when none is given: `gpu1-xid79`, `gpu0-ecc`, `gpu2-thermal`,
/// `gpu3-nvlink4`, `gpu1-excluded`.
pub fn default_name(fault: &Fault) -> String {
    let what = match fault.kind {
        FaultKind::Xid => format!("xid{}", fault.xid.unwrap_or(0)),
        FaultKind::Ecc => "ecc".into(),
        FaultKind::Thermal => "thermal".into(),
        FaultKind::NvLinkDown => format!("nvlink{}", fault.link.unwrap_or(0)),
        FaultKind::Excluded => "excluded".into(),
    };
    format!("gpu{}-{what}", fault.gpu)
}

/// Adds `fault` to `file` as `name` (by default [`default_name`], with `-2`, `-3`… when taken)
/// once it fits `topo`; the name given. Leaves `file` as it was on error.
pub fn add(
    file: &mut FaultFile,
    name: Option<&str>,
    fault: Fault,
    topo: &NodeTopology,
) -> Result<String, FaultFileError> {
    fault.validate(topo)?;
    let taken = |n: &str| file.faults.iter().any(|f| f.name == n);
    let name = match name {
        Some(n) if !valid_name(n) => return Err(FaultFileError::Name(n.into())),
        Some(n) if taken(n) => return Err(FaultFileError::Exists(n.into())),
        Some(n) => n.to_string(),
        None => {
            let base = default_name(&fault);
            (1..)
                .map(|i| {
                    if i == 1 {
                        base.clone()
                    } else {
                        format!("{base}-{i}")
                    }
                })
                .find(|n| !taken(n))
                .expect("some suffix is free")
        }
    };
    file.faults.push(NamedFault {
        name: name.clone(),
        fault,
    });
    Ok(name)
}

/// Which faults `fault clear` removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Clear {
    /// The fault of that name.
    Name(String),
    /// Every fault of that GPU.
    Gpu(u32),
    /// Every fault.
    All,
}

/// Removes the faults `which` names from `file`; those removed. A name that is not there is an
/// error; a GPU without faults, or an empty file, is not.
pub fn clear(file: &mut FaultFile, which: &Clear) -> Result<Vec<NamedFault>, FaultFileError> {
    let (removed, kept): (Vec<NamedFault>, Vec<NamedFault>) =
        file.faults.drain(..).partition(|f| match which {
            Clear::Name(n) => f.name == *n,
            Clear::Gpu(g) => f.fault.gpu == *g,
            Clear::All => true,
        });
    file.faults = kept;
    if let Clear::Name(n) = which
        && removed.is_empty()
    {
        return Err(FaultFileError::NoSuch(n.clone()));
    }
    Ok(removed)
}

/// The local faults in the bytes of a fault file, for the agent: each entry on its own, so that
/// a bad entry is skipped (and named in the second list) while the others apply. `Err` when the
/// file is not a fault file at all.
pub fn parse_lenient(raw: &[u8]) -> Result<(Vec<Sourced>, Vec<String>), String> {
    if raw.iter().all(u8::is_ascii_whitespace) {
        return Ok((Vec::new(), Vec::new()));
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Loose {
        faults: Vec<serde_json::Value>,
    }
    let loose: Loose = serde_json::from_slice(raw).map_err(|e| e.to_string())?;
    let mut faults = Vec::new();
    let mut errors = Vec::new();
    let mut names = BTreeSet::new();
    for (i, entry) in loose.faults.into_iter().enumerate() {
        match serde_json::from_value::<NamedFault>(entry) {
            Ok(f) if !names.insert(f.name.clone()) => {
                errors.push(format!("fault {i} ({}): the name is used twice", f.name));
            }
            Ok(f) => faults.push(Sourced {
                source: format!("{LOCAL}/{}", f.name),
                fault: f.fault,
            }),
            Err(e) => errors.push(format!("fault {i}: {e}")),
        }
    }
    Ok((faults, errors))
}

/// A fault and where it comes from: `local/<name>` or `GpuFault/<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sourced {
    /// `local/<name>` or `GpuFault/<name>`.
    pub source: String,
    /// The fault.
    pub fault: Fault,
}

/// The faults checked against the node's GPUs: those applied, in order (local ones first), and
/// those refused, with why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checked {
    /// Applied.
    pub applied: Vec<Sourced>,
    /// Refused: the source and the error.
    pub refused: Vec<(String, FaultError)>,
}

impl Checked {
    /// Checks `candidates` against `topo`.
    pub fn of(topo: &NodeTopology, candidates: &[Sourced]) -> Checked {
        let mut checked = Checked::default();
        for c in candidates {
            match c.fault.validate(topo) {
                Ok(()) => checked.applied.push(c.clone()),
                Err(e) => checked.refused.push((c.source.clone(), e)),
            }
        }
        checked
    }

    /// The applied faults.
    pub fn faults(&self) -> Vec<Fault> {
        self.applied.iter().map(|s| s.fault.clone()).collect()
    }

    /// What the device plugin and the reporter need of the applied faults on `topo`.
    pub fn report(&self, topo: &NodeTopology) -> FaultReport {
        let faults = self.faults();
        let status = self
            .applied
            .iter()
            .map(|s| GpuNodeFault {
                source: s.source.clone(),
                gpu: s.fault.gpu,
                uuid: topo
                    .gpus
                    .iter()
                    .find(|g| g.index == s.fault.gpu)
                    .map(|g| g.uuid.clone())
                    .unwrap_or_default(),
                kind: s.fault.kind,
                xid: s.fault.xid,
                message: s.fault.describe(),
            })
            .collect();
        let unhealthy = unhealthy(&faults, topo);
        FaultReport {
            faults,
            status,
            unhealthy,
        }
    }
}

/// The GPU indices of `topo` that `faults` leave unhealthy ([`GpuState::healthy`]).
pub fn unhealthy(faults: &[Fault], topo: &NodeTopology) -> BTreeSet<u32> {
    topo.gpus
        .iter()
        .map(|g| g.index)
        .filter(|&i| !GpuState::of(faults, i).healthy())
        .collect()
}

/// The applied faults as the device plugin and the GpuNode reporter see them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultReport {
    /// The faults applied.
    pub faults: Vec<Fault>,
    /// One GpuNode status entry per applied fault.
    pub status: Vec<GpuNodeFault>,
    /// The GPU indices the faults leave unhealthy.
    pub unhealthy: BTreeSet<u32>,
}

impl FaultReport {
    /// The GpuNode's `unhealthyGpus`.
    pub fn unhealthy_gpus(&self) -> u32 {
        u32::try_from(self.unhealthy.len()).unwrap_or(u32::MAX)
    }
}

/// A GpuFault object as the agent keeps it: its generation and spec.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterFault {
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// The spec.
    pub spec: GpuFaultSpec,
}

/// The GpuFault objects naming this node, by name.
pub type ClusterFaults = BTreeMap<String, ClusterFault>;

/// What the agent made of each GpuFault object, by name: at which generation, and the verdict.
pub type Verdicts = BTreeMap<String, (Option<i64>, Verdict)>;

/// What the agent made of one GpuFault object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Applied.
    Applied,
    /// Refused: the error.
    Invalid(String),
    /// Its `expires` has passed (when).
    Expired(String),
}

/// Whether the GpuFault `spec` is for `node`.
pub fn for_node(spec: &GpuFaultSpec, node: &str) -> bool {
    spec.node_name == node
}

/// Whether the GpuFault `spec` has expired at `now`.
pub fn expired(spec: &GpuFaultSpec, now: Timestamp) -> bool {
    spec.expires.as_ref().is_some_and(|t| t.0 <= now)
}

/// The faults of the GpuFault objects of `node` that have not expired at `now`, as candidates
/// (`GpuFault/<name>`), and the names of the expired ones with their expiry.
pub fn cluster_candidates(
    objects: &ClusterFaults,
    node: &str,
    now: Timestamp,
) -> (Vec<Sourced>, BTreeMap<String, String>) {
    let mut candidates = Vec::new();
    let mut gone = BTreeMap::new();
    for (name, spec) in objects
        .iter()
        .map(|(n, o)| (n, &o.spec))
        .filter(|(_, s)| for_node(s, node))
    {
        if expired(spec, now) {
            let when = spec.expires.as_ref().map(|t| t.0.to_string());
            gone.insert(name.clone(), when.unwrap_or_default());
        } else {
            candidates.push(Sourced {
                source: format!("{CLUSTER}/{name}"),
                fault: spec.fault.clone(),
            });
        }
    }
    (candidates, gone)
}

/// The verdict on each of the GpuFault `objects` (at their generation): expired, refused by
/// `checked`, or applied.
pub fn verdicts(
    objects: &ClusterFaults,
    checked: &Checked,
    expired: &BTreeMap<String, String>,
) -> Verdicts {
    let prefix = format!("{CLUSTER}/");
    let mut out = BTreeMap::new();
    let mut put = |name: &str, verdict| {
        if let Some(o) = objects.get(name) {
            out.insert(name.to_string(), (o.generation, verdict));
        }
    };
    for s in &checked.applied {
        if let Some(name) = s.source.strip_prefix(&prefix) {
            put(name, Verdict::Applied);
        }
    }
    for (source, e) in &checked.refused {
        if let Some(name) = source.strip_prefix(&prefix) {
            put(name, Verdict::Invalid(e.to_string()));
        }
    }
    for (name, when) in expired {
        put(name, Verdict::Expired(when.clone()));
    }
    out
}

/// The `Applied` condition for `verdict` on an object at `generation`; its transition time
/// stays `previous`'s while the status is the same.
pub fn applied_condition(
    verdict: &Verdict,
    generation: Option<i64>,
    previous: Option<&Condition>,
    now: &Time,
) -> Condition {
    let (status, reason, message) = match verdict {
        Verdict::Applied => (
            "True",
            "Applied",
            "the node's agent applies the fault".to_string(),
        ),
        Verdict::Invalid(e) => ("False", "Invalid", e.clone()),
        Verdict::Expired(when) => (
            "False",
            "Expired",
            format!("the fault expired at {when}: the agent no longer applies it"),
        ),
    };
    let last_transition_time = match previous {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => now.clone(),
    };
    Condition {
        type_: condition::APPLIED.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time,
        observed_generation: generation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mockgpu_api::Profile;

    /// Eight H100s on the two-socket fixture.
    pub(crate) fn topo() -> NodeTopology {
        let sysfs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/two-socket");
        let host = crate::host::SysfsHost::new(sysfs).probe().unwrap();
        NodeTopology::build(&Profile::builtin("h100").unwrap(), "node-a", &host).unwrap()
    }

    fn xid(gpu: u32, code: u32) -> Fault {
        Fault::xid(gpu, code)
    }

    #[test]
    fn adding_checks_the_fault_against_the_node() {
        let t = topo();
        let mut file = FaultFile::default();
        assert_eq!(add(&mut file, None, xid(1, 79), &t).unwrap(), "gpu1-xid79");
        assert_eq!(
            add(&mut file, None, xid(1, 79), &t).unwrap(),
            "gpu1-xid79-2"
        );
        assert_eq!(
            add(&mut file, Some("mine"), xid(0, 13), &t).unwrap(),
            "mine"
        );
        let before = file.clone();
        let e = add(&mut file, None, xid(8, 79), &t).unwrap_err();
        assert_eq!(e.to_string(), "GPU 8: the node has 8 GPUs (0 to 7)");
        let e = add(&mut file, None, xid(0, 7), &t).unwrap_err();
        assert!(e.to_string().starts_with("unknown Xid 7: known are"), "{e}");
        let e = add(&mut file, Some("mine"), xid(0, 13), &t).unwrap_err();
        assert!(matches!(e, FaultFileError::Exists(_)), "{e}");
        let e = add(&mut file, Some("../x"), xid(0, 13), &t).unwrap_err();
        assert!(matches!(e, FaultFileError::Name(_)), "{e}");
        assert_eq!(file, before, "a refused fault changes nothing");
    }

    #[test]
    fn clearing_by_name_gpu_or_all() {
        let t = topo();
        let mut file = FaultFile::default();
        for f in [xid(1, 79), xid(1, 13), xid(2, 48)] {
            add(&mut file, None, f, &t).unwrap();
        }
        assert!(matches!(
            clear(&mut file, &Clear::Name("nope".into())),
            Err(FaultFileError::NoSuch(_))
        ));
        assert_eq!(file.faults.len(), 3);
        let removed = clear(&mut file, &Clear::Gpu(1)).unwrap();
        assert_eq!(removed.len(), 2);
        assert_eq!(file.faults[0].name, "gpu2-xid48");
        clear(&mut file, &Clear::Name("gpu2-xid48".into())).unwrap();
        assert!(file.faults.is_empty());
        assert!(clear(&mut file, &Clear::All).unwrap().is_empty());
    }

    #[test]
    fn the_file_is_written_whole_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/faults.json");
        assert_eq!(read_file(&path).unwrap(), FaultFile::default());
        let mut file = FaultFile::default();
        add(&mut file, None, xid(1, 79), &topo()).unwrap();
        write_file(&path, &file).unwrap();
        assert_eq!(read_file(&path).unwrap(), file);
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["faults.json"], "no temporary file left");
        fs::write(&path, "{\"faults\": 3}").unwrap();
        let e = read_file(&path).unwrap_err();
        assert!(e.to_string().starts_with("fault file "), "{e}");
    }

    #[test]
    fn the_agent_skips_bad_entries_and_keeps_the_others() {
        let raw = br#"{"faults":[{"name":"a","gpu":1,"kind":"Xid","xid":79},
            {"name":"b","gpu":0,"kind":"Bogus"},{"name":"a","gpu":2,"kind":"Thermal"},
            {"name":"c","gpu":8,"kind":"Thermal"}]}"#;
        let (faults, errors) = parse_lenient(raw).unwrap();
        assert_eq!(faults.len(), 2);
        assert_eq!(faults[0].source, "local/a");
        assert_eq!(errors.len(), 2, "{errors:?}");
        let checked = Checked::of(&topo(), &faults);
        assert_eq!(checked.applied.len(), 1);
        assert_eq!(checked.refused[0].0, "local/c");
        assert!(parse_lenient(b"[1]").is_err());
        assert_eq!(parse_lenient(b"").unwrap(), (vec![], vec![]));
    }

    #[test]
    fn the_report_lists_each_fault_and_the_unhealthy_gpus() {
        let t = topo();
        let candidates = [
            Sourced {
                source: "local/a".into(),
                fault: xid(1, 79),
            },
            Sourced {
                source: "GpuFault/b".into(),
                fault: xid(2, 13),
            },
            Sourced {
                source: "GpuFault/c".into(),
                fault: xid(3, 7),
            },
        ];
        let report = Checked::of(&t, &candidates).report(&t);
        assert_eq!(report.status.len(), 2);
        assert_eq!(report.status[0].source, "local/a");
        assert_eq!(report.status[0].uuid, t.gpus[1].uuid);
        assert_eq!(report.status[0].xid, Some(79));
        assert_eq!(
            report.status[0].message,
            "GPU 1: Xid 79 (GPU has fallen off the bus.)"
        );
        assert_eq!(
            report.unhealthy,
            BTreeSet::from([1]),
            "Xid 13 leaves it healthy"
        );
        assert_eq!(report.unhealthy_gpus(), 1);
    }

    fn spec(node: &str, fault: Fault, expires: Option<&str>) -> ClusterFault {
        ClusterFault {
            generation: Some(1),
            spec: GpuFaultSpec {
                node_name: node.into(),
                fault,
                expires: expires.map(|t| Time(t.parse().unwrap())),
            },
        }
    }

    #[test]
    fn gpufaults_apply_to_their_node_until_they_expire() {
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let objects = ClusterFaults::from([
            ("a".into(), spec("node-a", xid(1, 79), None)),
            ("b".into(), spec("node-b", xid(1, 79), None)),
            (
                "c".into(),
                spec("node-a", xid(2, 79), Some("2026-01-01T11:59:59Z")),
            ),
            (
                "d".into(),
                spec("node-a", xid(3, 7), Some("2026-01-01T12:00:01Z")),
            ),
        ]);
        let (candidates, expired) = cluster_candidates(&objects, "node-a", now);
        let sources: Vec<&str> = candidates.iter().map(|c| c.source.as_str()).collect();
        assert_eq!(sources, ["GpuFault/a", "GpuFault/d"]);
        assert_eq!(
            expired,
            BTreeMap::from([("c".to_string(), "2026-01-01T11:59:59Z".to_string())])
        );
        let checked = Checked::of(&topo(), &candidates);
        let v = verdicts(&objects, &checked, &expired);
        assert_eq!(v["a"], (Some(1), Verdict::Applied));
        assert!(matches!(&v["d"].1, Verdict::Invalid(m) if m.starts_with("unknown Xid 7")));
        assert!(matches!(&v["c"].1, Verdict::Expired(_)));
        assert!(!v.contains_key("b"), "another node's object");
        let later = "2026-01-01T12:00:02Z".parse().unwrap();
        assert!(
            cluster_candidates(&objects, "node-a", later)
                .1
                .contains_key("d")
        );
    }

    #[test]
    fn the_applied_condition_says_what_the_agent_made_of_the_fault() {
        let t0 = Time("2026-01-01T12:00:00Z".parse().unwrap());
        let t1 = Time("2026-01-01T12:05:00Z".parse().unwrap());
        let ok = applied_condition(&Verdict::Applied, Some(2), None, &t0);
        assert_eq!(
            (ok.type_.as_str(), ok.status.as_str(), ok.reason.as_str()),
            ("Applied", "True", "Applied")
        );
        assert_eq!(ok.observed_generation, Some(2));
        let same = applied_condition(&Verdict::Applied, Some(2), Some(&ok), &t1);
        assert_eq!(same.last_transition_time, t0);
        let bad = applied_condition(
            &Verdict::Invalid("GPU 4: the node has 4 GPUs (0 to 3)".into()),
            Some(3),
            Some(&ok),
            &t1,
        );
        assert_eq!(
            (
                bad.status.as_str(),
                bad.reason.as_str(),
                bad.message.as_str()
            ),
            ("False", "Invalid", "GPU 4: the node has 4 GPUs (0 to 3)")
        );
        assert_eq!(bad.last_transition_time, t1);
        let gone = applied_condition(&Verdict::Expired("x".into()), None, None, &t1);
        assert_eq!(
            (gone.status.as_str(), gone.reason.as_str()),
            ("False", "Expired")
        );
    }
}
