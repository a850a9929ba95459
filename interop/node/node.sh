#!/usr/bin/env bash
# A real single-node Kubernetes v1.37.2 cluster on this machine, shaped like kubeadm's, for tests
# that need real pods: kubelet + containerd v2.4.2 (Debian's runc) + the reference CNI plugins,
# kube-apiserver as a static Pod, etcd, kube-controller-manager, kube-scheduler and kube-proxy
# (nftables) as processes of a supervisor. Everything is built from pinned sources
# (interop/node/build.sh, interop/k8s/build.sh) and every image locally (interop/node/images.sh);
# nothing is pulled. Needs root.
#
#   node.sh up [--apiserver-flag=FLAG]... [--apiserver-mount=PATH[:HOSTPATH_TYPE]]...
#              [--apiserver-grace-period=SECONDS]
#   node.sh down            stop every process of the node (work dir, netns and images stay: the
#                           next up is a warm start)
#   node.sh clean           down, then remove the netns, the pods' cgroups, the work dir and the
#                           host dirs up created; nothing of the node is left
#   node.sh kubectl ARGS... kubectl as cluster-admin (admin.conf), inside the node's network
#   node.sh run CMD...      CMD inside the node's network namespace, with KUBECONFIG=admin.conf and
#                           kubectl on PATH (curl to a pod IP, kubectl port-forward + curl, helm)
#   node.sh import TAR...   import OCI image tarballs into containerd's k8s.io namespace
#   node.sh status          whether it is up, its processes and RSS, and the paths below
#
# The node's world: network namespace "tether-node" (node IP 198.18.0.2 on lo, pods 198.19.0.0/24
# on the bridge cni0, Services 198.18.16.0/24 with kubernetes at 198.18.16.1, routed to lo for
# kube-proxy to rewrite; no default route, nothing leaves it), and a supervisor (supervisor.sh) in private mount and PID namespaces.
# Work dir $W = ${TETHER_NODE_DIR:-/tmp/tether-node}; inside the node $W/etc-kubernetes is
# /etc/kubernetes, kubeadm's layout:
#   pki/{ca,apiserver,apiserver-kubelet-client,front-proxy-ca,front-proxy-client}.{crt,key}, sa.{key,pub}
#   manifests/kube-apiserver.yaml   the kubelet's staticPodPath; other manifests put there run too
#   admin.conf kubelet.conf controller-manager.conf scheduler.conf kube-proxy.conf
# up rewrites manifests/kube-apiserver.yaml from its options every time: add kube-apiserver flags
# with --apiserver-flag and hostPath volumes (mounted at the same path, default type
# DirectoryOrCreate) with --apiserver-mount, e.g. for Konnectivity:
#   node.sh up --apiserver-flag=--egress-selector-config-file=/etc/kubernetes/egress-selector-configuration.yaml \
#     --apiserver-mount=/etc/kubernetes/egress-selector-configuration.yaml:File \
#     --apiserver-mount=/etc/kubernetes/konnectivity-server
# or edit the manifest while the node runs (the kubelet restarts the Pod; up overwrites the edit).
# A restart takes ~35 s: the old kube-apiserver stops listening at once but only exits when the
# kubelet kills it at the end of the grace period, 30 s by default as with kubeadm
# (kubernetes/kubernetes#131052); --apiserver-grace-period=SECONDS shortens that.
# Paths given to the Pod are the node's: /etc/kubernetes/X is $W/etc-kubernetes/X on the host.
#
# One node per machine: the netns name, the host mount points and /kubepods are fixed.
#
# Env: TETHER_NODE_DIR (work dir), TETHER_CACHE_DIR (build caches, default ~/.cache/tether),
#      TETHER_NODE_UP_SECONDS (deadline of each wait in up, default 120), TETHER_INTEROP_BIN
#      (where images.sh takes upstream's proxy-server and proxy-agent, default interop/bin).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

W=${TETHER_NODE_DIR:-/tmp/tether-node}
case $W in /?*) W=${W%/} ;; *) echo "node.sh: TETHER_NODE_DIR must be an absolute path, not $W" >&2; exit 2 ;; esac
ETC_K8S=$W/etc-kubernetes
NETNS=tether-node
NODE_NAME=tether-node
NODE_IP=198.18.0.2
POD_CIDR=198.19.0.0/24
SERVICE_CIDR=198.18.16.0/24
SERVICE_IP=198.18.16.1
APISERVER_URL=https://$NODE_IP:6443
UP_SECONDS=${TETHER_NODE_UP_SECONDS:-120}
# `up` refuses a disk this full: kubelet evicts pods and removes images near a full disk.
MAX_DISK_USED_PERCENT=95
[[ $UP_SECONDS =~ ^[1-9][0-9]*$ ]] || { echo "node.sh: TETHER_NODE_UP_SECONDS must be a whole number of seconds, not $UP_SECONDS" >&2; exit 2; }
STOP_SECONDS=15
# The paths the kubelet and containerd hard-code, covered by a tmpfs inside the node, plus
# /etc/kubernetes; made on the host as empty mount points when missing, removed by clean.
HOST_DIRS=(/var/lib/kubelet /var/log/containers /var/lib/cni /run/containerd /etc/kubernetes)

die() { echo "node.sh: $*" >&2; exit 1; }
say() { echo "node.sh: $*" >&2; }
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }
secs_since() { local d=$(($(now_ms) - $1)); printf '%d.%d' $((d / 1000)) $((d % 1000 / 100)); }

# shellcheck source=lib/pki.sh
. "$here/lib/pki.sh"
# shellcheck source=lib/config.sh
. "$here/lib/config.sh"

need_root() { [ "$(id -u)" = 0 ] || die "needs root (network namespace, mounts, cgroups)"; }

# shellcheck source=lib/last-line.sh
. "$here/lib/last-line.sh"

resolve_bins() {
	BIN=$(last_line_of "$here/build.sh")
	K8S_BIN=$(last_line_of "$repo/interop/k8s/build.sh")
	RUNC=$(command -v runc) || die "runc not found: run interop/node/build.sh as root (it installs Debian's runc)"
}

# --- the supervisor: the unshare process started by up (its pid in $W/run/unshare.pid) and its
# only child, bash supervisor.sh, PID 1 of the node's PID namespace.
unshare_pid() {
	local p
	p=$(cat "$W/run/unshare.pid" 2>/dev/null) || return 1
	[ -n "$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = unshare ] || return 1
	# a zombie (up's own child, after a failed up) has ended its namespace already
	[ "$(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null)" != Z ] || return 1
	echo "$p"
}
supervisor_pid() {
	local u c
	u=$(unshare_pid) || return 1
	c=$(cat "/proc/$u/task/$u/children" 2>/dev/null) || return 1
	c=${c%% *}
	[ -n "$c" ] && echo "$c"
}
is_up() { unshare_pid >/dev/null; }

# node_pids: every host PID of the node: the supervisor's descendants (a process orphaned inside
# the node's PID namespace is re-parented to the supervisor, its PID 1; containers are the
# shims' children in PID namespaces of their own).
node_pids() {
	local u
	u=$(unshare_pid) || return 0
	ps -e -o pid=,ppid= | awk -v root="$u" '
		{ parent[$1] = $2 }
		END {
			for (p in parent) {
				for (q = parent[p]; q > 1; q = parent[q]) if (q == root) { print p; break }
			}
		}'
}

# kubectl_in_node ARGS: no request timeout of its own (it would cut logs -f, exec and attach
# streams); node.sh's own polls pass --request-timeout.
kubectl_in_node() {
	nsenter --net="/run/netns/$NETNS" -- "$K8S_BIN/kubectl" --kubeconfig "$ETC_K8S/admin.conf" "$@"
}

wait_until() { # wait_until SECONDS WHAT LOG CMD...: poll CMD until it succeeds, or fail naming WHAT
	local secs=$1 what=$2 logname=$3 deadline
	shift 3
	deadline=$(($(now_ms) + secs * 1000))
	until "$@" >/dev/null 2>&1; do
		if ! is_up; then
			say "the node stopped while waiting for $what"
			show_log supervisor
			return 1
		fi
		if [ "$(now_ms)" -ge "$deadline" ]; then
			say "timed out after $secs s waiting for $what"
			show_log "$logname"
			return 1
		fi
		sleep 0.2
	done
}

show_log() { # show_log NAME: the last lines of a log in $W/logs, or of the kube-apiserver container's
	local f=$W/logs/$1.log
	if [ "$1" = kube-apiserver ]; then
		f=$(find "$W/pod-logs" -path '*kube-apiserver*' -name '*.log' -printf '%T@ %p\n' 2>/dev/null | sort -n | tail -n 1)
		f=${f#* }
		[ -n "$f" ] || { echo "--- no kube-apiserver container log in $W/pod-logs (see $W/logs/kubelet.log) ---" >&2; return 0; }
	fi
	echo "--- last lines of $f ---" >&2
	tail -n 30 "$f" >&2 2>/dev/null || true
}

# node_ready_since MS: the node's Ready condition is True with a heartbeat at or after MS (a warm
# start finds the last run's Ready status still in etcd).
node_ready_since() {
	local out status beat
	out=$(kubectl_in_node --request-timeout=5s get node "$NODE_NAME" \
		-o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}') || return 1
	status=${out%% *}
	beat=${out#* }
	[ "$status" = True ] && [ $(($(date -d "$beat" +%s) * 1000)) -ge $(($1 / 1000 * 1000)) ]
}

# pod_ready_since NAMESPACE POD MS: Ready, with every container started at or after MS.
pod_ready_since() {
	local out ready started s
	out=$(kubectl_in_node --request-timeout=5s -n "$1" get pod "$2" \
		-o jsonpath='{.status.conditions[?(@.type=="Ready")].status}{" "}{.status.containerStatuses[*].state.running.startedAt}') || return 1
	ready=${out%% *}
	started=${out#* }
	[ "$ready" = True ] && [ -n "$started" ] || return 1
	for s in $started; do
		[ $(($(date -d "$s" +%s) * 1000)) -ge $(($3 / 1000 * 1000)) ] || return 1
	done
}

# --- up
APISERVER_FLAGS=()
APISERVER_MOUNTS=()
APISERVER_GRACE=
cmd_up() {
	local a
	for a in "$@"; do
		case $a in
		--apiserver-grace-period=*)
			APISERVER_GRACE=${a#--apiserver-grace-period=}
			[[ $APISERVER_GRACE =~ ^[0-9]+$ ]] || die "$a: want a whole number of seconds"
			;;
		--apiserver-flag=--*) APISERVER_FLAGS+=("${a#--apiserver-flag=}") ;;
		--apiserver-flag=*) die "$a: the flag must start with -- (--apiserver-flag=--name=value)" ;;
		--apiserver-mount=/*) APISERVER_MOUNTS+=("${a#--apiserver-mount=}") ;;
		--apiserver-mount=*) die "$a: want an absolute path in the node, PATH[:HOSTPATH_TYPE]" ;;
		*) die "up: unknown option $a (see the comment at the top of node.sh)" ;;
		esac
	done
	need_root
	for tool in ip nsenter unshare setsid openssl curl base64 nft; do
		command -v "$tool" >/dev/null || die "$tool not found (iproute2, util-linux, openssl, curl, nftables)"
	done
	is_up && die "already up (work dir $W): node.sh down first"
	# The node keeps its images and containers under $W: on a nearly full disk kubelet evicts
	# pods and removes images (imagefs.available 1 %), and the flows fail far from the cause.
	local parent used
	parent=$W
	while [ ! -d "$parent" ]; do parent=$(dirname "$parent"); done
	used=$(df --output=pcent "$parent" | tail -1 | tr -dc 0-9)
	if [ "${used:-0}" -ge "$MAX_DISK_USED_PERCENT" ]; then
		die "the disk holding $W is ${used}% full (at most $MAX_DISK_USED_PERCENT%): kubelet would evict the pods and remove the test images; free space, or set TETHER_NODE_DIR to a roomier disk"
	fi
	# One node per machine: the netns name, the host mount points and /kubepods are shared.
	local users
	if [ -e "/run/netns/$NETNS" ] && users=$(ip netns pids "$NETNS") && [ -n "$users" ]; then
		die "netns $NETNS is in use by pids $(echo "$users" | tr '\n' ' ')(another node up with another TETHER_NODE_DIR? node.sh down it first)"
	fi
	resolve_bins
	local images
	images=$(last_line_of "$here/images.sh")
	PAUSE_IMAGE=localhost/tether-test/pause:1
	APISERVER_IMAGE=localhost/tether-test/kube-apiserver:v1.37.2

	local t0 t_api t_node t_pod
	t0=$(now_ms)
	trap 'say "up failed: stopping the node (node.sh clean removes the rest)"; cmd_down || true' EXIT
	if [ -d "$W/etcd" ]; then say "warm start in $W"; else say "cold start in $W"; fi
	# root's own directory: under /tmp another user could have made it (or a link) first.
	[ -e "$W" ] || [ -L "$W" ] || mkdir -p "$W"
	if [ -L "$W" ] || [ ! -d "$W" ] || [ "$(stat -c %u "$W")" != 0 ]; then
		die "work dir $W is a link, not a directory, or not root's: remove it or set TETHER_NODE_DIR"
	fi
	chmod 0700 "$W"
	mkdir -p "$W"/{conf,run,containerd,etcd,kubelet,pod-logs}
	chmod 0700 "$W/etcd"
	rm -rf "$W/logs.prev"
	[ ! -d "$W/logs" ] || mv "$W/logs" "$W/logs.prev"
	mkdir -p "$W/logs"

	pki_ensure
	config_containerd
	config_cni
	config_kubelet
	config_kube_proxy
	config_apiserver_manifest

	local d
	for d in "${HOST_DIRS[@]}"; do
		if [ ! -e "$d" ]; then
			mkdir -p "$d"
			echo "$d" >>"$W/host-dirs"
			say "made the empty mount point $d on the host (clean removes it)"
		fi
	done

	if [ ! -e "/run/netns/$NETNS" ]; then
		ip netns add "$NETNS"
		ip -n "$NETNS" link set lo up
		ip -n "$NETNS" addr add "$NODE_IP/32" dev lo
		# Processes on the node's own network (kube-apiserver, hostNetwork pods) reach Service
		# IPs as on any node: kube-proxy's output hook rewrites them to a pod. A real node's
		# default route lets the first route lookup pass; this one has none, so the Service
		# range gets a route of its own (on lo: nothing is sent before the rewrite).
		ip -n "$NETNS" route add "$SERVICE_CIDR" dev lo
	fi

	{
		declare -p W ETC_K8S BIN K8S_BIN NODE_NAME NODE_IP SERVICE_CIDR STOP_SECONDS
		echo "APISERVER_SECONDS=$UP_SECONDS"
		echo "BOOT_IMAGES=($(printf '%q ' "$images/pause.tar" "$images/kube-apiserver.tar"))"
	} >"$W/conf/node.env"

	setsid nsenter --net="/run/netns/$NETNS" -- unshare --mount --propagation private --pid --fork \
		--mount-proc --kill-child=SIGKILL -- bash "$here/supervisor.sh" "$W/conf/node.env" \
		>"$W/logs/supervisor.log" 2>&1 </dev/null &
	echo $! >"$W/run/unshare.pid"
	local sup deadline=$(($(now_ms) + 10000))
	until sup=$(supervisor_pid); do
		[ "$(now_ms)" -lt "$deadline" ] || { show_log supervisor; die "the supervisor did not start"; }
		sleep 0.05
	done
	readlink "/proc/$sup/ns/pid" >"$W/run/pidns"
	say "supervisor running (host pid $sup), log $W/logs/supervisor.log"

	wait_until "$UP_SECONDS" "the supervisor's ready mark $W/run/ready (kube-apiserver /readyz)" supervisor \
		test -e "$W/run/ready" || { show_log kube-apiserver; return 1; }
	t_api=$(secs_since "$t0")
	wait_until "$UP_SECONDS" "node $NODE_NAME Ready with a fresh heartbeat" kubelet node_ready_since "$t0"
	t_node=$(secs_since "$t0")
	wait_until "$UP_SECONDS" "the kube-apiserver static Pod kube-system/kube-apiserver-$NODE_NAME Ready" kubelet \
		pod_ready_since kube-system "kube-apiserver-$NODE_NAME" "$t0"
	t_pod=$(secs_since "$t0")
	trap - EXIT
	echo "apiserver=$t_api node=$t_node apiserver_pod=$t_pod" >"$W/run/timings"
	say "up: kube-apiserver ready $t_api s, node Ready $t_node s, kube-apiserver Pod Ready $t_pod s"
}

# --- down: TERM to the supervisor, KILL to unshare after the deadline (--kill-child then ends the
# PID namespace). When unshare has reaped the supervisor, nothing of the node is left: the kernel
# kills every process of a PID namespace, nested ones included, before its init can be reaped.
cmd_down() {
	local u sup deadline
	if u=$(unshare_pid); then
		if sup=$(supervisor_pid); then kill -TERM "$sup" 2>/dev/null || true; fi
		deadline=$(($(now_ms) + (STOP_SECONDS + 10) * 1000))
		while unshare_pid >/dev/null && [ "$(now_ms)" -lt "$deadline" ]; do sleep 0.1; done
		if unshare_pid >/dev/null; then
			say "the supervisor did not stop in $((STOP_SECONDS + 10)) s: KILL"
			kill -KILL "$u" 2>/dev/null || true
			deadline=$(($(now_ms) + 10000))
			while unshare_pid >/dev/null && [ "$(now_ms)" -lt "$deadline" ]; do sleep 0.1; done
		fi
	fi
	if u=$(unshare_pid); then
		say "unshare (pid $u) still running: processes of the node may be left"
		return 1
	fi
	rm -f "$W/run/unshare.pid" "$W/run/ready"
	say "down"
}

# --- clean: down, then everything up made.
cmd_clean() {
	need_root
	cmd_down
	local h d made=() users
	if [ -e "/run/netns/$NETNS" ] && users=$(ip netns pids "$NETNS") && [ -n "$users" ]; then
		die "netns $NETNS is still used by pids $(echo "$users" | tr '\n' ' ')(another node, with another TETHER_NODE_DIR?): not cleaning"
	fi
	# The pods' cgroups (cgroupfs driver, cgroupRoot /): /kubepods in every hierarchy, deepest first.
	for h in /sys/fs/cgroup/*/; do
		[ -d "$h/kubepods" ] || continue
		find "$h/kubepods" -depth -type d -exec rmdir {} + 2>/dev/null || true
		[ ! -d "$h/kubepods" ] || say "could not remove ${h}kubepods (a process still in it?)"
	done
	# cni0, the veths and kube-proxy's nftables tables go with the namespace.
	if [ -e "/run/netns/$NETNS" ]; then ip netns del "$NETNS"; fi
	if [ -d "$W" ]; then
		# The node's mounts live in its own mount namespace; one seen here is a leak, and rm -rf
		# must not run through it.
		if grep -q " ${W%/}/" /proc/self/mountinfo; then
			die "mounts under $W on the host (see /proc/self/mountinfo); unmount them first"
		fi
		[ ! -f "$W/host-dirs" ] || mapfile -t made <"$W/host-dirs"
		rm -rf "$W"
	fi
	for d in "${made[@]}"; do
		rmdir "$d" 2>/dev/null || say "left $d on the host: not empty"
	done
	say "clean: no process, netns, cgroup, work dir or host dir of the node left"
}

cmd_status() {
	local u sup p rss total=0
	echo "work dir        $W"
	echo "/etc/kubernetes $ETC_K8S  (pki/, manifests/, admin.conf, ...)"
	echo "admin.conf      $ETC_K8S/admin.conf  (server $APISERVER_URL, reachable in netns $NETNS)"
	echo "manifests       $ETC_K8S/manifests  (the kubelet's staticPodPath, /etc/kubernetes/manifests in the node)"
	echo "pki             $ETC_K8S/pki"
	echo "logs            $W/logs  (one file per component; supervisor.log)"
	echo "containerd      $W/containerd/containerd.sock  (ctr -n k8s.io)"
	echo "netns           $NETNS  (node $NODE_NAME, IP $NODE_IP, pods $POD_CIDR, Services $SERVICE_CIDR)"
	if ! u=$(unshare_pid); then
		echo "state           down"
		return 0
	fi
	sup=$(supervisor_pid) || true
	echo "state           up (supervisor host pid ${sup:-?}$([ -e "$W/run/ready" ] && echo ", ready"))"
	[ ! -f "$W/run/timings" ] || echo "last up         $(cat "$W/run/timings") (seconds)"
	for p in $(node_pids | sort -n); do
		rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null) || continue
		[ -n "$rss" ] || continue
		total=$((total + rss))
		printf '  %7s %6d MiB  %s\n' "$p" $((rss / 1024)) "$(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-100)"
	done
	echo "RSS total       $((total / 1024)) MiB"
}

case ${1:-} in
up) shift; cmd_up "$@" ;;
down) shift; need_root; cmd_down ;;
clean) shift; cmd_clean ;;
kubectl)
	shift
	is_up || die "the node is down (node.sh up)"
	# shellcheck source=/dev/null
	. "$W/conf/node.env"
	kubectl_in_node "$@"
	;;
run)
	shift
	[ $# -gt 0 ] || die "run: give a command"
	is_up || die "the node is down (node.sh up)"
	# shellcheck source=/dev/null
	. "$W/conf/node.env"
	KUBECONFIG=$ETC_K8S/admin.conf PATH=$K8S_BIN:$PATH nsenter --net="/run/netns/$NETNS" -- "$@"
	;;
import)
	shift
	[ $# -gt 0 ] || die "import: give OCI image tarballs"
	is_up || die "the node is down (node.sh up)"
	# shellcheck source=/dev/null
	. "$W/conf/node.env"
	for f in "$@"; do
		"$BIN/ctr" --address "$W/containerd/containerd.sock" -n k8s.io images import --snapshotter overlayfs "$f"
	done
	;;
status) cmd_status ;;
*) die "usage: node.sh up|down|clean|kubectl ARGS|run CMD|import TAR...|status (see the comment at the top)" ;;
esac
