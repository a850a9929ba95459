package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// reverseFlowNames are tether's node → API server flows: kubectl on the node side talks to the
// agent's --control-plane-listen port, and the agent carries the connection through its tunnel
// to the server, which dials kube-apiserver (its only --control-plane-endpoints entry). The
// streams of logs -f and exec then come back from kube-apiserver to the kubelet through the same
// proxy's forward direction.
var reverseFlowNames = []string{"get (node → API server)", "logs -f (node → API server)", "exec (node → API server)"}

const reverseDialsMetric = "tether_server_control_plane_dials_total"

// runReverseFlows runs the reverse flows through p (tether only: upstream has no reverse
// direction, and its rows show the flows as not run).
func (e *env) runReverseFlows(ctx context.Context, r *row, c *cluster, p *proxy) {
	if p.controlPlanePort == 0 {
		return
	}
	server := fmt.Sprintf("--server=https://127.0.0.1:%d", p.controlPlanePort)
	r.run("get (node → API server)", reversed(p, func() (string, error) {
		res := e.kubectl(ctx, c, 30*time.Second, server, "get", "pods", "-o", "name").run()
		if res.err != nil {
			return "", fmt.Errorf("%s: %s", describe(res), strings.TrimSpace(res.stderr))
		}
		if !strings.Contains(res.stdout, "pod/pod-a") {
			return "", fmt.Errorf("stdout %q lacks pod/pod-a", res.stdout)
		}
		return "", nil
	}))
	r.run("logs -f (node → API server)", reversed(p, func() (string, error) {
		return "", e.followLogs(ctx, c, "reverse-appended-"+strings.ReplaceAll(p.name, " ", "-"), server)
	}))
	r.run("exec (node → API server)", reversed(p, func() (string, error) {
		return "", e.execEcho(ctx, c, server)
	}))
}

// reversed runs f and checks that kubectl's connection went the reverse way: the server
// counted a connected reverse dial meanwhile (kubectl opens a new connection per command).
func reversed(p *proxy, f func() (string, error)) func() (string, error) {
	return func() (string, error) {
		before, _ := metricSum(p.metricsURL(), reverseDialsMetric, `result="connected"`)
		detail, err := f()
		if err != nil {
			return detail, err
		}
		after, err := waitMetricAtLeast(p.metricsURL(), reverseDialsMetric, before+1, 5*time.Second, `result="connected"`)
		if err != nil {
			return detail, fmt.Errorf("no reverse dial through the proxy: %v", err)
		}
		return strings.TrimSpace(detail + fmt.Sprintf(" reverse dials +%v", after-before)), nil
	}
}
