//go:build tools

// Package tools pins the code generators of the API pipeline.
package tools

import (
	_ "github.com/kcp-dev/sdk/cmd/apigen"
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
)
