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
AGENT_ARGS="--device-plugin --kubelet-dir /var/lib/kubelet${AGENT_ARGS:+ $AGENT_ARGS}"

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

kubeconfig() {  # kubeconfig <file> <cert name>: embedded data, so that it works from host and node
  local P=$R$KN/pki
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: mgtb
  cluster: {server: "https://127.0.0.1:6443", certificate-authority-data: "$(base64 -w0 "$P/ca.crt")"}
users:
- name: $2
  user: {client-certificate-data: "$(base64 -w0 "$P/$2.crt")", client-key-data: "$(base64 -w0 "$P/$2.key")"}
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

etcd_healthy() { nsenter -t "$(nodepid)" -n -- curl -sf http://127.0.0.1:2379/health | grep -q '"health":"true"'; }
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

node_ready() { [ "$(kc get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }

scenario_node_ready() {
  local t; t=$(date +%s%N)
  wait_for 120 "node $NODE Ready" node_ready || { kc describe node "$NODE" | tail -30; exit 1; }
  timing node-ready "$(ms "$t") ms after registration"
  kc get nodes -o wide | sed 's/^/  /'
  local v; v=$(kc get node "$NODE" -o jsonpath='{.status.nodeInfo.kubeletVersion}')
  [ "$v" = "$K8S_VERSION" ] || fail "kubelet version $v, want $K8S_VERSION"
  echo "  container runtime: $(kc get node "$NODE" -o jsonpath='{.status.nodeInfo.containerRuntimeVersion}')"
}

# (pods here have terminationGracePeriodSeconds: 1, since `sleep` as PID 1 ignores SIGTERM and the
# default 30 s would be waited out on every delete)
scenario_workloads() {  # a Pod (on the pod network) and a DaemonSet run; kubectl exec works
  wait_for 60 "the default service account" kc get serviceaccount default
  kc apply -f - > /dev/null <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: podnet, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: localhost/busybox:1, imagePullPolicy: Never, command: ["/bin/sleep", "3600"]}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: hostds, namespace: default}
spec:
  selector: {matchLabels: {app: hostds}}
  template:
    metadata: {labels: {app: hostds}}
    spec:
      hostNetwork: true
      terminationGracePeriodSeconds: 1
      containers:
      - {name: c, image: localhost/busybox:1, imagePullPolicy: Never, command: ["/bin/sleep", "3600"]}
EOF
  local t; t=$(date +%s%N)
  kc wait --for=condition=Ready pod/podnet --timeout=120s > /dev/null || { kc describe pod podnet | tail -20; exit 1; }
  timing pod-ready "$(ms "$t") ms"
  kc rollout status ds/hostds --timeout=120s > /dev/null || { kc describe ds hostds | tail -20; exit 1; }
  local ip; ip=$(kc get pod podnet -o jsonpath='{.status.podIP}')
  [[ $ip == 198.51.100.* ]] || fail "pod IP $ip is not in the bridge's $POD_CIDR"
  kc get pods -o wide | sed 's/^/  /'
  local out rc=0
  out=$(kc exec podnet -- sh -c 'echo exec-ok; exit 3') || rc=$?
  [ "$out" = exec-ok ] && [ $rc = 3 ] || fail "kubectl exec: output '$out', exit $rc (want exec-ok, 3)"
  echo "  kubectl exec: output and exit code relayed; pod IP $ip"
  kc delete ds/hostds pod/podnet --wait=true --timeout=60s > /dev/null
}

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
  local out="" i
  for i in $(seq 50); do
    if out=$(widget big 8 | kc create -f - 2>&1); then kc delete widget big > /dev/null; sleep 0.2; continue; fi
    break
  done
  echo "  denied: $out"
  grep -q 'a widget has at most 4 GPUs' <<< "$out" || fail "the ValidatingAdmissionPolicy did not deny the widget (try $i): $out"
  kc delete validatingadmissionpolicybinding/widget-gpus validatingadmissionpolicy/widget-gpus crd/widgets.testbed.mockgpu.io > /dev/null
}

scenario_device_plugin_socket() {
  local s=$R/var/lib/kubelet/device-plugins/kubelet.sock
  wait_for 30 "the kubelet's device-plugin registration socket" test -S "$s"
  echo "  $s (node path /var/lib/kubelet/device-plugins/kubelet.sock)"
}

pod_ctr() {  # pod_ctr <key> <namespace> <pod>: the CRI id and host PID of its container, in $ST/<key>.env
  local id; id=$(kc -n "$2" get pod "$3" -o jsonpath='{.status.containerStatuses[0].containerID}')
  id=${id#containerd://}; [ -n "$id" ] || fail "pod $2/$3 has no container id"
  printf 'CTR=%s\nPID=%s\n' "$id" "$(cri pid "$id")" > "$ST/$1.env"
}

scenario_gpu_pod() {  # kubelet -> containerd -> NRI: a pod holding /dev/nvidia0 is injected
  slurm_write_conf nvidia
  kc apply -f - > /dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: $GPU_NS}
---
apiVersion: v1
kind: Pod
metadata: {name: gpu-0, namespace: $GPU_NS}
spec:
  hostNetwork: true
  containers:
  - name: slurmd
    image: localhost/slurmd:1
    imagePullPolicy: Never
    command: ["/bin/sleep", "infinity"]
    securityContext: {privileged: true}
    volumeMounts: [{name: slurm, mountPath: /etc/slurm, readOnly: true}]
  volumes: [{name: slurm, hostPath: {path: /etc/slurm, type: Directory}}]
---
apiVersion: v1
kind: Pod
metadata: {name: env-only, namespace: $GPU_NS}
spec:
  containers:
  - name: c
    image: localhost/busybox:1
    imagePullPolicy: Never
    command: ["/bin/sleep", "infinity"]
    env: [{name: NVIDIA_VISIBLE_DEVICES, value: all}]
EOF
  local t; t=$(date +%s%N)
  kc -n "$GPU_NS" wait --for=condition=Ready pod/gpu-0 pod/env-only --timeout=120s > /dev/null \
    || { kc -n "$GPU_NS" describe pods | tail -30; exit 1; }
  timing gpu-pod-ready "$(ms "$t") ms"
  pod_ctr k8s-gpu "$GPU_NS" gpu-0; pod_ctr k8s-env "$GPU_NS" env-only
  assert_injected k8s-gpu
  # NVIDIA_VISIBLE_DEVICES counts only in trusted namespaces
  assert_untouched k8s-env
  echo "  privileged pod holding /dev/nvidia0-3 injected; env-only pod in $GPU_NS untouched"
  local info c
  info=$(kc -n "$GPU_NS" exec gpu-0 -- sh -c 'cat /proc/driver/nvidia/gpus/*/information') || fail "information not readable"
  [ "$(grep -c '^Model:' <<< "$info")" = 4 ] || fail "want 4 GPUs' information, got: $(head -3 <<< "$info")"
  echo "  $(grep -m1 '^Model:' <<< "$info")"
  c=$(kc -n "$GPU_NS" exec gpu-0 -- slurmd -C) || fail "slurmd -C in the pod"
  echo "  slurmd -C: $(sed -n 1p <<< "$c")"
  grep -q ' Gres=gpu:nvidia_gb300:4' <<< "$c" || fail "slurmd -C in the pod does not find gpu:nvidia_gb300:4"
  kc delete namespace "$GPU_NS" --wait=false > /dev/null
}

# (replaces the host-network test bed's step of the same name)
isolation() {  # nothing reaches out of the node, nothing listens outside it, nothing pulled
  local l bad="" hostnet p
  while read -r l; do
    case $l in
      lo|cni0) ;;
      veth*) innode busybox ip -o link show "$l" | grep -q 'master cni0' || bad="$bad $l(no master cni0)" ;;
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

# ---------------------------------------------------------------------------------------------
# the agent's device plugin against the real kubelet

allocatable() { kc get node "$NODE" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}'; }
allocatable_is() { [ "$(allocatable)" = "$1" ]; }
# log_since <file> <line count before> <pattern>: the pattern in the lines written since
log_since() { tail -n +"$(( $2 + 1 ))" "$1" | grep -q -- "$3"; }

scenario_dp_registered() {  # --device-plugin registers; the node advertises the 4 GPUs
  local t; t=$(date +%s%N)
  wait_for 60 "allocatable $RES = 4" allocatable_is 4 \
    || { grep -i 'device plugin\|kubelet' "$LOGS/agent.log" | tail -10; fail "allocatable $RES is '$(allocatable)', want 4"; }
  timing dp-allocatable "$(ms "$t") ms after node-ready"
  grep -q 'registered with the kubelet' "$LOGS/agent.log" || fail "the agent logged no registration"
  grep -q "Got registration request from device plugin with resource.*$RES" "$LOGS/kubelet.log" \
    || fail "the kubelet logged no registration request for $RES"
  echo "  allocatable $RES: $(allocatable), capacity $(kc get node "$NODE" -o jsonpath='{.status.capacity.nvidia\.com/gpu}')"
}

dp_pod() {  # dp_pod <name> <GPUs> [namespace]: a pod (in $DP_NS) with limits nvidia.com/gpu: <GPUs>
  kc apply -f - > /dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: ${3:-$DP_NS}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: localhost/slurmd:1
    imagePullPolicy: Never
    command: ["/bin/sleep", "infinity"]
    resources: {limits: {$RES: "$2"}}
EOF
}

dp_ns() { kc create namespace "$1" > /dev/null; wait_for 60 "the default service account in $1" kc -n "$1" get serviceaccount default; }

scenario_dp_pod() {  # 2 GPUs from the kubelet: 2 device nodes, their UUIDs, the NRI injection
  dp_ns "$DP_NS"
  dp_pod gpu-2 2
  local t; t=$(date +%s%N)
  kc -n "$DP_NS" wait --for=condition=Ready pod/gpu-2 --timeout=120s > /dev/null \
    || { kc -n "$DP_NS" describe pod gpu-2 | tail -20; exit 1; }
  timing dp-pod-ready "$(ms "$t") ms"
  local devs minors vis uuids gpus want
  devs=$(kc -n "$DP_NS" exec gpu-2 -- ls /dev | grep -E '^nvidia[0-9]+$' | sort -V | tr '\n' ' ')
  [ "$(wc -w <<< "$devs")" = 2 ] || fail "want two /dev/nvidia<N> in the pod, got: $devs"
  minors=$(sed 's/nvidia//g' <<< "$devs")
  vis=$(kc -n "$DP_NS" exec gpu-2 -- sh -c 'echo "$NVIDIA_VISIBLE_DEVICES"')
  uuids=$(tr ',' '\n' <<< "$vis" | grep -cE '^GPU-[0-9a-f-]{36}$' || true)
  [ "$uuids" = 2 ] && [ "$(tr ',' '\n' <<< "$vis" | wc -l)" = 2 ] || fail "NVIDIA_VISIBLE_DEVICES='$vis', want two GPU UUIDs"
  # the UUIDs are those of the allocated minors in the agent's tree
  local m u; for m in $minors; do
    u=$(innode sh -c "grep -l '^Device Minor:[[:space:]]*$m\$' $MOCK/proc/driver/nvidia/gpus/*/information | xargs grep -h '^GPU UUID:'" | awk '{print $3}')
    [[ ,$vis, == *",$u,"* ]] || fail "/dev/nvidia$m is GPU $u, not in NVIDIA_VISIBLE_DEVICES=$vis"
  done
  grep -q 'GPUs allocated to a container' "$LOGS/agent.log" || fail "the agent logged no allocation"
  pod_ctr k8s-dp "$DP_NS" gpu-2
  # shellcheck disable=SC2086 # the minors, one word each
  assert_injected k8s-dp "$(echo $minors)"
  gpus=$(kc -n "$DP_NS" exec gpu-2 -- ls /proc/driver/nvidia/gpus | tr '\n' ' ')
  want=$(innode ls "$MOCK/proc/driver/nvidia/gpus" | tr '\n' ' ')
  [ -n "$want" ] && [ "$gpus" = "$want" ] || fail "ls /proc/driver/nvidia/gpus in the pod: '$gpus', the node's: '$want'"
  echo "  devices: $devs; NVIDIA_VISIBLE_DEVICES=$vis; injected; /proc/driver/nvidia/gpus: $gpus"
}

unschedulable_reason() {
  kc -n "$DP_NS" get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].reason} {.status.conditions[?(@.type=="PodScheduled")].message}'
}
pod_unschedulable() { [[ $(unschedulable_reason "$1") == "Unschedulable "*"Insufficient $RES"* ]]; }

scenario_dp_too_many() {  # 5 GPUs on a node of 4: Pending, with the scheduler's reason
  dp_pod gpu-5 5
  wait_for 60 "gpu-5 unschedulable (Insufficient $RES)" pod_unschedulable gpu-5 \
    || fail "gpu-5: PodScheduled is '$(unschedulable_reason gpu-5)', want Unschedulable ... Insufficient $RES"
  local phase; phase=$(kc -n "$DP_NS" get pod gpu-5 -o jsonpath='{.status.phase}')
  [ "$phase" = Pending ] || fail "gpu-5 is $phase, want Pending"
  echo "  gpu-5: $phase, $(unschedulable_reason gpu-5)"
  kc delete namespace "$DP_NS" --wait=false > /dev/null
}

scenario_dp_failed_gpu() {  # failed_gpus: [3] in the profile: allocatable 3, live; restored: 4
  write_profile 4 'failed_gpus: [3]'
  local t; t=$(date +%s%N)
  wait_for 30 "allocatable $RES = 3" allocatable_is 3 || fail "allocatable $RES is '$(allocatable)' 30 s after failed_gpus: [3], want 3"
  timing dp-failed-gpu "$(ms "$t") ms to allocatable 3"
  local cap; cap=$(kc get node "$NODE" -o jsonpath='{.status.capacity.nvidia\.com/gpu}')
  [ "$cap" = 4 ] || fail "capacity $RES is '$cap', want 4 (the failed GPU stays listed)"
  write_profile 4; t=$(date +%s%N)
  wait_for 30 "allocatable $RES = 4" allocatable_is 4 || fail "allocatable $RES is '$(allocatable)' after the GPU came back, want 4"
  timing dp-gpu-back "$(ms "$t") ms to allocatable 4"
  echo "  failed_gpus: [3] -> allocatable 3 (capacity $cap); back -> $(allocatable)"
}

scenario_dp_kubelet_restart() {  # a restarted kubelet: the plugin registers again and allocates
  local na nk t; na=$(wc -l < "$LOGS/agent.log"); nk=$(wc -l < "$LOGS/kubelet.log")
  t=$(date +%s%N); stop_kinds TERM kubelet
  timing dp-kubelet-stopped "$(ms "$t") ms"
  t=$(date +%s%N); spawn_kubelet
  wait_for 60 "the agent registers again" log_since "$LOGS/agent.log" "$na" 'registered with the kubelet' \
    || { tail -n +"$(( na + 1 ))" "$LOGS/agent.log" | tail -10; fail "the agent did not register again after the kubelet restart"; }
  timing dp-reregistered "$(ms "$t") ms after the kubelet restart"
  log_since "$LOGS/kubelet.log" "$nk" "Got registration request from device plugin with resource.*$RES" \
    || fail "the restarted kubelet logged no registration request for $RES"
  wait_for 60 "allocatable $RES = 4" allocatable_is 4 || fail "allocatable $RES is '$(allocatable)' after the kubelet restart, want 4"
  wait_for 120 "node $NODE Ready" node_ready || fail "the node is not Ready after the kubelet restart"
  # only a registered plugin's devices are allocated: a new pod with a GPU runs
  local ns=$DP_NS-restart; dp_ns "$ns"; dp_pod gpu-1 1 "$ns"; t=$(date +%s%N)
  kc -n "$ns" wait --for=condition=Ready pod/gpu-1 --timeout=120s > /dev/null \
    || { kc -n "$ns" describe pod gpu-1 | tail -20; fail "a pod with 1 GPU did not start after the kubelet restart"; }
  timing dp-pod-after-restart "$(ms "$t") ms"
  kc delete namespace "$ns" --wait=false > /dev/null
  echo "  re-registered: $(tail -n +"$(( na + 1 ))" "$LOGS/agent.log" | grep -m1 'registered with the kubelet' | sed 's/^.*INFO //')"
  echo "  allocatable $RES after the restart: $(allocatable)"
}

# ---------------------------------------------------------------------------------------------
# the controller: two replicas as host processes in the node's network namespace, with a service
# account's token and the least privilege the chart grants; a fake Node of our own with a GpuNode
# whose heartbeats the steps write (the agent's GpuNode of node0 is the agent's business)

CONTROLLER_BIN=${CONTROLLER_BIN:-$(dirname "$AGENT_BIN")/mockgpu-controller}
CTL_NS=mockgpu-system
CTL_SA=system:serviceaccount:$CTL_NS:mockgpu-controller
CTL_NODE=mgtb-gpu1                 # a Node object without a kubelet, ours to label
CTL_STALE=20                       # MOCKGPU_STALE_AFTER of the replicas (s)
CTL_LEASE_S=15                     # the lease's duration (the controller's default)

ctl_holder() { kc -n "$CTL_NS" get lease mockgpu-controller -o jsonpath='{.spec.holderIdentity}' 2> /dev/null; }
ctl_holder_is() { [ "$(ctl_holder)" = "$1" ]; }
ctl_holder_in() { local h; h=$(ctl_holder); [ -n "$h" ] && [[ " $* " == *" $h "* ]]; }
ctl_label() { kc get node "$CTL_NODE" -o jsonpath="{.metadata.labels.${1//./\\.}}"; }
ctl_label_is() { [ "$(ctl_label "$1")" = "$2" ]; }
ctl_cond() { kc get gpunode "$CTL_NODE" -o jsonpath="{.status.conditions[?(@.type==\"$1\")].status}"; }
ctl_cond_is() { [ "$(ctl_cond "$1")" = "$2" ]; }
ctl_curl() { nsenter -t "$(nodepid)" -n -- curl -sf "http://127.0.0.1:$1$2"; }
ctl_port() { case $1 in ctl-a) echo 18080 ;; *) echo 18081 ;; esac; }

ctl_start() {  # ctl_start <identity>: a replica, kind controller-<identity>, log controller-<identity>.log
  setsid nsenter -t "$(nodepid)" -n -- env POD_NAMESPACE=$CTL_NS POD_NAME="$1" \
    MOCKGPU_CONTROLLER_LISTEN="127.0.0.1:$(ctl_port "$1")" MOCKGPU_STALE_AFTER=$CTL_STALE \
    "$CONTROLLER_BIN" run --kubeconfig "$ST/controller.kubeconfig" >> "$LOGS/controller-$1.log" 2>&1 < /dev/null 9>&- &
  track "controller-$1" $!
}

ctl_heartbeat() {  # ctl_heartbeat [topologySince]: the GpuNode's status as an agent would write it
  local now; now=$(date -u +%FT%TZ)
  kc patch gpunode "$CTL_NODE" --subresource=status --type=merge \
    -p "{\"status\":{\"lastHeartbeat\":\"$now\",\"topologySince\":\"${1:-$now}\",\"heldGpus\":0}}" > /dev/null
}

ctl_gpunode() {  # ctl_gpunode <profile> <GPUs> <model>: our GpuNode's spec
  local i gpus=""
  for i in $(seq 0 $(( $2 - 1 ))); do
    gpus="$gpus{index: $i, minor: $i, uuid: GPU-0000000$i-0000-0000-0000-000000000000, busId: '0000:0$i:00.0', model: $3, numaNode: 0, localCpulist: '0-7', socket: 0},"
  done
  kc apply -f - > /dev/null <<EOF
apiVersion: mockgpu.io/v1alpha1
kind: GpuNode
metadata: {name: $CTL_NODE}
spec: {nodeName: $CTL_NODE, mode: mock, profile: $1, topologyHash: $1-$2, gpuCount: $2, gpus: [${gpus%,}]}
EOF
}

scenario_controller_rbac() {  # the CRD, the service account, its roles, a token kubeconfig; can-i
  "$CONTROLLER_BIN" crd | kc apply -f - > /dev/null
  kc wait --for=condition=Established crd/gpunodes.mockgpu.io --timeout=60s > /dev/null
  kc apply -f - > /dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: $CTL_NS}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: mockgpu-controller, namespace: $CTL_NS}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: mockgpu-controller}
rules:
- {apiGroups: [mockgpu.io], resources: [gpunodes], verbs: [get, list, watch]}
- {apiGroups: [mockgpu.io], resources: [gpunodes/status], verbs: [patch, update]}
- {apiGroups: [""], resources: [nodes], verbs: [get, list, watch, patch]}
- {apiGroups: [""], resources: [pods], verbs: [get, list, watch, delete]}
- {apiGroups: [events.k8s.io], resources: [events], verbs: [create, patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: mockgpu-controller}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: mockgpu-controller}
subjects: [{kind: ServiceAccount, name: mockgpu-controller, namespace: $CTL_NS}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: mockgpu-controller-lease, namespace: $CTL_NS}
rules:
- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, create, update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: mockgpu-controller-lease, namespace: $CTL_NS}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: mockgpu-controller-lease}
subjects: [{kind: ServiceAccount, name: mockgpu-controller, namespace: $CTL_NS}]
EOF
  local token; token=$(kc -n "$CTL_NS" create token mockgpu-controller --duration=2h)
  cat > "$ST/controller.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: mgtb
  cluster: {server: "https://127.0.0.1:6443", certificate-authority-data: "$(base64 -w0 "$R$KN/pki/ca.crt")"}
users:
- name: mockgpu-controller
  user: {token: "$token"}
contexts:
- name: mgtb
  context: {cluster: mgtb, user: mockgpu-controller}
current-context: mgtb
EOF
  chmod 600 "$ST/controller.kubeconfig"
  local v want got bad=""
  while read -r want v; do
    # shellcheck disable=SC2086 # the verb, resource and flags are words
    got=$(kc auth can-i --as="$CTL_SA" $v 2> /dev/null || true)
    [ "$got" = "$want" ] || bad="$bad [$v: $got, want $want]"
  done <<EOF
yes patch nodes
yes delete pods -n $GPU_NS
yes patch gpunodes.mockgpu.io --subresource=status
yes update leases.coordination.k8s.io -n $CTL_NS
yes create events.events.k8s.io -n default
no delete nodes
no patch gpunodes.mockgpu.io
no delete gpunodes.mockgpu.io
no create pods -n $GPU_NS
no get secrets -n $CTL_NS
no update leases.coordination.k8s.io -n kube-system
no delete leases.coordination.k8s.io -n $CTL_NS
EOF
  [ -z "$bad" ] || fail "RBAC of the controller's service account:$bad"
  echo "  $CTL_SA: granted exactly the listed verbs (12 can-i checks: 5 allowed, 7 denied)"
}

scenario_controller_leader() {  # two replicas: one holds the lease and acts, both are ready
  kc apply -f - > /dev/null <<EOF
apiVersion: v1
kind: Node
metadata: {name: $CTL_NODE, labels: {kubernetes.io/hostname: $CTL_NODE}}
EOF
  local t; t=$(date +%s%N)
  ctl_start ctl-a; ctl_start ctl-b
  wait_for 30 "a controller holds the lease" ctl_holder_in ctl-a ctl-b || { tail -5 "$LOGS"/controller-ctl-*.log; exit 1; }
  timing controller-leader "$(ms "$t") ms to a lease holder"
  local leader standby; leader=$(ctl_holder); standby=$([ "$leader" = ctl-a ] && echo ctl-b || echo ctl-a)
  wait_for 10 "$standby ready" ctl_curl "$(ctl_port "$standby")" /readyz
  wait_for 10 "$leader ready" ctl_curl "$(ctl_port "$leader")" /readyz
  ctl_curl "$(ctl_port "$leader")" /metrics | grep -qx 'mockgpu_controller_leader 1' || fail "$leader: metric leader is not 1"
  ctl_curl "$(ctl_port "$standby")" /metrics | grep -qx 'mockgpu_controller_leader 0' || fail "$standby: metric leader is not 0"
  grep -q 'leading: controllers started' "$LOGS/controller-$leader.log" || fail "$leader did not log leading"
  ! grep -q 'leading: controllers started' "$LOGS/controller-$standby.log" || fail "$standby started its controllers too"
  echo "$leader" > "$ST/controller.leader"
  echo "  leader $leader, standby $standby (both /readyz 200; metric mockgpu_controller_leader 1 / 0)"
}

scenario_controller_labels() {  # a GpuNode: its Node gets the labels, only from the leader
  local leader standby t; leader=$(cat "$ST/controller.leader"); standby=$([ "$leader" = ctl-a ] && echo ctl-b || echo ctl-a)
  t=$(date +%s%N)
  ctl_gpunode gb300 4 "NVIDIA GB300"; ctl_heartbeat
  wait_for 30 "node $CTL_NODE labelled gb300" ctl_label_is mockgpu.io/profile gb300 || { tail -5 "$LOGS/controller-$leader.log"; exit 1; }
  timing controller-labels "$(ms "$t") ms from the GpuNode to the node's labels"
  local l want
  for want in nvidia.com/gpu.present=true nvidia.com/gpu.count=4 nvidia.com/gpu.product=NVIDIA-GB300 feature.node.kubernetes.io/pci-10de.present=true; do
    l=$(ctl_label "${want%%=*}"); [ "$l" = "${want#*=}" ] || fail "label ${want%%=*}='$l', want ${want#*=}"
  done
  kc get node "$CTL_NODE" --show-managed-fields -o json | grep -q '"manager": "mockgpu-controller"' || fail "no managed fields of mockgpu-controller on $CTL_NODE"
  ! kc get node "$NODE" --show-managed-fields -o json | grep -q '"manager": "mockgpu-controller"' || [ -n "$(kc get gpunode "$NODE" -o name 2> /dev/null)" ] \
    || fail "the controller touched $NODE, which has no GpuNode"
  wait_for 20 "Stale=False" ctl_cond_is Stale False || fail "Stale is '$(ctl_cond Stale)'"
  [ "$(ctl_cond Drifted)" = False ] && [ "$(ctl_cond InjectionMissing)" = False ] || fail "Drifted '$(ctl_cond Drifted)', InjectionMissing '$(ctl_cond InjectionMissing)'"
  kc get events -n default --field-selector "involvedObject.name=$CTL_NODE,reason=LabelsApplied" -o name | grep -q . || fail "no LabelsApplied event on GpuNode $CTL_NODE"
  grep -q 'node labels applied' "$LOGS/controller-$leader.log" || fail "the leader logged no label apply"
  ! grep -qE 'node labels applied|conditions applied' "$LOGS/controller-$standby.log" || fail "the standby acted"
  echo "  $(kc get node "$CTL_NODE" -o jsonpath='{.metadata.labels}')"
  echo "  conditions: $(kc get gpunode "$CTL_NODE" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {end}'); only $leader acted"
}

scenario_controller_stale() {  # no heartbeat for MOCKGPU_STALE_AFTER: Stale=True, an event; then back
  ctl_heartbeat; local t; t=$(date +%s%N)
  wait_for 20 "Stale=False" ctl_cond_is Stale False
  wait_for $(( CTL_STALE + 15 )) "Stale=True" ctl_cond_is Stale True || fail "Stale is '$(ctl_cond Stale)' $(( CTL_STALE + 15 )) s after the last heartbeat"
  timing controller-stale "$(ms "$t") ms from the last heartbeat to Stale=True (stale after $CTL_STALE s)"
  kc get events -n default --field-selector "involvedObject.name=$CTL_NODE,reason=HeartbeatLost" -o name | grep -q . || fail "no HeartbeatLost event"
  [ "$(ctl_cond InjectionMissing)" = Unknown ] || fail "InjectionMissing is '$(ctl_cond InjectionMissing)' on a stale node, want Unknown"
  ctl_heartbeat
  wait_for 20 "Stale=False again" ctl_cond_is Stale False || fail "Stale is '$(ctl_cond Stale)' after a new heartbeat"
  echo "  Stale=True after $(( ($(date +%s%N) - t) / 1000000 )) ms without heartbeats (event HeartbeatLost); a heartbeat: Stale=False"
}

ctl_other() { [ "$1" = ctl-a ] && echo ctl-b || echo ctl-a; }

scenario_controller_failover() {  # SIGTERM: the lease is released, handed over at once; SIGKILL: within the lease time
  local leader next t ms
  leader=$(ctl_holder); next=$(ctl_other "$leader")
  t=$(date +%s%N); stop_kinds TERM "controller-$leader"
  wait_for 10 "$next holds the lease" ctl_holder_is "$next" || fail "after SIGTERM of $leader the lease is held by '$(ctl_holder)'"
  ms=$(ms "$t"); timing controller-handover-sigterm "$ms ms"
  grep -q 'lease released' "$LOGS/controller-$leader.log" || fail "$leader did not release the lease"
  ctl_start "$leader"   # back, as the standby
  leader=$next; next=$(ctl_other "$leader")
  wait_for 10 "$next ready" ctl_curl "$(ctl_port "$next")" /readyz
  t=$(date +%s%N); stop_kinds KILL "controller-$leader"
  wait_for $(( CTL_LEASE_S + 10 )) "$next holds the lease" ctl_holder_is "$next" || fail "after SIGKILL of $leader the lease is held by '$(ctl_holder)'"
  ms=$(ms "$t"); timing controller-handover-sigkill "$ms ms (lease $CTL_LEASE_S s)"
  [ "$ms" -le $(( CTL_LEASE_S * 1000 + 2000 )) ] || fail "handover after SIGKILL took $ms ms, more than the lease ($CTL_LEASE_S s) and one retry"
  # the new leader acts
  ctl_gpunode h100 8 "NVIDIA H100 80GB HBM3"; t=$(date +%s%N)
  wait_for 30 "the label follows (h100)" ctl_label_is mockgpu.io/profile h100 || fail "profile label '$(ctl_label mockgpu.io/profile)' after the handover"
  ctl_label_is nvidia.com/gpu.product NVIDIA-H100-80GB-HBM3 || fail "product label '$(ctl_label nvidia.com/gpu.product)'"
  timing controller-label-after-handover "$(ms "$t") ms"
  ctl_start "$leader"
  echo "  SIGTERM: lease released, $next took over; SIGKILL of $leader: $next took over in $ms ms; labels follow (h100, 8)"
}

scenario_controller_apiserver_restart() {  # the watches survive a restarted API server
  local t; t=$(date +%s%N)
  stop_kinds TERM kube-apiserver
  spawn_apiserver
  wait_for 120 "kube-apiserver /readyz" api_ready || { tail -20 "$LOGS/kube-apiserver.log"; exit 1; }
  timing controller-apiserver-restart "$(ms "$t") ms to /readyz"
  wait_for $(( CTL_LEASE_S + 10 )) "a controller holds the lease" ctl_holder_in ctl-a ctl-b || fail "no lease holder after the restart"
  ctl_heartbeat; ctl_gpunode b200 8 "NVIDIA B200"; t=$(date +%s%N)
  wait_for 60 "the label follows (b200)" ctl_label_is mockgpu.io/profile b200 || { tail -5 "$LOGS"/controller-ctl-*.log; fail "profile label '$(ctl_label mockgpu.io/profile)' after the API server restart"; }
  timing controller-label-after-apiserver-restart "$(ms "$t") ms"
  echo "  after the restart: leader $(ctl_holder); labels follow (b200, $(ctl_label nvidia.com/gpu.count) GPUs)"
}

scenario_controller_gpunode_deleted() {  # no GpuNode: our labels go, the node's own stay; SIGTERM releases
  kc delete gpunode "$CTL_NODE" > /dev/null; local t; t=$(date +%s%N)
  wait_for 30 "the profile label removed" ctl_label_is mockgpu.io/profile "" || fail "profile label '$(ctl_label mockgpu.io/profile)' after the GpuNode was deleted"
  timing controller-labels-removed "$(ms "$t") ms"
  local k; for k in nvidia.com/gpu.present nvidia.com/gpu.count nvidia.com/gpu.product feature.node.kubernetes.io/pci-10de.present; do
    [ -z "$(ctl_label "$k")" ] || fail "label $k left on $CTL_NODE"
  done
  ctl_label_is kubernetes.io/hostname "$CTL_NODE" || fail "the node's own label is gone"
  kc get events -n default --field-selector "involvedObject.name=$CTL_NODE,reason=LabelsRemoved" -o name | grep -q . || fail "no LabelsRemoved event on node $CTL_NODE"
  stop_kinds TERM controller-ctl-a controller-ctl-b
  [ -z "$(ctl_holder)" ] || fail "the lease is still held by '$(ctl_holder)' after both replicas stopped"
  kc delete node "$CTL_NODE" > /dev/null
  echo "  labels removed, kubernetes.io/hostname kept; both replicas stopped, the lease released"
}

run_cluster_scenarios() {
  step node-ready scenario_node_ready
  step pod-daemonset-exec scenario_workloads
  step crd-admission-policy scenario_policy
  step helm scenario_helm
  step device-plugin-socket scenario_device_plugin_socket
  step gpu-pod-injected scenario_gpu_pod
  step dp-registered scenario_dp_registered
  step dp-pod-2-gpus scenario_dp_pod
  step dp-pod-5-pending scenario_dp_too_many
  step dp-failed-gpu scenario_dp_failed_gpu
  step dp-kubelet-restart scenario_dp_kubelet_restart
  step controller-rbac scenario_controller_rbac
  step controller-leader scenario_controller_leader
  step controller-labels scenario_controller_labels
  step controller-stale scenario_controller_stale
  step controller-failover scenario_controller_failover
  step controller-apiserver-restart scenario_controller_apiserver_restart
  step controller-gpunode-deleted scenario_controller_gpunode_deleted
}

cluster_down() {  # (phase_down, first) the kubelet before the runtime, so that it restarts nothing
  stop_kinds TERM controller-ctl-a controller-ctl-b kubelet kube-scheduler kube-controller-manager kube-apiserver etcd
}
