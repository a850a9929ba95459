package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

// admissionReview is the part of admission.k8s.io/v1 AdmissionReview the webhook reads and writes.
type admissionReview struct {
	APIVersion string             `json:"apiVersion"`
	Kind       string             `json:"kind"`
	Request    *admissionRequest  `json:"request,omitempty"`
	Response   *admissionResponse `json:"response,omitempty"`
}

type admissionRequest struct {
	UID       string `json:"uid"`
	Operation string `json:"operation"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Resource  struct {
		Resource string `json:"resource"`
	} `json:"resource"`
}

type admissionResponse struct {
	UID     string `json:"uid"`
	Allowed bool   `json:"allowed"`
}

// webhook serves an admission webhook over HTTPS that allows every request and counts them, so
// a flow can tell how many calls kube-apiserver made through the proxy: GET /count answers the
// number, /healthz is the probe, /apis/ is a small aggregated API, any other path takes
// AdmissionReviews.
func webhook(args []string) error {
	fs := flag.NewFlagSet("webhook", flag.ContinueOnError)
	cert := fs.String("cert", "/etc/webhook/tls.crt", "serving certificate (PEM)")
	key := fs.String("key", "/etc/webhook/tls.key", "its private key (PEM)")
	port := fs.String("port", envOr("PORT", "8443"), "port to listen on (default $PORT or 8443)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger := log.New(os.Stdout, "", log.LstdFlags|log.Lmicroseconds)
	srv := &http.Server{Addr: ":" + *port, Handler: newWebhookHandler(logger), ReadHeaderTimeout: 10 * time.Second}
	logger.Printf("node-app webhook serving HTTPS on :%s with %s", *port, *cert)
	return srv.ListenAndServeTLS(*cert, *key)
}

// newWebhookHandler answers AdmissionReviews on any path outside /apis/ with allowed: true, GET
// /count with the number of reviews answered, /healthz, and the aggregated API of aggregated.go.
func newWebhookHandler(logger *log.Logger) http.Handler {
	var reviews atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/count", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, reviews.Load()) })
	addAggregatedAPI(mux, logger)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
		var review admissionReview
		if err == nil {
			err = json.Unmarshal(body, &review)
		}
		if err != nil || review.Request == nil {
			logger.Printf("webhook: bad review from %s: %v", r.RemoteAddr, err)
			http.Error(w, "want an admission.k8s.io/v1 AdmissionReview with a request", http.StatusBadRequest)
			return
		}
		n := reviews.Add(1)
		req := review.Request
		logger.Printf("webhook: review %d allowed: %s %s %s/%s", n, req.Operation, req.Resource.Resource, req.Namespace, req.Name)
		review.Response = &admissionResponse{UID: req.UID, Allowed: true}
		review.Request = nil
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(review); err != nil {
			logger.Printf("webhook: writing the answer to %s: %v", r.RemoteAddr, err)
		}
	})
	return mux
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}
