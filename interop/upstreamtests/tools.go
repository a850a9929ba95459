//go:build tools

// Package upstreamtests pins the test-only dependencies of upstream's
// integration suite (package sigs.k8s.io/apiserver-network-proxy/tests) so
// that `go test sigs.k8s.io/apiserver-network-proxy/tests` runs from this module.
package upstreamtests

import (
	_ "go.uber.org/goleak"
	_ "sigs.k8s.io/apiserver-network-proxy/tests/framework"
)
