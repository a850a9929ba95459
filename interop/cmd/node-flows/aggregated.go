package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/template"
	"time"
)

// apiService puts the webhook pod's aggregated API (node-app's flows.tether.dev/v1) behind
// kube-apiserver, with the webhook's CA: kube-apiserver's availability check and every request
// reach the pod through the proxy.
var apiService = template.Must(template.New("apiservice").Parse(`apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1.flows.tether.dev
spec:
  group: flows.tether.dev
  version: v1
  groupPriorityMinimum: 1000
  versionPriority: 15
  caBundle: {{.CA}}
  service: {namespace: flows, name: webhook, port: 443}
`))

const apiServiceName = "apiservice/v1.flows.tether.dev"

// aggregatedAPI registers the APIService, waits for it to be Available, reads a Ping with
// kubectl get --raw and lists pings with kubectl's discovery, then removes the APIService
// again: an unavailable APIService would hold up the namespace's deletion later.
func (e *env) aggregatedAPI(ctx context.Context) (string, error) {
	obj, err := render(apiService, map[string]string{"CA": e.webhookCA})
	if err != nil {
		return "", err
	}
	if r := e.kube.Cmd(ctx, 30*time.Second, "apply", "-f", "-").WithStdin(obj).Run(); r.Err != nil {
		return "", fmt.Errorf("kubectl apply the APIService: %v: %s", r.Err, strings.TrimSpace(r.Stderr))
	}
	defer e.removeAPIService(ctx)
	if r := e.kube.Cmd(ctx, 70*time.Second, "wait", "--for=condition=Available", "--timeout=60s", apiServiceName).Run(); r.Err != nil {
		why := e.kube.Cmd(ctx, 10*time.Second, "get", apiServiceName, "-o",
			`jsonpath={.status.conditions[?(@.type=="Available")].message}`).Run()
		return "", fmt.Errorf("the APIService is not Available: %s", strings.TrimSpace(why.Stdout+" "+r.Stderr))
	}
	res := e.kube.Cmd(ctx, 30*time.Second, "get", "--raw", "/apis/flows.tether.dev/v1/pings/probe").Run()
	if err := wantOutput(res, `"kind":"Ping"`); err != nil {
		return "", err
	}
	var p struct {
		ServedBy    string `json:"servedBy"`
		RequestedBy string `json:"requestedBy"`
	}
	if err := json.Unmarshal([]byte(res.Stdout), &p); err != nil {
		return "", fmt.Errorf("the Ping %q: %v", res.Stdout, err)
	}
	if p.ServedBy != "webhook" || p.RequestedBy == "" {
		return "", fmt.Errorf("served by %q for %q, want the webhook pod for kubectl's user", p.ServedBy, p.RequestedBy)
	}
	// kubectl's own discovery: kube-apiserver's /apis lists the group once it has read the
	// pod's discovery document, which may take it a moment after Available.
	err = waitFor(ctx, "kubectl get pings listing the webhook's ping", 30*time.Second, func() error {
		return wantOutput(e.kube.Cmd(ctx, 20*time.Second, "get", "pings.flows.tether.dev", "-o", "name").Run(),
			"ping.flows.tether.dev/webhook")
	})
	return "Available; a Ping served by the pod for " + p.RequestedBy, err
}

func (e *env) removeAPIService(ctx context.Context) {
	if r := e.kube.Cmd(ctx, 30*time.Second, "delete", apiServiceName, "--ignore-not-found", "--wait=true").Run(); r.Err != nil {
		fmt.Printf("   removing %s: %v %s\n", apiServiceName, r.Err, strings.TrimSpace(r.Stderr))
	}
}
