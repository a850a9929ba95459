// k8s-flows runs kubectl 1.37.2 against a real kube-apiserver 1.37.2 whose egress selector
// sends kubelet traffic through a proxy server and agent (tether's, then upstream's for
// reference) to kwok fake kubelets, all on loopback and Unix sockets in -work:
//
//	etcd -> kube-apiserver --egress-selector-config-file (gRPC/UDS, HTTP CONNECT/UDS, HTTP CONNECT/mTLS TCP)
//	     -> proxy server (agent mTLS) -> proxy agent -> kwok on 127.0.0.2 / 127.0.0.3 -> test-target
//
// For every proxy and egress shape it asserts logs, logs -f, exec, attach and port-forward end
// to end (and that each crossed the proxy), then kills the agent with SIGKILL under a streaming
// exec, logs -f and an open port-forward connection (upstream #748) and records what kubectl
// sees. It writes the result block of COMPATIBILITY.md (-out). Every process runs in its own
// process group and is ended on every exit path; -timeout bounds the whole run.
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
		interopBin: *interopBin, kwokStages: *stages, upVersion: *upVersion}
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
			r := &row{impl: impl, shape: sh}
			e.rows = append(e.rows, r)
			name := fmt.Sprintf("%s-%d", impl, i+1)
			fmt.Printf("-- %s | %s\n", impl, sh.name)
			t0 := time.Now()
			r.err = e.runRow(ctx, r, name)
			if r.err != nil {
				fmt.Printf("   FAIL: %v\n", r.err)
			}
			fmt.Printf("   (%s in %.0f s)\n", name, time.Since(t0).Seconds())
		}
	}
	code := e.report(out, only == "")
	fmt.Printf("== k8s flows finished in %.0f s\n", time.Since(started).Seconds())
	return code
}

// runRow starts a proxy and a control plane for r, runs the flows and the kill cases, and
// stops them all again.
func (e *env) runRow(ctx context.Context, r *row, name string) error {
	p, err := e.startProxy(r.impl, r.shape, name)
	defer p.stop()
	if err != nil {
		return err
	}
	c, err := e.startCluster(ctx, name, p.egress)
	defer c.stop()
	if err != nil {
		return err
	}
	e.runFlows(ctx, r, c, p)
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
