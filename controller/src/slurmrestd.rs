//! [`SlurmNodes`] over slurmrestd's REST API (Slurm 24.11 serves data_parser v0.0.40 to
//! v0.0.42): `DELETE /slurm/v0.0.42/node/{name}` deletes a node's record; `GET` of the same path
//! reads its state and reason, and `POST` of an `update_node_msg` there (`{"state": ["DRAIN"],
//! "reason": "mockgpu: ..."}`, `{"state": ["RESUME"]}`) drains and resumes it. Requests are
//! authenticated by a JWT (`auth/jwt`) in the `X-SLURM-USER-NAME` / `X-SLURM-USER-TOKEN`
//! headers. slurmrestd speaks plain HTTP; the token is read from a Kubernetes Secret
//! ([`read_token`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::HeaderValue;
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Secret;
use serde::Deserialize;
use serde_json::json;
use tracing::{debug, warn};

use crate::slurm::{Drain, NodeDeleted, Resume, SlurmError, SlurmNodes, reason_is_ours};

/// The data_parser versions of the node endpoint, newest first: Slurm 24.11 serves all three,
/// 24.05 up to v0.0.41, 23.11 up to v0.0.40 (and an operator may load fewer with `slurmrestd -d`).
const API_VERSIONS: [&str; 3] = ["v0.0.42", "v0.0.41", "v0.0.40"];
/// The largest answer read (slurmrestd's answers to a delete are about 1 KiB, a node's
/// description a few).
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
    client: Client<HttpConnector, Full<Bytes>>,
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

    /// Sends one request (with a JSON `body`, if any) and reads its whole answer, within the
    /// timeout.
    async fn send(
        &self,
        method: Method,
        uri: Uri,
        body: Option<&serde_json::Value>,
    ) -> Result<(StatusCode, Bytes), SlurmError> {
        let mut req = Request::builder().method(method).uri(uri);
        if body.is_some() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        let req = req
            .header("X-SLURM-USER-NAME", self.user.clone())
            .header(
                "X-SLURM-USER-TOKEN",
                self.token
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone(),
            )
            .body(Full::new(body))
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

impl Slurmrestd {
    /// Sends `method` (with `body`) to node `name`'s URL in the newest API version this server
    /// serves (remembered), and answers what slurmrestd answered there.
    async fn node_request(
        &self,
        method: Method,
        name: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(StatusCode, Bytes), SlurmError> {
        if !valid_node_name(name) {
            return Err(SlurmError::Http(format!("invalid node name {name:?}")));
        }
        let first = self.version.load(Ordering::Relaxed);
        for (i, version) in API_VERSIONS.iter().enumerate().skip(first) {
            let (status, answer) = self
                .send(method.clone(), self.node_url(version, name)?, body)
                .await?;
            debug!(node = name, version, %method, %status, "slurmrestd: node request");
            if !path_not_served(status, &answer) {
                self.version.store(i, Ordering::Relaxed);
                return Ok((status, answer));
            }
        }
        // a server upgraded meanwhile may serve a newer one again
        self.version.store(0, Ordering::Relaxed);
        Err(SlurmError::Http(format!(
            "slurmrestd serves no node endpoint of {} (its data_parser plugins, `slurmrestd -d`)",
            API_VERSIONS[first..].join(", ")
        )))
    }

    /// Node `name`'s state flags and reason (`None`: no such node).
    async fn node_info(&self, name: &str) -> Result<Option<NodeInfo>, SlurmError> {
        let (status, body) = self.node_request(Method::GET, name, None).await?;
        match node_outcome(status, &body)? {
            NodeDeleted::AlreadyGone => Ok(None),
            NodeDeleted::Deleted => {
                let answer: NodesAnswer = serde_json::from_slice(&body).map_err(|e| {
                    SlurmError::Http(format!("reading node {name}'s description: {e}"))
                })?;
                let mut nodes = answer.nodes;
                let at = nodes.iter().position(|n| n.name == name).unwrap_or(0);
                Ok((at < nodes.len()).then(|| nodes.swap_remove(at)))
            }
        }
    }

    /// Posts `update` (an `update_node_msg`) to node `name`: whether the node existed.
    async fn update_node(
        &self,
        name: &str,
        update: &serde_json::Value,
    ) -> Result<bool, SlurmError> {
        let (status, body) = self.node_request(Method::POST, name, Some(update)).await?;
        Ok(node_outcome(status, &body)? == NodeDeleted::Deleted)
    }
}

/// A node as slurmrestd's `GET /slurm/v0.0.4x/node/{name}` describes it: the part read.
#[derive(Debug, Clone, Default, Deserialize)]
struct NodeInfo {
    #[serde(default)]
    name: String,
    /// The base state and its flags (`["IDLE", "DRAIN"]`).
    #[serde(default)]
    state: Vec<String>,
    /// Why it is drained or down (empty: no reason).
    #[serde(default)]
    reason: String,
}

impl NodeInfo {
    fn drained(&self) -> bool {
        self.state.iter().any(|s| s.eq_ignore_ascii_case("DRAIN"))
    }
}

#[derive(Debug, Default, Deserialize)]
struct NodesAnswer {
    #[serde(default)]
    nodes: Vec<NodeInfo>,
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

impl WithSecretToken {
    /// Reads the token again (a failure keeps the one before, and says so).
    async fn refresh(&self) {
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
    }
}

impl SlurmNodes for WithSecretToken {
    async fn delete_node(&self, name: &str) -> Result<NodeDeleted, SlurmError> {
        self.refresh().await;
        self.rest.delete_node(name).await
    }

    async fn drain_node(&self, name: &str, reason: &str) -> Result<Drain, SlurmError> {
        self.refresh().await;
        self.rest.drain_node(name, reason).await
    }

    async fn resume_node(&self, name: &str) -> Result<Resume, SlurmError> {
        self.refresh().await;
        self.rest.resume_node(name).await
    }
}

impl SlurmNodes for Slurmrestd {
    async fn delete_node(&self, name: &str) -> Result<NodeDeleted, SlurmError> {
        let (status, body) = self.node_request(Method::DELETE, name, None).await?;
        node_outcome(status, &body)
    }

    async fn drain_node(&self, name: &str, reason: &str) -> Result<Drain, SlurmError> {
        let Some(node) = self.node_info(name).await? else {
            return Ok(Drain::NoSuchNode);
        };
        if !node.reason.is_empty() && !reason_is_ours(&node.reason) {
            return Ok(Drain::Foreign(node.reason));
        }
        if node.drained() && node.reason == reason {
            return Ok(Drain::AlreadyDrained);
        }
        let update = json!({"state": ["DRAIN"], "reason": reason});
        Ok(match self.update_node(name, &update).await? {
            true => Drain::Drained,
            false => Drain::NoSuchNode,
        })
    }

    async fn resume_node(&self, name: &str) -> Result<Resume, SlurmError> {
        let Some(node) = self.node_info(name).await? else {
            return Ok(Resume::NoSuchNode);
        };
        if !node.drained() {
            return Ok(Resume::NotDrained);
        }
        if !reason_is_ours(&node.reason) {
            return Ok(Resume::NotOurs(node.reason));
        }
        Ok(
            match self
                .update_node(name, &json!({"state": ["RESUME"]}))
                .await?
            {
                true => Resume::Resumed,
                false => Resume::NoSuchNode,
            },
        )
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

/// Whether slurmrestd's answer says it does not serve the URL (that API version is not loaded):
/// 404 with a plain-text "Unable find requested URL".
fn path_not_served(status: StatusCode, body: &[u8]) -> bool {
    status == StatusCode::NOT_FOUND && body.starts_with(b"Unable find requested URL")
}

/// What slurmrestd's answer to a request about one node (a deletion, a read, an update) at a URL
/// it serves means: `Deleted`, the request succeeded; `AlreadyGone`, there is no such node. A
/// token slurmrestd cannot parse gets 401; one whose signature slurmctld rejects, 511 with error
/// 1007; a missing node, 500 with error 2018 (or 404).
fn node_outcome(status: StatusCode, body: &[u8]) -> Result<NodeDeleted, SlurmError> {
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
    if status == StatusCode::NOT_FOUND || answer.errors.iter().any(AnswerError::node_not_found) {
        return Ok(NodeDeleted::AlreadyGone);
    }
    if status.is_success() && answer.errors.is_empty() {
        return Ok(NodeDeleted::Deleted);
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
    fn node_outcomes() {
        use NodeDeleted::*;
        let code = |s| StatusCode::from_u16(s).unwrap();
        assert!(path_not_served(code(404), NOT_SERVED_BODY.as_bytes()));
        assert!(!path_not_served(code(404), b""));
        assert!(!path_not_served(code(500), NOT_SERVED_BODY.as_bytes()));
        let ok = |s, b: &str| node_outcome(code(s), b.as_bytes());
        for (status, body, want) in [
            (200, DELETED_BODY, Deleted),
            (200, "", Deleted),
            (404, "", AlreadyGone),
            (500, NOT_FOUND_BODY, AlreadyGone),
            (500, r#"{"errors":[{"error_number":2018}]}"#, AlreadyGone),
            (
                200,
                r#"{"errors":[{"error":"invalid node name specified"}]}"#,
                AlreadyGone,
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
        content_type: Option<String>,
        /// The JSON body (`Null`: none).
        body: serde_json::Value,
    }

    /// A fake slurmrestd answering every request with `status` and `body`; its URL and what it saw.
    async fn fake(status: u16, body: &'static str) -> (String, mpsc::UnboundedReceiver<Seen>) {
        fake_by(move |_, _| (status, body)).await
    }

    /// A fake slurmrestd whose answer depends on the path.
    async fn fake_by_path(
        answer: impl Fn(&str) -> (u16, &'static str) + Clone + Send + Sync + 'static,
    ) -> (String, mpsc::UnboundedReceiver<Seen>) {
        fake_by(move |_, path| answer(path)).await
    }

    /// A fake slurmrestd whose answer depends on the method and the path.
    async fn fake_by(
        answer: impl Fn(&Method, &str) -> (u16, &'static str) + Clone + Send + Sync + 'static,
    ) -> (String, mpsc::UnboundedReceiver<Seen>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (tx, answer) = (tx.clone(), answer.clone());
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (tx, answer) = (tx.clone(), answer.clone());
                    async move {
                        let (status, body) = answer(req.method(), req.uri().path());
                        let header = |n| {
                            req.headers()
                                .get(n)
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_owned)
                        };
                        let mut seen = Seen {
                            method: req.method().clone(),
                            path: req.uri().path().to_owned(),
                            user: header("x-slurm-user-name"),
                            token: header("x-slurm-user-token"),
                            content_type: header("content-type"),
                            body: serde_json::Value::Null,
                        };
                        let bytes = req.into_body().collect().await.unwrap().to_bytes();
                        if !bytes.is_empty() {
                            seen.body = serde_json::from_slice(&bytes).expect("a JSON body");
                        }
                        let _ = tx.send(seen);
                        let resp = hyper::Response::builder()
                            .status(status)
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from_static(body.as_bytes())));
                        Ok::<_, Infallible>(resp.unwrap())
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(conn), svc),
                );
            }
        });
        (url, rx)
    }

    /// Everything the fake saw so far.
    fn all_seen(seen: &mut mpsc::UnboundedReceiver<Seen>) -> Vec<Seen> {
        let mut all = Vec::new();
        while let Ok(s) = seen.try_recv() {
            all.push(s);
        }
        all
    }

    // slurmrestd's description of node0 (trimmed): idle, drained by us, drained by an admin,
    // down with an admin's reason
    const IDLE_NODE: &str =
        r#"{"nodes":[{"name":"node0","state":["IDLE"],"reason":""}],"errors":[],"warnings":[]}"#;
    const OUR_DRAIN: &str = r#"{"nodes":[{"name":"node0","state":["IDLE","DRAIN"],"reason":"mockgpu: GPU 1 (GPU-1): Xid 79 (GPU has fallen off the bus.)"}],"errors":[]}"#;
    const ADMIN_DRAIN: &str = r#"{"nodes":[{"name":"node0","state":["MIXED","DRAIN"],"reason":"admin: bad DIMM"}],"errors":[]}"#;
    const ADMIN_DOWN: &str =
        r#"{"nodes":[{"name":"node0","state":["DOWN"],"reason":"admin: cabling"}],"errors":[]}"#;
    const REASON: &str = "mockgpu: GPU 1 (GPU-1): Xid 79 (GPU has fallen off the bus.)";

    /// Drains `node0` with [`REASON`] through a fake whose GET answers `described` (and every
    /// other request [`DELETED_BODY`]): the outcome and the requests as (method, path, body).
    async fn drain_via(
        described: &'static str,
    ) -> (
        Result<Drain, SlurmError>,
        Vec<(Method, String, serde_json::Value)>,
        Vec<Seen>,
    ) {
        let (url, mut seen) = fake_by(move |m, _| match *m == Method::GET {
            true => (200, described),
            false => (200, DELETED_BODY),
        })
        .await;
        let r = client(&url, Duration::from_secs(5))
            .drain_node("node0", REASON)
            .await;
        let all = all_seen(&mut seen);
        let brief = all
            .iter()
            .map(|s| (s.method.clone(), s.path.clone(), s.body.clone()))
            .collect();
        (r, brief, all)
    }

    /// An idle node is read, then drained by a POST of `update_node_msg` with our reason (JSON,
    /// with the JWT headers).
    #[tokio::test]
    async fn drains_an_idle_node_with_our_reason() {
        let (r, requests, all) = drain_via(IDLE_NODE).await;
        assert_eq!(r.unwrap(), Drain::Drained);
        let path = "/slurm/v0.0.42/node/node0".to_string();
        assert_eq!(
            requests,
            [
                (Method::GET, path.clone(), serde_json::Value::Null),
                (
                    Method::POST,
                    path,
                    json!({"state": ["DRAIN"], "reason": REASON})
                ),
            ]
        );
        assert_eq!(all[1].content_type.as_deref(), Some("application/json"));
        assert_eq!(all[1].token.as_deref(), Some("eyJ.tok.en"));
        assert_eq!(all[1].user.as_deref(), Some("slurm"));
    }

    /// A node drained by us with the same reason is left alone; with another reason of ours it
    /// gets the new one; a drain or a down of someone else's is never touched.
    #[tokio::test]
    async fn drains_only_what_is_not_drained_already_or_by_someone_else() {
        let (r, requests, _) = drain_via(OUR_DRAIN).await;
        assert_eq!(r.unwrap(), Drain::AlreadyDrained);
        assert_eq!(requests.len(), 1, "{requests:?}");
        for (described, reason) in [
            (ADMIN_DRAIN, "admin: bad DIMM"),
            (ADMIN_DOWN, "admin: cabling"),
        ] {
            let (r, requests, _) = drain_via(described).await;
            assert_eq!(r.unwrap(), Drain::Foreign(reason.into()));
            assert_eq!(requests.len(), 1, "{requests:?}");
            assert_eq!(requests[0].0, Method::GET);
        }
        const OTHER_OF_OURS: &str = r#"{"nodes":[{"name":"node0","state":["IDLE","DRAIN"],"reason":"mockgpu: GPU 0 (GPU-0): excluded"}]}"#;
        let (r, requests, _) = drain_via(OTHER_OF_OURS).await;
        assert_eq!(r.unwrap(), Drain::Drained);
        assert_eq!(requests[1].2, json!({"state": ["DRAIN"], "reason": REASON}));
    }

    /// Resumes `node0` through a fake whose GET answers `described` (a missing node: 500 with
    /// error 2018): the outcome and the requests.
    async fn resume_via(
        status: u16,
        described: &'static str,
    ) -> (
        Result<Resume, SlurmError>,
        Vec<(Method, String, serde_json::Value)>,
    ) {
        let (url, mut seen) = fake_by(move |m, _| match *m == Method::GET {
            true => (status, described),
            false => (200, DELETED_BODY),
        })
        .await;
        let r = client(&url, Duration::from_secs(5))
            .resume_node("node0")
            .await;
        let all = all_seen(&mut seen);
        (
            r,
            all.into_iter()
                .map(|s| (s.method, s.path, s.body))
                .collect(),
        )
    }

    /// Our drain is resumed (`{"state": ["RESUME"]}`); someone else's drain is not, nor is a node
    /// that is not drained or does not exist: each only read.
    #[tokio::test]
    async fn resumes_only_our_own_drain() {
        let (r, requests) = resume_via(200, OUR_DRAIN).await;
        assert_eq!(r.unwrap(), Resume::Resumed);
        let path = "/slurm/v0.0.42/node/node0".to_string();
        assert_eq!(
            requests,
            [
                (Method::GET, path.clone(), serde_json::Value::Null),
                (Method::POST, path, json!({"state": ["RESUME"]})),
            ]
        );
        let (r, requests) = resume_via(200, ADMIN_DRAIN).await;
        assert_eq!(r.unwrap(), Resume::NotOurs("admin: bad DIMM".into()));
        assert_eq!(requests.len(), 1, "{requests:?}");
        for (status, described, want) in [
            (200, IDLE_NODE, Resume::NotDrained),
            (200, ADMIN_DOWN, Resume::NotDrained),
            (500, NOT_FOUND_BODY, Resume::NoSuchNode),
            (200, r#"{"nodes":[],"errors":[]}"#, Resume::NoSuchNode),
        ] {
            let (r, requests) = resume_via(status, described).await;
            assert_eq!(r.unwrap(), want, "{described}");
            assert_eq!(requests.len(), 1, "{requests:?}");
            assert_eq!(requests[0].0, Method::GET);
        }
    }

    /// A rejected token fails a drain at the read, before any update.
    #[tokio::test]
    async fn a_rejected_token_fails_the_drain() {
        let (url, mut seen) = fake(401, "Authentication failure").await;
        let r = client(&url, Duration::from_secs(5))
            .drain_node("node0", REASON)
            .await;
        assert!(matches!(r, Err(SlurmError::Unauthorized)), "{r:?}");
        let all = all_seen(&mut seen);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].method, Method::GET);
    }

    /// The update goes to the API version the read found served.
    #[tokio::test]
    async fn a_drain_falls_back_to_an_older_api_version() {
        let (url, mut seen) =
            fake_by(
                |m, path| match (path.starts_with("/slurm/v0.0.40/"), *m == Method::GET) {
                    (false, _) => (404, NOT_SERVED_BODY),
                    (true, true) => (200, IDLE_NODE),
                    (true, false) => (200, DELETED_BODY),
                },
            )
            .await;
        let r = client(&url, Duration::from_secs(5))
            .drain_node("node0", REASON)
            .await;
        assert_eq!(r.unwrap(), Drain::Drained);
        let paths: Vec<_> = all_seen(&mut seen)
            .into_iter()
            .map(|s| format!("{} {}", s.method, s.path))
            .collect();
        assert_eq!(
            paths,
            [
                "GET /slurm/v0.0.42/node/node0",
                "GET /slurm/v0.0.41/node/node0",
                "GET /slurm/v0.0.40/node/node0",
                "POST /slurm/v0.0.40/node/node0",
            ]
        );
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
