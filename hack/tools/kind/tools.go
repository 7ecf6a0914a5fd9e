//go:build tools

// Package tools pins the kind CLI.
package tools

import _ "sigs.k8s.io/kind"
