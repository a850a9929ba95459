#!/usr/bin/env bash
# Build tether's OCI image without a daemon or a registry: a statically linked tether (glibc,
# crt-static, stripped) on an empty base, user 65532 (named in /etc/passwd and /etc/group, group
# 65532), with upstream's entrypoints /proxy-server
# and /proxy-agent as links to it (tether picks the subcommand from argv[0]), written as an OCI
# image-layout tarball by deploy/image/mkimage. Reproducible: the same commit gives the same
# digest wherever it is built (cargo's paths remapped, fixed timestamps and owners).
#
#   deploy/image/build.sh [--arch amd64[,arm64]] [--name REF] [--out FILE]
#
# REF is where you will push it (REGISTRY/tether:<crate version>, the chart's image.repository
# and default tag), by default tether:<crate version>; FILE defaults to
# target/image/tether-<version>.oci.tar. Prints "FILE DIGEST" last. The name is not part of the
# digest.
# Push it with `skopeo copy oci-archive:FILE docker://REF` (Debian: skopeo), import it into a
# node's containerd with `ctr -n k8s.io images import FILE`.
#
# arm64 needs the Rust target and a cross toolchain with static glibc (Debian:
# gcc-aarch64-linux-gnu libc6-dev-arm64-cross; rustup target add aarch64-unknown-linux-gnu).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD

arches=amd64
name=
out=
while [ $# -gt 0 ]; do
	case $1 in
	--arch) arches=$2; shift ;;
	--name) name=$2; shift ;;
	--out) out=$2; shift ;;
	*) echo "image/build.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
	esac
	shift
done

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml)
version=${version%%$'\n'*}
name=${name:-tether:$version}
target_dir=${CARGO_TARGET_DIR:-$root/target}
case $target_dir in /*) ;; *) target_dir=$root/$target_dir ;; esac
out=${out:-$target_dir/image/tether-$version.oci.tar}
mkdir -p "$(dirname "$out")"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkimage_args=()
for arch in ${arches//,/ }; do
	case $arch in
	amd64) triple=x86_64-unknown-linux-gnu ;;
	arm64) triple=aarch64-unknown-linux-gnu ;;
	*) echo "image/build.sh: unknown --arch $arch (amd64 or arm64)" >&2; exit 2 ;;
	esac
	# Read whole, then matched: grep -q in a pipe can stop rustup with SIGPIPE under pipefail.
	installed=$(command -v rustup >/dev/null && rustup target list --installed || echo "$triple")
	if ! grep -qx "$triple" <<<"$installed"; then
		echo "image/build.sh: the Rust target $triple is not installed: rustup target add $triple" >&2
		[ "$arch" = amd64 ] || echo "  and a cross linker with static glibc (Debian: gcc-aarch64-linux-gnu libc6-dev-arm64-cross)," \
			"then CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc" >&2
		exit 1
	fi
	# Panic locations name source files: the workspace's relative to it, the dependencies' under
	# cargo's home, which is remapped so the digest does not depend on the machine. (Remapping
	# the checkout too would change RUSTFLAGS with every clone, and so rebuild everything.)
	RUSTFLAGS="-C target-feature=+crt-static --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo" \
		CARGO_PROFILE_RELEASE_STRIP=symbols CARGO_PROFILE_RELEASE_DEBUG=false \
		cargo build --release --locked --target "$triple" -p tether >&2
	cp "$target_dir/$triple/release/tether" "$work/tether-$arch"
	mkimage_args+=(-arch "$arch")
done

# User and group 65532 by name, as distroless' nonroot has them: the kubelet hands the runtime
# only the image's uid when a Pod sets no runAsGroup (the kubernetes.io task's manifests), and
# the runtime then takes the group from /etc/passwd, or 0 without one.
printf 'nonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' >"$work/passwd"
printf 'nonroot:x:65532:\n' >"$work/group"
(cd deploy/image/mkimage && go build -trimpath -o "$work/mkimage" .)
"$work/mkimage" -o "$out" -name "$name" -entrypoint /tether -user 65532:65532 \
	-symlink /proxy-server=tether -symlink /proxy-agent=tether -dir /etc:0755 "${mkimage_args[@]}" \
	"$work/tether-{arch}:/tether:0555" "$work/passwd:/etc/passwd:0444" "$work/group:/etc/group:0444"
