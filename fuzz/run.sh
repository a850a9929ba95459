#!/usr/bin/env bash
# Fuzzes each target in turn for SECONDS, one process at a time (the machine is shared).
# Usage: fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]       (default: 600 s, every target)
#
# Installs what it needs: the nightly toolchain (minimal profile) and cargo-fuzz.
# The corpus grows in $FUZZ_CORPUS/<target> (default fuzz/corpus; CI keeps it under
# ~/.cache/tether/fuzz so each run starts where the last stopped), seeded by
# fuzz/regressions/<target>. Builds go to $FUZZ_TARGET_DIR (default fuzz/target).
# A crash is copied into fuzz/regressions/<target>/ (commit it: the stable test
# `cargo test -p tether-fuzz-checks` replays every file there) and the script exits 1
# after the other targets ran.
set -u
cd "$(dirname "$0")"
seconds=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(frame_decoder packet authority identifiers policy_file session_table connect_head link_frames websocket_frames)
corpus_root=${FUZZ_CORPUS:-corpus}
target_dir=${FUZZ_TARGET_DIR:-target}
# cargo-fuzz's version, pinned so a CI run does not change with a release.
cargo_fuzz_version=0.13.2

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
if ! cargo fuzz --version 2>/dev/null | grep -q "$cargo_fuzz_version"; then
	cargo install --locked --version "$cargo_fuzz_version" cargo-fuzz
fi

failed=()
for t in "${targets[@]}"; do
	mkdir -p "$corpus_root/$t" "artifacts/$t"
	log="logs-$t.txt"
	before=$(find "$corpus_root/$t" -type f | wc -l)
	cargo +nightly fuzz run -O --target-dir "$target_dir" "$t" "$corpus_root/$t" "regressions/$t" -- \
		-max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
		-print_final_stats=1 > "$log" 2>&1
	status=$?
	runs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$')
	after=$(find "$corpus_root/$t" -type f | wc -l)
	echo "$t: exit $status, ${runs:-?} runs in ${seconds} s, corpus $before -> $after"
	crashes=$(find "artifacts/$t" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) 2>/dev/null)
	if [ "$status" -ne 0 ] || [ -n "$crashes" ]; then
		failed+=("$t")
		for c in $crashes; do
			mv "$c" "regressions/$t/"
			echo "  moved $(basename "$c") to fuzz/regressions/$t/: commit it once fixed (the stable replay keeps it fixed)"
		done
		tail -n 40 "$log" | sed 's/^/  | /'
	fi
done
if [ ${#failed[@]} -gt 0 ]; then
	echo "fuzzing found failures in: ${failed[*]} (logs: fuzz/logs-<target>.txt)" >&2
	exit 1
fi
