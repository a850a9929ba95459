package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// shape is one of the three egress transports kube-apiserver supports for the cluster selection.
type shape struct {
	name, mode, transport string // mode grpc | http-connect; transport uds | tcp
}

var shapes = []shape{
	{"gRPC over UDS", "grpc", "uds"},
	{"HTTP CONNECT over UDS", "http-connect", "uds"},
	{"HTTP CONNECT over mTLS TCP", "http-connect", "tcp"},
}

// proxy is one proxy server with its agent, tether's or upstream's, started with the same
// upstream flags (tether is invoked as proxy-server/proxy-agent).
type proxy struct {
	impl, name    string
	auth          string // mtlsAuth or tokenAuth: how the server authenticates its agent
	server, agent *proc
	health        int // server's health port (/metrics)
	agentPort     int
	agentAuthArgs []string // the agent's flags for auth
	// controlPlanePort is where a tether agent listens for node-side clients of the API
	// server (--control-plane-listen); 0 for upstream, which has no reverse direction.
	controlPlanePort int
	// tokenReviews is the API server's TokenReview count when the server started (token
	// mode), to show that admitting the agent took a review.
	tokenReviews float64
}

func (p *proxy) metricsURL() string { return fmt.Sprintf("http://127.0.0.1:%d/metrics", p.health) }

// egress is where kube-apiserver's egress selector sends the cluster selection in one shape:
// its configuration file and the server flags that make a proxy server listen there. Both
// servers of a shape (mTLS, then token mode) listen at the same place, one after the other.
type egress struct {
	file       string // EgressSelectorConfiguration for kube-apiserver
	serverArgs []string
	apiPort    int // kube-apiserver's port: tether's servers allowlist it for reverse dials
}

// egressFor chooses the socket or port for shape sh and writes kube-apiserver's
// configuration for it.
func (e *env) egressFor(sh shape, name string) (egress, error) {
	ep := egress{serverArgs: []string{"--mode=" + sh.mode}}
	var conn string
	switch sh.transport {
	case "uds":
		uds := filepath.Join(e.work, "s", name+".sock")
		// The second server of the shape binds the path the first one used.
		ep.serverArgs = append(ep.serverArgs, "--uds-name="+uds, "--delete-existing-uds-file", "--server-port=0")
		proto := map[string]string{"grpc": "GRPC", "http-connect": "HTTPConnect"}[sh.mode]
		conn = "    proxyProtocol: " + proto + "\n    transport:\n      uds:\n        udsName: " + uds + "\n"
	case "tcp":
		port := freePort()
		ep.serverArgs = append(ep.serverArgs, "--server-bind-address=127.0.0.1", "--server-port="+strconv.Itoa(port),
			"--server-cert="+e.pki("server.crt"), "--server-key="+e.pki("server.key"),
			"--server-ca-cert="+e.pki("ca.crt"))
		conn = fmt.Sprintf("    proxyProtocol: HTTPConnect\n    transport:\n      tcp:\n        url: https://127.0.0.1:%d\n"+
			"        tlsConfig:\n          caBundle: %s\n          clientCert: %s\n          clientKey: %s\n",
			port, e.pki("ca.crt"), e.pki("client.crt"), e.pki("client.key"))
	}
	ep.file = filepath.Join(e.work, name+"-egress.yaml")
	return ep, os.WriteFile(ep.file, []byte("apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\n"+
		"egressSelections:\n- name: cluster\n  connection:\n"+conn), 0o644)
}

// startServer starts impl's server at ep. With tok nil its agent authenticates with mTLS
// (--cluster-ca-cert); otherwise with a ServiceAccount token that the server checks with a
// TokenReview, as in the kubernetes.io task "Set up Konnectivity service".
func (e *env) startServer(impl string, ep egress, tok *tokens, c *cluster, name string) (*proxy, error) {
	p := &proxy{impl: impl, name: name, auth: mtlsAuth, health: freePort(), agentPort: freePort()}
	args := append([]string{}, ep.serverArgs...)
	args = append(args,
		"--agent-bind-address=127.0.0.1", "--agent-port="+strconv.Itoa(p.agentPort),
		"--health-bind-address=127.0.0.1", "--health-port="+strconv.Itoa(p.health),
		"--admin-bind-address=127.0.0.1", "--admin-port="+strconv.Itoa(freePort()),
		"--cluster-cert="+e.pki("server.crt"), "--cluster-key="+e.pki("server.key"),
		"--server-count=1", "--server-id="+name, "-v=2")
	if impl == tether {
		// Reverse dials (node → API server) may reach this control plane's API server only.
		args = append(args, fmt.Sprintf("--control-plane-endpoints=127.0.0.1:%d", ep.apiPort))
		p.controlPlanePort = freePort()
		// A killed agent cannot say it is gone: the server keeps its streams' connections
		// for it to resume them, --resume-window (30 s by default). The kill cases read the
		// outcome within 10 s, so the window is kept short here (stated in the report).
		args = append(args, "--resume-window="+killResumeWindow)
	}
	if tok == nil {
		args = append(args, "--cluster-ca-cert="+e.pki("ca.crt"))
		p.agentAuthArgs = []string{"--agent-cert=" + e.pki("agent.crt"), "--agent-key=" + e.pki("agent.key")}
	} else {
		p.auth = tokenAuth
		args = append(args, "--agent-namespace="+agentNamespace, "--agent-service-account="+agentServiceAccount,
			"--authentication-audience="+agentAudience, "--kubeconfig="+tok.serverKubeconfig)
		p.agentAuthArgs = []string{"--service-account-token-path=" + tok.agentToken}
		var err error
		if p.tokenReviews, err = e.tokenReviews(c); err != nil {
			return p, err
		}
	}
	var err error
	if p.server, err = e.ps.start(name+"-server", e.proxyBin(impl, "proxy-server"), args...); err != nil {
		return p, err
	}
	if err := waitStatus(fmt.Sprintf("http://127.0.0.1:%d/healthz", p.health), 200, 30*time.Second); err != nil {
		return p, fmt.Errorf("%s server: %v\n%s", name, err, p.server.tail(20))
	}
	return p, nil
}

// startAgent starts (or restarts, after a kill) p's agent and waits until the server counts it;
// in token mode, also until the API server has answered a TokenReview for it.
func (e *env) startAgent(p *proxy, c *cluster) error {
	health := freePort()
	args := append([]string{
		"--proxy-server-host=127.0.0.1", "--proxy-server-port=" + strconv.Itoa(p.agentPort),
		"--ca-cert=" + e.pki("ca.crt")}, p.agentAuthArgs...)
	args = append(args,
		"--health-server-host=127.0.0.1", "--health-server-port="+strconv.Itoa(health),
		"--admin-bind-address=127.0.0.1", "--admin-server-port="+strconv.Itoa(freePort()),
		"--agent-id="+p.name+"-agent", "--sync-interval=200ms", "--sync-interval-cap=1s", "-v=2")
	if p.controlPlanePort != 0 {
		args = append(args, fmt.Sprintf("--control-plane-listen=127.0.0.1:%d", p.controlPlanePort))
	}
	var err error
	p.agent, err = e.ps.start(p.name+"-agent", e.proxyBin(p.impl, "proxy-agent"), args...)
	if err != nil {
		return err
	}
	if err := waitStatus(fmt.Sprintf("http://127.0.0.1:%d/readyz", health), 200, 30*time.Second); err != nil {
		return fmt.Errorf("%s agent: %v\n%s", p.name, err, p.agent.tail(20))
	}
	if _, err := waitMetricAtLeast(p.metricsURL(), "konnectivity_network_proxy_server_ready_backend_connections", 1, 30*time.Second); err != nil {
		return fmt.Errorf("%s: agent not counted by the server: %v", p.name, err)
	}
	if p.auth == tokenAuth {
		n, err := e.tokenReviews(c)
		if err != nil {
			return err
		}
		if n <= p.tokenReviews {
			return fmt.Errorf("%s: the agent was admitted without a TokenReview (the API server counts %v, as before)", p.name, n)
		}
	}
	return nil
}

func (p *proxy) stop() {
	for _, q := range []*proc{p.agent, p.server} {
		if q != nil {
			q.stop()
		}
	}
}

// dials is the server's count of dials to agents (upstream's metric, which tether keeps).
func (p *proxy) dials() float64 {
	v, _ := metricSum(p.metricsURL(), "konnectivity_network_proxy_server_dial_duration_seconds_count")
	return v
}

const packetsMetric = "konnectivity_network_proxy_server_stream_packets_total"

var fromAgentData = []string{`segment="from_agent"`, `packet_type="DATA"`}

// agentData is the server's count of DATA packets received from agents.
func (p *proxy) agentData() float64 {
	v, _ := metricSum(p.metricsURL(), packetsMetric, fromAgentData...)
	return v
}
