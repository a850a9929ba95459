#!/usr/bin/env bash
# The real node's smoke test: brings the node up cold, then warm, and checks on each start that
# it runs real pods the way the flows on top of it need them, then cleans up and checks that
# nothing of the node is left. Straight to the kubelet (no proxy in between yet):
#   - node Ready, the kube-apiserver static Pod Ready (both since this start);
#   - a DaemonSet of node-app with the chart's hardened securityContext and a projected
#     ServiceAccount token for audience system:konnectivity-server: Ready, the securityContext
#     in force (id), the token's audience, a TokenReview accepting it;
#   - kubectl logs, exec -i with stdin, port-forward, cp into and out of the pod;
#   - the pod IP over the CNI bridge, and the API through the kubernetes Service (kube-proxy);
#   - after clean: no process, netns, mount, cgroup, work dir, host dir or nft table left.
# Prints the timings of each start and the total.
#
#   interop/node/smoke.sh        (root; builds what is missing first: see node.sh, images.sh)
# Env: TETHER_NODE_DIR (default /tmp/tether-node-smoke, its own work dir).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TETHER_NODE_DIR=${TETHER_NODE_DIR:-/tmp/tether-node-smoke}
W=$TETHER_NODE_DIR
NS=tether-smoke
node() { "$here/node.sh" "$@"; }
k() { node kubectl -n "$NS" "$@"; }
say() { echo "smoke: $*"; }
fail() { echo "smoke: FAIL: $*" >&2; exit 1; }
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }
secs_since() { local d=$(($(now_ms) - $1)); printf '%d.%d' $((d / 1000)) $((d % 1000 / 100)); }

[ "$(id -u)" = 0 ] || fail "needs root"
[ ! -e /run/netns/tether-node ] || fail "a node is already there (netns tether-node): node.sh clean it with its TETHER_NODE_DIR first"

t_total=$(now_ms)
host_dirs_before=$(for d in /var/lib/kubelet /var/log/containers /var/lib/cni /run/containerd /etc/kubernetes; do [ -e "$d" ] && echo "$d"; done || true)
nft_before=$(nft list tables)

on_exit() {
	local rc=$?
	if [ "$rc" != 0 ]; then
		say "failed: state of the node, then clean"
		node status || true
		k get pods -o wide 2>/dev/null || true
		k describe pods 2>/dev/null | tail -n 40 || true
		node clean || true
	fi
}
trap on_exit EXIT

images=$("$here/images.sh")

# wait_for SECONDS WHAT CMD...: bounded poll
wait_for() {
	local secs=$1 what=$2 deadline
	shift 2
	deadline=$(($(now_ms) + secs * 1000))
	until "$@" >/dev/null 2>&1; do
		[ "$(now_ms)" -lt "$deadline" ] || fail "timed out after $secs s waiting for $what"
		sleep 0.2
	done
}

workload() {
	cat <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: $NS}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: node-app, namespace: $NS}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: node-app, namespace: $NS}
spec:
  selector: {matchLabels: {app: node-app}}
  template:
    metadata: {labels: {app: node-app}}
    spec:
      serviceAccountName: node-app
      priorityClassName: system-node-critical
      tolerations: [{operator: Exists}]
      securityContext:
        fsGroup: 65532
        seccompProfile: {type: RuntimeDefault}
      containers:
      - name: app
        image: localhost/tether-test/node-app:1
        imagePullPolicy: Never
        command: [/node-app, serve]
        env: [{name: PORT, value: "8080"}]
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
        livenessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 10}
        resources:
          requests: {cpu: 10m, memory: 16Mi}
          limits: {memory: 64Mi}
        securityContext: &hardened
          runAsUser: 65532
          runAsGroup: 65532
          runAsNonRoot: true
          readOnlyRootFilesystem: true
          allowPrivilegeEscalation: false
          capabilities: {drop: [ALL]}
          seccompProfile: {type: RuntimeDefault}
        volumeMounts:
        - {name: konnectivity-agent-token, mountPath: /var/run/secrets/tokens, readOnly: true}
        - {name: work, mountPath: /work}
      - name: ticker
        image: localhost/tether-test/node-app:1
        imagePullPolicy: Never
        command: [/node-app, log-every, 100ms]
        securityContext: *hardened
      - name: echo
        image: localhost/tether-test/node-app:1
        imagePullPolicy: Never
        command: [/node-app, cat]
        stdin: true
        securityContext: *hardened
      volumes:
      - name: konnectivity-agent-token
        projected:
          sources:
          - serviceAccountToken: {path: konnectivity-agent-token, audience: system:konnectivity-server, expirationSeconds: 3600}
      - name: work
        emptyDir: {sizeLimit: 16Mi}
EOF
}

# The DaemonSet's pod, Ready with its container started at or after MS.
pod_ready_since() {
	local out name ready started
	out=$(k get pods -l app=node-app -o jsonpath='{range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status} {.status.containerStatuses[0].state.running.startedAt}{"\n"}{end}') || return 1
	read -r name ready started <<<"$out"
	[ "$ready" = True ] && [ -n "$started" ] && [ $(($(date -d "$started" +%s) * 1000)) -ge $(($1 / 1000 * 1000)) ] || return 1
	echo "$name"
}

jwt_payload() { # jwt_payload TOKEN: the JSON payload
	local p
	p=$(cut -d. -f2 <<<"$1" | tr '_-' '/+')
	while [ $((${#p} % 4)) != 0 ]; do p+="="; done
	base64 -d <<<"$p"
}

check_cycle() { # check_cycle cold|warm
	local kind=$1 t0 t_up t_apply pod t_pod out token review ip tmp
	say "--- $kind start"
	t0=$(now_ms)
	node up
	t_up=$(secs_since "$t0")
	local timings
	timings=$(cat "$W/run/timings")
	node import "$images/node-app.tar" >/dev/null
	t_apply=$(now_ms)
	workload | node kubectl apply -f - >/dev/null
	wait_for 90 "the node-app DaemonSet pod Ready" pod_ready_since "$t0"
	pod=$(pod_ready_since "$t0")
	t_pod="$(secs_since "$t0") s after the start, $(secs_since "$t_apply") s after import and apply"
	say "$kind: up $t_up s ($timings), DaemonSet pod $pod Ready $t_pod"

	out=$(k exec "$pod" -- /node-app id)
	say "id: $out"
	for want in uid=65532 gid=65532 NoNewPrivs=1 Seccomp=2 CapEff=0000000000000000 rootfs-writable=false; do
		[[ " $out " == *" $want "* ]] || fail "securityContext: want $want in: $out"
	done

	token=$(k exec "$pod" -- /node-app cat-file /var/run/secrets/tokens/konnectivity-agent-token)
	out=$(jwt_payload "$token")
	[[ $out == *'"aud":["system:konnectivity-server"]'* ]] || fail "projected token audience: $out"
	[[ $out == *"\"sub\":\"system:serviceaccount:$NS:node-app\""* ]] || fail "projected token subject: $out"
	review=$(node kubectl create -o jsonpath='{.status.authenticated} {.status.audiences}' -f - <<EOF
{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
 "spec": {"token": "$token", "audiences": ["system:konnectivity-server"]}}
EOF
	)
	[[ $review == 'true ["system:konnectivity-server"]' ]] || fail "TokenReview of the projected token: $review"
	say "projected token: audience system:konnectivity-server, TokenReview authenticated"

	out=$(k logs "$pod")
	[[ $out == *"node-app serving on :8080"* ]] || fail "kubectl logs: no start line in: $out"

	local word=stdin-$RANDOM-$RANDOM
	out=$(printf '%s\n' "$word" | k exec -i "$pod" -- /node-app cat)
	[ "$out" = "$word" ] || fail "exec -i: sent $word, got: $out"

	out=$(node run bash -c "
		kubectl -n $NS port-forward pod/$pod 18080:8080 >/dev/null 2>&1 & pf=\$!
		trap 'kill \$pf 2>/dev/null; wait \$pf 2>/dev/null' EXIT
		for _ in \$(seq 100); do curl -sf --max-time 2 http://127.0.0.1:18080/ && exit 0; sleep 0.1; done
		exit 1") || fail "port-forward: no answer on 127.0.0.1:18080 within 10 s"
	[[ $out == "hello from node-app on $pod"* ]] || fail "port-forward: answer: $out"
	wait_for 10 "the port-forwarded request in kubectl logs" bash -c "'$here/node.sh' kubectl -n $NS logs $pod | grep -q 'request GET / from 127.0.0.1'"
	# logs -f: numbered ticks, consecutive, from a follow cut after 2 s
	local rc=0 ticks
	out=$(node run timeout 2 kubectl -n "$NS" logs -f --tail=1 "$pod" -c ticker) || rc=$?
	[ "$rc" = 0 ] || [ "$rc" = 124 ] || fail "kubectl logs -f: exit status $rc"
	ticks=$(awk '$1 == "tick" { if (last && $2 != last + 1) gap = 1; last = $2; n++ } END { print gap ? "a gap" : n + 0 }' <<<"$out")
	if ! [[ $ticks =~ ^[0-9]+$ ]] || [ "$ticks" -lt 5 ]; then
		fail "kubectl logs -f: want >= 5 consecutive ticks in 2 s, got $ticks: $out"
	fi
	# attach -i: a line to the echo container's stdin comes back on its stdout. stdin stays open
	# until it has (at most 5 s): kubectl attach ends at stdin's EOF, before the echo arrives.
	local echoed
	echoed=$(mktemp)
	rc=0
	node run timeout 8 bash -c "{ printf '%s\n' '$word'
		for _ in \$(seq 50); do grep -q '$word' '$echoed' && break; sleep 0.1; done
	} | kubectl -n $NS attach -i $pod -c echo >'$echoed' 2>/dev/null" || rc=$?
	out=$(cat "$echoed")
	rm -f "$echoed"
	[ "$rc" = 0 ] || fail "kubectl attach -i: exit status $rc"
	[[ $out == *"$word"* ]] || fail "kubectl attach -i: sent $word, got: $out"
	say "kubectl logs, logs -f ($ticks ticks), exec -i, attach -i, port-forward: ok"

	tmp=$(mktemp -d)
	mkdir -p "$tmp/in/sub"
	head -c 100000 /dev/urandom >"$tmp/in/blob"
	echo "$word" >"$tmp/in/sub/note"
	# a directory of its own per start: the emptyDir outlives a warm restart (same pod)
	k cp "$tmp/in" "$pod:/work/$kind" >/dev/null
	out=$(k exec "$pod" -- /node-app cat-file "/work/$kind/sub/note")
	[ "$out" = "$word" ] || { rm -rf "$tmp"; fail "kubectl cp into the pod: /work/$kind/sub/note is: $out"; }
	k cp "$pod:/work/$kind" "$tmp/out" >/dev/null
	diff -r "$tmp/in" "$tmp/out" >/dev/null || { diff -r "$tmp/in" "$tmp/out" || true; rm -rf "$tmp"; fail "kubectl cp out of the pod: trees differ"; }
	rm -rf "$tmp"
	say "kubectl cp into and out of the pod: ok"

	ip=$(k get pod "$pod" -o jsonpath='{.status.podIP}')
	out=$(node run curl -sf --max-time 5 "http://$ip:8080/") || fail "pod IP $ip:8080 over the CNI bridge: no answer"
	out=$(k exec "$pod" -- /node-app whoami)
	[[ $out == "201 Created system:serviceaccount:$NS:node-app via https://198.18.16.1:443/"* ]] || fail "in-cluster API through the kubernetes Service: $out"
	say "pod IP $ip over the bridge, in-cluster API: $out"

	node status | grep 'RSS total'
	summary+=("$kind: up $t_up s ($timings), DaemonSet pod Ready $t_pod")
	node down
}

summary=()
node clean >/dev/null
check_cycle cold
check_cycle warm
pidns=$(cat "$W/run/pidns")
node clean

say "--- nothing left"
[ ! -e /run/netns/tether-node ] || fail "netns tether-node still there"
[ ! -e "$W" ] || fail "work dir $W still there"
if grep -q " ${W%/}/" < <(cat /proc/[0-9]*/mountinfo 2>/dev/null || true); then fail "a mount under $W in some process's mount namespace"; fi
for p in /proc/[0-9]*; do
	[ "$(readlink "$p/ns/pid" 2>/dev/null)" != "$pidns" ] || fail "process ${p#/proc/} of the node still running"
done
for h in /sys/fs/cgroup/*/; do [ ! -d "${h}kubepods" ] || fail "cgroup ${h}kubepods still there"; done
host_dirs_after=$(for d in /var/lib/kubelet /var/log/containers /var/lib/cni /run/containerd /etc/kubernetes; do [ -e "$d" ] && echo "$d"; done || true)
[ "$host_dirs_after" = "$host_dirs_before" ] || fail "host dirs differ: before [$host_dirs_before], after [$host_dirs_after]"
[ "$(nft list tables)" = "$nft_before" ] || fail "host nft tables changed: $(nft list tables)"
say "no process, netns, mount, cgroup, work dir, host dir or nft table of the node left"
trap - EXIT
printf 'smoke: %s\n' "${summary[@]}"
say "PASS in $(secs_since "$t_total") s"
