#!/usr/bin/env bash
# Build the real Kubernetes pieces of interop/k8s/run.sh, pinned by the small modules here:
#   kube/  kube-apiserver and kubectl   k8s.io/kubernetes v1.37.2 (staging modules at v0.37.2)
#   etcd/  etcd                         go.etcd.io/etcd/server/v3 v3.7.3
#   kwok/  kwok (the fake kubelets)     sigs.k8s.io/kwok v0.8.0
# into a cache OUTSIDE the repo, keyed by the pinned versions and a hash of the go.mod/go.sum
# files and of the build recipe, so a fresh clone on the same machine (CI) reuses a warm cache:
#   ${TETHER_CACHE_DIR:-$HOME/.cache/tether}/k8s/v1.37.2-<hash>/bin
# With --sample-apiserver it builds instead, into a cache of its own (so that adding it did not
# invalidate the one above):
#   sample-apiserver/  sample-apiserver (an aggregated API server)  k8s.io/sample-apiserver v0.37.2
#   ${TETHER_CACHE_DIR:-$HOME/.cache/tether}/k8s/sample-apiserver-v0.37.2-<hash>/bin
# Does nothing when every binary is already there. Prints the bin directory as its last line.
# A cold build takes minutes (kube-apiserver alone about 5-10 min on 2 cores) and ~3 GB of RAM;
# sample-apiserver about 1 min once kube-apiserver's packages are in the Go build cache.
#
#   interop/k8s/build.sh [--sample-apiserver]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

set_name=kubernetes
case ${1:-} in
"") ;;
--sample-apiserver) set_name=sample-apiserver ;;
*) echo "k8s/build.sh: unknown argument $1" >&2; exit 2 ;;
esac

command -v go >/dev/null || { echo "k8s/build.sh: go not found in PATH" >&2; exit 1; }
command -v sha256sum >/dev/null || { echo "k8s/build.sh: sha256sum not found" >&2; exit 1; }
command -v flock >/dev/null || { echo "k8s/build.sh: flock not found (util-linux)" >&2; exit 1; }

kube_version=v1.37.2
sample_apiserver_version=v0.37.2
# Bump recipe when the way the binaries are built changes (flags below), so old caches are not reused.
recipe="recipe=1 CGO_ENABLED=0 -trimpath version-ldflags"
first_line() { printf '%s\n' "${1%%$'\n'*}"; }

case $set_name in
kubernetes)
	pins=(kube/go.mod kube/go.sum etcd/go.mod etcd/go.sum kwok/go.mod kwok/go.sum)
	prefix=$kube_version
	bins=(kube-apiserver kubectl etcd kwok)
	;;
sample-apiserver)
	pins=(sample-apiserver/go.mod sample-apiserver/go.sum)
	prefix=sample-apiserver-$sample_apiserver_version
	bins=(sample-apiserver)
	;;
esac
key=$({ echo "$recipe"; cat "${pins[@]}"; } | sha256sum | cut -c1-16)
cache=${TETHER_CACHE_DIR:-$HOME/.cache/tether}/k8s/$prefix-$key

have_all() {
	local b
	for b in "${bins[@]}"; do [ -x "$cache/bin/$b" ] || return 1; done
}

if have_all; then
	echo "k8s/build.sh: cached, nothing to build"
	echo "$cache/bin"
	exit 0
fi

mkdir -p "$cache"
# One builder at a time per key (CI and a developer may start together); the second one waits
# (at most 30 min) and then finds the binaries there.
exec 9>"$cache/.lock"
flock -w 1800 9 || { echo "k8s/build.sh: timed out waiting for $cache/.lock" >&2; exit 1; }
if have_all; then
	echo "k8s/build.sh: built meanwhile by another run"
	echo "$cache/bin"
	exit 0
fi

export CGO_ENABLED=0
echo "k8s/build.sh: $(go version), CGO_ENABLED=0, into $cache/bin"
tmp=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# version ldflags: without them `--version` prints v0.0.0-master.
kube_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kube_ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=37 -X $pkg.gitTreeState=clean"
done

build() { # build NAME MODULE_DIR PACKAGE [go build args...]
	local name=$1 dir=$2 pkg=$3 t0=$SECONDS
	shift 3
	if [ -x "$cache/bin/$name" ]; then
		echo "k8s/build.sh: $name cached"
		return
	fi
	echo "k8s/build.sh: building $name ($pkg in $dir/)"
	(cd "$dir" && go build -trimpath -buildvcs=false "$@" -o "$tmp/$name" "$pkg")
	mkdir -p "$cache/bin"
	mv "$tmp/$name" "$cache/bin/$name"
	echo "k8s/build.sh: built $name in $((SECONDS - t0)) s"
}

case $set_name in
kubernetes)
	build etcd etcd go.etcd.io/etcd/server/v3
	build kwok kwok sigs.k8s.io/kwok/cmd/kwok
	build kube-apiserver kube k8s.io/kubernetes/cmd/kube-apiserver -ldflags "$kube_ldflags"
	build kubectl kube k8s.io/kubernetes/cmd/kubectl -ldflags "$kube_ldflags"
	"$cache/bin/kube-apiserver" --version
	# The first line of each, read from a captured output: piping into `head -1` under pipefail
	# fails the script when the writer is killed by SIGPIPE (it happened on a cold cache).
	first_line "$("$cache/bin/kubectl" version --client 2>/dev/null)"
	first_line "$("$cache/bin/etcd" --version)"
	;;
sample-apiserver)
	build sample-apiserver sample-apiserver k8s.io/sample-apiserver
	;;
esac
have_all || { echo "k8s/build.sh: binaries missing after build" >&2; exit 1; }
echo "$cache/bin"
