#!/usr/bin/env bash
# Run tether's image the way a cluster would and check it: `tether --version`, the
# /proxy-server and /proxy-agent links, user 65532, and a read-only root file system with every
# capability dropped. No network (--network=none).
#   deploy/image/check.sh [TAG]        default TAG: what deploy/image/build.sh printed
# Not in CI: the static release build takes minutes, and podman on this kind of machine needs
# runc (crun refuses its hybrid cgroup layout) and explicit ulimits (it may not raise them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
tag=${1:-localhost/tether:$version}
runtime=()
command -v runc >/dev/null && runtime=(--runtime runc)
run() {
	timeout 60 podman "${runtime[@]}" run --rm --network=none --read-only --cap-drop=all \
		--security-opt=no-new-privileges --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 "$@"
}
fail() { echo "image/check.sh: $*" >&2; exit 1; }

out=$(run "$tag" --version) || fail "tether --version failed"
[ "$out" = "tether $version" ] || fail "--version printed '$out', expected 'tether $version'"
run --entrypoint /proxy-server "$tag" --help | grep -q '^Usage: tether server' || fail "/proxy-server is not tether server"
run --entrypoint /proxy-agent "$tag" --help | grep -q '^Usage: tether agent' || fail "/proxy-agent is not tether agent"
user=$(podman image inspect "$tag" --format '{{.Config.User}}')
[ "$user" = "65532:65532" ] || fail "image user is '$user', expected 65532:65532"
# A start-up error, not a crash: the binary runs as 65532 on the read-only root.
err=$(run --entrypoint /proxy-agent "$tag" --ca-cert=/absent.crt 2>&1 || true)
case $err in *"reading CA bundle /absent.crt"*) ;; *) fail "unexpected agent output: $err" ;; esac
echo "image/check.sh: $tag ok ($(podman image inspect "$tag" --format '{{.Size}}') bytes): $out; /proxy-server, /proxy-agent, user $user"
