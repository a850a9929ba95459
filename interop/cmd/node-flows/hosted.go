package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// The hosted variant on one node, which plays both clusters of the book's two installs: the
// servers' release (server.kind=deployment, no agents) and the agents' release (server.kind=none)
// pointed at the servers' Service. kube-apiserver reaches the servers' frontend Service over
// HTTP CONNECT with mutual TLS, as a hosted control plane's does.
const (
	hostedServerRelease = "tether-server"
	hostedServers       = 2
	hostedServerPods    = "app.kubernetes.io/instance=" + hostedServerRelease + ",app.kubernetes.io/component=server"
	egressSelectorFile  = "egress-selector-configuration.yaml"
)

// hostedEgress is kube-apiserver's egress selector for the hosted variant: the cluster selection
// over HTTP CONNECT to the frontend Service, with a client certificate of the frontend's CA.
const hostedEgress = `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      tcp:
        url: https://%s:8131
        tlsConfig:
          caBundle: /etc/kubernetes/pki/ca.crt
          clientCert: /etc/kubernetes/pki/konnectivity-frontend-client.crt
          clientKey: /etc/kubernetes/pki/konnectivity-frontend-client.key
`

// hostedFiles are the certificates the hosted install makes under the node's pki directory.
var hostedFiles = []string{"konnectivity-server-agents", "konnectivity-server-frontend", "konnectivity-frontend-ca",
	"konnectivity-frontend-client"}

func (e *env) serviceIP(ctx context.Context, name string) (string, error) {
	r := e.kube.Cmd(ctx, 10*time.Second, "get", "service", "-n", "kube-system", name, "-o", "jsonpath={.spec.clusterIP}").Run()
	ip := strings.TrimSpace(r.Stdout)
	if r.Err != nil || ip == "" {
		return "", fmt.Errorf("the ClusterIP of Service %s: %v %s", name, r.Err, strings.TrimSpace(r.Stderr))
	}
	return ip, nil
}

// installTetherHosted installs the servers' release first, as a provider does in the management
// cluster; makes the serving certificates for its two Services' addresses (the agents' and
// kube-apiserver's) and Secret tether-server-tls, which the servers' pods wait for; installs the
// agents' release pointed at the agents' Service; waits until every server is Ready (each turns
// Ready with its first agent: B1) and the agent holds all of them; and last points kube-apiserver's
// egress selector at the frontend Service (a restart of kube-apiserver).
func (e *env) installTetherHosted(ctx context.Context) error {
	e.serverPods = hostedServerPods
	_, err := e.helmCmd(ctx, 3*time.Minute, append(append([]string{"install", hostedServerRelease, e.chart, "-n", "kube-system"},
		e.helmValues()...), "--set", "server.kind=deployment", "--set", "agent.enabled=false",
		"--set", "server.count="+strconv.Itoa(hostedServers))...)
	if err != nil {
		return err
	}
	agentsIP, err := e.serviceIP(ctx, "konnectivity-server-agents")
	if err != nil {
		return err
	}
	frontendIP, err := e.serviceIP(ctx, "konnectivity-server")
	if err != nil {
		return err
	}
	if err := e.runPKI(ctx, "the servers' certificates", fmt.Sprintf(`
pki_cert konnectivity-server-agents ca /CN=konnectivity-server serverAuth IP:%s
pki_cert konnectivity-server-frontend ca /CN=konnectivity-server serverAuth IP:%s
pki_ca konnectivity-frontend-ca konnectivity-frontend-ca
pki_cert konnectivity-frontend-client konnectivity-frontend-ca /CN=kube-apiserver clientAuth
`, agentsIP, frontendIP)); err != nil {
		return err
	}
	pki := func(f string) string { return e.node("pki/" + f) }
	r := e.kube.Cmd(ctx, 30*time.Second, "create", "secret", "generic", "tether-server-tls", "-n", "kube-system",
		"--from-file=cluster.crt="+pki("konnectivity-server-agents.crt"), "--from-file=cluster.key="+pki("konnectivity-server-agents.key"),
		"--from-file=frontend.crt="+pki("konnectivity-server-frontend.crt"), "--from-file=frontend.key="+pki("konnectivity-server-frontend.key"),
		"--from-file=frontend-ca.crt="+pki("konnectivity-frontend-ca.crt")).Run()
	if r.Err != nil {
		return fmt.Errorf("creating Secret tether-server-tls: %v: %s", r.Err, strings.TrimSpace(r.Stderr))
	}
	if _, err := e.helmCmd(ctx, 3*time.Minute, append(append([]string{"install", "tether", e.chart, "-n", "kube-system"},
		e.helmValues()...), "--set", "server.kind=none", "--set", "agent.proxyServerHost="+agentsIP)...); err != nil {
		return err
	}
	if err := seq(e.rolledOut("tether-agent"), e.serversRolledOut, e.agentsConnected(hostedServers))(ctx); err != nil {
		return err
	}
	return e.pointEgress(ctx, fmt.Sprintf(hostedEgress, frontendIP))
}

// serversRolledOut waits for the servers' Deployment to finish its rollout, every server Ready.
func (e *env) serversRolledOut(ctx context.Context) error {
	r := e.kube.Cmd(ctx, 3*time.Minute, "rollout", "status", "-n", "kube-system", "deployment/konnectivity-server", "--timeout=150s").Run()
	if r.Err != nil {
		return fmt.Errorf("deployment konnectivity-server: %v: %s %s", r.Err, strings.TrimSpace(r.Stdout), strings.TrimSpace(r.Stderr))
	}
	return nil
}

// pointEgress writes kube-apiserver's egress selector configuration in place (the Pod mounts the
// file itself) and restarts kube-apiserver to read it: a changed annotation in its manifest.
func (e *env) pointEgress(ctx context.Context, config string) error {
	if e.apiserverOriginal == nil {
		original, err := os.ReadFile(e.node(apiserverManifest))
		if err != nil {
			return err
		}
		egress, err := os.ReadFile(e.node(egressSelectorFile))
		if err != nil {
			return err
		}
		e.apiserverOriginal, e.egressOriginal = original, egress
	}
	if err := os.WriteFile(e.node(egressSelectorFile), []byte(config), 0o644); err != nil {
		return err
	}
	manifest := strings.Replace(string(e.apiserverOriginal), "  annotations:\n",
		"  annotations:\n    tether.dev/egress-selector: "+randomWord()+"\n", 1)
	if manifest == string(e.apiserverOriginal) {
		return errors.New("kube-apiserver's manifest has no annotations to change")
	}
	return e.replaceAPIServer(ctx, []byte(manifest))
}

// restoreAPIServer puts kube-apiserver's egress selector configuration and manifest back as
// they were before a variant changed them, and waits for it to restart.
func (e *env) restoreAPIServer(ctx context.Context) error {
	if e.apiserverOriginal == nil {
		return nil
	}
	var err error
	if e.egressOriginal != nil {
		err = os.WriteFile(e.node(egressSelectorFile), e.egressOriginal, 0o644)
	}
	err = errors.Join(err, e.replaceAPIServer(ctx, e.apiserverOriginal))
	e.apiserverOriginal, e.egressOriginal = nil, nil
	return err
}

// uninstallTetherHosted undoes installTetherHosted: kube-apiserver's egress selector back, both
// releases uninstalled, and what the operator made by hand removed.
func (e *env) uninstallTetherHosted(ctx context.Context) error {
	err := e.restoreAPIServer(ctx)
	for _, release := range []string{"tether", hostedServerRelease} {
		if _, uerr := e.helmCmd(ctx, 3*time.Minute, "uninstall", release, "-n", "kube-system", "--wait", "--timeout", "150s"); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}
	r := e.kube.Cmd(ctx, 30*time.Second, "delete", "secret", "tether-server-tls", "-n", "kube-system", "--ignore-not-found").Run()
	for _, f := range hostedFiles {
		_ = os.Remove(e.node("pki/" + f + ".crt"))
		_ = os.Remove(e.node("pki/" + f + ".key"))
	}
	e.serverPods = ""
	return errors.Join(err, r.Err, e.waitNothingLeft(ctx, "app.kubernetes.io/name=tether", false))
}

// scaleServers sets the servers' Deployment to n replicas.
func (e *env) scaleServers(ctx context.Context, n int) error {
	r := e.kube.Cmd(ctx, 30*time.Second, "scale", "-n", "kube-system", "deployment/konnectivity-server", "--replicas="+strconv.Itoa(n)).Run()
	if r.Err != nil {
		return fmt.Errorf("kubectl scale: %v: %s", r.Err, strings.TrimSpace(r.Stderr))
	}
	return nil
}

// everythingReady says whether every agent and kube-apiserver are Ready now.
func (e *env) everythingReady(ctx context.Context) error {
	r := e.kube.Cmd(ctx, 10*time.Second, "get", "daemonset", "-n", "kube-system", "tether-agent", "-o",
		"jsonpath={.status.numberReady} {.status.desiredNumberScheduled}").Run()
	if got := strings.Fields(r.Stdout); r.Err != nil || len(got) != 2 || got[0] != got[1] || got[0] == "0" {
		return fmt.Errorf("agents Ready/desired: %q %s", strings.TrimSpace(r.Stdout), strings.TrimSpace(r.Stderr))
	}
	r = e.kube.Cmd(ctx, 10*time.Second, "get", "pod", "-n", "kube-system", e.apiserverMirrorPod(), "-o",
		`jsonpath={.status.conditions[?(@.type=="Ready")].status}`).Run()
	if r.Err != nil || strings.TrimSpace(r.Stdout) != "True" {
		return fmt.Errorf("kube-apiserver Ready: %q %s", strings.TrimSpace(r.Stdout), strings.TrimSpace(r.Stderr))
	}
	return nil
}

// oneServerDown takes one of the two servers away (the Deployment scaled to 1, so it stays
// away), and for 10 s checks every second that the agents and kube-apiserver stay Ready and a
// webhook call passes through the server left; then brings the second server back and waits
// until the agent holds both again (operator trial A8).
func (e *env) oneServerDown(ctx context.Context) (string, error) {
	if err := e.scaleServers(ctx, 1); err != nil {
		return "", err
	}
	held := time.Now()
	err := waitFor(ctx, "one server left, holding the agent", 2*time.Minute, func() error {
		urls, err := e.serverMetricsURLs(ctx)
		if err == nil && len(urls) != 1 {
			err = fmt.Errorf("%d servers running", len(urls))
		}
		if err == nil {
			var n float64
			if n, err = e.metricSum("konnectivity_network_proxy_server_ready_backend_connections"); err == nil && n != 1 {
				err = fmt.Errorf("ready_backend_connections %v", n)
			}
		}
		return err
	})
	calls := 0
	for deadline := time.Now().Add(10 * time.Second); err == nil && time.Now().Before(deadline); calls++ {
		if err = e.everythingReady(ctx); err == nil {
			_, err = e.webhookCalls(ctx, 1)
		}
		time.Sleep(time.Second)
	}
	down := time.Since(held)
	back := seq(func(ctx context.Context) error { return e.scaleServers(ctx, hostedServers) }, e.serversRolledOut,
		e.agentsConnected(hostedServers))(ctx)
	if err != nil {
		return "", fmt.Errorf("with one server down: %v", err)
	}
	if back != nil {
		return "", fmt.Errorf("bringing the second server back: %v", back)
	}
	return fmt.Sprintf("%d webhook calls over %.0f s with one server, all passed; the agent back on both", calls, down.Seconds()), nil
}

// serverRollout restarts the servers' Deployment and checks that the rollout finishes, the
// agent holds every new server and a webhook call passes (operator trial B1: a server turns
// Ready only with an agent, which reaches it through a Service that publishes it before).
func (e *env) serverRollout(ctx context.Context) (string, error) {
	start := time.Now()
	r := e.kube.Cmd(ctx, 30*time.Second, "rollout", "restart", "-n", "kube-system", "deployment/konnectivity-server").Run()
	if r.Err != nil {
		return "", fmt.Errorf("kubectl rollout restart: %v: %s", r.Err, strings.TrimSpace(r.Stderr))
	}
	if err := seq(e.serversRolledOut, e.agentsConnected(hostedServers))(ctx); err != nil {
		return "", err
	}
	took := time.Since(start)
	if _, err := e.webhookCalls(ctx, 5); err != nil {
		return "", err
	}
	return fmt.Sprintf("rolled out and both servers held in %.0f s", took.Seconds()), nil
}
