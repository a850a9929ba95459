//go:build tools

// Package promtool pins Prometheus's promtool, which checks and unit-tests the rules under
// deploy/observability (see ../build-promtool.sh). It holds no code of its own.
package promtool

import _ "github.com/prometheus/prometheus/cmd/promtool"
