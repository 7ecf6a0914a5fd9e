package pds

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// NewHTTPClient returns an HTTP client for a PDS (R18): it dials only
// addresses policy allows (nil: public addresses only), never follows a
// redirect, ignores proxy settings of the environment, and verifies TLS
// against roots (nil: the system roots).
func NewHTTPClient(policy *netpolicy.Policy, roots *x509.CertPool, timeout time.Duration) *http.Client {
	tr := policy.Transport()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr, Timeout: timeout, CheckRedirect: netpolicy.NoRedirects}
}

// CheckURL checks, before anything is sent, that the PDS at host may
// receive a credential (R19): host must be an http(s) URL without path
// (else a *SpecError), and https unless policy allows the host for plain
// http (else an error matching ErrInsecureURL). A nil policy allows https
// only. The error never names the policy's ranges.
func CheckURL(host string, policy *netpolicy.Policy) error {
	host = strings.TrimRight(host, "/")
	if err := validateHost(host); err != nil {
		return err
	}
	u, _ := url.Parse(host) // validateHost parsed it
	if u.Scheme == "http" && !policy.AllowsHost(u.Hostname()) {
		return fmt.Errorf("%s: %w; plain http only to hosts the operator allows", host, ErrInsecureURL)
	}
	return nil
}
