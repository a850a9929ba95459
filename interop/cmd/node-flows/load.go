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
	mu sync.Mutex
	// steps in the order they began; the last is the one in force.
	steps    []*stepResult
	cancel   context.CancelFunc
	finished sync.WaitGroup
}

// stepResult is one step's figures.
type stepResult struct {
	step               string
	ok, failed, breaks int
	// longestFailing is the longest run of failing calls, from the first failure to the next
	// success or the step's end: how long this step kept webhooks from working.
	longestFailing time.Duration
	// failingFrom is when the current run of failures began; zero while calls succeed.
	failingFrom time.Time
}

// endFailing closes the current run of failures, if any, at at.
func (s *stepResult) endFailing(at time.Time) {
	if !s.failingFrom.IsZero() {
		s.longestFailing = max(s.longestFailing, at.Sub(s.failingFrom))
		s.failingFrom = time.Time{}
	}
}

// webhookInterval is the rate of webhook calls: 5 per second.
const webhookInterval = 200 * time.Millisecond

var proxyServing = regexp.MustCompile(`Starting to serve on 127\.0\.0\.1:(\d+)`)

// startLoad starts both kinds of traffic; stop ends them and waits.
func (e *env) startLoad(ctx context.Context, firstStep string) (*load, error) {
	ctx, cancel := context.WithCancel(ctx)
	l := &load{cancel: cancel}
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
	served := proxyServing.FindStringSubmatch(proxy.Output())
	if served == nil {
		proxy.Stop()
		cancel()
		return nil, fmt.Errorf("kubectl proxy printed no 127.0.0.1 port: %q", proxy.Output())
	}
	base := "http://127.0.0.1:" + served[1]
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

// setStep ends the step in force and begins step.
func (l *load) setStep(step string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.steps); n > 0 {
		l.steps[n-1].endFailing(time.Now())
	}
	l.steps = append(l.steps, &stepResult{step: step})
}

// current is the step in force; l.mu must be held.
func (l *load) current() *stepResult { return l.steps[len(l.steps)-1] }

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
	s := l.current()
	if ok {
		s.ok++
		s.endFailing(time.Now())
		return
	}
	s.failed++
	if s.failingFrom.IsZero() {
		s.failingFrom = time.Now()
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
		l.current().breaks++
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// results are every step's figures, the one in force ended now.
func (l *load) results() []stepResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.current().endFailing(time.Now())
	out := make([]stepResult, len(l.steps))
	for i, s := range l.steps {
		out[i] = *s
	}
	return out
}
