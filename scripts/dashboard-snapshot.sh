#!/usr/bin/env bash
# Draws deploy/observability/tether-dashboard.json fed by a live quickstart, without Grafana:
# starts `tether quickstart` (loopback only), a real Prometheus scraping its two servers and
# two agents every second, drives a bounded mix of traffic through both frontends, then runs
# every panel's own queries (read from the dashboard JSON) against Prometheus's range API and
# draws them as SVG (`tether-bench dashboard`). Stops everything it started.
#
#   scripts/dashboard-snapshot.sh [OUT.svg]     default docs/src/images/dashboard.svg (the book shows it)
#
# Needs Go (Prometheus is built at promtool's pinned version by interop/build-promtool.sh,
# cached under ~/.cache/tether/tools), python3 (the bulk-transfer destination) and curl.
# About two minutes, most of it the traffic.
set -euo pipefail
# Each background job in its own process group, so that stopping one stops its children.
set -m
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(realpath -m "${1:-$repo/docs/src/images/dashboard.svg}")"
cd "$repo"

say() { echo "dashboard-snapshot: $*" >&2; }

export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
scripts/build-debug.sh -q
tether="$repo/target/debug/tether"
bench="$repo/target/debug/tether-bench"
prometheus="$(interop/build-promtool.sh prometheus)"
prometheus_version="$(basename "$(dirname "$prometheus")")"
prometheus_version="${prometheus_version#promtool-}"

work="$(mktemp -d /tmp/tether-dashboard.XXXXXX)"
cleanup() {
	# Every job still running (each its own process group: the quickstart, Prometheus, the
	# destination, the traffic), asked to stop, then killed after 5 s.
	local running pid
	mapfile -t running < <(jobs -p)
	for pid in "${running[@]}"; do kill -INT -- "-$pid" 2>/dev/null || true; done
	for pid in "${running[@]}"; do
		for _ in $(seq 50); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL -- "-$pid" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT

# Waits (at most $2 tenths of a second) until command $1 succeeds.
wait_for() {
	local what="$1" tenths="$2"
	for _ in $(seq "$tenths"); do
		if eval "$what" >/dev/null 2>&1; then return 0; fi
		sleep 0.1
	done
	say "gave up waiting for: $what"
	return 1
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# 1. The quickstart: two servers (gRPC on a Unix socket, HTTP CONNECT over mTLS), two agents.
"$tether" quickstart --dir "$work/qs" >"$work/quickstart.out" 2>"$work/quickstart.err" &
wait_for "grep -q 'Serving until Ctrl-C' '$work/quickstart.out'" 600
backend="$(sed -n 's|^  demo backend *http://\([^/]*\)/.*|\1|p' "$work/quickstart.out")"
sock="$(sed -n 's|^  gRPC frontend *unix:\([^ ]*\).*|\1|p' "$work/quickstart.out")"
connect="$(sed -n 's|^  HTTP CONNECT (mTLS) *https://\([^ ]*\).*|\1|p' "$work/quickstart.out")"
mapfile -t metrics < <(sed -n 's|.*curl http://\([^/]*\)/metrics   (server metrics; agent: http://\([^/]*\)/metrics)|\1 \2|p' "$work/quickstart.out")
if [[ -z "$backend" || -z "$sock" || -z "$connect" || ${#metrics[@]} -ne 2 ]]; then
	say "could not read the quickstart's addresses:"; cat "$work/quickstart.out" >&2; exit 1
fi
read -r grpc_server grpc_agent <<<"${metrics[0]}"
read -r connect_server connect_agent <<<"${metrics[1]}"

# 2. Prometheus on loopback, scraping all four every second; `instance` names each process.
prom_port="$(free_port)"
cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: tether
    static_configs:
      - targets: ['$grpc_server']
        labels: {instance: 'server quickstart-grpc'}
      - targets: ['$grpc_agent']
        labels: {instance: 'agent quickstart-agent-grpc'}
      - targets: ['$connect_server']
        labels: {instance: 'server quickstart-http-connect'}
      - targets: ['$connect_agent']
        labels: {instance: 'agent quickstart-agent-http-connect'}
EOF
"$prometheus" --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
	--web.listen-address="127.0.0.1:$prom_port" --log.level=warn 2>"$work/prometheus.err" &
api="http://127.0.0.1:$prom_port/api/v1"
wait_for "curl -sf '$api/query?query=count(up==1)' | grep -q '\"4\"'" 300
start="$(date +%s)"
say "Prometheus $prometheus_version on 127.0.0.1:$prom_port scrapes 4 targets; traffic for about 60 s"

# 3. Traffic, every part bounded in count and time.
mkdir "$work/www"
truncate -s 256M "$work/www/blob"
www_port="$(free_port)"
python3 -m http.server --bind 127.0.0.1 --directory "$work/www" "$www_port" >/dev/null 2>&1 &
wait_for "curl -sf -o /dev/null -I http://127.0.0.1:$www_port/blob" 100
pki="$work/qs"
via_connect=(--mode http-connect --proxy-server "$connect" --ca-cert "$pki/ca.crt" --cert "$pki/client.crt" --key "$pki/client.key")
get_demo='GET / HTTP/1.1\r\nHost: demo\r\nConnection: close\r\n\r\n'

# Short dials through both frontends, about 4 a second for 50 s, a burst in the middle.
dials() {
	for i in $(seq 200); do
		if ((i % 2)); then
			printf "$get_demo" | timeout 10 "$tether" dial --uds "$sock" "$backend" >/dev/null || true
		else
			timeout 10 curl -sS -o /dev/null -p --proxy "https://$connect" --proxy-cacert "$pki/ca.crt" \
				--proxy-cert "$pki/client.crt" --proxy-key "$pki/client.key" "http://$backend/" || true
		fi
		if ((i > 90 && i < 130)); then sleep 0.05; else sleep 0.25; fi
	done
}
# Dials that fail: nothing listens on port 1 (the agent's connect is refused).
failing() {
	for _ in $(seq 12); do
		timeout 10 "$tether" dial --uds "$sock" 127.0.0.1:1 </dev/null >/dev/null 2>&1 || true
		timeout 10 "$tether" dial "${via_connect[@]}" 127.0.0.1:1 </dev/null >/dev/null 2>&1 || true
		sleep 3
	done
}
# Connections held open for a while (the open-connections panel).
held() {
	set +m # these stay in this job's process group
	for _ in $(seq 6); do
		sleep 25 | timeout 30 "$tether" dial --uds "$sock" "$backend" >/dev/null 2>&1 &
		sleep 2
	done
	wait
}
# Bulk downloads of 256 MiB, one per frontend, and one into a slow reader whose bytes queue
# at the server (the queued-bytes panel).
get_blob='GET /blob HTTP/1.0\r\n\r\n'
bulk() {
	sleep 8
	printf "$get_blob" | timeout 60 "$tether" dial --uds "$sock" "127.0.0.1:$www_port" >/dev/null || true
	sleep 5
	printf "$get_blob" | timeout 60 "$tether" dial "${via_connect[@]}" "127.0.0.1:$www_port" >/dev/null || true
	sleep 5
	printf "$get_blob" | timeout 60 "$tether" dial --uds "$sock" "127.0.0.1:$www_port" |
		timeout 60 python3 -c 'import sys, time
while sys.stdin.buffer.read(1 << 20):
    time.sleep(0.05)' || true
}
traffic=()
for part in dials failing held bulk; do
	"$part" &
	traffic+=($!)
	done
for pid in "${traffic[@]}"; do wait "$pid" || true; done
sleep 5
end="$(date +%s)"

# 4. The dashboard's own queries over that range, drawn.
mkdir -p "$(dirname "$out")"
"$bench" dashboard --dashboard deploy/observability/tether-dashboard.json \
	--prometheus "127.0.0.1:$prom_port" --start "$start" --end "$end" --step 1 --scrape-interval 1 \
	--subtitle "A live tether quickstart (2 servers, 2 agents) scraped every 1 s by Prometheus $prometheus_version; $(date -u -d "@$start" '+%Y-%m-%d %H:%M:%S')–$(date -u -d "@$end" '+%H:%M:%S') UTC; drawn by scripts/dashboard-snapshot.sh" \
	--svg "$out"
