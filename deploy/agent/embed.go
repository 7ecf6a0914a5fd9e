// Package agent holds what knotless-agent ships with beside its binary:
// its identity in a bidder workspace (rbac.yaml), which the provider also
// applies to every new market-bidder workspace, and its systemd unit.
package agent

import _ "embed"

// RBAC is rbac.yaml: the agent's ServiceAccount, ClusterRole and binding.
//
//go:embed rbac.yaml
var RBAC []byte
