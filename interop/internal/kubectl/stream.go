package kubectl

import (
	"bufio"
	"bytes"
	"errors"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Stream is a running kubectl whose stdout is watched line by line.
type Stream struct {
	k     *Cmd
	mu    sync.Mutex
	out   strings.Builder
	errb  bytes.Buffer
	lines chan string
	done  chan Result
	// exitedAt is when kubectl exited (under mu).
	exitedAt time.Time
}

// Start starts kubectl and returns at once; WaitLine, Wait and Stop follow it.
func (k *Cmd) Start() (*Stream, error) {
	s := &Stream{k: k, lines: make(chan string, 1024), done: make(chan Result, 1)}
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
	k.track()
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
		k.untrack()
		k.cancel()
		s.mu.Lock()
		r := result(s.out.String(), s.errb.String(), err)
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

// Output is everything kubectl printed on stdout so far.
func (s *Stream) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

// ExitedAt is when kubectl exited, zero while it runs.
func (s *Stream) ExitedAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exitedAt
}

// WaitLine waits up to d for a stdout line containing want.
func (s *Stream) WaitLine(want string, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	if strings.Contains(s.Output(), want) {
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
			if strings.Contains(r.Stdout, want) {
				return nil
			}
			return errors.New("kubectl exited (" + Describe(r) + ") before printing " + want + "; stderr: " + strings.TrimSpace(r.Stderr))
		case <-timer.C:
			s.mu.Lock()
			defer s.mu.Unlock()
			return errors.New("no line with " + want + " after " + d.String() + "; stderr: " + strings.TrimSpace(s.errb.String()))
		}
	}
}

// Wait waits up to d for kubectl to exit by itself; after that it is killed and Exit is -1.
func (s *Stream) Wait(d time.Duration) Result {
	select {
	case r := <-s.done:
		s.done <- r
		return r
	case <-time.After(d):
		s.Kill()
		r := <-s.done
		s.done <- r
		r.Exit = -1
		return r
	}
}

// Kill ends kubectl's process group without waiting.
func (s *Stream) Kill() {
	if s.k.cmd.Process != nil {
		_ = syscall.Kill(-s.k.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// Stop kills kubectl and waits for it (bounded).
func (s *Stream) Stop() {
	s.Kill()
	select {
	case r := <-s.done:
		s.done <- r
	case <-time.After(5 * time.Second):
	}
}
