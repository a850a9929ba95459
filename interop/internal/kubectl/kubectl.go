// Package kubectl runs a real kubectl against a test cluster with a deadline on every call:
// one-shot commands (Run) and long-lived ones whose output is watched line by line (Start: logs
// -f, attach, exec of a long command, port-forward). Each kubectl runs in a process group of its
// own, so a deadline or Stop ends it with everything it started.
package kubectl

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Tracker is told about every kubectl process group while it runs, so that a test's cleanup can
// kill the ones still running (and kill at once any started after cleanup began).
type Tracker interface {
	Track(pid int)
	Untrack(pid int)
}

// Runner makes kubectl commands for one cluster.
type Runner struct {
	Bin        string
	Kubeconfig string
	// CacheDir is kubectl's discovery cache: beside the cluster, not in $HOME where another
	// run's would be.
	CacheDir string
	Tracker  Tracker
}

// Cmd is one kubectl invocation with a deadline.
type Cmd struct {
	cmd     *exec.Cmd
	cancel  context.CancelFunc
	tracker Tracker
}

// Result is how a kubectl ended. Exit is -1 when it did not exit by itself (killed at its
// deadline or by Stop).
type Result struct {
	Stdout, Stderr string
	Exit           int
	Err            error
}

// Cmd prepares kubectl ARGS, killed after timeout.
func (r Runner) Cmd(ctx context.Context, timeout time.Duration, args ...string) *Cmd {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	cmd := exec.CommandContext(ctx, r.Bin, append([]string{"--kubeconfig=" + r.Kubeconfig,
		"--cache-dir=" + r.CacheDir}, args...)...)
	cmd.WaitDelay = 2 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return &Cmd{cmd: cmd, cancel: cancel, tracker: r.Tracker}
}

// WithStdin gives kubectl s as its standard input.
func (k *Cmd) WithStdin(s string) *Cmd {
	k.cmd.Stdin = strings.NewReader(s)
	return k
}

// Run runs kubectl to its end or its deadline.
func (k *Cmd) Run() Result {
	defer k.cancel()
	var out, errb bytes.Buffer
	k.cmd.Stdout, k.cmd.Stderr = &out, &errb
	err := k.cmd.Start()
	if err == nil {
		k.track()
		err = k.cmd.Wait()
		k.untrack()
	}
	return result(out.String(), errb.String(), err)
}

func (k *Cmd) track() {
	if k.tracker != nil {
		k.tracker.Track(k.cmd.Process.Pid)
	}
}

func (k *Cmd) untrack() {
	if k.tracker != nil {
		k.tracker.Untrack(k.cmd.Process.Pid)
	}
}

func result(out, errs string, err error) Result {
	r := Result{Stdout: out, Stderr: errs, Err: err}
	var ee *exec.ExitError
	switch {
	case err == nil:
		r.Exit = 0
	case errors.As(err, &ee) && ee.Exited():
		r.Exit = ee.ExitCode()
	default:
		r.Exit = -1
	}
	return r
}

// Describe says how kubectl ended, for error messages.
func Describe(r Result) string {
	if r.Exit == -1 {
		return "did not exit; killed"
	}
	return "exit " + strconv.Itoa(r.Exit)
}
