package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The files an operator prepares on a control-plane node, in kubeadm's layout.
const (
	udsDir        = "konnectivity-server"
	udsName       = "konnectivity-server.socket"
	serverConf    = "konnectivity-server.conf"
	staticPodFile = "manifests/konnectivity-server.yaml"
	// nonroot is the uid and gid both images run as.
	nonroot = 65532
)

func (e *env) node(rel string) string { return filepath.Join(e.etcK8s, rel) }

// mirrorPod is the API's copy of the server's static Pod.
func (e *env) mirrorPod() string { return "konnectivity-server-" + e.nodeName }

// runPKI runs steps of the node's openssl library (interop/node/lib/pki.sh) on its
// /etc/kubernetes; what names them in the error.
func (e *env) runPKI(ctx context.Context, what, steps string) error {
	cmd := exec.CommandContext(ctx, "bash", "-c", fmt.Sprintf("set -e\n. %q\n%s", e.pkiLib, steps))
	cmd.Env = append(os.Environ(), "ETC_K8S="+e.etcK8s, "NODE_NAME="+e.nodeName, "NODE_IP="+e.nodeIP,
		"APISERVER_URL=https://"+e.nodeIP+":6443")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("making %s: %v: %s", what, err, out)
	}
	return nil
}

// prepareServerFiles makes what both installs need on the node: the kubeconfig of user
// system:konnectivity-server and, for tether, the agent port's own certificate, with
// pki/ca.key as the README's openssl steps do (interop/node/lib/pki.sh). owner is the uid:gid
// that must read them (the socket directory too), or -1 to leave them root's.
func (e *env) prepareServerFiles(ctx context.Context, owner int) error {
	if err := e.runPKI(ctx, "the server's certificate and kubeconfig", fmt.Sprintf(`
pki_cert konnectivity-server-client ca /CN=system:konnectivity-server clientAuth
pki_kubeconfig "$ETC_K8S/%s" konnectivity-server-client system:konnectivity-server
pki_cert konnectivity-server ca /CN=konnectivity-server serverAuth IP:%s
`, serverConf, e.nodeIP)); err != nil {
		return err
	}
	if err := os.MkdirAll(e.node(udsDir), 0o770); err != nil {
		return err
	}
	if owner < 0 {
		return nil
	}
	// The README's steps: the socket's directory belongs to the image's user; the key and the
	// kubeconfig are readable by its group.
	if err := os.Chown(e.node(udsDir), owner, owner); err != nil {
		return err
	}
	if err := os.Chmod(e.node(udsDir), 0o770); err != nil {
		return err
	}
	for _, f := range []string{"pki/konnectivity-server.key", serverConf} {
		if err := os.Chown(e.node(f), 0, owner); err != nil {
			return err
		}
		if err := os.Chmod(e.node(f), 0o640); err != nil {
			return err
		}
	}
	return nil
}

// removeServerFiles undoes prepareServerFiles and removes the static Pod's manifest.
func (e *env) removeServerFiles() {
	for _, f := range []string{staticPodFile, serverConf, "pki/konnectivity-server.crt", "pki/konnectivity-server.key",
		"pki/konnectivity-server-client.crt", "pki/konnectivity-server-client.key"} {
		_ = os.Remove(e.node(f))
	}
}

// helmArgs are the values every tether install here sets: the image imported into the node, and
// where agents reach the server (the node's address; a load balancer's in a real cluster).
func (e *env) helmValues() []string {
	repo, tag, _ := strings.Cut(e.images.tether, ":")
	return []string{"--set", "image.repository=" + repo, "--set", "image.tag=" + tag,
		"--set", "image.pullPolicy=Never", "--set", "agent.proxyServerHost=" + e.nodeIP}
}

func (e *env) helmCmd(ctx context.Context, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.helm, append(args, "--kubeconfig", e.kube.Kubeconfig)...)
	cmd.WaitDelay = 2 * time.Second
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), fmt.Errorf("helm %s: %v: %s", args[0], err, strings.TrimSpace(string(ee.Stderr)))
		}
		return string(out), fmt.Errorf("helm %s: %v", args[0], err)
	}
	return string(out), nil
}

// installTether installs tether as the README says for a self-managed control plane: the
// release (agents, RBAC) with helm install, then on the node the prepared files and the
// server's static Pod rendered by helm (nodeManifests=true) into the kubelet's manifest
// directory.
func (e *env) installTether(ctx context.Context) error {
	return seq(e.helmStep("install"), e.tetherServer(), e.rolledOut("tether-agent"))(ctx)
}

// mtlsValues switch the agents to client certificates (auth.mode=mtls). The chart's one
// certificate proves no node, so agents go without host=/ipv4= identifiers (the chart's choice
// that keeps identity binding on) and the servers route by the default strategy, since their
// readiness follows the first one; one node needs no destHost routing.
var mtlsValues = []string{"--set", "auth.mode=mtls", "--set", "agent.identifiers=", "--set", "server.proxyStrategies=default"}

// installTetherMTLS installs tether as the book's mTLS variant: a CA for the agents' client
// certificates on the node (server.hostFiles.clusterCaCert), the agents' certificate with the
// CA that verifies the server in Secret tether-agent-tls (agent.tlsSecretName), then the same
// helm install and static Pod with auth.mode=mtls.
func (e *env) installTetherMTLS(ctx context.Context) error {
	if err := e.runPKI(ctx, "the agents' CA and certificate", `
pki_ca konnectivity-agent-ca konnectivity-agent-ca
pki_cert konnectivity-agent konnectivity-agent-ca /CN=konnectivity-agent clientAuth
`); err != nil {
		return err
	}
	r := e.kube.Cmd(ctx, 30*time.Second, "create", "secret", "generic", "tether-agent-tls", "-n", "kube-system",
		"--from-file=ca.crt="+e.node("pki/ca.crt"), "--from-file=tls.crt="+e.node("pki/konnectivity-agent.crt"),
		"--from-file=tls.key="+e.node("pki/konnectivity-agent.key")).Run()
	if r.Err != nil {
		return fmt.Errorf("creating Secret tether-agent-tls: %v: %s", r.Err, strings.TrimSpace(r.Stderr))
	}
	return seq(e.helmStep("install", mtlsValues...), e.tetherServer(mtlsValues...), e.rolledOut("tether-agent"))(ctx)
}

// uninstallTetherMTLS undoes installTetherMTLS: the release, and what the operator made by hand.
func (e *env) uninstallTetherMTLS(ctx context.Context) error {
	err := e.uninstallTether(ctx)
	r := e.kube.Cmd(ctx, 30*time.Second, "delete", "secret", "tether-agent-tls", "-n", "kube-system", "--ignore-not-found").Run()
	for _, f := range []string{"konnectivity-agent-ca.crt", "konnectivity-agent-ca.key", "konnectivity-agent.crt", "konnectivity-agent.key"} {
		_ = os.Remove(e.node("pki/" + f))
	}
	return errors.Join(err, r.Err)
}

func (e *env) uninstallTether(ctx context.Context) error {
	_, helmErr := e.helmCmd(ctx, 3*time.Minute, "uninstall", "tether", "-n", "kube-system", "--wait", "--timeout", "150s")
	_ = os.Remove(e.node(staticPodFile))
	return errors.Join(helmErr, e.waitNothingLeft(ctx, "app.kubernetes.io/instance=tether", true))
}

// serverConfigHash is the kubelet's hash of the server's static Pod manifest in force ("" when
// there is none), which changes when the kubelet has taken up a new manifest.
func (e *env) serverConfigHash(ctx context.Context) string {
	r := e.kube.Cmd(ctx, 10*time.Second, "get", "pod", "-n", "kube-system", e.mirrorPod(), "--ignore-not-found",
		"-o", `jsonpath={.metadata.annotations.kubernetes\.io/config\.hash}`).Run()
	return strings.TrimSpace(r.Stdout)
}

// waitServerWithAgent waits for the server's mirror Pod to run image, from a manifest other than
// the one hashed oldHash, and be Ready, and for an agent to be connected to it. Checking both
// matters when one server replaces another: the kubelet reads its manifest directory every
// 20 s, and the old server answers until then.
func (e *env) waitServerWithAgent(ctx context.Context, image, oldHash string) error {
	if err := waitFor(ctx, "the server's static Pod running "+image+" from its new manifest, Ready", 3*time.Minute, func() error {
		r := e.kube.Cmd(ctx, 10*time.Second, "get", "pod", "-n", "kube-system", e.mirrorPod(), "-o",
			`jsonpath={.metadata.annotations.kubernetes\.io/config\.hash} {.spec.containers[0].image} {.status.conditions[?(@.type=="Ready")].status}`).Run()
		got := strings.Fields(r.Stdout)
		if r.Err != nil || len(got) != 3 || got[0] == oldHash || got[1] != image || got[2] != "True" {
			return fmt.Errorf("config hash, image, Ready: %q (old hash %s) %s", strings.TrimSpace(r.Stdout), oldHash, strings.TrimSpace(r.Stderr))
		}
		return nil
	}); err != nil {
		return err
	}
	return waitFor(ctx, "an agent connected to the server", 2*time.Minute, func() error {
		n, err := e.metricSum("konnectivity_network_proxy_server_ready_backend_connections")
		if err == nil && n < 1 {
			err = fmt.Errorf("ready_backend_connections %v", n)
		}
		return err
	})
}

// waitNothingLeft waits until the server's static Pod and port, every object labelled selector
// and, with socket, the server's Unix socket are gone.
func (e *env) waitNothingLeft(ctx context.Context, selector string, socket bool) error {
	return waitFor(ctx, "nothing of the install left", 2*time.Minute, func() error {
		if _, err := os.Stat(e.node(staticPodFile)); err == nil {
			return errors.New("the static Pod's manifest is still there")
		}
		if _, err := os.Stat(filepath.Join(e.node(udsDir), udsName)); err == nil && socket {
			return fmt.Errorf("the socket %s is still there", filepath.Join(e.node(udsDir), udsName))
		}
		if _, err := httpClient.Get(loopbackMetricsURL); err == nil {
			return errors.New("the server still answers on its health port")
		}
		r := e.kube.Cmd(ctx, 20*time.Second, "get", "pods,daemonsets,deployments,services,serviceaccounts,leases",
			"-A", "-l", selector, "-o", "name").Run()
		if r.Err != nil {
			return fmt.Errorf("listing what is left: %v %s", r.Err, r.Stderr)
		}
		if left := strings.TrimSpace(r.Stdout); left != "" {
			return fmt.Errorf("still there: %s", strings.ReplaceAll(left, "\n", ", "))
		}
		r = e.kube.Cmd(ctx, 20*time.Second, "get", "pod", "-n", "kube-system", e.mirrorPod(), "--ignore-not-found", "-o", "name").Run()
		if strings.TrimSpace(r.Stdout) != "" {
			return errors.New("the server's mirror Pod is still there")
		}
		return nil
	})
}
