package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The webhook denies every object it is asked about, with this message: seeing it in
// kubectl's error proves kube-apiserver reached the webhook (through the proxy).
const webhookDenial = "denied by the tether k8s-flows webhook"

// startWebhook serves a validating admission webhook over TLS (a self-signed certificate for
// webhook.default.svc, which is also its caBundle) on every given address.
func (o *outside) startWebhook(hosts []string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "webhook.default.svc"},
		DNSNames:  []string{"webhook.default.svc"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	o.webhookCA = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(serveAdmission)}
	o.webhookPort = freePort(hosts...)
	for _, h := range hosts {
		ln, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(o.webhookPort)))
		if err != nil {
			return fmt.Errorf("webhook on %s: %w", h, err)
		}
		go func() {
			_ = srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
		}()
	}
	return nil
}

// serveAdmission answers an admission.k8s.io/v1 AdmissionReview with a denial.
func serveAdmission(w http.ResponseWriter, r *http.Request) {
	var review struct {
		Request struct {
			UID string `json:"uid"`
		} `json:"request"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&review); err != nil || review.Request.UID == "" {
		http.Error(w, "want an AdmissionReview", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"response": map[string]any{"uid": review.Request.UID, "allowed": false,
			"status": map[string]any{"code": 403, "message": webhookDenial}},
	})
}

// webhookFlow registers the webhook (a Service reference, so kube-apiserver resolves it to the
// EndpointSlice and dials it through the cluster egress) for labelled ConfigMaps only, then
// creates one and wants the webhook's denial.
func (e *env) webhookFlow(ctx context.Context, c *cluster, podIP string) error {
	o := e.outside
	objs := endpointSlice("webhook", "https", o.webhookPort, podIP) + "---\n" + fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: tether-k8s-flows
webhooks:
- name: deny.k8s-flows.tether.dev
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  timeoutSeconds: 10
  objectSelector:
    matchLabels: {tether-k8s-flows: webhook-probe}
  rules:
  - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}
  clientConfig:
    caBundle: %s
    service: {namespace: default, name: webhook, port: 443}
`, base64.StdEncoding.EncodeToString(o.webhookCA))
	if res := e.kubectl(ctx, c, 30*time.Second, "apply", "-f", "-").withStdin(objs).run(); res.err != nil {
		return fmt.Errorf("register the webhook: %v: %s", res.err, res.stderr)
	}
	// The webhook configuration and the EndpointSlice reach kube-apiserver's informers a
	// moment later; until then the ConfigMap may be admitted, or the call may fail.
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		cm := fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: webhook-probe-%d\n  namespace: default\n  labels: {tether-k8s-flows: webhook-probe}\n", i)
		res := e.kubectl(ctx, c, 30*time.Second, "create", "-f", "-").withStdin(cm).run()
		if res.err != nil && strings.Contains(res.stderr, webhookDenial) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no denial from the webhook after 20 s; last: %s %s", describe(res), strings.TrimSpace(res.stderr))
		}
		time.Sleep(300 * time.Millisecond)
	}
}
