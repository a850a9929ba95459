//go:build tools

// Package promtool pins Prometheus's promtool, which checks and unit-tests the rules under
// deploy/observability, and the Prometheus server that feeds scripts/dashboard-snapshot.sh
// (see ../build-promtool.sh). It holds no code of its own.
package promtool

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
