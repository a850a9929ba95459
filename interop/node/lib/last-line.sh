# shellcheck shell=bash
# Sourced by the node's scripts. last_line_of CMD...: run a build script, its lines to stderr as
# they come, and print its last line (the path it built). A read loop rather than
# `tee /dev/stderr`, which reopens whatever file stderr points at and writes over its start.
last_line_of() {
	local line last=
	while IFS= read -r line; do
		printf '%s\n' "$line" >&2
		last=$line
	done < <("$@")
	wait $! || { echo "${0##*/}: $* failed" >&2; exit 1; }
	printf '%s\n' "$last"
}
