//! A CRI v1 runtime client over the node's Unix socket: the part of a kubelet the test bed needs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::spec::{ContainerSpec, PodSpec};
use crate::{Error, Result};

/// A connected CRI runtime service.
#[derive(Clone)]
pub struct Cri {
    rt: RuntimeServiceClient<Channel>,
}

/// A started (or only created) container.
#[derive(Debug, Clone)]
pub struct Started {
    pub pod_id: String,
    pub container_id: String,
    /// Host PID of the container's first process (0 when not started).
    pub pid: u32,
    pub create: Duration,
    pub start: Duration,
}

/// The output of an ExecSync.
#[derive(Debug, Clone)]
pub struct ExecOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: i32,
}

/// A container as listed.
#[derive(Debug, Clone)]
pub struct Listed {
    pub id: String,
    pub name: String,
    pub pod_id: String,
    pub state: cri::ContainerState,
}

fn rpc(op: &'static str) -> impl FnOnce(tonic::Status) -> Error {
    move |status| Error::Rpc {
        op,
        status: Box::new(status),
    }
}

impl Cri {
    /// Connects to the runtime's socket; `timeout` bounds every request.
    pub async fn connect(socket: &Path, timeout: Duration) -> Result<Self> {
        let path: PathBuf = socket.to_owned();
        let channel =
            Endpoint::try_from("http://[::]:0")
                .map_err(|e| Error::Connect(socket.to_owned(), e.to_string()))?
                .timeout(timeout)
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                }))
                .await
                .map_err(|e| Error::Connect(socket.to_owned(), e.to_string()))?;
        Ok(Self {
            rt: RuntimeServiceClient::new(channel),
        })
    }

    /// The runtime's name and version.
    pub async fn version(&mut self) -> Result<String> {
        let v = self
            .rt
            .version(cri::VersionRequest {
                version: "v1".into(),
            })
            .await
            .map_err(rpc("Version"))?
            .into_inner();
        Ok(format!(
            "{} {} (CRI {})",
            v.runtime_name, v.runtime_version, v.runtime_api_version
        ))
    }

    /// The id of the ready sandbox named `name`, if any.
    pub async fn find_pod(&mut self, name: &str) -> Result<Option<String>> {
        let pods = self.list_pods().await?;
        Ok(pods
            .into_iter()
            .find(|p| {
                p.state == cri::PodSandboxState::SandboxReady as i32
                    && p.metadata.as_ref().is_some_and(|m| m.name == name)
            })
            .map(|p| p.id))
    }

    /// All sandboxes.
    pub async fn list_pods(&mut self) -> Result<Vec<cri::PodSandbox>> {
        Ok(self
            .rt
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
            .map_err(rpc("ListPodSandbox"))?
            .into_inner()
            .items)
    }

    /// Runs a sandbox, or returns the ready one of that name.
    pub async fn ensure_pod(&mut self, pod: &PodSpec) -> Result<String> {
        if let Some(id) = self.find_pod(&pod.name).await? {
            return Ok(id);
        }
        let r = self
            .rt
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(pod.to_cri()),
                runtime_handler: String::new(),
            })
            .await
            .map_err(rpc("RunPodSandbox"))?;
        Ok(r.into_inner().pod_sandbox_id)
    }

    /// Creates a container in `pod_id`, timing the CreateContainer round trip.
    pub async fn create(
        &mut self,
        pod_id: &str,
        pod: &PodSpec,
        c: &ContainerSpec,
        attempt: u32,
    ) -> Result<(String, Duration)> {
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: pod_id.to_owned(),
            config: Some(c.to_cri(attempt)),
            sandbox_config: Some(pod.to_cri()),
        };
        let t = Instant::now();
        let r = self
            .rt
            .create_container(req)
            .await
            .map_err(rpc("CreateContainer"))?;
        Ok((r.into_inner().container_id, t.elapsed()))
    }

    /// Creates the pod if needed, then creates and (unless `start` is false) starts the container.
    pub async fn up(&mut self, pod: &PodSpec, c: &ContainerSpec, start: bool) -> Result<Started> {
        let pod_id = self.ensure_pod(pod).await?;
        let attempt = self.next_attempt(&pod_id, &c.name).await?;
        let (container_id, create) = self.create(&pod_id, pod, c, attempt).await?;
        let mut started = Started {
            pod_id,
            container_id,
            pid: 0,
            create,
            start: Duration::ZERO,
        };
        if start {
            let t = Instant::now();
            self.rt
                .start_container(cri::StartContainerRequest {
                    container_id: started.container_id.clone(),
                })
                .await
                .map_err(rpc("StartContainer"))?;
            started.start = t.elapsed();
            started.pid = self.pid(&started.container_id).await?;
        }
        Ok(started)
    }

    /// One more than the highest attempt of a container of that name in the pod.
    async fn next_attempt(&mut self, pod_id: &str, name: &str) -> Result<u32> {
        let all = self.list_containers(Some(pod_id)).await?;
        let mut next = 0;
        for c in all.iter().filter(|c| c.name == name) {
            let st = self.status(&c.id).await?;
            let attempt = st
                .status
                .and_then(|s| s.metadata)
                .map(|m| m.attempt)
                .unwrap_or(0);
            next = next.max(attempt + 1);
        }
        Ok(next)
    }

    /// Containers, optionally of one pod.
    pub async fn list_containers(&mut self, pod_id: Option<&str>) -> Result<Vec<Listed>> {
        let filter = pod_id.map(|p| cri::ContainerFilter {
            pod_sandbox_id: p.to_owned(),
            ..Default::default()
        });
        let items = self
            .rt
            .list_containers(cri::ListContainersRequest { filter })
            .await
            .map_err(rpc("ListContainers"))?
            .into_inner()
            .containers;
        Ok(items
            .into_iter()
            .map(|c| Listed {
                name: c.metadata.map(|m| m.name).unwrap_or_default(),
                state: cri::ContainerState::try_from(c.state)
                    .unwrap_or(cri::ContainerState::ContainerUnknown),
                id: c.id,
                pod_id: c.pod_sandbox_id,
            })
            .collect())
    }

    async fn status(&mut self, id: &str) -> Result<cri::ContainerStatusResponse> {
        Ok(self
            .rt
            .container_status(cri::ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: true,
            })
            .await
            .map_err(rpc("ContainerStatus"))?
            .into_inner())
    }

    /// Host PID of a running container (containerd's verbose status `info.pid`).
    pub async fn pid(&mut self, id: &str) -> Result<u32> {
        let st = self.status(id).await?;
        let info = st
            .info
            .get("info")
            .ok_or_else(|| Error::Status(id.to_owned(), "no verbose info".into()))?;
        let v: serde_json::Value =
            serde_json::from_str(info).map_err(|e| Error::Status(id.to_owned(), e.to_string()))?;
        v.get("pid")
            .and_then(serde_json::Value::as_u64)
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| Error::Status(id.to_owned(), "no pid in verbose info".into()))
    }

    /// Resolves a container id, unique id prefix, or the name of a unique running container.
    pub async fn resolve(&mut self, what: &str) -> Result<String> {
        let all = self.list_containers(None).await?;
        let by_id: Vec<&Listed> = all.iter().filter(|c| c.id.starts_with(what)).collect();
        let by_name: Vec<&Listed> = all
            .iter()
            .filter(|c| c.name == what && c.state == cri::ContainerState::ContainerRunning)
            .collect();
        match (by_id.as_slice(), by_name.as_slice()) {
            ([c], _) | ([], [c]) => Ok(c.id.clone()),
            ([], []) => Err(Error::NotFound(what.to_owned())),
            _ => Err(Error::Ambiguous(what.to_owned())),
        }
    }

    /// Runs a command in a container and collects its output.
    pub async fn exec(&mut self, id: &str, cmd: &[String], timeout_s: i64) -> Result<ExecOutput> {
        let r = self
            .rt
            .exec_sync(cri::ExecSyncRequest {
                container_id: id.to_owned(),
                cmd: cmd.to_vec(),
                timeout: timeout_s,
            })
            .await
            .map_err(rpc("ExecSync"))?
            .into_inner();
        Ok(ExecOutput {
            stdout: r.stdout,
            stderr: r.stderr,
            exit_code: r.exit_code,
        })
    }

    /// Stops (grace `timeout_s`) and removes a container.
    pub async fn remove_container(&mut self, id: &str, timeout_s: i64) -> Result<()> {
        self.rt
            .stop_container(cri::StopContainerRequest {
                container_id: id.to_owned(),
                timeout: timeout_s,
            })
            .await
            .map_err(rpc("StopContainer"))?;
        self.rt
            .remove_container(cri::RemoveContainerRequest {
                container_id: id.to_owned(),
            })
            .await
            .map_err(rpc("RemoveContainer"))?;
        Ok(())
    }

    /// Stops and removes a sandbox with all its containers.
    pub async fn remove_pod(&mut self, id: &str) -> Result<()> {
        self.rt
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            })
            .await
            .map_err(rpc("StopPodSandbox"))?;
        self.rt
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            })
            .await
            .map_err(rpc("RemovePodSandbox"))?;
        Ok(())
    }

    /// CreateContainer round trips of `n` creations in a fresh pod, after `warmup` unmeasured
    /// ones; each container is removed again without being started, and so is the pod.
    pub async fn create_latency(
        &mut self,
        pod: &PodSpec,
        c: &ContainerSpec,
        warmup: usize,
        n: usize,
    ) -> Result<Vec<Duration>> {
        let pod_id = self.ensure_pod(pod).await?;
        let mut sample = Vec::with_capacity(n);
        let mut run = async || {
            for i in 0..warmup + n {
                let (id, took) = self
                    .create(&pod_id, pod, c, u32::try_from(i).unwrap_or(u32::MAX))
                    .await?;
                self.remove_container(&id, 0).await?;
                if i >= warmup {
                    sample.push(took);
                }
            }
            Ok::<_, Error>(())
        };
        let result = run().await;
        let cleanup = self.remove_pod(&pod_id).await;
        result.and(cleanup).map(|()| sample)
    }

    /// Removes the named (or id-prefixed) sandboxes, or all of them when `which` is empty; returns
    /// how many were removed.
    pub async fn down(&mut self, which: &[String]) -> Result<usize> {
        let pods = self.list_pods().await?;
        let mut n = 0;
        for p in pods {
            let name = p
                .metadata
                .as_ref()
                .map(|m| m.name.as_str())
                .unwrap_or_default();
            if which.is_empty()
                || which
                    .iter()
                    .any(|w| w == name || p.id.starts_with(w.as_str()))
            {
                self.remove_pod(&p.id).await?;
                n += 1;
            }
        }
        Ok(n)
    }
}
