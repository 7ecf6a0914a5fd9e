//go:build tools

// Package tools pins the CoreDNS server built into the node image.
package tools

import _ "github.com/coredns/coredns"
