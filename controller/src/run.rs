//! `mockgpu-controller run`: the health endpoint, the leader election, and the controllers while
//! this replica leads.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use kube::core::Selector;
use kube::{Api, Client};
use mockgpu_health::{HealthServer, Probe, Registry};
use tokio::sync::watch;
use tracing::info;

use crate::lease::{Elector, Timing};
use crate::metrics::Metrics;
use crate::plan::Settings;
use crate::reconcile::controllers;
use crate::slurm::SlurmNodes;
use crate::write::recorder;

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The Lease's namespace.
    pub namespace: String,
    /// This replica's identity in the Lease (its pod name).
    pub identity: String,
    /// The Lease's name.
    pub lease_name: String,
    /// Election timing.
    pub timing: Timing,
    /// Label selector of slurmd pods.
    pub slurmd_selector: Selector,
    /// Health endpoint address.
    pub listen: SocketAddr,
    /// The decision's settings.
    pub settings: Settings,
    /// Keep ComputeDomains (where the cluster serves them).
    pub compute_domains: bool,
}

/// Errors that end `run`.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The health endpoint could not start.
    #[error(transparent)]
    Health(#[from] mockgpu_health::HealthError),
}

/// Readiness: ready once the lease has been looked at, as leader or standby.
struct Standing(watch::Receiver<Option<bool>>);

impl Probe for Standing {
    fn ready(&self) -> Result<(), String> {
        match *self.0.borrow() {
            Some(_) => Ok(()),
            None => Err("the leader election has not reached the API server yet".into()),
        }
    }
}

/// Runs until `shutdown` completes: stops acting, then releases the lease.
pub async fn run<S: SlurmNodes + 'static>(
    client: Client,
    cfg: Config,
    slurm: Option<S>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let metrics = Metrics::default();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let health = HealthServer::bind(cfg.listen).await?;
    info!(listen = %cfg.listen, identity = %cfg.identity, lease = %format!("{}/{}", cfg.namespace, cfg.lease_name), "controller starting");
    let (leading_tx, mut leading) = watch::channel(None);
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let health_task = tokio::spawn(health.serve(
        Standing(leading.clone()),
        registry,
        stopped(stop_rx.clone()),
    ));
    let elector = Elector::new(
        Api::namespaced(client.clone(), &cfg.namespace),
        &cfg.lease_name,
        &cfg.identity,
        cfg.timing,
    );
    let election = tokio::spawn(elector.run(leading_tx, stopped(stop_rx)));
    let slurm = slurm.map(Arc::new);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            r = leading.wait_for(|l| *l == Some(true)) => if r.is_err() { break },
        }
        metrics.leader.set(1);
        info!("leading: controllers started");
        let acting = controllers(
            client.clone(),
            cfg.settings.clone(),
            slurm.clone(),
            recorder(client.clone(), &cfg.identity),
            metrics.clone(),
            cfg.slurmd_selector.clone(),
            cfg.compute_domains,
        );
        let stop = tokio::select! {
            () = &mut shutdown => true,
            _ = leading.wait_for(|l| *l != Some(true)) => false,
            () = acting => false,
        };
        metrics.leader.set(0);
        metrics.clear();
        info!("not leading: controllers stopped");
        if stop {
            break;
        }
    }
    // the controllers are stopped: now the lease may go
    let _ = stop_tx.send(true);
    let _ = election.await;
    let _ = health_task.await;
    info!("controller stopped");
    Ok(())
}
