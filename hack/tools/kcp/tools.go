//go:build tools

// Package tools pins the kcp binaries knotless runs in development and tests.
package tools

import (
	_ "github.com/kcp-dev/kcp/cmd/kcp"
	_ "github.com/kcp-dev/kcp/cmd/kcp-front-proxy"
)
