/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package mount holds what the mount shim (package mountproxy, in
// knotless-mountproxy) and the parts that prepare its work share: a
// tenant apiserver the shim forwards to, as internal/tenant resolves it
// from a TenantCluster and the mountregistry controller registers it, and
// the identity of the provider's probe, which the agent's tenants grant
// and the tenantcluster controller asserts. It sits below them all, so
// that no internal package imports the shim's package.
package mount

import (
	"crypto/tls"
	"crypto/x509"
	"net/url"
)

// Credential is what the shim authenticates with on a tenant: exactly one
// of a client certificate and a bearer token.
type Credential struct {
	ClientCert *tls.Certificate
	Token      string
}

// Tenant is one tenant apiserver the shim may forward to.
type Tenant struct {
	// LogicalCluster is the workspace the tenant belongs to; Name its name
	// there. Together they form the path /<prefix>/<LogicalCluster>/<Name>/.
	LogicalCluster, Name string
	// URL of the tenant apiserver (https; a path is kept as a prefix).
	URL *url.URL
	// CA verifies the tenant's serving certificate; nothing else does.
	CA         *x509.CertPool
	Credential Credential
	// Impersonate, when not nil, is all the shim may assert on the
	// tenant (a market contract's mount, whose credential may
	// impersonate these alone): a caller who is none of its users is
	// refused; of a caller's groups only its own are asserted, and no
	// extra.
	Impersonate *Principals
}

// Principals are kcp users and groups.
type Principals struct {
	Users, Groups []string
}

// ProbeUser is the only identity a probe certificate may assert, and so
// the user the shim impersonates on the tenant for the provider's probe.
const ProbeUser = "system:knotless:mount-probe"
