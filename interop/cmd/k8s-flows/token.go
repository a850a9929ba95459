package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"tether.dev/interop/internal/metrics"
)

// How agents authenticate to the proxy server: each flow runs in both modes.
const (
	mtlsAuth  = "mTLS"  // the agent's client certificate, checked with --cluster-ca-cert
	tokenAuth = "token" // a ServiceAccount token, checked with a TokenReview
)

// The names of the kubernetes.io task "Set up Konnectivity service".
const (
	agentNamespace      = "kube-system"
	agentServiceAccount = "konnectivity-agent"
	serverAccount       = "konnectivity-server"
	agentAudience       = "system:konnectivity-server"
)

// tokens are the files of token mode: the server's kubeconfig (a ServiceAccount allowed to
// create TokenReviews) and the agent's token for the konnectivity audience.
type tokens struct {
	serverKubeconfig, agentToken string
}

// tokenAccounts is the agent's ServiceAccount and the server's, bound to
// system:auth-delegator so that it may create TokenReviews (the task binds an x509 user; a
// ServiceAccount token in the server's kubeconfig needs no extra certificate).
const tokenAccounts = `apiVersion: v1
kind: ServiceAccount
metadata: {name: ` + agentServiceAccount + `, namespace: ` + agentNamespace + `}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: ` + serverAccount + `, namespace: ` + agentNamespace + `}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ` + serverAccount + `-auth-delegator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:auth-delegator}
subjects:
- {kind: ServiceAccount, name: ` + serverAccount + `, namespace: ` + agentNamespace + `}
`

// setupTokens creates the ServiceAccounts and their tokens (TokenRequest, through kubectl) in c.
func (e *env) setupTokens(ctx context.Context, c *cluster) (*tokens, error) {
	if r := e.kubectl(ctx, c, 30*time.Second, "apply", "-f", "-").withStdin(tokenAccounts).run(); r.err != nil {
		return nil, fmt.Errorf("create the ServiceAccounts: %v: %s", r.err, r.stderr)
	}
	create := func(account string, extra ...string) (string, error) {
		args := append([]string{"create", "token", account, "-n", agentNamespace, "--duration=2h"}, extra...)
		r := e.kubectl(ctx, c, 30*time.Second, args...).run()
		if r.err != nil {
			return "", fmt.Errorf("kubectl create token %s: %v: %s", account, r.err, r.stderr)
		}
		// Without the newline: upstream's agent sends the file's bytes as they are, and
		// grpc-go refuses a header value ending in one.
		return strings.TrimSpace(r.stdout), nil
	}
	serverToken, err := create(serverAccount)
	if err != nil {
		return nil, err
	}
	agentToken, err := create(agentServiceAccount, "--audience="+agentAudience)
	if err != nil {
		return nil, err
	}
	t := &tokens{
		serverKubeconfig: filepath.Join(c.dir, "konnectivity-server.kubeconfig"),
		agentToken:       filepath.Join(c.dir, "konnectivity-agent-token"),
	}
	if err := os.WriteFile(t.serverKubeconfig, []byte(kubeconfig(c.apiURL, e.pki("ca.crt"), serverAccount, serverToken)), 0o600); err != nil {
		return nil, err
	}
	return t, os.WriteFile(t.agentToken, []byte(agentToken), 0o600)
}

// kubeconfig is a kubeconfig for url as user with a bearer token.
func kubeconfig(url, ca, user, token string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: local
  context: {cluster: local, user: %s, namespace: default}
current-context: local
`, url, ca, user, token, user)
}

// tokenReviews is how many TokenReviews c's API server has handled, from its own metrics.
func (e *env) tokenReviews(c *cluster) (float64, error) {
	r := e.kubectl(context.Background(), c, 30*time.Second, "get", "--raw=/metrics").run()
	if r.err != nil {
		return 0, fmt.Errorf("kube-apiserver /metrics: %v: %s", r.err, r.stderr)
	}
	v, err := metricSumText(r.stdout, "apiserver_request_total", `resource="tokenreviews"`)
	if err == metrics.ErrMissing {
		return 0, nil
	}
	return v, err
}
