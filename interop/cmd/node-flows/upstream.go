package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/template"
	"time"
)

// upstreamServer is the server's static Pod as the kubernetes.io task "Set up Konnectivity
// service" describes it (its flags, ports, probe and mounts: kube-apiserver's own serving
// certificate on the agent port, token authentication), with the task's image swapped for the
// one built here and, with AsRoot, one line added: upstream's images run as uid 65532
// (distroless nonroot, BASEIMAGE in upstream's Makefile since v0.30), which can neither read
// kubeadm's root-only apiserver.key nor create the socket in a root-owned directory, so the Pod
// runs as root.
var upstreamServer = template.Must(template.New("server").Parse(`apiVersion: v1
kind: Pod
metadata:
  name: konnectivity-server
  namespace: kube-system
  labels:
    k8s-app: konnectivity-server
spec:
  priorityClassName: system-cluster-critical
  hostNetwork: true
{{- if .AsRoot}}
  securityContext: {runAsUser: 0, runAsGroup: 0}
{{- end}}
  containers:
  - name: konnectivity-server-container
    image: {{.Image}}
    imagePullPolicy: Never
    command: ["/proxy-server"]
    args:
    - --logtostderr=true
    - --uds-name=/etc/kubernetes/konnectivity-server/konnectivity-server.socket
    - --delete-existing-uds-file
    - --cluster-cert=/etc/kubernetes/pki/apiserver.crt
    - --cluster-key=/etc/kubernetes/pki/apiserver.key
    - --mode=grpc
    - --server-port=0
    - --agent-port=8132
    - --admin-port=8133
    - --health-port=8134
    - --agent-namespace=kube-system
    - --agent-service-account=konnectivity-agent
    - --kubeconfig=/etc/kubernetes/konnectivity-server.conf
    - --authentication-audience=system:konnectivity-server
    livenessProbe:
      httpGet: {scheme: HTTP, host: 127.0.0.1, port: 8134, path: /healthz}
      initialDelaySeconds: 30
      timeoutSeconds: 60
    ports:
    - {name: agentport, containerPort: 8132, hostPort: 8132}
    - {name: adminport, containerPort: 8133, hostPort: 8133}
    - {name: healthport, containerPort: 8134, hostPort: 8134}
    volumeMounts:
    - {name: k8s-certs, mountPath: /etc/kubernetes/pki, readOnly: true}
    - {name: kubeconfig, mountPath: /etc/kubernetes/konnectivity-server.conf, readOnly: true}
    - {name: konnectivity-uds, mountPath: /etc/kubernetes/konnectivity-server, readOnly: false}
  volumes:
  - {name: k8s-certs, hostPath: {path: /etc/kubernetes/pki}}
  - {name: kubeconfig, hostPath: {path: /etc/kubernetes/konnectivity-server.conf, type: FileOrCreate}}
  - {name: konnectivity-uds, hostPath: {path: /etc/kubernetes/konnectivity-server, type: DirectoryOrCreate}}
`))

// upstreamAgent is the task's agent objects: RBAC for the server's user, the agents'
// ServiceAccount and their DaemonSet with a projected token.
var upstreamAgent = template.Must(template.New("agent").Parse(`apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:konnectivity-server
  labels:
    kubernetes.io/cluster-service: "true"
    addonmanager.kubernetes.io/mode: Reconcile
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:auth-delegator
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: system:konnectivity-server
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: konnectivity-agent
  namespace: kube-system
  labels:
    kubernetes.io/cluster-service: "true"
    addonmanager.kubernetes.io/mode: Reconcile
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  labels:
    addonmanager.kubernetes.io/mode: Reconcile
    k8s-app: konnectivity-agent
  namespace: kube-system
  name: konnectivity-agent
spec:
  selector:
    matchLabels:
      k8s-app: konnectivity-agent
  template:
    metadata:
      labels:
        k8s-app: konnectivity-agent
    spec:
      priorityClassName: system-cluster-critical
      tolerations:
      - {key: CriticalAddonsOnly, operator: Exists}
      - {operator: Exists, effect: NoExecute}
      nodeSelector:
        kubernetes.io/os: linux
      containers:
      - image: {{.Image}}
        imagePullPolicy: Never
        name: konnectivity-agent
        command: ["/proxy-agent"]
        args:
        - --logtostderr=true
        - --ca-cert=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt
        - --proxy-server-host={{.ServerHost}}
        - --proxy-server-port=8132
        - --admin-server-port=8133
        - --health-server-port=8134
        - --service-account-token-path=/var/run/secrets/tokens/konnectivity-agent-token
        volumeMounts:
        - {mountPath: /var/run/secrets/tokens, name: konnectivity-agent-token}
        livenessProbe:
          httpGet: {port: 8134, path: /healthz}
          initialDelaySeconds: 15
          timeoutSeconds: 15
      serviceAccountName: konnectivity-agent
      volumes:
      - name: konnectivity-agent-token
        projected:
          sources:
          - serviceAccountToken:
              path: konnectivity-agent-token
              audience: system:konnectivity-server
`))

func render(t *template.Template, data any) (string, error) {
	var b strings.Builder
	err := t.Execute(&b, data)
	return b.String(), err
}

// installTaskManifests installs the kubernetes.io task's manifests with the given images (the
// task's own, upstream's, or tether's swapped in).
func (e *env) installTaskManifests(ctx context.Context, serverImage, agentImage string) error {
	if err := e.prepareServerFiles(ctx, -1); err != nil {
		return err
	}
	return seq(e.taskAgents(agentImage), e.taskServer(serverImage), e.rolledOut("konnectivity-agent"))(ctx)
}

// taskServer writes the task's server Pod with image over the server's manifest and waits
// until the kubelet runs it.
func (e *env) taskServer(image string) func(context.Context) error {
	return func(ctx context.Context) error {
		server, err := render(upstreamServer, map[string]any{"Image": image, "AsRoot": true})
		if err != nil {
			return err
		}
		return e.replaceServer(ctx, server, image)
	}
}

// taskAgents applies the task's agent objects with image.
func (e *env) taskAgents(image string) func(context.Context) error {
	return func(ctx context.Context) error {
		agent, err := render(upstreamAgent, map[string]string{"Image": image, "ServerHost": e.nodeIP})
		if err != nil {
			return err
		}
		if r := e.kube.Cmd(ctx, time.Minute, "apply", "-f", "-").WithStdin(agent).Run(); r.Err != nil {
			return fmt.Errorf("kubectl apply: %v: %s", r.Err, r.Stderr)
		}
		return nil
	}
}

func (e *env) uninstallTaskManifests(ctx context.Context) error {
	agent, _ := render(upstreamAgent, map[string]string{"Image": "unused", "ServerHost": e.nodeIP})
	r := e.kube.Cmd(ctx, 2*time.Minute, "delete", "-f", "-", "--ignore-not-found", "--wait=true").WithStdin(agent).Run()
	var delErr error
	if r.Err != nil {
		delErr = fmt.Errorf("kubectl delete: %v: %s", r.Err, r.Stderr)
	}
	_ = os.Remove(e.node(staticPodFile))
	return errors.Join(delErr, e.waitNothingLeft(ctx, "k8s-app=konnectivity-agent", false))
}

// nonRootAdvice replaces the running drop-in server with the task's Pod without its root line
// (operator trial B3) and checks that tether, as uid 65532, stops with an error that names its
// uid, the file it cannot read and both fixes; then puts the root line back.
func (e *env) nonRootAdvice(ctx context.Context) (string, error) {
	server, err := render(upstreamServer, map[string]any{"Image": e.images.tether, "AsRoot": false})
	if err != nil {
		return "", err
	}
	old := e.serverConfigHash(ctx)
	if err := os.WriteFile(e.node(staticPodFile), []byte(server), 0o600); err != nil {
		return "", err
	}
	// Not kubectl logs: it reaches the kubelet through this very proxy, which is down. The
	// kubelet's own log files, as crictl logs reads them on a control-plane node.
	var advice string
	err = waitFor(ctx, "the non-root server's error in the kubelet's log files", 2*time.Minute, func() error {
		if hash := e.serverConfigHash(ctx); hash == "" || hash == old {
			return fmt.Errorf("the kubelet still runs the old manifest (hash %q)", hash)
		}
		line, err := e.serverLogLine("65532")
		advice = line
		return err
	})
	if err != nil {
		return "", err
	}
	// Whichever it meets first: kubeadm's root-only key, or the root-owned socket directory.
	fix := map[string]string{"cannot read /etc/kubernetes/pki/apiserver.key": "chgrp 65532 /etc/kubernetes/pki/apiserver.key",
		"cannot create a socket in /etc/kubernetes/konnectivity-server": "install -d -o 65532 -g 65532 -m 0770 /etc/kubernetes/konnectivity-server"}
	var what string
	for refused, chgrp := range fix {
		if strings.Contains(advice, refused) && strings.Contains(advice, chgrp) {
			what = refused
		}
	}
	if what == "" || !strings.Contains(advice, "runs as uid 65532") || !strings.Contains(advice, "runAsUser: 0") {
		return "", fmt.Errorf("the error %q does not name uid 65532, what it cannot do with its fix, and runAsUser: 0", advice)
	}
	if err := e.taskServer(e.images.tether)(ctx); err != nil {
		return "", fmt.Errorf("the root line back: %v", err)
	}
	return "uid 65532 " + what + ", with both fixes", nil
}

// serverLogLine finds the last line holding want in the server's container logs, which the
// kubelet keeps under its podLogsDir (the node's pod-logs, beside its /etc/kubernetes) as
// kube-system_POD_UID/CONTAINER/N.log.
func (e *env) serverLogLine(want string) (string, error) {
	pattern := filepath.Join(filepath.Dir(e.etcK8s), "pod-logs", "kube-system_"+e.mirrorPod()+"_*", "*", "*.log")
	files, err := filepath.Glob(pattern)
	if err != nil {
		return "", err
	}
	var found string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, want) {
				found = line
			}
		}
	}
	if found == "" {
		return "", fmt.Errorf("no line with %q in %d log files (%s)", want, len(files), pattern)
	}
	return found, nil
}
