//! The checks of the runtime's side: its NRI socket, NRI enabled in containerd's configuration
//! and the agent's NRI plugin registered with it.

use std::io;
use std::path::{Path, PathBuf};

use super::{Check, Facts, Node, Options, REAL_NODE, sample};

/// The runtime's NRI socket.
pub(super) fn socket(facts: &Facts) -> Check {
    const NAME: &str = "nri-socket";
    if !facts.mock {
        return Check::skip(NAME, REAL_NODE);
    }
    let path = facts.nri_socket.display();
    match &facts.nri_socket_state {
        Ok(true) => Check::ok(NAME, format!("the runtime's NRI socket is at {path}")),
        Ok(false) => Check::fail(
            NAME,
            format!("{path} is not a socket"),
            "remove it and restart containerd, which creates the socket when NRI is enabled",
        ),
        Err(e) => Check::fail(
            NAME,
            format!("no NRI socket at {path}: {e}"),
            "enable NRI in containerd's configuration (see nri-config) and restart containerd, \
             or pass --nri-socket where it listens",
        ),
    }
}

/// The NRI plugin's id in containerd's configuration (version 2 and 3 files).
const NRI_PLUGIN_ID: &str = "io.containerd.nri.v1.nri";

/// containerd's configuration, as far as NRI is concerned.
pub(super) enum Containerd {
    /// The file cannot be read.
    Unreadable(io::Error),
    /// It is not TOML, or its NRI section is not a table.
    Invalid(String),
    /// The file's `version` and its NRI section, if it has one.
    Parsed {
        version: i64,
        nri: Option<toml::Table>,
    },
}

impl Containerd {
    pub(super) fn read<N: Node>(node: &N, path: &Path) -> Containerd {
        match node.read(path) {
            Ok(raw) => Self::parse(&String::from_utf8_lossy(&raw)),
            Err(e) => Containerd::Unreadable(e),
        }
    }

    fn parse(text: &str) -> Containerd {
        let table: toml::Table = match toml::from_str(text) {
            Ok(t) => t,
            Err(e) => return Containerd::Invalid(e.to_string().trim().replace('\n', " ")),
        };
        // A file without `version` is version 1, whose plugins have short names.
        let version = table
            .get("version")
            .and_then(toml::Value::as_integer)
            .unwrap_or(1);
        let id = if version == 1 { "nri" } else { NRI_PLUGIN_ID };
        match table.get("plugins").and_then(|p| p.get(id)) {
            None => Containerd::Parsed { version, nri: None },
            Some(toml::Value::Table(nri)) => Containerd::Parsed {
                version,
                nri: Some(nri.clone()),
            },
            Some(_) => Containerd::Invalid(format!("plugins.\"{id}\" is not a table")),
        }
    }

    fn nri_bool(&self, key: &str) -> Option<bool> {
        match self {
            Containerd::Parsed { nri: Some(nri), .. } => nri.get(key)?.as_bool(),
            _ => None,
        }
    }

    pub(super) fn socket_path(&self) -> Option<PathBuf> {
        match self {
            Containerd::Parsed { nri: Some(nri), .. } => {
                nri.get("socket_path")?.as_str().map(PathBuf::from)
            }
            _ => None,
        }
    }
}

/// NRI enabled in containerd's configuration.
pub(super) fn config(opts: &Options, facts: &Facts) -> Check {
    const NAME: &str = "nri-config";
    if !facts.mock {
        return Check::skip(NAME, REAL_NODE);
    }
    let path = opts.containerd_config.display();
    let (version, section) = match &facts.containerd {
        Containerd::Unreadable(e) => {
            return Check::skip(
                NAME,
                format!(
                    "no containerd configuration readable at {path}: {e}; containerd's defaults \
                     apply (NRI on in 2.x, off in 1.7), nri-socket tells whether it is on"
                ),
            );
        }
        Containerd::Invalid(e) => {
            return Check::fail(
                NAME,
                format!("cannot parse {path}: {e}"),
                "correct the file: containerd refuses it as well",
            );
        }
        Containerd::Parsed { version, .. } => {
            // Version 3 files quote the id with single quotes, version 2 with double quotes.
            let section = match version {
                1 => "[plugins.nri]".to_string(),
                2 => format!("[plugins.\"{NRI_PLUGIN_ID}\"]"),
                _ => format!("[plugins.'{NRI_PLUGIN_ID}']"),
            };
            (*version, section)
        }
    };
    if facts.containerd.nri_bool("disable_connections") == Some(true) {
        return Check::fail(
            NAME,
            format!(
                "{path} lets no external plugin connect (disable_connections = true in {section})"
            ),
            format!("set disable_connections = false in {section} and restart containerd"),
        );
    }
    match facts.containerd.nri_bool("disable") {
        Some(true) => Check::fail(
            NAME,
            format!("NRI is disabled in {path} (disable = true in {section})"),
            format!("set disable = false in {section} and restart containerd"),
        ),
        Some(false) => Check::ok(NAME, format!("NRI is enabled in {path} ({section})")),
        None if version >= 3 => Check::ok(
            NAME,
            format!("{path} (version {version}, containerd 2.x) leaves NRI at its default: on"),
        ),
        None if matches!(facts.nri_socket_state, Ok(true)) => Check::ok(
            NAME,
            format!(
                "{path} does not set disable in {section}; containerd's default is on here (its NRI socket exists)"
            ),
        ),
        None => Check::fail(
            NAME,
            format!("{path} does not enable NRI, and containerd 1.7 leaves it off by default"),
            format!("add disable = false to {section} in {path} and restart containerd"),
        ),
    }
}

/// The agent's NRI plugin registered with the runtime (its metrics say).
pub(super) fn plugin(opts: &Options, facts: &Facts) -> Check {
    const NAME: &str = "nri-plugin";
    if !facts.mock {
        return Check::skip(NAME, REAL_NODE);
    }
    let addr = opts.health;
    let body = match &facts.metrics {
        Ok(r) if r.status == 200 => &r.body,
        Ok(r) => {
            return Check::fail(
                NAME,
                format!("{addr}/metrics answers {}", r.status),
                "see the agent's log",
            );
        }
        Err(_) => return Check::skip(NAME, format!("no agent answers at {addr} (see agent)")),
    };
    let ready = sample(body, "mockgpu_nri_ready");
    let connected = sample(body, "mockgpu_nri_connected");
    let registrations = sample(body, "mockgpu_nri_registrations_total").unwrap_or(0.0);
    let socket = facts.nri_socket.display();
    match (ready, connected) {
        (None, _) => Check::fail(
            NAME,
            format!(
                "the agent at {addr} runs without its NRI plugin (no mockgpu_nri_ready metric)"
            ),
            format!("start the agent with --nri (or --nri-socket {socket})"),
        ),
        (Some(1.0), _) => Check::ok(
            NAME,
            format!(
                "the agent's NRI plugin is registered with the runtime and synchronized ({registrations} registrations)"
            ),
        ),
        (Some(_), Some(1.0)) => Check::fail(
            NAME,
            "the agent's NRI plugin is connected but not registered and synchronized",
            "see the agent's and containerd's logs",
        ),
        (Some(_), _) => Check::fail(
            NAME,
            "the agent's NRI plugin is not connected to the runtime",
            format!(
                "check that the agent's --nri-socket is the runtime's ({socket}); the plugin reconnects by itself"
            ),
        ),
    }
}
