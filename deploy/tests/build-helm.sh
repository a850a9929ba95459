#!/usr/bin/env bash
# Build helm (helm.sh/helm/v3/cmd/helm, pinned by helm/go.mod here) into a cache OUTSIDE the
# repo, keyed by the pinned version and a hash of go.mod/go.sum and the recipe, as
# interop/k8s/build.sh does for the Kubernetes binaries:
#   ${TETHER_CACHE_DIR:-$HOME/.cache/tether}/helm/v3.22.0-<hash>/helm
# Does nothing when the binary is there. Prints the binary's path as its last line.
# A cold build takes about two minutes on 2 cores.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/helm"

command -v go >/dev/null || { echo "build-helm.sh: go not found in PATH" >&2; exit 1; }
command -v flock >/dev/null || { echo "build-helm.sh: flock not found (util-linux)" >&2; exit 1; }

version=$(go list -m -f '{{.Version}}' helm.sh/helm/v3)
recipe="recipe=2 CGO_ENABLED=0 -trimpath version-ldflags k8s-version-ldflags"
key=$({ echo "$recipe"; cat go.mod go.sum; } | sha256sum | cut -c1-16)
cache=${TETHER_CACHE_DIR:-$HOME/.cache/tether}/helm/$version-$key
if [ -x "$cache/helm" ]; then
	echo "build-helm.sh: cached"
	echo "$cache/helm"
	exit 0
fi
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock -w 1800 9 || { echo "build-helm.sh: timed out waiting for $cache/.lock" >&2; exit 1; }
if [ ! -x "$cache/helm" ]; then
	t0=$SECONDS
	echo "build-helm.sh: building helm $version into $cache ($(go version))"
	tmp=$(mktemp "$cache/.helm.XXXXXX")
	trap 'rm -f "$tmp"' EXIT
	# As helm's Makefile does: without these, `helm version` prints v3.22+unreleased and
	# `helm template` assumes Kubernetes v1.20 (not the v1.37 of its client-go).
	k8s_minor=$(go list -m -f '{{.Version}}' k8s.io/client-go | cut -d. -f2)
	ldflags="-X helm.sh/helm/v3/internal/version.version=$version"
	for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
		ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
	done
	CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "$ldflags" \
		-o "$tmp" helm.sh/helm/v3/cmd/helm
	mv "$tmp" "$cache/helm"
	echo "build-helm.sh: built in $((SECONDS - t0)) s"
fi
"$cache/helm" version --short
echo "$cache/helm"
