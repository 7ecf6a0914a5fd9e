/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package options holds knotless-mountproxy's flags: NewOptions sets
// their defaults, AddFlags binds them and Validate checks them before the
// shim loads a file or connects to anything.
package options

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/knotless-dev/knotless/apis"
	"github.com/knotless-dev/knotless/cmd/internal/flagcheck"
	"github.com/knotless-dev/knotless/internal/bootstrap"
	"github.com/knotless-dev/knotless/internal/mount"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/mountproxy"
)

// Options are knotless-mountproxy's flags.
type Options struct {
	// Kubeconfig of kcp (--kubeconfig, default $KUBECONFIG) and its
	// context (--context).
	Kubeconfig, Context string
	// Workspace is the provider workspace's path (--workspace).
	Workspace string
	// BindAddress is the host:port the shim serves HTTPS on.
	BindAddress string
	// Files are the serving certificate and key and the requestheader CA.
	Files mountproxy.Files
	// RequestHeaderAllowedNames are the comma-separated common names that
	// may assert identities (empty: any the CA issued).
	RequestHeaderAllowedNames string
	// ProbeClientNames are the comma-separated common names of the
	// provider's probe certificates.
	ProbeClientNames string
	// Headers are the identity header names.
	Headers mountproxy.Headers
	// AllowPrivateNetworks are the comma-separated loopback/private ranges
	// tenants may be reached at (R18).
	AllowPrivateNetworks string
	// ReservedAddresses are the comma-separated URLs or host:port that no
	// tenant may be.
	ReservedAddresses string
	// Authorization configures the cache of kcp's answers.
	Authorization mountproxy.SAROptions
	// TenantResponseHeaderTimeout bounds a tenant's wait for response
	// headers.
	TenantResponseHeaderTimeout time.Duration
	// PathPrefix precedes <logical cluster>/<name>/ in tenant routes.
	PathPrefix string
	// MetricsBindAddress and HealthProbeBindAddress are host:port, or "0"
	// to disable the endpoint.
	MetricsBindAddress, HealthProbeBindAddress string
	// ConnectTimeout bounds the wait for kcp at start-up; ShutdownTimeout
	// bounds graceful shutdown.
	ConnectTimeout, ShutdownTimeout time.Duration
	// Logs are the --zap-* logging flags.
	Logs zap.Options
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		Kubeconfig:                  os.Getenv("KUBECONFIG"),
		Workspace:                   "root:knotless",
		BindAddress:                 "127.0.0.1:9443",
		RequestHeaderAllowedNames:   "kcp-front-proxy,knotless-probe",
		ProbeClientNames:            "knotless-probe",
		Authorization:               mountproxy.SAROptions{AllowTTL: 10 * time.Second, DenyTTL: 5 * time.Second, Size: 10000},
		TenantResponseHeaderTimeout: 60 * time.Second,
		PathPrefix:                  "/tenants/",
		MetricsBindAddress:          "127.0.0.1:8090",
		HealthProbeBindAddress:      "127.0.0.1:8091",
		ConnectTimeout:              20 * time.Second,
		ShutdownTimeout:             30 * time.Second,
	}
}

// AddFlags binds the options to fs; the options' values are the flags'
// defaults.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig of kcp (an admin of the provider workspace)")
	fs.StringVar(&o.Context, "context", o.Context, "kubeconfig context (default: the current one)")
	fs.StringVar(&o.Workspace, "workspace", o.Workspace, "path of the provider workspace that holds the "+apis.Export+" APIExport")
	fs.StringVar(&o.BindAddress, "bind-address", o.BindAddress, "address the shim serves HTTPS on")
	fs.StringVar(&o.Files.ServingCert, "tls-cert-file", o.Files.ServingCert, "serving certificate, issued by the CA kcp-front-proxy's mapping names as backend_server_ca (reloaded on change)")
	fs.StringVar(&o.Files.ServingKey, "tls-private-key-file", o.Files.ServingKey, "key of --tls-cert-file")
	fs.StringVar(&o.Files.RequestHeaderCA, "requestheader-client-ca-file", o.Files.RequestHeaderCA, "CA that issued kcp-front-proxy's proxy client certificate and the provider's probe certificate (reloaded on change)")
	fs.StringVar(&o.RequestHeaderAllowedNames, "requestheader-allowed-names", o.RequestHeaderAllowedNames, "comma-separated common names of client certificates that may assert identities (empty: any the CA issued)")
	fs.StringVar(&o.ProbeClientNames, "probe-client-names", o.ProbeClientNames, "comma-separated common names of the provider's probe certificates: they may only read /version as "+mount.ProbeUser)
	fs.StringVar(&o.Headers.User, "requestheader-username-headers", o.Headers.User, "header with the caller's user name (kcp-front-proxy's mapping user_header); required, a name callers cannot guess (docs/mountproxy.md)")
	fs.StringVar(&o.Headers.Group, "requestheader-group-headers", o.Headers.Group, "header with the caller's groups (the mapping's group_header); required, unguessable")
	fs.StringVar(&o.Headers.ExtraPrefix, "requestheader-extra-headers-prefix", o.Headers.ExtraPrefix, "prefix of headers with the caller's extra attributes (the mapping's extra_header_prefix); required, unguessable")
	fs.StringVar(&o.AllowPrivateNetworks, "allow-private-networks", o.AllowPrivateNetworks, "comma-separated loopback/private CIDR ranges (or addresses) tenants may be reached at; empty allows public addresses only (link-local and metadata addresses are never reached)")
	fs.StringVar(&o.ReservedAddresses, "reserved-addresses", o.ReservedAddresses, "comma-separated URLs or host:port that tenants may never be (kcp-front-proxy's, other kcp endpoints); kcp's kubeconfig server and the shim's own address are always reserved")
	fs.DurationVar(&o.Authorization.AllowTTL, "authorization-cache-ttl", o.Authorization.AllowTTL, "how long kcp's answer that a caller may enter a workspace is reused")
	fs.DurationVar(&o.Authorization.DenyTTL, "authorization-cache-denied-ttl", o.Authorization.DenyTTL, "how long kcp's refusal is reused")
	fs.IntVar(&o.Authorization.Size, "authorization-cache-size", o.Authorization.Size, "most authorization answers kept")
	fs.DurationVar(&o.TenantResponseHeaderTimeout, "tenant-response-header-timeout", o.TenantResponseHeaderTimeout, "how long a tenant may take to send response headers")
	fs.StringVar(&o.PathPrefix, "path-prefix", o.PathPrefix, "path prefix of tenant routes: <prefix><logical cluster>/<name>/...")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "address of the metrics endpoint (0 disables it)")
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", o.HealthProbeBindAddress, "address of /healthz and /readyz (0 disables them)")
	fs.DurationVar(&o.ConnectTimeout, "connect-timeout", o.ConnectTimeout, "how long to wait for kcp to answer at start-up")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "how long shutdown may take")
	o.Logs.BindFlags(fs)
}

// headerFlags name the identity header flags in Validate's errors.
const headerFlags = "--requestheader-username-headers, --requestheader-group-headers and --requestheader-extra-headers-prefix"

// Validate checks every flag without reading a file or connecting to
// anything and returns all problems in one error (nil when there are
// none). The TLS files and the kubeconfig are loaded, and reserved host
// names resolved, when the shim starts.
func (o *Options) Validate() error {
	errs := []error{
		flagcheck.Kubeconfig(o.Kubeconfig),
		flagcheck.Workspace("--workspace", o.Workspace),
		flagcheck.HostPort("--bind-address", o.BindAddress),
	}
	if o.Files.ServingCert == "" || o.Files.ServingKey == "" || o.Files.RequestHeaderCA == "" {
		errs = append(errs, errors.New("--tls-cert-file, --tls-private-key-file and --requestheader-client-ca-file are required"))
	}
	if allowed := bootstrap.SplitList(o.RequestHeaderAllowedNames); len(allowed) > 0 {
		for _, n := range bootstrap.SplitList(o.ProbeClientNames) {
			if !slices.Contains(allowed, n) {
				errs = append(errs, fmt.Errorf("--probe-client-names: %q is not in --requestheader-allowed-names, so the probe would be refused", n))
			}
		}
	}
	headerErrs := []error{
		mountproxy.ValidateHeaderName("--requestheader-username-headers", o.Headers.User),
		mountproxy.ValidateHeaderName("--requestheader-group-headers", o.Headers.Group),
		mountproxy.ValidateHeaderName("--requestheader-extra-headers-prefix", o.Headers.ExtraPrefix),
	}
	errs = append(errs, headerErrs...)
	if flagcheck.Join(headerErrs...) == nil {
		if err := o.Headers.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", headerFlags, err))
		}
	}
	if _, err := netpolicy.ParsePrefixes(o.AllowPrivateNetworks); err != nil {
		errs = append(errs, fmt.Errorf("--allow-private-networks: %w", err))
	}
	errs = append(errs,
		validateReserved(o.ReservedAddresses),
		flagcheck.Positive("--authorization-cache-ttl", o.Authorization.AllowTTL),
		flagcheck.Positive("--authorization-cache-denied-ttl", o.Authorization.DenyTTL),
	)
	if o.Authorization.Size <= 0 {
		errs = append(errs, fmt.Errorf("--authorization-cache-size must be positive, got %d", o.Authorization.Size))
	}
	errs = append(errs, flagcheck.Positive("--tenant-response-header-timeout", o.TenantResponseHeaderTimeout))
	if !strings.HasPrefix(o.PathPrefix, "/") || !strings.HasSuffix(o.PathPrefix, "/") {
		errs = append(errs, fmt.Errorf("--path-prefix %q must start and end with /", o.PathPrefix))
	}
	errs = append(errs,
		flagcheck.BindAddress("--metrics-bind-address", o.MetricsBindAddress),
		flagcheck.BindAddress("--health-probe-bind-address", o.HealthProbeBindAddress),
		flagcheck.Positive("--connect-timeout", o.ConnectTimeout),
		flagcheck.Positive("--shutdown-timeout", o.ShutdownTimeout),
	)
	return flagcheck.Join(errs...)
}

// validateReserved requires each entry to name a port, as
// netpolicy.Resolve does: a URL (its scheme's port when it has none) or
// host:port. Host names are resolved at start-up.
func validateReserved(list string) error {
	for i, target := range bootstrap.SplitList(list) {
		port := ""
		if u, err := url.Parse(target); err == nil && u.Host != "" {
			if u.User != nil {
				return fmt.Errorf("--reserved-addresses: entry %d must not carry credentials", i+1)
			}
			if port = u.Port(); port == "" {
				port = map[string]string{"http": "80", "https": "443", "ws": "80", "wss": "443"}[u.Scheme]
			}
		} else if _, p, err := net.SplitHostPort(target); err == nil {
			port = p
		}
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return fmt.Errorf("--reserved-addresses: %q has no port: want a URL or host:port", target)
		}
	}
	return nil
}
