//! Readiness and metrics of a running plugin: [`PluginStatus`] is a [`Probe`] and registers its
//! metrics in the process's [`Registry`].

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
    time::Duration,
};

use mockgpu_health::Probe;
use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

/// Runtime events the plugin counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    Configure,
    Synchronize,
    CreateContainer,
    StopContainer,
    RemoveContainer,
    RemovePodSandbox,
    StateChange,
    Shutdown,
}

impl EventKind {
    const ALL: [EventKind; 8] = [
        Self::Configure,
        Self::Synchronize,
        Self::CreateContainer,
        Self::StopContainer,
        Self::RemoveContainer,
        Self::RemovePodSandbox,
        Self::StateChange,
        Self::Shutdown,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Configure => "configure",
            Self::Synchronize => "synchronize",
            Self::CreateContainer => "create_container",
            Self::StopContainer => "stop_container",
            Self::RemoveContainer => "remove_container",
            Self::RemovePodSandbox => "remove_pod_sandbox",
            Self::StateChange => "state_change",
            Self::Shutdown => "shutdown",
        }
    }
}

/// Outcome of a CreateContainer that needed the mock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Injected,
    Refused,
    FailOpen,
}

/// CreateContainer latency buckets, seconds.
const LATENCY_BOUNDS: [f64; 10] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.1, 1.0,
];

/// A metric label set of one label.
type Label = [(&'static str, &'static str); 1];

#[derive(Debug)]
struct Inner {
    connected: AtomicBool,
    registered: AtomicBool,
    synchronized: AtomicBool,
    connected_gauge: Gauge,
    ready_gauge: Gauge,
    registrations: Counter,
    events: Family<Label, Counter>,
    injections: Counter,
    errors: Family<Label, Counter>,
    pinned: Gauge,
    create_latency: Histogram,
}

/// Readiness (`registered and synchronized`) and metrics of a plugin; cheap to clone.
#[derive(Debug, Clone)]
pub struct PluginStatus(Arc<Inner>);

impl Default for PluginStatus {
    fn default() -> Self {
        let inner = Inner {
            connected: AtomicBool::new(false),
            registered: AtomicBool::new(false),
            synchronized: AtomicBool::new(false),
            connected_gauge: Gauge::default(),
            ready_gauge: Gauge::default(),
            registrations: Counter::default(),
            events: Family::default(),
            injections: Counter::default(),
            errors: Family::default(),
            pinned: Gauge::default(),
            create_latency: Histogram::new(LATENCY_BOUNDS),
        };
        // Every series exists from the start, at 0.
        for kind in EventKind::ALL {
            let _ = inner.events.get_or_create(&[("event", kind.label())]);
        }
        for label in [Outcome::Refused, Outcome::FailOpen]
            .into_iter()
            .filter_map(Outcome::error_label)
        {
            let _ = inner.errors.get_or_create(&label);
        }
        Self(Arc::new(inner))
    }
}

impl Outcome {
    /// The `outcome` label of `mockgpu_nri_errors_total`; `None` for an injection.
    fn error_label(self) -> Option<Label> {
        match self {
            Self::Injected => None,
            Self::Refused => Some([("outcome", "refused")]),
            Self::FailOpen => Some([("outcome", "fail_open")]),
        }
    }
}

impl PluginStatus {
    /// Whether the plugin is registered and has completed Synchronize on its current connection.
    pub fn is_ready(&self) -> bool {
        self.0.registered.load(Relaxed) && self.0.synchronized.load(Relaxed)
    }

    /// How many times the plugin has registered with a runtime.
    pub fn registrations(&self) -> u64 {
        self.0.registrations.get()
    }

    /// Registers the plugin's metrics, named `mockgpu_nri_*`, in `registry` (once per registry).
    pub fn register(&self, registry: &mut Registry) {
        let s = &self.0;
        let r = registry.sub_registry_with_prefix("mockgpu_nri");
        let families = [
            ("events", "Runtime requests handled, by event", &s.events),
            (
                "errors",
                "GPU-holding containers not given the mock, by outcome",
                &s.errors,
            ),
        ];
        for (name, help, family) in families {
            r.register(name, help, family.clone());
        }
        let counters = [
            (
                "injections",
                "GPU-holding containers given the mock",
                &s.injections,
            ),
            (
                "registrations",
                "Registrations with a runtime",
                &s.registrations,
            ),
        ];
        for (name, help, counter) in counters {
            r.register(name, help, counter.clone());
        }
        let gauges = [
            (
                "connected",
                "1 while connected to the runtime",
                &s.connected_gauge,
            ),
            (
                "ready",
                "1 while registered and synchronized",
                &s.ready_gauge,
            ),
            (
                "pinned_containers",
                "Containers currently holding GPUs",
                &s.pinned,
            ),
        ];
        for (name, help, gauge) in gauges {
            r.register(name, help, gauge.clone());
        }
        r.register_with_unit(
            "create_container_duration",
            "Time to decide a CreateContainer adjustment",
            Unit::Seconds,
            s.create_latency.clone(),
        );
    }

    /// Mirrors the connection state into the gauges.
    fn publish_state(&self) {
        let s = &self.0;
        s.connected_gauge.set(i64::from(s.connected.load(Relaxed)));
        s.ready_gauge.set(i64::from(self.is_ready()));
    }

    pub(crate) fn set_connected(&self, connected: bool) {
        self.0.connected.store(connected, Relaxed);
        if !connected {
            self.0.registered.store(false, Relaxed);
            self.0.synchronized.store(false, Relaxed);
        }
        self.publish_state();
    }

    pub(crate) fn set_registered(&self) {
        self.0.registered.store(true, Relaxed);
        self.0.registrations.inc();
        self.publish_state();
    }

    pub(crate) fn set_synchronized(&self) {
        self.0.synchronized.store(true, Relaxed);
        self.publish_state();
    }

    pub(crate) fn event(&self, kind: EventKind) {
        self.0
            .events
            .get_or_create(&[("event", kind.label())])
            .inc();
    }

    /// A CreateContainer that needed the mock ended in `outcome` after `latency`.
    pub(crate) fn outcome(&self, outcome: Outcome, latency: Duration) {
        match outcome.error_label() {
            None => self.0.injections.inc(),
            Some(label) => self.0.errors.get_or_create(&label).inc(),
        };
        self.untouched(latency);
    }

    /// A CreateContainer that did not need the mock took `latency`.
    pub(crate) fn untouched(&self, latency: Duration) {
        self.0.create_latency.observe(latency.as_secs_f64());
    }

    pub(crate) fn set_pinned(&self, pinned: usize) {
        self.0.pinned.set(i64::try_from(pinned).unwrap_or(i64::MAX));
    }
}

impl Probe for PluginStatus {
    fn ready(&self) -> Result<(), String> {
        if !self.0.connected.load(Relaxed) {
            Err("nri plugin not connected to the runtime".into())
        } else if !self.0.registered.load(Relaxed) {
            Err("nri plugin not registered with the runtime".into())
        } else if !self.0.synchronized.load(Relaxed) {
            Err("nri plugin registered but not synchronized".into())
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    fn metrics(status: &PluginStatus) -> String {
        let mut registry = Registry::default();
        status.register(&mut registry);
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        out
    }

    fn assert_lines(out: &str, lines: &[&str]) {
        for line in lines {
            assert!(
                out.lines().any(|l| l == *line),
                "{line:?} missing in\n{out}"
            );
        }
    }

    #[test]
    fn metrics_are_named_counted_and_bucketed() {
        let status = PluginStatus::default();
        status.event(EventKind::CreateContainer);
        status.event(EventKind::CreateContainer);
        status.event(EventKind::CreateContainer);
        status.event(EventKind::Configure);
        status.outcome(Outcome::Injected, Duration::from_micros(40));
        status.outcome(Outcome::FailOpen, Duration::from_millis(2));
        status.untouched(Duration::from_secs(2));
        status.set_pinned(3);
        let out = metrics(&status);
        assert_lines(
            &out,
            &[
                "# TYPE mockgpu_nri_events counter",
                "mockgpu_nri_events_total{event=\"create_container\"} 3",
                "mockgpu_nri_events_total{event=\"configure\"} 1",
                "mockgpu_nri_events_total{event=\"shutdown\"} 0",
                "mockgpu_nri_injections_total 1",
                "mockgpu_nri_errors_total{outcome=\"fail_open\"} 1",
                "mockgpu_nri_errors_total{outcome=\"refused\"} 0",
                "mockgpu_nri_registrations_total 0",
                "mockgpu_nri_pinned_containers 3",
                "# TYPE mockgpu_nri_create_container_duration_seconds histogram",
                "# UNIT mockgpu_nri_create_container_duration_seconds seconds",
                "mockgpu_nri_create_container_duration_seconds_bucket{le=\"0.00005\"} 1",
                "mockgpu_nri_create_container_duration_seconds_bucket{le=\"0.001\"} 1",
                "mockgpu_nri_create_container_duration_seconds_bucket{le=\"0.0025\"} 2",
                "mockgpu_nri_create_container_duration_seconds_bucket{le=\"1.0\"} 2",
                "mockgpu_nri_create_container_duration_seconds_bucket{le=\"+Inf\"} 3",
                "mockgpu_nri_create_container_duration_seconds_count 3",
            ],
        );
    }

    #[test]
    fn ready_once_registered_and_synchronized_until_disconnected() {
        let status = PluginStatus::default();
        let not_ready = |reason: &str, status: &PluginStatus| {
            assert_eq!(status.ready(), Err(reason.to_owned()));
            assert!(!status.is_ready());
        };
        not_ready("nri plugin not connected to the runtime", &status);
        status.set_connected(true);
        not_ready("nri plugin not registered with the runtime", &status);
        assert_lines(
            &metrics(&status),
            &["mockgpu_nri_connected 1", "mockgpu_nri_ready 0"],
        );
        status.set_registered();
        not_ready("nri plugin registered but not synchronized", &status);
        status.set_synchronized();
        assert_eq!(status.ready(), Ok(()));
        assert!(status.is_ready());
        assert_lines(
            &metrics(&status),
            &[
                "mockgpu_nri_connected 1",
                "mockgpu_nri_ready 1",
                "mockgpu_nri_registrations_total 1",
            ],
        );
        status.set_connected(false);
        not_ready("nri plugin not connected to the runtime", &status);
        assert_lines(
            &metrics(&status),
            &["mockgpu_nri_connected 0", "mockgpu_nri_ready 0"],
        );
    }
}
