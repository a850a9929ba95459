package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
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
	// checks are this variant's own, run after the common flows while the workloads run.
	checks []variantCheck
}

// variantCheck is a check that only some installations make; the others show n/a.
type variantCheck struct {
	name string
	run  func(context.Context) (string, error)
}

// Checks of one variant each.
const (
	checkNonRootAdvice = "without the root line: the error names uid 65532 and the fix (B3)"
	checkOneServerDown = "one of two servers down: agents and kube-apiserver stay Ready, webhooks pass (A8)"
	checkServerRollout = "server rollout finishes, the agent back on every server (B1)"
)

// variantCheckNames are every variant's checks, in report order.
var variantCheckNames = []string{checkNonRootAdvice, checkOneServerDown, checkServerRollout}

// installations are the rows, in order: tether as its README says, with token and with mTLS
// agents, tether's image in the kubernetes.io task's manifests (the drop-in claim), and
// upstream's images as the reference.
func (e *env) installations() []installation {
	task := func(server, agent string) func(context.Context) error {
		return func(ctx context.Context) error { return e.installTaskManifests(ctx, server, agent) }
	}
	return []installation{
		{"tether", "tether's chart as the README says: `helm install` (agents with ServiceAccount tokens, RBAC), " +
			"then the server's static Pod from `helm template --set nodeManifests=true` into /etc/kubernetes/manifests",
			e.installTether, e.uninstallTether, nil},
		{"tether, mTLS agents", "the same with `auth.mode=mtls`: agents present a client certificate from Secret " +
			"tether-agent-tls, checked against the agents' CA on the node (`server.hostFiles.clusterCaCert`); " +
			"`agent.identifiers=\"\"` and `server.proxyStrategies=default`, since one certificate for every agent proves no node",
			e.installTetherMTLS, e.uninstallTetherMTLS, nil},
		{"tether sidecar", "the chart with `server.kind=sidecar`: `helm install`, then the node document (a strategic-merge " +
			"patch) applied to kube-apiserver's static Pod with `kubectl patch --local`, as the book says",
			e.installTetherSidecar, e.uninstallTetherSidecar, nil},
		{"tether hosted", "two installs as the book's hosted variant: the servers' release (`server.kind=deployment`, " +
			"`server.count=2`, `agent.enabled=false`), then the agents' (`server.kind=none`, `agent.proxyServerHost` = the " +
			"servers' agent Service); kube-apiserver's egress selector over HTTP CONNECT with mTLS to the frontend Service",
			e.installTetherHosted, e.uninstallTetherHosted, []variantCheck{
				{checkOneServerDown, e.oneServerDown}, {checkServerRollout, e.serverRollout}}},
		{"tether drop-in", "the kubernetes.io task's manifests with only the images swapped for tether's " +
			"plus the one line the book's install guide documents, `securityContext: {runAsUser: 0, runAsGroup: 0}`: " +
			"both images run as uid 65532, which cannot read kubeadm's root-only apiserver.key; the B3 check runs it without that line",
			task(e.images.tether, e.images.tether), e.uninstallTaskManifests,
			[]variantCheck{{checkNonRootAdvice, e.nonRootAdvice}}},
		{"upstream", "the kubernetes.io task's manifests with upstream's images (the reference)",
			task(e.images.upstreamServer, e.images.upstreamAgent), e.uninstallTaskManifests, nil},
	}
}

// row is one implementation installed on the node, and every check made with it.
type row struct {
	impl   string
	how    string // how it was installed, for the report
	checks checks.List
	// variant names the variant checks this installation makes.
	variant map[string]bool
	err     error // the install failed: no flows ran
}

// run records one check and prints it.
func (r *row) run(name string, f func() (string, error)) { r.checks.Run(22, name, f) }

func (r *row) result(name string) string {
	switch c, ran := r.checks.Find(name); {
	case !ran && slices.Contains(variantCheckNames, name) && !r.variant[name]:
		return "n/a"
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
	r := &row{impl: in.name, how: in.how, variant: map[string]bool{}}
	for _, c := range in.checks {
		r.variant[c.name] = true
	}
	fmt.Printf("\n== %s\n", in.name)
	if r.err = in.install(ctx); r.err != nil {
		fmt.Printf("   install FAILED: %v\n", r.err)
	} else {
		e.runFlows(ctx, r, in.checks)
	}
	r.run("uninstall leaves nothing", func() (string, error) { return "", in.uninstall(ctx) })
	return r
}

// loopbackMetricsURL is the proxy server's metrics page when it runs with hostNetwork (a static
// Pod or kube-apiserver's sidecar): both implementations serve it on the health port.
const loopbackMetricsURL = "http://127.0.0.1:8134/metrics"

var httpClient = &http.Client{Timeout: 5 * time.Second}

// serverMetricsURLs are the metrics pages of every proxy server: the node's loopback, or with
// e.serverPods set (servers in a Deployment) each of those pods' addresses, read anew each time
// since pods come and go.
func (e *env) serverMetricsURLs(ctx context.Context) ([]string, error) {
	if e.serverPods == "" {
		return []string{loopbackMetricsURL}, nil
	}
	r := e.kube.Cmd(ctx, 10*time.Second, "get", "pods", "-n", "kube-system", "-l", e.serverPods,
		"--field-selector=status.phase=Running", "-o", "jsonpath={.items[*].status.podIP}").Run()
	if r.Err != nil {
		return nil, fmt.Errorf("listing the servers' pods: %v: %s", r.Err, strings.TrimSpace(r.Stderr))
	}
	var urls []string
	for _, ip := range strings.Fields(r.Stdout) {
		urls = append(urls, "http://"+ip+":8134/metrics")
	}
	if len(urls) == 0 {
		return nil, fmt.Errorf("no running server pod (%s)", e.serverPods)
	}
	return urls, nil
}

// metricSum adds up every sample of name whose labels include all of want (`k="v"` pairs), over
// every server that answers; it fails when none does.
func (e *env) metricSum(name string, want ...string) (float64, error) {
	urls, err := e.serverMetricsURLs(context.Background())
	if err != nil {
		return 0, err
	}
	var sum float64
	var errs []error
	for _, url := range urls {
		v, err := scrape(url, name, want...)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		sum += v
	}
	if len(errs) == len(urls) {
		return 0, errors.Join(errs...)
	}
	return sum, nil
}

func scrape(url, name string, want ...string) (float64, error) {
	resp, err := httpClient.Get(url)
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
func (e *env) agentData() float64 {
	v, _ := e.metricSum("konnectivity_network_proxy_server_stream_packets_total",
		`segment="from_agent"`, `packet_type="DATA"`)
	return v
}

// crossed runs f and checks that its bytes went through the proxy.
func (e *env) crossed(f func() (string, error)) func() (string, error) {
	return func() (string, error) {
		before := e.agentData()
		detail, err := f()
		if err != nil {
			return detail, err
		}
		var after float64
		err = waitFor(context.Background(), "DATA from the agent through the server", 5*time.Second, func() error {
			if after = e.agentData(); after <= before {
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
