package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// node is one fake node: a kwok process serving kubelet endpoints on its own IP.
type node struct{ name, ip, pod, podCIDR string }

// The fake nodes on loopback; -outside adds node-c on a non-loopback address.
var loopbackNodes = []node{
	{"node-a", "127.0.0.2", "pod-a", ""},
	{"node-b", "127.0.0.3", "pod-b", ""},
}

const adminToken = "tether-k8s-flows-admin"

// cluster is one control plane: etcd, kube-apiserver (egress through a proxy server) and kwok.
type cluster struct {
	dir        string
	etcd       *proc
	etcdURL    string
	apiserver  *proc
	apiURL     string
	kubeconfig string
	kwok       []*proc
	aggregated *aggregatedServer // the sample-apiserver behind the APIService, once started
}

// writeStatic writes what gen-pki does not: the static token file kubectl and kwok
// authenticate with, and kube-apiserver's service-account key pair (SEC1 private key, PKIX
// public key: the encodings its flags parse).
func (e *env) writeStatic() error {
	if err := os.WriteFile(filepath.Join(e.work, "tokens.csv"),
		[]byte(adminToken+",admin,admin-uid,system:masters\n"), 0o600); err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	priv, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(e.pki("sa.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: priv}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(e.pki("sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

// startCluster starts etcd, kube-apiserver with egress config egress, and one kwok per node,
// and creates the nodes and pods. dir is fresh for each row.
// startCluster starts a control plane whose kube-apiserver serves on 127.0.0.1:apiPort (chosen
// by the caller, so that a proxy server started first can allowlist it for reverse dials).
func (e *env) startCluster(ctx context.Context, name, egress string, apiPort int) (*cluster, error) {
	c := &cluster{dir: filepath.Join(e.work, name)}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, err
	}
	client, peer, metrics := freePort(), freePort(), freePort()
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", client)
	c.etcdURL = etcdURL
	var err error
	c.etcd, err = e.ps.start(name+"-etcd", e.bin("etcd"),
		"--name=default", "--data-dir="+filepath.Join(c.dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", peer),
		fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", peer),
		fmt.Sprintf("--initial-cluster=default=http://127.0.0.1:%d", peer),
		fmt.Sprintf("--listen-metrics-urls=http://127.0.0.1:%d", metrics), "--log-level=warn")
	if err != nil {
		return c, err
	}
	if err := waitStatus(etcdURL+"/health", 200, 30*time.Second); err != nil {
		return c, fmt.Errorf("etcd: %v\n%s", err, c.etcd.tail(20))
	}

	port := apiPort
	c.apiURL = fmt.Sprintf("https://127.0.0.1:%d", port)
	c.apiserver, err = e.ps.start(name+"-kube-apiserver", e.bin("kube-apiserver"),
		"--etcd-servers="+etcdURL, "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(port),
		"--tls-cert-file="+e.pki("server.crt"), "--tls-private-key-file="+e.pki("server.key"),
		"--client-ca-file="+e.pki("ca.crt"), "--token-auth-file="+filepath.Join(e.work, "tokens.csv"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+e.pki("sa.pub"), "--service-account-signing-key-file="+e.pki("sa.key"),
		"--api-audiences=https://kubernetes.default.svc.cluster.local",
		"--authorization-mode=Node,RBAC", "--service-cluster-ip-range=10.96.0.0/16",
		// No loopback Endpoints for the kubernetes Service; nothing ever dials the service CIDR.
		"--endpoint-reconciler-type=none",
		"--egress-selector-config-file="+egress, "--kubelet-preferred-address-types=InternalIP",
		// Webhooks and APIServices referenced by Service go to its EndpointSlice, not its
		// (unrouted) ClusterIP.
		"--enable-aggregator-routing=true",
		// The aggregator's front-proxy identity toward aggregated API servers (the gen-pki
		// client certificate, CN=proxy-client; the one CA also signs kubectl-style client
		// certificates, so only that name may set the identity headers), and what they trust.
		"--proxy-client-cert-file="+e.pki("client.crt"), "--proxy-client-key-file="+e.pki("client.key"),
		"--requestheader-client-ca-file="+e.pki("ca.crt"), "--requestheader-allowed-names=proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group", "--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--enable-priority-and-fairness=false", "--profiling=false", "-v=1")
	if err != nil {
		return c, err
	}
	c.kubeconfig = filepath.Join(c.dir, "admin.kubeconfig")
	if err := os.WriteFile(c.kubeconfig, []byte(kubeconfig(c.apiURL, e.pki("ca.crt"), "admin", adminToken)), 0o600); err != nil {
		return c, err
	}
	if err := e.waitReady(ctx, c); err != nil {
		return c, err
	}

	// Nodes first (kwok manages existing ones), the default ServiceAccount (no controller
	// manager runs to create it), then one kwok per node, then the pods (bound: no scheduler).
	var objs strings.Builder
	for _, n := range e.nodes {
		fmt.Fprintf(&objs, "apiVersion: v1\nkind: Node\nmetadata:\n  name: %s\n  labels: {type: kwok}\n---\n", n.name)
	}
	objs.WriteString("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: default\n  namespace: default\n---\n")
	if e.outside != nil {
		objs.WriteString(e.outside.objects())
	}
	if r := e.kubectl(ctx, c, 30*time.Second, "apply", "-f", "-").withStdin(objs.String()).run(); r.err != nil {
		return c, fmt.Errorf("create nodes: %v: %s", r.err, r.stderr)
	}
	for _, n := range e.nodes {
		p, err := e.startKwok(c, name, n)
		if err != nil {
			return c, err
		}
		c.kwok = append(c.kwok, p)
	}
	for i, n := range e.nodes {
		if err := e.waitKwok(c, name, n, i); err != nil {
			return c, err
		}
	}
	objs.Reset()
	for _, n := range e.nodes {
		fmt.Fprintf(&objs, `apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: default
spec:
  nodeName: %s
  automountServiceAccountToken: false
  containers:
  - name: app
    image: fake.invalid/app
---
`, n.pod, n.name)
	}
	if r := e.kubectl(ctx, c, 30*time.Second, "apply", "-f", "-").withStdin(objs.String()).run(); r.err != nil {
		return c, fmt.Errorf("create pods: %v: %s", r.err, r.stderr)
	}
	for _, n := range e.nodes {
		if r := e.kubectl(ctx, c, 70*time.Second, "wait", "--for=condition=Ready", "--timeout=60s", "node/"+n.name, "pod/"+n.pod).run(); r.err != nil {
			return c, fmt.Errorf("wait for %s and %s: %v: %s", n.name, n.pod, r.err, r.stderr)
		}
	}
	return c, nil
}

// kwokStartupRace is how kwok v0.8.0 sometimes dies as it starts, before it serves anything:
// two of its goroutines register CEL types in one map (easycel's getTrait). Such a kwok is
// started again, at most kwokStarts times in all; any other failure fails the row.
const (
	kwokStartupRace = "fatal error: concurrent map writes"
	kwokStarts      = 3
)

// startKwok starts the kwok that plays node n of cluster c.
func (e *env) startKwok(c *cluster, name string, n node) (*proc, error) {
	args := []string{"--kubeconfig=" + c.kubeconfig, "--config=" + e.kwokConfig,
		"--manage-single-node=" + n.name, "--node-ip=" + n.ip, "--node-port=" + strconv.Itoa(e.kubeletPort),
		fmt.Sprintf("--server-address=%s:%d", n.ip, e.kubeletPort)}
	if n.podCIDR != "" {
		args = append(args, "--cidr="+n.podCIDR)
	}
	return e.ps.start(name+"-kwok-"+n.name, e.bin("kwok"), args...)
}

// waitKwok waits until c.kwok[i], node n's kwok, answers on its kubelet port, starting it
// again if it died of kwokStartupRace.
func (e *env) waitKwok(c *cluster, name string, n node, i int) error {
	url := fmt.Sprintf("https://%s:%d/healthz", n.ip, e.kubeletPort)
	for start := 1; ; start++ {
		p := c.kwok[i]
		err := waitStatusWhile(url, 200, 60*time.Second, p)
		if err == nil {
			return nil
		}
		log, _ := os.ReadFile(p.log)
		if !p.exited() || start == kwokStarts || !strings.Contains(string(log), kwokStartupRace) {
			return fmt.Errorf("kwok %s: %v\n%s", n.name, err, p.tail(20))
		}
		fmt.Printf("   kwok %s died of its startup race (%q, %s); starting it again (%d of %d)\n",
			n.name, kwokStartupRace, p.log, start+1, kwokStarts)
		next, err := e.startKwok(c, name, n)
		if err != nil {
			return err
		}
		c.kwok[i] = next
	}
}

// waitReady polls kube-apiserver's /readyz through kubectl's credentials, for at most 90 s.
func (e *env) waitReady(ctx context.Context, c *cluster) error {
	deadline := time.Now().Add(90 * time.Second)
	var last kubectlResult
	for time.Now().Before(deadline) {
		if c.apiserver.exited() {
			return fmt.Errorf("kube-apiserver exited:\n%s", c.apiserver.tail(8))
		}
		if last = e.kubectl(ctx, c, 10*time.Second, "get", "--raw=/readyz").run(); last.err == nil && strings.TrimSpace(last.stdout) == "ok" {
			return nil
		}
		time.Sleep(300 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready after 90 s: %v %s\n%s", last.err, last.stderr, c.apiserver.tail(8))
}

func (c *cluster) stop() {
	var procs []*proc
	if c.aggregated != nil {
		procs = append(procs, c.aggregated.proc)
	}
	for _, p := range append(append(procs, c.kwok...), c.apiserver, c.etcd) {
		if p != nil {
			p.stop()
		}
	}
}

// writeKwokConfig writes kwok's --config: the node and pod lifecycle Stages shipped in kwok's
// module (kwok refuses to start without stages) and the kubelet-endpoint rules for the flows.
func (e *env) writeKwokConfig() error {
	var b strings.Builder
	for _, f := range []string{"node/fast/node-initialize.yaml", "node/heartbeat/node-heartbeat.yaml",
		"pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml"} {
		data, err := os.ReadFile(filepath.Join(e.kwokStages, f))
		if err != nil {
			return fmt.Errorf("kwok stages: %w", err)
		}
		b.WriteString(strings.TrimSpace(string(data)))
		b.WriteString("\n---\n")
	}
	fmt.Fprintf(&b, `apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterLogs
metadata:
  name: flows
spec:
  logs:
  - logsFile: %s
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterAttach
metadata:
  name: flows
spec:
  attaches:
  - logsFile: %s
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterExec
metadata:
  name: flows
spec:
  execs:
  - local:
      workDir: %s
      envs:
      - name: FAKE_POD
        value: "yes"
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterPortForward
metadata:
  name: flows
spec:
  forwards:
  - ports: [%d]
    target: {address: 127.0.0.1, port: %d}
  - ports: [%d]
    target: {address: 127.0.0.1, port: %d}
`, e.logsFile, e.attachFile, e.work, podHTTPPort, e.httpPort, podEchoPort, e.echoPort)
	e.kwokConfig = filepath.Join(e.work, "kwok.yaml")
	return os.WriteFile(e.kwokConfig, []byte(b.String()), 0o644)
}

// The pod ports kubectl port-forward asks for; kwok maps them to test-target on 127.0.0.1.
const (
	podHTTPPort = 8080
	podEchoPort = 9000
)

// criLine is one container log line in the CRI format kwok's logs reader wants.
func criLine(text string) string {
	return time.Now().UTC().Format(time.RFC3339Nano) + " stdout F " + text + "\n"
}

func appendLine(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString(criLine(text))
	return err
}
