#!/usr/bin/env bash
# chart.sh - the Helm chart (charts/mockgpu) with the real Helm CLI (tests/build-k8s.sh): `helm lint
# --strict` and `helm template` with the default values and each value set in charts/mockgpu/ci/,
# the fields that matter asserted with jq (privileges, host paths, mount propagation, probes, the
# rollout, RBAC verbs, the admission policies, DRA's DeviceClasses and kubelet plugin directories);
# invalid values rejected by values.schema.json with a readable error; docs/configuration.md up to
# date. No cluster: the test bed's cluster mode
# applies the same value sets to the real API server (`chart-dry-run`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tests/apt-ensure.sh jq python3 python3-yaml
K8S_BIN=${K8S_BIN:-$(bash tests/build-k8s.sh --print-dir)}
HELM=${HELM:-$K8S_BIN/helm}
[ -x "$HELM" ] || { echo "chart.sh: no helm at $HELM (run tests/build-k8s.sh)" >&2; exit 1; }
C=charts/mockgpu
REL=mg NS=mockgpu-system F=mg-mockgpu
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
bad=0 n=0

# jq definitions over the rendered objects (an array)
PRELUDE='
def obj(k; n): [.[] | select(.kind == k and .metadata.name == n)]
  | if length == 1 then .[0] else error("want one \(k) \(n), found \(length)") end;
def kinds(k): [.[] | select(.kind == k)];
def ds(n): obj("DaemonSet"; "'$F'-agent-" + n);
def pod: .spec.template.spec;
def ctr(n): [(.initContainers // [])[], .containers[] | select(.name == n)] | first;
def env(n): [.env[]? | select(.name == n) | .value] | first;
def mount(n): [.volumeMounts[] | select(.name == n)] | first;
def vol(n): [.volumes[] | select(.name == n)] | first;
def rules: .rules | map({g: .apiGroups, r: .resources, v: (.verbs | sort), n: .resourceNames});
'

# want <rendered.json> <what> <jq expression that is true>
want() {
  n=$((n + 1))
  if ! jq -e "$PRELUDE $3" "$1" > /dev/null 2> "$T/err"; then
    echo "chart.sh: $(basename "$1" .json): $2: not so ($3) $(cat "$T/err")" >&2
    bad=$((bad + 1))
  fi
}

# YAML documents to a JSON array, read as YAML 1.1 (PyYAML) like the API server's decoder, so
# that an unquoted `off` or `yes` is the boolean Kubernetes would see
yaml2json() {
  python3 -c 'import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d is not None], default=str))'
}

# render <name> [helm args]: helm template into $T/<name>.json (an array of objects)
render() {
  local name=$1; shift
  "$HELM" lint --strict "$C" "$@" > "$T/lint" || { cat "$T/lint" >&2; echo "chart.sh: helm lint --strict ($name) failed" >&2; exit 1; }
  "$HELM" template "$REL" "$C" --namespace "$NS" --include-crds "$@" > "$T/$name.yaml"
  yaml2json < "$T/$name.yaml" > "$T/$name.json"
  want "$T/$name.json" "every env value a string (as the API server decodes it)" \
    '[.. | objects | select(has("env")) | .env[] | select(has("value")) | .value | type == "string"] | all'
  echo "chart.sh: $name: $(jq -r 'map(.kind) | group_by(.) | map("\(length) \(.[0])") | join(", ")' "$T/$name.json")"
}

# --- the default values
render default
D=$T/default.json
want "$D" "one agent DaemonSet, the controller, the two policies (GpuNodes, GpuFaults), the test pod" \
  '(kinds("DaemonSet") | length) == 1 and (kinds("Deployment") | length) == 1
   and (kinds("ValidatingAdmissionPolicy") | length) == 2 and (kinds("ValidatingAdmissionPolicyBinding") | length) == 2
   and (kinds("Pod") | length) == 1 and (kinds("ConfigMap") | length) == 0'
want "$D" "the GpuNode CRD (crds/, generated from the controller): cluster-scoped, with a status subresource" \
  'obj("CustomResourceDefinition"; "gpunodes.mockgpu.io").spec | .group == "mockgpu.io" and .scope == "Cluster"
   and .names.kind == "GpuNode" and ([.versions[] | select(.name == "v1alpha1") | .subresources.status] | length) == 1'
want "$D" "the ComputeDomain CRD (crds/, from api::dra, whatever agent.dra says): NVIDIA's group, namespaced, with a status subresource" \
  'obj("CustomResourceDefinition"; "computedomains.resource.nvidia.com").spec | .group == "resource.nvidia.com"
   and .scope == "Namespaced" and .names == {kind: "ComputeDomain", plural: "computedomains", singular: "computedomain"}
   and ([.versions[] | select(.name == "v1beta1" and .served and .storage) | .subresources.status] | length) == 1
   and (.versions[0].schema.openAPIV3Schema.properties.spec | .required == ["channel", "numNodes"]
     and .properties.channel.properties.allocationMode.enum == ["Single", "All"])'
want "$D" "DRA off: no DeviceClass, no ResourceSlice policy, no DRA environment or kubelet plugin directories" \
  '(kinds("DeviceClass") | length) == 0
   and ([.[] | select(.kind | startswith("ValidatingAdmissionPolicy")) | select(.metadata.name | endswith("resourceslices"))] | length) == 0
   and (ds("default") | pod | vol("plugins") == null and vol("plugins-registry") == null and vol("cdi") == null
     and (ctr("agent") | env("MOCKGPU_DRA_GPUS") == null and env("MOCKGPU_DRA_COMPUTE_DOMAINS") == null and env("MOCKGPU_CDI_DIR") == null
       and mount("plugins") == null and mount("plugins-registry") == null and mount("cdi") == null))'
want "$D" "rollout: a new agent before the old one stops" \
  'ds("default").spec.updateStrategy == {type: "RollingUpdate", rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}'
want "$D" "the agent's own pods opt out of injection (privileged, they see the node's GPU devices)" \
  'ds("default").spec.template.metadata.annotations["mockgpu.io/skip"] == "true"'
want "$D" "agent and keeper privileged, the agent image's binary" \
  'ds("default") | pod | (ctr("agent").securityContext.privileged == true and ctr("keeper").securityContext.privileged == true
   and ctr("agent").command == ["/usr/bin/mockgpu-agent", "serve"] and ctr("keeper").command == ["/usr/bin/mockgpu-agent", "keeper", "--idle-after-handover"])'
want "$D" "host paths" \
  'ds("default") | pod | (vol("run-mockgpu").hostPath.path == "/run/mockgpu" and vol("dev-fuse").hostPath == {path: "/dev/fuse", type: "CharDevice"}
   and vol("sys").hostPath.path == "/sys" and vol("nri").hostPath.path == "/var/run/nri"
   and vol("device-plugins").hostPath.path == "/var/lib/kubelet/device-plugins")'
want "$D" "the keeper a native sidecar that is started once its socket listens" \
  'ds("default") | pod | ([.initContainers[] | select(.name == "keeper")] | length) == 1
   and ctr("keeper").restartPolicy == "Always" and (ctr("keeper").startupProbe.exec.command | join(" ") | test("keeper.sock"))'
want "$D" "the keeper socket's directory beside /run/mockgpu, in agent and keeper, on the host" \
  'ds("default") | pod | vol("keeper").hostPath.path == "/run/mockgpu-keeper"
   and (ctr("agent") | mount("keeper").mountPath) == "/run/mockgpu-keeper"
   and (ctr("keeper") | mount("keeper").mountPath) == "/run/mockgpu-keeper"'
want "$D" "/run/mockgpu Bidirectional in agent and keeper, /sys read-only" \
  'ds("default") | pod | (ctr("agent") | mount("run-mockgpu").mountPropagation == "Bidirectional" and mount("sys").readOnly == true
   and mount("nri").mountPath == "/var/run/nri" and mount("dev-fuse").mountPath == "/dev/fuse")
   and (ctr("keeper") | mount("run-mockgpu").mountPropagation == "Bidirectional")'
want "$D" "probes on the health port" \
  'ds("default") | pod | ctr("agent") | (.livenessProbe.httpGet == {path: "/healthz", port: 9464}
   and .readinessProbe.httpGet == {path: "/readyz", port: 9464} and .startupProbe.httpGet.path == "/healthz")'
want "$D" "agent environment: node name from the pod, built-in profile, NRI, keeper, report" \
  'ds("default") | pod | ctr("agent") | ((.env[] | select(.name == "MOCKGPU_NODE_NAME") | .valueFrom.fieldRef.fieldPath) == "spec.nodeName"
   and env("MOCKGPU_PROFILE") == "gb300" and env("MOCKGPU_PROFILE_FILE") == null
   and env("MOCKGPU_NRI_SOCKET") == "/var/run/nri/nri.sock" and env("MOCKGPU_LISTEN") == "0.0.0.0:9464"
   and env("MOCKGPU_KEEPER") == "auto" and env("MOCKGPU_REPORT") == "auto" and env("MOCKGPU_HEARTBEAT") == "30"
   and env("MOCKGPU_TRUSTED_NAMESPACES") == null)'
want "$D" "the device plugin on by default (no GPU Operator needed), nvidia.com/gpu, the kubelet's directory" \
  'ds("default") | pod | ctr("agent") | env("MOCKGPU_DEVICE_PLUGIN") == "true" and env("MOCKGPU_RESOURCE_NAME") == "nvidia.com/gpu"
   and env("MOCKGPU_KUBELET_DIR") == "/var/lib/kubelet" and mount("device-plugins").mountPath == "/var/lib/kubelet/device-plugins"'
want "$D" "the agent tolerates every taint (a node tainted for Slurm workers keeps its GPUs)" \
  'ds("default") | pod | .tolerations == [{operator: "Exists"}]'
want "$D" "the controller tolerates nothing extra" \
  'obj("Deployment"; "'$F'-controller") | pod | has("tolerations") | not'
want "$D" "on the node network no container port (it would be a host port, blocking the surge pod)" \
  'ds("default") | pod | .hostNetwork == true and ([.containers[].ports // [] | length] | add) == 0'
want "$D" "agent RBAC: exactly its own verbs" \
  'obj("ClusterRole"; "'$F'-agent") | rules == [
     {g: ["mockgpu.io"], r: ["gpunodes"], v: ["create", "get", "patch", "update"], n: null},
     {g: ["mockgpu.io"], r: ["gpunodes/status"], v: ["get", "patch", "update"], n: null},
     {g: ["mockgpu.io"], r: ["gpufaults"], v: ["get", "list", "watch"], n: null},
     {g: ["mockgpu.io"], r: ["gpufaults/status"], v: ["patch"], n: null},
     {g: [""], r: ["nodes"], v: ["get"], n: null},
     {g: ["events.k8s.io"], r: ["events"], v: ["create", "patch"], n: null}]'
want "$D" "controller RBAC: exactly its verbs, no Secret without remediation" \
  'obj("ClusterRole"; "'$F'-controller") | rules == [
     {g: ["mockgpu.io"], r: ["gpunodes"], v: ["get", "list", "watch"], n: null},
     {g: ["mockgpu.io"], r: ["gpunodes/status"], v: ["patch", "update"], n: null},
     {g: ["mockgpu.io"], r: ["gpufaults"], v: ["create", "delete", "get", "list", "watch"], n: null},
     {g: [""], r: ["nodes"], v: ["get", "list", "patch", "watch"], n: null},
     {g: [""], r: ["nodes/status"], v: ["patch"], n: null},
     {g: [""], r: ["pods"], v: ["delete", "get", "list", "watch"], n: null},
     {g: ["events.k8s.io"], r: ["events"], v: ["create", "patch"], n: null},
     {g: ["resource.nvidia.com"], r: ["computedomains"], v: ["get", "list", "patch", "watch"], n: null},
     {g: ["resource.nvidia.com"], r: ["computedomains/status"], v: ["patch"], n: null},
     {g: ["resource.k8s.io"], r: ["resourceclaimtemplates"], v: ["create", "get", "list", "patch", "watch"], n: null}]'
want "$D" "uninstall cleanup: a post-delete Job running mockgpu-controller cleanup, with exactly its verbs" \
  'obj("ClusterRole"; "'$F'-cleanup") | rules == [
     {g: ["mockgpu.io"], r: ["gpunodes"], v: ["delete", "list"], n: null},
     {g: [""], r: ["nodes"], v: ["list", "patch"], n: null}]
   and .metadata.annotations["helm.sh/hook"] == "post-delete"'
want "$D" "helm test: doctor as the agent's service account, on the node's name" \
  'obj("Pod"; "'$F'-doctor") | .metadata.annotations["helm.sh/hook"] == "test"
   and .spec.serviceAccountName == "'$F'-agent" and (.spec.automountServiceAccountToken // true)
   and (.spec.containers[0].env | map(select(.name == "MOCKGPU_NODE_NAME"))[0].valueFrom.fieldRef.fieldPath == "spec.nodeName")'
want "$D" "uninstall cleanup Job" \
  'obj("Job"; "'$F'-cleanup") | .metadata.annotations["helm.sh/hook"] == "post-delete"
   and (pod | .serviceAccountName == "'$F'-cleanup" and .securityContext.runAsNonRoot == true
        and ctr("cleanup").command == ["/usr/bin/mockgpu-controller", "cleanup"])'
want "$D" "controller Role: the Lease only" \
  'obj("Role"; "'$F'-controller") | .metadata.namespace == "'$NS'" and rules == [
     {g: ["coordination.k8s.io"], r: ["leases"], v: ["create", "get", "update"], n: null}]'
want "$D" "bindings name the service accounts" \
  '(obj("ClusterRoleBinding"; "'$F'-agent").subjects == [{kind: "ServiceAccount", name: "'$F'-agent", namespace: "'$NS'"}])
   and (obj("ClusterRoleBinding"; "'$F'-controller").subjects[0].name == "'$F'-controller")
   and (obj("RoleBinding"; "'$F'-controller").roleRef.name == "'$F'-controller")
   and (ds("default") | pod | .serviceAccountName == "'$F'-agent")'
want "$D" "controller: 2 replicas, non-root 65532, read-only root, probes, its environment" \
  'obj("Deployment"; "'$F'-controller") | .spec.replicas == 2 and (pod | .securityContext.runAsUser == 65532 and .securityContext.runAsNonRoot == true
   and .serviceAccountName == "'$F'-controller"
   and (ctr("controller") | .command == ["/usr/bin/mockgpu-controller", "run"] and .securityContext.readOnlyRootFilesystem == true
     and .securityContext.allowPrivilegeEscalation == false and .securityContext.capabilities.drop == ["ALL"]
     and .livenessProbe.httpGet == {path: "/healthz", port: 8080} and .readinessProbe.httpGet == {path: "/readyz", port: 8080}
     and ((.env[] | select(.name == "POD_NAME") | .valueFrom.fieldRef.fieldPath) == "metadata.name")
     and ((.env[] | select(.name == "POD_NAMESPACE") | .valueFrom.fieldRef.fieldPath) == "metadata.namespace")
     and env("MOCKGPU_CONTROLLER_LISTEN") == "0.0.0.0:8080" and env("MOCKGPU_LEASE_NAME") == "'$F'-controller"
     and env("MOCKGPU_SLURMD_SELECTOR") == "app.kubernetes.io/name=slurmd" and env("MOCKGPU_REMEDIATION") == "false"
     and env("MOCKGPU_STALE_AFTER") == "120" and env("MOCKGPU_SLURMRESTD_URL") == null
     and env("MOCKGPU_NODE_CONDITION_TYPE") == "GPUProblem" and env("MOCKGPU_DRAIN_SLURM") == "false"))'
want "$D" "admission policy: the agent service account on gpunodes and their status" \
  'obj("ValidatingAdmissionPolicy"; "'$F'-agent-own-gpunode").spec | .failurePolicy == "Fail"
   and .matchConstraints.resourceRules == [{apiGroups: ["mockgpu.io"], apiVersions: ["*"],
     operations: ["CREATE", "UPDATE", "DELETE"], resources: ["gpunodes", "gpunodes/status"]}]
   and .matchConditions == [{name: "agent-service-account",
     expression: "request.userInfo.username == '"'system:serviceaccount:$NS:$F-agent'"'"}]'
want "$D" "admission policy: the node-name claim equals the object name, the message names both" \
  'obj("ValidatingAdmissionPolicy"; "'$F'-agent-own-gpunode").spec
   | (.variables[0].expression | contains("request.userInfo.extra['"'authentication.kubernetes.io/node-name'"'][0]"))
   and .validations[0].expression == "variables.nodeName != '"''"' && variables.nodeName == request.name"
   and (.validations[0].messageExpression | contains("variables.nodeName + '"', not '"' + request.name"))'
want "$D" "admission binding: Deny, the policy" \
  'obj("ValidatingAdmissionPolicyBinding"; "'$F'-agent-own-gpunode").spec == {policyName: "'$F'-agent-own-gpunode", validationActions: ["Deny"]}'
want "$D" "helm test: doctor with the agent directory (Bidirectional), NRI, containerd config, on the node network" \
  'obj("Pod"; "'$F'-doctor") | .metadata.annotations["helm.sh/hook"] == "test" and (.spec | .hostNetwork == true
   and .restartPolicy == "Never" and (ctr("doctor") | .command == ["/usr/bin/mockgpu-agent", "doctor"]
     and env("MOCKGPU_LISTEN") == "127.0.0.1:9464" and mount("run-mockgpu").mountPropagation == "Bidirectional"
     and mount("containerd").readOnly == true and mount("nri").mountPath == "/var/run/nri")
   and vol("run-mockgpu").hostPath.path == "/run/mockgpu" and vol("containerd").hostPath.path == "/etc/containerd")'

# --- value sets
V=$C/ci
render profile-file -f "$V/profile-file-values.yaml"
P=$T/profile-file.json
want "$P" "inline profile: a ConfigMap of the chart, read as MOCKGPU_PROFILE_FILE" \
  '(obj("ConfigMap"; "'$F'-profile-default").data["profile.yaml"] == "base: h100\ngpus: 2\n")
   and (ds("default") | pod | vol("profile").configMap.name == "'$F'-profile-default"
     and (ctr("agent") | env("MOCKGPU_PROFILE_FILE") == "/etc/mockgpu/profile/profile.yaml" and env("MOCKGPU_PROFILE") == null
       and mount("profile") == {name: "profile", mountPath: "/etc/mockgpu/profile", readOnly: true}))'

render profile-configmap -f "$V/profile-configmap-values.yaml"
P=$T/profile-configmap.json
want "$P" "existing ConfigMap: mounted whole (so that changes arrive), its key as the file" \
  '(kinds("ConfigMap") | length) == 0 and (ds("default") | pod | vol("profile").configMap == {name: "site-gpu-profile"}
   and (ctr("agent") | env("MOCKGPU_PROFILE_FILE") == "/etc/mockgpu/profile/gpus.yaml" and (mount("profile") | has("subPath") | not)))'

render device-plugin -f "$V/device-plugin-values.yaml"
P=$T/device-plugin.json
want "$P" "device plugin: its environment and the kubelet's device-plugins directory" \
  'ds("default") | pod | vol("device-plugins").hostPath.path == "/var/lib/k0s/kubelet/device-plugins"
   and (ctr("agent") | env("MOCKGPU_DEVICE_PLUGIN") == "true" and env("MOCKGPU_RESOURCE_NAME") == "example.com/gpu"
     and env("MOCKGPU_KUBELET_DIR") == "/var/lib/k0s/kubelet" and mount("device-plugins").mountPath == "/var/lib/k0s/kubelet/device-plugins")'

render device-plugin-off --set agent.devicePlugin.enabled=false
want "$T/device-plugin-off.json" "device plugin off: no environment, no kubelet directory" \
  'ds("default") | pod | vol("device-plugins") == null and (ctr("agent") | env("MOCKGPU_DEVICE_PLUGIN") == null
   and env("MOCKGPU_RESOURCE_NAME") == null and mount("device-plugins") == null)'

render nri-off -f "$V/nri-off-values.yaml"
P=$T/nri-off.json
want "$P" "NRI off: no socket, no keeper, no report; pod network with a metrics port" \
  'ds("default") | pod | vol("nri") == null and ctr("keeper") == null and (.hostNetwork | not)
   and (ctr("agent") | env("MOCKGPU_NRI_SOCKET") == null and mount("nri") == null and env("MOCKGPU_KEEPER") == "off"
     and env("MOCKGPU_REPORT") == "off" and .ports == [{name: "metrics", containerPort: 9464, protocol: "TCP"}])'
want "$P" "NRI off: the doctor pod does not mount the NRI directory" \
  'obj("Pod"; "'$F'-doctor").spec | vol("nri") == null and (.hostNetwork | not)'

render remediation -f "$V/remediation-values.yaml"
P=$T/remediation.json
want "$P" "remediation: slurmrestd URL and token Secret in the environment" \
  'obj("Deployment"; "'$F'-controller") | pod | ctr("controller") | env("MOCKGPU_REMEDIATION") == "true"
   and env("MOCKGPU_SLURMRESTD_URL") == "http://slurm-restapi.slurm:6820"
   and env("MOCKGPU_SLURMRESTD_TOKEN_SECRET") == "slurm-token-slurmrestd/auth-token"'
want "$P" "remediation: the Role reads that one Secret" \
  'obj("Role"; "'$F'-controller") | rules == [
     {g: ["coordination.k8s.io"], r: ["leases"], v: ["create", "get", "update"], n: null},
     {g: [""], r: ["secrets"], v: ["get"], n: ["slurm-token-slurmrestd"]}]'

render fault-drain -f "$V/fault-drain-values.yaml"
P=$T/fault-drain.json
want "$P" "fault drain: its condition type, the drain, slurmrestd and its token without remediation" \
  'obj("Deployment"; "'$F'-controller") | pod | ctr("controller") | env("MOCKGPU_REMEDIATION") == "false"
   and env("MOCKGPU_DRAIN_SLURM") == "true" and env("MOCKGPU_NODE_CONDITION_TYPE") == "example.com/GPUTrouble"
   and env("MOCKGPU_SLURMRESTD_URL") == "http://slurm-restapi.slurm:6820"
   and env("MOCKGPU_SLURMRESTD_TOKEN_SECRET") == "slurm-token-slurmrestd/auth-token"'
want "$P" "fault drain: the Role reads the token's Secret" \
  'obj("Role"; "'$F'-controller") | rules == [
     {g: ["coordination.k8s.io"], r: ["leases"], v: ["create", "get", "update"], n: null},
     {g: [""], r: ["secrets"], v: ["get"], n: ["slurm-token-slurmrestd"]}]'

render two-pools -f "$V/two-pools-values.yaml"
P=$T/two-pools.json
want "$P" "two pools: two DaemonSets with their own selectors and profiles" \
  '(kinds("DaemonSet") | length) == 2
   and (ds("gb300") | .spec.selector.matchLabels["mockgpu.io/pool"] == "gb300" and (pod
     | .nodeSelector == {"mockgpu.io/enabled": "true", pool: "gb300"} and (.tolerations | length) == 1
     and (ctr("agent") | env("MOCKGPU_PROFILE") == "gb300" and env("MOCKGPU_TRUSTED_NAMESPACES") == "slurm,ml-jobs")))
   and (ds("h100") | .spec.selector.matchLabels["mockgpu.io/pool"] == "h100" and (pod
     | .nodeSelector == {"mockgpu.io/enabled": "true", pool: "h100"} and (.tolerations | length) == 2
     and vol("profile").configMap.name == "'$F'-profile-h100" and (ctr("agent") | env("MOCKGPU_PROFILE") == null)))
   and (obj("ConfigMap"; "'$F'-profile-h100").data["profile.yaml"] | startswith("base: h100\ngpus: 8"))
   and (kinds("ConfigMap") | length) == 1'
want "$P" "two pools: the doctor runs on the first pool" \
  'obj("Pod"; "'$F'-doctor").spec.nodeSelector == {"mockgpu.io/enabled": "true", pool: "gb300"}'

# DRA: NVIDIA's DeviceClasses (the selectors of api/src/dra.rs, GPU_CLASS_SELECTOR and
# CHANNEL_CLASS_SELECTOR), the agent's DRA rules and the policy on its ResourceSlices
GPU_SEL="device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
CHANNEL_SEL="device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'channel' && device.attributes['compute-domain.nvidia.com'].id == 0"
AGENT_RULES='{g: ["mockgpu.io"], r: ["gpunodes"], v: ["create", "get", "patch", "update"], n: null},
     {g: ["mockgpu.io"], r: ["gpunodes/status"], v: ["get", "patch", "update"], n: null},
     {g: ["mockgpu.io"], r: ["gpufaults"], v: ["get", "list", "watch"], n: null},
     {g: ["mockgpu.io"], r: ["gpufaults/status"], v: ["patch"], n: null},
     {g: [""], r: ["nodes"], v: ["get"], n: null},
     {g: ["events.k8s.io"], r: ["events"], v: ["create", "patch"], n: null}'
DRA_RULES='{g: ["resource.k8s.io"], r: ["resourceslices"], v: ["create", "delete", "get", "list", "patch", "update", "watch"], n: null},
     {g: ["resource.k8s.io"], r: ["resourceclaims"], v: ["get", "list", "watch"], n: null}'

render dra -f "$V/dra-values.yaml"
P=$T/dra.json
want "$P" "DRA: the agent serves both DRA drivers (the CDI directory, the kubelet's), without the device plugin" \
  'ds("default") | pod | vol("device-plugins") == null and (ctr("agent") | env("MOCKGPU_DRA_GPUS") == "true"
   and env("MOCKGPU_DRA_COMPUTE_DOMAINS") == "true"
   and env("MOCKGPU_CDI_DIR") == "/var/run/cdi" and env("MOCKGPU_KUBELET_DIR") == "/var/lib/kubelet"
   and env("MOCKGPU_DEVICE_PLUGIN") == null and env("MOCKGPU_RESOURCE_NAME") == null and mount("device-plugins") == null)'
want "$P" "DRA: plugins_registry/ and plugins/ (HostToContainer) of the kubelet's directory and the CDI directory, from the host" \
  'ds("default") | pod | vol("plugins-registry").hostPath == {path: "/var/lib/kubelet/plugins_registry", type: "DirectoryOrCreate"}
   and vol("plugins").hostPath == {path: "/var/lib/kubelet/plugins", type: "DirectoryOrCreate"}
   and vol("cdi").hostPath == {path: "/var/run/cdi", type: "DirectoryOrCreate"}
   and (ctr("agent") | mount("plugins-registry") == {name: "plugins-registry", mountPath: "/var/lib/kubelet/plugins_registry"}
     and mount("plugins") == {name: "plugins", mountPath: "/var/lib/kubelet/plugins", mountPropagation: "HostToContainer"}
     and mount("cdi") == {name: "cdi", mountPath: "/var/run/cdi"})
   and (ctr("keeper") | mount("plugins") == null and mount("cdi") == null)'
want "$P" "DRA: the DeviceClasses gpu.nvidia.com and compute-domain-default-channel.nvidia.com with NVIDIA's selectors, exactly" \
  '(kinds("DeviceClass") | length) == 2
   and (obj("DeviceClass"; "gpu.nvidia.com") | .apiVersion == "resource.k8s.io/v1"
     and .metadata.labels["app.kubernetes.io/instance"] == "'$REL'"
     and .spec == {selectors: [{cel: {expression: "'"$GPU_SEL"'"}}]})
   and (obj("DeviceClass"; "compute-domain-default-channel.nvidia.com") | .apiVersion == "resource.k8s.io/v1"
     and .spec == {selectors: [{cel: {expression: "'"$CHANNEL_SEL"'"}}]})'
want "$P" "DRA: agent RBAC adds its node's ResourceSlices and reading ResourceClaims, nothing else" \
  'obj("ClusterRole"; "'$F'-agent") | rules == ['"$AGENT_RULES"',
     '"$DRA_RULES"']'
want "$P" "DRA: three policies and bindings, the third on ResourceSlices" \
  '(kinds("ValidatingAdmissionPolicy") | length) == 3 and (kinds("ValidatingAdmissionPolicyBinding") | length) == 3
   and obj("ValidatingAdmissionPolicyBinding"; "'$F'-agent-own-resourceslices").spec
     == {policyName: "'$F'-agent-own-resourceslices", validationActions: ["Deny"]}'
want "$P" "DRA: the ResourceSlice policy matches the agent service account's writes of resourceslices" \
  'obj("ValidatingAdmissionPolicy"; "'$F'-agent-own-resourceslices").spec | .failurePolicy == "Fail"
   and .matchConstraints.resourceRules == [{apiGroups: ["resource.k8s.io"], apiVersions: ["*"],
     operations: ["CREATE", "UPDATE", "DELETE"], resources: ["resourceslices"]}]
   and .matchConditions == [{name: "agent-service-account",
     expression: "request.userInfo.username == '"'system:serviceaccount:$NS:$F-agent'"'"}]'
want "$P" "DRA: the ResourceSlice policy holds the slice (the old one too, on DELETE and UPDATE) to the node-name claim" \
  'obj("ValidatingAdmissionPolicy"; "'$F'-agent-own-resourceslices").spec
   | (.variables | map(.name)) == ["nodeName", "sliceNode", "oldSliceNode", "otherNode"]
   and (.variables[0].expression | contains("request.userInfo.extra['"'authentication.kubernetes.io/node-name'"'][0]"))
   and .variables[1].expression == "(request.operation == '"'DELETE'"' ? oldObject : object).spec.?nodeName.orValue('"''"')"
   and .variables[2].expression == "request.operation == '"'UPDATE'"' ? oldObject.spec.?nodeName.orValue('"''"') : variables.sliceNode"
   and .validations[0].expression == "variables.nodeName != '"''"' && variables.sliceNode == variables.nodeName && variables.oldSliceNode == variables.nodeName"
   and (.validations[0].messageExpression | contains("'"' may write only the ResourceSlices of node '"'"))
   and .validations[0].reason == "Forbidden"'
want "$P" "DRA: the doctor runs without the device plugin's environment and directory (its pool runs DRA)" \
  'obj("Pod"; "'$F'-doctor").spec | vol("device-plugins") == null
   and (ctr("doctor") | env("MOCKGPU_RESOURCE_NAME") == null and env("MOCKGPU_KUBELET_DIR") == null and mount("device-plugins") == null)'
want "$P" "DRA: the controller's rules as without DRA (ComputeDomains are kept whatever agent.dra says)" \
  'obj("ClusterRole"; "'$F'-controller") | rules | map(select(.g == ["resource.nvidia.com"] or .g == ["resource.k8s.io"])) | length == 3'

render dra-pool -f "$V/dra-pool-values.yaml"
P=$T/dra-pool.json
want "$P" "DRA on one pool: its agent serves DRA under k0s's kubelet directory and /etc/cdi, without the device plugin" \
  'ds("dra") | pod | vol("device-plugins") == null
   and vol("plugins-registry").hostPath.path == "/var/lib/k0s/kubelet/plugins_registry"
   and vol("plugins").hostPath.path == "/var/lib/k0s/kubelet/plugins" and vol("cdi").hostPath.path == "/etc/cdi"
   and (ctr("agent") | env("MOCKGPU_DRA_GPUS") == "true" and env("MOCKGPU_CDI_DIR") == "/etc/cdi"
     and env("MOCKGPU_KUBELET_DIR") == "/var/lib/k0s/kubelet" and env("MOCKGPU_DEVICE_PLUGIN") == null
     and mount("plugins") == {name: "plugins", mountPath: "/var/lib/k0s/kubelet/plugins", mountPropagation: "HostToContainer"}
     and mount("cdi").mountPath == "/etc/cdi" and mount("device-plugins") == null)'
want "$P" "DRA on one pool: the other pool keeps the device plugin, without DRA" \
  'ds("plugin") | pod | vol("device-plugins").hostPath.path == "/var/lib/k0s/kubelet/device-plugins"
   and vol("plugins") == null and vol("plugins-registry") == null and vol("cdi") == null
   and (ctr("agent") | env("MOCKGPU_DEVICE_PLUGIN") == "true" and env("MOCKGPU_DRA_GPUS") == null and env("MOCKGPU_CDI_DIR") == null
     and env("MOCKGPU_KUBELET_DIR") == "/var/lib/k0s/kubelet" and mount("plugins") == null)'
want "$P" "DRA on one pool, deviceClasses off (NVIDIA's chart has them): no DeviceClass, the agent's DRA rules and the ResourceSlice policy stay" \
  '(kinds("DeviceClass") | length) == 0
   and (obj("ClusterRole"; "'$F'-agent") | rules == ['"$AGENT_RULES"',
     '"$DRA_RULES"'])
   and obj("ValidatingAdmissionPolicyBinding"; "'$F'-agent-own-resourceslices").spec.policyName == "'$F'-agent-own-resourceslices"'
want "$P" "DRA on one pool: the doctor, on the first pool (the device plugin's), checks the device plugin" \
  'obj("Pod"; "'$F'-doctor").spec | .nodeSelector == {pool: "plugin"} and vol("device-plugins").hostPath.path == "/var/lib/k0s/kubelet/device-plugins"
   and (ctr("doctor") | env("MOCKGPU_RESOURCE_NAME") == "nvidia.com/gpu")'

render dra-opted-out --set agent.dra.gpus=true --set-json 'agent.pools=[{"name":"default","dra":{"gpus":false}}]'
want "$T/dra-opted-out.json" "DRA on but every pool opting out: DRA nowhere (no DeviceClass, policy or DRA rule), the device plugin serves" \
  '(kinds("DeviceClass") | length) == 0 and (kinds("ValidatingAdmissionPolicy") | length) == 2
   and (obj("ClusterRole"; "'$F'-agent") | rules == ['"$AGENT_RULES"'])
   and (ds("default") | pod | ctr("agent") | env("MOCKGPU_DRA_GPUS") == null and env("MOCKGPU_DEVICE_PLUGIN") == "true"
     and mount("plugins") == null)'

render dra-channels --set agent.dra.computeDomains=true
want "$T/dra-channels.json" "IMEX channels through DRA beside the device plugin (Slinky's slurmd keeps nvidia.com/gpu)" \
  'ds("default") | pod | vol("device-plugins").hostPath.path == "/var/lib/kubelet/device-plugins"
   and vol("plugins").hostPath.path == "/var/lib/kubelet/plugins"
   and (ctr("agent") | env("MOCKGPU_DEVICE_PLUGIN") == "true" and env("MOCKGPU_DRA_COMPUTE_DOMAINS") == "true"
     and env("MOCKGPU_DRA_GPUS") == null and env("MOCKGPU_CDI_DIR") == "/var/run/cdi")'

render dra-no-policy -f "$V/dra-values.yaml" --set admissionPolicy.enabled=false
want "$T/dra-no-policy.json" "DRA with the admission policies off: no policy at all, the DeviceClasses still" \
  '(kinds("ValidatingAdmissionPolicy") | length) == 0 and (kinds("ValidatingAdmissionPolicyBinding") | length) == 0
   and (kinds("DeviceClass") | length) == 2'

# NOTES.txt (rendered by an install's client-side dry run): what to check next, per pool
n=$((n + 1))
notes=$(HELM_CACHE_HOME=$T/helm HELM_CONFIG_HOME=$T/helm HELM_DATA_HOME=$T/helm \
  "$HELM" install "$REL" "$C" --namespace "$NS" --dry-run=client -f "$V/two-pools-values.yaml" | sed -n '/^NOTES:/,$p')
for line in "rollout status daemonset/$F-agent-gb300" "rollout status daemonset/$F-agent-h100" "kubectl get gpunodes" \
  "helm test $REL -n $NS --logs" "-c agent -- mockgpu-agent doctor"; do
  grep -qF -- "$line" <<< "$notes" || { echo "chart.sh: NOTES.txt lacks '$line': $notes" >&2; bad=$((bad + 1)); }
done
n=$((n + 1))
notes=$(HELM_CACHE_HOME=$T/helm HELM_CONFIG_HOME=$T/helm HELM_DATA_HOME=$T/helm \
  "$HELM" install "$REL" "$C" --namespace "$NS" --dry-run=client -f "$V/dra-pool-values.yaml" | sed -n '/^NOTES:/,$p')
for line in "rollout status daemonset/$F-agent-dra" "GPUS:.status.allocatable.nvidia\\.com/gpu" \
  "the pools that run DRA" "kubectl get resourceslices"; do
  grep -qF -- "$line" <<< "$notes" || { echo "chart.sh: NOTES.txt (DRA on one pool) lacks '$line': $notes" >&2; bad=$((bad + 1)); }
done

# --- invalid values: rejected, and the error says where and why
# reject <what> <fragment of the error> <helm args>...
reject() {
  local what=$1 frag=$2 out; shift 2; n=$((n + 1))
  if out=$("$HELM" template "$REL" "$C" "$@" 2>&1 > /dev/null); then
    echo "chart.sh: $what: accepted ($*)" >&2; bad=$((bad + 1)); return
  fi
  grep -qF -- "$frag" <<< "$out" || { echo "chart.sh: $what: the error lacks '$frag': $out" >&2; bad=$((bad + 1)); return; }
  echo "chart.sh: rejected $what: $(grep -F -- "$frag" <<< "$out" | head -1 | sed 's/^ *//')"
}
reject "a wrong type" "at '/agent/heartbeatSeconds': got string, want integer" --set agent.heartbeatSeconds=soon
reject "an unknown key" "at '/agent/devicePlugin': additional properties 'enable' not allowed" --set agent.devicePlugin.enable=true
reject "an unknown top-level key" "additional properties 'agents' not allowed" --set agents.nri.enabled=false
reject "a bad profile name" "at '/agent/profile/name': value must be one of 'gb300'" --set agent.profile.name=h300
reject "a bad pool profile name" "at '/agent/pools/0/profile/name': value must be one of" --set 'agent.pools[0].profile.name=gb9000'
reject "a bad pool name" "at '/agent/pools/0/name': 'GPU_pool' does not match pattern" --set 'agent.pools[0].name=GPU_pool'
reject "an empty pool list" "at '/agent/pools': minItems: got 0, want 1" --set-json 'agent.pools=[]'
reject "no pool list" "at '/agent': missing property 'pools'" --set agent.pools=null
reject "a port out of range" "at '/controller/port': maximum" --set controller.port=70000
reject "remediation without slurmrestd" "at '/controller/remediation/slurmrestdUrl': '' does not match pattern" --set controller.remediation.enabled=true
reject "a pool's dra.gpus not a boolean" "at '/agent/pools/0/dra/gpus': got string, want boolean" \
  --set-json 'agent.pools=[{"name":"default","dra":{"gpus":"yes"}}]'
reject "an unknown key under agent.dra" "at '/agent/dra': additional properties 'enable' not allowed" --set agent.dra.enable=true
reject "a relative CDI directory" "at '/agent/dra/cdiDir': 'var/run/cdi' does not match pattern" --set agent.dra.cdiDir=var/run/cdi
reject "DRA on a Kubernetes without resource.k8s.io/v1" "agent.dra: DRA needs Kubernetes 1.34 or later (resource.k8s.io/v1), this is v1.33.0" \
  --set agent.dra.gpus=true --kube-version 1.33.0
reject "a profile from a file and a ConfigMap" 'agent pool "default": the profile sets both file and configMap.name; set one' \
  --set agent.profile.file=base:gb300 --set agent.profile.configMap.name=p

# --- the configuration reference
n=$((n + 1))
bash tests/chart-docs.sh --check || bad=$((bad + 1))

[ $bad = 0 ] || { echo "chart.sh: $bad of $n checks failed" >&2; exit 1; }
echo "chart.sh: $n checks passed ($("$HELM" version --short))"
