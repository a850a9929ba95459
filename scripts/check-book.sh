#!/usr/bin/env bash
# Builds the book (docs/) with a pinned mdbook and checks its internal links, so that a page
# moved or a heading renamed breaks CI instead of a reader's click. mdbook checks neither.
#
#   scripts/check-book.sh            install mdbook if missing, build into a temp dir, check links
#
# mdbook is installed with `cargo install --locked` into a cache OUTSIDE the repo, as the other
# pinned tools are: ${TETHER_CACHE_DIR:-$HOME/.cache/tether}/mdbook/<version>/bin/mdbook.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version=0.5.4
cache=${TETHER_CACHE_DIR:-$HOME/.cache/tether}/mdbook/$version
mdbook=$cache/bin/mdbook
if [ ! -x "$mdbook" ]; then
	command -v flock >/dev/null || { echo "check-book.sh: flock not found (util-linux)" >&2; exit 1; }
	mkdir -p "$cache"
	exec 9>"$cache/.lock"
	flock -w 1800 9 || { echo "check-book.sh: timed out waiting for $cache/.lock" >&2; exit 1; }
	if [ ! -x "$mdbook" ]; then
		t0=$SECONDS
		echo "check-book.sh: installing mdbook $version into $cache"
		# Without serve and watch (an HTTP server and a file watcher): half the dependencies.
		# Its own target dir, so that CARGO_TARGET_DIR (CI's cached one) is not filled with it.
		cargo install --locked mdbook --version "$version" --no-default-features --features search \
			--root "$cache" --target-dir "$cache/.build"
		rm -rf "$cache/.build"
		echo "check-book.sh: installed in $((SECONDS - t0)) s"
	fi
fi
"$mdbook" --version

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$mdbook" build docs --dest-dir "$out"
python3 scripts/check-book-links.py docs/src "$out"
