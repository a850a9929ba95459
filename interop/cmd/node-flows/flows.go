package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"tether.dev/interop/internal/kubectl"
)

// flowNames are the report's columns, in order.
var flowNames = []string{"logs", "logs -f", "exec (stdin)", "exec in the container", "attach", "port-forward",
	"cp into a pod", "cp out of a pod", "nodes/proxy", "services/proxy", "webhook (Fail policy)", "aggregated API (APIService)"}

// runFlows runs every flow through the installed proxy, then the installation's own checks.
func (e *env) runFlows(ctx context.Context, r *row, variant []variantCheck) {
	var workloadsErr error
	r.run("workloads Ready", func() (string, error) {
		workloadsErr = e.startWorkloads(ctx)
		return "", workloadsErr
	})
	if workloadsErr != nil {
		return
	}
	defer r.run("workloads removed", func() (string, error) { return "", e.stopWorkloads(ctx) })
	ns := []string{"-n", flowsNamespace}
	k := func(timeout time.Duration, args ...string) *kubectl.Cmd {
		return e.kube.Cmd(ctx, timeout, append(ns, args...)...)
	}

	r.run("logs", e.crossed(func() (string, error) {
		return "", wantOutput(k(30*time.Second, "logs", "app", "-c", "web").Run(), "node-app serving on :8080")
	}))
	r.run("logs -f", e.crossed(func() (string, error) {
		return followTicks(k(60*time.Second, "logs", "-f", "--tail=1", "app", "-c", "ticker"), 3)
	}))
	r.run("exec (stdin)", e.crossed(func() (string, error) {
		want := "stdin through the tunnel " + randomWord()
		res := k(30*time.Second, "exec", "-i", "app", "-c", "web", "--", "/node-app", "cat").WithStdin(want + "\n").Run()
		return "", wantOutput(res, want)
	}))
	r.run("exec in the container", e.crossed(func() (string, error) {
		// A fake kubelet would run the command on the host; the pod's UTS namespace says "app".
		out := k(30*time.Second, "exec", "app", "-c", "web", "--", "/node-app", "hostname").Run()
		if err := wantOutput(out, ""); err != nil {
			return "", err
		}
		if got := strings.TrimSpace(out.Stdout); got != "app" {
			return "", fmt.Errorf("hostname %q, want the pod's (app)", got)
		}
		return "hostname app", nil
	}))
	r.run("attach", e.crossed(func() (string, error) {
		return followTicks(k(60*time.Second, "attach", "app", "-c", "ticker"), 2)
	}))
	r.run("port-forward", e.crossed(func() (string, error) {
		return e.portForward(ctx)
	}))
	payload := make([]byte, 1<<20)
	_, _ = rand.Read(payload)
	local := filepath.Join(e.work, "cp-in")
	r.run("cp into a pod", e.crossed(func() (string, error) {
		if err := os.WriteFile(local, payload, 0o600); err != nil {
			return "", err
		}
		if res := k(60*time.Second, "cp", local, flowsNamespace+"/app:/data/payload", "-c", "web").Run(); res.Err != nil {
			return "", fmt.Errorf("%s: %s", kubectl.Describe(res), strings.TrimSpace(res.Stderr))
		}
		return "1 MiB", nil
	}))
	r.run("cp out of a pod", e.crossed(func() (string, error) {
		back := filepath.Join(e.work, "cp-out")
		if res := k(60*time.Second, "cp", flowsNamespace+"/app:/data/payload", back, "-c", "web").Run(); res.Err != nil {
			return "", fmt.Errorf("%s: %s", kubectl.Describe(res), strings.TrimSpace(res.Stderr))
		}
		got, err := os.ReadFile(back)
		if err != nil {
			return "", err
		}
		if !bytes.Equal(got, payload) {
			return "", fmt.Errorf("copied back %d bytes that differ from the %d sent", len(got), len(payload))
		}
		return "1 MiB, same bytes", nil
	}))
	r.run("nodes/proxy", e.crossed(func() (string, error) {
		return "", wantOutput(e.kube.Cmd(ctx, 30*time.Second, "get", "--raw", "/api/v1/nodes/"+e.nodeName+"/proxy/healthz").Run(), "ok")
	}))
	r.run("services/proxy", e.crossed(func() (string, error) {
		return "", wantOutput(e.kube.Cmd(ctx, 30*time.Second, "get", "--raw",
			"/api/v1/namespaces/flows/services/web:http/proxy/").Run(), "hello from node-app on app")
	}))
	r.run("webhook (Fail policy)", e.crossed(func() (string, error) {
		return e.webhookCalls(ctx, 20)
	}))
	r.run("aggregated API (APIService)", e.crossed(func() (string, error) {
		return e.aggregatedAPI(ctx)
	}))
	for _, c := range variant {
		r.run(c.name, func() (string, error) { return c.run(ctx) })
	}
}

// followTicks starts cmd (a logs -f or attach of the ticker) and waits for a tick, then for
// one numbered more later: lines written after the stream opened arrive through it.
func followTicks(cmd *kubectl.Cmd, more int) (string, error) {
	s, err := cmd.Start()
	if err != nil {
		return "", err
	}
	defer s.Stop()
	first, err := nextTick(s, -1)
	if err != nil {
		return "", err
	}
	last, err := nextTick(s, first+more)
	return fmt.Sprintf("ticks %d..%d", first, last), err
}

var tickLine = regexp.MustCompile(`(?m)^tick (\d+) `)

// nextTick waits for a tick line numbered at least min (any, with -1) and returns its number.
func nextTick(s *kubectl.Stream, min int) (int, error) {
	var found int
	err := waitFor(context.Background(), fmt.Sprintf("a tick line numbered at least %d", min), 20*time.Second, func() error {
		matches := tickLine.FindAllStringSubmatch(s.Output(), -1)
		for _, m := range matches {
			if n, _ := strconv.Atoi(m[1]); n >= min {
				found = n
				return nil
			}
		}
		if !s.ExitedAt().IsZero() {
			return fmt.Errorf("kubectl exited; output %q", lastLines(s.Output(), 3))
		}
		return fmt.Errorf("%d tick lines so far", len(matches))
	})
	return found, err
}

var forwarding = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> 8080`)

// portForward forwards a free local port to the app's 8080 and fetches a page through it.
func (e *env) portForward(ctx context.Context) (string, error) {
	s, err := e.kube.Cmd(ctx, 60*time.Second, "port-forward", "-n", flowsNamespace, "--address=127.0.0.1", "pod/app", ":8080").Start()
	if err != nil {
		return "", err
	}
	defer s.Stop()
	if err := s.WaitLine("Forwarding from 127.0.0.1:", 20*time.Second); err != nil {
		return "", err
	}
	m := forwarding.FindStringSubmatch(s.Output())
	if m == nil {
		return "", fmt.Errorf("no local port in %q", s.Output())
	}
	resp, err := httpClient.Get("http://127.0.0.1:" + m[1] + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return "", err
	}
	if !strings.Contains(string(body), "hello from node-app on app") {
		return "", fmt.Errorf("answer %q", body)
	}
	return "", nil
}

// webhookCalls creates n ConfigMaps the webhook must admit (failurePolicy Fail: each create
// fails unless kube-apiserver reached the webhook through the proxy) and checks its count.
func (e *env) webhookCalls(ctx context.Context, n int) (string, error) {
	count := func() (int, error) {
		res := e.kube.Cmd(ctx, 30*time.Second, "get", "--raw", "/api/v1/namespaces/flows/services/https:webhook:https/proxy/count").Run()
		if res.Err != nil {
			return 0, fmt.Errorf("reading the webhook's count: %v %s", res.Err, res.Stderr)
		}
		return strconv.Atoi(strings.TrimSpace(res.Stdout))
	}
	before, err := count()
	if err != nil {
		return "", err
	}
	batch := randomWord()
	for i := range n {
		name := fmt.Sprintf("probe-%s-%d", batch, i)
		obj := fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: %s, namespace: flows, labels: {flows-probe: \"yes\"}}\n", name)
		if res := e.kube.Cmd(ctx, 30*time.Second, "create", "-f", "-").WithStdin(obj).Run(); res.Err != nil {
			return "", fmt.Errorf("create %s: %s", name, strings.TrimSpace(res.Stderr))
		}
	}
	after, err := count()
	if err != nil {
		return "", err
	}
	if after-before != n {
		return "", fmt.Errorf("the webhook counted %d calls for %d creates", after-before, n)
	}
	return fmt.Sprintf("%d calls, 0 failed", n), nil
}

func wantOutput(res kubectl.Result, want string) error {
	if res.Err != nil {
		return fmt.Errorf("%s: %s", kubectl.Describe(res), strings.TrimSpace(res.Stderr))
	}
	if !strings.Contains(res.Stdout, want) {
		return fmt.Errorf("stdout %q lacks %q", lastLines(res.Stdout, 3), want)
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

func randomWord() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}
