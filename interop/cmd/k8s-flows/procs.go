package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one process the harness started. Each runs in its own process group, so that
// stopping it also ends what it started (kwok runs `kubectl exec` commands as its children).
type proc struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
}

// procs tracks every process group the harness started, so all of them end on every exit path.
type procs struct {
	mu     sync.Mutex
	all    []*proc
	logs   string
	seq    int
	closed bool // stopAll ran: whatever starts later (a racing restart) is ended at once
	// kubectls are the process groups of running kubectl commands (not logged like procs).
	kubectls map[int]bool
}

// Track records a started kubectl's process group, or kills it if stopAll already ran.
func (ps *procs) Track(pid int) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		return
	}
	if ps.kubectls == nil {
		ps.kubectls = map[int]bool{}
	}
	ps.kubectls[pid] = true
}

func (ps *procs) Untrack(pid int) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	delete(ps.kubectls, pid)
}

// start runs path with args, stdout and stderr to logs/NN-name.log.
func (ps *procs) start(name, path string, args ...string) (*proc, error) {
	ps.mu.Lock()
	ps.seq++
	logPath := filepath.Join(ps.logs, fmt.Sprintf("%03d-%s.log", ps.seq, name))
	ps.mu.Unlock()
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "# %s %s\n", path, strings.Join(args, " "))
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	ps.mu.Lock()
	closed := ps.closed
	if !closed {
		ps.all = append(ps.all, p)
	}
	ps.mu.Unlock()
	if closed {
		p.stop()
		return nil, fmt.Errorf("start %s: stopping everything", name)
	}
	return p, nil
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

// kill9 sends SIGKILL to p's whole process group.
func (p *proc) kill9() { _ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) }

// stop ends p's process group: SIGTERM, then SIGKILL after 3 s. The group is killed even when
// its leader has exited, so no child is left behind.
func (p *proc) stop() {
	if !p.exited() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		p.wait(3 * time.Second)
	}
	p.kill9()
	p.wait(5 * time.Second)
}

// stopAll stops every process started so far, in parallel.
func (ps *procs) stopAll() {
	ps.mu.Lock()
	all := append([]*proc(nil), ps.all...)
	ps.all = nil
	ps.closed = true
	for pid := range ps.kubectls {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
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
