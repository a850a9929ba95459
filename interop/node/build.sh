#!/usr/bin/env bash
# Build the binaries of the real node (interop/node/node.sh), pinned by the small modules here:
#   kube/        kubelet, kube-controller-manager,   k8s.io/kubernetes v1.37.2 (staging at v0.37.2),
#                kube-scheduler, kube-proxy           a module of its own so kube-apiserver's cache
#                                                     (interop/k8s/build.sh) is never invalidated
#   containerd/  containerd, containerd-shim-runc-v2, github.com/containerd/containerd/v2 v2.4.2
#                ctr                                  (the tags of its Makefile's static build)
#   cni/         bridge, host-local, loopback,        github.com/containernetworking/plugins v1.10.0
#                portmap
#   images/pause.c                  pause             static C (gcc -static)
#   ../cmd/node-app                 node-app          the test workload (interop Go module)
# Each set goes into a cache of its own OUTSIDE the repo, keyed by its versions and a hash of its
# pins and recipe, so changing node-app does not relink the kubelet:
#   ${TETHER_CACHE_DIR:-$HOME/.cache/tether}/node/<set>-<version>-<hash>/
# and one directory of links to them all, keyed by every set's key, is printed as the last line:
#   ${TETHER_CACHE_DIR:-$HOME/.cache/tether}/node/v1.37.2-c2.4.2-cni1.10.0-<hash>/bin
#     kubelet kube-controller-manager kube-scheduler kube-proxy containerd containerd-shim-runc-v2
#     ctr pause node-app cni/{bridge,host-local,loopback,portmap}
# Nothing is rebuilt when present. The OCI runtime and kube-proxy's nft come from Debian: this
# script checks for runc and nft (and gcc, libc6-dev for pause) and, when missing, installs them as
# root with apt-get (it says what it installs); otherwise it stops naming the packages.
# A cold build takes ~7 min on 2 cores once kube-apiserver's packages are in the Go build cache.
#
#   interop/node/build.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

command -v go >/dev/null || { echo "node/build.sh: go not found in PATH" >&2; exit 1; }
command -v sha256sum >/dev/null || { echo "node/build.sh: sha256sum not found" >&2; exit 1; }
command -v flock >/dev/null || { echo "node/build.sh: flock not found (util-linux)" >&2; exit 1; }

kube_version=v1.37.2
containerd_version=v2.4.2
cni_version=v1.10.0
# Bump a recipe when the way its binaries are built changes (flags below), so old caches are not reused.
kube_recipe="recipe=1 CGO_ENABLED=0 -trimpath version-ldflags"
containerd_recipe="recipe=1 CGO_ENABLED=0 -trimpath tags=urfave_cli_no_docs,osusergo,netgo,static_build shim+no_grpc version-ldflags"
cni_recipe="recipe=1 CGO_ENABLED=0 -trimpath"
tools_recipe="recipe=1 gcc -static -Os -s; CGO_ENABLED=0 -trimpath -s -w"
first_line() { printf '%s\n' "${1%%$'\n'*}"; }
cache_root=${TETHER_CACHE_DIR:-$HOME/.cache/tether}/node

# --- Debian packages: runc (the OCI runtime), nftables (kube-proxy's nftables mode), gcc and
# libc6-dev (the static pause binary).
need_pkgs=()
command -v runc >/dev/null || need_pkgs+=(runc)
command -v nft >/dev/null || need_pkgs+=(nftables)
command -v gcc >/dev/null || need_pkgs+=(gcc)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || [ -e /usr/lib/aarch64-linux-gnu/libc.a ] || [ -e /usr/lib/libc.a ] ||
	need_pkgs+=(libc6-dev)
if [ ${#need_pkgs[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "node/build.sh: installing Debian packages: ${need_pkgs[*]} (apt-get install --no-install-recommends)"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" ||
			{ DEBIAN_FRONTEND=noninteractive apt-get update -q &&
				DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_pkgs[@]}"; }
	else
		echo "node/build.sh: missing ${need_pkgs[*]}: install the Debian packages (apt-get install ${need_pkgs[*]}) or run as root with apt-get" >&2
		exit 1
	fi
fi
echo "node/build.sh: $(first_line "$(runc --version)"), $(first_line "$(nft --version)")"

key_of() { # key_of RECIPE FILE... -> 16 hex digits
	local recipe=$1
	shift
	{ echo "$recipe"; cat "$@"; } | sha256sum | cut -c1-16
}
kube_key=$(key_of "$kube_recipe" kube/go.mod kube/go.sum)
containerd_key=$(key_of "$containerd_recipe" containerd/go.mod containerd/go.sum)
cni_key=$(key_of "$cni_recipe" cni/go.mod cni/go.sum)
mapfile -t node_app_sources < <(cd .. && find cmd/node-app -name '*.go' | LC_ALL=C sort)
tools_key=$(key_of "$tools_recipe $(first_line "$(gcc --version)")" images/pause.c ../go.mod ../go.sum \
	"${node_app_sources[@]/#/../}")

# set name, cache dir, binaries
declare -A dir=(
	[kube]=$cache_root/kube-$kube_version-$kube_key
	[containerd]=$cache_root/containerd-$containerd_version-$containerd_key
	[cni]=$cache_root/cni-$cni_version-$cni_key
	[tools]=$cache_root/tools-$tools_key
)
declare -A bins=(
	[kube]="kubelet kube-controller-manager kube-scheduler kube-proxy"
	[containerd]="containerd containerd-shim-runc-v2 ctr"
	[cni]="cni/bridge cni/host-local cni/loopback cni/portmap"
	[tools]="pause node-app"
)
sets=(kube containerd cni tools)
all_key=$(printf '%s\n' "$kube_key" "$containerd_key" "$cni_key" "$tools_key" | sha256sum | cut -c1-16)
out=$cache_root/$kube_version-c${containerd_version#v}-cni${cni_version#v}-$all_key

have_set() { # have_set SET
	local b
	for b in ${bins[$1]}; do [ -x "${dir[$1]}/bin/$b" ] || return 1; done
}
have_links() {
	local s b
	for s in "${sets[@]}"; do
		for b in ${bins[$s]}; do [ -x "$out/bin/$b" ] || return 1; done
	done
}

if have_links; then
	echo "node/build.sh: cached, nothing to build"
	echo "$out/bin"
	exit 0
fi

mkdir -p "$cache_root"
# One builder at a time (CI and a developer may start together); the second one waits (at most
# 30 min) and then finds the binaries there.
exec 9>"$cache_root/.lock"
flock -w 1800 9 || { echo "node/build.sh: timed out waiting for $cache_root/.lock" >&2; exit 1; }

export CGO_ENABLED=0
echo "node/build.sh: $(go version), CGO_ENABLED=0, into $cache_root"
tmp=$(mktemp -d "$cache_root/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

build() { # build SET NAME MODULE_DIR PACKAGE [go build args...]
	local set=$1 name=$2 mod=$3 pkg=$4 t0=$SECONDS
	shift 4
	if [ -x "${dir[$set]}/bin/$name" ]; then
		echo "node/build.sh: $name cached"
		return
	fi
	echo "node/build.sh: building $name ($pkg in $mod/)"
	mkdir -p "$(dirname "$tmp/$name")" "$(dirname "${dir[$set]}/bin/$name")"
	(cd "$mod" && go build -trimpath -buildvcs=false "$@" -o "$tmp/$name" "$pkg")
	mv "$tmp/$name" "${dir[$set]}/bin/$name"
	echo "node/build.sh: built $name in $((SECONDS - t0)) s"
}

# version ldflags, as interop/k8s/build.sh: without them `--version` prints v0.0.0-master.
kube_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kube_ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=37 -X $pkg.gitTreeState=clean"
done
for b in kubelet kube-controller-manager kube-scheduler kube-proxy; do
	build kube "$b" kube "k8s.io/kubernetes/cmd/$b" -ldflags "$kube_ldflags"
done

# containerd's Makefile, STATIC=1: these tags (btrfs needs cgo and drops out by itself); the shim
# also no_grpc (it speaks ttrpc only).
ctrd=github.com/containerd/containerd/v2
ctrd_ldflags="-X $ctrd/version.Version=$containerd_version -X $ctrd/version.Package=github.com/containerd/containerd"
ctrd_tags="urfave_cli_no_docs osusergo netgo static_build"
build containerd containerd containerd "$ctrd/cmd/containerd" -tags "$ctrd_tags" -ldflags "$ctrd_ldflags"
build containerd ctr containerd "$ctrd/cmd/ctr" -tags "$ctrd_tags" -ldflags "$ctrd_ldflags"
build containerd containerd-shim-runc-v2 containerd "$ctrd/cmd/containerd-shim-runc-v2" -tags "$ctrd_tags no_grpc" -ldflags "$ctrd_ldflags"

plugins=github.com/containernetworking/plugins/plugins
build cni cni/bridge cni "$plugins/main/bridge"
build cni cni/host-local cni "$plugins/ipam/host-local"
build cni cni/loopback cni "$plugins/main/loopback"
build cni cni/portmap cni "$plugins/meta/portmap"

build tools node-app .. ./cmd/node-app -ldflags "-s -w"
if [ ! -x "${dir[tools]}/bin/pause" ]; then
	echo "node/build.sh: building pause (images/pause.c, gcc -static)"
	gcc -static -Os -s -Wall -Werror -o "$tmp/pause" images/pause.c
	mv "$tmp/pause" "${dir[tools]}/bin/pause"
fi

for s in "${sets[@]}"; do
	have_set "$s" || { echo "node/build.sh: binaries of $s missing after build in ${dir[$s]}/bin" >&2; exit 1; }
done
"${dir[kube]}/bin/kubelet" --version
first_line "$("${dir[containerd]}/bin/containerd" --version)"

# The directory of links, made whole in a temp dir and renamed into place.
links=$(mktemp -d "$cache_root/.links.XXXXXX")
chmod 0755 "$links"
mkdir -p "$links/bin/cni"
for s in "${sets[@]}"; do
	for b in ${bins[$s]}; do ln -s "${dir[$s]}/bin/$b" "$links/bin/$b"; done
done
rm -rf "$out"
mv "$links" "$out"
have_links || { echo "node/build.sh: links missing in $out/bin" >&2; exit 1; }
echo "$out/bin"
