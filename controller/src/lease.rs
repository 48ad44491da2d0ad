//! Leader election through a `coordination.k8s.io/v1` Lease: the holder renews it; another
//! replica takes it when it has not been renewed for its duration (measured on the observer's
//! own clock from when it first saw the current record, so clock skew between replicas does not
//! matter); the holder releases it when it stops, so that a standby takes over at once.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

/// Timing of the election.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long a lease holds without renewal.
    pub lease: Duration,
    /// How often the leader renews.
    pub renew: Duration,
    /// A leader that could not renew for this long stops acting (shorter than `lease`).
    pub renew_deadline: Duration,
    /// How often a standby looks at the lease.
    pub retry: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(15),
            renew: Duration::from_secs(5),
            renew_deadline: Duration::from_secs(10),
            retry: Duration::from_secs(1),
        }
    }
}

/// What to do with the lease as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// It is ours: renew it.
    Renew,
    /// Nobody holds it, or the holder let it expire: take it.
    Acquire,
    /// Someone else holds it.
    Follow {
        /// The holder.
        holder: String,
    },
}

/// The decision for `me` on `lease`, whose current record we have seen unchanged for
/// `unchanged_for`.
pub fn decide(lease: Option<&LeaseSpec>, me: &str, unchanged_for: Duration) -> Decision {
    let holder = lease
        .and_then(|l| l.holder_identity.as_deref())
        .filter(|h| !h.is_empty());
    let Some(holder) = holder else {
        return Decision::Acquire;
    };
    if holder == me {
        return Decision::Renew;
    }
    let duration = lease
        .and_then(|l| l.lease_duration_seconds)
        .map_or(Duration::ZERO, |s| {
            Duration::from_secs(u64::try_from(s).unwrap_or(0))
        });
    if unchanged_for >= duration {
        Decision::Acquire
    } else {
        Decision::Follow {
            holder: holder.to_string(),
        }
    }
}

/// The record `me` writes to take or renew `old`.
pub fn claim(old: Option<&LeaseSpec>, me: &str, lease: Duration, now: Timestamp) -> LeaseSpec {
    let old = old.cloned().unwrap_or_default();
    let ours = old.holder_identity.as_deref() == Some(me);
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(i32::try_from(lease.as_secs()).unwrap_or(i32::MAX).max(1)),
        acquire_time: if ours {
            old.acquire_time.clone()
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(old.lease_transitions.unwrap_or(0) + i32::from(!ours)),
        ..old
    }
}

/// The record that hands `old` back: no holder, a duration of one second.
pub fn released(old: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        renew_time: Some(MicroTime(now)),
        ..old.clone()
    }
}

/// Errors of the election.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The API server refused or failed a request.
    #[error("lease {name}: {source}")]
    Api {
        /// The lease.
        name: String,
        /// The API error.
        source: kube::Error,
    },
}

/// What identifies a lease record: its holder and renew time.
type Record = (Option<String>, Option<MicroTime>);

/// One replica's side of the election.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    me: String,
    timing: Timing,
    /// The record last seen (holder, renew time) and since when (our clock).
    seen: Option<(Record, Instant)>,
    /// When we last wrote the lease successfully as its holder.
    renewed: Option<Instant>,
}

impl Elector {
    /// An elector for lease `name` (in `api`'s namespace) as `me`.
    pub fn new(api: Api<Lease>, name: &str, me: &str, timing: Timing) -> Self {
        Self {
            api,
            name: name.to_string(),
            me: me.to_string(),
            timing,
            seen: None,
            renewed: None,
        }
    }

    /// Runs the election until `stop` completes, telling `leading` whether we lead (`None` until
    /// the lease was first read); then releases the lease if we hold it.
    pub async fn run(
        mut self,
        leading: watch::Sender<Option<bool>>,
        stop: impl Future<Output = ()>,
    ) {
        tokio::pin!(stop);
        loop {
            let known = match self.step().await {
                Ok(lead) => Some(lead),
                Err(err) => {
                    warn!(%err, "leader election: cannot read or write the lease");
                    let lead = self
                        .renewed
                        .is_some_and(|t| t.elapsed() < self.timing.renew_deadline);
                    leading.borrow().map(|_| lead)
                }
            };
            let lead = known == Some(true);
            if !lead {
                self.renewed = None;
            }
            leading.send_if_modified(|l| {
                let changed = *l != known;
                *l = known;
                changed
            });
            let pause = if lead {
                self.timing.renew
            } else {
                self.timing.retry
            };
            tokio::select! {
                () = &mut stop => break,
                () = tokio::time::sleep(pause) => {}
            }
        }
        let was_leading = *leading.borrow() == Some(true);
        leading.send_replace(Some(false));
        if was_leading {
            match self.release().await {
                Ok(()) => info!(lease = %self.name, "leader election: lease released"),
                Err(err) => warn!(%err, "leader election: cannot release the lease"),
            }
        }
    }

    /// One look at the lease: takes or renews it when due. `Ok(true)`: we lead.
    async fn step(&mut self) -> Result<bool, LeaseError> {
        let api_err = |source| LeaseError::Api {
            name: self.name.clone(),
            source,
        };
        let current = self.api.get_opt(&self.name).await.map_err(api_err)?;
        let spec = current.as_ref().and_then(|l| l.spec.as_ref());
        let record: Record = spec
            .map(|s| (s.holder_identity.clone(), s.renew_time.clone()))
            .unwrap_or_default();
        let now = Instant::now();
        let since = match &self.seen {
            Some((r, at)) if *r == record => *at,
            _ => now,
        };
        self.seen = Some((record, since));
        match decide(spec, &self.me, now - since) {
            Decision::Follow { holder } => {
                if self.renewed.is_some() {
                    warn!(%holder, "leader election: the lease is held by another replica");
                }
                Ok(false)
            }
            decision => {
                // the current resourceVersion: a write that raced another replica's fails (409)
                let metadata = current.as_ref().map_or_else(
                    || ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    |l| l.metadata.clone(),
                );
                let lease = Lease {
                    metadata,
                    spec: Some(claim(spec, &self.me, self.timing.lease, Timestamp::now())),
                };
                let written = match current {
                    None => self.api.create(&PostParams::default(), &lease).await,
                    Some(_) => {
                        self.api
                            .replace(&self.name, &PostParams::default(), &lease)
                            .await
                    }
                };
                match written {
                    Ok(_) => {
                        if decision == Decision::Acquire || self.renewed.is_none() {
                            info!(lease = %self.name, identity = %self.me, "leader election: leading");
                        }
                        self.renewed = Some(now);
                        Ok(true)
                    }
                    // another replica wrote it first: look again next time
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                    Err(e) => Err(api_err(e)),
                }
            }
        }
    }

    async fn release(&self) -> Result<(), LeaseError> {
        let api_err = |source| LeaseError::Api {
            name: self.name.clone(),
            source,
        };
        let Some(mut lease) = self.api.get_opt(&self.name).await.map_err(api_err)? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_ref() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(&self.me) {
            return Ok(());
        }
        lease.spec = Some(released(spec, Timestamp::now()));
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map_err(api_err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(by: &str, secs: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(by.into()),
            lease_duration_seconds: Some(secs),
            ..Default::default()
        }
    }

    #[test]
    fn the_decision_table() {
        let s = Duration::from_secs;
        let follow = |h: &str| Decision::Follow { holder: h.into() };
        let cases = [
            (None, s(0), Decision::Acquire),
            (Some(LeaseSpec::default()), s(0), Decision::Acquire),
            (Some(held("", 15)), s(0), Decision::Acquire),
            (Some(held("a", 15)), s(100), Decision::Renew),
            (Some(held("b", 15)), s(0), follow("b")),
            (Some(held("b", 15)), s(14), follow("b")),
            (Some(held("b", 15)), s(15), Decision::Acquire),
            (Some(held("b", 1)), s(1), Decision::Acquire),
        ];
        for (lease, unchanged, want) in cases {
            assert_eq!(
                decide(lease.as_ref(), "a", unchanged),
                want,
                "{lease:?} unchanged for {unchanged:?}"
            );
        }
    }

    #[test]
    fn claiming_counts_transitions_and_keeps_the_acquire_time_on_renewal() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(1_005).unwrap();
        let first = claim(None, "a", Duration::from_secs(15), t0);
        assert_eq!(first.holder_identity.as_deref(), Some("a"));
        assert_eq!(first.lease_duration_seconds, Some(15));
        assert_eq!(first.lease_transitions, Some(1));
        let renewed = claim(Some(&first), "a", Duration::from_secs(15), t1);
        assert_eq!(renewed.acquire_time, Some(MicroTime(t0)));
        assert_eq!(renewed.renew_time, Some(MicroTime(t1)));
        assert_eq!(renewed.lease_transitions, Some(1));
        let taken = claim(Some(&renewed), "b", Duration::from_secs(15), t1);
        assert_eq!(
            (taken.acquire_time, taken.lease_transitions),
            (Some(MicroTime(t1)), Some(2))
        );
        let back = released(&renewed, t1);
        assert_eq!(back.holder_identity, None);
        assert_eq!(decide(Some(&back), "b", Duration::ZERO), Decision::Acquire);
    }

    /// The lease's writes against a mocked API server.
    mod writes {
        use serde_json::{Value, json};

        use super::*;
        use crate::mock_api::{Sent, api_server, requests, status};

        const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/mockgpu/leases";
        const LEASE: &str =
            "/apis/coordination.k8s.io/v1/namespaces/mockgpu/leases/mockgpu-controller";
        const PUT: &str =
            "/apis/coordination.k8s.io/v1/namespaces/mockgpu/leases/mockgpu-controller?";

        fn lease(holder: &str) -> Value {
            json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "mockgpu-controller", "namespace": "mockgpu",
                             "resourceVersion": "5"},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                         "leaseTransitions": 1},
            })
        }

        /// An elector of `replica-0` against a server holding a lease of `holder` (`None`: none)
        /// at resource version 5, whose writes are answered `write` (`None`: the object
        /// written back).
        fn elector(
            holder: Option<&'static str>,
            write: Option<u16>,
        ) -> (Elector, crate::mock_api::Server) {
            let (client, server) = api_server(move |s: &Sent| match (&*s.method, holder, write) {
                ("GET", Some(h), _) => (200, lease(h)),
                ("GET", None, _) => status(404, "NotFound"),
                (_, _, Some(code)) => status(code, "Conflict"),
                ("POST", ..) => (201, s.body.clone()),
                _ => (200, s.body.clone()),
            });
            let api = Api::namespaced(client, "mockgpu");
            let e = Elector::new(api, "mockgpu-controller", "replica-0", Timing::default());
            (e, server)
        }

        /// The lease's holder and transitions in a written body.
        fn holder(s: &Sent) -> (Value, Value) {
            let spec = &s.body["spec"];
            (
                spec["holderIdentity"].clone(),
                spec["leaseTransitions"].clone(),
            )
        }

        /// One step of the election against [`elector`]`(holder, write)`: its outcome and what
        /// was sent.
        async fn step(
            holder: Option<&'static str>,
            write: Option<u16>,
        ) -> (Result<bool, LeaseError>, Vec<Sent>) {
            let (mut e, server) = elector(holder, write);
            let r = e.step().await;
            drop(e);
            (r, server.sent().await)
        }

        /// No lease yet: it is created, held by us.
        #[tokio::test]
        async fn a_missing_lease_is_created() {
            let (r, sent) = step(None, None).await;
            assert!(r.unwrap());
            let post = format!("{LEASES}?");
            assert_eq!(requests(&sent), [("GET", LEASE), ("POST", &*post)]);
            assert_eq!(sent[1].body["metadata"]["name"], "mockgpu-controller");
            assert_eq!(holder(&sent[1]), (json!("replica-0"), json!(1)));
        }

        /// Our lease is renewed by a replace at the version read (a race with another replica
        /// fails it); a conflict means another replica wrote first: we do not lead.
        #[tokio::test]
        async fn our_lease_is_renewed_at_the_version_read() {
            for (write, leads) in [(None, true), (Some(409), false)] {
                let (r, sent) = step(Some("replica-0"), write).await;
                assert_eq!(r.unwrap(), leads, "{write:?}");
                assert_eq!(requests(&sent), [("GET", LEASE), ("PUT", PUT)]);
                assert_eq!(sent[1].body["metadata"]["resourceVersion"], "5");
                assert_eq!(holder(&sent[1]), (json!("replica-0"), json!(1)));
            }
        }

        /// Any other error writing the lease is an error of the step.
        #[tokio::test]
        async fn a_failed_renewal_is_an_error() {
            let (r, sent) = step(Some("replica-0"), Some(500)).await;
            assert!(
                matches!(&r, Err(LeaseError::Api { name, source: kube::Error::Api(s) })
                    if name == "mockgpu-controller" && s.code == 500),
                "{r:?}"
            );
            assert_eq!(requests(&sent), [("GET", LEASE), ("PUT", PUT)]);
        }

        /// A lease another replica holds, freshly seen, is not written.
        #[tokio::test]
        async fn another_replicas_lease_is_left_alone() {
            let (mut e, server) = elector(Some("replica-1"), None);
            assert!(!e.step().await.unwrap());
            e.release().await.unwrap();
            drop(e);
            let sent = server.sent().await;
            assert!(
                sent.iter().all(|s| s.method == "GET"),
                "{:?}",
                requests(&sent)
            );
        }

        /// On stopping, the holder hands the lease back: no holder, one second.
        #[tokio::test]
        async fn our_lease_is_released() {
            let (e, server) = elector(Some("replica-0"), None);
            e.release().await.unwrap();
            drop(e);
            let sent = server.sent().await;
            assert_eq!(requests(&sent), [("GET", LEASE), ("PUT", PUT)]);
            assert_eq!(sent[1].body["metadata"]["resourceVersion"], "5");
            assert_eq!(holder(&sent[1]), (Value::Null, json!(1)));
            assert_eq!(sent[1].body["spec"]["leaseDurationSeconds"], 1);
        }
    }
}
