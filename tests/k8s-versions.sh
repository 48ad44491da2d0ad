# k8s-versions.sh - the one place where the test bed's Kubernetes, Helm and CoreDNS versions are pinned
# (sourced by tests/build-k8s.sh and tests/testbed/cluster.sh).
# kubelet 1.37 is the newest that works with trixie's containerd 1.7 (no CRI RuntimeConfig:
# kubelet 1.38 drops the fallback to its own cgroupDriver).
K8S_VERSION=v1.37.2
# Helm, current major (4), from helm.sh/helm/v4.
HELM_VERSION=v4.3.2
# From the node root's Debian suite, not built: etcd, the CNI plugins (bridge, host-local), iproute2,
# nftables (kube-proxy's nftables mode runs `nft`), wget (pods reach the `kubernetes` service).
K8S_DEBIAN_PACKAGES="etcd-server etcd-client containernetworking-plugins iproute2 nftables wget"
# CoreDNS, the cluster's DNS (github.com/coredns/coredns), with the plugins the test bed's
# Corefile (tests/testbed/node/coredns.yaml) uses, in CoreDNS's execution order: built from a main
# package that imports these and coremain (CoreDNS's documented way to choose plugins at compile
# time, dnsserver.SetDirectives), not its own main, which imports all 60 (the cloud providers' SDKs
# among them: a cold build took 676 s of the CI's 90 minutes).
COREDNS_VERSION=v1.15.0
COREDNS_PLUGINS="ready health errors cache kubernetes"
# Binaries built by tests/build-k8s.sh from k8s.io/kubernetes.
K8S_BINARIES="kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy"
