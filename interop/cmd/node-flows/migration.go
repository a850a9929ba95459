package main

import (
	"context"
	"fmt"
	"time"
)

// settle is how long each step's state is held under load before the next step, so a step's
// figures include its after-effects.
const settle = 8 * time.Second

// migrationSteps switch upstream's Konnectivity (as the kubernetes.io task installs it) to
// tether and back, in the order the README's "Migrating from Konnectivity" gives.
func (e *env) migrationSteps() []step {
	deleteUpstreamAgents := func(ctx context.Context) error {
		r := e.kube.Cmd(ctx, 2*time.Minute, "delete", "daemonset", "-n", "kube-system", "konnectivity-agent", "--wait=true", "--timeout=100s").Run()
		if r.Err != nil {
			return fmt.Errorf("deleting upstream's DaemonSet: %v: %s", r.Err, r.Stderr)
		}
		return nil
	}
	uninstall := func(ctx context.Context) error {
		_, err := e.helmCmd(ctx, 3*time.Minute, "uninstall", "tether", "-n", "kube-system", "--wait", "--timeout=150s")
		return err
	}
	keepSA := []string{"--set", "agent.serviceAccount.create=false"}
	return []step{
		{"1. tether's agents beside upstream's (helm install, server.kind=none, agent.serviceAccount.create=false)",
			seq(e.helmStep("install", append(keepSA, "--set", "server.kind=none")...), e.rolledOut("tether-agent"), e.agentsConnected(2))},
		{"2. upstream's agents removed (kubectl delete daemonset konnectivity-agent)", seq(deleteUpstreamAgents, e.agentsConnected(1))},
		{"3. the server switched to tether (helm upgrade server.kind=staticPod, its node document over the old)",
			seq(e.helmStep("upgrade", append(keepSA, "--set", "server.kind=staticPod")...), e.tetherServer(keepSA...))},
		{"4. rollback: the server back to upstream's (its manifest written back)", e.taskServer(e.images.upstreamServer)},
		{"5. rollback: upstream's agents back (kubectl apply)", seq(e.taskAgents(e.images.upstreamAgent), e.rolledOut("konnectivity-agent"), e.agentsConnected(2))},
		{"6. rollback: tether uninstalled (helm uninstall; upstream's ServiceAccount stays)", seq(uninstall, e.agentsConnected(1))},
	}
}

// runMigration starts from upstream's install with traffic flowing and runs the runbook.
func (e *env) runMigration(ctx context.Context) ([]stepResult, error) {
	return e.underLoad(ctx, "migration from upstream to tether and back, under load",
		"0. upstream only (before)", "7. upstream only (after)",
		func(ctx context.Context) error {
			return e.installTaskManifests(ctx, e.images.upstreamServer, e.images.upstreamAgent)
		}, e.uninstallTaskManifests, e.migrationSteps())
}
