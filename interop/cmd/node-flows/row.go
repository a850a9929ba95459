package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"tether.dev/interop/internal/checks"
	"tether.dev/interop/internal/metrics"
)

// installation is one way of putting a Konnectivity implementation on the node: a report row.
type installation struct {
	name      string
	how       string // for the report
	install   func(context.Context) error
	uninstall func(context.Context) error
}

// installations are the rows, in order: tether as its README says, tether's image in the
// kubernetes.io task's manifests (the drop-in claim), and upstream's images as the reference.
func (e *env) installations() []installation {
	task := func(server, agent string) func(context.Context) error {
		return func(ctx context.Context) error { return e.installTaskManifests(ctx, server, agent) }
	}
	return []installation{
		{"tether", "tether's chart as the README says: `helm install` (agents with ServiceAccount tokens, RBAC), " +
			"then the server's static Pod from `helm template --set nodeManifests=true` into /etc/kubernetes/manifests",
			e.installTether, e.uninstallTether},
		{"tether drop-in", "the kubernetes.io task's manifests with only the images swapped for tether's " +
			"(plus the task's documented root line, see the uid note above)",
			task(e.images.tether, e.images.tether), e.uninstallTaskManifests},
		{"upstream", "the kubernetes.io task's manifests with upstream's images (the reference)",
			task(e.images.upstreamServer, e.images.upstreamAgent), e.uninstallTaskManifests},
	}
}

// row is one implementation installed on the node, and every check made with it.
type row struct {
	impl   string
	how    string // how it was installed, for the report
	checks checks.List
	err    error // the install failed: no flows ran
}

// run records one check and prints it.
func (r *row) run(name string, f func() (string, error)) { r.checks.Run(22, name, f) }

func (r *row) result(name string) string {
	switch c, ran := r.checks.Find(name); {
	case !ran:
		return "not run"
	case c.Err != nil:
		return "FAIL"
	default:
		return "ok"
	}
}

// runRow installs, runs every flow through the installation, and removes it again.
func (e *env) runRow(ctx context.Context, in installation) *row {
	r := &row{impl: in.name, how: in.how}
	fmt.Printf("\n== %s\n", in.name)
	if r.err = in.install(ctx); r.err != nil {
		fmt.Printf("   install FAILED: %v\n", r.err)
	} else {
		e.runFlows(ctx, r)
	}
	r.run("uninstall leaves nothing", func() (string, error) { return "", in.uninstall(ctx) })
	return r
}

// serverMetrics is the proxy server's metrics page (both implementations serve it on the health
// port, on the node's loopback: the server runs with hostNetwork).
const serverMetricsURL = "http://127.0.0.1:8134/metrics"

var httpClient = &http.Client{Timeout: 5 * time.Second}

// metricSum adds up every sample of name whose labels include all of want (`k="v"` pairs).
func metricSum(name string, want ...string) (float64, error) {
	resp, err := httpClient.Get(serverMetricsURL)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return metrics.Sum(io.LimitReader(resp.Body, 16<<20), name, want...)
}

// waitFor polls cond every 250 ms until it returns nil or d passes; the error says what was
// waited for and the last reason it was not so.
func waitFor(ctx context.Context, what string, d time.Duration, cond func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s: not so after %v: %v", what, d, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// agentData is how many DATA packets the server has forwarded from agents: a flow that went
// through the proxy moves it.
func agentData() float64 {
	v, _ := metricSum("konnectivity_network_proxy_server_stream_packets_total",
		`segment="from_agent"`, `packet_type="DATA"`)
	return v
}

// crossed runs f and checks that its bytes went through the proxy.
func crossed(f func() (string, error)) func() (string, error) {
	return func() (string, error) {
		before := agentData()
		detail, err := f()
		if err != nil {
			return detail, err
		}
		var after float64
		err = waitFor(context.Background(), "DATA from the agent through the server", 5*time.Second, func() error {
			if after = agentData(); after <= before {
				return fmt.Errorf("%s{segment=from_agent,packet_type=DATA} still %v", "konnectivity_network_proxy_server_stream_packets_total", after)
			}
			return nil
		})
		if err != nil {
			return detail, err
		}
		return strings.TrimSpace(fmt.Sprintf("%s DATA from agent +%v", detail, after-before)), nil
	}
}
