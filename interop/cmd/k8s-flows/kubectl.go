package main

import (
	"context"
	"path/filepath"
	"time"

	"tether.dev/interop/internal/kubectl"
)

// kubectlCmd is one kubectl 1.37.2 invocation against a cluster, with a deadline; the flows'
// short names for the shared runner in interop/internal/kubectl.
type kubectlCmd struct{ cmd *kubectl.Cmd }

type kubectlResult struct {
	stdout, stderr string
	exit           int // -1 when it did not exit by itself (killed at its deadline)
	err            error
}

func (e *env) kubectl(ctx context.Context, c *cluster, timeout time.Duration, args ...string) *kubectlCmd {
	r := kubectl.Runner{Bin: e.bin("kubectl"), Kubeconfig: c.kubeconfig,
		CacheDir: filepath.Join(c.dir, "kubectl-cache"), Tracker: e.ps}
	return &kubectlCmd{cmd: r.Cmd(ctx, timeout, args...)}
}

func (k *kubectlCmd) withStdin(s string) *kubectlCmd {
	k.cmd.WithStdin(s)
	return k
}

func (k *kubectlCmd) run() kubectlResult { return fromResult(k.cmd.Run()) }

func fromResult(r kubectl.Result) kubectlResult {
	return kubectlResult{stdout: r.Stdout, stderr: r.Stderr, exit: r.Exit, err: r.Err}
}

// stream is a running kubectl whose stdout is watched line by line (logs -f, attach, exec of a
// long command, port-forward).
type stream struct{ s *kubectl.Stream }

func (k *kubectlCmd) start() (*stream, error) {
	s, err := k.cmd.Start()
	if err != nil {
		return nil, err
	}
	return &stream{s: s}, nil
}

func (s *stream) waitLine(want string, d time.Duration) error { return s.s.WaitLine(want, d) }
func (s *stream) wait(d time.Duration) kubectlResult          { return fromResult(s.s.Wait(d)) }
func (s *stream) kill()                                       { s.s.Kill() }
func (s *stream) stop()                                       { s.s.Stop() }

func describe(r kubectlResult) string {
	return kubectl.Describe(kubectl.Result{Exit: r.exit})
}
