#!/usr/bin/env bash
# Every check tether has, in the order CI runs them. Needs Rust (rustup) and Go >= 1.26 with
# the Go module proxy, and root: it installs tinyproxy, stunnel4, haproxy, nginx-light,
# iproute2, runc, nftables and gcc with apt-get, and the real node (interop/node) needs a
# network namespace, mounts and cgroups; everything else is fetched by cargo and go themselves.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Each step's time, printed at the end (and on a failure, up to it), so a slow CI run says
# where its time went.
started=$SECONDS
step_name=
step_started=$SECONDS
timings=()
finish_step() {
	if [ -n "$step_name" ]; then
		timings+=("$(printf '%6d s  %s' $((SECONDS - step_started)) "${step_name%%:*}")")
	fi
	step_name=
}
print_timings() {
	finish_step
	printf '\n== time by step\n'
	printf '%s\n' "${timings[@]}"
}
trap print_timings EXIT
step() {
	finish_step
	step_name=$*
	step_started=$SECONDS
	printf '\n== %s\n' "$*"
}

step "toolchain"
command -v cargo >/dev/null || { echo "cargo not found: install Rust with rustup" >&2; exit 1; }
command -v go >/dev/null || { echo "go not found: install Go >= 1.26" >&2; exit 1; }
if command -v rustup >/dev/null; then
	components=$(rustup component list --installed 2>/dev/null || true)
	grep -q '^rustfmt' <<<"$components" || rustup component add rustfmt
	grep -q '^clippy' <<<"$components" || rustup component add clippy
fi
cargo --version
go version

step "Debian packages: tinyproxy and stunnel4 (egress-proxy tests), haproxy and nginx-light (L7 proxies for the WebSocket link), iproute2 (network namespaces), runc, nftables and gcc (the real node)"
# crates/tether/tests/egress_proxy starts tinyproxy and stunnel4, and haproxy and nginx in
# front of the server (the WebSocket link), on loopback with its own configuration (without
# them those tests skip); tests that need a node address make a network namespace of their
# own with ip; the real node runs pods with runc, kube-proxy programs nftables
# and the pause image is a static C program. Installed once (CI runs as root on a fresh machine).
if command -v tinyproxy >/dev/null && command -v stunnel4 >/dev/null && command -v ip >/dev/null &&
	command -v runc >/dev/null && command -v nft >/dev/null && command -v gcc >/dev/null &&
	command -v haproxy >/dev/null && command -v nginx >/dev/null; then
	echo "tinyproxy, stunnel4, haproxy, nginx, ip, runc, nft and gcc are installed"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends tinyproxy stunnel4 iproute2 \
		runc nftables gcc libc6-dev haproxy nginx-light
	# The packages' own services (ports 8888 and 80) are not wanted where systemd would start them.
	for service in tinyproxy haproxy nginx; do
		if command -v systemctl >/dev/null && systemctl is-active --quiet "$service" 2>/dev/null; then
			systemctl disable --now "$service" || true
		fi
	done
else
	echo "tinyproxy, stunnel4, haproxy, nginx, ip, runc, nft or gcc missing and apt-get needs root: the egress-proxy tests will skip and the real node will fail" >&2
fi

step "Go peers for interop tests (upstream Konnectivity v0.36.0 from the Go module proxy)"
interop/build.sh

step "pinned tools: Kubernetes binaries, the real node's, promtool and helm (cached under ~/.cache/tether; cold 22 min on 2 cores, 2026-12-06)"
interop/k8s/build.sh
interop/k8s/build.sh --sample-apiserver
interop/node/build.sh
interop/build-promtool.sh
deploy/tests/build-helm.sh

step "format"
cargo fmt --all -- --check

step "lint"
cargo clippy --workspace --all-targets --locked -- -D warnings
python3 scripts/module-cycles.py crates/*/src

step "tests"
cargo test --workspace --locked --no-fail-fast

step "the end-to-end suites again, their agents on the gRPC link (tether's default is the native link)"
# Every feature is tested over both agent links: the run above uses the native one.
# --workspace, as above, so that cargo reuses that build (a `-p` selection resolves other
# features and compiles much of the tree again); `--test resume` also names tether-session's
# sans-IO resume tests, which no link touches (3 s).
TETHER_TEST_AGENT_LINK=grpc cargo test --workspace --locked --no-fail-fast \
	--test e2e --test resume --test resume_window --test churn --test token_auth

step "the end-to-end suites again, their agents on the WebSocket link (the native link in WebSocket messages)"
TETHER_TEST_AGENT_LINK=websocket cargo test --workspace --locked --no-fail-fast --test e2e --test resume --test token_auth

step "fuzz campaign: each of the 9 targets for 20 s on nightly (cargo-fuzz, installed if missing); a crash fails the build and is saved under fuzz/regressions"
# The stable tests above only replay the saved inputs; this explores. The corpus and the
# sanitizer builds are kept under ${TETHER_CACHE_DIR:-~/.cache/tether}/fuzz, so each run goes
# on from the last.
fuzz_cache=${TETHER_CACHE_DIR:-$HOME/.cache/tether}/fuzz
FUZZ_CORPUS="$fuzz_cache/corpus" FUZZ_TARGET_DIR="$fuzz_cache/target" fuzz/run.sh "${TETHER_FUZZ_SECONDS:-20}"

step "the book (docs/): a pinned mdbook builds it, its internal links and anchors are checked"
# mdbook is installed once into ~/.cache/tether (cold: 123 crates compiled, 28 min measured on
# 2 cores busy with other builds; warm: nothing); the generated reference pages (flags,
# metrics) were compared with the code by the tests above.
scripts/check-book.sh

step "interop matrix (real Go client, kube-apiserver's dialer, upstream server/agent and suite; COMPATIBILITY.md)"
interop/run.sh

step "Kubernetes flows (kubectl/kube-apiserver 1.37.2, etcd 3.7.3, kwok 0.8.0 through tether and upstream; COMPATIBILITY.md)"
# The Kubernetes binaries are cached outside the repo (interop/k8s/build.sh): a cold build is
# about 12 min on 2 cores, a warm run about 2.5 min. interop/build.sh already ran above.
SKIP_GO_BUILD=1 interop/k8s/run.sh

step "the image: deploy/image/mkimage's tests (layout, reproducibility, multi-architecture index)"
(cd deploy/image/mkimage && go test -count=1 ./...)

step "a real node (kubelet, containerd, runc, CNI): the chart and images installed as documented, flows through tether and upstream, the migration runbook (COMPATIBILITY.md)"
# Builds tether's image with deploy/image/build.sh (a static release build: cached in cargo's
# target dir) and the test images, brings the node up in its own network namespace, and cleans
# it up afterwards.
interop/node/flows.sh

step "benchmark smoke: scripts/bench.sh --quick (every system and workload runs; timings are not checked)"
# The debug builds of the tests above (scripts/build-debug.sh compiles nothing more): about
# 3 min of running.
BENCH_PROFILE=debug scripts/bench.sh --quick --out target/bench-quick

step "soak, quick: 3 peered tether servers (Leases in a real kube-apiserver) and 10 agents on all three links under churn, long-lived streams, bulk, stalled readers and reverse dials for 60 s, while every kind of fault strikes: agents killed, frozen, drained and cut, servers killed and frozen, a Lease expired, the routing file changed and broken, certificates rotated (seed 108); fails on a hang, lost bytes, a leak, a panic or an unexplained error (RELIABILITY.md)"
# The debug builds the benchmark smoke just used, and the Kubernetes binaries the Lease tests
# used. The report (seed, every fault's time) is in target/soak-quick/soak.md; `--seed`
# replays a schedule. Seed 108 draws every kind of fault within the minute (a unit test in
# crates/bench/src/soak/schedule.rs holds it to that).
"${CARGO_TARGET_DIR:-target}/debug/tether-bench" --out target/soak-quick soak --seed 108 --duration 60 --agents 10 --leases

echo
echo "all checks passed in $((SECONDS - started)) s"
