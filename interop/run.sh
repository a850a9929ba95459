#!/usr/bin/env bash
# tether's interop matrix against real Konnectivity peers (see COMPATIBILITY.md):
#   1. the Go konnectivity-client (newest tag and Kubernetes 1.35's) -> tether server
#   2. kube-apiserver's egress selector dialer (HTTPConnect/UDS, HTTPConnect/TCP+mTLS, GRPC/UDS)
#   3. upstream proxy-agent -> tether server, tether agent -> upstream proxy-server, with drain
#   4. upstream's integration suite with tether's agent (-agent-path)
#   5. the TLS key exchange group Go 1.26 negotiates with each tether endpoint (X25519MLKEM768)
# Builds what it needs (tether with cargo, the Go side with build.sh; Go modules are fetched by
# go), runs every cell on 127.0.0.1 and Unix sockets in a temp dir, and rewrites the generated
# block of COMPATIBILITY.md from what ran. Exits non-zero when a cell fails, and, with CI set
# (or --check), when the committed COMPATIBILITY.md differs from what ran.
#
#   interop/run.sh [--check] [--only 1,2,3,4,5,6]     (--only runs some sections, writes nothing)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
started=$SECONDS

check=${CI:+1}
only=
while [ $# -gt 0 ]; do
	case $1 in
	--check) check=1 ;;
	--only) only=$2; shift ;;
	*) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done

echo "run.sh: building tether (scripts/build-debug.sh)"
"$root/scripts/build-debug.sh"
tether_bin=${CARGO_TARGET_DIR:-$root/target}/debug/tether
case $tether_bin in /*) ;; *) tether_bin=$root/$tether_bin ;; esac
test -x "$tether_bin" || { echo "run.sh: $tether_bin missing after cargo build" >&2; exit 1; }
echo "run.sh: building the Go side (interop/build.sh)"
interop/build.sh

upstream_version=$(cd interop && go list -m -f '{{.Version}}' sigs.k8s.io/apiserver-network-proxy)
upstream_dir=$(cd interop && go list -m -f '{{.Dir}}' sigs.k8s.io/apiserver-network-proxy)

work=$(mktemp -d /tmp/tether-interop.XXXXXX)
matrix_pid=
cleanup() {
	rc=$?
	if [ -n "$matrix_pid" ] && kill -0 "$matrix_pid" 2>/dev/null; then
		# The matrix and every process it started share one process group (setsid below).
		kill -TERM -- "-$matrix_pid" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$matrix_pid" 2>/dev/null || break; sleep 0.1; done
	fi
	[ -n "$matrix_pid" ] && kill -KILL -- "-$matrix_pid" 2>/dev/null || true
	if [ $rc -ne 0 ] && [ -d "$work/logs" ]; then
		echo "run.sh: logs kept in $work/logs" >&2
	else
		rm -rf "$work"
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

args=(-bin "$root/interop/bin" -tether "$tether_bin"
	-upstream-tests "$root/interop/bin/upstream-tests.test" -upstream-tests-src "$upstream_dir/tests"
	-upstream-version "$upstream_version" -work "$work" -out "$root/COMPATIBILITY.md")
[ -n "$only" ] && args+=(-only "$only")

# Bounded: the matrix stops itself well before this; the timeout is a backstop.
setsid timeout -s KILL 25m "$root/interop/bin/interop-matrix" "${args[@]}" </dev/null &
matrix_pid=$!
rc=0
wait "$matrix_pid" || rc=$?
matrix_pid_done=$matrix_pid
# The group may still hold stragglers if the matrix was killed: end them.
kill -KILL -- "-$matrix_pid_done" 2>/dev/null || true
matrix_pid=
if [ $rc -ne 0 ]; then
	echo "run.sh: interop matrix failed (exit $rc)" >&2
	exit $rc
fi

if [ -n "$check" ] && [ -z "$only" ] && git rev-parse --git-dir >/dev/null 2>&1; then
	if ! git diff --exit-code -- COMPATIBILITY.md; then
		echo "run.sh: COMPATIBILITY.md differs from what ran (diff above): commit the regenerated file" >&2
		exit 1
	fi
fi
echo "run.sh: interop matrix passed in $((SECONDS - started)) s"
