//! The GpuFault watcher of `serve` (with an API server, like the GpuNode reporter): watches
//! every GpuFault object, keeps those whose `spec.nodeName` is this node (filtered here, on the
//! client), hands them to the reload loop, which applies them with the local faults, and writes
//! each object's `Applied` condition (server-side apply of the status subresource, field
//! manager `mockgpu-agent`) from the reload loop's verdicts. The pure parts are in
//! [`crate::faults`].

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use mockgpu_api::GpuFault;
use mockgpu_api::fault::condition;
use mockgpu_api::gpunode::AGENT_MANAGER;
use tokio::sync::watch;

use crate::faults::{self, ClusterFault, ClusterFaults, Verdicts, applied_condition};
use crate::report::Credentials;

/// How often status writes that failed are tried again.
const RETRY: Duration = Duration::from_secs(30);

/// Watches the GpuFaults of `node` until `stop` completes: publishes them on `cluster`, and
/// writes the `Applied` condition of each as `verdicts` say.
pub async fn run(
    credentials: Credentials,
    node: String,
    cluster: watch::Sender<ClusterFaults>,
    mut verdicts: watch::Receiver<Verdicts>,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    let Some(client) = credentials
        .client_until("watching GpuFaults", RETRY, stop.as_mut())
        .await
    else {
        return;
    };
    let api: Api<GpuFault> = Api::all(client);
    let mut events = watcher::watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut objects: BTreeMap<String, GpuFault> = BTreeMap::new();
    let mut initial: Option<BTreeMap<String, GpuFault>> = None;
    // the condition last written per object
    let mut written: BTreeMap<String, Condition> = BTreeMap::new();
    let mut retry = tokio::time::interval(RETRY);
    tracing::info!(%node, "watching GpuFaults");
    loop {
        tokio::select! {
            _ = &mut stop => return,
            event = events.next() => {
                match event {
                    Some(Ok(event)) => apply_event(&node, event, &mut objects, &mut initial),
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "watching GpuFaults failed; retrying");
                        continue;
                    }
                    None => return,
                }
                let kept = keep(&objects);
                cluster.send_if_modified(|current| {
                    let changed = *current != kept;
                    *current = kept;
                    changed
                });
                written.retain(|name, _| objects.contains_key(name));
            }
            changed = verdicts.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = retry.tick() => {}
        }
        let wanted = verdicts.borrow_and_update().clone();
        write_statuses(&api, &objects, &wanted, &mut written).await;
    }
}

/// Applies one watch event to `objects` (those of `node`); `initial` collects a relist.
fn apply_event(
    node: &str,
    event: Event<GpuFault>,
    objects: &mut BTreeMap<String, GpuFault>,
    initial: &mut Option<BTreeMap<String, GpuFault>>,
) {
    let name = |o: &GpuFault| o.metadata.name.clone().unwrap_or_default();
    match event {
        Event::Init => *initial = Some(BTreeMap::new()),
        Event::InitApply(o) => {
            if faults::for_node(&o.spec, node) {
                initial
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name(&o), o);
            }
        }
        Event::InitDone => *objects = initial.take().unwrap_or_default(),
        Event::Apply(o) => {
            if faults::for_node(&o.spec, node) {
                objects.insert(name(&o), o);
            } else {
                // its node changed
                objects.remove(&name(&o));
            }
        }
        Event::Delete(o) => {
            objects.remove(&name(&o));
        }
    }
}

/// What the reload loop needs of `objects`.
pub(crate) fn keep(objects: &BTreeMap<String, GpuFault>) -> ClusterFaults {
    objects
        .iter()
        .map(|(n, o)| {
            let fault = ClusterFault {
                generation: o.metadata.generation,
                spec: o.spec.clone(),
            };
            (n.clone(), fault)
        })
        .collect()
}

/// The `Applied` condition to write on `object` for `verdict`, or `None` when the object
/// already says so (or the verdict is for another generation of it).
pub(crate) fn wanted_condition(
    object: &GpuFault,
    verdict: &(Option<i64>, faults::Verdict),
    now: &Time,
) -> Option<Condition> {
    if verdict.0 != object.metadata.generation {
        return None;
    }
    let current = object
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == condition::APPLIED));
    let wanted = applied_condition(&verdict.1, verdict.0, current, now);
    let same = current.is_some_and(|c| {
        (&c.status, &c.reason, &c.message, c.observed_generation)
            == (
                &wanted.status,
                &wanted.reason,
                &wanted.message,
                wanted.observed_generation,
            )
    });
    (!same).then_some(wanted)
}

/// Writes the `Applied` condition of each object whose verdict it does not show yet.
async fn write_statuses(
    api: &Api<GpuFault>,
    objects: &BTreeMap<String, GpuFault>,
    verdicts: &Verdicts,
    written: &mut BTreeMap<String, Condition>,
) {
    let now = Time(Timestamp::now());
    for (name, verdict) in verdicts {
        let Some(object) = objects.get(name) else {
            continue;
        };
        let Some(wanted) = wanted_condition(object, verdict, &now) else {
            continue;
        };
        if written.get(name).is_some_and(|c| {
            (&c.status, &c.message, c.observed_generation)
                == (&wanted.status, &wanted.message, wanted.observed_generation)
        }) {
            continue;
        }
        let body = serde_json::json!({
            "apiVersion": "mockgpu.io/v1alpha1",
            "kind": "GpuFault",
            "status": { "conditions": [wanted] },
        });
        let params = PatchParams::apply(AGENT_MANAGER).force();
        match api.patch_status(name, &params, &Patch::Apply(&body)).await {
            Ok(_) => {
                tracing::info!(gpufault = %name, status = %wanted.status, reason = %wanted.reason, message = %wanted.message, "GpuFault status written");
                written.insert(name.clone(), wanted);
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                tracing::warn!(gpufault = %name, error = %e, "cannot write the GpuFault's status; retrying");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::Verdict;
    use mockgpu_api::fault::GpuFaultStatus;
    use mockgpu_api::{Fault, FaultKind, GpuFaultSpec};

    fn object(name: &str, node: &str, generation: i64) -> GpuFault {
        let mut o = GpuFault::new(
            name,
            GpuFaultSpec {
                node_name: node.into(),
                fault: Fault::new(1, FaultKind::Thermal),
                expires: None,
            },
        );
        o.metadata.generation = Some(generation);
        o
    }

    #[test]
    fn only_this_nodes_objects_are_kept() {
        let mut objects = BTreeMap::new();
        let mut initial = None;
        apply_event("n", Event::Init, &mut objects, &mut initial);
        apply_event(
            "n",
            Event::InitApply(object("a", "n", 1)),
            &mut objects,
            &mut initial,
        );
        apply_event(
            "n",
            Event::InitApply(object("b", "m", 1)),
            &mut objects,
            &mut initial,
        );
        assert!(objects.is_empty(), "not before the list is done");
        apply_event("n", Event::InitDone, &mut objects, &mut initial);
        assert_eq!(objects.keys().collect::<Vec<_>>(), ["a"]);
        apply_event(
            "n",
            Event::Apply(object("c", "n", 1)),
            &mut objects,
            &mut initial,
        );
        apply_event(
            "n",
            Event::Apply(object("a", "m", 2)),
            &mut objects,
            &mut initial,
        );
        assert_eq!(
            objects.keys().collect::<Vec<_>>(),
            ["c"],
            "a moved to node m"
        );
        apply_event(
            "n",
            Event::Delete(object("c", "n", 1)),
            &mut objects,
            &mut initial,
        );
        assert!(keep(&objects).is_empty());
    }

    #[test]
    fn a_condition_is_written_once_per_verdict_and_generation() {
        let now = Time("2026-01-01T12:00:00Z".parse().unwrap());
        let mut o = object("a", "n", 2);
        assert!(
            wanted_condition(&o, &(Some(1), Verdict::Applied), &now).is_none(),
            "a verdict on an older generation"
        );
        let c = wanted_condition(&o, &(Some(2), Verdict::Applied), &now).unwrap();
        assert_eq!(
            (c.status.as_str(), c.observed_generation),
            ("True", Some(2))
        );
        o.status = Some(GpuFaultStatus {
            conditions: vec![c],
        });
        assert!(wanted_condition(&o, &(Some(2), Verdict::Applied), &now).is_none());
        let bad = Verdict::Invalid("GPU 9: the node has 4 GPUs (0 to 3)".into());
        let c = wanted_condition(&o, &(Some(2), bad), &now).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            ("False", "Invalid", "GPU 9: the node has 4 GPUs (0 to 3)")
        );
    }
}
