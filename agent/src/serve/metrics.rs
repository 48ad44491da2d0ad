//! The agent's `mockgpu_*` metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::{counter::ConstCounter, gauge::ConstGauge};

use super::state::AgentState;
use crate::fuse::TreeHandle;

/// The agent's `mockgpu_*` metrics, read from its state at each scrape.
pub(super) struct AgentMetrics(pub(super) Arc<AgentState>);

impl std::fmt::Debug for AgentMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentMetrics")
    }
}

impl Collector for AgentMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let state = &self.0;
        let relaxed = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let gauges = [
            ("mockgpu_gpus", "Mock GPUs served", state.gpu_count() as u64),
            (
                "mockgpu_real_gpus",
                "Real GPUs found (report-only mode)",
                relaxed(&state.real_gpus),
            ),
            (
                "mockgpu_mounted",
                "Whether the FUSE tree is mounted",
                u64::from(state.mounted.load(Ordering::Relaxed)),
            ),
            (
                "mockgpu_mount_duration_milliseconds",
                "Time from start to mounted",
                relaxed(&state.mount_ms),
            ),
            (
                "mockgpu_faults",
                "GPU faults applied (local and GpuFault objects)",
                state.faults.borrow().faults.len() as u64,
            ),
            (
                "mockgpu_unhealthy_gpus",
                "GPUs the faults leave unhealthy",
                u64::from(state.faults.borrow().unhealthy_gpus()),
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let reads = state
            .handle
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, TreeHandle::reads);
        let counters = [
            (
                "mockgpu_profile_reloads",
                "Profile changes applied",
                relaxed(&state.reloads),
            ),
            (
                "mockgpu_profile_reload_errors",
                "Profile changes rejected",
                relaxed(&state.reload_errors),
            ),
            (
                "mockgpu_fault_errors",
                "GPU fault entries refused (invalid, or naming what the node lacks)",
                relaxed(&state.fault_errors),
            ),
            (
                "mockgpu_fuse_reads",
                "Reads that reached the agent (kernel cache misses)",
                reads,
            ),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;

    #[test]
    fn agent_metrics_are_named_and_counted() {
        let state = Arc::new(AgentState::default());
        state.reloads.store(2, Ordering::Relaxed);
        state.reload_errors.store(1, Ordering::Relaxed);
        state.mount_ms.store(42, Ordering::Relaxed);
        state.mounted.store(true, Ordering::Release);
        let mut registry = Registry::default();
        registry.register_collector(Box::new(AgentMetrics(state)));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        for line in [
            "# TYPE mockgpu_gpus gauge",
            "mockgpu_gpus 0",
            "mockgpu_real_gpus 0",
            "mockgpu_mounted 1",
            "mockgpu_mount_duration_milliseconds 42",
            "# TYPE mockgpu_profile_reloads counter",
            "mockgpu_profile_reloads_total 2",
            "mockgpu_profile_reload_errors_total 1",
            "mockgpu_fuse_reads_total 0",
        ] {
            assert!(out.lines().any(|l| l == line), "{line:?} missing in\n{out}");
        }
        assert!(out.ends_with("\n# EOF\n"), "{out}");
    }
}
