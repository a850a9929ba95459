#!/usr/bin/env bash
# Build the real node's images as OCI image-layout tarballs, without a daemon or a registry, with
# the project's deploy/image/mkimage (reproducible: the same binaries give the same digests):
#   pause.tar           localhost/tether-test/pause:1              /pause (images/pause.c)
#   node-app.tar        localhost/tether-test/node-app:1           /node-app, user 65532; /bin/tar and
#                                                                  /bin/test link to it (kubectl cp)
#   kube-apiserver.tar  localhost/tether-test/kube-apiserver:v1.37.2  /usr/local/bin/kube-apiserver
#                                                                  (interop/k8s/build.sh), user root
#                                                                  as upstream's
#   proxy-server.tar    localhost/tether-test/proxy-server:<ver>   /proxy-server  } upstream Konnectivity
#   proxy-agent.tar     localhost/tether-test/proxy-agent:<ver>    /proxy-agent   } (interop/build.sh),
#                       user 65532:65532 as upstream's images (FROM gcr.io/distroless/static-debian12:nonroot)
# each cached as ${TETHER_CACHE_DIR:-$HOME/.cache/tether}/node/images/<name>-<hash>.tar, with a
# directory of links to them all, node/images-<hash>/<name>.tar, printed as the last line.
# Nothing is rebuilt when present. TETHER_INTEROP_BIN names another interop/bin to take
# proxy-server and proxy-agent from (e.g. the main checkout's, read-only).
#
#   interop/node/images.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
mkimage_dir=$repo/deploy/image/mkimage

# shellcheck source=lib/last-line.sh
. "$here/lib/last-line.sh"
[ -f "$mkimage_dir/main.go" ] || { echo "node/images.sh: $mkimage_dir missing (the project's OCI image writer)" >&2; exit 1; }
bin=$(last_line_of "$here/build.sh")
k8s_bin=$(last_line_of "$repo/interop/k8s/build.sh")
upstream_bin=${TETHER_INTEROP_BIN:-$repo/interop/bin}
if [ ! -x "$upstream_bin/proxy-server" ] || [ ! -x "$upstream_bin/proxy-agent" ]; then
	echo "node/images.sh: building upstream's proxy-server and proxy-agent (interop/build.sh)" >&2
	"$repo/interop/build.sh" >&2
fi
anp_version=$(sed -n 's/^\tsigs.k8s.io\/apiserver-network-proxy \(v[^ ]*\)$/\1/p' "$repo/interop/go.mod")
[ -n "$anp_version" ] || { echo "node/images.sh: no sigs.k8s.io/apiserver-network-proxy version in interop/go.mod" >&2; exit 1; }

nonroot=65532:65532
# name|reference|input binary|mkimage arguments after -o and -name
images=(
	"pause|localhost/tether-test/pause:1|$bin/pause|-entrypoint /pause $bin/pause:/pause"
	"node-app|localhost/tether-test/node-app:1|$bin/node-app|-entrypoint /node-app -user $nonroot -symlink /bin/tar=/node-app -symlink /bin/test=/node-app $bin/node-app:/node-app"
	"kube-apiserver|localhost/tether-test/kube-apiserver:v1.37.2|$k8s_bin/kube-apiserver|-entrypoint /usr/local/bin/kube-apiserver $k8s_bin/kube-apiserver:/usr/local/bin/kube-apiserver"
	"proxy-server|localhost/tether-test/proxy-server:$anp_version|$upstream_bin/proxy-server|-entrypoint /proxy-server -user $nonroot $upstream_bin/proxy-server:/proxy-server"
	"proxy-agent|localhost/tether-test/proxy-agent:$anp_version|$upstream_bin/proxy-agent|-entrypoint /proxy-agent -user $nonroot $upstream_bin/proxy-agent:/proxy-agent"
)
cache_root=${TETHER_CACHE_DIR:-$HOME/.cache/tether}/node
mkimage_key=$(cat "$mkimage_dir"/go.mod "$mkimage_dir"/*.go | sha256sum | cut -c1-16)

# Each image is cached on its own, keyed by its line above, mkimage's sources and its input binary
# by path, size and mtime (hashing ~300 MB at every node.sh up took 3 s; the build caches' binaries
# sit in directories keyed by their pins), so a new node-app does not rewrite kube-apiserver's.
declare -A file=()
names=()
for i in "${images[@]}"; do
	IFS='|' read -r name ref input args <<<"$i"
	key=$(printf '%s\n%s\n%s %s\n' "$i" "$mkimage_key" "$(readlink -f "$input")" "$(stat -L -c '%s %Y' "$input")" |
		sha256sum | cut -c1-16)
	file[$name]=$cache_root/images/$name-$key.tar
	names+=("$name")
done
all_key=$(for n in "${names[@]}"; do echo "${file[$n]}"; done | sha256sum | cut -c1-16)
out=$cache_root/images-$all_key

have_links() {
	local n
	for n in "${names[@]}"; do [ -s "$out/$n.tar" ] || return 1; done
}
if have_links; then
	echo "node/images.sh: cached, nothing to build" >&2
	echo "$out"
	exit 0
fi

mkdir -p "$cache_root/images"
exec 9>"$cache_root/.images.lock"
flock -w 600 9 || { echo "node/images.sh: timed out waiting for $cache_root/.images.lock" >&2; exit 1; }
tmp=$(mktemp -d "$cache_root/.images.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$mkimage_dir" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -o "$tmp/mkimage" .)
for i in "${images[@]}"; do
	IFS='|' read -r name ref input args <<<"$i"
	[ ! -s "${file[$name]}" ] || continue
	t0=$SECONDS
	# shellcheck disable=SC2086 # args is a list of words without spaces
	"$tmp/mkimage" -o "$tmp/$name.tar" -name "$ref" $args >&2
	mv "$tmp/$name.tar" "${file[$name]}"
	echo "node/images.sh: $name.tar ($ref) in $((SECONDS - t0)) s" >&2
done
# The directory of links, made whole and renamed into place.
mkdir "$tmp/links"
for n in "${names[@]}"; do ln -s "${file[$n]}" "$tmp/links/$n.tar"; done
chmod 0755 "$tmp/links"
rm -rf "$out"
mv "$tmp/links" "$out"
have_links || { echo "node/images.sh: images missing in $out" >&2; exit 1; }
echo "$out"
