#!/usr/bin/env bash
# Records what kube-apiserver's own loader (k8s.io/apiserver egressselector, inside
# konnectivity-peer) says about each EgressSelectorConfiguration under
# crates/client/tests/egress/{invalid,valid}, into crates/client/tests/egress/go-results.txt.
# tether-client's test `egress::go_agrees` checks its loader against that file.
#
#   interop/egress-golden.sh [PEER]   (default: interop/bin/k8s-1.37/konnectivity-peer)
#
# Each line: FILE <TAB> STAGE <TAB> MESSAGE, where STAGE is `setup` when Go refused the file
# (MESSAGE is its error, newlines written as \n) and `dial` when Go accepted it and went on to
# dial 127.0.0.1:1 (refused; nothing else is dialed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
peer="${1:-interop/bin/k8s-1.37/konnectivity-peer}"
[[ -x "$peer" ]] || { echo "egress-golden.sh: $peer not found; run interop/build.sh" >&2; exit 1; }
dir=crates/client/tests/egress
out="$dir/go-results.txt"
{
	echo "# konnectivity-peer $("$peer" version)"
	for f in "$dir"/invalid/* "$dir"/valid/*; do
		rel="${f#"$dir"/}"
		# Exit status 1 is expected (the case reports failure); the JSON says how.
		json="$(cd "$(dirname "$f")" && timeout 20 "$OLDPWD/$peer" egress --config "$(basename "$f")" \
			--case dial-error --address 127.0.0.1:1 --timeout 10s || true)"
		python3 -c '
import json, sys
r = json.loads(sys.argv[2])
stage = r.get("stage") or ("dial" if r.get("ok") else "unknown")
msg = r.get("error") or r.get("dial_error") or ""
print("%s\t%s\t%s" % (sys.argv[1], stage, msg.replace("\\", "\\\\").replace("\n", "\\n")))
' "$rel" "$json"
	done
} >"$out.tmp"
mv "$out.tmp" "$out"
echo "egress-golden.sh: wrote $out ($(grep -vc '^#' "$out") files)"
