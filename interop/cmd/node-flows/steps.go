package main

import (
	"context"
	"fmt"
	"os"
	"time"
)

// step is one thing an operator does to a running installation, measured under load.
type step struct {
	name string
	do   func(context.Context) error
}

// seq runs fs in order and stops at the first error.
func seq(fs ...func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		for _, f := range fs {
			if err := f(ctx); err != nil {
				return err
			}
		}
		return nil
	}
}

// helmStep runs helm VERB on the tether release with the node's values and extra ones.
func (e *env) helmStep(verb string, extra ...string) func(context.Context) error {
	return func(ctx context.Context) error {
		args := []string{verb, "tether"}
		if verb != "rollback" {
			args = append(append(append(args, e.chart, "-n", "kube-system"), e.helmValues()...), extra...)
		} else {
			args = append(append(args, "-n", "kube-system"), extra...)
		}
		_, err := e.helmCmd(ctx, 3*time.Minute, args...)
		return err
	}
}

// rolledOut waits for DaemonSet ds in kube-system to finish its rollout.
func (e *env) rolledOut(ds string) func(context.Context) error {
	return func(ctx context.Context) error {
		r := e.kube.Cmd(ctx, 2*time.Minute, "rollout", "status", "-n", "kube-system", "daemonset/"+ds, "--timeout=100s").Run()
		if r.Err != nil {
			return fmt.Errorf("daemonset %s: %v: %s", ds, r.Err, r.Stderr)
		}
		return nil
	}
}

// agentsConnected waits until the server counts exactly want agents.
func (e *env) agentsConnected(want float64) func(context.Context) error {
	return func(ctx context.Context) error {
		return waitFor(ctx, fmt.Sprintf("%v agents connected to the server", want), time.Minute, func() error {
			n, err := e.metricSum("konnectivity_network_proxy_server_ready_backend_connections")
			if err == nil && n != want {
				err = fmt.Errorf("ready_backend_connections %v", n)
			}
			return err
		})
	}
}

// tetherServer writes tether's static Pod (helm template --set nodeManifests=true, with extra
// values) over the server's manifest and waits until the kubelet runs it.
func (e *env) tetherServer(extra ...string) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := e.prepareServerFiles(ctx, nonroot); err != nil {
			return err
		}
		args := append(append([]string{"template", "tether", e.chart, "-n", "kube-system", "--set", "nodeManifests=true"},
			e.helmValues()...), extra...)
		manifest, err := e.helmCmd(ctx, time.Minute, args...)
		if err != nil {
			return err
		}
		return e.replaceServer(ctx, manifest, e.images.tether)
	}
}

// replaceServer writes manifest over the server's static Pod and waits until the kubelet runs
// it with image and an agent is back.
func (e *env) replaceServer(ctx context.Context, manifest, image string) error {
	old := e.serverConfigHash(ctx)
	if err := os.WriteFile(e.node(staticPodFile), []byte(manifest), 0o600); err != nil {
		return err
	}
	return e.waitServerWithAgent(ctx, image, old)
}

// underLoad installs with install, starts the workloads and the load, runs each step and
// holds its state for settle, and returns each step's figures. The run fails when a step
// fails or when, after the last step, webhook calls still fail.
func (e *env) underLoad(ctx context.Context, title, before, after string, install, uninstall func(context.Context) error,
	steps []step) ([]stepResult, error) {
	fmt.Printf("\n== %s\n", title)
	if err := install(ctx); err != nil {
		return nil, fmt.Errorf("installing: %v", err)
	}
	defer func() { _ = uninstall(ctx) }()
	if err := e.startWorkloads(ctx); err != nil {
		return nil, err
	}
	defer func() { _ = e.stopWorkloads(ctx) }()
	// The webhook's endpoint reaches kube-apiserver a moment after its pod is Ready.
	if err := waitFor(ctx, "a first webhook call", time.Minute, func() error { _, err := e.webhookCalls(ctx, 1); return err }); err != nil {
		return nil, err
	}
	l, err := e.startLoad(ctx, before)
	if err != nil {
		return nil, err
	}
	time.Sleep(settle)
	var stepErr error
	for _, s := range steps {
		l.setStep(s.name)
		start := time.Now()
		err := s.do(ctx)
		fmt.Printf("   %-100s %s (%.1f s)\n", s.name, okOrErr(err), time.Since(start).Seconds())
		if err != nil {
			stepErr = fmt.Errorf("%s: %v", s.name, err)
			break
		}
		time.Sleep(settle)
	}
	if stepErr == nil {
		l.setStep(after)
		time.Sleep(settle)
	}
	l.stop()
	res := l.results()
	for _, r := range res {
		fmt.Printf("   %-100s webhook ok %d failed %d (longest failing %d ms), logs -f broken %d\n", r.step, r.ok, r.failed, r.longestFailing.Milliseconds(), r.breaks)
	}
	if stepErr == nil {
		if last := res[len(res)-1]; last.failed > 0 || last.ok == 0 {
			stepErr = fmt.Errorf("after the last step webhooks still fail: %d ok, %d failed", last.ok, last.failed)
		}
	}
	return res, stepErr
}

func okOrErr(err error) string {
	if err != nil {
		return "FAIL: " + err.Error()
	}
	return "ok"
}
