#!/usr/bin/env bash
# Builds Prometheus's promtool at the version promtool/go.mod pins, into a cache outside the
# repository, and prints the binary's path. The observability test (crates/testkit/tests/
# observability.rs) runs it on deploy/observability's rules: `check rules` and `test rules`.
#
#   interop/build-promtool.sh        build if missing; print the path
#
# The output directory is $TETHER_TOOLS_DIR, else ${XDG_CACHE_HOME:-~/.cache}/tether/tools.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/promtool"
command -v go >/dev/null || { echo "build-promtool.sh: go not found in PATH" >&2; exit 1; }
version="$(go list -m -f '{{.Version}}' github.com/prometheus/prometheus)"
dir="${TETHER_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tether/tools}/promtool-$version"
if [[ ! -x "$dir/promtool" ]]; then
	mkdir -p "$dir"
	echo "build-promtool.sh: building promtool $version into $dir" >&2
	CGO_ENABLED=0 go build -buildvcs=false -o "$dir/promtool.tmp" github.com/prometheus/prometheus/cmd/promtool
	mv "$dir/promtool.tmp" "$dir/promtool"
fi
echo "$dir/promtool"
