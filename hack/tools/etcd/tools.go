//go:build tools

// Package tools pins the etcd server built into the node image.
package tools

import _ "go.etcd.io/etcd/server/v3"
