//go:build tools

// Package tools pins the Prometheus commands hack/node.mk builds (cmd/prometheus, cmd/promtool).
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
