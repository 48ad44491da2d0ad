//! The GpuNode reporter of `serve`: server-side applies (field manager `mockgpu-agent`) this
//! node's GpuNode, owned by its Node so that the garbage collector deletes it with the Node,
//! and the agent's part of its status.
//!
//! It reports when the GPUs are first served, on every heartbeat (jittered), about half a second
//! after a pinning change (the NRI plugin's events; Synchronize replays them at every
//! connection) or a change of the device plugin's standing (`DevicePluginConflict`), when
//! the topology changes (a profile reload), and when the GPU faults applied change (`faults`,
//! `unhealthyGpus`). API errors are retried with
//! a doubling delay (1 s to 5 min); after one, the object and the Node are read again. A deleted
//! GpuNode is recreated by the next report. The pure parts are in [`status`], the API server
//! behind [`GpuNodes`] ([`Live`] in production, a fake in the tests).

mod live;
pub mod status;

use std::future::Future;
use std::hash::{BuildHasher as _, Hasher as _};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use mockgpu_api::gpunode::{GpuNode, GpuNodeStatus, PreparedClaim};
use mockgpu_nri::PinningEvent;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::device_plugin::Standing;
use crate::faults::FaultReport;

pub use live::{Credentials, Live, credentials, credentials_from_env};
pub use status::{PinningMap, Previous, Readiness, RealGpus, Served};

/// How long after a pinning change its report waits for more changes.
pub(crate) const DEBOUNCE: Duration = Duration::from_millis(500);
/// How long the last report (`Ready` False) of a stopping agent may take.
const FAREWELL: Duration = Duration::from_secs(2);

/// A failed API request (or credentials that cannot be used), in words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ApiError(pub String);

/// The requests the reporter makes.
pub trait GpuNodes: Send + Sync + 'static {
    /// The uid of the Node `name`.
    fn node_uid(&self, name: &str) -> impl Future<Output = Result<String, ApiError>> + Send;
    /// The GpuNode `name`, if it exists.
    fn get(&self, name: &str) -> impl Future<Output = Result<Option<GpuNode>, ApiError>> + Send;
    /// Server-side applies `object` (metadata and spec), creating it if need be; the uid of
    /// the object applied.
    fn apply(&self, object: &GpuNode) -> impl Future<Output = Result<String, ApiError>> + Send;
    /// Server-side applies `status` to the GpuNode `name`'s status subresource; with
    /// `resource_version`, only while the object is at that version (false when it has
    /// changed since).
    fn apply_status(
        &self,
        name: &str,
        status: &GpuNodeStatus,
        resource_version: Option<&str>,
    ) -> impl Future<Output = Result<bool, ApiError>> + Send;
}

/// Settings of the reporter.
#[derive(Debug, Clone)]
pub struct Config {
    /// The node (and the GpuNode's name).
    pub node_name: String,
    /// The heartbeat period (each one jittered by a tenth).
    pub heartbeat: Duration,
    /// The API server.
    pub credentials: Credentials,
}

/// A GpuNode named and owned by its Node (`node_uid`), with `spec`.
pub fn gpunode(spec: mockgpu_api::gpunode::GpuNodeSpec, node_uid: &str) -> GpuNode {
    let name = spec.node_name.clone();
    let mut object = GpuNode::new(&name, spec);
    object.metadata = ObjectMeta {
        name: Some(name.clone()),
        owner_references: Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name,
            uid: node_uid.into(),
            ..Default::default()
        }]),
        ..Default::default()
    };
    object
}

/// A number different at each call (std's per-process random hash keys).
fn random_u64() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(u64::from(std::process::id()));
    hasher.finish()
}

/// A number in `[0, 1)`, different at each call.
fn random_unit() -> f64 {
    (random_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// The status agent `instance` reports now, with `previous` as its base.
fn agent_status(
    instance: &str,
    (pinning, faults, claims): (&PinningMap, &FaultReport, &[PreparedClaim]),
    hash: &str,
    readiness: &Readiness,
    standing: Option<&Standing>,
    previous: &Previous,
) -> GpuNodeStatus {
    let now = Time(Timestamp::now());
    let version = env!("CARGO_PKG_VERSION");
    let mut status = status::status(hash, readiness, standing, pinning, previous, version, &now);
    status::with_faults(&mut status, faults);
    status.claims = claims.to_vec();
    status.agent_instance = Some(instance.to_string());
    status
}

/// The reporter's memory of the API server: the Node's uid, the object's uid, and what was
/// reported last. `None` until read (at start, and after an error).
struct Known {
    node_uid: String,
    object_uid: Option<String>,
    previous: Previous,
}

struct Reporter<A> {
    api: A,
    node_name: String,
    /// This process's `agentInstance`.
    instance: String,
    pinning: PinningMap,
    /// The device plugin's standing, when it runs.
    standing: Option<Standing>,
    /// The GPU faults applied.
    faults: FaultReport,
    /// The claims the DRA driver prepared.
    claims: Vec<PreparedClaim>,
    known: Option<Known>,
    reported_once: bool,
}

impl<A: GpuNodes> Reporter<A> {
    /// Reads the Node's uid and the existing object (its `topologySince` and `Ready`).
    async fn refresh(&mut self) -> Result<(), ApiError> {
        if self.known.is_none() {
            let node_uid = self.api.node_uid(&self.node_name).await?;
            let existing = self.api.get(&self.node_name).await?;
            self.known = Some(Known {
                node_uid,
                object_uid: existing.as_ref().and_then(|o| o.metadata.uid.clone()),
                previous: existing
                    .as_ref()
                    .map(|o| Previous::of(&o.spec, o.status.as_ref()))
                    .unwrap_or_default(),
            });
        }
        Ok(())
    }

    /// One report: the object, then its status.
    async fn report(
        &mut self,
        served: &impl Served,
        readiness: &Readiness,
    ) -> Result<(), ApiError> {
        let spec = served.spec(&self.node_name);
        let (hash, gpus) = (spec.topology_hash.clone(), spec.gpu_count);
        self.refresh().await?;
        let known = self.known.as_mut().expect("refreshed");
        let uid = self
            .api
            .apply(&gpunode(spec.clone(), &known.node_uid))
            .await?;
        if known.object_uid.as_ref().is_some_and(|old| *old != uid) {
            tracing::info!(gpunode = %self.node_name, "GpuNode recreated (it had been deleted)");
            // a Node deleted and registered again has a new uid: own the new one
            let node_uid = self.api.node_uid(&self.node_name).await?;
            if node_uid != known.node_uid {
                known.node_uid = node_uid;
                self.api.apply(&gpunode(spec, &known.node_uid)).await?;
            }
        }
        known.object_uid = Some(uid);
        let status = agent_status(
            &self.instance,
            (&self.pinning, &self.faults, &self.claims),
            &hash,
            readiness,
            self.standing.as_ref(),
            &known.previous,
        );
        self.api
            .apply_status(&self.node_name, &status, None)
            .await?;
        if known.previous.topology_hash.as_deref() != Some(hash.as_str()) {
            tracing::info!(gpunode = %self.node_name, topology_hash = %hash, gpus, "GpuNode reported with a new topology");
        } else if !self.reported_once {
            tracing::info!(gpunode = %self.node_name, "GpuNode reported");
        }
        self.reported_once = true;
        known.previous = status::reported(&hash, &status);
        Ok(())
    }

    /// The last report of a stopping agent: `Ready` False, in the status alone, and only while
    /// the status is still this agent's (read, then applied at the version read); whether it
    /// was sent. In a rollout the successor has reported by then, and this report would bring
    /// back the old profile's spec and say the node is not ready until the successor's next
    /// heartbeat.
    async fn farewell(&mut self, served: &impl Served) -> Result<bool, ApiError> {
        let Some(current) = self.api.get(&self.node_name).await? else {
            return Ok(false);
        };
        let status = current.status.as_ref();
        if status.and_then(|s| s.agent_instance.as_deref()) != Some(self.instance.as_str()) {
            return Ok(false);
        }
        let Some(version) = current.metadata.resource_version.as_deref() else {
            return Ok(false);
        };
        let previous = Previous::of(&current.spec, status);
        let hash = served.spec(&self.node_name).topology_hash;
        let status = agent_status(
            &self.instance,
            (&self.pinning, &self.faults, &self.claims),
            &hash,
            &status::stopped(),
            self.standing.as_ref(),
            &previous,
        );
        self.api
            .apply_status(&self.node_name, &status, Some(version))
            .await
    }
}

/// Reports `served`'s GpuNode through `api` until `stop` completes, then reports `Ready` False
/// (if it has reported at all). `served` is `None` until the GPUs are served; `pinning` is
/// `None` without an NRI plugin, `standing` without a device plugin, `faults` in real mode,
/// `claims` without a DRA driver.
pub async fn run<A: GpuNodes, S: Served>(
    api: A,
    config: &Config,
    mut served: watch::Receiver<Option<S>>,
    (mut pinning, mut faults, mut claims): Inputs,
    mut standing: Option<watch::Receiver<Standing>>,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut reporter = Reporter {
        api,
        node_name: config.node_name.clone(),
        instance: format!("{:016x}", random_u64()),
        pinning: PinningMap::default(),
        standing: standing.as_mut().map(|s| s.borrow_and_update().clone()),
        faults: faults
            .as_mut()
            .map(|f| f.borrow_and_update().clone())
            .unwrap_or_default(),
        claims: claims
            .as_mut()
            .map(|c| c.borrow_and_update().clone())
            .unwrap_or_default(),
        known: None,
        reported_once: false,
    };
    let mut served_open = true;
    let mut failures = 0u32;
    let mut next = Instant::now();
    loop {
        let current = served.borrow_and_update().clone();
        let due = tokio::select! {
            _ = &mut stop => break,
            changed = served.changed(), if served_open => {
                if changed.is_err() {
                    served_open = false;
                } else if failures == 0 {
                    next = next.min(Instant::now() + DEBOUNCE);
                }
                None
            }
            event = async { pinning.as_mut().expect("guarded").recv().await }, if pinning.is_some() => {
                match event {
                    Some(event) => {
                        if reporter.pinning.apply(&event, &Time(Timestamp::now())) && failures == 0 {
                            next = next.min(Instant::now() + DEBOUNCE);
                        }
                    }
                    None => pinning = None,
                }
                None
            }
            changed = async { standing.as_mut().expect("guarded").changed().await }, if standing.is_some() => {
                match changed {
                    Ok(()) => {
                        reporter.standing = standing.as_mut().map(|s| s.borrow_and_update().clone());
                        if failures == 0 {
                            next = next.min(Instant::now() + DEBOUNCE);
                        }
                    }
                    // the device plugin ended: what it said last stays
                    Err(_) => standing = None,
                }
                None
            }
            value = next_value(&mut faults), if faults.is_some() => {
                if let Some(value) = value {
                    reporter.faults = value;
                    if failures == 0 {
                        next = next.min(Instant::now() + DEBOUNCE);
                    }
                }
                None
            }
            value = next_value(&mut claims), if claims.is_some() => {
                if let Some(value) = value {
                    reporter.claims = value;
                    if failures == 0 {
                        next = next.min(Instant::now() + DEBOUNCE);
                    }
                }
                None
            }
            _ = tokio::time::sleep_until(next), if current.is_some() => current,
        };
        let Some(served) = due else { continue };
        // a request that hangs does not hold up a stopping agent
        let readiness = served.readiness();
        let outcome = tokio::select! {
            _ = &mut stop => break,
            outcome = reporter.report(&served, &readiness) => outcome,
        };
        match outcome {
            Ok(()) => {
                failures = 0;
                next = Instant::now() + status::jittered(config.heartbeat, random_unit());
            }
            Err(error) => {
                failures += 1;
                reporter.known = None;
                let retry = status::backoff(failures);
                tracing::warn!(%error, retry_in = ?retry, failures, "cannot report the GpuNode; retrying");
                next = Instant::now() + retry;
            }
        }
    }
    let last = served.borrow().clone();
    if let (Some(served), true) = (last, reporter.reported_once) {
        match tokio::time::timeout(FAREWELL, reporter.farewell(&served)).await {
            Ok(Ok(true)) => tracing::info!("GpuNode reported not Ready: the agent stops"),
            Ok(Ok(false)) => {
                tracing::info!(
                    "another agent reports the GpuNode now (a rollout's successor): no last report"
                );
            }
            Ok(Err(error)) => tracing::warn!(%error, "cannot report the GpuNode not Ready"),
            Err(_) => tracing::warn!("the API server did not answer the last report in time"),
        }
    }
}

/// The next value of `rx` once it changes; `None` (and `rx` dropped) when its sender is gone.
async fn next_value<T: Clone>(rx: &mut Option<watch::Receiver<T>>) -> Option<T> {
    let changed = rx.as_mut()?.changed().await;
    match changed {
        Ok(()) => rx.as_mut().map(|r| r.borrow_and_update().clone()),
        Err(_) => {
            *rx = None;
            None
        }
    }
}

/// What the reporter follows besides the served GPUs: the NRI plugin's pinning events, the
/// faults applied and the DRA driver's prepared claims.
pub type Inputs = (
    Option<mpsc::UnboundedReceiver<PinningEvent>>,
    Option<watch::Receiver<FaultReport>>,
    Option<watch::Receiver<Vec<PreparedClaim>>>,
);

/// Starts the reporter for `served` with the API server of `config`.
pub fn start<S: Served>(
    config: Config,
    served: watch::Receiver<Option<S>>,
    inputs: Inputs,
    standing: Option<watch::Receiver<Standing>>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tracing::info!(node = %config.node_name, heartbeat = ?config.heartbeat, credentials = ?config.credentials, "reporting the GpuNode");
    tokio::spawn(async move {
        let api = Live::new(config.credentials.clone());
        run(api, &config, served, inputs, standing, stop).await;
    })
}

#[cfg(test)]
mod tests;
