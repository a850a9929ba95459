package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"strings"
	"text/template"
	"time"
)

const flowsNamespace = "flows"

// workloads are the pods the flows reach: "app" serves HTTP (container web, with an emptyDir
// for kubectl cp) and logs a numbered tick (container ticker); "webhook" is an admission
// webhook that counts its calls, registered for ConfigMaps labelled flows-probe in this
// namespace with failurePolicy Fail, so every such create goes through the proxy or fails.
var workloads = template.Must(template.New("workloads").Parse(`apiVersion: v1
kind: Namespace
metadata:
  name: flows
---
apiVersion: v1
kind: Pod
metadata:
  name: app
  namespace: flows
  labels: {app: web}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: {{.Image}}
    imagePullPolicy: Never
    args: [serve]
    env: [{name: PORT, value: "8080"}]
    ports: [{containerPort: 8080}]
    readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
    volumeMounts: [{name: data, mountPath: /data}]
  - name: ticker
    image: {{.Image}}
    imagePullPolicy: Never
    args: [log-every, 300ms]
  volumes: [{name: data, emptyDir: {}}]
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: flows
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Secret
metadata:
  name: webhook-tls
  namespace: flows
type: kubernetes.io/tls
data:
  tls.crt: {{.WebhookCert}}
  tls.key: {{.WebhookKey}}
---
apiVersion: v1
kind: Pod
metadata:
  name: webhook
  namespace: flows
  labels: {app: webhook}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: webhook
    image: {{.Image}}
    imagePullPolicy: Never
    args: [webhook, -port, "8443"]
    ports: [{containerPort: 8443}]
    readinessProbe: {httpGet: {scheme: HTTPS, path: /healthz, port: 8443}, periodSeconds: 1}
    volumeMounts: [{name: tls, mountPath: /etc/webhook, readOnly: true}]
  volumes: [{name: tls, secret: {secretName: webhook-tls}}]
---
apiVersion: v1
kind: Service
metadata:
  name: webhook
  namespace: flows
spec:
  selector: {app: webhook}
  ports: [{name: https, port: 443, targetPort: 8443}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: tether-flows
webhooks:
- name: probe.flows.tether.dev
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  timeoutSeconds: 10
  namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: flows}}
  objectSelector: {matchLabels: {flows-probe: "yes"}}
  rules:
  - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}
  clientConfig:
    caBundle: {{.WebhookCA}}
    service: {namespace: flows, name: webhook, port: 443, path: /validate}
`))

// webhookTLS makes a CA and the webhook's serving certificate for webhook.flows.svc, base64
// PEM as the objects above take them.
func webhookTLS() (ca, cert, key string, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", "", err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "flows webhook CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return "", "", "", err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", "", err
	}
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "webhook.flows.svc"},
		DNSNames: []string{"webhook.flows.svc"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caTmpl, &leafKey.PublicKey, caKey)
	if err != nil {
		return "", "", "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(leafKey)
	if err != nil {
		return "", "", "", err
	}
	b64 := func(typ string, der []byte) string {
		return base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
	}
	return b64("CERTIFICATE", caDER), b64("CERTIFICATE", leafDER), b64("EC PRIVATE KEY", keyDER), nil
}

// startWorkloads creates the workloads and waits for both pods to be Ready.
func (e *env) startWorkloads(ctx context.Context) error {
	ca, cert, key, err := webhookTLS()
	if err != nil {
		return err
	}
	e.webhookCA = ca
	objs, err := render(workloads, map[string]string{"Image": e.images.app, "WebhookCA": ca, "WebhookCert": cert, "WebhookKey": key})
	if err != nil {
		return err
	}
	// The namespace first: its pods need its default ServiceAccount, which
	// kube-controller-manager creates a moment later (longer right after kube-apiserver
	// restarted, as the sidecar and hosted variants make it).
	namespace := e.kube.Cmd(ctx, time.Minute, "create", "namespace", flowsNamespace).Run()
	if namespace.Err != nil {
		return fmt.Errorf("kubectl create namespace: %v: %s", namespace.Err, namespace.Stderr)
	}
	err = waitFor(ctx, "the flows namespace's default ServiceAccount", 2*time.Minute, func() error {
		r := e.kube.Cmd(ctx, 10*time.Second, "get", "serviceaccount", "default", "-n", flowsNamespace, "-o", "name").Run()
		if r.Err != nil {
			return fmt.Errorf("%v %s", r.Err, strings.TrimSpace(r.Stderr))
		}
		return nil
	})
	if err != nil {
		return err
	}
	if r := e.kube.Cmd(ctx, time.Minute, "apply", "-f", "-").WithStdin(objs).Run(); r.Err != nil {
		return fmt.Errorf("kubectl apply: %v: %s", r.Err, r.Stderr)
	}
	r := e.kube.Cmd(ctx, 2*time.Minute, "wait", "-n", flowsNamespace, "--for=condition=Ready", "--timeout=100s", "pod/app", "pod/webhook").Run()
	if r.Err != nil {
		return fmt.Errorf("workloads not Ready: %v: %s", r.Err, strings.TrimSpace(r.Stderr))
	}
	// kube-apiserver resolves the Services through their EndpointSlices, which
	// kube-controller-manager writes a moment after the pods are Ready (longer right after
	// kube-apiserver restarted, while its informers list again).
	for _, service := range []string{"web", "webhook"} {
		err := waitFor(ctx, "Service "+service+"'s EndpointSlice with a ready address", time.Minute, func() error {
			r := e.kube.Cmd(ctx, 10*time.Second, "get", "endpointslices", "-n", flowsNamespace,
				"-l", "kubernetes.io/service-name="+service,
				"-o", `jsonpath={.items[*].endpoints[?(@.conditions.ready==true)].addresses[0]}`).Run()
			if r.Err != nil || strings.TrimSpace(r.Stdout) == "" {
				return fmt.Errorf("no ready address yet %s", strings.TrimSpace(r.Stderr))
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// stopWorkloads deletes them and waits until they are gone.
func (e *env) stopWorkloads(ctx context.Context) error {
	e.removeAPIService(ctx)
	r := e.kube.Cmd(ctx, 2*time.Minute, "delete", "validatingwebhookconfiguration/tether-flows", "namespace/"+flowsNamespace,
		"--ignore-not-found", "--wait=true", "--timeout=100s").Run()
	if r.Err != nil {
		return fmt.Errorf("deleting the workloads: %v: %s", r.Err, r.Stderr)
	}
	return nil
}
