//! [`SlurmNodes`] over slurmrestd's REST API: `DELETE /slurm/v0.0.42/node/{name}` (Slurm 24.11
//! serves data_parser v0.0.40 to v0.0.42), authenticated by a JWT (`auth/jwt`) in the
//! `X-SLURM-USER-NAME` / `X-SLURM-USER-TOKEN` headers. slurmrestd speaks plain HTTP; the token
//! is read from a Kubernetes Secret ([`read_token`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::HeaderValue;
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Secret;
use serde::Deserialize;
use tracing::{debug, warn};

use crate::slurm::{NodeDeleted, SlurmError, SlurmNodes};

/// The data_parser versions of the node endpoint, newest first: Slurm 24.11 serves all three,
/// 24.05 up to v0.0.41, 23.11 up to v0.0.40 (and an operator may load fewer with `slurmrestd -d`).
const API_VERSIONS: [&str; 3] = ["v0.0.42", "v0.0.41", "v0.0.40"];
/// The largest answer read (slurmrestd's answers to a delete are about 1 KiB).
const MAX_BODY: usize = 1 << 20;

/// A bad slurmrestd client setting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The URL does not parse.
    #[error("slurmrestd url {url:?}: {reason}")]
    Url { url: String, reason: String },
    /// A header value (user name or token) holds characters HTTP headers cannot carry.
    #[error("the slurmrestd {what} is not a valid HTTP header value")]
    Header { what: &'static str },
}

/// A slurmrestd client: one base URL, one user, one token (replaceable), one request timeout.
pub struct Slurmrestd {
    client: Client<HttpConnector, Empty<Bytes>>,
    base: String,
    user: HeaderValue,
    token: RwLock<HeaderValue>,
    timeout: Duration,
    /// Index in [`API_VERSIONS`] of the newest version this server was last seen to serve.
    version: AtomicUsize,
}

impl Slurmrestd {
    /// A client for slurmrestd at `url` (`http://host:port`, optionally with a path prefix),
    /// acting as Slurm user `user` with the JWT `token`; every request ends after `timeout`.
    pub fn new(url: &str, user: &str, token: &str, timeout: Duration) -> Result<Self, ConfigError> {
        let bad = |reason: &str| ConfigError::Url {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let uri: Uri = url
            .parse()
            .map_err(|e: hyper::http::uri::InvalidUri| bad(&e.to_string()))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad("want http://host:port (slurmrestd serves plain HTTP)"));
        }
        if uri.authority().is_none() {
            return Err(bad("no host"));
        }
        if uri.query().is_some() {
            return Err(bad("a query has no place in the base url"));
        }
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: url.trim_end_matches('/').to_owned(),
            user: header("user name", user)?,
            token: RwLock::new(header("token", token)?),
            timeout,
            version: AtomicUsize::new(0),
        })
    }

    /// Uses `token` from now on.
    pub fn set_token(&self, token: &str) -> Result<(), ConfigError> {
        let token = header("token", token)?;
        *self.token.write().unwrap_or_else(PoisonError::into_inner) = token;
        Ok(())
    }

    /// The URL of node `name` in API `version`.
    fn node_url(&self, version: &str, name: &str) -> Result<Uri, SlurmError> {
        format!("{}/slurm/{version}/node/{name}", self.base)
            .parse()
            .map_err(|e| SlurmError::Http(format!("node url for {name:?}: {e}")))
    }

    /// Sends one request and reads its whole answer, within the timeout.
    async fn send(&self, method: Method, uri: Uri) -> Result<(StatusCode, Bytes), SlurmError> {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("X-SLURM-USER-NAME", self.user.clone())
            .header(
                "X-SLURM-USER-TOKEN",
                self.token
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone(),
            )
            .body(Empty::new())
            .map_err(|e| SlurmError::Http(e.to_string()))?;
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| SlurmError::Http(chain(&e)))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| SlurmError::Http(format!("reading the answer: {e}")))?;
            Ok((status, body.to_bytes()))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| SlurmError::Timeout)?
    }
}

/// A header value of `what` (the token's is marked sensitive: never logged).
fn header(what: &'static str, v: &str) -> Result<HeaderValue, ConfigError> {
    let mut h = HeaderValue::from_str(v).map_err(|_| ConfigError::Header { what })?;
    h.set_sensitive(what == "token");
    Ok(h)
}

/// slurmrestd with its token from a Secret, read again before each deletion: a renewed token is
/// used without a restart. A failed read keeps the token read before (and says so).
pub struct WithSecretToken {
    rest: Slurmrestd,
    client: kube::Client,
    namespace: String,
    secret: SecretKey,
}

impl WithSecretToken {
    /// `rest`, whose token came from `secret` in `namespace`.
    pub fn new(rest: Slurmrestd, client: kube::Client, namespace: &str, secret: SecretKey) -> Self {
        Self {
            rest,
            client,
            namespace: namespace.to_owned(),
            secret,
        }
    }
}

impl SlurmNodes for WithSecretToken {
    async fn delete_node(&self, name: &str) -> Result<NodeDeleted, SlurmError> {
        let fresh = read_token(self.client.clone(), &self.namespace, &self.secret).await;
        match fresh.map(|t| self.rest.set_token(&t)) {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                warn!(%err, "the slurmrestd token read again is unusable; keeping the one before")
            }
            Err(err) => {
                warn!(%err, "cannot read the slurmrestd token again; keeping the one before")
            }
        }
        self.rest.delete_node(name).await
    }
}

impl SlurmNodes for Slurmrestd {
    async fn delete_node(&self, name: &str) -> Result<NodeDeleted, SlurmError> {
        if !valid_node_name(name) {
            return Err(SlurmError::Http(format!("invalid node name {name:?}")));
        }
        let first = self.version.load(Ordering::Relaxed);
        for (i, version) in API_VERSIONS.iter().enumerate().skip(first) {
            let (status, body) = self
                .send(Method::DELETE, self.node_url(version, name)?)
                .await?;
            let outcome = delete_outcome(status, &body);
            debug!(node = name, version, %status, ?outcome, "slurmrestd: delete node");
            if let Answered::Node(deleted) = outcome? {
                self.version.store(i, Ordering::Relaxed);
                return Ok(deleted);
            }
        }
        // a server upgraded meanwhile may serve a newer one again
        self.version.store(0, Ordering::Relaxed);
        Err(SlurmError::Http(format!(
            "slurmrestd serves no node endpoint of {} (its data_parser plugins, `slurmrestd -d`)",
            API_VERSIONS[first..].join(", ")
        )))
    }
}

/// Kubernetes node names (DNS subdomains) and Slurm's own: nothing that needs escaping in a path.
fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && name != "."
        && name != ".."
}

/// The `errors` list of a slurmrestd answer.
#[derive(Debug, Default, Deserialize)]
struct Answer {
    #[serde(default)]
    errors: Vec<AnswerError>,
}

#[derive(Debug, Default, Deserialize)]
struct AnswerError {
    #[serde(default)]
    description: String,
    #[serde(default)]
    error: String,
    #[serde(default)]
    error_number: i64,
}

/// Slurm's ESLURM_INVALID_NODE_NAME ("Invalid node name specified"): no such node. slurmrestd
/// answers it with status 500.
const ESLURM_INVALID_NODE_NAME: i64 = 2018;
/// SLURM_PROTOCOL_AUTHENTICATION_ERROR: slurmctld rejected the token (slurmrestd's status 511).
const SLURM_PROTOCOL_AUTHENTICATION_ERROR: i64 = 1007;

impl AnswerError {
    fn node_not_found(&self) -> bool {
        self.error_number == ESLURM_INVALID_NODE_NAME
            || [&self.error, &self.description]
                .iter()
                .any(|s| s.to_ascii_lowercase().contains("invalid node name"))
    }
}

/// What slurmrestd's answer to a request about one node says.
#[derive(Debug, PartialEq, Eq)]
enum Answered {
    /// The node's fate.
    Node(NodeDeleted),
    /// This server does not serve the URL (that API version is not loaded).
    PathNotServed,
}

/// What slurmrestd's answer to a node deletion means. A token slurmrestd cannot parse gets 401;
/// one whose signature slurmctld rejects, 511 with error 1007; a missing node, 500 with error
/// 2018; a URL it does not serve, 404 with a plain-text "Unable find requested URL".
fn delete_outcome(status: StatusCode, body: &[u8]) -> Result<Answered, SlurmError> {
    // an answer that is not slurmrestd's JSON (a plain-text one, a proxy's page) has no errors
    let answer: Answer = serde_json::from_slice(body).unwrap_or_default();
    if matches!(status.as_u16(), 401 | 403 | 511)
        || answer
            .errors
            .iter()
            .any(|e| e.error_number == SLURM_PROTOCOL_AUTHENTICATION_ERROR)
    {
        return Err(SlurmError::Unauthorized);
    }
    if status == StatusCode::NOT_FOUND && body.starts_with(b"Unable find requested URL") {
        return Ok(Answered::PathNotServed);
    }
    if status == StatusCode::NOT_FOUND || answer.errors.iter().any(AnswerError::node_not_found) {
        return Ok(Answered::Node(NodeDeleted::AlreadyGone));
    }
    if status.is_success() && answer.errors.is_empty() {
        return Ok(Answered::Node(NodeDeleted::Deleted));
    }
    let what = answer
        .errors
        .iter()
        .map(|e| {
            let text = if e.description.is_empty() {
                &e.error
            } else {
                &e.description
            };
            format!("{text} (error {})", e.error_number)
        })
        .collect::<Vec<_>>()
        .join("; ");
    Err(SlurmError::Http(if what.is_empty() {
        format!("status {status}")
    } else {
        format!("status {status}: {what}")
    }))
}

/// An error and its sources, one after the other (hyper's own messages are terse).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Where the JWT lies: key `key` of Secret `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretKey {
    /// The Secret's name.
    pub name: String,
    /// The key in its `data`.
    pub key: String,
}

impl std::str::FromStr for SecretKey {
    type Err = TokenError;

    /// `<secret>/<key>`.
    fn from_str(s: &str) -> Result<Self, TokenError> {
        match s.split_once('/') {
            Some((name, key)) if !name.is_empty() && !key.is_empty() && !key.contains('/') => {
                Ok(Self {
                    name: name.to_owned(),
                    key: key.to_owned(),
                })
            }
            _ => Err(TokenError::Ref(s.to_owned())),
        }
    }
}

/// The token could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Not `<secret>/<key>`.
    #[error("{0:?} is not <secret>/<key>")]
    Ref(String),
    /// The API server's answer.
    #[error("reading secret {namespace}/{name}: {source}")]
    Api {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    /// The Secret has no such key.
    #[error("secret {name} has no key {key:?}")]
    MissingKey { name: String, key: String },
    /// A token file that cannot be read.
    #[error("reading {path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
    /// The value is not a usable token.
    #[error("the token in {from}: {reason}")]
    Value { from: String, reason: &'static str },
}

/// Reads the JWT from `secret` in `namespace`.
pub async fn read_token(
    client: kube::Client,
    namespace: &str,
    secret: &SecretKey,
) -> Result<String, TokenError> {
    let api: kube::Api<Secret> = kube::Api::namespaced(client, namespace);
    let s = api
        .get(&secret.name)
        .await
        .map_err(|source| TokenError::Api {
            namespace: namespace.to_owned(),
            name: secret.name.clone(),
            source,
        })?;
    token_from_secret(&s, secret)
}

/// Reads the JWT from a file (as `scontrol token` writes it: `SLURM_JWT=` is taken off).
pub fn read_token_file(path: &std::path::Path) -> Result<String, TokenError> {
    let bytes = std::fs::read(path).map_err(|source| TokenError::File {
        path: path.display().to_string(),
        source,
    })?;
    token_from_bytes(bytes, || format!("file {}", path.display()))
}

/// The token in a Secret's `data` (or `stringData`, as written by hand and not yet stored).
fn token_from_secret(s: &Secret, at: &SecretKey) -> Result<String, TokenError> {
    let bytes = s
        .data
        .as_ref()
        .and_then(|d| d.get(&at.key))
        .map(|b| b.0.clone())
        .or_else(|| {
            s.string_data
                .as_ref()
                .and_then(|d| d.get(&at.key))
                .map(|v| v.clone().into_bytes())
        })
        .ok_or_else(|| TokenError::MissingKey {
            name: at.name.clone(),
            key: at.key.clone(),
        })?;
    token_from_bytes(bytes, || format!("secret {}, key {:?}", at.name, at.key))
}

/// A token as stored: surrounding white space and a `SLURM_JWT=` prefix taken off.
fn token_from_bytes(bytes: Vec<u8>, from: impl Fn() -> String) -> Result<String, TokenError> {
    let value = |reason| TokenError::Value {
        from: from(),
        reason,
    };
    let token = String::from_utf8(bytes).map_err(|_| value("not UTF-8"))?;
    let token = token.trim();
    let token = token.strip_prefix("SLURM_JWT=").unwrap_or(token);
    if token.is_empty() {
        return Err(value("empty"));
    }
    if HeaderValue::from_str(token).is_err() {
        return Err(value("holds characters an HTTP header cannot carry"));
    }
    Ok(token.to_owned())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::convert::Infallible;
    use std::time::Instant;

    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use k8s_openapi::ByteString;
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    use super::*;

    // slurmrestd 24.11's answers (trimmed): a missing node, a token slurmctld rejects
    const NOT_FOUND_BODY: &str = r#"{"errors":[{"description":"Failure to update node nosuch","error_number":2018,"error":"Invalid node name specified","source":"op_handler_node"}],"warnings":[],"meta":{}}"#;
    const BAD_TOKEN_BODY: &str = r#"{"errors":[{"description":"Failure to update node node0","error_number":1007,"error":"Protocol authentication error","source":"op_handler_node"}],"warnings":[]}"#;
    const NOT_SERVED_BODY: &str =
        "Unable find requested URL. Please view /openapi/v3 for API reference.";
    const DELETED_BODY: &str = r#"{"errors":[],"warnings":[],"meta":{}}"#;

    #[test]
    fn delete_outcomes() {
        use NodeDeleted::*;
        let ok = |s, b: &str| delete_outcome(StatusCode::from_u16(s).unwrap(), b.as_bytes());
        for (status, body, want) in [
            (200, DELETED_BODY, Answered::Node(Deleted)),
            (200, "", Answered::Node(Deleted)),
            (404, "", Answered::Node(AlreadyGone)),
            (404, NOT_SERVED_BODY, Answered::PathNotServed),
            (500, NOT_FOUND_BODY, Answered::Node(AlreadyGone)),
            (
                500,
                r#"{"errors":[{"error_number":2018}]}"#,
                Answered::Node(AlreadyGone),
            ),
            (
                200,
                r#"{"errors":[{"error":"invalid node name specified"}]}"#,
                Answered::Node(AlreadyGone),
            ),
        ] {
            assert_eq!(ok(status, body).unwrap(), want, "{status} {body}");
        }
        for (status, body) in [
            (401, "Authentication failure"),
            (403, ""),
            (511, BAD_TOKEN_BODY),
            (500, BAD_TOKEN_BODY),
        ] {
            assert!(
                matches!(ok(status, body), Err(SlurmError::Unauthorized)),
                "{status} {body}"
            );
        }
        for (status, body, want) in [
            (
                500,
                r#"{"errors":[{"description":"Failure to update node node0","error_number":2028,"error":"Invalid node state specified"}]}"#,
                "status 500 Internal Server Error: Failure to update node node0 (error 2028)",
            ),
            (
                200,
                r#"{"errors":[{"error":"Unspecified error","error_number":1}]}"#,
                "status 200 OK: Unspecified error (error 1)",
            ),
            (502, "<html>bad gateway</html>", "status 502 Bad Gateway"),
        ] {
            match ok(status, body) {
                Err(SlurmError::Http(m)) => assert_eq!(m, want),
                other => panic!("{status} {body}: {other:?}"),
            }
        }
    }

    #[test]
    fn node_names() {
        for good in ["node0", "gpu-node-1.example.com", "a_b"] {
            assert!(valid_node_name(good), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "a b", "a?b", "n%2f", &"x".repeat(254)] {
            assert!(!valid_node_name(bad), "{bad}");
        }
    }

    #[test]
    fn secret_key_refs() {
        let r: SecretKey = "slurm-jwt/token".parse().unwrap();
        assert_eq!((r.name.as_str(), r.key.as_str()), ("slurm-jwt", "token"));
        for bad in ["", "token", "/token", "slurm-jwt/", "a/b/c"] {
            assert!(
                matches!(bad.parse::<SecretKey>(), Err(TokenError::Ref(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn tokens_from_secrets() {
        let at: SecretKey = "jwt/token".parse().unwrap();
        let with = |data: Option<&[u8]>, string: Option<&str>| Secret {
            data: data.map(|d| BTreeMap::from([("token".to_owned(), ByteString(d.to_vec()))])),
            string_data: string.map(|s| BTreeMap::from([("token".to_owned(), s.to_owned())])),
            ..Secret::default()
        };
        assert_eq!(
            token_from_secret(&with(Some(b"eyJ.a.b\n"), None), &at).unwrap(),
            "eyJ.a.b"
        );
        assert_eq!(
            token_from_secret(&with(Some(b"SLURM_JWT=eyJ.e.f"), None), &at).unwrap(),
            "eyJ.e.f"
        );
        assert_eq!(
            token_from_secret(&with(None, Some("eyJ.c.d")), &at).unwrap(),
            "eyJ.c.d"
        );
        assert!(matches!(
            token_from_secret(&with(None, None), &at),
            Err(TokenError::MissingKey { .. })
        ));
        for (bad, reason) in [
            (&b"\xff\xfe"[..], "not UTF-8"),
            (b" \n", "empty"),
            (b"SLURM_JWT=", "empty"),
            (b"a\nb", "holds characters an HTTP header cannot carry"),
        ] {
            match token_from_secret(&with(Some(bad), None), &at) {
                Err(e @ TokenError::Value { reason: r, .. }) => {
                    assert_eq!(r, reason);
                    assert!(
                        e.to_string()
                            .starts_with("the token in secret jwt, key \"token\": "),
                        "{e}"
                    );
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn token_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwt");
        std::fs::write(&path, "SLURM_JWT=eyJ.g.h\n").unwrap();
        assert_eq!(read_token_file(&path).unwrap(), "eyJ.g.h");
        let missing = dir.path().join("none");
        assert!(matches!(
            read_token_file(&missing),
            Err(TokenError::File { .. })
        ));
    }

    #[test]
    fn bad_settings() {
        let t = Duration::from_secs(1);
        for url in [
            "https://h:6820",
            "127.0.0.1:6820",
            "http://",
            "http://h:6820/?x=1",
            "not a url",
        ] {
            assert!(
                matches!(
                    Slurmrestd::new(url, "root", "t", t),
                    Err(ConfigError::Url { .. })
                ),
                "{url}"
            );
        }
        assert!(matches!(
            Slurmrestd::new("http://h:6820", "root", "a\nb", t),
            Err(ConfigError::Header { what: "token" })
        ));
    }

    /// What the fake slurmrestd saw of one request.
    #[derive(Debug)]
    struct Seen {
        method: Method,
        path: String,
        user: Option<String>,
        token: Option<String>,
    }

    /// A fake slurmrestd answering every request with `status` and `body`; its URL and what it saw.
    async fn fake(status: u16, body: &'static str) -> (String, mpsc::UnboundedReceiver<Seen>) {
        fake_by_path(move |_| (status, body)).await
    }

    /// A fake slurmrestd whose answer depends on the path.
    async fn fake_by_path(
        answer: impl Fn(&str) -> (u16, &'static str) + Clone + Send + Sync + 'static,
    ) -> (String, mpsc::UnboundedReceiver<Seen>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (tx, answer) = (tx.clone(), answer.clone());
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (status, body) = answer(req.uri().path());
                    let header = |n| {
                        req.headers()
                            .get(n)
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned)
                    };
                    let _ = tx.send(Seen {
                        method: req.method().clone(),
                        path: req.uri().path().to_owned(),
                        user: header("x-slurm-user-name"),
                        token: header("x-slurm-user-token"),
                    });
                    let resp = hyper::Response::builder()
                        .status(status)
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from_static(body.as_bytes())));
                    async move { Ok::<_, Infallible>(resp.unwrap()) }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(conn), svc),
                );
            }
        });
        (url, rx)
    }

    fn client(url: &str, timeout: Duration) -> Slurmrestd {
        Slurmrestd::new(url, "slurm", "eyJ.tok.en", timeout).unwrap()
    }

    #[tokio::test]
    async fn deletes_through_the_v0_0_42_endpoint_with_the_jwt_headers() {
        let (url, mut seen) = fake(200, r#"{"errors":[],"warnings":[]}"#).await;
        let c = client(&format!("{url}/"), Duration::from_secs(5));
        assert_eq!(c.delete_node("node0").await.unwrap(), NodeDeleted::Deleted);
        let s = seen.recv().await.unwrap();
        assert_eq!(s.method, Method::DELETE);
        assert_eq!(s.path, "/slurm/v0.0.42/node/node0");
        assert_eq!(s.user.as_deref(), Some("slurm"));
        assert_eq!(s.token.as_deref(), Some("eyJ.tok.en"));
    }

    #[tokio::test]
    async fn a_new_token_is_sent_from_then_on() {
        let (url, mut seen) = fake(200, DELETED_BODY).await;
        let c = client(&url, Duration::from_secs(5));
        c.delete_node("node0").await.unwrap();
        c.set_token("eyJ.re.newed").unwrap();
        c.delete_node("node0").await.unwrap();
        let tokens = [seen.recv().await.unwrap(), seen.recv().await.unwrap()].map(|s| s.token);
        assert_eq!(
            tokens,
            [Some("eyJ.tok.en".into()), Some("eyJ.re.newed".into())]
        );
        assert!(matches!(
            c.set_token("eyJ\nsplit"),
            Err(ConfigError::Header { what: "token" })
        ));
    }

    /// Deletes `node` through a fake answering `status` and `body`: the outcome, and what it saw.
    async fn delete_via(
        status: u16,
        body: &'static str,
        node: &str,
    ) -> (
        Result<NodeDeleted, SlurmError>,
        mpsc::UnboundedReceiver<Seen>,
    ) {
        let (url, seen) = fake(status, body).await;
        (
            client(&url, Duration::from_secs(5)).delete_node(node).await,
            seen,
        )
    }

    #[tokio::test]
    async fn maps_the_servers_answers() {
        for (status, body) in [(401, ""), (511, BAD_TOKEN_BODY)] {
            let (r, _) = delete_via(status, body, "node0").await;
            assert!(
                matches!(r, Err(SlurmError::Unauthorized)),
                "{status}: {r:?}"
            );
        }
        for (status, body) in [(404, ""), (500, NOT_FOUND_BODY)] {
            let (r, _) = delete_via(status, body, "node0").await;
            assert!(matches!(r, Ok(NodeDeleted::AlreadyGone)), "{status}: {r:?}");
        }
    }

    #[tokio::test]
    async fn falls_back_to_older_api_versions_and_remembers() {
        let (url, mut seen) = fake_by_path(|path| match path.starts_with("/slurm/v0.0.40/") {
            true => (200, DELETED_BODY),
            false => (404, NOT_SERVED_BODY),
        })
        .await;
        let c = client(&url, Duration::from_secs(5));
        for _ in 0..2 {
            assert_eq!(c.delete_node("node0").await.unwrap(), NodeDeleted::Deleted);
        }
        let mut paths = Vec::new();
        while let Ok(s) = seen.try_recv() {
            paths.push(s.path);
        }
        let want = [
            "/slurm/v0.0.42/node/node0",
            "/slurm/v0.0.41/node/node0",
            "/slurm/v0.0.40/node/node0",
        ];
        assert_eq!(paths, [&want[..], &want[2..]].concat());
    }

    #[tokio::test]
    async fn a_server_without_any_node_endpoint_is_an_http_error() {
        let (r, _) = delete_via(404, NOT_SERVED_BODY, "node0").await;
        let want = "v0.0.42, v0.0.41, v0.0.40";
        assert!(
            matches!(r, Err(SlurmError::Http(ref m)) if m.contains(want)),
            "{r:?}"
        );
    }

    #[tokio::test]
    async fn an_invalid_node_name_is_refused_before_any_request() {
        let (r, mut seen) = delete_via(200, "", "../diag").await;
        let want = "invalid node name";
        assert!(
            matches!(r, Err(SlurmError::Http(ref m)) if m.contains(want)),
            "{r:?}"
        );
        assert!(seen.try_recv().is_err(), "a request was sent");
    }

    #[tokio::test]
    async fn a_server_that_never_answers_times_out() {
        // accepts the connection and reads nothing: the request is never answered
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let t = Instant::now();
        let r = client(&url, Duration::from_millis(300))
            .delete_node("node0")
            .await;
        assert!(matches!(r, Err(SlurmError::Timeout)), "{r:?}");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "took {:?}",
            t.elapsed()
        );
        hold.abort();
    }

    #[tokio::test]
    async fn no_server_is_an_http_error() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let r = client(&format!("http://127.0.0.1:{port}"), Duration::from_secs(5))
            .delete_node("node0")
            .await;
        assert!(
            matches!(r, Err(SlurmError::Http(ref m)) if m.contains("onnect")),
            "{r:?}"
        );
    }
}
