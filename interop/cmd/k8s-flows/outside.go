package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// outside holds the flows kube-apiserver refuses for loopback addresses ("address not
// allowed"): nodes/proxy to a node on a non-loopback IP, pods/proxy to a pod IP, and
// services/proxy to an EndpointSlice address. They run only inside a network namespace the
// caller created (run.sh), whose only addresses besides loopback are in 198.18.0.0/15, so
// nothing leaves it.
type outside struct {
	nodeIP      string
	podCIDR     netip.Prefix // node-c's pod IPs (kwok --cidr); the backends listen on each
	backendPort int
	webhookPort int
	webhookCA   []byte // PEM of the webhook's self-signed certificate, its caBundle
}

// benchmarking is 198.18.0.0/15 (RFC 2544): never routed on the Internet.
var benchmarking = netip.MustParsePrefix("198.18.0.0/15")

func newOutside(spec string) (*outside, error) {
	nodeIP, cidr, ok := strings.Cut(spec, ",")
	if !ok {
		return nil, fmt.Errorf("%q: want NODE_IP,POD_CIDR", spec)
	}
	a, err := netip.ParseAddr(nodeIP)
	if err != nil || !benchmarking.Contains(a) {
		return nil, fmt.Errorf("%q: not an address in %v", nodeIP, benchmarking)
	}
	p, err := netip.ParsePrefix(cidr)
	if err != nil || !benchmarking.Contains(p.Addr()) || p.Bits() < 24 || p.Bits() > 30 || p.Contains(a) {
		return nil, fmt.Errorf("%q: want a /24../30 in %v without the node IP", cidr, benchmarking)
	}
	return &outside{nodeIP: nodeIP, podCIDR: p.Masked()}, nil
}

const backendBody = "pod-backend-ok\n"

// start serves backendBody on every address of podCIDR, so that whichever IP kwok gives
// pod-c answers there (the addresses must be local: the namespace holds each of them).
func (o *outside) start() error {
	var hosts []string
	for a := o.podCIDR.Addr(); o.podCIDR.Contains(a); a = a.Next() {
		hosts = append(hosts, a.String())
	}
	o.backendPort = freePort(hosts...)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(backendBody))
	})}
	for _, h := range hosts {
		ln, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(o.backendPort)))
		if err != nil {
			return fmt.Errorf("backend on %s (is this running in the network namespace?): %w", h, err)
		}
		go func() { _ = srv.Serve(ln) }()
	}
	return o.startWebhook(hosts)
}

// objects is two selector-less Services (the backend, the webhook); their EndpointSlices come
// once pod-c has its IP.
func (o *outside) objects() string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: backend
  namespace: default
spec:
  ports:
  - {name: http, port: 80, targetPort: %d, protocol: TCP}
---
apiVersion: v1
kind: Service
metadata:
  name: webhook
  namespace: default
spec:
  ports:
  - {name: https, port: 443, targetPort: %d, protocol: TCP}
---
`, o.backendPort, o.webhookPort)
}

// endpointSlice points Service svc at pod-c's port (services/proxy only proxies to endpoints
// whose targetRef is a pod with that IP).
func endpointSlice(svc, portName string, port int, podIP string) string {
	return fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[1]s-1
  namespace: default
  labels: {kubernetes.io/service-name: %[1]s}
addressType: IPv4
ports:
- {name: %[2]s, port: %[3]d, protocol: TCP}
endpoints:
- addresses: ["%[4]s"]
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: default, name: pod-c}
`, svc, portName, port, podIP)
}

var outsideFlowNames = []string{"nodes/proxy (node-c)", "pods/proxy (pod-c)", "services/proxy (EndpointSlice)", "admission webhook (Service)",
	"aggregated API (APIService)", "webhook, agent gone: Fail", "webhook, agent gone: Ignore"}

func (e *env) runOutsideFlows(ctx context.Context, r *row, c *cluster, p *proxy) {
	o := e.outside
	r.run("nodes/proxy (node-c)", crossed(p, func() (string, error) {
		res := e.kubectl(ctx, c, 30*time.Second, "get", "--raw", "/api/v1/nodes/node-c/proxy/healthz").run()
		if res.err != nil {
			return "", fmt.Errorf("%s: %s", describe(res), strings.TrimSpace(res.stderr))
		}
		if got := strings.TrimSpace(res.stdout); got != "ok" {
			return "", fmt.Errorf("kwok's /healthz through nodes/proxy: %q, want ok", got)
		}
		return "", nil
	}))
	res := e.kubectl(ctx, c, 30*time.Second, "get", "pod", "pod-c", "-o", "jsonpath={.status.podIP}").run()
	podIP := strings.TrimSpace(res.stdout)
	if a, err := netip.ParseAddr(podIP); res.err != nil || err != nil || !o.podCIDR.Contains(a) {
		r.run("pods/proxy (pod-c)", func() (string, error) {
			return "", fmt.Errorf("pod-c's IP %q (%v %s) is not in %v", podIP, res.err, res.stderr, o.podCIDR)
		})
		return
	}
	r.run("pods/proxy (pod-c)", crossed(p, func() (string, error) {
		return "", e.wantBody(ctx, c, fmt.Sprintf("/api/v1/namespaces/default/pods/pod-c:%d/proxy/", o.backendPort))
	}))
	r.run("services/proxy (EndpointSlice)", crossed(p, func() (string, error) {
		if res := e.kubectl(ctx, c, 30*time.Second, "apply", "-f", "-").withStdin(endpointSlice("backend", "http", o.backendPort, podIP)).run(); res.err != nil {
			return "", fmt.Errorf("create EndpointSlice: %v: %s", res.err, res.stderr)
		}
		// kube-apiserver reads EndpointSlices from an informer: allow it to catch up.
		deadline := time.Now().Add(15 * time.Second)
		for {
			err := e.wantBody(ctx, c, "/api/v1/namespaces/default/services/backend:http/proxy/")
			if err == nil || time.Now().After(deadline) || !strings.Contains(err.Error(), "no endpoints available") {
				return "", err
			}
			time.Sleep(200 * time.Millisecond)
		}
	}))
	r.run("admission webhook (Service)", crossed(p, func() (string, error) {
		return "", e.webhookFlow(ctx, c, podIP)
	}))
	tag := strings.ReplaceAll(p.name, " ", "-")
	r.run("aggregated API (APIService)", crossed(p, func() (string, error) {
		return e.aggregatedFlow(ctx, c, podIP, tag)
	}))
	// Last: it stops the agent (and starts it again).
	e.runAgentGoneFlows(ctx, r, c, p, tag)
}

// wantBody GETs path through kube-apiserver and wants the backend's body.
func (e *env) wantBody(ctx context.Context, c *cluster, path string) error {
	res := e.kubectl(ctx, c, 30*time.Second, "get", "--raw", path).run()
	if res.err != nil {
		return fmt.Errorf("%s: %s", describe(res), strings.TrimSpace(res.stderr))
	}
	if res.stdout != backendBody {
		return fmt.Errorf("GET %s: body %q, want %q", path, res.stdout, backendBody)
	}
	return nil
}
