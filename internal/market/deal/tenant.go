package deal

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/serviceauth"
)

// Tenant is how a running lease says its tenant is reached: its
// endpoint, the CA bundle that verifies it, the service identity
// callers ask their PDS for tokens for, and the bidder's gateway
// (host:port; empty when the lease names none or names it badly), and
// the bidder's SSH gateway with its host key fingerprint (both empty
// unless both are well formed).
type Tenant struct {
	Endpoint   string
	CA         []byte
	ServiceID  string
	Gateway    string
	SSHAddress string
	SSHHostKey string
}

// ErrCABundleNotPinned: a lease's CA bundle is not the one its
// caFingerprint pins (market.CAFingerprint covers every certificate of
// the bundle, each of which a client of the tenant would trust).
var ErrCABundleNotPinned = errors.New("the lease's CA bundle is not the one its caFingerprint pins")

// TenantOf checks what the lease l, written by the bidder bidderDID,
// says of its tenant: the lease is running, its endpoint is an https
// URL, its CA bundle is exactly the one its caFingerprint pins, and its
// service identity is one of the bidder's own (bidderDID#knotless_
// tenant_...): a bidder cannot make a caller ask for a token that
// another service would accept.
func TenantOf(bidderDID string, l *market.Lease) (Tenant, error) {
	if l.State != LeaseRunning {
		return Tenant{}, fmt.Errorf("the lease is %s, not running", l.State)
	}
	u, err := url.Parse(l.Endpoint)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return Tenant{}, errors.New("the lease's endpoint is not an https URL")
	}
	fp, err := market.CAFingerprint([]byte(l.CABundle))
	if err != nil {
		return Tenant{}, fmt.Errorf("the lease's CA bundle: %w", err)
	}
	if fp != l.CAFingerprint {
		return Tenant{}, ErrCABundleNotPinned
	}
	if !serviceauth.IsAudienceOf(l.ServiceID, bidderDID) {
		return Tenant{}, errors.New("the lease's serviceId is not a service identity of the bidder's")
	}
	tn := Tenant{Endpoint: l.Endpoint, CA: []byte(l.CABundle), ServiceID: l.ServiceID, Gateway: gatewayAddress(l.Gateway)}
	if addr := gatewayAddress(l.SSHAddress); addr != "" && hostKeyFingerprint(l.SSHHostKey) {
		tn.SSHAddress, tn.SSHHostKey = addr, l.SSHHostKey
	}
	return tn, nil
}

// hostKeyFingerprint: s is an SSH SHA256 fingerprint as ssh-keygen
// prints it (SHA256: and 43 characters of unpadded base64).
func hostKeyFingerprint(s string) bool {
	b64, ok := strings.CutPrefix(s, "SHA256:")
	if !ok || len(b64) != 43 {
		return false
	}
	_, err := base64.RawStdEncoding.DecodeString(b64)
	return err == nil
}

// gatewayAddress is a lease's gateway if it is a host (an IP address or
// a lowercase DNS name) and a port, else "": a gateway named badly is no
// gateway, the tenant is still reached. Nothing else of the bidder's
// text shows in a status.
func gatewayAddress(s string) string {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return ""
	}
	if ip, ipErr := netip.ParseAddr(host); (ipErr != nil && len(validation.IsDNS1123Subdomain(host)) > 0) || (ipErr == nil && ip.Zone() != "") {
		return ""
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return ""
	}
	return s
}
