package deal

import (
	"strings"
	"testing"

	"github.com/knotless-dev/knotless/internal/market"
)

// TestTenantOfRefusesOddEndpoints pins: userinfo (even empty), other
// schemes, queries, fragments and opaque/hostless forms are refused
// before the CA is looked at.
func TestTenantOfRefusesOddEndpoints(t *testing.T) {
	for _, ep := range []string{"https://u:p@h:6443", "https://@h", "http://h", "HTTPS:h", "https:///x", "https://h?x=1", "https://h#f", " https://h", "//h", "wss://h"} {
		_, err := TenantOf("did:plc:fit", &market.Lease{State: LeaseRunning, Endpoint: ep})
		if err == nil || !strings.Contains(err.Error(), "endpoint") {
			t.Errorf("endpoint %q: %v, want refused", ep, err)
		}
	}
}
