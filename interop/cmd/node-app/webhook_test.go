package main

import (
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestWebhookAllowsAndCounts(t *testing.T) {
	srv := httptest.NewServer(newWebhookHandler(log.New(io.Discard, "", 0)))
	defer srv.Close()
	for i, uid := range []string{"a-1", "b-2"} {
		body := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"` + uid +
			`","operation":"CREATE","namespace":"ns","name":"cm","resource":{"resource":"configmaps"}}}`
		resp, err := http.Post(srv.URL+"/validate", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var got admissionReview
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || got.Response == nil || got.Response.UID != uid || !got.Response.Allowed || got.Request != nil {
			t.Fatalf("review %d: got %+v (%v), want allowed with uid %s", i, got, err, uid)
		}
		if got.APIVersion != "admission.k8s.io/v1" || got.Kind != "AdmissionReview" {
			t.Fatalf("review %d: apiVersion/kind %q/%q not echoed", i, got.APIVersion, got.Kind)
		}
	}
	resp, err := http.Post(srv.URL+"/validate", "application/json", strings.NewReader(`{"kind":"AdmissionReview"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a review without a request: status %d, want 400", resp.StatusCode)
	}
	resp, err = http.Get(srv.URL + "/count")
	if err != nil {
		t.Fatal(err)
	}
	count, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.TrimSpace(string(count)) != "2" {
		t.Fatalf("/count = %q, want 2 (bad reviews are not counted)", count)
	}
}

func TestAggregatedAPIServesDiscoveryAndPings(t *testing.T) {
	srv := httptest.NewServer(newWebhookHandler(log.New(io.Discard, "", 0)))
	defer srv.Close()
	get := func(path string, user string) (int, map[string]any) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if user != "" {
			req.Header.Set("X-Remote-User", user)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&v)
		return resp.StatusCode, v
	}
	if code, v := get("/apis/flows.tether.dev/v1", ""); code != 200 || v["kind"] != "APIResourceList" || v["groupVersion"] != "flows.tether.dev/v1" {
		t.Fatalf("discovery: %d %v", code, v)
	}
	code, v := get("/apis/flows.tether.dev/v1/pings/p1", "kubernetes-admin")
	if code != 200 || v["kind"] != "Ping" || v["requestedBy"] != "kubernetes-admin" || v["metadata"].(map[string]any)["name"] != "p1" {
		t.Fatalf("get ping: %d %v", code, v)
	}
	if code, v := get("/apis/flows.tether.dev/v1/pings", ""); code != 200 || v["kind"] != "PingList" || len(v["items"].([]any)) != 1 {
		t.Fatalf("list pings: %d %v", code, v)
	}
	if code, _ := get("/apis", ""); code != 404 {
		t.Fatalf("/apis: %d, want 404 (aggregated discovery is left to kube-apiserver's fallback)", code)
	}
	if code, _ := get("/apis/other.example/v1", ""); code != 404 {
		t.Fatalf("another group: %d, want 404", code)
	}
}
