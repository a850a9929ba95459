#!/usr/bin/env bash
# Build tether's OCI image: a statically linked tether (glibc, crt-static) FROM scratch, with
# /proxy-server and /proxy-agent as links to it. Runs offline: nothing is pulled.
#   deploy/image/build.sh [TAG]        default TAG: localhost/tether:<crate version>
# Needs podman (Debian: apt-get install podman). Prints the tag as its last line.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
tag=${1:-localhost/tether:$version}
target=x86_64-unknown-linux-gnu

RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked --target "$target" -p tether
binary=${CARGO_TARGET_DIR:-target}/$target/release/tether
file "$binary" | grep -q -E 'statically linked|static-pie linked' || {
	echo "image/build.sh: $binary is not statically linked" >&2
	exit 1
}

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
mkdir "$context/rootfs"
# Stripped: the release profile's line tables are most of the binary (40 MB -> 9 MB).
install -m 0555 -s "$binary" "$context/rootfs/tether"
ln -s tether "$context/rootfs/proxy-server"
ln -s tether "$context/rootfs/proxy-agent"
podman build --pull=never -f deploy/image/Containerfile -t "$tag" "$context" >&2
echo "$tag"
