//! The controller's metrics (`/metrics`, OpenMetrics through prometheus-client).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of the remediation counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    /// `delete_slurm_node`, `delete_pod`, `drain_slurm_node` or `resume_slurm_node`.
    pub action: &'static str,
    /// `ok` or `error`.
    pub result: &'static str,
}

/// Labels of the API-writes counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `node_labels`, `node_condition`, `gpunode_conditions`, `event`, and of ComputeDomains
    /// `compute_domain_finalizer`, `resource_claim_template` or `compute_domain_status`.
    pub kind: &'static str,
}

/// (GPUs, held GPUs) of each GpuNode seen by the leader, and their sums.
#[derive(Default)]
struct Fleet {
    nodes: HashMap<String, (u32, u32)>,
    gpus: i64,
    held: i64,
}

/// The controller's metrics; clones share them.
#[derive(Clone)]
pub struct Metrics {
    nodes: Gauge,
    gpus: Gauge,
    held: Gauge,
    fleet: Arc<Mutex<Fleet>>,
    /// 1 while this replica leads.
    pub leader: Gauge,
    /// GpuNodes that became Drifted.
    pub drifts: Counter,
    /// Remediation actions.
    pub remediation: Family<ActionLabels, Counter>,
    /// Reconcile latency.
    pub reconcile_seconds: Histogram,
    /// Writes to the API server, by kind (none while the cluster is as the controller wants it).
    pub writes: Family<WriteLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            nodes: Gauge::default(),
            gpus: Gauge::default(),
            held: Gauge::default(),
            fleet: Arc::default(),
            leader: Gauge::default(),
            drifts: Counter::default(),
            remediation: Family::default(),
            // 0.5 ms .. ~16 s
            reconcile_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            writes: Family::default(),
        }
    }
}

impl Metrics {
    /// Registers every metric under `mockgpu_controller_`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("mockgpu_controller");
        r.register(
            "gpunodes",
            "GpuNodes known to the leader",
            self.nodes.clone(),
        );
        r.register("gpus", "GPUs of those GpuNodes", self.gpus.clone());
        r.register(
            "held_gpus",
            "GPUs held by containers on those GpuNodes",
            self.held.clone(),
        );
        r.register(
            "leader",
            "1 while this replica holds the lease",
            self.leader.clone(),
        );
        r.register(
            "drifts",
            "GpuNodes that became Drifted",
            self.drifts.clone(),
        );
        r.register(
            "remediation_actions",
            "Remediation actions taken, by action and result",
            self.remediation.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Time to reconcile one GpuNode",
            self.reconcile_seconds.clone(),
        );
        r.register(
            "api_writes",
            "Writes to the API server (node labels, GpuNode conditions, ComputeDomains, events)",
            self.writes.clone(),
        );
    }

    /// Counts one write of `kind`.
    pub fn wrote(&self, kind: &'static str) {
        self.writes.get_or_create(&WriteLabels { kind }).inc();
    }

    /// Records GpuNode `name` with its GPU counts (`None`: it is gone).
    pub fn node(&self, name: &str, counts: Option<(u32, u32)>) {
        let mut fleet = self.fleet.lock().unwrap_or_else(|p| p.into_inner());
        let old = match counts {
            Some(c) if fleet.nodes.get(name) == Some(&c) => return,
            Some(c) => fleet.nodes.insert(name.to_string(), c),
            None => fleet.nodes.remove(name),
        };
        let (new_gpus, new_held) = counts.unwrap_or_default();
        let (old_gpus, old_held) = old.unwrap_or_default();
        fleet.gpus += i64::from(new_gpus) - i64::from(old_gpus);
        fleet.held += i64::from(new_held) - i64::from(old_held);
        self.publish(&fleet);
    }

    /// Forgets every GpuNode (this replica stopped leading).
    pub fn clear(&self) {
        let mut fleet = self.fleet.lock().unwrap_or_else(|p| p.into_inner());
        *fleet = Fleet::default();
        self.publish(&fleet);
    }

    fn publish(&self, fleet: &Fleet) {
        self.nodes
            .set(i64::try_from(fleet.nodes.len()).unwrap_or(i64::MAX));
        self.gpus.set(fleet.gpus);
        self.held.set(fleet.held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_gauges_follow_the_nodes() {
        let m = Metrics::default();
        let mut registry = Registry::default();
        m.register(&mut registry);
        m.node("a", Some((4, 2)));
        m.node("b", Some((8, 0)));
        m.node("a", Some((4, 3)));
        assert_eq!((m.nodes.get(), m.gpus.get(), m.held.get()), (2, 12, 3));
        m.node("b", None);
        assert_eq!((m.nodes.get(), m.gpus.get(), m.held.get()), (1, 4, 3));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(out.contains("mockgpu_controller_gpus 4"), "{out}");
        m.node("c", None);
        assert_eq!((m.nodes.get(), m.gpus.get(), m.held.get()), (1, 4, 3));
        m.wrote("event");
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(
            out.contains("mockgpu_controller_api_writes_total{kind=\"event\"} 1"),
            "{out}"
        );
        m.clear();
        assert_eq!((m.nodes.get(), m.gpus.get(), m.held.get()), (0, 0, 0));
    }
}
