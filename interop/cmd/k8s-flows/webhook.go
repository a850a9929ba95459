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
	"errors"
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
	cert, err := selfSigned("webhook.default.svc")
	if err != nil {
		return err
	}
	o.webhookCA = cert.certPEM
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(serveAdmission)}
	o.webhookPort = freePort(hosts...)
	for _, h := range hosts {
		ln, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(o.webhookPort)))
		if err != nil {
			return fmt.Errorf("webhook on %s: %w", h, err)
		}
		go func() {
			_ = srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert.pair}, MinVersion: tls.VersionTLS12}))
		}()
	}
	return nil
}

// serving is a self-signed serving certificate (its own CA: the caBundle that trusts it).
type serving struct {
	certPEM, keyPEM []byte
	pair            tls.Certificate
}

func selfSigned(dnsName string) (serving, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return serving{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: dnsName},
		DNSNames:  []string{dnsName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return serving{}, err
	}
	priv, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return serving{}, err
	}
	return serving{
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: priv}),
		pair:    tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
	}, nil
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

// The webhooks of the agent-gone flows: same Service, one per failurePolicy, each for the
// ConfigMaps with its label value, and a timeout that bounds the wait when the call fails.
const (
	goneTimeoutSeconds = 5
	goneFail           = "agent-gone-fail"
	goneIgnore         = "agent-gone-ignore"
)

func goneWebhooks(ca []byte) string {
	var b strings.Builder
	b.WriteString("apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata:\n  name: tether-k8s-flows-agent-gone\nwebhooks:\n")
	for _, w := range []struct{ label, policy string }{{goneFail, "Fail"}, {goneIgnore, "Ignore"}} {
		fmt.Fprintf(&b, `- name: %[1]s.k8s-flows.tether.dev
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: %[2]s
  timeoutSeconds: %[3]d
  objectSelector:
    matchLabels: {tether-k8s-flows: %[1]s}
  rules:
  - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}
  clientConfig:
    caBundle: %[4]s
    service: {namespace: default, name: webhook, port: 443}
`, w.label, w.policy, goneTimeoutSeconds, base64.StdEncoding.EncodeToString(ca))
	}
	return b.String()
}

// createConfigMap creates ConfigMap name with the webhook label value label, and returns
// kubectl's result and how long it took.
func (e *env) createConfigMap(ctx context.Context, c *cluster, name, label string) (kubectlResult, time.Duration) {
	cm := fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s\n  namespace: default\n  labels: {tether-k8s-flows: %s}\n", name, label)
	started := time.Now()
	res := e.kubectl(ctx, c, 30*time.Second, "create", "-f", "-").withStdin(cm).run()
	return res, time.Since(started)
}

// runAgentGoneFlows registers a failurePolicy Fail and a failurePolicy Ignore webhook on the
// webhook's Service, proves that kube-apiserver calls both through the proxy while the agent
// is connected (they deny), then stops the agent: Fail must refuse with kube-apiserver's
// "failed calling webhook" error carrying the proxy's failure, Ignore must admit, both within
// the webhook's timeoutSeconds (no hang). The agent is started again afterwards.
func (e *env) runAgentGoneFlows(ctx context.Context, r *row, c *cluster, p *proxy, tag string) {
	failName, ignoreName := "webhook, agent gone: Fail", "webhook, agent gone: Ignore"
	setup := func() error {
		if res := e.kubectl(ctx, c, 30*time.Second, "apply", "-f", "-").withStdin(goneWebhooks(e.outside.webhookCA)).run(); res.err != nil {
			return fmt.Errorf("register the webhooks: %v: %s", res.err, res.stderr)
		}
		for _, label := range []string{goneFail, goneIgnore} {
			deadline := time.Now().Add(20 * time.Second)
			for i := 0; ; i++ {
				res, _ := e.createConfigMap(ctx, c, fmt.Sprintf("%s-%s-%d", label, tag, i), label)
				if res.err != nil && strings.Contains(res.stderr, webhookDenial) {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("the %s webhook did not deny with the agent connected; last: %s %s", label, describe(res), strings.TrimSpace(res.stderr))
				}
				time.Sleep(300 * time.Millisecond)
			}
		}
		p.agent.stop()
		if err := waitMetricAtMost(p.metricsURL(), "konnectivity_network_proxy_server_ready_backend_connections", 0, 10*time.Second); err != nil {
			return fmt.Errorf("the server still counts the stopped agent: %v", err)
		}
		return nil
	}
	err := setup()
	bound := time.Duration(goneTimeoutSeconds)*time.Second + 5*time.Second
	r.run(failName, func() (string, error) {
		if err != nil {
			return "", err
		}
		res, took := e.createConfigMap(ctx, c, goneFail+"-"+tag, goneFail)
		msg := lastLine(res.stderr)
		r.goneFail = msg
		switch {
		case res.err == nil:
			return "", errors.New("admitted with the agent gone, despite failurePolicy Fail")
		case strings.Contains(res.stderr, webhookDenial):
			return "", errors.New("the webhook was called with the agent gone: " + msg)
		case !strings.Contains(res.stderr, `failed calling webhook "`+goneFail):
			return "", errors.New("not refused for the failed webhook call: " + msg)
		case took > bound:
			return "", fmt.Errorf("refused after %v, more than timeoutSeconds (%d s) allows", took.Round(100*time.Millisecond), goneTimeoutSeconds)
		}
		if why := proxyFailure(r.shape, res.stderr); why != "" {
			return "", errors.New(why + ": " + msg)
		}
		return fmt.Sprintf("refused in %v: %s", took.Round(10*time.Millisecond), msg), nil
	})
	r.run(ignoreName, func() (string, error) {
		if err != nil {
			return "", err
		}
		res, took := e.createConfigMap(ctx, c, goneIgnore+"-"+tag, goneIgnore)
		switch {
		case res.err != nil:
			return "", fmt.Errorf("refused with the agent gone, despite failurePolicy Ignore: %s: %s", describe(res), lastLine(res.stderr))
		case took > bound:
			return "", fmt.Errorf("admitted after %v, more than timeoutSeconds (%d s) allows", took.Round(100*time.Millisecond), goneTimeoutSeconds)
		}
		return fmt.Sprintf("admitted in %v", took.Round(10*time.Millisecond)), nil
	})
	if p.agent.exited() {
		if err := e.startAgent(p, c); err != nil {
			r.err = fmt.Errorf("restarting the agent after the agent-gone flows: %w", err)
		}
	}
}

// proxyFailure says what is missing when kube-apiserver's error does not carry the proxy's
// failure: the server's DIAL_RSP error on gRPC, the CONNECT answer's status on HTTP CONNECT.
func proxyFailure(sh shape, stderr string) string {
	want := map[string]string{"grpc": "No agent available", "http-connect": "proxy error from"}[sh.mode]
	if !strings.Contains(stderr, want) {
		return fmt.Sprintf("kube-apiserver's error does not carry the proxy's failure (%q)", want)
	}
	return ""
}
