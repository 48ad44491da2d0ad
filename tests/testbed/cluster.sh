# cluster.sh - the test bed's cluster mode (CLUSTER=1, sourced by testbed.sh): a real Kubernetes
# node in the node's namespaces. etcd (Debian) and kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet (tests/build-k8s.sh) run inside the node's mount namespace and its own
# network namespace, which has a documentation-range node address on `lo`, a default route on
# `lo` and no link out; pods get a bridge (CNI) inside it. Real TLS (a CA, serving and client
# certificates, service-account keys), Node,RBAC authorization and NodeRestriction admission.
# kubectl runs on the host, entering only the node's network namespace (`testbed.sh kubectl`).
# shellcheck shell=bash

K8S_BIN=${K8S_BIN:-$("$REPO/tests/build-k8s.sh" --print-dir)}
KUBECTL=${KUBECTL:-$K8S_BIN/kubectl}
NODE_IP=192.0.2.10                 # TEST-NET-1: routed nowhere
POD_CIDR=198.51.100.0/24           # TEST-NET-2: the bridge's pods
SVC_CIDR=203.0.113.0/24            # TEST-NET-3: service addresses (no kube-proxy: never answered)
SVC_IP=203.0.113.1                 # the `kubernetes` service
KN=/etc/kubernetes                 # node path of the PKI, kubeconfigs and kubelet config
KCFG=$R$KN/admin.kubeconfig        # host path of the admin kubeconfig
GPU_NS=gpu-jobs                    # a namespace the agent does not trust (--trusted-namespaces default)
DP_NS=dp-jobs                      # the device plugin's pods: untrusted as well
RES=nvidia.com/gpu                 # the resource the agent's device plugin serves
# the agent serves the device plugin to the node's kubelet (its --root-dir)
# (--keeper off: the host agent mounts by itself here; the keeper is the non-cluster test bed's
# agent-restart step and the chart's sidecar; a keeper the host agent started did not survive
# the sid kubelet's restart in dp-kubelet-restart)
AGENT_ARGS="--device-plugin --kubelet-dir /var/lib/kubelet --keeper off${AGENT_ARGS:+ $AGENT_ARGS}"

# kubectl from the host, in the node's network namespace only (the API server listens on its
# loopback)
HELM=${HELM:-$K8S_BIN/helm}
# helm from the host likewise, with its state (cache, config) under $ST
hc() { nsenter -t "$(nodepid)" -n -- env HELM_CACHE_HOME="$ST/helm/cache" HELM_CONFIG_HOME="$ST/helm/config" \
  HELM_DATA_HOME="$ST/helm/data" "$HELM" --kubeconfig "$KCFG" "$@"; }
kc() { nsenter -t "$(nodepid)" -n -- "$KUBECTL" --kubeconfig "$KCFG" --request-timeout=30s "$@"; }

# ---------------------------------------------------------------------------------------------
# the node: its own /dev, sysfs and sysctls, configs, PKI

# host-global sysctls the kubelet rewrites
SYSCTLS="vm/overcommit_memory kernel/panic kernel/panic_on_oops"
host_sysctls() { local n; for n in $SYSCTLS; do echo "$n=$(cat "/proc/sys/$n")"; done; }

# in the holder, after pivot_root (the old root still at /.oldroot): a sysfs of the node's network
# namespace (CNI reads /sys/class/net) with the host's cgroup tree inside; and the host-global
# sysctls the kubelet rewrites, shadowed by files of the node
NODE_PIVOT_HOOK='
  mount -t sysfs sysfs /sys
  mount --rbind /.oldroot/sys/fs/cgroup /sys/fs/cgroup
  mkdir -p /run/fakesysctl
  for n in '"$SYSCTLS"'; do
    f=/run/fakesysctl/$(echo "$n" | tr / .); cat "/proc/sys/$n" > "$f"; mount --bind "$f" "/proc/sys/$n"
  done'
NODE_NET_HOOK="busybox ip addr add $NODE_IP/32 dev lo; busybox ip route add default dev lo"

cluster_dev() {  # the node's own /dev: the host's basic devices and a GPU node's /dev/nvidia*
  mountpoint -q "$R/dev" && return 0
  mount -t tmpfs -o mode=755,nosuid tmpfs "$R/dev"
  local d m
  for d in null zero full random urandom tty fuse kmsg; do
    touch "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"
  done
  mkdir -p "$R/dev/pts" "$R/dev/shm"
  mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$R/dev/pts"
  ln -s pts/ptmx "$R/dev/ptmx"
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/dev/shm"
  ln -s /proc/self/fd "$R/dev/fd"
  ln -s /proc/self/fd/0 "$R/dev/stdin"; ln -s /proc/self/fd/1 "$R/dev/stdout"; ln -s /proc/self/fd/2 "$R/dev/stderr"
  # no driver behind them (opening one fails with ENXIO): they are what privileged containers and
  # device plugins hand out, so that the NRI plugin sees a container holding GPUs
  for m in 0 1 2 3; do mknod -m 666 "$R/dev/nvidia$m" c 195 "$m"; done
  mknod -m 666 "$R/dev/nvidiactl" c 195 255
}

pki() {  # pki <dir>: CA, serving and client certificates, service-account key pair
  local P=$1
  rm -rf "$P"; mkdir -p "$P"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$P/ca.key" -sha256 -days 3650 -subj "/CN=mgtb-ca" -out "$P/ca.crt" 2> /dev/null
  openssl genrsa -out "$P/sa.key" 2048 2> /dev/null
  openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2> /dev/null
  cert "$P" apiserver /CN=kube-apiserver serverAuth \
    "IP:127.0.0.1,IP:$NODE_IP,IP:$SVC_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert "$P" apiserver-kubelet-client /O=system:masters/CN=kube-apiserver-kubelet-client clientAuth
  cert "$P" admin /O=system:masters/CN=kubernetes-admin clientAuth
  cert "$P" controller-manager /CN=system:kube-controller-manager clientAuth
  cert "$P" scheduler /CN=system:kube-scheduler clientAuth
  cert "$P" kubelet "/O=system:nodes/CN=system:node:$NODE" clientAuth
  cert "$P" kubelet-serving "/O=system:nodes/CN=system:node:$NODE" serverAuth "IP:$NODE_IP,DNS:$NODE"
  rm -f "$P/ca.srl"
}

cert() {  # cert <dir> <name> <subject> <extendedKeyUsage> [subjectAltName]: signed by <dir>/ca
  local P=$1
  { echo "basicConstraints=CA:FALSE"; echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$4"; [ -z "${5:-}" ] || echo "subjectAltName=$5"; } > "$P/$2.ext"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$P/$2.key" -subj "$3" 2> /dev/null \
    | openssl x509 -req -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 3650 -sha256 \
        -extfile "$P/$2.ext" -out "$P/$2.crt" 2> /dev/null
  rm -f "$P/$2.ext"
  openssl verify -CAfile "$P/ca.crt" "$P/$2.crt" > /dev/null || fail "certificate $2 does not verify"
}

kubeconfig() {  # kubeconfig <file> <user> [token]: the PKI's client certificate <user>, or a
  # service account's token; embedded data, so that it works from host and node
  local P=$R$KN/pki user
  if [ $# -ge 3 ]; then user="{token: \"$3\"}"
  else user="{client-certificate-data: \"$(base64 -w0 "$P/$2.crt")\", client-key-data: \"$(base64 -w0 "$P/$2.key")\"}"; fi
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: mgtb
  cluster: {server: "https://127.0.0.1:6443", certificate-authority-data: "$(base64 -w0 "$P/ca.crt")"}
users:
- name: $2
  user: $user
contexts:
- name: mgtb
  context: {cluster: mgtb, user: $2}
current-context: mgtb
EOF
  chmod 600 "$1"
}

cluster_configs() {  # (write_configs, cluster mode) containerd with CNI, kubelet, PKI, kubeconfigs
  [ -x "$K8S_BIN/kube-apiserver" ] || fail "no Kubernetes binaries in $K8S_BIN (run tests/build-k8s.sh)"
  mkdir -p "$R/opt/k8s" "$R$KN" "$R/etc/cni/net.d"
  mountpoint -q "$R/opt/k8s" || mount --bind -o ro "$K8S_BIN" "$R/opt/k8s"
  # a fresh cluster every time: no state of an earlier run
  rm -rf "$R/var/lib/etcd-mgtb" "$R/var/lib/kubelet" "$R/var/lib/cni" "$R/var/log/pods" "$R/var/log/containers"
  [ -s "$R/etc/machine-id" ] || tr -d - < /proc/sys/kernel/random/uuid > "$R/etc/machine-id"   # cadvisor
  cat > "$R/etc/cni/net.d/10-mgtb.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "mgtb", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
EOF
  echo "nameserver 127.0.0.1" > "$R$KN/resolv.conf"   # pods' DNS: nothing outside the node is asked
  host_sysctls > "$ST/host-sysctls"    # the isolation step checks that the host keeps them
  pki "$R$KN/pki"
  kubeconfig "$R$KN/admin.kubeconfig" admin
  kubeconfig "$R$KN/controller-manager.kubeconfig" controller-manager
  kubeconfig "$R$KN/scheduler.kubeconfig" scheduler
  kubeconfig "$R$KN/kubelet.kubeconfig" kubelet
  cat > "$R$KN/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
# containerd 1.7 has no CRI RuntimeConfig: kubelet 1.37 falls back to this (1.38 does not)
cgroupDriver: cgroupfs
# its own subtree: the kubelet deletes pod cgroups it does not know below its root
cgroupRoot: $CGROUP_PARENT
# the host is cgroup v1 (+ cgroup2 at /sys/fs/cgroup/unified); kubelet >= 1.35 refuses v1 by default
failCgroupV1: false
failSwapOn: false
# the kubelet rewrites vm.overcommit_memory and kernel.panic*: shadowed in the node (cluster.sh)
protectKernelDefaults: false
# no CAP_SYS_RESOURCE here
oomScoreAdj: 0
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $KN/pki/kubelet-serving.crt
tlsPrivateKeyFile: $KN/pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $KN/pki/ca.crt}
authorization: {mode: Webhook}
resolvConf: $KN/resolv.conf
clusterDomain: cluster.local
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
# images are imported, never pulled: never collect them
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
}

# ---------------------------------------------------------------------------------------------
# cluster-up: etcd, kube-apiserver (readyz), controller-manager, scheduler, kubelet (registered)

etcd_healthy() { nsenter -t "$(nodepid)" -n -- curl -sf http://127.0.0.1:2379/health | matches '"health":"true"'; }
api_ready() { [ "$(kc get --raw /readyz 2> /dev/null)" = ok ]; }

cgroup_root_ready() {  # the kubelet wants its cgroupRoot to exist in every hierarchy
  local h
  for h in /sys/fs/cgroup/*/; do
    mkdir -p "$h${CGROUP_PARENT#/}"
    if [ -f "${h}cpuset.cpus" ]; then
      cat "${h}cpuset.cpus" > "$h${CGROUP_PARENT#/}/cpuset.cpus"; cat "${h}cpuset.mems" > "$h${CGROUP_PARENT#/}/cpuset.mems"
    fi
  done
}

spawn_apiserver() {  # (control_plane_up; the API server restart step)
  local P=$KN/pki
  spawn kube-apiserver "$LOGS/kube-apiserver.log" /opt/k8s/kube-apiserver --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=127.0.0.1 --secure-port=6443 --advertise-address="$NODE_IP" \
    --service-cluster-ip-range="$SVC_CIDR" --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file=$P/sa.pub --service-account-signing-key-file=$P/sa.key \
    --tls-cert-file=$P/apiserver.crt --tls-private-key-file=$P/apiserver.key --client-ca-file=$P/ca.crt \
    --kubelet-client-certificate=$P/apiserver-kubelet-client.crt --kubelet-client-key=$P/apiserver-kubelet-client.key \
    --kubelet-preferred-address-types=InternalIP --kubelet-certificate-authority=$P/ca.crt \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --allow-privileged=true \
    --profiling=false -v=1
}

control_plane_up() {
  local t t0; t=$(date +%s%N); t0=$t
  spawn etcd "$LOGS/etcd.log" etcd --name node0 --data-dir /var/lib/etcd-mgtb --unsafe-no-fsync \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster node0=http://127.0.0.1:2380
  wait_for 30 "etcd healthy" etcd_healthy || { tail -20 "$LOGS/etcd.log"; exit 1; }
  timing etcd-ready "$(ms "$t") ms"; t=$(date +%s%N)
  spawn_apiserver
  wait_for 120 "kube-apiserver /readyz" api_ready || { tail -30 "$LOGS/kube-apiserver.log"; exit 1; }
  timing apiserver-ready "$(ms "$t") ms (etcd + apiserver $(ms "$t0") ms)"
  echo "  /readyz from the host: $(kc get --raw /readyz)"
}

node_registered() { kc get node "$NODE" > /dev/null; }

spawn_kubelet() {
  spawn kubelet "$LOGS/kubelet.log" /opt/k8s/kubelet --config=$KN/kubelet.yaml --kubeconfig=$KN/kubelet.kubeconfig \
    --hostname-override="$NODE" --node-ip="$NODE_IP" --root-dir=/var/lib/kubelet -v=2
}

kubelet_up() {
  local t t0 P=$KN/pki; t=$(date +%s%N); t0=$t
  spawn kube-controller-manager "$LOGS/kube-controller-manager.log" /opt/k8s/kube-controller-manager \
    --kubeconfig=$KN/controller-manager.kubeconfig --authentication-kubeconfig=$KN/controller-manager.kubeconfig \
    --authorization-kubeconfig=$KN/controller-manager.kubeconfig --bind-address=127.0.0.1 --leader-elect=false \
    --use-service-account-credentials=true --service-account-private-key-file=$P/sa.key --root-ca-file=$P/ca.crt \
    --cluster-signing-cert-file=$P/ca.crt --cluster-signing-key-file=$P/ca.key --allocate-node-cidrs=false \
    --profiling=false -v=1
  spawn kube-scheduler "$LOGS/kube-scheduler.log" /opt/k8s/kube-scheduler --kubeconfig=$KN/scheduler.kubeconfig \
    --authentication-kubeconfig=$KN/scheduler.kubeconfig --authorization-kubeconfig=$KN/scheduler.kubeconfig \
    --bind-address=127.0.0.1 --leader-elect=false --profiling=false -v=1
  cgroup_root_ready
  spawn_kubelet
  wait_for 120 "node $NODE registered" node_registered || { grep -E '^E|rror' "$LOGS/kubelet.log" | tail -20; exit 1; }
  timing node-registered "$(ms "$t") ms"
}

cluster_up() {
  step control-plane control_plane_up
  if [ $FAILED = 0 ]; then step kubelet kubelet_up; fi
}

# ---------------------------------------------------------------------------------------------
# scenarios




widget() { printf 'apiVersion: testbed.mockgpu.io/v1\nkind: Widget\nmetadata: {name: %s}\nspec: {gpus: %s}\n' "$1" "$2"; }
widget_apply() { widget "$1" "$2" | kc apply -f -; }

scenario_policy() {  # a CRD and a ValidatingAdmissionPolicy on it, enforced by the API server
  kc apply -f - > /dev/null <<'EOF'
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.testbed.mockgpu.io}
spec:
  group: testbed.mockgpu.io
  names: {kind: Widget, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {gpus: {type: integer}}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: widget-gpus}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - {apiGroups: [testbed.mockgpu.io], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [widgets]}
  validations:
  - {expression: "object.spec.gpus <= 4", message: "a widget has at most 4 GPUs"}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: widget-gpus}
spec: {policyName: widget-gpus, validationActions: [Deny]}
EOF
  kc wait --for=condition=Established crd/widgets.testbed.mockgpu.io --timeout=60s > /dev/null
  wait_for 30 "a widget with 2 GPUs accepted" widget_apply small 2
  # the policy takes effect a moment after it is created: until it denies, remove what got in
  local out
  wait_for 10 "the policy to deny a widget with 8 GPUs" widget_denied || true
  out=$(cat "$ST/widget-denied.txt")
  echo "  denied: $out"
  grep -q 'a widget has at most 4 GPUs' <<< "$out" || fail "the ValidatingAdmissionPolicy did not deny the widget: $out"
  kc delete validatingadmissionpolicybinding/widget-gpus validatingadmissionpolicy/widget-gpus crd/widgets.testbed.mockgpu.io > /dev/null
}

widget_denied() {  # creating a widget with 8 GPUs fails (its output in $ST/widget-denied.txt); one that got in is removed
  if widget big 8 | kc create -f - > "$ST/widget-denied.txt" 2>&1; then kc delete widget big > /dev/null; return 1; fi
}




# (replaces the host-network test bed's step of the same name)
isolation() {  # nothing reaches out of the node, nothing listens outside it, nothing pulled
  local l bad="" hostnet p
  while read -r l; do
    case $l in
      lo|cni0) ;;
      veth*) innode busybox ip -o link show "$l" | matches 'master cni0' || bad="$bad $l(no master cni0)" ;;
      *) bad="$bad $l" ;;
    esac
  done < <(innode busybox ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1)
  [ -z "$bad" ] || fail "the node's network namespace has links other than lo and the pod bridge:$bad"
  # every process of the node (its mount namespace, its pods' cgroups) is outside the host's
  # network namespace, so whatever listens does so in the node's namespaces
  hostnet=$(readlink /proc/self/ns/net)
  local ns; ns=$(cat "$ST/node.mntns")
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$ns" ] || continue
    [ "$(readlink "$p/ns/net" 2>/dev/null)" != "$hostnet" ] || fail "process ${p#/proc/} ($(cat "$p/comm")) is in the host's network namespace"
  done
  for p in $(cgroup_dirs | while read -r d; do find "$d" -name cgroup.procs -exec cat {} +; done | sort -u); do
    [ "$(readlink "/proc/$p/ns/net" 2>/dev/null)" != "$hostnet" ] || fail "pod process $p is in the host's network namespace"
  done
  ! grep -qiE 'PullImage|pulling image' "$LOGS/containerd.log" || fail "containerd pulled an image: $(grep -iE 'PullImage|pulling image' "$LOGS/containerd.log" | head -1)"
  # the kubelet's sysctl writes landed on the node's shadow files, not on the host
  [ "$(host_sysctls)" = "$(cat "$ST/host-sysctls")" ] || fail "host sysctls changed: $(host_sysctls | tr '\n' ' '), were $(tr '\n' ' ' < "$ST/host-sysctls")"
  echo "  host sysctls kept ($(tr '\n' ' ' < "$ST/host-sysctls")); node (the kubelet's): $(for n in $SYSCTLS; do printf '%s=%s ' "$n" "$(innode cat "/proc/sys/$n")"; done)"
  echo "  node links: $(innode busybox ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | tr '\n' ' '); no process in the host's network namespace; no image pulled"
}

scenario_helm() {  # Helm installs and removes a chart against the real API server
  local C=$ST/helm/chart out
  rm -rf "$ST/helm"; mkdir -p "$C/templates"
  printf 'apiVersion: v2\nname: mgtb-probe\nversion: 0.1.0\n' > "$C/Chart.yaml"
  printf 'gpus: 4\n' > "$C/values.yaml"
  # shellcheck disable=SC2016 # a Helm template, not shell
  printf 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: {{ .Release.Name }}-probe}\ndata: {gpus: "{{ .Values.gpus }}"}\n' > "$C/templates/cm.yaml"
  hc install probe "$C" --namespace default --set gpus=2 --wait --timeout 60s > /dev/null || fail "helm install"
  out=$(kc get configmap probe-probe -o jsonpath='{.data.gpus}')
  [ "$out" = 2 ] || fail "the chart's ConfigMap has gpus=$out, want 2 (from --set)"
  echo "  $(hc version --short): $(hc list --namespace default --short | tr '\n' ' ')installed, ConfigMap gpus=$out"
  hc uninstall probe --namespace default --wait > /dev/null || fail "helm uninstall"
  ! kc get configmap probe-probe > /dev/null 2>&1 || fail "helm uninstall left the ConfigMap"
}

# every value set of tests/chart.sh (the defaults and charts/mockgpu/ci/*-values.yaml) rendered
# with the CRDs and applied with --dry-run=server: the real API server validates each object (its
# schema, unknown fields, the admission policy's CEL) and keeps none
scenario_chart_dry_run() {
  local f name out want got
  # (a namespace of its own: one being deleted does not get in the way of a real install later)
  kc create namespace chart-dry-run > /dev/null
  # (the helm test pod runs as the agent's service account, which a dry run does not create:
  # Helm creates test pods after the release's objects)
  kc -n chart-dry-run create serviceaccount mg-mockgpu-agent > /dev/null
  for f in default "$REPO"/charts/mockgpu/ci/*-values.yaml; do
    name=$(basename "$f" -values.yaml)
    if [ "$f" = default ]; then set --; else set -- -f "$f"; fi
    hc template mg "$REPO/charts/mockgpu" --namespace chart-dry-run --include-crds "$@" > "$ST/chart-$name.yaml"
    want=$(grep -c '^kind:' "$ST/chart-$name.yaml")
    out=$(kc apply --dry-run=server -f "$ST/chart-$name.yaml" 2>&1) || fail "chart values $name: the API server rejects: $out"
    got=$(grep -c ' (server dry run)$' <<< "$out" || true)
    [ "$got" = "$want" ] || fail "chart values $name: $got of $want objects accepted: $out"
    grep -qx 'customresourcedefinition.apiextensions.k8s.io/gpunodes.mockgpu.io created (server dry run)' <<< "$out" \
      || fail "chart values $name: no GpuNode CRD among: $out"
    grep -qx 'validatingadmissionpolicy.admissionregistration.k8s.io/mg-mockgpu-agent-own-gpunode created (server dry run)' <<< "$out" \
      || fail "chart values $name: no admission policy among: $out"
    echo "  $name: $got objects accepted"
  done
  ! kc get crd gpunodes.mockgpu.io > /dev/null 2>&1 || fail "a dry run left the GpuNode CRD behind"
  kc delete namespace chart-dry-run --wait=false > /dev/null
}

img_pod() {  # img_pod <name> <image> <the container's command/args fields, JSON>: a pod that runs once
  kc apply -f - > /dev/null <<EOF
{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "$1", "namespace": "default"},
 "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
  "containers": [{"name": "c", "image": "$2", "imagePullPolicy": "Never", $3}]}}
EOF
}
pod_phase_is() { [ "$(kc get pod "$1" -o jsonpath='{.status.phase}')" = "$2" ]; }

scenario_product_images() {  # the test bed's images hold what the Dockerfiles install, and run
  local f name img n dest mode checks uid out want_uid
  for f in "$REPO"/images/*.Dockerfile; do
    name=mockgpu-$(basename "$f" .Dockerfile); img=localhost/$name:1; checks=""
    # shellcheck disable=SC2016 # expanded in the container
    while read -r n dest mode; do checks="$checks stat -c '%n %a' $dest;"; done < <("$REPO/tests/images.sh" installs "$f")
    img_pod "$name-files" "$img" "\"command\": [\"/bin/sh\", \"-c\", \"$checks id -u\"]"
    # the entry point as the Dockerfile sets it, with --version for arguments
    img_pod "$name-entry" "$img" '"args": ["--version"]'
    wait_for 60 "$name-files Succeeded" pod_phase_is "$name-files" Succeeded \
      || { kc describe pod "$name-files" | tail -15; fail "$img: the file checks failed: $(kc logs "$name-files" 2>&1 | tail -3)"; }
    out=$(kc logs "$name-files")
    while read -r n dest mode; do
      grep -qx "$dest $mode" <<< "$out" || fail "$img: want $dest with mode $mode (as $f installs it), got: $(tr '\n' ' ' <<< "$out")"
    done < <("$REPO/tests/images.sh" installs "$f")
    uid=$(tail -1 <<< "$out"); want_uid=$("$REPO/tests/images.sh" config "$f" | jq -r '.User // "0"'); want_uid=${want_uid%%:*}
    [ "$uid" = "$want_uid" ] || fail "$img runs as uid $uid, $f says USER $want_uid"
    wait_for 60 "$name-entry Succeeded" pod_phase_is "$name-entry" Succeeded \
      || fail "$img: its entry point with --version failed: $(kc logs "$name-entry" 2>&1 | tail -3)"
    echo "  $img: $(sed '$d' <<< "$out" | tr '\n' ' ')uid $uid; entry point --version: $(kc logs "$name-entry")"
    kc delete pod "$name-files" "$name-entry" --wait=false > /dev/null
  done
}

# ---------------------------------------------------------------------------------------------
# the agent's device plugin against the real kubelet

allocatable() { kc get node "$NODE" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}'; }
allocatable_is() { [ "$(allocatable)" = "$1" ]; }
# log_since <file> <line count before> <pattern>: the pattern in the lines written since
log_since() { tail -n +"$(( $2 + 1 ))" "$1" | matches -- "$3"; }

# ---------------------------------------------------------------------------------------------
# the controller's steps (controller-rbac ... controller-gpunode-deleted) are in Rust
# (src/scenarios/controller.rs): two replicas as host processes in the node's network namespace
# (kinds controller-ctl-a, controller-ctl-b), with a service account's token and the chart's RBAC

# chart_rbac <agent|controller> <namespace>: that component's service account and roles as the
# chart makes them (release mockgpu), applied by kubectl: the steps before chart-install run the
# binaries as host processes with the chart's own least privilege
chart_rbac() {
  kc create namespace "$2" --dry-run=client -o yaml | kc apply -f - > /dev/null
  hc template mockgpu "$REPO/charts/mockgpu" --namespace "$2" --show-only "templates/$1-rbac.yaml" > "$ST/$1-rbac.yaml" \
    || fail "helm template of the chart's $1 RBAC"
  kc apply -f "$ST/$1-rbac.yaml" > /dev/null
}

# ---------------------------------------------------------------------------------------------
# Slurm the way Slinky runs it (slinky-slurm, chart-slinky-remediation): in Rust
# (src/scenarios/slinky.rs, chart.rs)

slinky_supported() {  # Slinky's operator supports Slurm 25.11 and later
  local v; v=$(innode slurmd -V | awk '{print $2}')
  awk -v v="$v" 'BEGIN {split(v, p, "."); exit !(p[1] > 25 || (p[1] == 25 && p[2] >= 11))}'
}

# ---------------------------------------------------------------------------------------------
# the agent's GpuNode report against the real API server, with the agent's own credentials

AGENT_SA=mockgpu-agent                     # the agent's service account ...
AGENT_SA_NS=mockgpu-system                 # ... in this namespace
AGENT_KCFG=$KN/mockgpu-agent.kubeconfig    # node path of its kubeconfig (a bound token)
AGENT_USER=system:serviceaccount:$AGENT_SA_NS:$AGENT_SA
# the test bed's reporting agent: its kubeconfig, and a short heartbeat
REPORT_ARGS="--kubeconfig $AGENT_KCFG --heartbeat 3"
gn() { kc get gpunode "$NODE" -o jsonpath="$1"; }   # gn <jsonpath>: of the node's GpuNode
gn_ready() { [ "$(gn '{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }
# kubectl as the agent: its token, its RBAC
kc_as() { local f=$1; shift; nsenter -t "$(nodepid)" -n -- "$KUBECTL" --kubeconfig "$f" --request-timeout=30s "$@"; }  # kc_as <kubeconfig> ...
kc_agent() { kc_as "$R$AGENT_KCFG" "$@"; }

agent_kubeconfig() { kubeconfig "$R$AGENT_KCFG" "$AGENT_SA" "$1"; }  # agent_kubeconfig <token>

scenario_gpunode_setup() {  # the CRD, the agent's service account and RBAC; the agent restarted with them
  # the agent so far had no credentials: it said so once (the log is kept across runs: count from
  # the start before the one of this agent, which logs the line just before it listens)
  local prev n
  prev=$(grep -n 'health endpoint listening' "$LOGS/agent.log" | tail -2 | head -n -1 | cut -d: -f1)
  n=$(tail -n +"$(( ${prev:-0} + 1 ))" "$LOGS/agent.log" | grep -c 'no Kubernetes API server configured: not reporting' || true)
  [ "$n" = 1 ] || fail "the agent without credentials logged 'not reporting' $n times, want once"
  # the GPU pods of the earlier steps gone, HELD counts only this test's pods
  if ! kc wait --for=delete "namespace/$GPU_NS" --timeout=90s > /dev/null 2>&1; then
    ! kc get namespace "$GPU_NS" > /dev/null 2>&1 || fail "namespace $GPU_NS still there 90 s after its deletion"
  fi
  kc apply -f "$REPO/charts/mockgpu/crds/gpunodes.mockgpu.io.yaml" > /dev/null
  kc wait --for=condition=Established crd/gpunodes.mockgpu.io --timeout=60s > /dev/null
  chart_rbac agent "$AGENT_SA_NS"
  local token; token=$(kc -n "$AGENT_SA_NS" create token "$AGENT_SA" --duration=2h)
  agent_kubeconfig "$token"
  # real RBAC: the token may read its node and write GpuNodes, nothing else
  wait_for 30 "the agent's token may get node $NODE" kc_agent get node "$NODE"
  local out
  if out=$(kc_agent get pods -A 2>&1); then fail "the agent's token lists pods: $out"; fi
  grep -q Forbidden <<< "$out" || fail "listing pods as the agent: $out"
  if out=$(kc_agent delete gpunode nothing-here 2>&1); then fail "the agent's token deletes GpuNodes: $out"; fi
  grep -q Forbidden <<< "$out" || fail "deleting a GpuNode as the agent: $out"
  echo "  CRD gpunodes.mockgpu.io established; $AGENT_USER may get nodes and write gpunodes; listing pods, deleting gpunodes: Forbidden"
  stop_kinds TERM agent
  local t; t=$(date +%s%N)
  start_reporting_agent
  timing agent-ready-reporting "$(ms "$t") ms"
}

start_reporting_agent() {  # the host agent with its credentials, ready, its GPUs allocatable
  local n0; n0=$(nri_lines)
  AGENT_ARGS="$AGENT_ARGS $REPORT_ARGS" start_agent
  wait_for 30 "agent ready with credentials" agent_ready "$n0" || { tail -20 "$LOGS/agent.log"; exit 1; }
  wait_for 60 "allocatable $RES = 4 again" allocatable_is 4 || fail "allocatable $RES is '$(allocatable)' after the agent restart"
}






gn_apply_status() { kc apply --server-side --force-conflicts --field-manager=mockgpu-agent --subresource=status -f -; }  # < the status's YAML, as the agent applies it
gn_ready_is() { [ "$(gn '{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].reason}')" = "$1" ]; }
gn_instance_not() { local i; i=$(gn '{.status.agentInstance}') && [ -n "$i" ] && [[ " $* " != *" $i "* ]]; }
gn_reported_anew() { gn_instance_not "$@" && gn_ready_is "True TreeMounted"; }   # gn_reported_anew <old instances>

scenario_gpunode_last_report() {  # a stopping agent reports Ready False, unless a successor reports
  local first second l0
  first=$(gn '{.status.agentInstance}'); [ -n "$first" ] || fail "the GpuNode's status names no agentInstance"
  stop_kinds TERM agent
  gn_ready_is "False AgentStopped" || fail "Ready after the agent stopped: $(gn '{.status.conditions}')"
  start_reporting_agent
  wait_for 30 "GpuNode $NODE reported by a new agent" gn_reported_anew "$first" || fail "no report of the new agent: $(gn '{.status}')"
  second=$(gn '{.status.agentInstance}')
  # a rollout's successor has reported (as the agent's field manager); then the old agent stops.
  # The running agent may report once more in between (a heartbeat, its device plugin's change):
  # then it is the reporter again and says so at its stop; that race is the test's, so it retries
  local try
  for try in 1 2 3; do
    gn_apply_status > /dev/null <<EOF
apiVersion: mockgpu.io/v1alpha1
kind: GpuNode
metadata: {name: $NODE}
status:
  agentInstance: mgtb-successor
  conditions:
  - {type: Ready, status: "True", reason: Successor, message: a rollout's new agent, lastTransitionTime: "$(date -u +%Y-%m-%dT%H:%M:%SZ)"}
EOF
    l0=$(wc -l < "$LOGS/agent.log")
    stop_kinds TERM agent
    # (the log may trail the process that stop_kinds waited for by a few milliseconds)
    wait_for 10 "the stopping agent's last report" log_since "$LOGS/agent.log" "$l0" 'another agent reports the GpuNode now\|GpuNode reported not Ready' \
      || fail "the stopping agent logged no last report: $(tail -n +"$l0" "$LOGS/agent.log" | tail -5)"
    log_since "$LOGS/agent.log" "$l0" 'another agent reports the GpuNode now' && break
    [ "$try" -lt 3 ] || fail "the stopping agent did not see the successor, $try times: $(tail -n +"$l0" "$LOGS/agent.log" | tail -5)"
    echo "  try $try: the agent reported again between the successor's report and its stop; once more"
    second=$(gn '{.status.agentInstance}')
    start_reporting_agent
    wait_for 30 "GpuNode $NODE reported by a new agent" gn_reported_anew "$first" "$second" || fail "no report of the new agent: $(gn '{.status}')"
    second=$(gn '{.status.agentInstance}')
  done
  [ "$(gn '{.status.agentInstance}')" = mgtb-successor ] && gn_ready_is "True Successor" \
    || fail "the stopping agent overwrote its successor's report: $(gn '{.status}')"
  # the stopping agent applies at the resourceVersion it read: the API server refuses a stale one
  local rv out; rv=$(gn '{.metadata.resourceVersion}')
  kc annotate gpunode "$NODE" mockgpu.io/testbed-touch="$(date +%s%N)" --overwrite > /dev/null
  if out=$(printf 'apiVersion: mockgpu.io/v1alpha1\nkind: GpuNode\nmetadata: {name: %s, resourceVersion: "%s"}\nstatus: {agentInstance: mgtb-stale}\n' "$NODE" "$rv" \
      | gn_apply_status 2>&1); then
    fail "a status apply at the stale resourceVersion $rv was accepted: $out"
  fi
  grep -q 'the object has been modified' <<< "$out" || fail "a status apply at a stale resourceVersion: $out"
  kc annotate gpunode "$NODE" mockgpu.io/testbed-touch- > /dev/null
  echo "  alone, the stopping agent reported Ready False AgentStopped; after a successor's report it left the GpuNode to it; a status apply at a stale resourceVersion is refused (409)"
  start_reporting_agent
  wait_for 30 "GpuNode $NODE reported by the next agent" gn_reported_anew "$first" "$second" mgtb-successor || fail "no report of the next agent: $(gn '{.status}')"
}

# ---------------------------------------------------------------------------------------------
# the chart as a user installs it (the README's commands): chart-install, chart-slinky-remediation
# and chart-uninstall are in Rust (src/scenarios/chart.rs)

run_cluster_scenarios() {
  sstep node-ready rust_scenario node-ready
  sstep pod-daemonset-exec rust_scenario pod-daemonset-exec
  sstep crd-admission-policy scenario_policy
  sstep helm scenario_helm
  sstep chart-dry-run scenario_chart_dry_run
  sstep product-images scenario_product_images
  sstep device-plugin-socket rust_scenario device-plugin-socket
  sstep gpu-pod-injected rust_scenario gpu-pod-injected
  sstep dp-registered rust_scenario dp-registered
  sstep gpunode-setup scenario_gpunode_setup
  sstep gpunode-reported rust_scenario gpunode-reported
  sstep dp-pod-2-gpus rust_scenario dp-pod-2-gpus
  sstep gpunode-held rust_scenario gpunode-held
  sstep dp-pod-5-pending rust_scenario dp-pod-5-pending
  sstep dp-failed-gpu rust_scenario dp-failed-gpu
  sstep dp-kubelet-restart rust_scenario dp-kubelet-restart
  sstep gpunode-topology rust_scenario gpunode-topology
  sstep gpunode-recreated rust_scenario gpunode-recreated
  sstep gpunode-heartbeat rust_scenario gpunode-heartbeat
  sstep gpunode-last-report scenario_gpunode_last_report
  sstep controller-rbac rust_scenario controller-rbac
  sstep controller-leader rust_scenario controller-leader
  sstep controller-labels rust_scenario controller-labels
  sstep controller-stale rust_scenario controller-stale
  sstep controller-failover rust_scenario controller-failover
  sstep controller-apiserver-restart rust_scenario controller-apiserver-restart
  sstep controller-gpunode-deleted rust_scenario controller-gpunode-deleted
  if slinky_supported; then sstep slinky-slurm rust_scenario slinky-slurm
  else log "slinky-slurm: left out: the node root has Slurm $(innode slurmd -V | awk '{print $2}'), Slinky's operator supports 25.11 and later (SUITE=sid has 26.05)"; fi
  sstep chart-install rust_scenario chart-install
  # (Slurm 24.11's dynamic nodes ignore autodetected GPUs that their --conf does not name: the
  # Slinky shape needs 25.11 or later there too)
  if slinky_supported; then sstep chart-slinky-remediation rust_scenario chart-slinky-remediation
  else log "chart-slinky-remediation: left out: Slurm $(innode slurmd -V | awk '{print $2}') ignores the GPUs a dynamic node autodetects (SUITE=sid has 26.05)"; fi
  sstep chart-uninstall rust_scenario chart-uninstall
}

cluster_down() {  # (phase_down, first) the kubelet before the runtime, so that it restarts nothing
  stop_kinds TERM controller-ctl-a controller-ctl-b kubelet kube-scheduler kube-controller-manager kube-apiserver etcd
}
