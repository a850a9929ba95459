// proxy-agent builds upstream Konnectivity's proxy agent (cmd/agent/app)
// from the Go module dependency, for interop tests and benchmarks.
package main

import (
	"sigs.k8s.io/apiserver-network-proxy/cmd/agent/app"
	"sigs.k8s.io/apiserver-network-proxy/cmd/agent/app/options"

	"tether.dev/interop/internal/klogflags"
)

func main() {
	opts := options.NewGrpcProxyAgentOptions()
	klogflags.Execute(app.NewAgentCommand(&app.Agent{}, opts), opts.Flags())
}
