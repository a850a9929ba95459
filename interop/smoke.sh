#!/usr/bin/env bash
# Loopback smoke test of the Go harness against upstream Konnectivity:
# upstream proxy-server (gRPC frontend on a UDS) + upstream proxy-agent (mTLS),
# a local echo/HTTP target, and konnectivity-dial in every mode.
# Everything binds 127.0.0.1 only; every process started here is killed on exit.
#
# Env overrides: SERVER_BIN / AGENT_BIN (e.g. tether's binaries), BASE_PORT (default 18090).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
./build.sh >/dev/null

BIN=$PWD/bin
SERVER_BIN=${SERVER_BIN:-$BIN/proxy-server}
AGENT_BIN=${AGENT_BIN:-$BIN/proxy-agent}
P=${BASE_PORT:-18090}
AGENT_PORT=$((P + 1)) S_HEALTH=$((P + 2)) A_HEALTH=$((P + 3)) A_ADMIN=$((P + 4)) S_ADMIN=$((P + 5))
ECHO_PORT=$((P + 10)) HTTP_PORT=$((P + 11)) REFUSED_PORT=$((P + 909))

WORK=$(mktemp -d /tmp/tether-interop.XXXXXX)
UDS=$WORK/konnectivity.sock
pids=()
cleanup() {
	# Two SIGTERMs: the agent's first one only starts a drain (upstream behaviour).
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	sleep 0.3
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do
		for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$pid" 2>/dev/null || true
	done
	[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT

# wait_http URL SECONDS: poll until URL answers 200.
wait_http() {
	for _ in $(seq $(($2 * 10))); do
		curl -fsS -o /dev/null --max-time 1 "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	echo "smoke: timed out waiting for $1" >&2
	return 1
}

"$BIN/gen-pki" --dir "$WORK/pki" >/dev/null

"$BIN/test-target" --echo 127.0.0.1:$ECHO_PORT --http 127.0.0.1:$HTTP_PORT 2>"$WORK/target.log" &
pids+=($!)

"$SERVER_BIN" --mode=grpc --uds-name="$UDS" --server-port=0 \
	--agent-bind-address=127.0.0.1 --agent-port=$AGENT_PORT \
	--health-bind-address=127.0.0.1 --health-port=$S_HEALTH \
	--admin-bind-address=127.0.0.1 --admin-port=$S_ADMIN \
	--cluster-cert="$WORK/pki/server.crt" --cluster-key="$WORK/pki/server.key" \
	--cluster-ca-cert="$WORK/pki/ca.crt" --server-count=1 -v=2 2>"$WORK/server.log" &
pids+=($!)
wait_http http://127.0.0.1:$S_HEALTH/healthz 20

"$AGENT_BIN" --proxy-server-host=127.0.0.1 --proxy-server-port=$AGENT_PORT \
	--ca-cert="$WORK/pki/ca.crt" --agent-cert="$WORK/pki/agent.crt" --agent-key="$WORK/pki/agent.key" \
	--health-server-host=127.0.0.1 --health-server-port=$A_HEALTH \
	--admin-bind-address=127.0.0.1 --admin-server-port=$A_ADMIN \
	--agent-id=smoke-agent -v=2 2>"$WORK/agent.log" &
pids+=($!)
wait_http http://127.0.0.1:$A_HEALTH/readyz 20   # agent connected to a server
wait_http http://127.0.0.1:$S_HEALTH/readyz 20   # server has an agent

fail=0
run() { # run NAME ARGS...: konnectivity-dial, print its JSON, count failures
	local name=$1; shift
	local out rc=0
	out=$("$BIN/konnectivity-dial" --uds "$UDS" --timeout 30s "$@") || rc=$?
	printf '%-22s rc=%d %s\n' "$name" "$rc" "$out"
	[ $rc -eq 0 ] || fail=$((fail + 1))
}
run echo-1MiB        --mode echo --address 127.0.0.1:$ECHO_PORT --bytes $((1 << 20))
run echo-64MiB       --mode echo --address 127.0.0.1:$ECHO_PORT --bytes $((64 << 20))
run echo-odd-chunks  --mode echo --address 127.0.0.1:$ECHO_PORT --bytes 1000003 --chunk 777
run get-root         --mode get  --address 127.0.0.1:$HTTP_PORT --path /
run get-10MiB        --mode get  --address 127.0.0.1:$HTTP_PORT --path /bytes/$((10 << 20))
run dial-refused     --mode expect-dial-error --expect-reason endpoint --address 127.0.0.1:$REFUSED_PORT

echo "server metrics:"
curl -fsS --max-time 5 http://127.0.0.1:$S_HEALTH/metrics |
	grep -E '^konnectivity_network_proxy_server_(dial_failure_count|established_connections|ready_backend_connections|pending_backend_dials)[ {]' | sed 's/^/  /' || true
echo "agent metrics:"
curl -fsS --max-time 5 http://127.0.0.1:$A_HEALTH/metrics |
	grep -E '^konnectivity_network_proxy_agent_(open_server_connections|open_endpoint_connections|endpoint_dial_failure_total)[ {]' | sed 's/^/  /' || true

if [ $fail -ne 0 ]; then
	echo "smoke: $fail check(s) failed; logs in $WORK (kept)" >&2
	KEEP_WORK=1
	exit 1
fi
echo "smoke: all checks passed"
