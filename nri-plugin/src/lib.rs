//! mockgpu's NRI plugin: the NRI protocol (multiplexer, ttrpc, our own `.proto` subset), the
//! injection policy, and pinning events for the agent.
//!
//! The agent runs the plugin in-process:
//!
//! ```no_run
//! # async fn agent(inventory: std::sync::Arc<dyn mockgpu_nri::Inventory>) -> Result<(), mockgpu_nri::Error> {
//! use std::sync::Arc;
//! use mockgpu_nri::{Config, Plugin, PinningEvent};
//!
//! let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<PinningEvent>();
//! let plugin = Plugin::new(Config::default(), inventory, Arc::new(tx))?;
//! let status = plugin.status(); // a mockgpu_health::Probe (/readyz)
//! let mut registry = prometheus_client::registry::Registry::default();
//! status.register(&mut registry); // mockgpu_nri_* on /metrics
//! tokio::spawn(async move { while let Some(event) = rx.recv().await { /* report */ } });
//! plugin.run(tokio::signal::ctrl_c().map(|_| ())).await
//! # }
//! # use futures::FutureExt;
//! ```

pub mod config;
pub mod error;
pub mod inventory;
pub mod mux;
pub mod pinning;
pub mod plugin;
pub mod policy;
pub mod status;

/// Code generated from `proto/api.proto` (messages and async ttrpc services).
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/mod.rs"));
}

pub use config::{Config, InjectionConfig};
pub use error::{Error, Result};
pub use inventory::{DriverTreeInventory, GpuInventory, Inventory, NotReady, StdFiles};
pub use pinning::{GpuRef, PinningEvent, PinningSink, PodRef};
pub use plugin::Plugin;
pub use status::PluginStatus;
