#!/usr/bin/env bash
# The benchmark (see BENCHMARKS.md): builds what it needs, then runs tether-bench, which
# starts every system on loopback, drives the same workloads through each and writes
# results/report.md with SVG charts. Arguments go to tether-bench:
#
#   scripts/bench.sh                  full run, 3 runs per figure (~20 min on 2 cores)
#   scripts/bench.sh --quick          seconds: proves every system and workload runs (CI)
#   scripts/bench.sh --help           every option (subsets of systems/workloads, --runs, --out)
#
# BENCH_PROFILE=debug uses debug builds (what CI already compiled); the default is release.
# Needs Rust, Go >= 1.26 (upstream Konnectivity is built from the Go module proxy by
# interop/build.sh) and, for the SSH baseline, Debian's openssh-server and openssh-client,
# which this script installs when missing (as root).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
profile=${BENCH_PROFILE:-release}

if ! [ -x /usr/sbin/sshd ] || ! command -v ssh >/dev/null || ! command -v ssh-keygen >/dev/null; then
	if [ "$(id -u)" != 0 ]; then
		echo "bench.sh: OpenSSH is missing; install it: apt-get install -y openssh-server openssh-client" >&2
		exit 1
	fi
	echo "bench.sh: installing openssh-server and openssh-client (Debian packages) for the SSH baseline"
	export DEBIAN_FRONTEND=noninteractive
	# The package must not start a system-wide sshd: the benchmark runs its own on 127.0.0.1.
	made_policy=
	if ! [ -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
		made_policy=1
	fi
	apt-get install -y -qq openssh-server openssh-client >/dev/null ||
		{ apt-get update -qq && apt-get install -y -qq openssh-server openssh-client >/dev/null; }
	[ -z "$made_policy" ] || rm -f /usr/sbin/policy-rc.d
fi

interop/build.sh >/dev/null

flags=(--locked -p tether -p tether-bench)
[ "$profile" = release ] && flags+=(--release)
cargo build "${flags[@]}"
exec "target/$profile/tether-bench" "$@"
