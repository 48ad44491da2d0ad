//! Readiness and metrics of a running plugin, shared with the health endpoint.

use std::{
    fmt::Write as _,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use crate::health::{Histogram, Probe};

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
static LATENCY_BOUNDS: [f64; 10] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.1, 1.0,
];

#[derive(Debug)]
struct Inner {
    connected: AtomicBool,
    registered: AtomicBool,
    synchronized: AtomicBool,
    registrations: AtomicU64,
    events: [AtomicU64; EventKind::ALL.len()],
    outcomes: [AtomicU64; 3],
    pinned: AtomicU64,
    create_latency: Histogram,
}

/// Readiness (`registered and synchronized`) and metrics of a plugin; cheap to clone.
#[derive(Debug, Clone)]
pub struct PluginStatus(Arc<Inner>);

impl Default for PluginStatus {
    fn default() -> Self {
        Self(Arc::new(Inner {
            connected: AtomicBool::new(false),
            registered: AtomicBool::new(false),
            synchronized: AtomicBool::new(false),
            registrations: AtomicU64::new(0),
            events: Default::default(),
            outcomes: Default::default(),
            pinned: AtomicU64::new(0),
            create_latency: Histogram::new(&LATENCY_BOUNDS),
        }))
    }
}

impl PluginStatus {
    /// Whether the plugin is registered and has completed Synchronize on its current connection.
    pub fn is_ready(&self) -> bool {
        self.0.registered.load(Relaxed) && self.0.synchronized.load(Relaxed)
    }

    /// How many times the plugin has registered with a runtime.
    pub fn registrations(&self) -> u64 {
        self.0.registrations.load(Relaxed)
    }

    pub(crate) fn set_connected(&self, connected: bool) {
        self.0.connected.store(connected, Relaxed);
        if !connected {
            self.0.registered.store(false, Relaxed);
            self.0.synchronized.store(false, Relaxed);
        }
    }

    pub(crate) fn set_registered(&self) {
        self.0.registered.store(true, Relaxed);
        self.0.registrations.fetch_add(1, Relaxed);
    }

    pub(crate) fn set_synchronized(&self) {
        self.0.synchronized.store(true, Relaxed);
    }

    pub(crate) fn event(&self, kind: EventKind) {
        if let Some(i) = EventKind::ALL.iter().position(|k| *k == kind) {
            self.0.events[i].fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn outcome(&self, outcome: Outcome, latency: Duration) {
        self.0.outcomes[outcome as usize].fetch_add(1, Relaxed);
        self.0.create_latency.observe(latency);
    }

    pub(crate) fn untouched(&self, latency: Duration) {
        self.0.create_latency.observe(latency);
    }

    pub(crate) fn set_pinned(&self, pinned: usize) {
        self.0.pinned.store(pinned as u64, Relaxed);
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

    fn metrics(&self, out: &mut String) {
        let s = &self.0;
        let _ = writeln!(
            out,
            "# HELP mockgpu_nri_events_total Runtime requests handled, by event.\n# TYPE mockgpu_nri_events_total counter"
        );
        for (kind, count) in EventKind::ALL.iter().zip(&s.events) {
            let _ = writeln!(
                out,
                "mockgpu_nri_events_total{{event=\"{}\"}} {}",
                kind.label(),
                count.load(Relaxed)
            );
        }
        let [injected, refused, fail_open] = [0, 1, 2].map(|i| s.outcomes[i].load(Relaxed));
        let _ = writeln!(
            out,
            "# HELP mockgpu_nri_injections_total GPU-holding containers given the mock.\n# TYPE mockgpu_nri_injections_total counter\nmockgpu_nri_injections_total {injected}"
        );
        let _ = writeln!(
            out,
            "# HELP mockgpu_nri_errors_total GPU-holding containers not given the mock, by outcome.\n# TYPE mockgpu_nri_errors_total counter\nmockgpu_nri_errors_total{{outcome=\"refused\"}} {refused}\nmockgpu_nri_errors_total{{outcome=\"fail_open\"}} {fail_open}"
        );
        let gauges = [
            (
                "registrations_total",
                "counter",
                "Registrations with a runtime.",
                s.registrations.load(Relaxed),
            ),
            (
                "connected",
                "gauge",
                "1 while connected to the runtime.",
                u64::from(s.connected.load(Relaxed)),
            ),
            (
                "ready",
                "gauge",
                "1 while registered and synchronized.",
                u64::from(self.is_ready()),
            ),
            (
                "pinned_containers",
                "gauge",
                "Containers currently holding GPUs.",
                s.pinned.load(Relaxed),
            ),
        ];
        for (name, kind, help, value) in gauges {
            let _ = writeln!(
                out,
                "# HELP mockgpu_nri_{name} {help}\n# TYPE mockgpu_nri_{name} {kind}\nmockgpu_nri_{name} {value}"
            );
        }
        s.create_latency.render(
            "mockgpu_nri_create_container_duration_seconds",
            "Time to decide a CreateContainer adjustment.",
            out,
        );
    }
}
