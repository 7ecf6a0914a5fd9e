package deal

import (
	"strings"
	"testing"

	certutil "k8s.io/client-go/util/cert"

	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/serviceauth"
)

func TestTenantOfChecksWhatTheLeaseSays(t *testing.T) {
	crt, _, err := certutil.GenerateSelfSignedCertKey("tenant", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ca := string(crt)
	fp, err := market.CAFingerprint(crt)
	if err != nil {
		t.Fatal(err)
	}
	other, _, _ := certutil.GenerateSelfSignedCertKey("attacker", nil, nil)
	good := func() *market.Lease {
		return &market.Lease{State: LeaseRunning, Endpoint: "https://127.0.0.1:7443/clusters/root", CABundle: ca, CAFingerprint: fp,
			ServiceID: serviceauth.Audience(fit, "vm-uid")}
	}
	tn, err := TenantOf(fit, good())
	if err != nil || tn.Endpoint != good().Endpoint || string(tn.CA) != ca || tn.ServiceID != good().ServiceID {
		t.Fatalf("TenantOf = %+v, %v", tn, err)
	}
	for name, bad := range map[string]func(*market.Lease){
		"not running":                         func(l *market.Lease) { l.State = LeaseConfirmed },
		"plain http":                          func(l *market.Lease) { l.Endpoint = "http://127.0.0.1:7443" },
		"credentials in the URL":              func(l *market.Lease) { l.Endpoint = "https://u:p@127.0.0.1:7443" },
		"no CA":                               func(l *market.Lease) { l.CABundle = "" },
		"another CA than pinned":              func(l *market.Lease) { l.CABundle = string(other) },
		"an attacker CA after the pinned one": func(l *market.Lease) { l.CABundle = ca + string(other) },
		"another DID's service identity":      func(l *market.Lease) { l.ServiceID = serviceauth.Audience(shop, "vm-uid") },
		"the bidder's PDS service":            func(l *market.Lease) { l.ServiceID = fit + "#atproto_pds" },
		"the bidder's bare DID":               func(l *market.Lease) { l.ServiceID = fit },
	} {
		l := good()
		bad(l)
		if _, err := TenantOf(fit, l); err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), "BEGIN") {
			t.Errorf("%s: the error quotes the bundle: %v", name, err)
		}
	}
}

// TestTenantGateway: a lease's gateway is taken only as a host and a
// port; anything else is no gateway, and the tenant is still reached.
func TestTenantGateway(t *testing.T) {
	crt, _, err := certutil.GenerateSelfSignedCertKey("tenant", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	fp, _ := market.CAFingerprint(crt)
	for gw, want := range map[string]string{
		"gw.fit.example:443":  "gw.fit.example:443",
		"127.0.0.1:8443":      "127.0.0.1:8443",
		"[::1]:8443":          "[::1]:8443",
		"":                    "",
		"gw.fit.example":      "",
		"gw.fit.example:0":    "",
		"gw.fit.example:http": "",
		":443":                "",
		"u@gw.example:443":    "",
		"gw.example/x:443":    "",
		"gw.example:99999":    "",
		"GW.example:443":      "",
		"gw\nexample:443":     "",
		"gw\u202eelpmaxe:443": "",
		"[fe80::1%eth0]:443":  "",
	} {
		l := &market.Lease{State: LeaseRunning, Endpoint: "https://127.0.0.1:7443/clusters/root", CABundle: string(crt), CAFingerprint: fp,
			ServiceID: serviceauth.Audience(fit, "vm-uid"), Gateway: gw}
		tn, err := TenantOf(fit, l)
		if err != nil || tn.Gateway != want {
			t.Errorf("gateway %q: %q, %v; want %q", gw, tn.Gateway, err, want)
		}
	}
}

// TestTenantSSH: a lease's SSH gateway counts only with a well-formed
// address and host key fingerprint, both.
func TestTenantSSH(t *testing.T) {
	crt, _, err := certutil.GenerateSelfSignedCertKey("tenant", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	fp, _ := market.CAFingerprint(crt)
	const key = "SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s"
	for _, c := range []struct{ addr, key, wantAddr string }{
		{"ssh.fit.example:2222", key, "ssh.fit.example:2222"},
		{"ssh.fit.example:2222", "", ""},
		{"ssh.fit.example:2222", "MD5:16:27:ac:a5:76:28:2d:36:63:1b:56:4d:eb:df:a6:48", ""},
		{"ssh.fit.example:2222", "SHA256:short", ""},
		{"ssh.fit.example:2222", "SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2!", ""},
		{"ssh.fit.example", key, ""},
		{"", key, ""},
	} {
		l := &market.Lease{State: LeaseRunning, Endpoint: "https://127.0.0.1:7443/clusters/root", CABundle: string(crt), CAFingerprint: fp,
			ServiceID: serviceauth.Audience(fit, "vm-uid"), SSHAddress: c.addr, SSHHostKey: c.key}
		tn, err := TenantOf(fit, l)
		wantKey := ""
		if c.wantAddr != "" {
			wantKey = c.key
		}
		if err != nil || tn.SSHAddress != c.wantAddr || tn.SSHHostKey != wantKey {
			t.Errorf("ssh %q %q: %q %q, %v", c.addr, c.key, tn.SSHAddress, tn.SSHHostKey, err)
		}
	}
}
