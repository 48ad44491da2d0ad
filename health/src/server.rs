//! The HTTP side: accepting connections and answering each request over hyper's HTTP/1.1.

use std::{convert::Infallible, future::Future, io, net::SocketAddr, sync::Arc, time::Duration};

use hyper::{
    Method, Request, Response, StatusCode,
    header::{self, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::{encoding::text::encode, registry::Registry};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
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

/// Longest request head accepted; one still incomplete at this length is answered 431 and the
/// connection closed.
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

    /// Answers requests until `shutdown` completes, each connection on its own task and closed
    /// after one response: readiness from `probe`, metrics from `registry`. A failed `accept()`
    /// is logged and retried after a short pause; it does not end the server.
    pub async fn serve<P: Probe + 'static>(
        mut self,
        probe: P,
        registry: Registry,
        shutdown: impl Future<Output = ()>,
    ) {
        let endpoint = Arc::new(Endpoint { probe, registry });
        let mut http = http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(self.request_timeout)
            .max_header_size(MAX_REQUEST_HEAD)
            .keep_alive(false)
            .title_case_headers(true);
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => return,
                accepted = self.acceptor.accept() => accepted,
            };
            match accepted {
                Ok(stream) => {
                    let endpoint = Arc::clone(&endpoint);
                    let service = service_fn(move |request| {
                        std::future::ready(Ok::<_, Infallible>(endpoint.respond(&request)))
                    });
                    let connection = http.serve_connection(TokioIo::new(stream), service);
                    tokio::spawn(async move {
                        if let Err(err) = connection.await {
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
}

/// A response of `status` with a body of `content_type` (hyper leaves the body out for `HEAD`).
fn response(status: StatusCode, content_type: &'static str, body: String) -> Response<String> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<String> {
    response(status, TEXT, body.into())
}

impl<P: Probe> Endpoint<P> {
    fn respond<B>(&self, request: &Request<B>) -> Response<String> {
        if !matches!(*request.method(), Method::GET | Method::HEAD) {
            let mut refused = text(
                StatusCode::METHOD_NOT_ALLOWED,
                "only GET and HEAD are served\n",
            );
            refused
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return refused;
        }
        match request.uri().path() {
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/readyz" => match self.probe.ready() {
                Ok(()) => text(StatusCode::OK, "ready\n"),
                Err(reason) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {reason}\n"),
                ),
            },
            "/metrics" => {
                let mut body = String::new();
                match encode(&mut body, &self.registry) {
                    Ok(()) => response(StatusCode::OK, OPENMETRICS, body),
                    Err(_) => text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "metrics could not be encoded\n",
                    ),
                }
            }
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::time::timeout;

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
            // The whole limit and still no blank line: the server reads all of it (so closing
            // does not reset the connection) and answers 431.
            let mut request = b"GET /healthz HTTP/1.1\r\nX-Padding: ".to_vec();
            request.resize(MAX_REQUEST_HEAD, b'a');
            let refused = exchange(addr, &request).await;
            assert!(refused.starts_with("HTTP/1.1 431 "), "{refused}");
            let health = get(addr, "GET /healthz").await;
            assert!(health.starts_with("HTTP/1.1 200 OK\r\n"), "{health}");
        })
        .await;
    }

    #[tokio::test]
    async fn a_slow_client_does_not_hold_up_others() {
        let (mut server, addr) = bound().await;
        // Longer than `with_server` waits: a server that waited for this head would fail the test.
        server.request_timeout = Duration::from_secs(3600);
        with_server(server, Fixed(Ok(())), async {
            let mut slow = TcpStream::connect(addr).await.unwrap();
            slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                .await
                .unwrap();
            let health = get(addr, "GET /healthz").await;
            assert!(health.starts_with("HTTP/1.1 200 OK\r\n"), "{health}");
            slow.write_all(b"\r\n").await.unwrap();
            let mut response = String::new();
            slow.read_to_string(&mut response).await.unwrap();
            assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
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
