#!/usr/bin/env bash
# The real node's supervisor: started by node.sh up as PID 1 of a fresh PID namespace, in a
# private mount namespace, inside the node's network namespace:
#   nsenter --net=/run/netns/tether-node -- unshare --mount --propagation private --pid --fork \
#     --mount-proc --kill-child=SIGKILL -- bash supervisor.sh $W/conf/node.env
# It makes the node's mounts (only it sees them), starts containerd, imports the boot images,
# starts etcd and the kubelet (which runs kube-apiserver as a static Pod from
# /etc/kubernetes/manifests), waits for kube-apiserver's /readyz, then starts
# kube-controller-manager, kube-scheduler and kube-proxy, and writes $W/run/ready. On SIGTERM it
# stops them (stop_all: TERM, then KILL after a deadline) and exits; the kernel then kills
# everything left in the PID namespace and drops every mount with the mount namespace.
# A start step that misses its deadline prints what it waited for and the log's last lines, and
# exits non-zero (node.sh up reports it).
set -euo pipefail
# shellcheck source=/dev/null
. "$1"

log() { echo "$(date +%H:%M:%S.%3N) supervisor: $*"; }
declare -A pid=()
order=()

tail_log() { # tail_log NAME: the last lines of a component's log
	echo "--- last lines of $W/logs/$1.log ---"
	tail -n 25 "$W/logs/$1.log" 2>/dev/null || true
}

start() { # start NAME CMD...
	local name=$1
	shift
	"$@" >>"$W/logs/$name.log" 2>&1 </dev/null &
	pid[$name]=$!
	order+=("$name")
	log "started $name (pid ${pid[$name]} in the node's PID namespace)"
}

wait_for() { # wait_for NAME SECONDS WHAT CMD...: poll CMD every 0.1 s until it succeeds
	local name=$1 secs=$2 what=$3 deadline
	shift 3
	deadline=$((SECONDS + secs))
	until "$@" >/dev/null 2>&1; do
		if ! kill -0 "${pid[$name]}" 2>/dev/null; then
			log "$name exited while waiting for $what"
			tail_log "$name"
			exit 1
		fi
		if [ "$SECONDS" -ge "$deadline" ]; then
			log "timed out after ${secs} s waiting for $what"
			tail_log "$name"
			exit 1
		fi
		sleep 0.1
	done
	log "$what after $((SECONDS - t0)) s"
}

stopping=0
# stop_all: TERM to the Kubernetes components first (the kubelet then starts nothing new), then to
# every other process of the PID namespace at once (kill -1 from its PID 1: the containers, so
# kube-apiserver lets go of etcd, the shims, etcd, containerd); KILL what is left after
# STOP_SECONDS.
stop_all() {
	stopping=1
	local name deadline t_stop=$SECONDS
	log "stopping"
	deadline=$((SECONDS + STOP_SECONDS))
	for name in kube-proxy kube-scheduler kube-controller-manager kubelet etcd containerd; do
		[ -n "${pid[$name]:-}" ] || continue
		if [ "$name" = etcd ]; then
			kill -TERM -1 2>/dev/null || true
		else
			kill -TERM "${pid[$name]}" 2>/dev/null || true
		fi
		while kill -0 "${pid[$name]}" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
		if kill -0 "${pid[$name]}" 2>/dev/null; then
			log "$name still running ${STOP_SECONDS} s after the stop began: KILL"
			kill -KILL "${pid[$name]}" 2>/dev/null || true
		else
			log "$name stopped after $((SECONDS - t_stop)) s"
		fi
	done
	log "stopped; the kernel ends the rest of the PID namespace"
	exit 0
}
trap stop_all TERM INT

t0=$SECONDS
rm -f "$W/run/ready"

# --- mounts, private to this mount namespace (see real-node.md, "Host paths").
# The paths the kubelet and containerd hard-code, whatever their root dirs say.
for d in /var/lib/kubelet /var/log/containers /var/lib/cni /run/containerd; do
	mount -t tmpfs -o mode=0755,size=64m tether-node "$d"
done
# kubeadm's /etc/kubernetes, from the work dir.
mount --bind "$ETC_K8S" /etc/kubernetes
# The host-wide sysctls the kubelet would write (vm.overcommit_memory=1, kernel.panic=10,
# kernel.panic_on_oops=1): read-only files with those values over this /proc's entries, so it
# reads what it wants and writes nothing to the host.
mkdir -p "$W/conf/sysctl"
for kv in vm/overcommit_memory=1 kernel/panic=10 kernel/panic_on_oops=1; do
	f=$W/conf/sysctl/${kv%%=*}
	mkdir -p "$(dirname "$f")"
	echo "${kv#*=}" >"$f"
	mount --bind -o ro "$f" "/proc/sys/${kv%%=*}"
done
log "mounts made (tmpfs on the kubelet's and containerd's host paths, $ETC_K8S on /etc/kubernetes, sysctls)"

ctr=("$BIN/ctr" --address "$W/containerd/containerd.sock" -n k8s.io)
PATH=$BIN:$PATH start containerd "$BIN/containerd" --config "$W/conf/containerd.toml"
wait_for containerd 30 "containerd answering on $W/containerd/containerd.sock" "${ctr[@]}" version
# import_image TARBALL: skipped when containerd has the tarball's name at its digest already (a
# warm start; importing again took ~2 s).
import_image() {
	local index ref digest have
	index=$(tar -xOf "$1" index.json)
	ref=$(sed -n 's/.*"io.containerd.image.name":"\([^"]*\)".*/\1/p' <<<"$index")
	digest=$(sed -n 's/.*"digest":"\(sha256:[0-9a-f]*\)".*/\1/p' <<<"$index")
	if [ -n "$ref" ] && [ -n "$digest" ]; then
		have=$("${ctr[@]}" images ls "name==$ref" 2>/dev/null) || have=
		[[ $have != *" $digest "* ]] || return 0
	fi
	"${ctr[@]}" images import --snapshotter overlayfs "$1" >>"$W/logs/import.log" 2>&1 ||
		{ log "importing $1 failed"; tail -n 25 "$W/logs/import.log"; exit 1; }
	log "imported $1 ($ref)"
}
for tarball in "${BOOT_IMAGES[@]}"; do import_image "$tarball"; done
log "boot images in containerd after $((SECONDS - t0)) s"

start etcd "$K8S_BIN/etcd" --name=tether-node --data-dir="$W/etcd" \
	--listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
	--listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
	--initial-cluster=tether-node=http://127.0.0.1:2380 --listen-metrics-urls=http://127.0.0.1:2381 \
	--log-level=warn
start kubelet "$BIN/kubelet" --config="$W/conf/kubelet-config.yaml" --kubeconfig=/etc/kubernetes/kubelet.conf \
	--root-dir="$W/kubelet" --cert-dir="$W/kubelet/pki" --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" -v=2
wait_for etcd 30 "etcd healthy" curl -sf --max-time 2 http://127.0.0.1:2379/health
wait_for kubelet "$APISERVER_SECONDS" "kube-apiserver (static Pod) ready at https://$NODE_IP:6443/readyz" \
	curl -sf --max-time 2 --cacert "$ETC_K8S/pki/ca.crt" "https://$NODE_IP:6443/readyz"

start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig=/etc/kubernetes/controller-manager.conf \
	--authentication-kubeconfig=/etc/kubernetes/controller-manager.conf \
	--authorization-kubeconfig=/etc/kubernetes/controller-manager.conf \
	--bind-address=127.0.0.1 --leader-elect=false --controllers='*' \
	--service-account-private-key-file=/etc/kubernetes/pki/sa.key --root-ca-file=/etc/kubernetes/pki/ca.crt \
	--use-service-account-credentials=true --service-cluster-ip-range="$SERVICE_CIDR" \
	--requestheader-client-ca-file=/etc/kubernetes/pki/front-proxy-ca.crt \
	--client-ca-file=/etc/kubernetes/pki/ca.crt
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig=/etc/kubernetes/scheduler.conf \
	--authentication-kubeconfig=/etc/kubernetes/scheduler.conf --authorization-kubeconfig=/etc/kubernetes/scheduler.conf \
	--bind-address=127.0.0.1 --leader-elect=false
start kube-proxy "$BIN/kube-proxy" --config="$W/conf/kube-proxy.yaml"
echo "$((SECONDS - t0))" >"$W/run/ready"
log "ready after $((SECONDS - t0)) s"

# Watch: a component that exits is logged (node.sh status shows it); the node keeps running.
declare -A reported=()
while [ "$stopping" = 0 ]; do
	sleep 1 &
	wait $! || true
	for name in "${order[@]}"; do
		if [ -z "${reported[$name]:-}" ] && ! kill -0 "${pid[$name]}" 2>/dev/null; then
			reported[$name]=1
			log "$name exited"
			tail_log "$name"
		fi
	done
done
