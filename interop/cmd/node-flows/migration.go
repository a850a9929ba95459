package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"
)

// migrationStep is one step of the README's runbook "Migrating from Konnectivity": what an
// operator does, run while webhook calls and a `logs -f` flow through the proxy.
type migrationStep struct {
	name string
	do   func(context.Context) error
}

// settle is how long each step's state is held under load before the next step, so a step's
// figures include its after-effects.
const settle = 8 * time.Second

// migrationSteps switch upstream's Konnectivity (as the kubernetes.io task installs it) to
// tether and back, in the order the README gives.
func (e *env) migrationSteps() []migrationStep {
	helm := func(verb string, extra ...string) func(context.Context) error {
		return func(ctx context.Context) error {
			args := append(append([]string{verb, "tether", e.chart, "-n", "kube-system"}, e.helmValues()...), extra...)
			_, err := e.helmCmd(ctx, 3*time.Minute, args...)
			return err
		}
	}
	rollout := func(ds string) func(context.Context) error {
		return func(ctx context.Context) error {
			r := e.kube.Cmd(ctx, 2*time.Minute, "rollout", "status", "-n", "kube-system", "daemonset/"+ds, "--timeout=100s").Run()
			if r.Err != nil {
				return fmt.Errorf("daemonset %s: %v: %s", ds, r.Err, r.Stderr)
			}
			return nil
		}
	}
	backends := func(want float64) func(context.Context) error {
		return func(ctx context.Context) error {
			return waitFor(ctx, fmt.Sprintf("%v agents connected to the server", want), time.Minute, func() error {
				n, err := metricSum("konnectivity_network_proxy_server_ready_backend_connections", nil)
				if err == nil && n != want {
					err = fmt.Errorf("ready_backend_connections %v", n)
				}
				return err
			})
		}
	}
	upstreamServer := func(ctx context.Context) error {
		server, err := render(upstreamServer, map[string]string{"Image": e.images.upstreamServer})
		if err == nil {
			err = os.WriteFile(e.node(staticPodFile), []byte(server), 0o600)
		}
		return err
	}
	tetherServer := func(ctx context.Context) error {
		if err := e.prepareServerFiles(ctx, nonroot); err != nil {
			return err
		}
		manifest, err := e.helmCmd(ctx, time.Minute, append([]string{"template", "tether", e.chart, "-n", "kube-system",
			"--set", "nodeManifests=true"}, e.helmValues()...)...)
		if err == nil {
			err = os.WriteFile(e.node(staticPodFile), []byte(manifest), 0o600)
		}
		return err
	}
	deleteUpstreamAgents := func(ctx context.Context) error {
		r := e.kube.Cmd(ctx, 2*time.Minute, "delete", "daemonset", "-n", "kube-system", "konnectivity-agent", "--wait=true", "--timeout=100s").Run()
		if r.Err != nil {
			return fmt.Errorf("deleting upstream's DaemonSet: %v: %s", r.Err, r.Stderr)
		}
		return nil
	}
	applyUpstreamAgents := func(ctx context.Context) error {
		agent, err := render(upstreamAgent, map[string]string{"Image": e.images.upstreamAgent, "ServerHost": e.nodeIP})
		if err != nil {
			return err
		}
		if r := e.kube.Cmd(ctx, time.Minute, "apply", "-f", "-").WithStdin(agent).Run(); r.Err != nil {
			return fmt.Errorf("kubectl apply: %v: %s", r.Err, r.Stderr)
		}
		return nil
	}
	seq := func(fs ...func(context.Context) error) func(context.Context) error {
		return func(ctx context.Context) error {
			for _, f := range fs {
				if err := f(ctx); err != nil {
					return err
				}
			}
			return nil
		}
	}
	return []migrationStep{
		{"1. tether's agents beside upstream's (helm install, server.kind=none, agent.serviceAccount.create=false)",
			seq(helm("install", "--set", "server.kind=none", "--set", "agent.serviceAccount.create=false"), rollout("tether-agent"), backends(2))},
		{"2. upstream's agents removed (kubectl delete daemonset konnectivity-agent)", seq(deleteUpstreamAgents, backends(1))},
		{"3. the server switched to tether (helm upgrade server.kind=staticPod, its node document over the old)",
			seq(helm("upgrade", "--set", "server.kind=staticPod", "--set", "agent.serviceAccount.create=false"), tetherServer,
				func(ctx context.Context) error { return e.waitServerWithAgent(ctx, e.images.tether) })},
		{"4. rollback: the server back to upstream's (its manifest written back)",
			seq(upstreamServer, func(ctx context.Context) error { return e.waitServerWithAgent(ctx, e.images.upstreamServer) })},
		{"5. rollback: upstream's agents back (kubectl apply)", seq(applyUpstreamAgents, rollout("konnectivity-agent"), backends(2))},
		{"6. rollback: tether uninstalled (helm uninstall; upstream's ServiceAccount stays)",
			seq(func(ctx context.Context) error {
				_, err := e.helmCmd(ctx, 3*time.Minute, "uninstall", "tether", "-n", "kube-system", "--wait", "--timeout=150s")
				return err
			}, backends(1))},
	}
}

// runMigration starts from upstream's install with traffic flowing, runs every step and records
// each step's failed webhook calls, broken streams and longest outage.
func (e *env) runMigration(ctx context.Context) ([]stepResult, error) {
	fmt.Printf("\n== migration from upstream to tether and back, under load\n")
	if err := e.installTaskManifests(ctx, e.images.upstreamServer, e.images.upstreamAgent); err != nil {
		return nil, fmt.Errorf("installing upstream: %v", err)
	}
	defer func() { _ = e.uninstallTaskManifests(ctx) }()
	if err := e.startWorkloads(ctx); err != nil {
		return nil, err
	}
	defer func() { _ = e.stopWorkloads(ctx) }()
	// The webhook's endpoint reaches kube-apiserver a moment after its pod is Ready.
	if _, err := e.webhookCalls(ctx, 1); err != nil {
		if err = waitFor(ctx, "a first webhook call", time.Minute, func() error { _, err := e.webhookCalls(ctx, 1); return err }); err != nil {
			return nil, err
		}
	}
	l, err := e.startLoad(ctx, "0. upstream only (before)")
	if err != nil {
		return nil, err
	}
	time.Sleep(settle)
	var stepErr error
	for _, s := range e.migrationSteps() {
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
		l.setStep("7. upstream only (after)")
		time.Sleep(settle)
	}
	l.stop()
	res := l.results()
	for _, r := range res {
		fmt.Printf("   %-100s webhook ok %d failed %d (longest failing %d ms), logs -f broken %d\n", r.step, r.ok, r.failed, r.longestFailingMs, r.breaks)
	}
	if stepErr == nil {
		last := res[len(res)-1]
		if last.failed > 0 || last.ok == 0 {
			stepErr = fmt.Errorf("after the rollback webhooks still fail: %d ok, %d failed", last.ok, last.failed)
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

// migrationMarkdown is the runbook's figures as a table.
func migrationMarkdown(res []stepResult) string {
	var b strings.Builder
	fmt.Fprintln(&b, "| step | webhook calls ok | failed | longest outage | `logs -f` broken |")
	fmt.Fprintln(&b, "| --- | --- | --- | --- | --- |")
	for _, r := range res {
		fmt.Fprintf(&b, "| %s | %d | %d | %.1f s | %d |\n", r.step, r.ok, r.failed, float64(r.longestFailingMs)/1000, r.breaks)
	}
	return b.String()
}
