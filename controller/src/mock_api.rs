//! A mocked API server for the tests of what the controller writes (`tower-test`): a [`Client`]
//! whose requests are recorded and answered by a function of each.

use std::time::Duration;

use hyper::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// A request the mocked API server was sent.
#[derive(Debug)]
pub struct Sent {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Path and query.
    pub uri: String,
    /// The `Content-Type` header.
    pub content_type: String,
    /// The JSON body (`Null`: none).
    pub body: Value,
}

/// A mocked API server: a client whose requests are recorded, in order, and answered by `answer`
/// (status, JSON body).
pub fn api_server(answer: impl Fn(&Sent) -> (u16, Value) + Send + 'static) -> (Client, Server) {
    api_server_holding(move |s| Some(answer(s)))
}

/// [`api_server`], but a request that `answer` answers `None` is held open, unanswered (a watch
/// that sees no change) until the server ends.
pub fn api_server_holding(
    answer: impl Fn(&Sent) -> Option<(u16, Value)> + Send + 'static,
) -> (Client, Server) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(async move {
        let (mut sent, mut held) = (Vec::new(), Vec::new());
        while let Some((req, reply)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.expect("a readable request body");
            let s = Sent {
                method: parts.method.to_string(),
                uri: parts.uri.to_string(),
                content_type: parts
                    .headers
                    .get(hyper::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string(),
                body: if bytes.is_empty() {
                    Value::Null
                } else {
                    serde_json::from_slice(&bytes).expect("a JSON request body")
                },
            };
            match answer(&s) {
                Some((status, body)) => {
                    let answer = Response::builder()
                        .status(status)
                        .body(Body::from(serde_json::to_vec(&body).unwrap()))
                        .unwrap();
                    reply.send_response(answer);
                }
                None => held.push(reply),
            }
            sent.push(s);
        }
        sent
    });
    (Client::new(service, "default"), Server(server))
}

/// The mocked API server's task.
pub struct Server(JoinHandle<Vec<Sent>>);

impl Server {
    /// What the server was sent, in order; it ends once every clone of its client is dropped.
    pub async fn sent(self) -> Vec<Sent> {
        tokio::time::timeout(Duration::from_secs(10), self.0)
            .await
            .expect("the mocked API server ends once its clients are gone")
            .expect("the mocked API server did not panic")
    }
}

/// A status answer of `code`.
pub fn status(code: u16, reason: &str) -> (u16, Value) {
    let body = json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "message": format!("{reason} (mocked)"), "reason": reason, "code": code,
    });
    (code, body)
}

/// (method, path and query) of each request.
pub fn requests(sent: &[Sent]) -> Vec<(&str, &str)> {
    sent.iter()
        .map(|s| (s.method.as_str(), s.uri.as_str()))
        .collect()
}
