//! The API server behind [`GpuNodes`]: credentials (in-cluster, `KUBECONFIG`, `--kubeconfig`),
//! server-side apply of the GpuNode and its status, and the reads `doctor` makes.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use mockgpu_api::gpunode::{AGENT_MANAGER, GpuNode, GpuNodeStatus};
use tokio::sync::OnceCell;

use super::{ApiError, GpuNodes};

/// How long one request may take before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// Where the API server's address and credentials come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// A kubeconfig file (`--kubeconfig`).
    Kubeconfig(PathBuf),
    /// `KUBECONFIG` or `~/.kube/config`, else the pod's service account.
    Infer,
}

/// The credentials to use, or `None` when nothing names an API server: a `--kubeconfig`
/// (`flag`), else `KUBECONFIG`, the in-cluster `KUBERNETES_SERVICE_HOST`, or an existing
/// `~/.kube/config` (`home_config`). `env` reads a variable.
pub fn credentials(
    flag: Option<&Path>,
    env: impl Fn(&str) -> Option<OsString>,
    home_config: Option<&Path>,
) -> Option<Credentials> {
    let set = |name: &str| env(name).is_some_and(|v| !v.is_empty());
    if let Some(path) = flag {
        Some(Credentials::Kubeconfig(path.to_path_buf()))
    } else if set("KUBECONFIG")
        || set("KUBERNETES_SERVICE_HOST")
        || home_config.is_some_and(Path::is_file)
    {
        Some(Credentials::Infer)
    } else {
        None
    }
}

/// [`credentials`] from this process' environment.
pub fn credentials_from_env(flag: Option<&Path>) -> Option<Credentials> {
    let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".kube/config"));
    credentials(flag, |name| std::env::var_os(name), home.as_deref())
}

impl Credentials {
    /// A client for the API server; reads the files each time, so a kubeconfig or a token that
    /// appears later is found.
    pub async fn client(&self) -> Result<Client, ApiError> {
        let mut config = match self {
            Credentials::Kubeconfig(path) => {
                let kubeconfig = Kubeconfig::read_from(path).map_err(|e| {
                    ApiError(format!("cannot read kubeconfig {}: {e}", path.display()))
                })?;
                Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                    .await
                    .map_err(|e| ApiError(format!("invalid kubeconfig {}: {e}", path.display())))?
            }
            Credentials::Infer => Config::infer()
                .await
                .map_err(|e| ApiError(format!("no usable Kubernetes credentials: {e}")))?,
        };
        config.read_timeout = Some(REQUEST_TIMEOUT);
        Client::try_from(config)
            .map_err(|e| ApiError(format!("cannot build a Kubernetes client: {e}")))
    }

    /// A client, tried again every `retry` until one is made (a failure logged as what `task`
    /// cannot do yet); `None` when `stop` completes first.
    pub async fn client_until<F: std::future::Future<Output = ()>>(
        &self,
        task: &str,
        retry: std::time::Duration,
        mut stop: std::pin::Pin<&mut F>,
    ) -> Option<Client> {
        loop {
            match self.client().await {
                Ok(c) => return Some(c),
                Err(e) => {
                    tracing::warn!(error = %e, "{task}: no API server yet; retrying");
                    tokio::select! {
                        _ = stop.as_mut() => return None,
                        _ = tokio::time::sleep(retry) => {}
                    }
                }
            }
        }
    }
}

/// The API server, reached with [`Credentials`]; the client is made at the first request that
/// can make it (a failure is one more error to retry).
pub struct Live {
    credentials: Credentials,
    client: OnceCell<Client>,
}

impl Live {
    /// The API server `credentials` name.
    pub fn new(credentials: Credentials) -> Live {
        Live {
            credentials,
            client: OnceCell::new(),
        }
    }

    async fn client(&self) -> Result<Client, ApiError> {
        self.client
            .get_or_try_init(|| self.credentials.client())
            .await
            .cloned()
    }

    /// The Node `name`, if it exists.
    pub async fn node(&self, name: &str) -> Result<Option<Node>, ApiError> {
        Api::<Node>::all(self.client().await?)
            .get_opt(name)
            .await
            .map_err(|e| ApiError(format!("cannot get node {name}: {e}")))
    }

    async fn gpunodes(&self) -> Result<Api<GpuNode>, ApiError> {
        Ok(Api::all(self.client().await?))
    }
}

fn apply_params() -> PatchParams {
    PatchParams::apply(AGENT_MANAGER).force()
}

impl GpuNodes for Live {
    async fn node_uid(&self, name: &str) -> Result<String, ApiError> {
        self.node(name)
            .await?
            .ok_or_else(|| ApiError(format!("node {name} not found")))?
            .metadata
            .uid
            .ok_or_else(|| ApiError(format!("node {name} has no uid")))
    }

    async fn get(&self, name: &str) -> Result<Option<GpuNode>, ApiError> {
        self.gpunodes()
            .await?
            .get_opt(name)
            .await
            .map_err(|e| ApiError(format!("cannot get GpuNode {name}: {e}")))
    }

    async fn apply(&self, object: &GpuNode) -> Result<String, ApiError> {
        let name = object.metadata.name.clone().unwrap_or_default();
        let applied = self
            .gpunodes()
            .await?
            .patch(&name, &apply_params(), &Patch::Apply(object))
            .await
            .map_err(|e| ApiError(format!("cannot apply GpuNode {name}: {e}")))?;
        Ok(applied.metadata.uid.unwrap_or_default())
    }

    async fn apply_status(
        &self,
        name: &str,
        status: &GpuNodeStatus,
        resource_version: Option<&str>,
    ) -> Result<bool, ApiError> {
        // with a resourceVersion, the API server refuses the apply (409) once the object changed
        let mut metadata = serde_json::json!({"name": name});
        if let Some(version) = resource_version {
            metadata["resourceVersion"] = version.into();
        }
        let body = serde_json::json!({
            "apiVersion": "mockgpu.io/v1alpha1",
            "kind": "GpuNode",
            "metadata": metadata,
            "status": status,
        });
        let api = self.gpunodes().await?;
        match api
            .patch_status(name, &apply_params(), &Patch::Apply(body))
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 && resource_version.is_some() => Ok(false),
            Err(e) => Err(ApiError(format!(
                "cannot apply the status of GpuNode {name}: {e}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_from_the_flag_the_environment_or_a_home_kubeconfig() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("config");
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        let flag = Path::new("/etc/k/agent.kubeconfig");
        assert_eq!(
            credentials(Some(flag), env(&[]), None),
            Some(Credentials::Kubeconfig(flag.into()))
        );
        assert_eq!(credentials(None, env(&[]), Some(&home)), None);
        assert_eq!(credentials(None, env(&[("KUBECONFIG", "")]), None), None);
        for vars in [
            &[("KUBECONFIG", "/k")][..],
            &[("KUBERNETES_SERVICE_HOST", "10.0.0.1")][..],
        ] {
            assert_eq!(
                credentials(None, env(vars), None),
                Some(Credentials::Infer),
                "{vars:?}"
            );
        }
        std::fs::write(&home, "apiVersion: v1\n").unwrap();
        assert_eq!(
            credentials(None, env(&[]), Some(&home)),
            Some(Credentials::Infer)
        );
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_is_an_error_naming_it() {
        let e = Credentials::Kubeconfig("/nonexistent/agent.kubeconfig".into())
            .client()
            .await
            .err()
            .unwrap();
        assert!(
            e.0.starts_with("cannot read kubeconfig /nonexistent/agent.kubeconfig: "),
            "{e}"
        );
    }
}
