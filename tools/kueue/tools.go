//go:build tools

// Package tools records the command this wrapper module builds, so that
// `go mod tidy` keeps its whole dependency graph in go.mod and go.sum.
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
