//! Plugin configuration: one YAML file (unknown keys rejected), validated, overridable by flags.
//!
//! ```yaml
//! name: mockgpu                 # plugin name, [a-zA-Z0-9_.+-]+
//! index: "10"                   # plugin index, two digits
//! socket: /var/run/nri/nri.sock # runtime socket of the external mode
//! injection:
//!   host_dir: /run/mockgpu      # mount source on the host (holds fs/, lib/, ld.so.preload)
//!   container_dir: /run/mockgpu # mount destination in the container
//!   ld_so_preload: true         # also bind <host_dir>/ld.so.preload onto /etc/ld.so.preload
//!   fail_open: false            # driver tree not ready: inject nothing instead of failing
//!   namespaces: []              # only these pod namespaces (empty: all)
//!   trusted_namespaces: []      # pods here may claim GPUs by NVIDIA_VISIBLE_DEVICES or the
//!                               # inject annotation (empty: no pod may; GPU devices count anywhere)
//!   containers: []              # only these container names (empty: all)
//!   inject_annotation: mockgpu.io/inject  # pod annotation naming containers to treat as GPU holders
//!   skip_annotation: mockgpu.io/skip      # pod annotation "true" opts the pod out
//! ```
//!
//! The runtime's own drop-in (`ConfigureRequest.config`) is merged into this configuration: it
//! may change the policy settings it sets to a non-default value, but never the layout
//! (`host_dir`, `container_dir`, `ld_so_preload`) that the agent wrote its files for; a drop-in
//! that tries is rejected with a message.

use std::path::{Path, PathBuf};

use mockgpu_api::Layout;
use serde::Deserialize;

/// Errors loading or validating the configuration; each names the file and the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The YAML did not parse or had unknown keys or wrong types.
    #[error("invalid config in {origin}: {source}")]
    Parse {
        /// Where the text came from (a path, or the runtime's Configure request).
        origin: String,
        /// Underlying error (says what is wrong and where; boxed, being large).
        source: Box<serde_saphyr::Error>,
    },
    /// The runtime's drop-in sets a layout key to another value than the agent's.
    #[error(
        "invalid config in {origin}: `{key}` is {theirs} there but {ours} in the agent's configuration; the layout cannot be changed by the runtime's plugin configuration"
    )]
    Conflict {
        /// Where the value came from.
        origin: String,
        /// The key, dotted.
        key: &'static str,
        /// The agent's value.
        ours: String,
        /// The drop-in's value.
        theirs: String,
    },
    /// A value is out of range.
    #[error("invalid config in {origin}: `{key}` {reason}")]
    Invalid {
        /// Where the value came from.
        origin: String,
        /// The offending key, dotted.
        key: &'static str,
        /// What is wrong, in words.
        reason: String,
    },
}

/// Local result type of this module.
pub type Result<T, E = ConfigError> = std::result::Result<T, E>;

/// Default runtime socket of external plugins.
pub const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";

/// The whole plugin configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Plugin name registered with the runtime.
    pub name: String,
    /// Plugin index (two digits) registered with the runtime.
    pub index: String,
    /// Runtime socket used in the external mode.
    pub socket: PathBuf,
    /// What to inject and into which containers.
    pub injection: InjectionConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            name: "mockgpu".into(),
            index: "10".into(),
            socket: DEFAULT_SOCKET.into(),
            injection: InjectionConfig::default(),
        }
    }
}

/// The injection policy settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InjectionConfig {
    /// Host directory mounted into GPU-holding containers.
    pub host_dir: PathBuf,
    /// Where that directory appears inside the container.
    pub container_dir: PathBuf,
    /// Bind `<host_dir>/ld.so.preload` onto `/etc/ld.so.preload` (read-only).
    pub ld_so_preload: bool,
    /// Inject nothing (instead of failing the container) while the driver tree is not ready.
    pub fail_open: bool,
    /// Pod namespaces to consider; empty means all.
    pub namespaces: Vec<String>,
    /// Container names to consider; empty means all.
    pub containers: Vec<String>,
    /// Namespaces whose pods may claim GPUs through `NVIDIA_VISIBLE_DEVICES` or the inject
    /// annotation; empty means none (GPU devices granted by Kubernetes count everywhere).
    pub trusted_namespaces: Vec<String>,
    /// Pod annotation whose comma-separated value names containers that get the mock.
    pub inject_annotation: String,
    /// Pod annotation that, set to `true`, opts the whole pod out.
    pub skip_annotation: String,
}

impl Default for InjectionConfig {
    fn default() -> Self {
        Self {
            host_dir: mockgpu_api::layout::DEFAULT_DIR.into(),
            container_dir: mockgpu_api::layout::DEFAULT_DIR.into(),
            ld_so_preload: true,
            fail_open: false,
            namespaces: Vec::new(),
            containers: Vec::new(),
            trusted_namespaces: Vec::new(),
            inject_annotation: "mockgpu.io/inject".into(),
            skip_annotation: "mockgpu.io/skip".into(),
        }
    }
}

impl InjectionConfig {
    /// The layout these settings describe (valid once [`Config::validate`] passed).
    pub fn layout(&self) -> Layout {
        Layout::new(&self.host_dir, &self.container_dir).unwrap_or_default()
    }
}

impl Config {
    /// Reads and parses a YAML file (not yet validated: apply overrides, then [`validate`](Self::validate)).
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses YAML text; `origin` names its source in errors. Empty text gives the defaults.
    /// Only `true` and `false` are booleans; errors are one line ending in
    /// `at line L, column C`; serde-saphyr's default budget bounds hostile input.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let options = serde_saphyr::options! {
            strict_booleans: true,
            with_snippet: false,
        };
        serde_saphyr::from_str_with_options(text, options).map_err(|source| ConfigError::Parse {
            origin: origin.to_owned(),
            source: Box::new(source),
        })
    }

    /// Checks every value; `origin` names the source in errors.
    pub fn validate(&self, origin: &str) -> Result<()> {
        let invalid = |key, reason: &str| {
            Err(ConfigError::Invalid {
                origin: origin.to_owned(),
                key,
                reason: reason.to_owned(),
            })
        };
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.+-".contains(c))
        {
            return invalid("name", "must be non-empty and use only [a-zA-Z0-9_.+-]");
        }
        if self.index.len() != 2 || !self.index.bytes().all(|b| b.is_ascii_digit()) {
            return invalid("index", "must be exactly two digits, e.g. \"10\"");
        }
        if !self.socket.is_absolute() {
            return invalid("socket", "must be an absolute path");
        }
        let inj = &self.injection;
        if !inj.host_dir.is_absolute() || inj.host_dir == Path::new("/") {
            return invalid(
                "injection.host_dir",
                "must be an absolute path other than /",
            );
        }
        if !inj.container_dir.is_absolute() || inj.container_dir == Path::new("/") {
            return invalid(
                "injection.container_dir",
                "must be an absolute path other than /",
            );
        }
        if inj.namespaces.iter().any(String::is_empty) {
            return invalid("injection.namespaces", "must not contain empty names");
        }
        if inj.trusted_namespaces.iter().any(String::is_empty) {
            return invalid(
                "injection.trusted_namespaces",
                "must not contain empty names",
            );
        }
        if inj.containers.iter().any(String::is_empty) {
            return invalid("injection.containers", "must not contain empty names");
        }
        if inj.inject_annotation.is_empty() {
            return invalid("injection.inject_annotation", "must not be empty");
        }
        if inj.skip_annotation.is_empty() {
            return invalid("injection.skip_annotation", "must not be empty");
        }
        Ok(())
    }

    /// The injection settings after merging the runtime's drop-in `text` into these: each
    /// policy key the drop-in sets to a non-default value replaces ours; a layout key set to a
    /// value other than ours is a [`ConfigError::Conflict`].
    pub fn merge_runtime(&self, text: &str, origin: &str) -> Result<InjectionConfig> {
        let theirs = Config::parse(text, origin)?;
        theirs.validate(origin)?;
        let (ours, theirs, default) = (
            &self.injection,
            theirs.injection,
            InjectionConfig::default(),
        );
        let conflict = |key, a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| {
            Err(ConfigError::Conflict {
                origin: origin.to_owned(),
                key,
                ours: format!("{a:?}"),
                theirs: format!("{b:?}"),
            })
        };
        if theirs.host_dir != default.host_dir && theirs.host_dir != ours.host_dir {
            return conflict("injection.host_dir", &ours.host_dir, &theirs.host_dir);
        }
        if theirs.container_dir != default.container_dir
            && theirs.container_dir != ours.container_dir
        {
            return conflict(
                "injection.container_dir",
                &ours.container_dir,
                &theirs.container_dir,
            );
        }
        if theirs.ld_so_preload != default.ld_so_preload
            && theirs.ld_so_preload != ours.ld_so_preload
        {
            return conflict(
                "injection.ld_so_preload",
                &ours.ld_so_preload,
                &theirs.ld_so_preload,
            );
        }
        Ok(InjectionConfig {
            fail_open: set_or(&theirs.fail_open, &default.fail_open, &ours.fail_open),
            namespaces: set_or(&theirs.namespaces, &default.namespaces, &ours.namespaces),
            containers: set_or(&theirs.containers, &default.containers, &ours.containers),
            trusted_namespaces: set_or(
                &theirs.trusted_namespaces,
                &default.trusted_namespaces,
                &ours.trusted_namespaces,
            ),
            inject_annotation: set_or(
                &theirs.inject_annotation,
                &default.inject_annotation,
                &ours.inject_annotation,
            ),
            skip_annotation: set_or(
                &theirs.skip_annotation,
                &default.skip_annotation,
                &ours.skip_annotation,
            ),
            ..ours.clone()
        })
    }
}

/// `theirs` where it differs from the default, else `ours`.
fn set_or<T: PartialEq + Clone>(theirs: &T, default: &T, ours: &T) -> T {
    if theirs != default { theirs } else { ours }.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_text_gives_valid_defaults() {
        let config = Config::parse("", "x").unwrap();
        assert_eq!(config, Config::default());
        config.validate("x").unwrap();
    }

    #[test]
    fn parses_a_full_file() {
        let text = "name: gpu.mock\nindex: \"05\"\nsocket: /tmp/nri.sock\ninjection:\n  host_dir: /opt/m\n  container_dir: /m\n  ld_so_preload: false\n  fail_open: true\n  namespaces: [slurm]\n  containers: [slurmd]\n";
        let config = Config::parse(text, "f.yaml").unwrap();
        config.validate("f.yaml").unwrap();
        assert_eq!(config.index, "05");
        assert_eq!(config.injection.container_dir, Path::new("/m"));
        assert!(config.injection.fail_open && !config.injection.ld_so_preload);
        assert_eq!(config.injection.inject_annotation, "mockgpu.io/inject");
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_name_and_the_file() {
        let err = Config::parse("injection:\n  fail_opn: true\n", "/etc/m.yaml").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("/etc/m.yaml") && msg.contains("fail_opn"),
            "{msg}"
        );
        let ConfigError::Parse { source, .. } = &err else {
            panic!("not a parse error: {err}");
        };
        let at = source.location().map(|l| (l.line(), l.column()));
        assert_eq!(at, Some((2, 3)), "{msg}");
        assert!(msg.ends_with("at line 2, column 3"), "{msg}");
    }

    #[test]
    fn yaml_1_1_booleans_and_deep_nesting_are_refused_with_their_position() {
        let position = |text: &str| match Config::parse(text, "c.yaml") {
            Err(ConfigError::Parse { source, .. }) => {
                source.location().map(|l| (l.line(), l.column()))
            }
            other => panic!("{text:.40}: {other:?}"),
        };
        assert_eq!(position("injection:\n  fail_open: yes\n"), Some((2, 14)));
        let deep = format!("injection:\n  namespaces: {}\n", "[".repeat(100_000));
        assert_eq!(position(&deep).map(|(line, _)| line), Some(2));
    }

    #[test]
    fn the_runtime_merges_policy_but_never_moves_the_layout() {
        let ours = Config::parse(
            "injection:\n  host_dir: /var/lib/m\n  container_dir: /m\n  trusted_namespaces: [slurm]\n",
            "agent",
        )
        .unwrap();
        let merged = ours
            .merge_runtime(
                "injection:\n  fail_open: true\n  containers: [slurmd]\n",
                "rt",
            )
            .unwrap();
        assert_eq!(merged.host_dir, Path::new("/var/lib/m"));
        assert_eq!(merged.container_dir, Path::new("/m"));
        assert!(merged.fail_open);
        assert_eq!(merged.containers, ["slurmd"]);
        assert_eq!(merged.trusted_namespaces, ["slurm"]);
        // Restating the agent's own layout is fine; another one is refused with both values.
        ours.merge_runtime("injection:\n  container_dir: /m\n", "rt")
            .unwrap();
        let err = ours
            .merge_runtime("injection:\n  container_dir: /other\n", "rt")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`injection.container_dir` is \"/other\" there but \"/m\""),
            "{err}"
        );
        let err = ours
            .merge_runtime("injection:\n  ld_so_preload: false\n", "rt")
            .unwrap_err();
        assert!(matches!(
            err,
            ConfigError::Conflict {
                key: "injection.ld_so_preload",
                ..
            }
        ));
        assert!(ours.merge_runtime("injection: {bogus: 1}", "rt").is_err());
    }

    #[test]
    fn invalid_values_name_the_key() {
        let cases: [(&str, &str); 5] = [
            ("name: 'a b'", "`name`"),
            ("index: '1'", "`index`"),
            ("socket: rel/nri.sock", "`socket`"),
            ("injection: {host_dir: run}", "`injection.host_dir`"),
            ("injection: {container_dir: /}", "`injection.container_dir`"),
        ];
        for (text, key) in cases {
            let err = Config::parse(text, "c.yaml")
                .unwrap()
                .validate("c.yaml")
                .unwrap_err()
                .to_string();
            assert!(err.contains(key) && err.contains("c.yaml"), "{text}: {err}");
        }
    }
}
