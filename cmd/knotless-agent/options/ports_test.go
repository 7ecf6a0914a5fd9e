package options_test

import (
	"testing"

	agent "github.com/knotless-dev/knotless/cmd/knotless-agent/options"
	mountproxy "github.com/knotless-dev/knotless/cmd/knotless-mountproxy/options"
	provider "github.com/knotless-dev/knotless/cmd/knotless-provider/options"
)

// TestDefaultPortsDoNotClash: the provider, the mount proxy and the agent
// run on one machine with their default flags (make dev, a bidder that is
// also an operator), so no two default listeners share an address.
func TestDefaultPortsDoNotClash(t *testing.T) {
	a, m, p := agent.NewOptions(), mountproxy.NewOptions(), provider.NewOptions()
	seen := map[string]string{}
	for name, addr := range map[string]string{
		"agent --metrics-bind-address":           a.MetricsBindAddress,
		"agent --health-probe-bind-address":      a.HealthProbeBindAddress,
		"agent --webhook-address":                a.WebhookAddress,
		"mountproxy --metrics-bind-address":      m.MetricsBindAddress,
		"mountproxy --health-probe-bind-address": m.HealthProbeBindAddress,
		"mountproxy --bind-address":              m.BindAddress,
		"provider --metrics-bind-address":        p.MetricsBindAddress,
		"provider --health-probe-bind-address":   p.HealthProbeBindAddress,
	} {
		if other, ok := seen[addr]; ok {
			t.Errorf("%s and %s both default to %s", name, other, addr)
		}
		seen[addr] = name
	}
}
