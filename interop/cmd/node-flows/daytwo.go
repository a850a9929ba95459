package main

import "context"

// dayTwoSteps are an operator's changes to a running tether install: an upgrade that rolls
// the agents, one that replaces the server, and a helm rollback.
func (e *env) dayTwoSteps() []step {
	return []step{
		{"1. helm upgrade that rolls the agents (agent.resources changed)",
			seq(e.helmStep("upgrade", "--set", "agent.resources.requests.cpu=60m"), e.rolledOut("tether-agent"), e.agentsConnected(1))},
		{"2. the server upgraded (its node document re-rendered with server.resources changed)",
			e.tetherServer("--set", "server.resources.requests.cpu=110m")},
		{"3. helm rollback (the agents roll back)",
			seq(e.helmStep("rollback"), e.rolledOut("tether-agent"), e.agentsConnected(1))},
	}
}

// runDayTwo installs tether as the README says and changes it under load.
func (e *env) runDayTwo(ctx context.Context) ([]stepResult, error) {
	return e.underLoad(ctx, "day 2: upgrades and a rollback of tether, under load",
		"0. tether installed (before)", "4. after the rollback", e.installTether, e.uninstallTether, e.dayTwoSteps())
}
