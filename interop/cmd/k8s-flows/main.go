// k8s-flows runs kubectl 1.37.2 against a real kube-apiserver 1.37.2 whose egress selector
// sends kubelet traffic through a proxy server and agent (tether's, then upstream's for
// reference) to kwok fake kubelets, all on loopback and Unix sockets in -work:
//
//	etcd -> kube-apiserver --egress-selector-config-file (gRPC/UDS, HTTP CONNECT/UDS, HTTP CONNECT/mTLS TCP)
//	     -> proxy server (agent mTLS) -> proxy agent -> kwok on 127.0.0.2 / 127.0.0.3 -> test-target
//
// For every proxy and egress shape, on one control plane, and for each agent authentication
// (mTLS, then ServiceAccount token with TokenReview), it asserts logs, logs -f, exec, attach and
// port-forward end to end (and that each crossed the proxy); with -outside also nodes/, pods/
// and services/proxy, an admission webhook, an aggregated API and the webhook's failurePolicy
// with the agent gone. Then it kills the agent with SIGKILL under a streaming exec, logs -f and
// an open port-forward connection (upstream #748) and records what kubectl sees. It writes the
// result block of COMPATIBILITY.md (-out). Every process runs in its own process group and is
// ended on every exit path; -timeout bounds the whole run.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

const (
	tether   = "tether"
	upstream = "upstream"
)

type env struct {
	ps                        *procs
	work, pkiDir              string
	k8sBin, interopBin        string
	tetherServer, tetherAgent string
	kwokStages, kwokConfig    string
	logsFile, attachFile      string
	httpPort, echoPort        int
	kubeletPort               int
	upVersion                 string
	sampleAPIServer           string // k8s.io/sample-apiserver, for the aggregated API flow
	rows                      []*row
	nodes                     []node
	outside                   *outside // nil: no network namespace, no non-loopback flows
}

func (e *env) bin(name string) string { return filepath.Join(e.k8sBin, name) }
func (e *env) pki(name string) string { return filepath.Join(e.pkiDir, name) }

func (e *env) proxyBin(impl, name string) string {
	if impl == tether {
		return map[string]string{"proxy-server": e.tetherServer, "proxy-agent": e.tetherAgent}[name]
	}
	return filepath.Join(e.interopBin, name)
}

func main() {
	k8sBin := flag.String("k8s-bin", "", "directory with kube-apiserver, kubectl, etcd, kwok (interop/k8s/build.sh)")
	interopBin := flag.String("interop-bin", "", "interop/bin (upstream proxy-server, proxy-agent, gen-pki, test-target)")
	tetherBin := flag.String("tether", "", "the tether binary")
	stages := flag.String("kwok-stages", "", "kwok's kustomize/stage directory (from its Go module)")
	upVersion := flag.String("upstream-version", "", "upstream proxy-server/proxy-agent version, for the report")
	sampleAPIServer := flag.String("sample-apiserver", "", "k8s.io/sample-apiserver binary (interop/k8s/build.sh --sample-apiserver), for the aggregated API flow (with -outside)")
	work := flag.String("work", "", "scratch directory (sockets, logs, etcd data)")
	out := flag.String("out", "", "COMPATIBILITY.md to rewrite the k8s-flows block of (empty: do not write)")
	only := flag.String("only", "", "run only this proxy (tether or upstream); writes nothing")
	timeout := flag.Duration("timeout", 20*time.Minute, "the whole run's deadline")
	outsideIPs := flag.String("outside", "", "NODE_IP,POD_CIDR inside 198.18.0.0/15, local addresses of the network namespace this runs in: adds node-c (its pods get POD_CIDR addresses, where a backend listens) and the flows kube-apiserver refuses on loopback (nodes/, pods/ and services/proxy)")
	flag.Parse()
	for name, v := range map[string]string{"k8s-bin": *k8sBin, "interop-bin": *interopBin, "tether": *tetherBin, "kwok-stages": *stages, "work": *work} {
		if v == "" {
			fmt.Fprintf(os.Stderr, "k8s-flows: -%s is required\n", name)
			os.Exit(2)
		}
	}
	e := &env{ps: &procs{logs: filepath.Join(*work, "logs")}, work: *work, k8sBin: *k8sBin,
		interopBin: *interopBin, kwokStages: *stages, upVersion: *upVersion, sampleAPIServer: *sampleAPIServer}
	if *outsideIPs != "" {
		o, err := newOutside(*outsideIPs)
		if err != nil {
			fmt.Fprintln(os.Stderr, "k8s-flows: -outside:", err)
			os.Exit(2)
		}
		e.outside = o
	}

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	// Every exit path ends every process: a signal, the global deadline, or a normal return.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "k8s-flows: %v: stopping everything\n", s)
			e.ps.stopAll()
			os.Exit(130)
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				fmt.Fprintf(os.Stderr, "k8s-flows: global deadline %v reached: stopping everything\n", *timeout)
				e.ps.stopAll()
				os.Exit(3)
			}
		}
	}()

	code := run(ctx, e, *tetherBin, *only, *out)
	e.ps.stopAll()
	os.Exit(code)
}

func run(ctx context.Context, e *env, tetherBin, only, out string) int {
	started := time.Now()
	if err := e.setup(ctx, tetherBin); err != nil {
		fmt.Fprintln(os.Stderr, "k8s-flows: setup:", err)
		return 1
	}
	impls := []string{tether, upstream}
	if only != "" {
		impls = []string{only}
	}
	for _, impl := range impls {
		for i, sh := range shapes {
			name := fmt.Sprintf("%s-%d", impl, i+1)
			fmt.Printf("-- %s | %s\n", impl, sh.name)
			t0 := time.Now()
			e.runShape(ctx, impl, sh, name)
			fmt.Printf("   (%s in %.0f s)\n", name, time.Since(t0).Seconds())
		}
	}
	code := e.report(out, only == "")
	fmt.Printf("== k8s flows finished in %.0f s\n", time.Since(started).Seconds())
	return code
}

// runShape runs every flow through impl's proxy in egress shape sh against one control plane,
// in both agent authentication modes: first with an mTLS agent, then the server restarted in
// token mode where the first one listened (the egress configuration names that place) with a
// ServiceAccount-token agent.
func (e *env) runShape(ctx context.Context, impl string, sh shape, name string) {
	mtls := &row{impl: impl, shape: sh, auth: mtlsAuth}
	token := &row{impl: impl, shape: sh, auth: tokenAuth}
	e.rows = append(e.rows, mtls, token)
	fail := func(err error) {
		for _, r := range []*row{mtls, token} {
			if r.err == nil && len(r.flows) == 0 {
				r.err = err
			}
		}
		fmt.Printf("   FAIL: %v\n", err)
	}
	ep, err := e.egressFor(sh, name)
	if err != nil {
		fail(err)
		return
	}
	// The mTLS server first: kube-apiserver dials it on demand, the agent connects once the
	// control plane is up.
	ep.apiPort = freePort()
	p, err := e.startServer(impl, ep, nil, nil, name)
	defer func() { p.stop() }()
	if err != nil {
		fail(err)
		return
	}
	c, err := e.startCluster(ctx, name, ep.file, ep.apiPort)
	defer c.stop()
	if err != nil {
		fail(err)
		return
	}
	if err := e.runRow(ctx, mtls, c, p); err != nil {
		fmt.Printf("   FAIL: %v\n", err)
	}
	p.stop()
	tok, err := e.setupTokens(ctx, c)
	if err != nil {
		fail(err)
		return
	}
	if p, err = e.startServer(impl, ep, tok, c, name+"-token"); err != nil {
		fail(err)
		return
	}
	if err := e.runRow(ctx, token, c, p); err != nil {
		fmt.Printf("   FAIL: %v\n", err)
	}
}

// runRow connects p's agent and runs r's flows and kill cases through cluster c and proxy p.
func (e *env) runRow(ctx context.Context, r *row, c *cluster, p *proxy) error {
	fmt.Printf("   agent authentication: %s\n", r.auth)
	if r.err = e.startAgent(p, c); r.err != nil {
		return r.err
	}
	e.runFlows(ctx, r, c, p)
	e.runReverseFlows(ctx, r, c, p)
	if e.outside != nil {
		e.runOutsideFlows(ctx, r, c, p)
	}
	e.runKills(ctx, r, c, p)
	return r.err
}

func (e *env) setup(ctx context.Context, tetherBin string) error {
	for _, d := range []string{"logs", "s", "tether-bin"} {
		if err := os.MkdirAll(filepath.Join(e.work, d), 0o755); err != nil {
			return err
		}
	}
	abs, err := filepath.Abs(tetherBin)
	if err != nil {
		return err
	}
	// tether under upstream's names: argv[0] selects `tether server` / `tether agent`.
	e.tetherServer = filepath.Join(e.work, "tether-bin", "proxy-server")
	e.tetherAgent = filepath.Join(e.work, "tether-bin", "proxy-agent")
	for _, l := range []string{e.tetherServer, e.tetherAgent} {
		if err := os.Symlink(abs, l); err != nil {
			return err
		}
	}
	for _, b := range []string{e.bin("kube-apiserver"), e.bin("kubectl"), e.bin("etcd"), e.bin("kwok"), abs,
		e.proxyBin(upstream, "proxy-server"), e.proxyBin(upstream, "proxy-agent")} {
		if st, err := os.Stat(b); err != nil || st.Mode()&0o111 == 0 {
			return fmt.Errorf("%s: not an executable file (%v)", b, err)
		}
	}
	e.pkiDir = filepath.Join(e.work, "pki")
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(cctx, filepath.Join(e.interopBin, "gen-pki"), "--dir", e.pkiDir).CombinedOutput(); err != nil {
		return fmt.Errorf("gen-pki: %v: %s", err, out)
	}
	if err := e.writeStatic(); err != nil {
		return err
	}
	e.httpPort, e.echoPort = freePort(), freePort()
	httpAddr := fmt.Sprintf("127.0.0.1:%d", e.httpPort)
	if _, err := e.ps.start("test-target", filepath.Join(e.interopBin, "test-target"),
		"--echo", fmt.Sprintf("127.0.0.1:%d", e.echoPort), "--http", httpAddr); err != nil {
		return err
	}
	if err := waitStatus("http://"+httpAddr+"/", 200, 20*time.Second); err != nil {
		return err
	}
	e.logsFile = filepath.Join(e.work, "pod.log")
	e.attachFile = filepath.Join(e.work, "attach.log")
	for _, l := range []string{"flow-line-1", "flow-line-2"} {
		if err := appendLine(e.logsFile, l); err != nil {
			return err
		}
	}
	if err := appendLine(e.attachFile, "attach-start"); err != nil {
		return err
	}
	e.nodes = append([]node{}, loopbackNodes...)
	if e.outside != nil {
		if err := e.outside.start(); err != nil {
			return err
		}
		e.nodes = append(e.nodes, node{"node-c", e.outside.nodeIP, "pod-c", e.outside.podCIDR.String()})
	}
	var ips []string
	for _, n := range e.nodes {
		ips = append(ips, n.ip)
	}
	e.kubeletPort = freePort(ips...)
	return e.writeKwokConfig()
}
