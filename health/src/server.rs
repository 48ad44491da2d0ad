//! The HTTP side: accepting connections, reading one request head, answering it.

use std::{future::Future, io, net::SocketAddr, sync::Arc, time::Duration};

use prometheus_client::{encoding::text::encode, registry::Registry};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    time::timeout,
};
use tracing::{debug, warn};

use crate::Probe;

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
}

/// Longest request head accepted; a longer one is answered 431 and the connection closed.
const MAX_REQUEST_HEAD: usize = 8 * 1024;
/// A client must send its request head within this time.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause after a failed `accept()` (e.g. `EMFILE`) before accepting again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

const TEXT: &str = "text/plain; charset=utf-8";
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A source of connections: [`TcpListener`], or a stand-in.
pub trait Accept: Send + 'static {
    /// One accepted connection.
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// Waits for the next connection.
    fn accept(&mut self) -> impl Future<Output = io::Result<Self::Stream>> + Send;
}

impl Accept for TcpListener {
    type Stream = TcpStream;

    async fn accept(&mut self) -> io::Result<TcpStream> {
        TcpListener::accept(self).await.map(|(stream, _)| stream)
    }
}

/// A bound health endpoint, ready to [`serve`](HealthServer::serve).
#[derive(Debug)]
pub struct HealthServer<A = TcpListener> {
    acceptor: A,
    request_timeout: Duration,
}

impl HealthServer {
    /// Binds the TCP address (port 0 picks a free port, see [`local_addr`](Self::local_addr)),
    /// with `SO_REUSEPORT`: a successor on the node's network (a surge pod of a DaemonSet
    /// rollout) binds the same port while its predecessor still serves; only processes of the
    /// same user can share it.
    pub async fn bind(addr: SocketAddr) -> Result<Self, HealthError> {
        let bind = || {
            let socket = match addr {
                SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
                SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
            }?;
            socket.set_reuseaddr(true)?;
            socket.set_reuseport(true)?;
            socket.bind(addr)?;
            socket.listen(1024)
        };
        let acceptor = bind().map_err(|source| HealthError::Bind { addr, source })?;
        Ok(Self::new(acceptor))
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.acceptor.local_addr()
    }
}

impl<A: Accept> HealthServer<A> {
    /// A server over connections from `acceptor`.
    pub fn new(acceptor: A) -> Self {
        Self {
            acceptor,
            request_timeout: REQUEST_TIMEOUT,
        }
    }

    /// Answers requests until `shutdown` completes, each connection on its own task: readiness
    /// from `probe`, metrics from `registry`. A failed `accept()` is logged and retried after a
    /// short pause; it does not end the server.
    pub async fn serve<P: Probe + 'static>(
        mut self,
        probe: P,
        registry: Registry,
        shutdown: impl Future<Output = ()>,
    ) {
        let endpoint = Arc::new(Endpoint {
            probe,
            registry,
            request_timeout: self.request_timeout,
        });
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => return,
                accepted = self.acceptor.accept() => accepted,
            };
            match accepted {
                Ok(stream) => {
                    let endpoint = Arc::clone(&endpoint);
                    tokio::spawn(async move {
                        if let Err(err) = endpoint.handle(stream).await {
                            debug!(%err, "health request failed");
                        }
                    });
                }
                Err(err) => {
                    warn!(%err, backoff = ?ACCEPT_BACKOFF, "health endpoint cannot accept a connection; retrying");
                    tokio::select! {
                        () = &mut shutdown => return,
                        () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                    }
                }
            }
        }
    }
}

/// What the server answers from.
struct Endpoint<P> {
    probe: P,
    registry: Registry,
    request_timeout: Duration,
}

/// How reading a request head ended.
enum Head {
    /// Up to the blank line.
    Complete(String),
    /// Longer than [`MAX_REQUEST_HEAD`].
    TooLong,
    /// The client closed the connection before the blank line.
    Closed,
}

/// One response; `head_only` answers a `HEAD` request (headers, no body).
struct Response {
    status: &'static str,
    content_type: &'static str,
    body: String,
    head_only: bool,
}

impl Response {
    fn text(status: &'static str, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: TEXT,
            body: body.into(),
            head_only: false,
        }
    }

    fn into_bytes(self) -> Vec<u8> {
        let allow = if self.status.starts_with("405") {
            "Allow: GET, HEAD\r\n"
        } else {
            ""
        };
        let mut out = format!(
            "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
            self.status,
            self.content_type,
            self.body.len()
        )
        .into_bytes();
        if !self.head_only {
            out.extend_from_slice(self.body.as_bytes());
        }
        out
    }
}

impl<P: Probe> Endpoint<P> {
    async fn handle<S: AsyncRead + AsyncWrite + Unpin>(&self, mut stream: S) -> io::Result<()> {
        let response = match timeout(self.request_timeout, read_head(&mut stream)).await {
            Err(_) => {
                debug!(timeout = ?self.request_timeout, "health request head not received in time");
                return Ok(());
            }
            Ok(head) => match head? {
                Head::Complete(head) => self.respond(&head),
                Head::TooLong => Response::text(
                    "431 Request Header Fields Too Large",
                    format!("request head longer than {MAX_REQUEST_HEAD} bytes\n"),
                ),
                Head::Closed => return Ok(()),
            },
        };
        stream.write_all(&response.into_bytes()).await?;
        stream.shutdown().await
    }

    fn respond(&self, head: &str) -> Response {
        let mut parts = head.lines().next().unwrap_or_default().split(' ');
        let (method, target) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        let head_only = match method {
            "GET" => false,
            "HEAD" => true,
            _ => {
                return Response::text("405 Method Not Allowed", "only GET and HEAD are served\n");
            }
        };
        let path = target.split('?').next().unwrap_or_default();
        let response = match path {
            "/healthz" => Response::text("200 OK", "ok\n"),
            "/readyz" => match self.probe.ready() {
                Ok(()) => Response::text("200 OK", "ready\n"),
                Err(reason) => {
                    Response::text("503 Service Unavailable", format!("not ready: {reason}\n"))
                }
            },
            "/metrics" => {
                let mut body = String::new();
                match encode(&mut body, &self.registry) {
                    Ok(()) => Response {
                        content_type: OPENMETRICS,
                        ..Response::text("200 OK", body)
                    },
                    Err(_) => Response::text(
                        "500 Internal Server Error",
                        "metrics could not be encoded\n",
                    ),
                }
            }
            _ => Response::text("404 Not Found", "not found\n"),
        };
        Response {
            head_only,
            ..response
        }
    }
}

/// Reads up to the blank line ending the request head.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> io::Result<Head> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Head::Closed);
        }
        // Only the new bytes and the three before them can complete the terminator.
        let scan_from = buf.len().saturating_sub(3);
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        let new = buf.get(scan_from..).unwrap_or_default();
        if new.windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(Head::Complete(String::from_utf8_lossy(&buf).into_owned()));
        }
        if buf.len() > MAX_REQUEST_HEAD {
            return Ok(Head::TooLong);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use prometheus_client::metrics::counter::Counter;

    use super::*;
    use crate::Fixed;

    /// Sends `request` raw and reads the whole response (the server closes the connection).
    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    async fn get(addr: SocketAddr, method_and_target: &str) -> String {
        exchange(
            addr,
            format!("{method_and_target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        )
        .await
    }

    /// Runs `server` over `probe` and one counter (at 3) during `test`, then shuts it down and
    /// checks that `serve` returned.
    async fn with_server<A: Accept>(
        server: HealthServer<A>,
        probe: Fixed,
        test: impl Future<Output = ()>,
    ) {
        let mut registry = Registry::default();
        let requests = Counter::<u64>::default();
        requests.inc_by(3);
        registry.register("test_requests", "Requests handled", requests);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server.serve(probe, registry, async {
            let _ = stopped.await;
        }));
        timeout(Duration::from_secs(10), test).await.unwrap();
        stop.send(()).unwrap();
        timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }

    async fn bound() -> (HealthServer, SocketAddr) {
        let server = HealthServer::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = server.local_addr().unwrap();
        (server, addr)
    }

    #[tokio::test]
    async fn a_successor_binds_the_port_its_predecessor_serves() {
        let (first, addr) = bound().await;
        let second = HealthServer::bind(addr).await.expect("the same port again");
        assert_eq!(second.local_addr().unwrap(), addr);
        drop(first);
        with_server(second, Fixed(Ok(())), async {
            assert!(
                get(addr, "GET /healthz")
                    .await
                    .starts_with("HTTP/1.1 200 OK\r\n")
            );
        })
        .await;
    }

    #[tokio::test]
    async fn answers_each_path_and_method() {
        let (server, addr) = bound().await;
        with_server(server, Fixed(Err("not synchronized")), async {
            let health = get(addr, "GET /healthz").await;
            assert!(health.starts_with("HTTP/1.1 200 OK\r\n"), "{health}");
            assert!(health.ends_with("\r\n\r\nok\n"), "{health}");

            let ready = get(addr, "GET /readyz").await;
            assert!(ready.starts_with("HTTP/1.1 503 "), "{ready}");
            assert!(ready.ends_with("\r\n\r\nnot ready: not synchronized\n"), "{ready}");

            let metrics = get(addr, "GET /metrics?x=1").await;
            assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
            assert!(
                metrics.contains("\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"),
                "{metrics}"
            );
            assert!(
                metrics.contains("\n# TYPE test_requests counter\n"),
                "{metrics}"
            );
            assert!(metrics.contains("\ntest_requests_total 3\n"), "{metrics}");
            assert!(metrics.ends_with("\n# EOF\n"), "{metrics}");

            let head = get(addr, "HEAD /metrics").await;
            let (headers, body) = head.split_once("\r\n\r\n").unwrap();
            assert!(headers.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
            let (_, metrics_body) = metrics.split_once("\r\n\r\n").unwrap();
            assert!(
                headers.contains(&format!("\r\nContent-Length: {}\r\n", metrics_body.len())),
                "{head}"
            );
            assert_eq!(body, "", "HEAD carries no body");

            let missing = get(addr, "GET /nope").await;
            assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");
            let missing_head = get(addr, "HEAD /nope").await;
            assert!(missing_head.starts_with("HTTP/1.1 404 "), "{missing_head}");
            assert!(missing_head.ends_with("\r\n\r\n"), "{missing_head}");

            let post = get(addr, "POST /readyz").await;
            assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
            assert!(post.contains("\r\nAllow: GET, HEAD\r\n"), "{post}");
        })
        .await;
    }

    #[tokio::test]
    async fn ready_probe_answers_200() {
        let (server, addr) = bound().await;
        with_server(server, Fixed(Ok(())), async {
            let ready = get(addr, "GET /readyz").await;
            assert!(ready.starts_with("HTTP/1.1 200 OK\r\n"), "{ready}");
            assert!(ready.ends_with("\r\n\r\nready\n"), "{ready}");
        })
        .await;
    }

    #[tokio::test]
    async fn over_long_head_is_refused_and_the_server_goes_on() {
        let (server, addr) = bound().await;
        with_server(server, Fixed(Ok(())), async {
            // Exactly one byte over the limit and no blank line: the server reads all of it
            // (so closing does not reset the connection) and answers 431.
            let mut request = b"GET /healthz HTTP/1.1\r\nX-Padding: ".to_vec();
            request.resize(MAX_REQUEST_HEAD + 1, b'a');
            let refused = exchange(addr, &request).await;
            assert!(refused.starts_with("HTTP/1.1 431 "), "{refused}");
            let health = get(addr, "GET /healthz").await;
            assert!(health.starts_with("HTTP/1.1 200 OK\r\n"), "{health}");
        })
        .await;
    }

    #[tokio::test]
    async fn a_client_too_slow_with_its_head_is_dropped_and_the_server_goes_on() {
        let (mut server, addr) = bound().await;
        server.request_timeout = Duration::from_millis(100);
        with_server(server, Fixed(Ok(())), async {
            let dropped = exchange(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await;
            assert_eq!(dropped, "", "closed unanswered");
            let health = get(addr, "GET /healthz").await;
            assert!(health.starts_with("HTTP/1.1 200 OK\r\n"), "{health}");
        })
        .await;
    }

    /// A listener whose first `accept()` fails as it does when the process is out of
    /// descriptors.
    struct FailsOnce {
        listener: TcpListener,
        failures: Arc<AtomicUsize>,
    }

    impl Accept for FailsOnce {
        type Stream = TcpStream;

        async fn accept(&mut self) -> io::Result<TcpStream> {
            if self.failures.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(io::Error::from_raw_os_error(libc::EMFILE));
            }
            Accept::accept(&mut self.listener).await
        }
    }

    #[tokio::test]
    async fn a_failed_accept_does_not_end_the_server() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let server = HealthServer::new(FailsOnce {
            listener,
            failures: Arc::clone(&calls),
        });
        with_server(server, Fixed(Ok(())), async {
            let health = get(addr, "GET /healthz").await;
            assert!(health.starts_with("HTTP/1.1 200 OK\r\n"), "{health}");
        })
        .await;
        // The failed call and at least the one that accepted.
        assert!(calls.load(Ordering::SeqCst) >= 2);
    }
}
