//! ComputeDomains (NVIDIA's `resource.nvidia.com/v1beta1`): for each, a finalizer, the
//! ResourceClaimTemplate of its channel claims, and its status: the nodes on which the agents' DRA
//! drivers prepared a claim of its channels, as their GpuNodes list them ([`Members`]). Unlike
//! NVIDIA's controller it runs no IMEX daemons: a node joins a domain when a channel claim of it
//! is prepared there, and is ready while its agent is.
//!
//! On where the cluster serves the CRD and `resource.k8s.io/v1` ([`served`]); the GpuNodes come
//! from the other controllers' watch and cache.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClaimConfiguration, DeviceRequest, ExactDeviceRequest,
    OpaqueDeviceConfiguration, ResourceClaimSpec, ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{ListParams, ObjectMeta, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use mockgpu_api::dra::{
    CHANNEL_CLASS, CHANNEL_DRIVER, ChannelConfig, ComputeDomain, ComputeDomainNode,
    ComputeDomainStatus, DOMAIN_LABEL, FINALIZER, NOT_READY, READY,
};
use mockgpu_api::gpunode::CONTROLLER_MANAGER;
use serde_json::json;
use tracing::{info, warn};

use crate::common::{ReconcileError, Synced, controller_config, log_result, retry, touched};
use crate::metrics::Metrics;
use crate::slim::SlimGpuNode;
use crate::write::{Events, WriteError, kube_err};

/// The label that marks a domain's template as its workloads' (NVIDIA's controller labels its
/// IMEX daemons' `Daemon`).
pub const TARGET_LABEL: &str = "resource.nvidia.com/computeDomainTarget";
/// The template's one request.
const CHANNEL_REQUEST: &str = "channel";
/// How often a deleted domain looks again for nodes that still hold its channels.
const DELETION_RECHECK: Duration = Duration::from_secs(5);

/// Whether the cluster serves what ComputeDomains need, their CRD and `resource.k8s.io/v1`
/// (Kubernetes 1.34), and lets the controller list both; when not, says why, once.
pub async fn served(client: &Client) -> bool {
    let lp = ListParams::default().limit(1);
    let domains = Api::<ComputeDomain>::all(client.clone());
    if !usable("the ComputeDomain CRD", domains.list_metadata(&lp).await) {
        return false;
    }
    let templates = Api::<ResourceClaimTemplate>::all(client.clone());
    usable(
        "resource.k8s.io/v1 ResourceClaimTemplates",
        templates.list_metadata(&lp).await,
    )
}

/// Whether a list of `what` came back, or failed otherwise than with 404 or 403 (the watches
/// retry those failures).
fn usable<T>(what: &str, listed: Result<T, kube::Error>) -> bool {
    match listed {
        Ok(_) => true,
        Err(kube::Error::Api(s)) if s.code == 404 => {
            info!("{what} is not served: ComputeDomains are left alone");
            false
        }
        Err(kube::Error::Api(s)) if s.code == 403 => {
            warn!("listing {what} is forbidden (RBAC): ComputeDomains are left alone");
            false
        }
        Err(err) => {
            warn!(%err, "cannot list {what}; keeping ComputeDomains all the same");
            true
        }
    }
}

/// Who is in which ComputeDomain: the domains (UIDs) each GpuNode lists claims of, kept from the
/// GpuNode watch beside its store, and the domains each change concerns, sent to the controller.
/// Clones share it.
#[derive(Clone)]
pub struct Members {
    gpunodes: Store<SlimGpuNode>,
    /// Node name → its domains; only nodes in one.
    domains: Arc<RwLock<HashMap<String, Vec<String>>>>,
    changed: mpsc::UnboundedSender<String>,
}

impl Members {
    /// The members among the GpuNodes of `gpunodes`, and the stream of domains whose members
    /// changed.
    pub fn new(gpunodes: Store<SlimGpuNode>) -> (Self, mpsc::UnboundedReceiver<String>) {
        let (changed, rx) = mpsc::unbounded();
        let members = Self {
            gpunodes,
            domains: Arc::default(),
            changed,
        };
        (members, rx)
    }

    /// Takes in a GpuNode watch event, once the store has, and sends the domains it concerns:
    /// those the node was in and is in (a member's readiness and clique change with it); at the
    /// end of a list, every domain before and after it.
    pub fn apply(&self, e: &watcher::Event<SlimGpuNode>) {
        let mut touched = BTreeSet::new();
        {
            // a poisoned lock's map is still whole: every change is one map operation
            let mut domains = self.domains.write().unwrap_or_else(|p| p.into_inner());
            match e {
                watcher::Event::Apply(g) => {
                    let now = domains_of(g).to_vec();
                    touched.extend(now.iter().cloned());
                    let old = if now.is_empty() {
                        domains.remove(&g.name_any())
                    } else {
                        domains.insert(g.name_any(), now)
                    };
                    touched.extend(old.into_iter().flatten());
                }
                watcher::Event::Delete(g) => {
                    touched.extend(domains.remove(&g.name_any()).into_iter().flatten());
                }
                watcher::Event::InitDone => {
                    touched.extend(domains.drain().flat_map(|(_, d)| d));
                    for g in self.gpunodes.state() {
                        let now = domains_of(&g).to_vec();
                        if !now.is_empty() {
                            touched.extend(now.iter().cloned());
                            domains.insert(g.name_any(), now);
                        }
                    }
                }
                watcher::Event::Init | watcher::Event::InitApply(_) => {}
            }
        }
        for uid in touched {
            let _ = self.changed.unbounded_send(uid);
        }
    }

    /// The GpuNodes that list a claim of domain `uid`, by name.
    pub fn of(&self, uid: &str) -> Vec<Arc<SlimGpuNode>> {
        let domains = self.domains.read().unwrap_or_else(|p| p.into_inner());
        let mut names: Vec<&String> = domains
            .iter()
            .filter(|(_, d)| d.iter().any(|d| d == uid))
            .map(|(name, _)| name)
            .collect();
        names.sort_unstable();
        names
            .into_iter()
            .filter_map(|name| self.gpunodes.get(&ObjectRef::new(name)))
            .filter(|g| domains_of(g).iter().any(|d| d == uid))
            .collect()
    }
}

/// The domains GpuNode `g` lists claims of.
fn domains_of(g: &SlimGpuNode) -> &[String] {
    match &g.status {
        Some(s) => &s.domains,
        None => &[],
    }
}

/// The ResourceClaimTemplate of domain `cd`'s channel claims, as NVIDIA's controller makes it:
/// one request `channel` of the channel DeviceClass, configured with the domain's UID and
/// allocation mode; labelled with that UID and owned by the domain (`owner`, its controller
/// reference), so that it goes with it.
pub fn template(cd: &ComputeDomain, owner: OwnerReference) -> ResourceClaimTemplate {
    let config = ChannelConfig::new(&owner.uid, cd.spec.channel.allocation_mode);
    let parameters = serde_json::to_value(config).expect("a ChannelConfig is JSON");
    ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(cd.spec.channel.resource_claim_template.name.clone()),
            namespace: cd.namespace(),
            labels: Some(BTreeMap::from([
                (DOMAIN_LABEL.to_string(), owner.uid.clone()),
                (TARGET_LABEL.to_string(), "Workload".to_string()),
            ])),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: ResourceClaimTemplateSpec {
            metadata: None,
            spec: ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: CHANNEL_REQUEST.into(),
                        exactly: Some(ExactDeviceRequest {
                            device_class_name: CHANNEL_CLASS.into(),
                            ..ExactDeviceRequest::default()
                        }),
                        ..DeviceRequest::default()
                    }]),
                    config: Some(vec![DeviceClaimConfiguration {
                        requests: Some(vec![CHANNEL_REQUEST.into()]),
                        opaque: Some(OpaqueDeviceConfiguration {
                            driver: CHANNEL_DRIVER.into(),
                            parameters: RawExtension(parameters),
                        }),
                    }]),
                    ..DeviceClaim::default()
                }),
            },
        },
    }
}

/// The status of a domain that needs `num_nodes` nodes and whose members are `members` (the
/// GpuNodes listing a claim of it, in any order), the nodes' addresses in `ips`: each node
/// indexed in name order, with its clique `<fabric cluster UUID>.<clique id>` (empty off a
/// fabric), `Ready` while its agent's Ready condition is True. The domain is `Ready` once it has
/// at least `num_nodes` nodes and all are ready: with `numNodes: 0` and no nodes yet too, as
/// NVIDIA's controller has it.
pub fn status(
    num_nodes: u32,
    members: &[Arc<SlimGpuNode>],
    ips: &HashMap<String, String>,
) -> ComputeDomainStatus {
    let mut members: Vec<&SlimGpuNode> = members.iter().map(|g| &**g).collect();
    members.sort_unstable_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let nodes: Vec<ComputeDomainNode> = members
        .into_iter()
        .enumerate()
        .map(|(index, g)| {
            let name = g.name_any();
            let ready = g.status.as_ref().is_some_and(|s| s.ready);
            ComputeDomainNode {
                ip_address: ips.get(&name).cloned().unwrap_or_default(),
                name,
                clique_id: g.spec.clique.as_deref().unwrap_or_default().into(),
                index: i32::try_from(index).unwrap_or(i32::MAX),
                status: readiness(ready).into(),
            }
        })
        .collect();
    let ready = nodes.len() >= num_nodes as usize && nodes.iter().all(|n| n.status == READY);
    ComputeDomainStatus {
        status: readiness(ready).into(),
        nodes,
    }
}

fn readiness(ready: bool) -> &'static str {
    if ready { READY } else { NOT_READY }
}

/// The Event of a domain of `num_nodes` whose status goes from `old` (`None`: none yet, not
/// ready) to `new`, as (type, reason, note); `None` while its readiness stays.
fn transition(
    old: Option<&ComputeDomainStatus>,
    new: &ComputeDomainStatus,
    num_nodes: u32,
) -> Option<(EventType, &'static str, String)> {
    let was = old.is_some_and(|s| s.status == READY);
    let is = new.status == READY;
    if was == is {
        return None;
    }
    let ready = new.nodes.iter().filter(|n| n.status == READY).count();
    let note = format!(
        "{ready} of {} nodes ready, {num_nodes} needed",
        new.nodes.len()
    );
    Some(if is {
        (EventType::Normal, "ComputeDomainReady", note)
    } else {
        (EventType::Warning, "ComputeDomainNotReady", note)
    })
}

/// `cd`'s finalizers, with ours or without it.
fn finalizers(cd: &ComputeDomain, ours: bool) -> Vec<String> {
    let others = cd.finalizers().iter().filter(|f| *f != FINALIZER).cloned();
    others.chain(ours.then(|| FINALIZER.to_string())).collect()
}

/// A Node's InternalIP (empty: it has none).
fn internal_ip(node: &Node) -> String {
    let addresses = node
        .status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten());
    addresses
        .filter(|a| a.type_ == "InternalIP")
        .map(|a| a.address.clone())
        .next()
        .unwrap_or_default()
}

/// What the ComputeDomain reconciles share.
struct Domains {
    client: Client,
    events: Events,
    metrics: Metrics,
    members: Members,
    /// The templates labelled with a domain (metadata only).
    templates: Store<PartialObjectMeta<ResourceClaimTemplate>>,
    /// The GpuNodes and the templates have had their first list.
    synced: Synced,
}

/// Runs the ComputeDomain controller until its watches end: a domain is reconciled when it or
/// its template changes, and when its members do (`changed`, from `members`), once the GpuNodes
/// (`gpunodes_listed`) and the templates are listed.
pub(crate) async fn run(
    client: Client,
    events: Events,
    metrics: Metrics,
    members: Members,
    changed: mpsc::UnboundedReceiver<String>,
    gpunodes_listed: Synced,
) {
    let (templates, writer) = reflector::store();
    let template_events = reflector::reflector(
        writer,
        watcher(
            Api::<PartialObjectMeta<ResourceClaimTemplate>>::all(client.clone()),
            watcher::Config::default().labels(DOMAIN_LABEL),
        ),
    );
    let synced = Synced::all(vec![gpunodes_listed, Synced::of(templates.clone())]);
    let controller = Controller::new(
        Api::<ComputeDomain>::all(client.clone()),
        watcher::Config::default(),
    );
    let domains = controller.store();
    let members_changed = changed.filter_map(move |uid| {
        let cd = domains.find(|cd| cd.metadata.uid.as_deref() == Some(uid.as_str()));
        futures::future::ready(cd.map(|cd| ObjectRef::from_obj(&*cd)))
    });
    let ctx = Arc::new(Domains {
        client,
        events,
        metrics,
        members,
        templates,
        synced,
    });
    controller
        .owns_stream(touched(template_events))
        .reconcile_on(members_changed)
        .with_config(controller_config())
        .run(reconcile, retry, ctx)
        .for_each(|r| async move { log_result("ComputeDomain", r) })
        .await;
}

/// Domain `cd` deleted: our finalizer goes once no node holds its channels. Otherwise: our
/// finalizer, its template, its status, each written only if not in place.
async fn reconcile(cd: Arc<ComputeDomain>, ctx: Arc<Domains>) -> Result<Action, ReconcileError> {
    ctx.synced.wait().await?;
    // the API server's objects have a UID
    let Some(owner) = cd.controller_owner_ref(&()) else {
        return Ok(Action::await_change());
    };
    let members = ctx.members.of(&owner.uid);
    let finalized = cd.finalizers().iter().any(|f| f == FINALIZER);
    if cd.metadata.deletion_timestamp.is_some() {
        if !finalized {
            return Ok(Action::await_change());
        }
        if members.is_empty() {
            ctx.set_finalizers(&cd, finalizers(&cd, false)).await?;
            return Ok(Action::await_change());
        }
        let names: Vec<String> = members.iter().map(|g| g.name_any()).collect();
        let note = format!(
            "nodes {} still hold its channels: it goes once their claims are released",
            names.join(", ")
        );
        let regarding = cd.object_ref(&());
        ctx.events
            .publish(&regarding, EventType::Normal, "WaitingForChannels", note)
            .await;
        return Ok(Action::requeue(DELETION_RECHECK));
    }
    if !finalized {
        ctx.set_finalizers(&cd, finalizers(&cd, true)).await?;
    }
    if !ctx.has_template(&cd, &owner.uid) {
        ctx.apply_template(&template(&cd, owner)).await?;
    }
    let ips = ctx.addresses(&cd, &members).await?;
    let status = status(cd.spec.num_nodes, &members, &ips);
    if cd.status.as_ref() != Some(&status) {
        ctx.apply_status(&cd, &status).await?;
        if let Some((type_, reason, note)) =
            transition(cd.status.as_ref(), &status, cd.spec.num_nodes)
        {
            ctx.events
                .publish(&cd.object_ref(&()), type_, reason, note)
                .await;
        }
    }
    Ok(Action::await_change())
}

impl Domains {
    /// Whether `cd`'s template (domain `uid`'s) is in place, as the cache has it.
    fn has_template(&self, cd: &ComputeDomain, uid: &str) -> bool {
        let key = ObjectRef::new(&cd.spec.channel.resource_claim_template.name)
            .within(&cd.namespace().unwrap_or_default());
        self.templates
            .get(&key)
            .is_some_and(|t| t.labels().get(DOMAIN_LABEL).is_some_and(|l| l == uid))
    }

    /// The addresses of `members`, by node: as `cd`'s status lists them, else (and when empty
    /// there) their Node's InternalIP, read (empty: none, or no Node).
    async fn addresses(
        &self,
        cd: &ComputeDomain,
        members: &[Arc<SlimGpuNode>],
    ) -> Result<HashMap<String, String>, WriteError> {
        let listed = cd.status.iter().flat_map(|s| &s.nodes);
        let known: HashMap<&str, &str> = listed
            .filter(|n| !n.ip_address.is_empty())
            .map(|n| (n.name.as_str(), n.ip_address.as_str()))
            .collect();
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut ips = HashMap::new();
        for g in members {
            let name = g.name_any();
            let ip = match known.get(name.as_str()) {
                Some(ip) => ip.to_string(),
                None => nodes
                    .get_opt(&name)
                    .await
                    .map_err(kube_err(format!("reading node {name}")))?
                    .as_ref()
                    .map(internal_ip)
                    .unwrap_or_default(),
            };
            ips.insert(name, ip);
        }
        Ok(ips)
    }

    /// Sets `cd`'s finalizers to `list` (a merge patch, on the resource version cached: a
    /// conflict fails it, to be tried again).
    async fn set_finalizers(
        &self,
        cd: &ComputeDomain,
        list: Vec<String>,
    ) -> Result<(), WriteError> {
        let (name, ns) = (cd.name_any(), cd.namespace().unwrap_or_default());
        let patch = json!({
            "metadata": {"resourceVersion": cd.resource_version(), "finalizers": &list},
        });
        let params = PatchParams {
            field_manager: Some(CONTROLLER_MANAGER.into()),
            ..PatchParams::default()
        };
        Api::<ComputeDomain>::namespaced(self.client.clone(), &ns)
            .patch(&name, &params, &Patch::Merge(&patch))
            .await
            .map_err(kube_err(format!(
                "setting the finalizers of ComputeDomain {ns}/{name}"
            )))?;
        self.metrics.wrote("compute_domain_finalizer");
        info!(domain = %format!("{ns}/{name}"), finalizers = ?list, "ComputeDomain finalizers set");
        Ok(())
    }

    /// Applies template `t` (server-side, forced).
    async fn apply_template(&self, t: &ResourceClaimTemplate) -> Result<(), WriteError> {
        let (name, ns) = (t.name_any(), t.namespace().unwrap_or_default());
        Api::<ResourceClaimTemplate>::namespaced(self.client.clone(), &ns)
            .patch(
                &name,
                &PatchParams::apply(CONTROLLER_MANAGER).force(),
                &Patch::Apply(t),
            )
            .await
            .map_err(kube_err(format!(
                "applying ResourceClaimTemplate {ns}/{name}"
            )))?;
        self.metrics.wrote("resource_claim_template");
        info!(template = %format!("{ns}/{name}"), "ResourceClaimTemplate applied");
        Ok(())
    }

    /// Applies `status` to `cd` (server-side, forced, on the status subresource).
    async fn apply_status(
        &self,
        cd: &ComputeDomain,
        status: &ComputeDomainStatus,
    ) -> Result<(), WriteError> {
        let (name, ns) = (cd.name_any(), cd.namespace().unwrap_or_default());
        let patch = json!({
            "apiVersion": ComputeDomain::api_version(&()),
            "kind": ComputeDomain::kind(&()),
            "metadata": {"name": name, "namespace": ns},
            "status": status,
        });
        Api::<ComputeDomain>::namespaced(self.client.clone(), &ns)
            .patch_status(
                &name,
                &PatchParams::apply(CONTROLLER_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(kube_err(format!(
                "applying the status of ComputeDomain {ns}/{name}"
            )))?;
        self.metrics.wrote("compute_domain_status");
        info!(domain = %format!("{ns}/{name}"), status = %status.status,
            nodes = status.nodes.len(), "ComputeDomain status applied");
        Ok(())
    }
}

#[cfg(test)]
mod tests;
