//! What a test asks for (a pod, a container) and its translation into CRI v1 configs.

use std::collections::HashMap;

use k8s_cri::v1 as cri;

use crate::{Error, Result};

/// A host-network pod sandbox.
#[derive(Debug, Clone, Default)]
pub struct PodSpec {
    pub name: String,
    pub namespace: String,
    pub labels: HashMap<String, String>,
    pub annotations: HashMap<String, String>,
    /// Cgroup parent of the pod (cgroupfs path); each pod gets `<parent>/<uid>`.
    pub cgroup_parent: String,
}

/// A container in a pod.
#[derive(Debug, Clone, Default)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    pub command: Vec<String>,
    pub privileged: bool,
    pub env: Vec<(String, String)>,
    pub devices: Vec<DeviceSpec>,
    pub cdi_devices: Vec<String>,
    pub mounts: Vec<MountSpec>,
    pub labels: HashMap<String, String>,
    pub annotations: HashMap<String, String>,
}

/// `HOST[:CONTAINER[:PERMISSIONS]]`; paths are node paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    pub host: String,
    pub container: String,
    pub permissions: String,
}

/// `HOST:CONTAINER[:ro][:rslave|:rshared]`; the host path is a node path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    pub host: String,
    pub container: String,
    pub readonly: bool,
    pub propagation: cri::MountPropagation,
}

/// Parses `KEY=VALUE`.
pub fn parse_kv(s: &str) -> Result<(String, String)> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| Error::Parse(format!("expected KEY=VALUE, got {s:?}")))
}

/// Parses `HOST[:CONTAINER[:PERMISSIONS]]`.
pub fn parse_device(s: &str) -> Result<DeviceSpec> {
    let mut it = s.splitn(3, ':');
    let host = it.next().filter(|h| h.starts_with('/'));
    let host =
        host.ok_or_else(|| Error::Parse(format!("device {s:?}: host path must be absolute")))?;
    let container = it.next().filter(|c| !c.is_empty()).unwrap_or(host);
    let permissions = it.next().unwrap_or("rwm");
    Ok(DeviceSpec {
        host: host.to_owned(),
        container: container.to_owned(),
        permissions: permissions.to_owned(),
    })
}

/// Parses `HOST:CONTAINER[:ro][:rslave|:rshared]`.
pub fn parse_mount(s: &str) -> Result<MountSpec> {
    let parts: Vec<&str> = s.split(':').collect();
    let [host, container, opts @ ..] = parts.as_slice() else {
        return Err(Error::Parse(format!(
            "mount {s:?}: expected HOST:CONTAINER[:OPTS]"
        )));
    };
    if !host.starts_with('/') || !container.starts_with('/') {
        return Err(Error::Parse(format!("mount {s:?}: paths must be absolute")));
    }
    let mut m = MountSpec {
        host: (*host).to_owned(),
        container: (*container).to_owned(),
        readonly: false,
        propagation: cri::MountPropagation::PropagationPrivate,
    };
    for o in opts {
        match *o {
            "ro" => m.readonly = true,
            "rw" => m.readonly = false,
            "rslave" => m.propagation = cri::MountPropagation::PropagationHostToContainer,
            "rshared" => m.propagation = cri::MountPropagation::PropagationBidirectional,
            "rprivate" => m.propagation = cri::MountPropagation::PropagationPrivate,
            other => {
                return Err(Error::Parse(format!(
                    "mount {s:?}: unknown option {other:?}"
                )));
            }
        }
    }
    Ok(m)
}

impl PodSpec {
    /// The pod's uid: stable per name, so logs and cgroups are easy to find.
    pub fn uid(&self) -> String {
        format!("mgtb-{}", self.name)
    }

    /// The CRI sandbox config: node network, IPC and PID namespaces off (pod scope), host network on.
    pub fn to_cri(&self) -> cri::PodSandboxConfig {
        let ns = cri::NamespaceOption {
            network: cri::NamespaceMode::Node as i32,
            pid: cri::NamespaceMode::Container as i32,
            ipc: cri::NamespaceMode::Pod as i32,
            ..Default::default()
        };
        let namespace = if self.namespace.is_empty() {
            "default"
        } else {
            &self.namespace
        };
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: self.name.clone(),
                uid: self.uid(),
                namespace: namespace.to_owned(),
                attempt: 0,
            }),
            hostname: String::new(),
            log_directory: format!("/var/log/pods/{namespace}_{}", self.name),
            labels: self.labels.clone(),
            annotations: self.annotations.clone(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: if self.cgroup_parent.is_empty() {
                    String::new()
                } else {
                    format!(
                        "{}/{}",
                        self.cgroup_parent.trim_end_matches('/'),
                        self.uid()
                    )
                },
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(ns),
                    privileged: true,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

impl ContainerSpec {
    /// The CRI container config; the pod's namespace options are repeated as kubelet does.
    pub fn to_cri(&self, attempt: u32) -> cri::ContainerConfig {
        let kv = |(k, v): &(String, String)| cri::KeyValue {
            key: k.clone(),
            value: v.clone(),
        };
        let ns = cri::NamespaceOption {
            network: cri::NamespaceMode::Node as i32,
            pid: cri::NamespaceMode::Container as i32,
            ipc: cri::NamespaceMode::Pod as i32,
            ..Default::default()
        };
        cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: self.name.clone(),
                attempt,
            }),
            image: Some(cri::ImageSpec {
                image: self.image.clone(),
                ..Default::default()
            }),
            command: self.command.clone(),
            envs: self.env.iter().map(kv).collect(),
            mounts: self
                .mounts
                .iter()
                .map(|m| cri::Mount {
                    container_path: m.container.clone(),
                    host_path: m.host.clone(),
                    readonly: m.readonly,
                    propagation: m.propagation as i32,
                    ..Default::default()
                })
                .collect(),
            devices: self
                .devices
                .iter()
                .map(|d| cri::Device {
                    container_path: d.container.clone(),
                    host_path: d.host.clone(),
                    permissions: d.permissions.clone(),
                })
                .collect(),
            cdi_devices: self
                .cdi_devices
                .iter()
                .map(|n| cri::CdiDevice { name: n.clone() })
                .collect(),
            labels: self.labels.clone(),
            annotations: self.annotations.clone(),
            log_path: format!("{}/{attempt}.log", self.name),
            linux: Some(cri::LinuxContainerConfig {
                security_context: Some(cri::LinuxContainerSecurityContext {
                    privileged: self.privileged,
                    namespace_options: Some(ns),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv() {
        assert_eq!(parse_kv("A=b=c").unwrap(), ("A".into(), "b=c".into()));
        assert_eq!(parse_kv("A=").unwrap(), ("A".into(), String::new()));
        assert!(parse_kv("=x").is_err());
        assert!(parse_kv("novalue").is_err());
    }

    #[test]
    fn device() {
        let d = parse_device("/dev/null:/dev/nvidia0").unwrap();
        assert_eq!(
            (
                d.host.as_str(),
                d.container.as_str(),
                d.permissions.as_str()
            ),
            ("/dev/null", "/dev/nvidia0", "rwm")
        );
        let d = parse_device("/dev/fuse").unwrap();
        assert_eq!(d.container, "/dev/fuse");
        assert_eq!(parse_device("/dev/null:/dev/x:r").unwrap().permissions, "r");
        assert!(parse_device("dev/null").is_err());
    }

    #[test]
    fn mount() {
        let m = parse_mount("/etc/slurm:/etc/slurm:ro").unwrap();
        assert!(m.readonly);
        assert_eq!(m.propagation, cri::MountPropagation::PropagationPrivate);
        let m = parse_mount("/run/x:/run/x:rslave").unwrap();
        assert_eq!(
            m.propagation,
            cri::MountPropagation::PropagationHostToContainer
        );
        assert!(parse_mount("/a").is_err());
        assert!(parse_mount("/a:/b:bogus").is_err());
        assert!(parse_mount("a:/b").is_err());
    }

    #[test]
    fn pod_config_is_host_network_with_cgroup_under_parent() {
        let p = PodSpec {
            name: "slurm-0".into(),
            cgroup_parent: "/mgtb".into(),
            ..Default::default()
        };
        let c = p.to_cri();
        let linux = c.linux.unwrap();
        assert_eq!(linux.cgroup_parent, "/mgtb/mgtb-slurm-0");
        let ns = linux.security_context.unwrap().namespace_options.unwrap();
        assert_eq!(ns.network, cri::NamespaceMode::Node as i32);
        assert_eq!(c.metadata.unwrap().namespace, "default");
    }

    #[test]
    fn container_config_carries_everything() {
        let s = ContainerSpec {
            name: "slurmd".into(),
            image: "localhost/slurmd:1".into(),
            privileged: true,
            env: vec![("NVIDIA_VISIBLE_DEVICES".into(), "all".into())],
            devices: vec![parse_device("/dev/null:/dev/nvidia0").unwrap()],
            cdi_devices: vec!["nvidia.com/gpu=0".into()],
            ..Default::default()
        };
        let c = s.to_cri(0);
        assert!(c.linux.unwrap().security_context.unwrap().privileged);
        assert_eq!(c.envs[0].key, "NVIDIA_VISIBLE_DEVICES");
        assert_eq!(c.devices[0].container_path, "/dev/nvidia0");
        assert_eq!(c.cdi_devices[0].name, "nvidia.com/gpu=0");
        assert_eq!(c.log_path, "slurmd/0.log");
    }
}
