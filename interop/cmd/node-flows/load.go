package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"regexp"
	"sync"
	"time"

	"tether.dev/interop/internal/kubectl"
)

// load is traffic that must keep flowing while the proxy under it changes: admission webhook
// calls at a steady rate (each a ConfigMap create that fails unless kube-apiserver reaches the
// webhook pod through the proxy) and a `kubectl logs -f` that is restarted whenever it breaks.
// Every outcome is stamped with the step it happened in.
type load struct {
	mu       sync.Mutex
	step     string
	steps    []string
	calls    map[string]*callStats
	breaks   map[string]int
	cancel   context.CancelFunc
	finished sync.WaitGroup
}

type callStats struct {
	ok, failed int
	// longestGap is the longest time between a failure after a success and the next success:
	// how long this step kept webhooks from working.
	longestGap  time.Duration
	failingFrom time.Time
}

// webhookInterval is the rate of webhook calls: 5 per second.
const webhookInterval = 200 * time.Millisecond

var proxyServing = regexp.MustCompile(`Starting to serve on 127\.0\.0\.1:(\d+)`)

// startLoad starts both kinds of traffic; stop ends them and waits.
func (e *env) startLoad(ctx context.Context, firstStep string) (*load, error) {
	ctx, cancel := context.WithCancel(ctx)
	l := &load{calls: map[string]*callStats{}, breaks: map[string]int{}, cancel: cancel}
	l.setStep(firstStep)
	// kubectl proxy carries the creates: one process instead of one kubectl per call.
	proxy, err := e.kube.Cmd(ctx, 30*time.Minute, "proxy", "--port=0", "--address=127.0.0.1").Start()
	if err != nil {
		cancel()
		return nil, err
	}
	if err := proxy.WaitLine("Starting to serve on", 20*time.Second); err != nil {
		proxy.Stop()
		cancel()
		return nil, err
	}
	base := "http://127.0.0.1:" + proxyServing.FindStringSubmatch(proxy.Output())[1]
	l.finished.Add(2)
	go func() {
		defer l.finished.Done()
		defer proxy.Stop()
		l.webhookCalls(ctx, base)
	}()
	go func() {
		defer l.finished.Done()
		l.follow(ctx, e.kube)
	}()
	return l, nil
}

func (l *load) setStep(step string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.step = step
	l.steps = append(l.steps, step)
	l.calls[step] = &callStats{}
}

func (l *load) stop() {
	l.cancel()
	l.finished.Wait()
}

func (l *load) webhookCalls(ctx context.Context, base string) {
	client := &http.Client{Timeout: 12 * time.Second}
	tick := time.NewTicker(webhookInterval)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"load-%d","namespace":"flows","labels":{"flows-probe":"yes"}}}`, i)
		resp, err := client.Post(base+"/api/v1/namespaces/flows/configmaps", "application/json", bytes.NewBufferString(body))
		ok := err == nil && resp.StatusCode == http.StatusCreated
		if resp != nil {
			resp.Body.Close()
		}
		if ctx.Err() != nil {
			return
		}
		l.record(ok)
	}
}

func (l *load) record(ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.calls[l.step]
	now := time.Now()
	if ok {
		s.ok++
		if !s.failingFrom.IsZero() {
			s.longestGap = max(s.longestGap, now.Sub(s.failingFrom))
			s.failingFrom = time.Time{}
		}
		return
	}
	s.failed++
	if s.failingFrom.IsZero() {
		s.failingFrom = now
	}
}

// follow keeps a `logs -f` of the ticker open; each time it ends before the load stops is a
// broken stream of the step it broke in.
func (l *load) follow(ctx context.Context, kube kubectl.Runner) {
	for ctx.Err() == nil {
		s, err := kube.Cmd(ctx, 30*time.Minute, "logs", "-f", "--tail=1", "-n", flowsNamespace, "app", "-c", "ticker").Start()
		if err == nil {
			s.Wait(30 * time.Minute)
		}
		if ctx.Err() != nil {
			return
		}
		l.mu.Lock()
		l.breaks[l.step]++
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// stepResult is one step's figures.
type stepResult struct {
	step             string
	ok, failed       int
	longestFailingMs int64
	breaks           int
}

func (l *load) results() []stepResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []stepResult
	for _, step := range l.steps {
		s := l.calls[step]
		gap := s.longestGap
		if !s.failingFrom.IsZero() {
			gap = max(gap, time.Since(s.failingFrom))
		}
		out = append(out, stepResult{step: step, ok: s.ok, failed: s.failed, longestFailingMs: gap.Milliseconds(), breaks: l.breaks[step]})
	}
	return out
}
