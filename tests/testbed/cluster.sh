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
# NODES nodes: node0 runs the control plane and is the test bed's node (its root $R); node<i>
# (worker_vars) has a root, state and logs of its own under $TB, the same images, and a veth link
# to node0 (nodes_link). Workers register with Slinky's worker taint, so that only pods that
# tolerate it (the chart's DaemonSets, Slinky's slurmd) land there.
NODES=${NODES:-1}
API_IP=192.0.2.10                  # node0's address: the API server, for every node
NODE_IP=$API_IP                    # TEST-NET-1, routed nowhere: node<i> has 192.0.2.(10+i)
CLUSTER_CIDR=198.51.100.0/24       # TEST-NET-2: the pods of all nodes
POD_CIDR=198.51.100.0/25           # the bridge's pods on this node (node<i>: the i-th /25)
WORKER_TAINT=nodeset.slinky.slurm.net/worker:NoExecute
SVC_CIDR=203.0.113.0/24            # TEST-NET-3: service addresses (kube-proxy, nftables mode)
SVC_IP=203.0.113.1                 # the `kubernetes` service
DNS_IP=203.0.113.10                # the `kube-dns` service: CoreDNS, the pods' nameserver
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
# (evaluated by the holder, with the node's NODE_IP in its environment)
NODE_NET_HOOK='busybox ip addr add $NODE_IP/32 dev lo; busybox ip route add default dev lo'

worker_vars() {  # worker_vars <i>: the globals of node<i> (i > 0), in a subshell of a step
  local i=$1
  NODE=node$i; NODE_IP=192.0.2.$((10 + i)); POD_CIDR=198.51.100.$((128 * i))/25
  R=$TB/rootfs-$NODE; ST=$TB/state/$NODE; LOGS=$TB/logs/$NODE
  CRI_SOCKET=$R/run/containerd/containerd.sock; NRI_SOCKET=$R/run/nri/nri.sock
  CGROUP_PARENT=$CGROUP_PARENT-$NODE; MGTB_CGROUP_PARENT=$CGROUP_PARENT; KIND_AT=@$NODE
  mkdir -p "$ST" "$LOGS"
}
workers() { seq 1 $((NODES - 1)); }   # the workers' indexes
worker_roots() {  # each worker's root: a copy of the node root, as debootstrap left it (before up)
  local i d t; t=$(date +%s%N)
  for i in $(workers); do
    d=$TB/rootfs-node$i
    ! grep -q " $d[/ ]" /proc/self/mountinfo || fail "$d is still mounted (testbed.sh down first)"
    rsync -aHx --delete --exclude=/var/lib/containerd --exclude=/var/lib/kubelet --exclude=/var/lib/etcd-mgtb \
      --exclude=/var/log/pods --exclude=/var/log/containers --exclude=/etc/kubernetes --exclude=/opt/k8s \
      --exclude=/var/lib/mgtb --exclude='/run/*' --exclude='/dev/*' "$R/" "$d/"
  done
  timing worker-roots "$(ms "$t") ms ($((NODES - 1)) of them)"
}

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
  cert "$P" kube-proxy /CN=system:kube-proxy clientAuth
  node_certs "$P"
}

node_certs() {  # node_certs <dir>: the kubelet's client and serving certificates of $NODE
  cert "$1" kubelet "/O=system:nodes/CN=system:node:$NODE" clientAuth
  cert "$1" kubelet-serving "/O=system:nodes/CN=system:node:$NODE" serverAuth "IP:$NODE_IP,DNS:$NODE"
  rm -f "$1/ca.srl"
}

worker_pki() {  # worker_pki <dir>: a worker's: the CA's certificate, its kubelet's, kube-proxy's
  local P=$1 P0=$TB/rootfs$KN/pki
  rm -rf "$P"; mkdir -p "$P"
  cp "$P0/ca.crt" "$P0/ca.key" "$P0/kube-proxy.crt" "$P0/kube-proxy.key" "$P/"
  node_certs "$P"
  rm -f "$P/ca.key"   # a worker signs nothing
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
  cluster: {server: "https://$API_IP:6443", certificate-authority-data: "$(base64 -w0 "$P/ca.crt")"}
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
  # the node's upstream DNS (dnsPolicy Default): nothing outside the node is asked; CoreDNS
  # answers the cluster's names and forwards nothing
  echo "nameserver 127.0.0.1" > "$R$KN/resolv.conf"
  host_sysctls > "$ST/host-sysctls"    # the isolation step checks that the host keeps them
  if [ "$NODE" = node0 ]; then
    pki "$R$KN/pki"
    kubeconfig "$R$KN/admin.kubeconfig" admin
    kubeconfig "$R$KN/controller-manager.kubeconfig" controller-manager
    kubeconfig "$R$KN/scheduler.kubeconfig" scheduler
  else
    worker_pki "$R$KN/pki"
  fi
  kubeconfig "$R$KN/kubelet.kubeconfig" kubelet
  kubeconfig "$R$KN/kube-proxy.kubeconfig" kube-proxy
  cat > "$R$KN/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $KN/kube-proxy.kubeconfig}
hostnameOverride: $NODE
mode: nftables
clusterCIDR: $CLUSTER_CIDR
# a pod reaching a service whose endpoint is on the same bridge: without br_netfilter (a host-wide
# module) the reply would bypass the node's NAT; masquerading every service connection avoids that
nftables: {masqueradeAll: true}
# the conntrack limits and timeouts are the host's (0: leave them)
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
# no CAP_SYS_RESOURCE here (as the kubelet)
oomScoreAdj: 0
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
EOF
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
clusterDNS: [$DNS_IP]
$([ "$NODE" = node0 ] || echo "registerWithTaints: [{key: ${WORKER_TAINT%:*}, effect: ${WORKER_TAINT#*:}}]")
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
    --bind-address=0.0.0.0 --secure-port=6443 --advertise-address="$NODE_IP" \
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

node_daemons() {  # kube-proxy and the kubelet of this node
  cgroup_root_ready
  spawn kube-proxy "$LOGS/kube-proxy.log" /opt/k8s/kube-proxy --config=$KN/kube-proxy.yaml -v=1
  spawn_kubelet
}

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
  node_daemons
  wait_for 120 "node $NODE registered" node_registered || { grep -E '^E|rror' "$LOGS/kubelet.log" | tail -20; exit 1; }
  timing node-registered "$(ms "$t") ms"
}

dns_ready() { [ "$(kc -n kube-system get deploy coredns -o jsonpath='{.status.readyReplicas}')" = 1 ]; }
cluster_dns_up() {  # CoreDNS behind the kube-dns service (node/coredns.yaml), ready
  local t; t=$(date +%s%N)
  sed "s/@DNS_IP@/$DNS_IP/" "$HERE/node/coredns.yaml" | kc apply -f - > /dev/null
  wait_for 120 "CoreDNS ready" dns_ready ||
    { kc -n kube-system describe pods -l k8s-app=kube-dns | tail -20; tail -20 "$LOGS/kube-proxy.log"; exit 1; }
  timing dns-ready "$(ms "$t") ms"
}

nodes_link() {  # a veth between node0 and this worker, routes to each other's address and pods
  local p0 p; p0=$(cat "$TB/state/node.pid"); p=$(nodepid)
  ip link add "$NODE" netns "$p0" type veth peer name node0 netns "$p"
  nsenter -t "$p0" -n -- sh -c "ip link set $NODE up && ip route add $NODE_IP/32 dev $NODE &&
    ip route add $POD_CIDR via $NODE_IP dev $NODE && sysctl -qw net.ipv4.ip_forward=1"
  nsenter -t "$p" -n -- sh -c "ip link set node0 up && ip route add $API_IP/32 dev node0 &&
    ip route add 192.0.2.0/24 via $API_IP dev node0 && ip route add $CLUSTER_CIDR via $API_IP dev node0 &&
    sysctl -qw net.ipv4.ip_forward=1"
}

workers_up() {  # each worker: its namespaces, containerd and images, the link, kube-proxy and kubelet; registered
  local i t; t=$(date +%s%N)
  for i in $(workers); do
    ( worker_vars "$i"; phase_up; nodes_link; node_daemons
      wait_for 120 "node $NODE registered" node_registered || { grep -E '^E|rror' "$LOGS/kubelet.log" | tail -20; exit 1; } )
  done
  timing workers-registered "$(ms "$t") ms ($((NODES - 1)) of them)"
}

cluster_up() {
  step control-plane control_plane_up
  if [ $FAILED = 0 ]; then step kubelet kubelet_up; fi
  if [ $FAILED = 0 ] && [ "$NODES" -gt 1 ]; then step workers workers_up; fi
  if [ $FAILED = 0 ]; then step cluster-dns cluster_dns_up; fi
}

# ---------------------------------------------------------------------------------------------
# scenarios: the API server's own (crd-admission-policy, helm, chart-dry-run, product-images) and
# the isolation at the end are in Rust (src/scenarios/apiserver.rs)

# ---------------------------------------------------------------------------------------------
# the agent's device plugin against the real kubelet

node_label() { kc get node "${2:-$NODE}" -o jsonpath="{.metadata.labels.${1//./\\.}}"; }   # node_label <key> [node]
allocatable() { kc get node "$NODE" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}'; }
allocatable_is() { [ "$(allocatable)" = "$1" ]; }


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






# ---------------------------------------------------------------------------------------------
# the controller's steps (controller-rbac ... controller-gpunode-deleted) are in Rust
# (src/scenarios/controller.rs): two replicas as host processes in the node's network namespace
# (kinds controller-ctl-a, controller-ctl-b), with a service account's token and the chart's RBAC

gpunode_yaml() {  # gpunode_yaml <name> <profile> <GPUs> <model>: a GpuNode as an agent would report it
  local i gpus=""
  for i in $(seq 0 $(( $3 - 1 ))); do
    gpus="$gpus{index: $i, minor: $i, uuid: GPU-0000000$i-0000-0000-0000-000000000000, busId: '0000:0$i:00.0', model: $4, numaNode: 0, localCpulist: '0-7', socket: 0},"
  done
  printf 'apiVersion: mockgpu.io/v1alpha1\nkind: GpuNode\nmetadata: {name: %s}\nspec: {nodeName: %s, mode: mock, profile: %s, topologyHash: %s-%s, gpuCount: %s, gpus: [%s]}\n' \
    "$1" "$1" "$2" "$2" "$3" "$3" "${gpus%,}"
}

# ---------------------------------------------------------------------------------------------
# Slurm the way Slinky runs it: a slurmctld pod in configless mode and a slurmd DaemonSet of
# Slinky's pod shape, from the slurmd image (Debian's Slurm). Nothing here knows who serves the
# agent (a host process today, the chart's DaemonSet later): only the node, its label and its
# allocatable GPUs count.

SLINKY_NS=slurm                     # Slinky's namespace
SLINKY_NODESET=gpu                  # the NodeSet: the slurmd pods' instance label, Features, NodeSet
SLINKY_CTLD=slurm-controller-0      # Slinky's controller pod (StatefulSet slurm-controller, ordinal 0)
PCI_LABEL=feature.node.kubernetes.io/pci-10de.present
# Networking: pod IPs on the bridge, not hostNetwork. Slinky's pods are on the pod network, and
# Slurm needs every daemon to reach every other one directly (slurmd registers with slurmctld,
# slurmctld and srun connect back to slurmd, slurmstepd to srun): pod IPs do that on the bridge.
# Slinky names slurmctld through a Service, which nothing answers here (no kube-proxy, no DNS), so
# slurm.conf and slurmd's --conf-server carry the controller pod's IP instead.

# the executables the pods start: Debian's package installs <name>-wlm, its maintainer scripts
# (update-alternatives) make the usual names; an image assembled from extracted packages has to
# make them itself. The start of the containers' scripts
# shellcheck disable=SC2016 # expanded in the container
SLINKY_NEED='set -e; need() { for n; do [ -x "/usr/sbin/$n" ] || { echo "slurmd image: no /usr/sbin/$n (the Debian package installs $n-wlm; its maintainer scripts make $n with update-alternatives, which an image from extracted packages must recreate)" >&2; exit 1; }; done; [ "$(id -u slurm):$(id -g slurm)" = "'$SLURM_UID:$SLURM_UID'" ] || { echo "slurmd image: slurm is $(id -u slurm):$(id -g slurm), Slinky uses '$SLURM_UID:$SLURM_UID'" >&2; exit 1; }; }'

slinky_supported() {  # Slinky's operator supports Slurm 25.11 and later
  local v; v=$(innode slurmd -V | awk '{print $2}')
  awk -v v="$v" 'BEGIN {split(v, p, "."); exit !(p[1] > 25 || (p[1] == 25 && p[2] >= 11))}'
}

slinky_cgroup_conf() {  # slinky_cgroup_conf [constrain]: Slinky's cgroup.conf where Slurm's
  # cgroup/v2 can work, or why not; constrain adds ConstrainDevices=yes (a user's addition)
  if [ "$(innode stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
    printf 'CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n'
  elif [ "${1:-}" = constrain ]; then
    # a cgroup v1 host (v1 controllers, an empty cgroup2 at /sys/fs/cgroup/unified): Slurm's
    # cgroup/v2 refuses it (below); its cgroup/v1 confines devices through the v1 controller
    printf 'CgroupPlugin=cgroup/v1\n'
  else
    # slurmd's cgroup/v2 plugin stops at start on a v1 host, whatever CgroupMountpoint says:
    # "fatal: Hybrid mode is not supported. Mounted cgroups are: ..." (it reads the v1 lines of
    # /proc/self/cgroup). Slurm then runs without cgroups (proctrack/linuxproc in slurm.conf)
    printf 'CgroupPlugin=disabled\n'
  fi
  [ "${1:-}" != constrain ] || printf 'ConstrainDevices=yes\n'
}

# the partitions of the README's values for Slinky's chart (examples/slinky-values.yaml), as the
# operator writes them (PartitionName=all Nodes=ALL Default=YES MaxTime=UNLIMITED for `all`): the
# chart defines none by default, and without one srun fails
slinky_partitions() {
  python3 -c 'import sys, yaml
values = yaml.safe_load(open(sys.argv[1]))
for name, p in (values.get("partitions") or {}).items():
    if (p or {}).get("enabled"):
        print(f"PartitionName={name} Nodes=ALL Default=YES MaxTime=UNLIMITED")' "$REPO/examples/slinky-values.yaml"
}

slinky_slurm_conf() {  # slurm.conf as Slinky's operator generates it (@CTLD_ADDR@: the controller's pod IP)
  cat <<EOF
ClusterName=slinky
SlurmUser=slurm
SlurmctldHost=$SLINKY_CTLD(@CTLD_ADDR@)
SlurmctldPort=6817
StateSaveLocation=/var/spool/slurmctld
SlurmdUser=root
SlurmdPort=6818
SlurmdSpoolDir=/var/spool/slurmd
MaxNodeCount=1024
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AuthType=auth/slurm
CredType=cred/slurm
AuthInfo=use_client_ids
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=/etc/slurm/jwt_hs256.key
SlurmctldParameters=enable_configless,reconfig_on_restart
AccountingStorageType=accounting_storage/none
GresTypes=gpu
NodeSet=$SLINKY_NODESET Feature=$SLINKY_NODESET
EOF
  slinky_partitions
  grep -q '^CgroupPlugin=disabled' <<< "$1" && echo 'ProctrackType=proctrack/linuxproc'
  grep -q '^ConstrainDevices=yes' <<< "$1" && echo 'TaskPlugin=task/cgroup'
  return 0
}

slinky_controller_up() {  # slinky_controller_up [nvidia|nvml [constrain]]: slurm.key Secret, config
  # ConfigMap (gres.conf AutoDetect=nvidia, or nvml; cgroup.conf), the slurmctld pod; its IP in
  # $ST/slinky-ctld-ip
  local cg autodetect=${1:-nvidia}; cg=$(slinky_cgroup_conf "${2:-}")
  dp_ns "$SLINKY_NS"
  kc -n "$SLINKY_NS" create secret generic slurm-auth-slurm --from-file=slurm.key=<(head -c 1024 /dev/urandom) > /dev/null
  kc -n "$SLINKY_NS" create secret generic slurm-auth-jwths256 --from-file=jwt_hs256.key=<(head -c 32 /dev/urandom) > /dev/null
  kc -n "$SLINKY_NS" create configmap slurm-config --from-file=slurm.conf=<(slinky_slurm_conf "$cg") \
    --from-file=cgroup.conf=<(echo "$cg") --from-file=gres.conf=<(echo "AutoDetect=$autodetect") > /dev/null
  kc apply -f - > /dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $SLINKY_CTLD
  namespace: $SLINKY_NS
  labels: {app.kubernetes.io/name: slurmctld, app.kubernetes.io/instance: slurm, app.kubernetes.io/component: controller}
spec:
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: 5
  containers:
  - name: slurmctld
    image: localhost/slurmd:1
    imagePullPolicy: Never
    # Slinky's controller copies its configuration and key into /etc/slurm (the key owned by
    # SlurmUser, 0600); slurmctld starts as root and runs as SlurmUser
    command: [/bin/sh, -c]
    args:
    - |
      $SLINKY_NEED
      need slurmctld
      sed "s/@CTLD_ADDR@/\$POD_IP/" /mnt/slurm/slurm.conf > /etc/slurm/slurm.conf
      cp /mnt/slurm/cgroup.conf /mnt/slurm/gres.conf /etc/slurm/
      install -o slurm -g slurm -m 600 /mnt/slurm-key/slurm.key /etc/slurm/slurm.key
      install -o slurm -g slurm -m 600 /mnt/jwt-key/jwt_hs256.key /etc/slurm/jwt_hs256.key
      install -d -o slurm -g slurm /var/spool/slurmctld /var/log/slurm
      exec slurmctld -D
    env: [{name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]
    volumeMounts:
    - {name: slurm-config, mountPath: /mnt/slurm, readOnly: true}
    - {name: slurm-key, mountPath: /mnt/slurm-key, readOnly: true}
    - {name: jwt-key, mountPath: /mnt/jwt-key, readOnly: true}
  volumes:
  - {name: slurm-config, configMap: {name: slurm-config}}
  - {name: slurm-key, secret: {secretName: slurm-auth-slurm, defaultMode: 0600}}
  - {name: jwt-key, secret: {secretName: slurm-auth-jwths256, defaultMode: 0600}}
EOF
  kc -n "$SLINKY_NS" wait --for=condition=Ready "pod/$SLINKY_CTLD" --timeout=120s > /dev/null \
    || { kc -n "$SLINKY_NS" describe pod "$SLINKY_CTLD" | tail -20; kc -n "$SLINKY_NS" logs "$SLINKY_CTLD" | tail -20; exit 1; }
  wait_for 60 "slurmctld answers scontrol ping" ctld scontrol ping \
    || { kc -n "$SLINKY_NS" logs "$SLINKY_CTLD" | tail -20; ctld tail -20 /var/log/slurm/slurmctld.log; exit 1; }
  kc -n "$SLINKY_NS" get pod "$SLINKY_CTLD" -o jsonpath='{.status.podIP}' > "$ST/slinky-ctld-ip"
}

ctld() { kc -n "$SLINKY_NS" exec "$SLINKY_CTLD" -c slurmctld -- "$@"; }   # a command in the slurmctld container

SLINKY_RESTAPI=slurm-restapi         # Slinky's slurmrestd (a Deployment and Service of that name)
RESTAPI_PORT=6820
slinky_restapi_up() {  # slinky_restapi_up <controller IP>: slurmrestd as Slinky runs it; its IP in $ST/slinky-restapi-ip
  # JWT only, and SLURM_JWT=daemon: each request reaches slurmctld with its client's token. It
  # refuses to run as root, SlurmUser or nobody: a user of its own
  kc apply -f - > /dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $SLINKY_RESTAPI
  namespace: $SLINKY_NS
  labels: {app.kubernetes.io/name: slurmrestd, app.kubernetes.io/instance: slurm, app.kubernetes.io/component: restapi}
spec:
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: 5
  containers:
  - name: slurmrestd
    image: localhost/slurmd:1
    imagePullPolicy: Never
    command: [/bin/sh, -c]
    args:
    - |
      set -e
      sed "s/@CTLD_ADDR@/\$CTLD_ADDR/" /mnt/slurm/slurm.conf > /etc/slurm/slurm.conf
      echo 'slurmrestd:x:65532:65532::/nonexistent:/usr/sbin/nologin' >> /etc/passwd
      echo 'slurmrestd:x:65532:' >> /etc/group
      exec slurmrestd -s openapi/slurmctld -a rest_auth/jwt -u slurmrestd -g slurmrestd 0.0.0.0:$RESTAPI_PORT
    env:
    - {name: SLURM_JWT, value: daemon}
    - {name: CTLD_ADDR, value: "$1"}
    ports: [{name: slurmrestd, containerPort: $RESTAPI_PORT}]
    readinessProbe: {tcpSocket: {port: $RESTAPI_PORT}, periodSeconds: 2}
    volumeMounts: [{name: slurm-config, mountPath: /mnt/slurm, readOnly: true}]
  volumes: [{name: slurm-config, configMap: {name: slurm-config}}]
EOF
  kc -n "$SLINKY_NS" wait --for=condition=Ready "pod/$SLINKY_RESTAPI" --timeout=120s > /dev/null \
    || { kc -n "$SLINKY_NS" describe pod "$SLINKY_RESTAPI" | tail -20; kc -n "$SLINKY_NS" logs "$SLINKY_RESTAPI" | tail -20; exit 1; }
  kc -n "$SLINKY_NS" get pod "$SLINKY_RESTAPI" -o jsonpath='{.status.podIP}' > "$ST/slinky-restapi-ip"
}

slinky_nodeset_up() {  # slinky_nodeset_up <controller IP>: the slurmd DaemonSet, Slinky's pod shape
  kc apply -f - > /dev/null <<EOF
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: $SLINKY_NODESET, namespace: $SLINKY_NS}
spec:
  selector:
    matchLabels: {app.kubernetes.io/name: slurmd, app.kubernetes.io/instance: $SLINKY_NODESET}
  template:
    metadata:
      labels:
        app.kubernetes.io/name: slurmd
        app.kubernetes.io/instance: $SLINKY_NODESET
        app.kubernetes.io/component: worker
        slinky.slurm.net/cluster: slurm
      annotations: {kubectl.kubernetes.io/default-container: slurmd}
    spec:
      # Slinky's DaemonSet mode names each pod's host after its node (the Slurm node name); a
      # Kubernetes DaemonSet has one template, which on this one-node test bed can say it
      hostname: $NODE
      nodeSelector: {$PCI_LABEL: "true"}
      automountServiceAccountToken: false
      enableServiceLinks: false
      terminationGracePeriodSeconds: 5
      initContainers:
      - name: logfile               # a native sidecar (musl-style static busybox, as Slinky's alpine)
        image: localhost/busybox:1
        imagePullPolicy: Never
        restartPolicy: Always
        command: ["/bin/sh", "-c", "touch /var/log/slurm/slurmd.log && exec tail -n +1 -F /var/log/slurm/slurmd.log"]
        volumeMounts: [{name: slurm-logfile, mountPath: /var/log/slurm}]
      containers:
      - name: slurmd
        image: localhost/slurmd:1
        imagePullPolicy: Never
        # (Slinky's supervisord keeps slurmd in the foreground: -D)
        command:
        - /bin/sh
        - -c
        - |
          $SLINKY_NEED
          need slurmd slurmstepd
          mkdir -p /var/spool/slurmd
          exec slurmd -D -Z --conf-server $1:6817 --conf 'Features=$SLINKY_NODESET'
        ports: [{name: slurmd, containerPort: 6818}]
        securityContext:
          privileged: true
          capabilities: {add: [BPF, NET_ADMIN, SYS_ADMIN, SYS_NICE]}
        resources: {limits: {$RES: "4"}}
        volumeMounts:
        - {name: slurm-etc, mountPath: /etc/slurm, readOnly: true}
        - {name: slurm-logfile, mountPath: /var/log/slurm}
      volumes:
      - name: slurm-etc
        projected:
          defaultMode: 0600
          sources: [{secret: {name: slurm-auth-slurm, items: [{key: slurm.key, path: slurm.key}]}}]
      - {name: slurm-logfile, emptyDir: {}}
EOF
}

slinky_logs() {  # what helps when the Slinky step fails
  echo "--- sinfo:"; ctld sinfo -N -o '%N %T %G %E' || true
  echo "--- slurmd pods:"; kc -n "$SLINKY_NS" get pods -o wide || true
  echo "--- slurmd (logfile sidecar):"; kc -n "$SLINKY_NS" logs "ds/$SLINKY_NODESET" -c logfile --tail=20 || true
  echo "--- slurmd container:"; kc -n "$SLINKY_NS" logs "ds/$SLINKY_NODESET" -c slurmd --tail=10 || true
  echo "--- slurmctld:"; ctld tail -20 /var/log/slurm/slurmctld.log || true
}

slinky_node_idle() { grep -qE "^$NODE idle " <<< "$(ctld sinfo -h -N -o '%N %T %G')"; }
slinky_srun() { ctld timeout 60 srun -D / -N1 "$@"; }

slinky_pod() {  # the slurmd pod's name
  kc -n "$SLINKY_NS" get pods -l "app.kubernetes.io/name=slurmd,app.kubernetes.io/instance=$SLINKY_NODESET" -o jsonpath='{.items[0].metadata.name}'
}

slinky_injection() {  # slinky_injection <container>: "<mockgpu mounts> <LD_PRELOAD of PID 1> <nvidia devices>
  # present|absent (/proc/driver/nvidia)", seen from inside
  # shellcheck disable=SC2016 # expanded in the container
  kc -n "$SLINKY_NS" exec "$(slinky_pod)" -c "$1" -- /bin/sh -c '
    m=$(grep -cE " (/run/mockgpu|/etc/ld.so.preload) " /proc/1/mountinfo || true)
    p=$(tr "\0" "\n" < /proc/1/environ | grep -c "^LD_PRELOAD=.*libmockfs" || true)
    d=$(ls /dev | grep -c "^nvidia" || true)
    if [ -e /proc/driver/nvidia ]; then n=present; else n=absent; fi
    echo "$m $p $d $n"'
}

scenario_slinky_slurm() {  # Slinky's slurmctld + slurmd pods find the agent's GPUs; jobs get them
  # (gres.conf AutoDetect=nvml: Slurm's NVML plugin over the mock libnvidia-ml.so.1 the slurmd
  # container is given; chart-slinky-remediation runs the README's AutoDetect=nvidia)
  local t ip s m p d labelled=""
  trap 'slinky_down > /dev/null 2>&1 || true' EXIT   # a failed step leaves the node as it found it too
  # the controller labels GPU nodes; until it runs here, the step labels the node itself (and
  # removes the label again)
  if [ -z "$(kc get node "$NODE" -o jsonpath="{.metadata.labels.${PCI_LABEL//./\\.}}")" ]; then
    kc label node "$NODE" "$PCI_LABEL=true" > /dev/null; labelled=1
  fi
  echo "$labelled" > "$ST/slinky-labelled"
  echo "  slurm $(innode slurmd -V | awk '{print $2}'); cgroup.conf: $(slinky_cgroup_conf constrain | tr '\n' ' ')(/sys/fs/cgroup is $(innode stat -fc %T /sys/fs/cgroup))"
  t=$(date +%s%N); slinky_controller_up nvml constrain; ip=$(cat "$ST/slinky-ctld-ip")
  timing slinky-slurmctld-ready "$(ms "$t") ms"
  s=$(ctld sh -c 'readlink -f /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/slurmstepd | tr "\n" " "; id slurm')
  echo "  slurmctld at $ip; $s"
  [[ $s == *"uid=$SLURM_UID(slurm) gid=$SLURM_UID(slurm)"* ]] || fail "the slurmd image's slurm user is not $SLURM_UID:$SLURM_UID: $s"
  [ "$(ctld stat -c %u /etc/slurm/slurm.key)" = "$SLURM_UID" ] || fail "slurm.key in slurmctld is not owned by slurm ($SLURM_UID)"
  t=$(date +%s%N); slinky_nodeset_up "$ip"
  kc -n "$SLINKY_NS" rollout status "ds/$SLINKY_NODESET" --timeout=120s > /dev/null \
    || { kc -n "$SLINKY_NS" describe pods -l app.kubernetes.io/name=slurmd | tail -30; slinky_logs; exit 1; }
  wait_for 60 "slurmd $NODE idle in sinfo" slinky_node_idle || { slinky_logs; exit 1; }
  timing slinky-slurmd-idle "$(ms "$t") ms"
  local sockets; sockets=$(gres_sockets); [ -n "$sockets" ] || fail "no socket found for the served GPUs"
  s=$(ctld sinfo -h -N -o '%N %T %G'); echo "  gres.conf AutoDetect=nvml: sinfo -N -o '%N %T %G': $s"
  [ "$s" = "$NODE idle gpu:nvidia_gb300:4(S:$sockets)" ] || { slinky_logs; fail "want '$NODE idle gpu:nvidia_gb300:4(S:$sockets)'"; }
  s=$(slinky_srun --gres=gpu:2 env | grep '^CUDA_VISIBLE_DEVICES=') || { slinky_logs; fail "srun -N1 --gres=gpu:2 env"; }
  echo "  srun -N1 --gres=gpu:2 env: $s"
  [ "$s" = CUDA_VISIBLE_DEVICES=0,1 ] || fail "want CUDA_VISIBLE_DEVICES=0,1"
  # the README's verification with ConstrainDevices=yes: exactly the two GPUs Slurm gave the job
  # (their UUIDs); in the job (uid 401, as Slinky's), the other two nodes refuse to open (EPERM)
  local uuids want
  uuids=$(slinky_srun sh -c 'for f in /proc/driver/nvidia/gpus/*/information; do
    printf "%s %s\n" "$(sed -n "s/^Device Minor:[[:space:]]*//p" "$f")" "$(sed -n "s/^GPU UUID:[[:space:]]*//p" "$f")"; done' | sort -n)
  # shellcheck disable=SC2016 # expanded by the job's shell
  s=$(slinky_srun --gres=gpu:2 bash -c 'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; nvidia-smi -L') || { slinky_logs; fail "srun nvidia-smi -L"; }
  echo "$s" | sed 's/^/  ConstrainDevices=yes: srun --gres=gpu:2 nvidia-smi -L: /'
  want=$(printf 'CUDA_VISIBLE_DEVICES=0,1\nGPU 0: NVIDIA GB300 (UUID: %s)\nGPU 1: NVIDIA GB300 (UUID: %s)' \
    "$(awk '$1 == 0 {print $2}' <<< "$uuids")" "$(awk '$1 == 1 {print $2}' <<< "$uuids")")
  [ "$s" = "$want" ] || fail "the README's verification with ConstrainDevices=yes: want
$want"
  s=$(slinky_srun --gres=gpu:2 sh -c "$OPEN_GPUS") || fail "srun: opening the GPU nodes"
  echo "  open in a job with gpu:2: $(tr '\n' ';' <<< "$s")"
  [ "$s" = "$(printf '0 ok\n1 ok\n2 Operation not permitted\n3 Operation not permitted')" ] \
    || fail "opening the GPU nodes in a job: want 0 and 1 to open, EPERM for 2 and 3"
  s=$(slinky_srun ls /proc/driver/nvidia/gpus) || { slinky_logs; fail "srun ls /proc/driver/nvidia/gpus"; }
  echo "  job: ls /proc/driver/nvidia/gpus: $(tr '\n' ' ' <<< "$s")"
  [ "$(grep -cE '^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$' <<< "$s")" = 4 ] || fail "the job does not see 4 GPUs"
  # the slurmd container is injected (mockgpu mounts, the shim, GPU devices), its sidecar is not
  local inj side; inj=$(slinky_injection slurmd); side=$(slinky_injection logfile)
  echo "  mockgpu mounts, LD_PRELOAD, /dev/nvidia*, /proc/driver/nvidia: slurmd $inj; logfile sidecar $side"
  read -r m p d _ <<< "$inj"
  if [ "$m" -lt 2 ] || [ "$p" != 1 ] || [ "$d" -lt 4 ]; then fail "the slurmd container is not injected ($inj)"; fi
  [ "$side" = "0 0 0 absent" ] || fail "the logfile sidecar got an injection: mounts, LD_PRELOAD, devices, /proc/driver/nvidia = $side"
  slinky_down; trap - EXIT
}

slinky_down() {  # the namespace and its pods gone, the label removed if the step set it
  kc delete namespace "$SLINKY_NS" --timeout=90s > /dev/null || fail "namespace $SLINKY_NS was not deleted"
  [ "$(cat "$ST/slinky-labelled" 2>/dev/null)" != 1 ] || kc label node "$NODE" "$PCI_LABEL-" > /dev/null || fail "the label $PCI_LABEL was not removed"
  rm -f "$ST/slinky-labelled" "$ST/slinky-ctld-ip"
}

# ---------------------------------------------------------------------------------------------
# the agent's GpuNode report against the real API server, with the agent's own credentials: its
# steps (gpunode-setup ... gpunode-last-report) are in Rust (src/scenarios/gpunode.rs); what the
# chart steps use of it

AGENT_SA=mockgpu-agent                     # the agent's service account
gn() { kc get gpunode "$NODE" -o jsonpath="$1"; }   # gn <jsonpath>: of the node's GpuNode
gn_ready() { [ "$(gn '{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }
# kubectl with another kubeconfig (a token's)
kc_as() { local f=$1; shift; nsenter -t "$(nodepid)" -n -- "$KUBECTL" --kubeconfig "$f" --request-timeout=30s "$@"; }  # kc_as <kubeconfig> ...

# ---------------------------------------------------------------------------------------------
# the chart as a user installs it (the README's command), with the test bed's images, in place of
# the host agent; `helm test`; `helm uninstall` leaves nothing behind

CHART_NS=mockgpu-system
# what the test bed adds to the README's install: its own images, and the API server on the
# node's loopback (there is no kube-proxy to answer the `kubernetes` service's address)
CHART_TB_VALUES=(--set agent.image.repository=localhost/mockgpu-agent --set-string agent.image.tag=1
  --set agent.image.pullPolicy=Never --set controller.image.repository=localhost/mockgpu-controller
  --set-string controller.image.tag=1 --set controller.image.pullPolicy=Never
  --set controller.hostNetwork=true --set controller.replicas=1
  --set 'agent.extraEnv[0].name=KUBERNETES_SERVICE_HOST' --set-string 'agent.extraEnv[0].value=127.0.0.1'
  --set 'agent.extraEnv[1].name=KUBERNETES_SERVICE_PORT' --set-string 'agent.extraEnv[1].value=6443'
  --set 'controller.extraEnv[0].name=KUBERNETES_SERVICE_HOST' --set-string 'controller.extraEnv[0].value=127.0.0.1'
  --set 'controller.extraEnv[1].name=KUBERNETES_SERVICE_PORT' --set-string 'controller.extraEnv[1].value=6443')

# readme_line <prefix>: the README's first line that starts with <prefix>: the test bed runs the
# guide's commands as the README writes them
readme_line() { grep -m1 -- "^$1" "$REPO/README.md" || fail "README.md has no command line starting with '$1'"; }
# readme_cmd <prefix>: the words of that line, shell quoting undone
readme_cmd() {
  local line; line=$(readme_line "$1") || exit 1
  python3 -c 'import shlex, sys; sys.stdout.write("".join(w + "\0" for w in shlex.split(sys.argv[1])))' "$line"
}
# guide <prefix> [more args]: that command, helm as `hc` and kubectl as `kc`, from the repository root
guide() {
  local -a w; mapfile -d '' -t w < <(readme_cmd "$1"); shift
  [ ${#w[@]} -gt 0 ] || fail "README.md: no command starting with '$1'"
  case ${w[0]} in
    helm) (cd "$REPO" && hc "${w[@]:1}" "$@") ;;
    kubectl) (cd "$REPO" && kc "${w[@]:1}" "$@") ;;
    *) fail "README.md: '${w[0]}' is not a command the test bed runs" ;;
  esac
}

# guide_sh <prefix>: that command line as a shell runs it ($(...) and all), helm and kubectl
# being `hc` and `kc`
guide_sh() {
  local line; line=$(readme_line "$1") || exit 1
  (cd "$REPO" && helm() { hc "$@"; } && kubectl() { kc "$@"; } && eval "$line")
}

node_label_is() { [ "$(node_label "$1")" = "$2" ]; }
mockgpu_mounts() { grep -c ' - fuse[^ ]* mockgpu ' "/proc/$(nodepid)/mountinfo" || true; }
no_mockgpu_mounts() { [ "$(mockgpu_mounts)" = 0 ]; }
mockgpu_devices() { find "$R/run/mockgpu" -type c 2> /dev/null | wc -l; }

# the admission policy with real service-account tokens of the agent: the agent pod's own (bound
# to it, so to this node), one bound to a pod on another node, and one bound to nothing
VAP_NODE=mgtb-elsewhere          # a Node object with no kubelet behind it
VAP_POD=agent-token-probe        # a pod of the agent's service account there (it never runs)
jwt_claims() {  # jwt_claims <token>: its payload, JSON
  cut -d. -f2 <<< "$1" | tr '_-' '/+' | awk '{n = length($0) % 4; if (n) $0 = $0 substr("===", 1, 4 - n); print}' | base64 -d
}
vap_try() {  # vap_try <token> <GpuNode>: a server-side dry run of that GpuNode's apply with the token
  kubeconfig "$ST/vap.kubeconfig" "$AGENT_SA" "$1"
  gpunode_yaml "$2" gb300 4 gb300 | kc_as "$ST/vap.kubeconfig" apply --server-side --dry-run=server --field-manager mockgpu-agent -f - 2>&1
}
vap_allows() {  # vap_allows <what> <token> <GpuNode>
  local out; out=$(vap_try "$2" "$3") || fail "$1: writing GpuNode $3 was refused: $out"
  echo "  $1, GpuNode $3: allowed ($out)"
}
vap_denies() {  # vap_denies <what> <token> <GpuNode> <message part>
  local out; if out=$(vap_try "$2" "$3"); then fail "$1: writing GpuNode $3 was allowed: $out"; fi
  grep -qF "ValidatingAdmissionPolicy 'mockgpu-agent-own-gpunode'" <<< "$out" || fail "$1, GpuNode $3: not refused by the policy: $out"
  grep -qF -- "$4" <<< "$out" || fail "$1, GpuNode $3: the refusal does not say '$4': $out"
  echo "  $1, GpuNode $3: denied ($(grep -oF -- "$4" <<< "$out"))"
}
vap_down() {
  # the agent's DaemonSet tolerates every taint, so it placed a pod there too (never started)
  kc -n "$CHART_NS" delete pods --field-selector "spec.nodeName=$VAP_NODE" --ignore-not-found --force --grace-period=0 > /dev/null 2>&1 || true
  kc delete node "$VAP_NODE" --ignore-not-found > /dev/null
}
chart_admission_policy() {
  local own other unbound
  own=$(kc -n "$CHART_NS" exec ds/mockgpu-agent-default -c agent -- cat /var/run/secrets/kubernetes.io/serviceaccount/token) \
    || fail "reading the agent pod's service-account token"
  [ "$(jwt_claims "$own" | jq -r '."kubernetes.io".node.name')" = "$NODE" ] \
    || fail "the agent pod's token names no node $NODE: $(jwt_claims "$own" | jq -c '."kubernetes.io"')"
  # a Node object with no kubelet; the probe pod is bound to it and tolerates its taint
  kc apply -f - > /dev/null <<EOF
apiVersion: v1
kind: Node
metadata: {name: $VAP_NODE}
spec: {taints: [{key: mockgpu.io/token-probe, effect: NoExecute}]}
---
apiVersion: v1
kind: Pod
metadata: {name: $VAP_POD, namespace: $CHART_NS}
spec:
  serviceAccountName: $AGENT_SA
  nodeName: $VAP_NODE
  tolerations: [{key: mockgpu.io/token-probe, operator: Exists}]
  containers: [{name: probe, image: localhost/busybox:1, imagePullPolicy: Never}]
EOF
  other=$(kc -n "$CHART_NS" create token "$AGENT_SA" --bound-object-kind Pod --bound-object-name "$VAP_POD" --duration=10m)
  [ "$(jwt_claims "$other" | jq -r '."kubernetes.io".node.name')" = "$VAP_NODE" ] \
    || fail "the probe pod's token names no node $VAP_NODE: $(jwt_claims "$other" | jq -c '."kubernetes.io"')"
  unbound=$(kc -n "$CHART_NS" create token "$AGENT_SA" --duration=10m)
  vap_allows "the agent pod's token" "$own" "$NODE"
  vap_denies "the agent pod's token" "$own" "$VAP_NODE" "the mockgpu agent on node $NODE may write only GpuNode $NODE, not $VAP_NODE"
  vap_allows "a token bound to a pod on $VAP_NODE" "$other" "$VAP_NODE"
  vap_denies "a token bound to a pod on $VAP_NODE" "$other" "$NODE" "the mockgpu agent on node $VAP_NODE may write only GpuNode $VAP_NODE, not $NODE"
  vap_denies "a token bound to no pod" "$unbound" "$NODE" "no authentication.kubernetes.io/node-name claim"
  vap_down
}

scenario_chart_install() {
  # the steps before left a host agent with the keeper it started, and objects of the same names
  # as the chart's
  stop_kinds TERM agent
  local k; for k in $(pgrep -f 'exe keeper --dir /run/mockgpu' || true); do kill -TERM "$k"; done
  wait_for 30 "the host agent's FUSE mount gone" no_mockgpu_mounts || fail "the host agent left $(mockgpu_mounts) mounts"
  kc delete namespace "$CHART_NS" --ignore-not-found --timeout=120s > /dev/null
  kc delete clusterrolebinding,clusterrole mockgpu-agent mockgpu-controller --ignore-not-found > /dev/null
  local t; t=$(date +%s%N)
  guide "helm install mockgpu " "${CHART_TB_VALUES[@]}" --timeout 180s > "$ST/helm-install.txt" 2>&1 \
    || { cat "$ST/helm-install.txt"; kc -n "$CHART_NS" get pods -o wide; kc -n "$CHART_NS" describe pods | tail -40; fail "helm install of charts/mockgpu"; }
  timing chart-install "$(ms "$t") ms (helm install --wait)"
  grep -q 'kubectl get gpunodes' "$ST/helm-install.txt" || fail "helm install printed no NOTES (what to check next)"
  kc -n "$CHART_NS" rollout status ds/mockgpu-agent-default --timeout=60s > /dev/null || fail "the agent DaemonSet is not rolled out"
  wait_for 60 "GpuNode $NODE Ready" gn_ready || { kc -n "$CHART_NS" logs ds/mockgpu-agent-default -c agent | tail -20; fail "no Ready GpuNode from the chart's agent"; }
  guide "kubectl get gpunodes" | sed 's/^/  /'
  [ "$(gn '{.spec.mode}/{.spec.profile}/{.spec.gpuCount}')" = mock/gb300/4 ] || fail "GpuNode spec: $(gn '{.spec.mode}/{.spec.profile}/{.spec.gpuCount}')"
  wait_for 60 "label feature.node.kubernetes.io/pci-10de.present=true" node_label_is feature.node.kubernetes.io/pci-10de.present true \
    || { kc -n "$CHART_NS" logs deploy/mockgpu-controller | tail -20; fail "the controller did not label the node"; }
  wait_for 60 "allocatable $RES = 4" allocatable_is 4 || fail "allocatable $RES is '$(allocatable)' with the chart's agent"
  local cols; cols=$(guide "kubectl get nodes -o custom-columns") || fail "the README's kubectl get nodes"
  echo "$cols" | sed 's/^/  /'
  [ "$(awk -v n="$NODE" '$1 == n {print $2, $3}' <<< "$cols")" = "4 true" ] || fail "the README's node columns show: $cols"
  echo "  labels: $(kc get node "$NODE" -o json | jq -r '.metadata.labels | to_entries | map(select(.key | test("mockgpu|nvidia|pci-10de"))) | map("\(.key)=\(.value)") | join(" ")')"
  # the user's path: a pod asking for GPUs gets them and the driver files
  local ns=chart-jobs; dp_ns "$ns"; dp_pod gpu-2 2 "$ns"
  kc -n "$ns" wait --for=condition=Ready pod/gpu-2 --timeout=120s > /dev/null || { kc -n "$ns" describe pod gpu-2 | tail -20; fail "a pod with 2 GPUs did not start"; }
  local gpus; gpus=$(kc -n "$ns" exec gpu-2 -- ls /proc/driver/nvidia/gpus | wc -l)
  [ "$gpus" = 4 ] || fail "the pod with 2 GPUs sees $gpus GPUs in /proc/driver/nvidia/gpus, want the node's 4"
  kc delete namespace "$ns" --wait=false > /dev/null
  t=$(date +%s%N)
  guide "helm test mockgpu " > "$ST/helm-test.txt" 2>&1 || { cat "$ST/helm-test.txt"; fail "helm test (mockgpu-agent doctor)"; }
  timing chart-helm-test "$(ms "$t") ms"
  awk '/POD LOGS/ {f = 1} f && n++ < 30 {print "  " $0}' "$ST/helm-test.txt"   # (no `| head`: see matches)
  trap 'vap_down' EXIT
  chart_admission_policy
  trap - EXIT
}

# Slinky on the chart's agent and controller, then the README's profile change by `helm upgrade`
# with remediation on: the controller sees the slurmd pod predate the new topology (Drifted),
# deletes the node's Slurm record through slurmrestd and the pod, and the recreated pod's slurmd
# registers the new GPUs
chart_logs() {  # what helps when a rollout of the chart fails
  echo "--- pods:"; kc -n "$CHART_NS" get pods -o wide || true
  local p c; for p in $(kc -n "$CHART_NS" get pods -o name); do
    kc -n "$CHART_NS" describe "$p" | sed -n '/^Conditions:/,/^Volumes:/p;/^Events:/,$p' | sed "s|^|  $p: |" | tail -25
    for c in keeper agent controller; do
      { kc -n "$CHART_NS" logs "$p" -c "$c" --tail=25 2>/dev/null || true; } | sed "s|^|  $p/$c: |"
      { kc -n "$CHART_NS" logs "$p" -c "$c" --previous --tail=25 2>/dev/null || true; } | sed "s|^|  $p/$c (before its restart): |"
    done
  done
}
slurmd_uid() { kc -n "$SLINKY_NS" get pods -l "app.kubernetes.io/name=slurmd" -o jsonpath='{.items[*].metadata.uid}'; }
slinky_node_gres_is() { [ "$(ctld sinfo -h -N -o '%N %T %G')" = "$NODE idle $1" ]; }
gn_events() { kc get events -A --field-selector "involvedObject.kind=GpuNode,involvedObject.name=$NODE" -o jsonpath='{range .items[*]}{.reason}{"\n"}{end}'; }
gn_event_seen() { gn_events | matches -x "$1"; }
remediated() { gn_event_seen SlurmNodeDeleted && gn_event_seen PodDeleted; }
gn_profile_is() { [ "$(gn '{.spec.profile}')" = "$1" ]; }
scenario_chart_slinky() {
  local t ip rip s sockets uid0 r
  trap 'slinky_down > /dev/null 2>&1 || true' EXIT
  : > "$ST/slinky-labelled"    # the chart's controller labels the node; the step does not
  node_label_is "$PCI_LABEL" true || fail "the chart's controller did not label $NODE $PCI_LABEL=true"
  slinky_controller_up; ip=$(cat "$ST/slinky-ctld-ip")
  slinky_restapi_up "$ip"; rip=$(cat "$ST/slinky-restapi-ip")
  t=$(date +%s%N); slinky_nodeset_up "$ip"
  kc -n "$SLINKY_NS" rollout status "ds/$SLINKY_NODESET" --timeout=120s > /dev/null || { slinky_logs; exit 1; }
  wait_for 60 "slurmd $NODE idle in sinfo" slinky_node_idle || { slinky_logs; exit 1; }
  timing chart-slinky-slurmd-idle "$(ms "$t") ms"
  sockets=$(gres_sockets); [ -n "$sockets" ] || fail "no socket found for the served GPUs"
  slinky_node_gres_is "gpu:nvidia_gb300:4(S:$sockets)" || { slinky_logs; fail "sinfo: $(ctld sinfo -h -N -o '%N %T %G'), want gpu:nvidia_gb300:4(S:$sockets)"; }
  s=$(slinky_srun --gres=gpu:2 env | grep '^CUDA_VISIBLE_DEVICES=') || { slinky_logs; fail "srun -N1 --gres=gpu:2 env"; }
  [ "$s" = CUDA_VISIBLE_DEVICES=0,1 ] || fail "srun --gres=gpu:2 on the chart's agent: $s"
  echo "  on the chart's agent: $(ctld sinfo -h -N -o '%N %T %G'); srun --gres=gpu:2: $s"
  # the README's verification: nvidia-smi in the job, through the libnvidia-ml.so.1 the NRI plugin
  # bound into the slurmd container; without ConstrainDevices (Slinky's default cgroup.conf) a job
  # sees all four GPUs, as on a real node, with the driver files' UUIDs (the node test bed's
  # constrain-devices step confines jobs)
  local smi uuids
  # shellcheck disable=SC2016 # expanded by the job's shell
  smi=$(slinky_srun --gres=gpu:2 bash -c 'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; nvidia-smi -L') || { slinky_logs; fail "srun nvidia-smi -L"; }
  echo "$smi" | sed 's/^/  srun nvidia-smi -L: /'
  [ "$(sed -n 1p <<< "$smi")" = CUDA_VISIBLE_DEVICES=0,1 ] || fail "the README's srun: want CUDA_VISIBLE_DEVICES=0,1 first"
  [ "$(grep -cE '^GPU [0-3]: NVIDIA GB300 \(UUID: GPU-[0-9a-f-]+\)$' <<< "$smi")" = 4 ] || fail "srun nvidia-smi -L: want four NVIDIA GB300 lines"
  uuids=$(slinky_srun sh -c 'sed -n "s/^GPU UUID:[[:space:]]*//p" /proc/driver/nvidia/gpus/*/information' | sort)
  [ "$(grep -oE 'GPU-[0-9a-f-]+' <<< "$smi" | sort)" = "$uuids" ] || fail "nvidia-smi -L's UUIDs are not the driver files': $uuids"
  uid0=$(slurmd_uid)
  # the README's token Secret and profile change; slurmrestd's address in place of its Service's
  guide_sh "kubectl -n mockgpu-system create secret generic slurm-token" > /dev/null || fail "the README's slurm-token Secret"
  t=$(date +%s%N)
  guide "helm upgrade mockgpu " --set "controller.remediation.slurmrestdUrl=http://$rip:$RESTAPI_PORT" --timeout 120s > "$ST/helm-upgrade.txt" 2>&1 \
    || { cat "$ST/helm-upgrade.txt"; chart_logs; fail "helm upgrade (profile gb200, remediation on)"; }
  timing chart-upgrade "$(ms "$t") ms (helm upgrade --wait)"
  wait_for 60 "GpuNode $NODE with profile gb200" gn_profile_is gb200 || fail "GpuNode profile: $(gn '{.spec.profile}')"
  wait_for 120 "the controller's remediation (SlurmNodeDeleted, PodDeleted)" remediated \
    || { kc -n "$CHART_NS" logs deploy/mockgpu-controller | tail -20; gn_events | sort | uniq -c; kc get gpunode "$NODE" -o jsonpath='{.status.conditions}'; fail "no remediation after the profile change"; }
  echo "  the GpuNode's events: $(gn_events | sort | uniq -c | awk '{printf "%s %s; ", $2, $1}')"
  gn_event_seen Drifted || fail "no Drifted event before the remediation"
  sockets=$(gres_sockets); [ -n "$sockets" ] || fail "no socket found for the served GPUs"
  wait_for 120 "sinfo: $NODE idle gpu:nvidia_gb200:4(S:$sockets)" slinky_node_gres_is "gpu:nvidia_gb200:4(S:$sockets)" \
    || { slinky_logs; fail "Slurm did not take the new GPUs"; }
  timing chart-remediated "$(ms "$t") ms from helm upgrade to slurmd idle with the new GPUs"
  [ -n "$(slurmd_uid)" ] && [ "$(slurmd_uid)" != "$uid0" ] || fail "the slurmd pod was not recreated (uid $(slurmd_uid), was $uid0)"
  s=$(slinky_srun --gres=gpu:2 env | grep '^CUDA_VISIBLE_DEVICES=') || { slinky_logs; fail "srun --gres=gpu:2 after the remediation"; }
  [ "$s" = CUDA_VISIBLE_DEVICES=0,1 ] || fail "srun --gres=gpu:2 after the remediation: $s"
  r=$(slinky_srun sh -c 'grep -h "^Model:" /proc/driver/nvidia/gpus/*/information | sort | uniq -c') || fail "srun reading the GPUs' information"
  grep -qE '^ *4 Model:[[:space:]]+NVIDIA GB200' <<< "$r" || fail "the job sees: $r"
  echo "  after helm upgrade: $(guide "kubectl -n slurm exec slurm-controller-0 -c slurmctld -- sinfo" | tail -1); slurmd pod recreated; srun --gres=gpu:2: $s; the job: $(xargs <<< "$r")"
  echo "  conditions: $(kc get gpunode "$NODE" -o json | jq -r '[.status.conditions[] | "\(.type)=\(.status)"] | join(" ")')"
  slinky_down; trap - EXIT
}

scenario_chart_uninstall() {  # `helm uninstall` leaves no mount, device node or label behind
  local t k
  grep ' /run/mockgpu' "/proc/$(nodepid)/mountinfo" | sed 's/^/  mount before uninstall: /'
  t=$(date +%s%N)
  guide "helm uninstall mockgpu " --timeout 180s > /dev/null || fail "helm uninstall"
  timing chart-uninstall "$(ms "$t") ms"
  wait_for 60 "no mockgpu FUSE mount in the node" no_mockgpu_mounts \
    || { grep ' /run/mockgpu' "/proc/$(nodepid)/mountinfo" | sed 's/^/  left: /'; fail "helm uninstall left $(mockgpu_mounts) FUSE mounts"; }
  [ "$(mockgpu_devices)" = 0 ] || fail "helm uninstall left device nodes: $(find "$R/run/mockgpu" -type c | tr '\n' ' ')"
  for k in mockgpu.io/profile nvidia.com/gpu.present nvidia.com/gpu.count nvidia.com/gpu.product feature.node.kubernetes.io/pci-10de.present; do
    [ -z "$(node_label "$k")" ] || fail "helm uninstall left the label $k=$(node_label "$k")"
  done
  echo "  uninstalled: no FUSE mount, no device node under /run/mockgpu, no mockgpu label on $NODE"
}

run_cluster_scenarios() {
  sstep node-ready rust_scenario node-ready
  sstep pod-daemonset-exec rust_scenario pod-daemonset-exec
  sstep services-dns rust_scenario services-dns
  if [ "$NODES" -gt 1 ]; then sstep two-nodes rust_scenario two-nodes; else echo "two-nodes: left out (NODES=1)"; fi
  sstep crd-admission-policy rust_scenario crd-admission-policy
  sstep helm rust_scenario helm
  sstep chart-dry-run rust_scenario chart-dry-run
  sstep product-images rust_scenario product-images
  sstep device-plugin-socket rust_scenario device-plugin-socket
  sstep gpu-pod-injected rust_scenario gpu-pod-injected
  sstep dp-registered rust_scenario dp-registered
  sstep gpunode-setup rust_scenario gpunode-setup
  sstep gpunode-reported rust_scenario gpunode-reported
  sstep dp-pod-2-gpus rust_scenario dp-pod-2-gpus
  sstep gpunode-held rust_scenario gpunode-held
  sstep dp-pod-5-pending rust_scenario dp-pod-5-pending
  sstep dp-failed-gpu rust_scenario dp-failed-gpu
  sstep dp-kubelet-restart rust_scenario dp-kubelet-restart
  sstep gpunode-topology rust_scenario gpunode-topology
  sstep gpunode-recreated rust_scenario gpunode-recreated
  sstep gpunode-heartbeat rust_scenario gpunode-heartbeat
  sstep gpunode-last-report rust_scenario gpunode-last-report
  sstep controller-rbac rust_scenario controller-rbac
  sstep controller-leader rust_scenario controller-leader
  sstep controller-labels rust_scenario controller-labels
  sstep controller-stale rust_scenario controller-stale
  sstep controller-failover rust_scenario controller-failover
  sstep controller-apiserver-restart rust_scenario controller-apiserver-restart
  sstep controller-gpunode-deleted rust_scenario controller-gpunode-deleted
  if slinky_supported; then sstep slinky-slurm scenario_slinky_slurm
  else log "slinky-slurm: left out: the node root has Slurm $(innode slurmd -V | awk '{print $2}'), Slinky's operator supports 25.11 and later (SUITE=sid has 26.05)"; fi
  sstep chart-install scenario_chart_install
  # (Slurm 24.11's dynamic nodes ignore autodetected GPUs that their --conf does not name: the
  # Slinky shape needs 25.11 or later there too)
  if slinky_supported; then sstep chart-slinky-remediation scenario_chart_slinky
  else log "chart-slinky-remediation: left out: Slurm $(innode slurmd -V | awk '{print $2}') ignores the GPUs a dynamic node autodetects (SUITE=sid has 26.05)"; fi
  sstep chart-uninstall scenario_chart_uninstall
}

cluster_down() {  # (phase_down, first) the kubelet before the runtime, so that it restarts nothing
  stop_kinds TERM controller-ctl-a controller-ctl-b kubelet kube-proxy kube-scheduler kube-controller-manager kube-apiserver etcd
}
