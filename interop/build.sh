#!/usr/bin/env bash
# Build the Go side of tether's interop harness into interop/bin/:
#   proxy-server, proxy-agent   upstream Konnectivity v0.36.0 (from Go modules, see go.mod)
#   konnectivity-dial           our client tool built on upstream konnectivity-client
#   gen-pki                     throwaway ECDSA PKI for loopback tests
#   test-target                 loopback TCP echo + HTTP target (/, /bytes/N, /status/N, POST /sink)
#   interop-matrix              the driver of run.sh's interop matrix
#   upstream-tests.test         upstream's integration suite (package .../tests), compiled
#   k8s-1.37/konnectivity-peer  Go peers (konnectivity-client + kube-apiserver's egress dialer):
#   k8s-1.35/konnectivity-peer    peer/latest/go.mod (newest tags) and peer/go.mod (Kubernetes 1.35's)
# Needs Go >= 1.26.2 (or GOTOOLCHAIN=auto) and the Go module proxy; modules are
# fetched on first run and pinned by go.sum. Re-runs are quick (Go build cache).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

command -v go >/dev/null || { echo "build.sh: go not found in PATH" >&2; exit 1; }

# Static binaries like upstream's images; no VCS stamping (works outside git too).
export CGO_ENABLED="${CGO_ENABLED:-0}"
cmds=(proxy-server proxy-agent konnectivity-dial gen-pki test-target interop-matrix)

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
echo "build.sh: building bin/upstream-tests.test  (go test -c sigs.k8s.io/apiserver-network-proxy/tests)"
go test -buildvcs=false -c -o bin/upstream-tests.test sigs.k8s.io/apiserver-network-proxy/tests

# The peers: one module per konnectivity-client version (a module holds only one).
echo "build.sh: building bin/k8s-1.35/konnectivity-peer  (peer/go.mod)"
(cd peer && go build -buildvcs=false -o ../bin/k8s-1.35/konnectivity-peer ./cmd/konnectivity-peer)
echo "build.sh: building bin/k8s-1.37/konnectivity-peer  (peer/latest/go.mod)"
(cd peer/latest && go build -buildvcs=false -tags reusable -o ../../bin/k8s-1.37/konnectivity-peer tether.dev/interop/peer/cmd/konnectivity-peer)
for p in k8s-1.35 k8s-1.37; do
	echo "build.sh: bin/$p/konnectivity-peer: $(bin/$p/konnectivity-peer version)"
done
echo "build.sh: done: $(cd bin && ls -1 "${cmds[@]}" upstream-tests.test k8s-1.35/konnectivity-peer k8s-1.37/konnectivity-peer | tr '\n' ' ')"
