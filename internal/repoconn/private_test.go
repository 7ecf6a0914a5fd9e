package repoconn

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/knotless-dev/knotless/internal/pds/pdstest"
)

// TestPrivatePDSFailuresLookAlike (R17, from review): an AtprotoRepo whose
// spec.pds.url is an address inside the operator's allowed private
// ranges must not tell a closed port, a host that does not answer and a
// certificate that does not verify apart: otherwise any workspace user
// scans the operator's networks with AtprotoRepos, as TenantClusters no
// longer can (TestPrivateTenantFailuresLookAlike).
func TestPrivatePDSFailuresLookAlike(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			held.Lock()
			conns = append(conns, c)
			held.Unlock()
		}
	}()
	t.Cleanup(func() {
		silent.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	untrusted := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(untrusted.Close)
	p := &Pool{Directory: pdstest.Directory("http://localhost"), Policy: local, Timeout: 300 * time.Millisecond}
	c := workspace(t)
	var first string
	for i, url := range []string{"https://" + closedAddr, "https://" + silent.Addr().String(), untrusted.URL} {
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
