#!/usr/bin/env bash
# kubectl through Konnectivity on the real node (interop/node/node.sh), installed the way an
# operator installs it: tether with its Helm chart and image (deploy/image/build.sh), and, as the
# reference row, upstream's images with the kubernetes.io task's manifests. Runs the flows of
# interop/cmd/node-flows in each and rewrites the real-node block of COMPATIBILITY.md; with CI set
# (or --check) fails when the committed block differs from what ran. Brings the node up with
# kube-apiserver's egress selector pointing at the server's socket, and cleans it up afterwards
# (--keep leaves it up for a look: node.sh kubectl ..., then node.sh clean).
#
#   interop/node/flows.sh [--check] [--only tether|upstream] [--keep]
# Needs root. Env as node.sh (TETHER_NODE_DIR default /tmp/tether-node-flows).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
started=$SECONDS
export TETHER_NODE_DIR=${TETHER_NODE_DIR:-/tmp/tether-node-flows}
W=$TETHER_NODE_DIR

check=${CI:+1}
only=
keep=
while [ $# -gt 0 ]; do
	case $1 in
	--check) check=1 ;;
	--only) only=$2; shift ;;
	--keep) keep=1 ;;
	*) echo "node/flows.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done
[ "$(id -u)" = 0 ] || { echo "node/flows.sh: needs root (the node's netns, mounts, cgroups)" >&2; exit 1; }

# shellcheck source=lib/last-line.sh
. "$here/lib/last-line.sh"

echo "node/flows.sh: building (node binaries, test images, tether's image, helm, node-flows)"
images=$(last_line_of "$here/images.sh")
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml")
tether_image=localhost/tether:${version%%$'\n'*}
image_line=$(last_line_of "$repo/deploy/image/build.sh" --name "$tether_image")
tether_tar=${image_line%% *}
helm=$(last_line_of "$repo/deploy/tests/build-helm.sh")
anp_version=$(sed -n 's/^\tsigs.k8s.io\/apiserver-network-proxy \(v[^ ]*\)$/\1/p' "$repo/interop/go.mod")
flows_bin=$W-bin/node-flows
mkdir -p "$W-bin"
(cd "$repo/interop" && CGO_ENABLED=0 go build -trimpath -o "$flows_bin" ./cmd/node-flows)

# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
	if [ -z "$keep" ]; then
		"$here/node.sh" clean || echo "node/flows.sh: node.sh clean failed" >&2
		rm -rf "$W-bin"
	fi
}
trap cleanup EXIT

# The flows need an empty cluster: a run killed before its EXIT trap (a reboot, SIGKILL) leaves
# its etcd behind, and a warm start would bring that run's objects into this one.
if [ -e "$W" ]; then
	echo "node/flows.sh: a previous node's state is in $W: cleaning it first"
	"$here/node.sh" clean
fi

# kube-apiserver's egress selector, as the kubernetes.io task writes it: the cluster selection
# over gRPC to the server's socket. The node's /etc/kubernetes is $W/etc-kubernetes.
mkdir -p "$W/etc-kubernetes"
cat >"$W/etc-kubernetes/egress-selector-configuration.yaml" <<'YAML'
apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: GRPC
    transport:
      uds:
        udsName: /etc/kubernetes/konnectivity-server/konnectivity-server.socket
YAML
"$here/node.sh" up \
	--apiserver-flag=--egress-selector-config-file=/etc/kubernetes/egress-selector-configuration.yaml \
	--apiserver-mount=/etc/kubernetes/egress-selector-configuration.yaml:File \
	--apiserver-mount=/etc/kubernetes/konnectivity-server
"$here/node.sh" import "$images/node-app.tar" "$images/proxy-server.tar" "$images/proxy-agent.tar" "$tether_tar"

args=(-etc-kubernetes "$W/etc-kubernetes" -helm "$helm" -chart "$repo/deploy/helm/tether" -work "$W-bin"
	-pki-lib "$here/lib/pki.sh" -tether-image "$tether_image"
	-upstream-server-image "localhost/tether-test/proxy-server:$anp_version"
	-upstream-agent-image "localhost/tether-test/proxy-agent:$anp_version"
	-app-image localhost/tether-test/node-app:1)
if [ -n "$only" ]; then
	args+=(-only "$only")
else
	args+=(-out "$repo/COMPATIBILITY.md")
	[ -z "$check" ] || args+=(-check)
fi
rc=0
"$here/node.sh" run "$flows_bin" "${args[@]}" || rc=$?
echo "node/flows.sh: done in $((SECONDS - started)) s (exit $rc)"
exit $rc
