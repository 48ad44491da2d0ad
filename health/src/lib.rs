//! The health endpoint of mockgpu's processes (the agent, the standalone NRI plugin): an
//! HTTP/1.1 server (hyper) answering `GET`/`HEAD` on `/healthz` (alive), `/readyz` (every [`Probe`]
//! ready, or the reasons why not) and `/metrics` (one `prometheus-client` [`Registry`] in the
//! OpenMetrics text format).
//!
//! ```no_run
//! # async fn example() -> Result<(), mockgpu_health::HealthError> {
//! use mockgpu_health::{HealthServer, Probe};
//! use prometheus_client::{metrics::counter::Counter, registry::Registry};
//!
//! struct AlwaysReady;
//! impl Probe for AlwaysReady {
//!     fn ready(&self) -> Result<(), String> {
//!         Ok(())
//!     }
//! }
//!
//! let mut registry = Registry::default();
//! let requests = Counter::<u64>::default();
//! registry.register("requests", "Requests handled", requests.clone());
//! let server = HealthServer::bind("127.0.0.1:9464".parse().unwrap()).await?;
//! server.serve(AlwaysReady, registry, std::future::pending()).await;
//! # Ok(())
//! # }
//! ```

mod server;

use std::sync::Arc;

pub use prometheus_client::registry::Registry;
pub use server::{Accept, HealthError, HealthServer};

/// Something that contributes to readiness.
pub trait Probe: Send + Sync {
    /// `Ok(())` when ready, otherwise a reason in words (shown in the `/readyz` body).
    fn ready(&self) -> Result<(), String>;
}

/// Several probes act as one: ready when all are ready, otherwise every reason, `; `-separated.
impl<P: Probe + ?Sized> Probe for Vec<Arc<P>> {
    fn ready(&self) -> Result<(), String> {
        let reasons: Vec<String> = self.iter().filter_map(|p| p.ready().err()).collect();
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(reasons.join("; "))
        }
    }
}

/// A probe with a fixed answer, for the tests.
#[cfg(test)]
struct Fixed(Result<(), &'static str>);

#[cfg(test)]
impl Probe for Fixed {
    fn ready(&self) -> Result<(), String> {
        self.0.map_err(String::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probes(states: &[Result<(), &'static str>]) -> Vec<Arc<dyn Probe>> {
        states
            .iter()
            .map(|s| Arc::new(Fixed(*s)) as Arc<dyn Probe>)
            .collect()
    }

    #[test]
    fn combined_probes_are_ready_only_when_all_are() {
        assert_eq!(probes(&[]).ready(), Ok(()));
        assert_eq!(probes(&[Ok(()), Ok(())]).ready(), Ok(()));
        assert_eq!(
            probes(&[Ok(()), Err("tree not mounted")]).ready(),
            Err("tree not mounted".into())
        );
        assert_eq!(
            probes(&[Err("tree not mounted"), Ok(()), Err("nri not registered")]).ready(),
            Err("tree not mounted; nri not registered".into())
        );
    }
}
