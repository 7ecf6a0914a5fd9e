package main

import (
	"crypto/tls"
	"net"
	"net/http"
	"testing"

	"github.com/go-logr/logr"

	"github.com/knotless-dev/knotless/internal/serviceauth"
)

// TestVMServersServeOneVMAndAreJoined: a VM's webhook server answers that
// VM's path only (another VM's, or one with more after it, is 404);
// closeAll closes and joins every server, and none is served after it.
func TestVMServersServeOneVMAndAreJoined(t *testing.T) {
	pair, _, err := serviceauth.ServingCert(t.TempDir(), "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	main := &http.Server{
		Handler:   http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12},
	}
	free := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	vms := &vmServers{log: logr.Discard()}
	addr := free()
	if _, err := vms.serve("vm-a", addr, main); err != nil {
		t.Fatal(err)
	}
	other := free()
	c, err := vms.serve("vm-b", other, main)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the test's own certificate
	for path, want := range map[string]int{
		serviceauth.WebhookPath + "vm-a":      http.StatusNoContent,
		serviceauth.WebhookPath + "vm-b":      http.StatusNotFound,
		serviceauth.WebhookPath + "vm-a/x":    http.StatusNotFound,
		serviceauth.WebhookPath + "vm-a%2Fx":  http.StatusNotFound,
		serviceauth.WebhookPath + "x/../vm-a": http.StatusNotFound,
	} {
		req, _ := http.NewRequest(http.MethodPost, "https://"+addr+path, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	vms.closeAll() // returns once every server has ended
	if _, err := client.Get("https://" + addr + serviceauth.WebhookPath + "vm-a"); err == nil {
		t.Error("a VM's server still answers after closeAll")
	}
	if _, err := vms.serve("vm-c", free(), main); err == nil {
		t.Error("a VM's server was started after closeAll")
	}
}
