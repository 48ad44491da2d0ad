//! The reload loop of `serve`: follows the profile, the host's device numbers and the faults,
//! and swaps the tree they give in place.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc;

use mockgpu_api::{HostTopology, NodeTopology};

use super::state::{AgentState, ServeConfig, record_served};
use crate::faults::{self, Checked, Sourced};
use crate::fuse::TreeHandle;
use crate::profile::{self, ProfileSource};

/// Every `reload_interval` until `stop` is dropped: rebuilds the tree when the profile file or
/// the host's `/proc/devices` changed (a module loaded since may have taken a major the mock
/// chose), or the faults did (the local fault file, the GpuFault objects, one of them expiring),
/// and swaps it in place. A rejected profile keeps the previous one; a fault that does not fit
/// the node is logged and skipped. `record` as [`record_served`] (relayed connections only).
pub(super) fn reload_loop(
    state: &AgentState,
    cfg: &ServeConfig,
    handle: &TreeHandle,
    record: Option<&Path>,
    mut follower: Follower,
    stop: &mpsc::Receiver<()>,
) {
    while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(cfg.reload_interval) {
        let Some(profile_changed) = follower.poll_profile(state) else {
            continue;
        };
        follower.read_local();
        if !profile_changed && !follower.faults_changed(state) {
            continue;
        }
        let tree = follower.render(state);
        let changed = handle.replace(&tree);
        if let Some(record) = record {
            record_served(&tree, record);
        }
        handle.warm(&tree, Path::new(crate::SELF_EXE));
        let topo = follower.topology().clone();
        let mut current = state.topology.write().unwrap_or_else(|e| e.into_inner());
        if current.as_ref() != Some(&topo) {
            if current.as_ref().is_some_and(|t| t.devices != topo.devices) {
                tracing::warn!(devices = ?topo.devices, "the host's /proc/devices changed: device majors chosen anew");
            }
            tracing::info!(profile = %topo.profile.name, gpus = topo.gpus.len(), changed, "tree updated");
            state.published.send_replace(Some(topo.clone()));
            *current = Some(topo);
        } else {
            tracing::info!(changed, "tree updated for the faults");
        }
    }
}

/// What the reload loop follows: the profile and the host's device numbers, the local fault
/// file and the GpuFault objects, with what it served last.
pub(super) struct Follower {
    profile: ProfileSource,
    node_name: String,
    sysfs: PathBuf,
    procfs: PathBuf,
    faults_file: PathBuf,
    /// The profile's bytes and `/proc/devices` last seen.
    raw: Vec<u8>,
    devices: Vec<u8>,
    /// The GPUs placed on the host by the last profile accepted.
    placed: (NodeTopology, HostTopology),
    /// The fault file's bytes last read (`None` before the first read), and its faults.
    local_raw: Option<Vec<u8>>,
    local: Vec<Sourced>,
    /// The last error reading the fault file (logged once).
    local_error: Option<String>,
    /// The faults last applied or refused, and the GpuFault objects expired then.
    candidates: Vec<Sourced>,
    expired: std::collections::BTreeMap<String, String>,
}

impl Follower {
    pub(super) fn new(
        cfg: &ServeConfig,
        raw: Vec<u8>,
        placed: (NodeTopology, HostTopology),
    ) -> Follower {
        Follower {
            profile: cfg.profile.clone(),
            node_name: cfg.node_name.clone(),
            sysfs: cfg.sysfs.clone(),
            procfs: cfg.procfs.clone(),
            faults_file: cfg.layout.faults_file(),
            devices: fs::read(cfg.procfs.join("devices")).unwrap_or_default(),
            raw,
            placed,
            local_raw: None,
            local: Vec::new(),
            local_error: None,
            candidates: Vec::new(),
            expired: std::collections::BTreeMap::new(),
        }
    }

    /// The GPUs placed by the last profile accepted.
    pub(super) fn topology(&self) -> &NodeTopology {
        &self.placed.0
    }

    /// Reads the profile and `/proc/devices`; on a change, places the GPUs anew. Whether the
    /// placement changed; `None` when the profile cannot be read.
    fn poll_profile(&mut self, state: &AgentState) -> Option<bool> {
        let profile_now = match self.profile.read() {
            Ok(now) => now,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read profile file");
                return None;
            }
        };
        let devices_now = fs::read(self.procfs.join("devices")).unwrap_or_default();
        if profile_now == self.raw && devices_now == self.devices {
            return Some(false);
        }
        let placed = self
            .profile
            .parse(&profile_now)
            .and_then(|p| profile::place(&p, &self.node_name, &self.sysfs, &self.procfs));
        self.raw = profile_now;
        self.devices = devices_now;
        match placed {
            Ok(placed) => {
                self.placed = placed;
                state.reloads.fetch_add(1, Ordering::Relaxed);
                Some(true)
            }
            Err(e) => {
                state.reload_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "profile change rejected; still serving the previous tree");
                Some(false)
            }
        }
    }

    /// Reads the local fault file; when its bytes changed, takes its faults (an entry that is
    /// not a fault is logged and skipped; a file that is no fault file at all is logged, and
    /// the faults read before stay).
    pub(super) fn read_local(&mut self) {
        let raw = match faults::read_raw(&self.faults_file) {
            Ok(raw) => raw,
            Err(e) => {
                let e = e.to_string();
                if self.local_error.as_ref() != Some(&e) {
                    tracing::warn!(error = %e, "cannot read the local faults; keeping those read before");
                    self.local_error = Some(e);
                }
                return;
            }
        };
        self.local_error = None;
        if self.local_raw.as_ref() == Some(&raw) {
            return;
        }
        match faults::parse_lenient(&raw) {
            Ok((local, errors)) => {
                for error in errors {
                    tracing::warn!(file = %self.faults_file.display(), %error, "local fault skipped");
                }
                self.local = local;
            }
            Err(e) => {
                tracing::warn!(file = %self.faults_file.display(), error = %e, "the fault file is invalid; keeping the faults read before");
            }
        }
        self.local_raw = Some(raw);
    }

    /// The local faults, then those of the GpuFault objects naming this node that have not
    /// expired, and the objects that have.
    fn gather(
        &self,
        state: &AgentState,
    ) -> (Vec<Sourced>, std::collections::BTreeMap<String, String>) {
        let now = k8s_openapi::jiff::Timestamp::now();
        let (cluster, expired) =
            faults::cluster_candidates(&state.cluster.borrow(), &self.node_name, now);
        let mut candidates = self.local.clone();
        candidates.extend(cluster);
        (candidates, expired)
    }

    /// Whether the faults differ from those last rendered.
    fn faults_changed(&self, state: &AgentState) -> bool {
        let (candidates, expired) = self.gather(state);
        candidates != self.candidates || expired != self.expired
    }

    /// Checks the faults against the GPUs placed, publishes them (and the GpuFault objects'
    /// verdicts) and renders the tree they leave.
    pub(super) fn render(&mut self, state: &AgentState) -> crate::tree::Tree {
        let (candidates, expired) = self.gather(state);
        let (topo, host) = &self.placed;
        let checked = Checked::of(topo, &candidates);
        for (source, error) in &checked.refused {
            tracing::warn!(%source, %error, "GPU fault skipped: it does not fit this node");
        }
        state
            .fault_errors
            .fetch_add(checked.refused.len() as u64, Ordering::Relaxed);
        let applied = checked.faults();
        if !candidates.is_empty() || !self.candidates.is_empty() {
            tracing::info!(
                faults = applied.len(),
                refused = checked.refused.len(),
                "GPU faults applied"
            );
        }
        let tree = crate::render::driver_tree_with(topo, host, &applied);
        state.faults.send_if_modified(|current| {
            let report = checked.report(topo);
            let changed = *current != report;
            *current = report;
            changed
        });
        let verdicts = faults::verdicts(&state.cluster.borrow(), &checked, &expired);
        state.verdicts.send_if_modified(|current| {
            let changed = *current != verdicts;
            *current = verdicts;
            changed
        });
        self.candidates = candidates;
        self.expired = expired;
        tree
    }
}
