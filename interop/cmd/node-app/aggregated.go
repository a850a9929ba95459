package main

import (
	"encoding/json"
	"log"
	"net/http"
	"os"
)

// The aggregated API the webhook's server also serves, for an APIService in front of it: group
// flows.tether.dev, version v1, one cluster-scoped read-only resource "pings". kube-apiserver
// reaches it through the proxy, as it reaches every aggregated API server.
const (
	aggregatedGroup   = "flows.tether.dev"
	aggregatedVersion = aggregatedGroup + "/v1"
	aggregatedPrefix  = "/apis/" + aggregatedVersion
)

// ping is the one kind of the API: who served it (the pod's hostname) and for whom, as the
// front-proxy headers kube-apiserver adds name the user (X-Remote-User).
type ping struct {
	APIVersion  string         `json:"apiVersion"`
	Kind        string         `json:"kind"`
	Metadata    map[string]any `json:"metadata"`
	ServedBy    string         `json:"servedBy"`
	RequestedBy string         `json:"requestedBy"`
}

// addAggregatedAPI registers discovery (/apis/flows.tether.dev/v1, which kube-apiserver's
// availability check reads) and GET of /pings and /pings/NAME. Aggregated discovery is left to
// kube-apiserver's fallback: anything else under /apis answers 404.
func addAggregatedAPI(mux *http.ServeMux, logger *log.Logger) {
	served, _ := os.Hostname()
	mux.HandleFunc("GET "+aggregatedPrefix, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, logger, map[string]any{
			"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": aggregatedVersion,
			"resources": []map[string]any{{
				"name": "pings", "singularName": "ping", "namespaced": false, "kind": "Ping",
				"verbs": []string{"get", "list"},
			}},
		})
	})
	one := func(name string, r *http.Request) ping {
		return ping{APIVersion: aggregatedVersion, Kind: "Ping", Metadata: map[string]any{"name": name},
			ServedBy: served, RequestedBy: r.Header.Get("X-Remote-User")}
	}
	mux.HandleFunc("GET "+aggregatedPrefix+"/pings", func(w http.ResponseWriter, r *http.Request) {
		logger.Printf("aggregated API: list pings for %q", r.Header.Get("X-Remote-User"))
		writeJSON(w, logger, map[string]any{"apiVersion": aggregatedVersion, "kind": "PingList",
			"metadata": map[string]any{}, "items": []ping{one(served, r)}})
	})
	mux.HandleFunc("GET "+aggregatedPrefix+"/pings/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		logger.Printf("aggregated API: get ping %q for %q", name, r.Header.Get("X-Remote-User"))
		writeJSON(w, logger, one(name, r))
	})
	mux.HandleFunc("/apis/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "only "+aggregatedPrefix+" is served here", http.StatusNotFound)
	})
}

func writeJSON(w http.ResponseWriter, logger *log.Logger, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		logger.Printf("aggregated API: writing the answer: %v", err)
	}
}
