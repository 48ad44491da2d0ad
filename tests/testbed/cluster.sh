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
# NODES (2) nodes: node0 runs the control plane and is the test bed's node (its root $R); node<i>
# (worker_vars) has a root, state and logs of its own under $TB, the same images, and a veth link
# to node0 (nodes_link). Workers register with Slinky's worker taint, so that only pods that
# tolerate it (the chart's DaemonSets, Slinky's slurmd) land there.
NODES=${NODES:-2}
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

# helm for the scenarios (cluster::helm, the README's commands: state under $ST/helm)
HELM=${HELM:-$K8S_BIN/helm}
# kubectl from the host, in the node's network namespace only (the API server listens on its
# loopback)
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

brnf() {  # whether bridged IPv4 goes through the node's nftables (br_netfilter; new network
  # namespaces start with bridge-nf-call-iptables=1 where the kernel has it)
  [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2> /dev/null)" = 1 ]
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
# a pod reaching a service whose endpoint is on the same bridge: the reply crosses the bridge
# only, and reaches the node's NAT through br_netfilter's hooks (bridge-nf-call-iptables); on a
# kernel without them, masquerading every service connection makes it come back (and each server
# then sees the node's address instead of its client's, which Slurm's dynamic nodes register by:
# the Slinky steps check NodeAddr)
nftables: {masqueradeAll: $(brnf && echo false || echo true)}
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

control_plane_up() {
  local t t0 P=$KN/pki; t=$(date +%s%N); t0=$t
  spawn etcd "$LOGS/etcd.log" etcd --name node0 --data-dir /var/lib/etcd-mgtb --unsafe-no-fsync \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster node0=http://127.0.0.1:2380
  wait_for 30 "etcd healthy" etcd_healthy || { tail -20 "$LOGS/etcd.log"; exit 1; }
  timing etcd-ready "$(ms "$t") ms"; t=$(date +%s%N)
  # (controller-apiserver-restart starts it again with the command line it runs with: Bed::cmdline_of)
  spawn kube-apiserver "$LOGS/kube-apiserver.log" /opt/k8s/kube-apiserver --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=0.0.0.0 --secure-port=6443 --advertise-address="$NODE_IP" \
    --service-cluster-ip-range="$SVC_CIDR" --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file=$P/sa.pub --service-account-signing-key-file=$P/sa.key \
    --tls-cert-file=$P/apiserver.crt --tls-private-key-file=$P/apiserver.key --client-ca-file=$P/ca.crt \
    --kubelet-client-certificate=$P/apiserver-kubelet-client.crt --kubelet-client-key=$P/apiserver-kubelet-client.key \
    --kubelet-preferred-address-types=InternalIP --kubelet-certificate-authority=$P/ca.crt \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --allow-privileged=true \
    --profiling=false -v=1
  wait_for 120 "kube-apiserver /readyz" api_ready || { tail -30 "$LOGS/kube-apiserver.log"; exit 1; }
  timing apiserver-ready "$(ms "$t") ms (etcd + apiserver $(ms "$t0") ms)"
  echo "  /readyz from the host: $(kc get --raw /readyz)"
}

node_registered() { kc get node "$NODE" > /dev/null; }

node_daemons() {  # kube-proxy and the kubelet of this node (dp-kubelet-restart starts it again as it runs)
  cgroup_root_ready
  spawn kube-proxy "$LOGS/kube-proxy.log" /opt/k8s/kube-proxy --config=$KN/kube-proxy.yaml -v=1
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
# the controller's steps (controller-rbac ... controller-gpunode-deleted) are in Rust
# (src/scenarios/controller.rs): two replicas as host processes in the node's network namespace
# (kinds controller-ctl-a, controller-ctl-b), with a service account's token and the chart's RBAC

# ---------------------------------------------------------------------------------------------
# Slurm the way Slinky runs it (slinky-slurm, chart-slinky-remediation): in Rust
# (src/scenarios/slinky.rs, chart.rs)

slinky_supported() {  # Slinky's operator supports Slurm 25.11 and later
  local v; v=$(innode slurmd -V | awk '{print $2}')
  awk -v v="$v" 'BEGIN {split(v, p, "."); exit !(p[1] > 25 || (p[1] == 25 && p[2] >= 11))}'
}

# ---------------------------------------------------------------------------------------------
# the agent's GpuNode report against the real API server, with the agent's own credentials: its
# steps (gpunode-setup ... gpunode-last-report) are in Rust (src/scenarios/gpunode.rs)

# ---------------------------------------------------------------------------------------------
# the chart as a user installs it (the README's commands): chart-install, chart-slinky-remediation
# and chart-uninstall are in Rust (src/scenarios/chart.rs); the GPU faults on it in
# src/scenarios/faults.rs, with go-nvml's program (tests/nvml/go, its Go caches shared with
# tests/nvml/run.sh) in a GPU pod

run_cluster_scenarios() {
  NVMLLIST=$ST/nvmllist
  bash "$REPO/tests/nvml/go/build.sh" "${NVML_CACHE:-/var/tmp/mockgpu-nvml}" "$NVMLLIST"
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
  if slinky_supported; then sstep slinky-slurm rust_scenario slinky-slurm
  else log "slinky-slurm: left out: the node root has Slurm $(innode slurmd -V | awk '{print $2}'), Slinky's operator supports 25.11 and later (SUITE=sid has 26.05)"; fi
  sstep chart-install rust_scenario chart-install
  if [ "$NODES" -gt 1 ]; then sstep worker-leaves rust_scenario worker-leaves; else echo "worker-leaves: left out (NODES=1)"; fi
  sstep chart-gpu-faults rust_scenario chart-gpu-faults
  sstep chart-dra rust_scenario chart-dra
  # (Slurm 24.11's dynamic nodes ignore autodetected GPUs that their --conf does not name: the
  # Slinky shape needs 25.11 or later there too)
  if slinky_supported; then
    sstep chart-slinky-remediation rust_scenario chart-slinky-remediation
    sstep chart-slinky-gpu-drain rust_scenario chart-slinky-gpu-drain
    sstep chart-slinky-imex rust_scenario chart-slinky-imex
  else log "chart-slinky-remediation, chart-slinky-gpu-drain, chart-slinky-imex: left out: Slurm $(innode slurmd -V | awk '{print $2}') ignores the GPUs a dynamic node autodetects (SUITE=sid has 26.05)"; fi
  sstep chart-uninstall rust_scenario chart-uninstall
}

cluster_down() {  # (phase_down, first) the kubelet before the runtime, so that it restarts nothing
  stop_kinds TERM controller-ctl-a controller-ctl-b kubelet kube-proxy kube-scheduler kube-controller-manager kube-apiserver etcd
}
