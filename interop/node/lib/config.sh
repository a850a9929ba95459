# shellcheck shell=bash
# Sourced by node.sh: the node's component configs under $W/conf (containerd, kubelet, CNI,
# kube-proxy) and kube-apiserver's static Pod manifest in $ETC_K8S/manifests, rewritten at every
# up from the constants and options in node.sh. Every line that mattered on this kind of machine
# (cgroup v1, no CAP_SYS_RESOURCE, no systemd, hard-coded host paths) is explained in
# ../shared/reference/real-node.md; the comments here say which.
# Uses: W ETC_K8S BIN RUNC NODE_NAME NODE_IP POD_CIDR SERVICE_CIDR PAUSE_IMAGE APISERVER_IMAGE
#       APISERVER_FLAGS[] APISERVER_MOUNTS[] APISERVER_GRACE

config_containerd() {
	cat >"$W/conf/containerd.toml" <<EOF
version = 4
root = "$W/containerd/root"
state = "$W/containerd/state"
imports = []
# Snapshotters and tracing this node does not use (some probe the host at start).
disabled_plugins = ["io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = "$W/containerd/containerd.sock"
  [plugins.'io.containerd.server.v1.ttrpc']
    address = "$W/containerd/containerd.sock.ttrpc"
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.internal.v1.opt']
    path = "$W/containerd/opt"
  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = "$W/containerd/image-verifier"
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "$PAUSE_IMAGE"
  [plugins.'io.containerd.cri.v1.runtime']
    cdi_spec_dirs = []
    # Pod netns pins under the work dir, not /run/netns.
    netns_mounts_under_state_dir = true
    # No CAP_SYS_RESOURCE here: runc cannot lower a sandbox's oom_score_adj and fails every pod.
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = "$RUNC"
          Root = "$W/containerd/runc"
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["$BIN/cni"]
      conf_dir = "$W/cni/conf"
      max_conf_num = 1
  [plugins.'io.containerd.grpc.v1.cri']
    # exec, attach and port-forward streams, proxied by the kubelet
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
EOF
}

config_cni() {
	mkdir -p "$W/cni/conf" "$W/cni/ipam"
	cat >"$W/cni/conf/10-tether-node.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "tether-node", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$W/cni/ipam",
            "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
}

config_kubelet() {
	cat >"$W/conf/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false            # this machine has cgroup v1; 1.35+ refuses it otherwise
cgroupDriver: cgroupfs         # no systemd
containerRuntimeEndpoint: unix://$W/containerd/containerd.sock
imageServiceEndpoint: unix://$W/containerd/containerd.sock
staticPodPath: /etc/kubernetes/manifests
podLogsDir: $W/pod-logs
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: /etc/kubernetes/pki/ca.crt}
authorization: {mode: Webhook}
resolvConf: ""                 # no cluster DNS and not the host's resolv.conf
hairpinMode: none
maxPods: 30
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
rotateCertificates: false
serverTLSBootstrap: false
protectKernelDefaults: false   # the host sysctls it would write are bind mounts (supervisor.sh)
EOF
}

config_kube_proxy() {
	cat >"$W/conf/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection: {kubeconfig: /etc/kubernetes/kube-proxy.conf}
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
nodePortAddresses: ["$NODE_IP/32"]
# leave the host-wide conntrack settings alone
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
}

# config_apiserver_manifest: kube-apiserver as kubeadm runs it, a hostNetwork static Pod with the
# PKI from /etc/kubernetes/pki and the command found through PATH (containerd's default PATH),
# plus the flags (APISERVER_FLAGS), hostPath mounts (APISERVER_MOUNTS, PATH[:TYPE]) and grace
# period (APISERVER_GRACE, empty: the default 30 s as kubeadm's) given to up. etcd is a plain-HTTP process on loopback (kubeadm's runs with TLS, in a Pod). Probes as
# kubeadm's, with a 1 s startup probe instead of 10 s.
config_apiserver_manifest() {
	# written beside it under a dot name (the kubelet skips those) and renamed into place
	local m=$ETC_K8S/manifests/kube-apiserver.yaml tmp=$ETC_K8S/manifests/.kube-apiserver.yaml.tmp
	local f mount path type i=0
	mkdir -p "$ETC_K8S/manifests"
	{
		cat <<EOF
# Written by interop/node/node.sh up (rewritten at every up; edit it to change the running Pod,
# the kubelet restarts it).
apiVersion: v1
kind: Pod
metadata:
  name: kube-apiserver
  namespace: kube-system
  labels: {component: kube-apiserver, tier: control-plane}
  annotations:
    kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint: $NODE_IP:6443
spec:
  hostNetwork: true
${APISERVER_GRACE:+  terminationGracePeriodSeconds: $APISERVER_GRACE
}  priority: 2000001000
  priorityClassName: system-node-critical
  securityContext:
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: kube-apiserver
    image: $APISERVER_IMAGE
    imagePullPolicy: IfNotPresent
    command:
    - kube-apiserver
    - --advertise-address=$NODE_IP
    - --allow-privileged=true
    - --authorization-mode=Node,RBAC
    - --client-ca-file=/etc/kubernetes/pki/ca.crt
    - --enable-admission-plugins=NodeRestriction
    - --etcd-servers=http://127.0.0.1:2379
    - --kubelet-client-certificate=/etc/kubernetes/pki/apiserver-kubelet-client.crt
    - --kubelet-client-key=/etc/kubernetes/pki/apiserver-kubelet-client.key
    - --kubelet-preferred-address-types=InternalIP
    - --proxy-client-cert-file=/etc/kubernetes/pki/front-proxy-client.crt
    - --proxy-client-key-file=/etc/kubernetes/pki/front-proxy-client.key
    - --requestheader-allowed-names=front-proxy-client
    - --requestheader-client-ca-file=/etc/kubernetes/pki/front-proxy-ca.crt
    - --requestheader-extra-headers-prefix=X-Remote-Extra-
    - --requestheader-group-headers=X-Remote-Group
    - --requestheader-username-headers=X-Remote-User
    - --secure-port=6443
    - --service-account-issuer=https://kubernetes.default.svc.cluster.local
    - --service-account-key-file=/etc/kubernetes/pki/sa.pub
    - --service-account-signing-key-file=/etc/kubernetes/pki/sa.key
    - --service-cluster-ip-range=$SERVICE_CIDR
    - --tls-cert-file=/etc/kubernetes/pki/apiserver.crt
    - --tls-private-key-file=/etc/kubernetes/pki/apiserver.key
    - --profiling=false
EOF
		for f in "${APISERVER_FLAGS[@]}"; do printf '    - %s\n' "$f"; done
		cat <<EOF
    resources:
      requests: {cpu: 250m}
    startupProbe:
      httpGet: {host: $NODE_IP, path: /livez, port: 6443, scheme: HTTPS}
      initialDelaySeconds: 1
      periodSeconds: 1
      timeoutSeconds: 15
      failureThreshold: 120
    livenessProbe:
      httpGet: {host: $NODE_IP, path: /livez, port: 6443, scheme: HTTPS}
      initialDelaySeconds: 10
      periodSeconds: 10
      timeoutSeconds: 15
      failureThreshold: 8
    readinessProbe:
      httpGet: {host: $NODE_IP, path: /readyz, port: 6443, scheme: HTTPS}
      periodSeconds: 1
      timeoutSeconds: 15
      failureThreshold: 3
    volumeMounts:
    - {name: k8s-certs, mountPath: /etc/kubernetes/pki, readOnly: true}
EOF
		for mount in "${APISERVER_MOUNTS[@]}"; do
			i=$((i + 1))
			printf '    - {name: extra-%d, mountPath: %s}\n' "$i" "${mount%%:*}"
		done
		cat <<EOF
  volumes:
  - name: k8s-certs
    hostPath: {path: /etc/kubernetes/pki, type: DirectoryOrCreate}
EOF
		i=0
		for mount in "${APISERVER_MOUNTS[@]}"; do
			i=$((i + 1))
			path=${mount%%:*}
			type=DirectoryOrCreate
			[ "$path" = "$mount" ] || type=${mount#*:}
			printf '  - name: extra-%d\n    hostPath: {path: %s, type: %s}\n' "$i" "$path" "$type"
		done
	} >"$tmp"
	mv "$tmp" "$m"
}
