package repoconn

import (
	"testing"
	"time"

	"github.com/knotless-dev/knotless/internal/netpolicy/nettest"
	"github.com/knotless-dev/knotless/internal/pds/pdstest"
)

// TestPrivatePDSFailuresLookAlike (R17, from review): an AtprotoRepo whose
// spec.pds.url is an address inside the operator's allowed private
// ranges must not tell a closed port, a host that does not answer and a
// certificate that does not verify apart: otherwise any workspace user
// scans the operator's networks with AtprotoRepos, as TenantClusters no
// longer can (TestPrivateTenantFailuresLookAlike).
func TestPrivatePDSFailuresLookAlike(t *testing.T) {
	p := &Pool{Directory: pdstest.Directory("http://localhost"), Policy: local, Timeout: 300 * time.Millisecond}
	c := workspace(t)
	var first string
	for i, url := range []string{"https://" + nettest.ClosedAddr(t), "https://" + nettest.SilentAddr(t), nettest.UntrustedURL(t)} {
		got, msg := reason(t, p, c, newRepo(url))
		if i == 0 {
			first = got + ": " + msg
			continue
		}
		if got+": "+msg != first {
			t.Errorf("%s: %s: %s\nfirst: %s", url, got, msg, first)
		}
	}
}
