#!/usr/bin/env bash
# Fuzzes each target in turn, one process each (the machine is shared).
# Usage: fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]
# New corpus entries go to fuzz/corpus/<target>; fuzz/regressions/<target> seeds it.
set -u
cd "$(dirname "$0")"
seconds=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(frame_decoder packet authority identifiers policy_file session_table connect_head link_frames websocket_frames)
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    cargo +nightly fuzz run -O "$t" "corpus/$t" "regressions/$t" -- \
        -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
        > "logs-$t.txt" 2>&1
    echo "$t exit $?: $(grep -E '^#[0-9]+.*(DONE|cov:)' "logs-$t.txt" | tail -1)"
done
