#!/usr/bin/env bash
# Builds Prometheus's promtool (or the Prometheus server) at the version promtool/go.mod pins,
# into a cache outside the repository, and prints the binary's path. The observability test
# (crates/testkit/tests/observability.rs) runs promtool on deploy/observability's rules:
# `check rules` and `test rules`. scripts/dashboard-snapshot.sh runs the server.
#
#   interop/build-promtool.sh             build promtool if missing; print its path
#   interop/build-promtool.sh prometheus  the same for the Prometheus server
#
# The output directory is $TETHER_TOOLS_DIR, else $TETHER_CACHE_DIR/tools (the cache every
# pinned tool shares), else ${XDG_CACHE_HOME:-~/.cache}/tether/tools.
set -euo pipefail
tool="${1:-promtool}"
case "$tool" in
promtool | prometheus) ;;
*) echo "build-promtool.sh: unknown tool '$tool' (promtool or prometheus)" >&2; exit 2 ;;
esac
cd "$(dirname "${BASH_SOURCE[0]}")/promtool"
command -v go >/dev/null || { echo "build-promtool.sh: go not found in PATH" >&2; exit 1; }
version="$(go list -m -f '{{.Version}}' github.com/prometheus/prometheus)"
dir="${TETHER_TOOLS_DIR:-${TETHER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tether}/tools}/promtool-$version"
if [[ ! -x "$dir/$tool" ]]; then
	mkdir -p "$dir"
	echo "build-promtool.sh: building $tool $version into $dir" >&2
	CGO_ENABLED=0 go build -buildvcs=false -o "$dir/$tool.tmp" "github.com/prometheus/prometheus/cmd/$tool"
	mv "$dir/$tool.tmp" "$dir/$tool"
fi
echo "$dir/$tool"
