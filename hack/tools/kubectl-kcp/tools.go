//go:build tools

// Package tools pins the kubectl plugins used with knotless.
package tools

import (
	_ "github.com/kcp-dev/cli/cmd/kubectl-kcp"
	_ "github.com/kcp-dev/cli/cmd/kubectl-ws"
)
