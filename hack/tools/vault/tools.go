//go:build tools

// Package tools pins the Vault server binary.
package tools

import _ "github.com/hashicorp/vault"
