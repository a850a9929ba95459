#!/usr/bin/env bash
# kubectl 1.37.2 -> a real kube-apiserver 1.37.2 (etcd 3.7.3) -> egress selector -> proxy server
# -> agent -> kwok fake kubelets, with tether and, as the reference, upstream v0.36.0, in each
# egress shape (gRPC/UDS, HTTP CONNECT/UDS, HTTP CONNECT/mTLS TCP) and each agent
# authentication (mTLS, ServiceAccount token); in a network namespace also nodes/, pods/ and
# services/proxy, an admission webhook (and its agent gone) and an aggregated API
# (k8s.io/sample-apiserver); then the agent is killed under open streams (upstream #748). See
# COMPATIBILITY.md, "A real control plane".
# Builds what it needs (tether with cargo; the Kubernetes binaries with interop/k8s/build.sh
# into a cache outside the repo; interop/build.sh for upstream's binaries, gen-pki and
# test-target), runs everything on loopback and Unix sockets in a temp dir, and rewrites the
# k8s-flows block of COMPATIBILITY.md. Exits non-zero when a check fails, and, with CI set (or
# --check), when the committed COMPATIBILITY.md differs from what ran.
#
#   interop/k8s/run.sh [--check] [--only tether|upstream]     (--only writes nothing)
#   SKIP_GO_BUILD=1: reuse interop/bin as it is (after interop/build.sh has run)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
started=$SECONDS

check=${CI:+1}
only=
while [ $# -gt 0 ]; do
	case $1 in
	--check) check=1 ;;
	--only) only=$2; shift ;;
	*) echo "k8s/run.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done
command -v setsid >/dev/null && command -v pkill >/dev/null || { echo "k8s/run.sh: needs setsid and pkill (util-linux, procps)" >&2; exit 1; }

echo "k8s/run.sh: building tether (scripts/build-debug.sh)"
"$root/scripts/build-debug.sh"
tether_bin=${CARGO_TARGET_DIR:-$root/target}/debug/tether
case $tether_bin in /*) ;; *) tether_bin=$root/$tether_bin ;; esac
test -x "$tether_bin" || { echo "k8s/run.sh: $tether_bin missing after cargo build" >&2; exit 1; }
if [ -z "${SKIP_GO_BUILD:-}" ]; then
	echo "k8s/run.sh: building the Go side (interop/build.sh)"
	interop/build.sh
fi
t0=$SECONDS
# Not `tee /dev/stderr`: reopening /dev/stderr truncates it when it is a log file.
k8s_build_out=$(interop/k8s/build.sh)
printf '%s\n' "$k8s_build_out" >&2
k8s_bin=$(printf '%s\n' "$k8s_build_out" | tail -n 1)
echo "k8s/run.sh: Kubernetes binaries in $k8s_bin ($((SECONDS - t0)) s)"
t0=$SECONDS
sample_build_out=$(interop/k8s/build.sh --sample-apiserver)
printf '%s\n' "$sample_build_out" >&2
sample_apiserver=$(printf '%s\n' "$sample_build_out" | tail -n 1)/sample-apiserver
test -x "$sample_apiserver" || { echo "k8s/run.sh: $sample_apiserver missing" >&2; exit 1; }
echo "k8s/run.sh: sample-apiserver at $sample_apiserver ($((SECONDS - t0)) s)"
(cd interop && go build -buildvcs=false -o bin/k8s-flows ./cmd/k8s-flows)
# kwok's node and pod lifecycle Stages come from its module (downloaded if the cache was warm
# but the module cache is not).
kwok_stages=$(cd interop/k8s/kwok && go mod download sigs.k8s.io/kwok && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage
test -d "$kwok_stages" || { echo "k8s/run.sh: kwok stages not found at $kwok_stages" >&2; exit 1; }
upstream_version=$(cd interop && go list -m -f '{{.Version}}' sigs.k8s.io/apiserver-network-proxy)

work=$(mktemp -d /tmp/tether-k8s.XXXXXX)
netns=
flows_pid=
stop_flows() {
	[ -n "$flows_pid" ] || return 0
	# k8s-flows started every process in its own session (setsid below): end the session.
	kill -TERM "$flows_pid" 2>/dev/null || true
	for _ in $(seq 100); do kill -0 "$flows_pid" 2>/dev/null || break; sleep 0.1; done
	pkill -KILL -s "$flows_pid" 2>/dev/null || true
	flows_pid=
}
cleanup() {
	rc=$?
	stop_flows
	[ -n "$netns" ] && ip netns del "$netns" 2>/dev/null || true
	if [ $rc -ne 0 ] && [ -d "$work/logs" ]; then
		echo "k8s/run.sh: logs kept in $work/logs" >&2
	else
		rm -rf "$work"
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The flows kube-apiserver refuses for loopback addresses (nodes/, pods/ and services/proxy, a
# Service-referenced webhook) need non-loopback ones: a network namespace of our own holding
# 198.18.0.0/15 (benchmarking) addresses and no route out, so nothing can leave it. A dummy
# interface where the kernel has the module, else the namespace's own lo (containers often lack
# it). Needs root; skipped otherwise (the block then says so, and a CI check fails).
netns_exec=()
outside=()
setup_netns() {
	[ "$(id -u)" = 0 ] && command -v ip >/dev/null || { echo "k8s/run.sh: not root or no ip(8): non-loopback flows not run" >&2; return 0; }
	local ns="tether-k8s-$$"
	ip netns add "$ns" || { echo "k8s/run.sh: ip netns add failed: non-loopback flows not run" >&2; return 0; }
	netns=$ns
	ip -n "$ns" link set lo up
	local dev=lo
	if ip -n "$ns" link add tether0 type dummy 2>/dev/null; then
		ip -n "$ns" link set tether0 up
		dev=tether0
	fi
	ip -n "$ns" addr add 198.18.0.3/32 dev "$dev"
	# node-c's pod CIDR (kwok --cidr): each address local, as the backend listens on all of them.
	local i
	for i in $(seq 8 15); do ip -n "$ns" addr add "198.18.0.$i/32" dev "$dev"; done
	echo "k8s/run.sh: network namespace $ns: 198.18.0.3 and 198.18.0.8/29 on $dev; routes: $(ip -n "$ns" route show | tr '\n' ';')"
	netns_exec=(ip netns exec "$ns")
	outside=(-outside 198.18.0.3,198.18.0.8/29)
}
setup_netns

args=(-k8s-bin "$k8s_bin" -interop-bin "$root/interop/bin" -tether "$tether_bin" -kwok-stages "$kwok_stages"
	-upstream-version "$upstream_version" -sample-apiserver "$sample_apiserver" -work "$work" -out "$root/COMPATIBILITY.md" -timeout 12m)
[ -n "$only" ] && args+=(-only "$only")

# Bounded: k8s-flows stops itself at -timeout; the timeout here is a backstop.
setsid timeout -s KILL 15m "${netns_exec[@]}" "$root/interop/bin/k8s-flows" "${args[@]}" "${outside[@]}" </dev/null &
flows_pid=$!
rc=0
wait "$flows_pid" || rc=$?
stop_flows
if [ $rc -ne 0 ]; then
	echo "k8s/run.sh: Kubernetes flows failed (exit $rc)" >&2
	exit $rc
fi

if [ -n "$check" ] && [ -z "$only" ] && git rev-parse --git-dir >/dev/null 2>&1; then
	if ! git diff --exit-code -- COMPATIBILITY.md; then
		echo "k8s/run.sh: COMPATIBILITY.md differs from what ran (diff above): commit the regenerated file" >&2
		exit 1
	fi
fi
echo "k8s/run.sh: Kubernetes flows passed in $((SECONDS - started)) s"
