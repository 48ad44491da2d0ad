//! A minimal HTTP/1.1 health endpoint: `GET /healthz`, `GET /readyz` and `GET /metrics`
//! (Prometheus text format) over any number of [`Probe`]s.
//!
//! ```no_run
//! # async fn example(probe: std::sync::Arc<dyn mockgpu_nri::health::Probe>) -> Result<(), mockgpu_nri::health::HealthError> {
//! use mockgpu_nri::health::HealthServer;
//! let server = HealthServer::bind("127.0.0.1:9464".parse().unwrap()).await?;
//! server.serve(vec![probe], std::future::pending()).await
//! # }
//! ```

use std::{fmt::Write as _, future::Future, io, net::SocketAddr, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    time::timeout,
};

/// Errors of the health endpoint.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// The listening socket could not be bound.
    #[error("cannot listen on {addr} for health checks: {source}")]
    Bind {
        /// Address that was requested.
        addr: SocketAddr,
        /// Underlying error.
        source: io::Error,
    },
    /// Accepting a connection failed.
    #[error("health endpoint accept failed: {0}")]
    Accept(io::Error),
}

/// Something that contributes to readiness and to the metrics page.
pub trait Probe: Send + Sync {
    /// `Ok(())` when ready, otherwise a reason in words (shown in the `/readyz` body).
    fn ready(&self) -> Result<(), String>;
    /// Appends Prometheus text-format metrics (with `# HELP`/`# TYPE` lines) to `out`.
    fn metrics(&self, out: &mut String);
}

/// Several probes act as one: ready when all are ready, metrics concatenated.
impl<P: Probe + ?Sized> Probe for Vec<Arc<P>> {
    fn ready(&self) -> Result<(), String> {
        let reasons: Vec<String> = self.iter().filter_map(|p| p.ready().err()).collect();
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(reasons.join("; "))
        }
    }

    fn metrics(&self, out: &mut String) {
        for probe in self {
            probe.metrics(out);
        }
    }
}

/// Longest request head accepted; a longer one closes the connection unanswered.
const MAX_REQUEST_HEAD: usize = 8 * 1024;
/// A client must send its request head within this time.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A bound health endpoint, ready to [`serve`](HealthServer::serve).
#[derive(Debug)]
pub struct HealthServer {
    listener: TcpListener,
}

impl HealthServer {
    /// Binds the TCP address (port 0 picks a free port, see [`local_addr`](Self::local_addr)).
    pub async fn bind(addr: SocketAddr) -> Result<Self, HealthError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| HealthError::Bind { addr, source })?;
        Ok(Self { listener })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Answers requests until `shutdown` completes. Each connection is handled on its own task.
    pub async fn serve<P>(
        self,
        probe: P,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), HealthError>
    where
        P: Probe + 'static,
    {
        let probe = Arc::new(probe);
        tokio::pin!(shutdown);
        loop {
            let (stream, _) = tokio::select! {
                () = &mut shutdown => return Ok(()),
                accepted = self.listener.accept() => accepted.map_err(HealthError::Accept)?,
            };
            let probe = Arc::clone(&probe);
            tokio::spawn(async move {
                if let Err(err) = handle(stream, probe.as_ref()).await {
                    tracing::debug!(%err, "health request failed");
                }
            });
        }
    }
}

async fn handle(mut stream: TcpStream, probe: &dyn Probe) -> io::Result<()> {
    let head = match timeout(REQUEST_TIMEOUT, read_head(&mut stream)).await {
        Ok(head) => head?,
        Err(_) => return Ok(()),
    };
    let Some(head) = head else {
        return Ok(());
    };
    let (status, content_type, body) = respond(&head, probe);
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// Reads up to the blank line ending the request head; `None` when it exceeds the limit.
async fn read_head(stream: &mut TcpStream) -> io::Result<Option<String>> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        if buf.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
        if buf.len() > MAX_REQUEST_HEAD {
            return Ok(None);
        }
    }
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

const TEXT: &str = "text/plain; charset=utf-8";
const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

fn respond(head: &str, probe: &dyn Probe) -> (&'static str, &'static str, String) {
    let mut parts = head.lines().next().unwrap_or_default().split(' ');
    let (method, target) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or("/"),
    );
    let path = target.split('?').next().unwrap_or_default();
    if method != "GET" && method != "HEAD" {
        return (
            "405 Method Not Allowed",
            TEXT,
            "only GET is served\n".into(),
        );
    }
    match path {
        "/healthz" => ("200 OK", TEXT, "ok\n".into()),
        "/readyz" => match probe.ready() {
            Ok(()) => ("200 OK", TEXT, "ready\n".into()),
            Err(reason) => (
                "503 Service Unavailable",
                TEXT,
                format!("not ready: {reason}\n"),
            ),
        },
        "/metrics" => {
            let mut out = String::new();
            probe.metrics(&mut out);
            ("200 OK", PROMETHEUS, out)
        }
        _ => ("404 Not Found", TEXT, "not found\n".into()),
    }
}

/// A Prometheus histogram with fixed bucket bounds, updated lock-free.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<std::sync::atomic::AtomicU64>,
    count: std::sync::atomic::AtomicU64,
    sum_nanos: std::sync::atomic::AtomicU64,
}

impl Histogram {
    /// A histogram over `bounds` (upper bounds in seconds, ascending; `+Inf` is implicit).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: bounds.iter().map(|_| Default::default()).collect(),
            count: Default::default(),
            sum_nanos: Default::default(),
        }
    }

    /// Records one observation.
    pub fn observe(&self, value: Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let secs = value.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|b| secs <= *b)
            && let Some(bucket) = self.buckets.get(i)
        {
            bucket.fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        let nanos = u64::try_from(value.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Relaxed);
    }

    /// Appends the histogram as `name` with `help` in Prometheus text format.
    pub fn render(&self, name: &str, help: &str, out: &mut String) {
        use std::sync::atomic::Ordering::Relaxed;
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            cumulative += bucket.load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count.load(Relaxed);
        let sum = self.sum_nanos.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {sum}\n{name}_count {count}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Result<(), String>, &'static str);

    impl Probe for Fixed {
        fn ready(&self) -> Result<(), String> {
            self.0.clone()
        }
        fn metrics(&self, out: &mut String) {
            out.push_str(self.1);
        }
    }

    async fn get(addr: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn serves_health_ready_and_metrics_of_combined_probes() {
        let server = HealthServer::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = server.local_addr().unwrap();
        let probes: Vec<Arc<dyn Probe>> = vec![
            Arc::new(Fixed(Ok(()), "a_total 1\n")),
            Arc::new(Fixed(Err("not synchronized".into()), "b_total 2\n")),
        ];
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server.serve(probes, async {
            let _ = stopped.await;
        }));
        let run = async {
            let health = get(addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
            assert!(health.starts_with("HTTP/1.1 200 OK"), "{health}");
            let ready = get(addr, "GET /readyz HTTP/1.1\r\n\r\n").await;
            assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
            assert!(ready.ends_with("not ready: not synchronized\n"), "{ready}");
            let metrics = get(addr, "GET /metrics?x=1 HTTP/1.1\r\n\r\n").await;
            assert!(
                metrics.ends_with("\r\n\r\na_total 1\nb_total 2\n"),
                "{metrics}"
            );
            let missing = get(addr, "GET /nope HTTP/1.1\r\n\r\n").await;
            assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
            let post = get(addr, "POST /readyz HTTP/1.1\r\n\r\n").await;
            assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        };
        timeout(Duration::from_secs(10), run).await.unwrap();
        stop.send(()).unwrap();
        timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    #[test]
    fn histogram_renders_cumulative_buckets() {
        static BOUNDS: [f64; 2] = [0.001, 0.01];
        let h = Histogram::new(&BOUNDS);
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_secs(1));
        let mut out = String::new();
        h.render("lat_seconds", "latency", &mut out);
        assert!(
            out.contains("lat_seconds_bucket{le=\"0.001\"} 1\n"),
            "{out}"
        );
        assert!(out.contains("lat_seconds_bucket{le=\"0.01\"} 2\n"), "{out}");
        assert!(out.contains("lat_seconds_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("lat_seconds_count 3\n"), "{out}");
    }
}
