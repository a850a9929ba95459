package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"tether.dev/interop/internal/checks"
)

// row is one proxy implementation in one egress shape: the flows and the agent-kill cases.
type row struct {
	impl  string
	shape shape
	auth  string // mtlsAuth or tokenAuth
	flows checks.List
	kills []killCase
	// goneFail is kubectl's error when the failurePolicy Fail webhook's agent is gone.
	goneFail string
	err      error // the row could not be set up
}

var flowNames = []string{"logs", "logs (node-b)", "logs -f", "exec", "attach", "port-forward"}

// run records one check of r and prints it.
func (r *row) run(name string, f func() (string, error)) { r.flows.Run(16, name, f) }

// crossed runs f and checks that its bytes went through the proxy: the server forwarded DATA
// packets from its agent meanwhile (kube-apiserver keeps idle kubelet connections, so a flow
// may reuse a tunnel instead of dialing; the detail shows the dials too).
func crossed(p *proxy, f func() (string, error)) func() (string, error) {
	return func() (string, error) {
		dials, data := p.dials(), p.agentData()
		detail, err := f()
		if err != nil {
			return detail, err
		}
		after, err := waitMetricAtLeast(p.metricsURL(), packetsMetric, data+1, 5*time.Second, fromAgentData...)
		if err != nil {
			return detail, fmt.Errorf("no data through the proxy: %v", err)
		}
		return strings.TrimSpace(detail + fmt.Sprintf(" dials +%v, DATA from agent +%v", p.dials()-dials, after-data)), nil
	}
}

// runFlows runs every kubelet-endpoint flow with kubectl through cluster c and proxy p.
func (e *env) runFlows(ctx context.Context, r *row, c *cluster, p *proxy) {
	tag := strings.ReplaceAll(p.name, " ", "-")
	r.run("logs", crossed(p, func() (string, error) {
		return "", e.wantOutput(e.kubectl(ctx, c, 30*time.Second, "logs", "pod-a").run(), "flow-line-1")
	}))
	r.run("logs (node-b)", crossed(p, func() (string, error) {
		return "", e.wantOutput(e.kubectl(ctx, c, 30*time.Second, "logs", "pod-b").run(), "flow-line-1")
	}))
	r.run("logs -f", crossed(p, func() (string, error) {
		return "", e.followLogs(ctx, c, "appended-"+tag)
	}))
	r.run("exec", crossed(p, func() (string, error) {
		return "", e.execEcho(ctx, c)
	}))
	r.run("attach", crossed(p, func() (string, error) {
		s, err := e.kubectl(ctx, c, 60*time.Second, "attach", "pod-a").start()
		if err != nil {
			return "", err
		}
		defer s.stop()
		// Attach follows the container's output: lines appended while it is attached.
		line := "attached-" + tag
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			if err := appendLine(e.attachFile, line); err != nil {
				return "", err
			}
			if s.waitLine(line, 1*time.Second) == nil {
				return "", nil
			}
		}
		return "", fmt.Errorf("attach did not show %q in 20 s", line)
	}))
	r.run("port-forward", crossed(p, func() (string, error) {
		local := freePort()
		s, err := e.kubectl(ctx, c, 60*time.Second, "port-forward", "--address=127.0.0.1", "pod/pod-a",
			fmt.Sprintf("%d:%d", local, podHTTPPort)).start()
		if err != nil {
			return "", err
		}
		defer s.stop()
		if err := s.waitLine("Forwarding from", 20*time.Second); err != nil {
			return "", err
		}
		base := fmt.Sprintf("http://127.0.0.1:%d", local)
		status, body, err := httpGet(base + "/")
		if err != nil || status != 200 || body != "ok\n" {
			return "", fmt.Errorf("GET / through the forward: %d %q %v", status, body, err)
		}
		n, err := getLen(base + "/bytes/1048576")
		if err != nil || n != 1<<20 {
			return "", fmt.Errorf("GET /bytes/1048576 through the forward: %d bytes, %v", n, err)
		}
		return "GET / ok, 1 MiB body ok", nil
	}))
}

// followLogs follows pod-a's log with kubectl (extra flags first, e.g. --server), then
// appends line to the container's log file and waits for kubectl to print it.
func (e *env) followLogs(ctx context.Context, c *cluster, line string, flags ...string) error {
	s, err := e.kubectl(ctx, c, 60*time.Second, append(flags, "logs", "-f", "pod-a")...).start()
	if err != nil {
		return err
	}
	defer s.stop()
	if err := s.waitLine("flow-line-1", 20*time.Second); err != nil {
		return err
	}
	if err := appendLine(e.logsFile, line); err != nil {
		return err
	}
	return s.waitLine(line, 20*time.Second)
}

// execEcho runs a command in pod-a with kubectl exec (extra flags first) and checks stdout.
func (e *env) execEcho(ctx context.Context, c *cluster, flags ...string) error {
	res := e.kubectl(ctx, c, 30*time.Second,
		append(flags, "exec", "pod-a", "--", "sh", "-c", "echo exec-ok FAKE_POD=$FAKE_POD")...).run()
	if res.err != nil {
		return fmt.Errorf("%s: %s", describe(res), strings.TrimSpace(res.stderr))
	}
	if got := strings.TrimSpace(res.stdout); got != "exec-ok FAKE_POD=yes" {
		return fmt.Errorf("stdout %q, want %q", got, "exec-ok FAKE_POD=yes")
	}
	return nil
}

func (e *env) wantOutput(res kubectlResult, want string) error {
	if res.err != nil {
		return fmt.Errorf("%s: %s", describe(res), strings.TrimSpace(res.stderr))
	}
	if !strings.Contains(res.stdout, want) {
		return fmt.Errorf("stdout %q lacks %q", res.stdout, want)
	}
	return nil
}

func getLen(url string) (int64, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return io.Copy(io.Discard, resp.Body)
}
