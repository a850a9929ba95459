// proxy-server builds upstream Konnectivity's proxy server (cmd/server/app)
// from the Go module dependency, for interop tests and benchmarks.
package main

import (
	"sigs.k8s.io/apiserver-network-proxy/cmd/server/app"
	"sigs.k8s.io/apiserver-network-proxy/cmd/server/app/options"

	"tether.dev/interop/internal/klogflags"
)

func main() {
	opts := options.NewProxyRunOptions()
	klogflags.Execute(app.NewProxyCommand(&app.Proxy{}, opts), opts.Flags())
}
