#!/usr/bin/env bash
# Builds the workspace's debug binaries (tether, tether-bench, ...) with the features
# `cargo test --workspace` resolves: the scripts that run them (the interop matrix, the
# Kubernetes flows, the benchmark's smoke run) then reuse what the tests compiled. A narrower
# selection such as `-p tether` resolves other features for shared dependencies, and cargo then
# compiles them again, and the next test build compiles them back (1–4 min per switch in CI).
#
#   scripts/build-debug.sh     (extra arguments go to cargo build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# --tests selects the dev-dependencies' features too, as `cargo test` does.
exec cargo build --locked --workspace --bins --tests "$@"
