package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// kubectlCmd is one kubectl 1.37.2 invocation against a cluster, with a deadline.
type kubectlCmd struct {
	cmd    *exec.Cmd
	cancel context.CancelFunc
	ps     *procs
}

type kubectlResult struct {
	stdout, stderr string
	exit           int // -1 when it did not exit by itself (killed at its deadline)
	err            error
}

func (e *env) kubectl(ctx context.Context, c *cluster, timeout time.Duration, args ...string) *kubectlCmd {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	// Its discovery cache beside the cluster, not in $HOME where another run's would be.
	cmd := exec.CommandContext(ctx, e.bin("kubectl"), append([]string{"--kubeconfig=" + c.kubeconfig,
		"--cache-dir=" + filepath.Join(c.dir, "kubectl-cache")}, args...)...)
	cmd.WaitDelay = 2 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return &kubectlCmd{cmd: cmd, cancel: cancel, ps: e.ps}
}

func (k *kubectlCmd) withStdin(s string) *kubectlCmd {
	k.cmd.Stdin = strings.NewReader(s)
	return k
}

func (k *kubectlCmd) run() kubectlResult {
	defer k.cancel()
	var out, errb bytes.Buffer
	k.cmd.Stdout, k.cmd.Stderr = &out, &errb
	err := k.cmd.Start()
	if err == nil {
		k.ps.trackKubectl(k.cmd.Process.Pid)
		err = k.cmd.Wait()
		k.ps.untrackKubectl(k.cmd.Process.Pid)
	}
	return result(k.cmd, out.String(), errb.String(), err)
}

func result(cmd *exec.Cmd, out, errs string, err error) kubectlResult {
	r := kubectlResult{stdout: out, stderr: errs, err: err}
	var ee *exec.ExitError
	switch {
	case err == nil:
		r.exit = 0
	case errors.As(err, &ee) && ee.Exited():
		r.exit = ee.ExitCode()
	default:
		r.exit = -1
	}
	return r
}

// stream is a running kubectl whose stdout is watched line by line (logs -f, attach, exec of a
// long command, port-forward).
type stream struct {
	k     *kubectlCmd
	mu    sync.Mutex
	out   strings.Builder
	errb  bytes.Buffer
	lines chan string
	done  chan kubectlResult
	// exitedAt is when kubectl exited (under mu).
	exitedAt time.Time
}

func (k *kubectlCmd) start() (*stream, error) {
	s := &stream{k: k, lines: make(chan string, 1024), done: make(chan kubectlResult, 1)}
	stdout, err := k.cmd.StdoutPipe()
	if err != nil {
		k.cancel()
		return nil, err
	}
	k.cmd.Stderr = &lockedWriter{mu: &s.mu, b: &s.errb}
	if err := k.cmd.Start(); err != nil {
		k.cancel()
		return nil, err
	}
	k.ps.trackKubectl(k.cmd.Process.Pid)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			s.mu.Lock()
			s.out.WriteString(sc.Text() + "\n")
			s.mu.Unlock()
			select {
			case s.lines <- sc.Text():
			default: // nobody waits for lines this far behind; out keeps them
			}
		}
		err := k.cmd.Wait()
		k.ps.untrackKubectl(k.cmd.Process.Pid)
		k.cancel()
		s.mu.Lock()
		r := result(k.cmd, s.out.String(), s.errb.String(), err)
		s.exitedAt = time.Now()
		s.mu.Unlock()
		s.done <- r
	}()
	return s, nil
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// waitLine waits up to d for a stdout line containing want.
func (s *stream) waitLine(want string, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	s.mu.Lock()
	seen := strings.Contains(s.out.String(), want)
	s.mu.Unlock()
	if seen {
		return nil
	}
	for {
		select {
		case l := <-s.lines:
			if strings.Contains(l, want) {
				return nil
			}
		case r := <-s.done:
			s.done <- r
			if strings.Contains(r.stdout, want) {
				return nil
			}
			return errors.New("kubectl exited (" + describe(r) + ") before printing " + want)
		case <-timer.C:
			s.mu.Lock()
			defer s.mu.Unlock()
			return errors.New("no line with " + want + " after " + d.String() + "; stderr: " + strings.TrimSpace(s.errb.String()))
		}
	}
}

// wait waits up to d for kubectl to exit by itself; after that it is killed and exit is -1.
func (s *stream) wait(d time.Duration) kubectlResult {
	select {
	case r := <-s.done:
		s.done <- r
		return r
	case <-time.After(d):
		s.kill()
		r := <-s.done
		s.done <- r
		r.exit = -1
		return r
	}
}

// kill ends kubectl (used to end a follow that passed, and at deadlines).
func (s *stream) kill() {
	if s.k.cmd.Process != nil {
		_ = syscall.Kill(-s.k.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// stop kills kubectl and waits for it (bounded).
func (s *stream) stop() {
	s.kill()
	select {
	case r := <-s.done:
		s.done <- r
	case <-time.After(5 * time.Second):
	}
}

func describe(r kubectlResult) string {
	if r.exit == -1 {
		return "did not exit; killed"
	}
	return "exit " + itoa(r.exit)
}
