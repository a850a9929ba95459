package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one long-running process (a server, an agent, a target) started by the matrix.
type proc struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

type procs struct {
	mu   sync.Mutex
	all  []*proc
	logs string
}

// start runs path with args, output to logs/<name>.log. Children stay in the matrix's
// process group, so run.sh's trap can end them all even if this program is killed.
func (ps *procs) start(name, path string, args ...string) (*proc, error) {
	return ps.startEnv(name, path, nil, args...)
}

// startEnv is start with env as the whole environment (nil: this program's).
func (ps *procs) startEnv(name, path string, env []string, args ...string) (*proc, error) {
	logPath := filepath.Join(ps.logs, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "# %s %s\n", path, strings.Join(args, " "))
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Stdin = nil
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	ps.mu.Lock()
	ps.all = append(ps.all, p)
	ps.mu.Unlock()
	return p, nil
}

func (p *proc) signal(sig syscall.Signal) {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) wait(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// stop ends p: SIGTERM twice (an agent's first one only starts a drain), then SIGKILL.
func (p *proc) stop() {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGTERM} {
		p.signal(sig)
		if p.wait(1500 * time.Millisecond) {
			return
		}
	}
	p.signal(syscall.SIGKILL)
	p.wait(5 * time.Second)
}

func (ps *procs) stopAll() {
	ps.mu.Lock()
	all := append([]*proc(nil), ps.all...)
	ps.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range all {
		wg.Add(1)
		go func() { defer wg.Done(); p.stop() }()
	}
	wg.Wait()
}

// tail returns the last n lines of p's log.
func (p *proc) tail(n int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ---- ports, HTTP polling, metrics ----

var (
	portMu   sync.Mutex
	usedPort = map[int]bool{}
)

// freePort picks a free 127.0.0.1 TCP port in 20000-31999: inside upstream's allowed 1024-49151
// and below Linux's ephemeral range, so no outgoing connection can take it meanwhile.
func freePort() int {
	portMu.Lock()
	defer portMu.Unlock()
	for {
		p := 20000 + rand.IntN(12000)
		if usedPort[p] {
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		ln.Close()
		usedPort[p] = true
		return p
	}
}

var httpClient = &http.Client{Timeout: 2 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error {
	return http.ErrUseLastResponse
}}

func httpStatus(url string) int {
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// waitStatus polls url until it answers want, for at most d.
func waitStatus(url string, want int, d time.Duration) error {
	deadline := time.Now().Add(d)
	last := 0
	for time.Now().Before(deadline) {
		if last = httpStatus(url); last == want {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s: status %d after %v, want %d", url, last, d, want)
}

// metric reads one sample (name with its exact label set, e.g. `x{a="b"}`, or a bare name)
// from a Prometheus text page; errMissing if the page has no such sample.
func metric(url, sample string) (float64, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, sample+" ") {
			return strconv.ParseFloat(strings.Fields(line[len(sample):])[0], 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errMissing
}

var errMissing = errors.New("no such sample")

// waitMetric polls until sample == want, for at most d.
func waitMetric(url, sample string, want float64, d time.Duration) error {
	deadline := time.Now().Add(d)
	var v float64
	var err error
	for time.Now().Before(deadline) {
		if v, err = metric(url, sample); err == nil && v == want {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s: %s = %v (err %v) after %v, want %v", url, sample, v, err, d, want)
}

// ---- running a peer tool ----

type peerResult struct {
	OK        bool    `json:"ok"`
	Stage     string  `json:"stage"`
	Error     string  `json:"error"`
	DialError string  `json:"dial_error"`
	Reason    string  `json:"reason"`
	Bytes     int64   `json:"bytes"`
	Status    int     `json:"status"`
	MiBPerSec float64 `json:"mib_per_s"`
	ElapsedMs float64 `json:"elapsed_ms"`
	raw       string
}

func (r peerResult) String() string { return strings.TrimSpace(r.raw) }

var (
	portRE = regexp.MustCompile(`(127\.0\.0\.1|localhost):\d+`)
	sockRE = regexp.MustCompile(`/[^\s"']*\.sock`)
)

// normalize removes what differs between two runs of the same case: ports and socket paths.
func normalize(s string) string {
	return sockRE.ReplaceAllString(portRE.ReplaceAllString(s, "$1:PORT"), "UDS")
}

func runTool(ctx context.Context, timeout time.Duration, path string, args ...string) (peerResult, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.WaitDelay = 2 * time.Second
	out, err := cmd.Output()
	var r peerResult
	r.raw = string(out)
	if jerr := jsonUnmarshal(out, &r); jerr != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		return r, fmt.Errorf("%s %s: no result (%v; %v): %s %s", filepath.Base(path), strings.Join(args, " "), err, jerr, out, stderr)
	}
	return r, nil
}
