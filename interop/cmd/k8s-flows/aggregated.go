package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The aggregated API flow: k8s.io/sample-apiserver (its wardle.example.com/v1alpha1 group,
// stored in the test's etcd under its own prefix) on pod-c's IP, behind an APIService whose
// Service points there. kube-apiserver's aggregator reaches it through the cluster egress,
// so `kubectl create` and `kubectl get` of a Flunder cross the proxy.
const (
	apiServiceName = "v1alpha1.wardle.example.com"
	aggregatedHost = "api.default.svc"
)

// aggregatedServer is a running sample-apiserver.
type aggregatedServer struct {
	proc *proc
	port int
	ca   []byte // its self-signed certificate: the APIService's caBundle
}

// startAggregated starts c's sample-apiserver on podIP, once per cluster: it authenticates
// the aggregator by its front-proxy certificate and delegates authorization to kube-apiserver.
func (e *env) startAggregated(c *cluster, podIP string) (*aggregatedServer, error) {
	if c.aggregated != nil {
		return c.aggregated, nil
	}
	cert, err := selfSigned(aggregatedHost)
	if err != nil {
		return nil, err
	}
	certFile, keyFile := filepath.Join(c.dir, "sample-apiserver.crt"), filepath.Join(c.dir, "sample-apiserver.key")
	if err := os.WriteFile(certFile, cert.certPEM, 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(keyFile, cert.keyPEM, 0o600); err != nil {
		return nil, err
	}
	a := &aggregatedServer{port: freePort(podIP), ca: cert.certPEM}
	a.proc, err = e.ps.start(filepath.Base(c.dir)+"-sample-apiserver", e.sampleAPIServer,
		"--etcd-servers="+c.etcdURL, "--bind-address="+podIP, "--secure-port="+strconv.Itoa(a.port),
		"--tls-cert-file="+certFile, "--tls-private-key-file="+keyFile, "--cert-dir="+filepath.Join(c.dir, "sample-apiserver-certs"),
		"--kubeconfig="+c.kubeconfig, "--authentication-kubeconfig="+c.kubeconfig, "--authorization-kubeconfig="+c.kubeconfig,
		"--enable-priority-and-fairness=false",
		// It would call webhooks by their Service's unrouted ClusterIP; the flows need none.
		"--disable-admission-plugins=MutatingAdmissionWebhook,ValidatingAdmissionWebhook,MutatingAdmissionPolicy,ValidatingAdmissionPolicy",
		"-v=1")
	if err != nil {
		return nil, err
	}
	if err := waitStatus(fmt.Sprintf("https://%s:%d/readyz", podIP, a.port), 200, 60*time.Second); err != nil {
		a.proc.stop()
		return nil, fmt.Errorf("sample-apiserver: %v\n%s", err, a.proc.tail(20))
	}
	c.aggregated = a
	return a, nil
}

// aggregatedFlow registers the APIService, waits until kube-apiserver finds it available
// (its availability check crosses the proxy too), creates a Flunder and gets it back, and
// removes the APIService again, so that no later kubectl's discovery depends on it.
func (e *env) aggregatedFlow(ctx context.Context, c *cluster, podIP, tag string) (string, error) {
	if e.sampleAPIServer == "" {
		return "", fmt.Errorf("no -sample-apiserver given")
	}
	a, err := e.startAggregated(c, podIP)
	if err != nil {
		return "", err
	}
	objs := fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: api
  namespace: default
spec:
  ports:
  - {name: https, port: 443, targetPort: %d, protocol: TCP}
---
%s---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: %s
spec:
  group: wardle.example.com
  version: v1alpha1
  groupPriorityMinimum: 1000
  versionPriority: 15
  caBundle: %s
  service: {namespace: default, name: api, port: 443}
`, a.port, endpointSlice("api", "https", a.port, podIP), apiServiceName, base64.StdEncoding.EncodeToString(a.ca))
	if res := e.kubectl(ctx, c, 30*time.Second, "apply", "-f", "-").withStdin(objs).run(); res.err != nil {
		return "", fmt.Errorf("register the APIService: %v: %s", res.err, res.stderr)
	}
	defer e.kubectl(ctx, c, 30*time.Second, "delete", "apiservice", apiServiceName, "--wait=false").run()
	started := time.Now()
	if res := e.kubectl(ctx, c, 70*time.Second, "wait", "--for=condition=Available", "--timeout=60s", "apiservice/"+apiServiceName).run(); res.err != nil {
		status := e.kubectl(ctx, c, 30*time.Second, "get", "apiservice", apiServiceName, "-o", "jsonpath={.status.conditions}").run()
		return "", fmt.Errorf("APIService not Available: %s: %s; conditions %s", describe(res), strings.TrimSpace(res.stderr), status.stdout)
	}
	available := time.Since(started)
	name := "flunder-" + tag
	flunder := fmt.Sprintf("apiVersion: wardle.example.com/v1alpha1\nkind: Flunder\nmetadata:\n  name: %s\n  namespace: default\nspec: {}\n", name)
	if res := e.kubectl(ctx, c, 30*time.Second, "create", "-f", "-").withStdin(flunder).run(); res.err != nil {
		return "", fmt.Errorf("create a Flunder: %s: %s", describe(res), strings.TrimSpace(res.stderr))
	}
	res := e.kubectl(ctx, c, 30*time.Second, "get", "flunders.wardle.example.com", name, "-o", "jsonpath={.metadata.name}/{.metadata.uid}").run()
	if res.err != nil {
		return "", fmt.Errorf("get the Flunder: %s: %s", describe(res), strings.TrimSpace(res.stderr))
	}
	got, uid, _ := strings.Cut(strings.TrimSpace(res.stdout), "/")
	if got != name || uid == "" {
		return "", fmt.Errorf("kubectl get flunder: %q, want %s with a uid", res.stdout, name)
	}
	return fmt.Sprintf("APIService Available after %v; Flunder %s created and read back", available.Round(100*time.Millisecond), name), nil
}
