#!/usr/bin/env bash
# The benchmark (see BENCHMARKS.md): builds what it needs, then runs tether-bench, which
# starts every system on loopback, drives the same workloads through each and writes
# results/report.md with SVG charts. Arguments go to tether-bench:
#
#   scripts/bench.sh                  full run, 3 runs per figure (~25 min on 2 cores, the fleet
#                                     of 10,000 fake agents on 3 peered servers ~5 of them)
#   scripts/bench.sh --quick          seconds: proves every system and workload runs (CI;
#                                     rathole only if an earlier full run built it)
#   scripts/bench.sh --help           every option (subsets of systems/workloads, --runs, --out)
#
# BENCH_PROFILE=debug uses debug builds (what CI already compiled); the default is release.
# Needs Rust, Go >= 1.26 (upstream Konnectivity is built from the Go module proxy by
# interop/build.sh), for the SSH baseline Debian's openssh-server and openssh-client,
# which this script installs when missing (as root), and crates.io for rathole.
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

# rathole, another reverse tunnel, from crates.io with Noise only (its TLS needs OpenSSL),
# built once into target/ and reused. Not --locked: the Cargo.lock of 0.5.0 pins time 0.3.29,
# which no longer compiles (E0282 on current Rust). --quick runs without it unless it is built.
rathole_version=0.5.0 # = VERSION in crates/bench/src/systems/rathole.rs
target_dir=${CARGO_TARGET_DIR:-target}
rathole_root=$target_dir/rathole-$rathole_version
quick=
for arg in "$@"; do [ "$arg" != --quick ] || quick=1; done
if [ -z "$quick" ] && ! [ -x "$rathole_root/bin/rathole" ]; then
	echo "bench.sh: building rathole $rathole_version once (into $rathole_root)"
	cargo install --quiet --root "$rathole_root" --no-default-features --features server,client,noise \
		"rathole@$rathole_version"
fi

if [ "$profile" = release ]; then
	cargo build --locked --release -p tether -p tether-bench
else
	scripts/build-debug.sh
fi
exec "$target_dir/$profile/tether-bench" "$@"
