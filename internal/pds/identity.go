package pds

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/knotless-dev/knotless/internal/bodylimit"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// MaxDIDDocument bounds a DID document read from the PLC directory or a
// did:web host (R21). A PLC document is about 1 KiB; one past this size
// fails to resolve (ErrResponseTooLarge) instead of being read whole.
const MaxDIDDocument = 64 << 10

// NewDirectory returns the provider's DID directory: did:plc documents come
// from plcURL, did:web ones over https from their host; every request
// dials through policy (R18), follows no redirect, takes at most timeout
// and reads at most MaxDIDDocument bytes. Handles are not resolved back to
// their DID (callers compare a document's declared handle themselves).
// Found identities are cached for ttl, failures a minute.
func NewDirectory(plcURL string, policy *netpolicy.Policy, timeout, ttl time.Duration) *identity.CacheDirectory {
	hc := NewHTTPClient(policy, nil, timeout)
	hc.Transport = bodylimit.Transport(hc.Transport, MaxDIDDocument)
	base := &identity.BaseDirectory{
		PLCURL:                 plcURL,
		SkipHandleVerification: true,
		HTTPClient:             *hc,
		UserAgent:              "knotless-provider",
	}
	return identity.NewCacheDirectory(base, 100_000, ttl, time.Minute, time.Minute)
}

// checkIdentity requires the account's DID document to name this PDS as
// its #atproto_pds service and to declare the session's handle
// (alsoKnownAs at://<handle>), R20: a PDS cannot pass another account's
// DID off as the repo's. A document that does not match is looked up once
// more past the directory's cache (it may predate a move). Without a
// directory (Options.Directory) nothing is checked.
func (c *Client) checkIdentity(ctx context.Context) error {
	if c.dir == nil {
		return nil
	}
	s := c.session()
	did, err := syntax.ParseDID(s.DID)
	if err != nil {
		return fmt.Errorf("pds: %w: %q is not a DID", ErrDIDMismatch, s.DID)
	}
	why, err := c.identityMismatch(ctx, did, s.Handle)
	if err == nil && why != "" {
		_ = c.dir.Purge(ctx, did.AtIdentifier())
		why, err = c.identityMismatch(ctx, did, s.Handle)
	}
	switch {
	case err != nil:
		return err
	case why != "":
		return fmt.Errorf("pds: %w: the DID document of %s %s", ErrDIDMismatch, did, why)
	}
	return nil
}

// identityMismatch says how the document of did disagrees with this PDS
// and handle ("" when it agrees), or why it could not be read.
func (c *Client) identityMismatch(ctx context.Context, did syntax.DID, handle string) (string, error) {
	ident, err := c.dir.LookupDID(ctx, did)
	switch {
	case errors.Is(err, identity.ErrDIDNotFound):
		return "does not exist", nil
	case err != nil:
		return "", fmt.Errorf("pds: %s: %w: %w", did, ErrDIDUnresolvable, err)
	}
	if !SameHost(ident.PDSEndpoint(), c.host) {
		return "names another PDS than spec.pds.url", nil
	}
	if declared, err := ident.DeclaredHandle(); err != nil || !strings.EqualFold(declared.String(), handle) {
		return "declares another handle than the PDS's session", nil
	}
	return "", nil
}

// SameHost reports whether two http(s) URLs name the same PDS: the same
// host name (case and a final dot aside) and the same effective port (the
// port given, or the scheme's default: 80 for http, 443 for https); the
// scheme and path are not compared. A DID document names the PDS's public
// URL, which a TLS-terminating proxy may serve; a repo reaches the PDS at
// that URL, so the ports agree.
//
// Loopback names (localhost, *.localhost, 127.0.0.0/8, ::1) are one host
// name: a local PDS names itself http://localhost:<port> while a repo
// reaches it as 127.0.0.1:<port>. The port is compared there as
// everywhere (issue 29): another port of the same machine is another
// server, and a PDS there could otherwise pass off every account whose
// document names the first. The port is compared for other hosts too,
// for the same reason: another port of one name is another origin, which
// may be another operator's (a shared host), and nothing tells the two
// apart. A repo that reaches its PDS through another port than its DID
// document names is DIDMismatch (docs/atproto.md).
func SameHost(a, b string) bool {
	ha, pa := hostPort(a)
	hb, pb := hostPort(b)
	if ha == "" || hb == "" || pa != pb {
		return false
	}
	return ha == hb || (loopback(ha) && loopback(hb))
}

// hostPort is the lowercase host name (no final dot) and the effective
// port of an http(s) URL, or "" when it is not one.
func hostPort(raw string) (string, int) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return "", 0
	}
	port := 443
	if u.Scheme == "http" {
		port = 80
	}
	if p := u.Port(); p != "" {
		if port, err = strconv.Atoi(p); err != nil || port < 1 || port > 65535 {
			return "", 0
		}
	}
	return strings.TrimSuffix(strings.ToLower(u.Hostname()), "."), port
}

func loopback(host string) bool {
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}
