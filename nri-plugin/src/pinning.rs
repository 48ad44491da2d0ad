//! Pinning events: which container of which pod holds which GPUs.

use std::collections::HashMap;

use tokio::sync::mpsc;

/// Identity of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodRef {
    /// Kubernetes namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
}

/// One GPU held by a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuRef {
    /// Device minor.
    pub minor: u32,
    /// `GPU-…` identity.
    pub uuid: String,
}

/// A container started or stopped holding GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinningEvent {
    /// The container holds `gpus` (on creation, or found by Synchronize).
    Pinned {
        /// Its pod.
        pod: PodRef,
        /// Container name within the pod.
        container_name: String,
        /// Runtime container id.
        container_id: String,
        /// The GPUs, ordered by minor.
        gpus: Vec<GpuRef>,
    },
    /// The container no longer holds GPUs (stopped, removed, or gone while disconnected).
    Unpinned {
        /// Its pod.
        pod: PodRef,
        /// Container name within the pod.
        container_name: String,
        /// Runtime container id.
        container_id: String,
    },
}

/// Receiver of pinning events; called from protocol handlers, so it must not block.
pub trait PinningSink: Send + Sync {
    /// Delivers one event.
    fn publish(&self, event: PinningEvent);
}

impl PinningSink for mpsc::UnboundedSender<PinningEvent> {
    fn publish(&self, event: PinningEvent) {
        if self.send(event).is_err() {
            tracing::debug!("pinning event dropped: receiver gone");
        }
    }
}

impl PinningSink for mpsc::Sender<PinningEvent> {
    fn publish(&self, event: PinningEvent) {
        if let Err(err) = self.try_send(event) {
            tracing::warn!(%err, "pinning event dropped");
        }
    }
}

/// A pinned container as remembered between events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinRecord {
    /// Its pod.
    pub pod: PodRef,
    /// Runtime id of its pod sandbox.
    pub pod_sandbox_id: String,
    /// Container name.
    pub container_name: String,
    /// Container id.
    pub container_id: String,
    /// The GPUs.
    pub gpus: Vec<GpuRef>,
}

impl PinRecord {
    fn pinned(&self) -> PinningEvent {
        PinningEvent::Pinned {
            pod: self.pod.clone(),
            container_name: self.container_name.clone(),
            container_id: self.container_id.clone(),
            gpus: self.gpus.clone(),
        }
    }

    fn unpinned(self) -> PinningEvent {
        PinningEvent::Unpinned {
            pod: self.pod,
            container_name: self.container_name,
            container_id: self.container_id,
        }
    }
}

/// The pinned containers; turns runtime events into pinning events without duplicates.
#[derive(Debug, Default)]
pub struct PinTable {
    pins: HashMap<String, PinRecord>,
}

impl PinTable {
    /// Records a pin; an event unless the same pin is already recorded.
    pub fn pin(&mut self, pin: PinRecord) -> Option<PinningEvent> {
        if self.pins.get(&pin.container_id) == Some(&pin) {
            return None;
        }
        let event = pin.pinned();
        self.pins.insert(pin.container_id.clone(), pin);
        Some(event)
    }

    /// Forgets a container; an event if it was pinned.
    pub fn unpin(&mut self, container_id: &str) -> Option<PinningEvent> {
        self.pins.remove(container_id).map(PinRecord::unpinned)
    }

    /// Forgets every container of a pod sandbox.
    pub fn unpin_pod(&mut self, pod_sandbox_id: &str) -> Vec<PinningEvent> {
        let ids: Vec<String> = self
            .pins
            .values()
            .filter(|pin| pin.pod_sandbox_id == pod_sandbox_id)
            .map(|pin| pin.container_id.clone())
            .collect();
        ids.iter().filter_map(|id| self.unpin(id)).collect()
    }

    /// Replaces the table with the complete set found by Synchronize: unpins what is gone,
    /// pins what is new or changed.
    pub fn resync(&mut self, pins: Vec<PinRecord>) -> Vec<PinningEvent> {
        let mut gone: Vec<String> = self
            .pins
            .keys()
            .filter(|id| !pins.iter().any(|pin| &pin.container_id == *id))
            .cloned()
            .collect();
        gone.sort();
        let mut events: Vec<PinningEvent> = gone.iter().filter_map(|id| self.unpin(id)).collect();
        events.extend(pins.into_iter().filter_map(|pin| self.pin(pin)));
        events
    }

    /// Number of pinned containers.
    pub fn len(&self) -> usize {
        self.pins.len()
    }

    /// Whether no container is pinned.
    pub fn is_empty(&self) -> bool {
        self.pins.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pin(id: &str, pod: &str, minors: &[u32]) -> PinRecord {
        PinRecord {
            pod: PodRef {
                namespace: "ns".into(),
                name: format!("pod-{pod}"),
                uid: format!("uid-{pod}"),
            },
            pod_sandbox_id: pod.into(),
            container_name: format!("c-{id}"),
            container_id: id.into(),
            gpus: minors
                .iter()
                .map(|&minor| GpuRef {
                    minor,
                    uuid: format!("GPU-{minor}"),
                })
                .collect(),
        }
    }

    #[test]
    fn pins_once_and_unpins_once() {
        let mut table = PinTable::default();
        assert!(matches!(
            table.pin(pin("a", "p", &[0])),
            Some(PinningEvent::Pinned { .. })
        ));
        assert_eq!(table.pin(pin("a", "p", &[0])), None);
        assert!(table.pin(pin("a", "p", &[0, 1])).is_some());
        assert!(
            matches!(table.unpin("a"), Some(PinningEvent::Unpinned { container_id, .. }) if container_id == "a")
        );
        assert_eq!(table.unpin("a"), None);
        assert!(table.is_empty());
    }

    #[test]
    fn pod_removal_unpins_its_containers_only() {
        let mut table = PinTable::default();
        table.pin(pin("a", "p", &[0]));
        table.pin(pin("b", "p", &[1]));
        table.pin(pin("c", "q", &[2]));
        assert_eq!(table.unpin_pod("p").len(), 2);
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn resync_reports_the_difference() {
        let mut table = PinTable::default();
        table.pin(pin("gone", "p", &[0]));
        table.pin(pin("kept", "p", &[1]));
        let events = table.resync(vec![pin("kept", "p", &[1]), pin("new", "q", &[2])]);
        assert_eq!(events.len(), 2, "{events:?}");
        assert!(
            matches!(&events[0], PinningEvent::Unpinned { container_id, .. } if container_id == "gone")
        );
        assert!(
            matches!(&events[1], PinningEvent::Pinned { container_id, .. } if container_id == "new")
        );
    }
}
