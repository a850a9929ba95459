#!/usr/bin/env bash
# Build the Go side of tether's interop harness into interop/bin/:
#   proxy-server, proxy-agent   upstream Konnectivity v0.36.0 (from Go modules, see go.mod)
#   konnectivity-dial           our client tool built on upstream konnectivity-client
#   gen-pki                     throwaway ECDSA PKI for loopback tests
#   test-target                 loopback TCP echo + HTTP target (/, /bytes/N, /status/N)
# Needs Go >= 1.26.2 (or GOTOOLCHAIN=auto) and the Go module proxy; modules are
# fetched on first run and pinned by go.sum. Re-runs are quick (Go build cache).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

command -v go >/dev/null || { echo "build.sh: go not found in PATH" >&2; exit 1; }

# Static binaries like upstream's images; no VCS stamping (works outside git too).
export CGO_ENABLED="${CGO_ENABLED:-0}"
cmds=(proxy-server proxy-agent konnectivity-dial gen-pki test-target)

echo "build.sh: $(go version) CGO_ENABLED=$CGO_ENABLED"
echo "build.sh: module $(go list -m) with $(go list -m sigs.k8s.io/apiserver-network-proxy) and $(go list -m sigs.k8s.io/apiserver-network-proxy/konnectivity-client | cut -d' ' -f2) client"
mkdir -p bin
pkgs=()
for c in "${cmds[@]}"; do
	echo "build.sh: building bin/$c  (./cmd/$c)"
	pkgs+=("./cmd/$c")
done
go build -buildvcs=false -o bin/ "${pkgs[@]}"
for c in "${cmds[@]}"; do
	test -x "bin/$c" || { echo "build.sh: bin/$c missing after build" >&2; exit 1; }
done
echo "build.sh: done: $(cd bin && ls -1 "${cmds[@]}" | tr '\n' ' ')"
