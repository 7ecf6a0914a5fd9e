/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package options holds knotless-provider's flags: NewOptions sets their
// defaults, AddFlags binds them and Validate checks them before the
// provider connects to anything.
package options

import (
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/knotless-dev/knotless/cmd/internal/flagcheck"
	"github.com/knotless-dev/knotless/internal/bootstrap"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/vault"
	"github.com/knotless-dev/knotless/mountproxy"
)

// Options are knotless-provider's flags.
type Options struct {
	// Kubeconfig of kcp (--kubeconfig, default $KUBECONFIG) and its
	// context (--context).
	Kubeconfig, Context string
	// Workspace is the provider workspace's path (--workspace).
	Workspace string
	// MetricsBindAddress, HealthProbeBindAddress and PprofBindAddress are
	// host:port, or "0" to disable the endpoint.
	MetricsBindAddress, HealthProbeBindAddress, PprofBindAddress string
	// ConnectTimeout bounds the wait for kcp at start-up; ShutdownTimeout
	// bounds graceful shutdown.
	ConnectTimeout, ShutdownTimeout time.Duration
	// BootstrapOnly applies the provider workspace's objects and exits.
	BootstrapOnly bool
	// AtprotoWorkers are the concurrent AtprotoRecord reconciles.
	AtprotoWorkers int
	// AtprotoMaxBatch bounds the writes of one applyWrites batch (1 to
	// pds.MaxWritesPerBatch).
	AtprotoMaxBatch int
	// AtprotoResync is how often a synced record is read back.
	AtprotoResync time.Duration
	// PLCURL is the PLC directory (scheme://host[:port]).
	PLCURL string
	// WatchFlushInterval is how often an AtprotoRecordWatch's status is
	// written.
	WatchFlushInterval time.Duration
	// AllowPrivateNetworks are the comma-separated loopback/private ranges
	// outbound connections may reach (R18).
	AllowPrivateNetworks string
	// FirehoseMetricSources are the comma-separated firehose hosts whose
	// metrics carry their own source label.
	FirehoseMetricSources string
	// Vault is the --vault-* connection; an empty address disables it.
	Vault vault.Config
	// Mount configures the TenantCluster controller's view of the shim.
	Mount MountOptions
	// Guest configures GuestIdentityGrants: kcp-front-proxy as the
	// tenants reach it and the admission webhook kcp calls.
	Guest GuestOptions
	// GatewayCAFile is a CA bundle that verifies the bidders' gateways
	// (besides the system's roots) when Gateways are probed.
	GatewayCAFile string
	// Logs are the --zap-* logging flags.
	Logs zap.Options
	// LeaderElection makes replicas take turns (--leader-elect).
	LeaderElection LeaderElectionOptions
}

// LeaderElectionOptions configure leader election: replicas compete for a
// Lease in the provider workspace and only the holder reconciles.
type LeaderElectionOptions struct {
	// Enabled is --leader-elect.
	Enabled bool
	// Namespace and ID name the Lease in the provider workspace.
	Namespace, ID string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's leader
	// election timings (LeaseDuration > RenewDeadline > RetryPeriod).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// MountOptions configure the TenantCluster controller's view of
// knotless-mountproxy.
type MountOptions struct {
	// ProxyURL is the shim's https://host:port (--mountproxy-url); empty
	// reports TenantClusters MountProxyUnavailable.
	ProxyURL string
	// MountURL is the base of TenantCluster status.URL (--mount-url);
	// empty means the kubeconfig's server.
	MountURL string
	// CAFile verifies the shim; ClientCertFile and ClientKeyFile are the
	// probe's client certificate.
	CAFile, ClientCertFile, ClientKeyFile string
	// UserHeader and GroupHeader are the shim's identity header names.
	UserHeader, GroupHeader string
	// ProbeInterval is how often a TenantCluster's tenant is probed.
	ProbeInterval time.Duration
}

// GuestOptions configure GuestIdentityGrants (controllers/guestidentity
// and its admission webhook, internal/guestadmission).
type GuestOptions struct {
	// Server is kcp-front-proxy's base URL as workloads in the tenants
	// reach it (--guest-kcp-server); empty reports grants NotEnabled.
	Server string
	// CAFile verifies kcp-front-proxy; TLSServerName is the name its
	// certificate is checked for, when Server's host is not in it.
	CAFile, TLSServerName string
	// WebhookBindAddress is where the admission webhook listens
	// (host:port), with tls.crt and tls.key of WebhookCertDir.
	WebhookBindAddress, WebhookCertDir string
	// WebhookURL is the webhook's base URL as kcp reaches it, and
	// WebhookCAFile the CA bundle kcp verifies it with.
	WebhookURL, WebhookCAFile string
}

func (g GuestOptions) validate() []error {
	if g.Server == "" {
		if g.CAFile != "" || g.TLSServerName != "" || g.WebhookURL != "" || g.WebhookCertDir != "" || g.WebhookCAFile != "" {
			return []error{errors.New("--guest-kcp-ca-file, --guest-kcp-tls-server-name and --admission-webhook-* need --guest-kcp-server")}
		}
		return nil
	}
	var errs []error
	for flag, raw := range map[string]string{"--guest-kcp-server": g.Server, "--admission-webhook-url": g.WebhookURL} {
		if u, err := flagcheck.URL(flag, raw); err != nil {
			errs = append(errs, err)
		} else if u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			errs = append(errs, fmt.Errorf("%s %q must be https://host:port", flag, raw))
		}
	}
	if g.CAFile == "" || g.WebhookCertDir == "" || g.WebhookCAFile == "" {
		errs = append(errs, errors.New("--guest-kcp-server needs --guest-kcp-ca-file, --admission-webhook-cert-dir and --admission-webhook-ca-file"))
	}
	return append(errs, flagcheck.HostPort("--admission-webhook-bind-address", g.WebhookBindAddress))
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		Kubeconfig:             os.Getenv("KUBECONFIG"),
		Workspace:              "root:knotless",
		MetricsBindAddress:     "127.0.0.1:8080",
		HealthProbeBindAddress: "127.0.0.1:8081",
		PprofBindAddress:       "0",
		ConnectTimeout:         20 * time.Second,
		ShutdownTimeout:        30 * time.Second,
		AtprotoWorkers:         64,
		AtprotoMaxBatch:        pds.MaxWritesPerBatch,
		AtprotoResync:          2 * time.Minute,
		PLCURL:                 "https://plc.directory",
		WatchFlushInterval:     2 * time.Second,
		Vault:                  vault.Config{AppRole: vault.AppRoleConfig{MountPath: vault.DefaultAppRoleMount}, Prefix: vault.DefaultPrefix, Timeout: vault.DefaultTimeout},
		Mount:                  MountOptions{ProbeInterval: 30 * time.Second},
		Guest:                  GuestOptions{WebhookBindAddress: "0.0.0.0:9443"},
		LeaderElection: LeaderElectionOptions{
			Namespace: "default", ID: "knotless-provider",
			LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		},
	}
}

// AddFlags binds the options to fs; the options' values are the flags'
// defaults.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig of kcp (an admin of the provider workspace's parent)")
	fs.StringVar(&o.Context, "context", o.Context, "kubeconfig context (default: the current one)")
	fs.StringVar(&o.Workspace, "workspace", o.Workspace, "path of the provider workspace, created if missing")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "address of the metrics endpoint (0 disables it)")
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", o.HealthProbeBindAddress, "address of /healthz and /readyz (0 disables them)")
	fs.StringVar(&o.PprofBindAddress, "pprof-bind-address", o.PprofBindAddress, "address of net/http/pprof (heap and goroutine profiles; 0 disables it)")
	fs.DurationVar(&o.ConnectTimeout, "connect-timeout", o.ConnectTimeout, "how long to wait for kcp to answer at start-up")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "how long shutdown may take")
	fs.BoolVar(&o.BootstrapOnly, "bootstrap-only", o.BootstrapOnly, "apply the provider workspace's objects and exit")
	fs.IntVar(&o.AtprotoWorkers, "atproto-workers", o.AtprotoWorkers, "concurrent AtprotoRecord reconciles; records of one repo that are reconciled at the same time share one applyWrites batch")
	fs.IntVar(&o.AtprotoMaxBatch, "atproto-max-batch", o.AtprotoMaxBatch, "most record writes per applyWrites batch (1 disables batching)")
	fs.DurationVar(&o.AtprotoResync, "atproto-resync", o.AtprotoResync, "how often a synced AtprotoRecord is read back from its PDS to catch changes made behind knotless's back")
	fs.StringVar(&o.PLCURL, "plc-url", o.PLCURL, "PLC directory that resolves did:plc identities (signing keys and PDS endpoints) for firehose verification and to check that an AtprotoRepo's account lives on its PDS")
	fs.DurationVar(&o.WatchFlushInterval, "watch-flush-interval", o.WatchFlushInterval, "how often an AtprotoRecordWatch's changed records and cursor are written to its status")
	fs.StringVar(&o.Mount.ProxyURL, "mountproxy-url", o.Mount.ProxyURL, "address of knotless-mountproxy (https://host:port) that TenantClusters are probed through; empty reports them MountProxyUnavailable")
	fs.StringVar(&o.Mount.MountURL, "mount-url", o.Mount.MountURL, "base of TenantCluster status.URL: where kcp's clients reach the shim's /tenants/ path (kcp-front-proxy's mapping for it); default: the kubeconfig's server")
	fs.StringVar(&o.Mount.CAFile, "mountproxy-ca-file", o.Mount.CAFile, "CA bundle that verifies knotless-mountproxy's serving certificate (reloaded on change)")
	fs.StringVar(&o.Mount.ClientCertFile, "mountproxy-client-cert-file", o.Mount.ClientCertFile, "client certificate of the probe, issued by the shim's requestheader CA (reloaded on change)")
	fs.StringVar(&o.Mount.ClientKeyFile, "mountproxy-client-key-file", o.Mount.ClientKeyFile, "key of --mountproxy-client-cert-file")
	fs.StringVar(&o.Mount.UserHeader, "mountproxy-user-header", o.Mount.UserHeader, "the shim's user header (its --requestheader-username-headers); required with --mountproxy-url")
	fs.StringVar(&o.Mount.GroupHeader, "mountproxy-group-header", o.Mount.GroupHeader, "the shim's group header (its --requestheader-group-headers); required with --mountproxy-url")
	fs.DurationVar(&o.Mount.ProbeInterval, "tenant-probe-interval", o.Mount.ProbeInterval, "how often a TenantCluster's tenant is probed through the shim")
	fs.StringVar(&o.GatewayCAFile, "gateway-ca-file", o.GatewayCAFile, "CA bundle (PEM) that verifies the bidders' gateways, besides the system's roots, when Gateways are probed")
	fs.StringVar(&o.Guest.Server, "guest-kcp-server", o.Guest.Server, "kcp-front-proxy's https://host:port as workloads in the tenants reach it, written into GuestIdentityGrants' kubeconfigs; empty reports grants NotEnabled")
	fs.StringVar(&o.Guest.CAFile, "guest-kcp-ca-file", o.Guest.CAFile, "CA bundle that verifies kcp-front-proxy, written into GuestIdentityGrants' kubeconfigs")
	fs.StringVar(&o.Guest.TLSServerName, "guest-kcp-tls-server-name", o.Guest.TLSServerName, "name kcp-front-proxy's certificate is checked for by the guests, when --guest-kcp-server's host is not in it")
	fs.StringVar(&o.Guest.WebhookBindAddress, "admission-webhook-bind-address", o.Guest.WebhookBindAddress, "address of the GuestIdentityGrant admission webhook (https)")
	fs.StringVar(&o.Guest.WebhookCertDir, "admission-webhook-cert-dir", o.Guest.WebhookCertDir, "directory with the webhook's serving tls.crt and tls.key (reloaded on change)")
	fs.StringVar(&o.Guest.WebhookURL, "admission-webhook-url", o.Guest.WebhookURL, "https://host:port where kcp reaches the webhook")
	fs.StringVar(&o.Guest.WebhookCAFile, "admission-webhook-ca-file", o.Guest.WebhookCAFile, "CA bundle kcp verifies the webhook's certificate with")
	fs.StringVar(&o.AllowPrivateNetworks, "allow-private-networks", o.AllowPrivateNetworks, "comma-separated loopback/private CIDR ranges (or addresses) that PDS and firehose connections may reach, and where plain http may carry credentials; empty allows public addresses only (link-local and metadata addresses, kcp's and the mount proxy's are never reached)")
	fs.StringVar(&o.FirehoseMetricSources, "firehose-metric-sources", o.FirehoseMetricSources, "comma-separated host or host:port of firehose sources whose metrics carry their own source label; every other source is labelled \"other\" (metric labels come from a bounded set)")
	fs.BoolVar(&o.LeaderElection.Enabled, "leader-elect", o.LeaderElection.Enabled, "take turns with other replicas through a Lease in the provider workspace; only the holder reconciles")
	fs.StringVar(&o.LeaderElection.Namespace, "leader-election-namespace", o.LeaderElection.Namespace, "namespace of the Lease in the provider workspace (created if missing)")
	fs.StringVar(&o.LeaderElection.ID, "leader-election-id", o.LeaderElection.ID, "name of the Lease")
	fs.DurationVar(&o.LeaderElection.LeaseDuration, "leader-election-lease-duration", o.LeaderElection.LeaseDuration, "how long a replica waits before it takes over a Lease that was not renewed")
	fs.DurationVar(&o.LeaderElection.RenewDeadline, "leader-election-renew-deadline", o.LeaderElection.RenewDeadline, "how long the leader tries to renew before it gives up (and exits)")
	fs.DurationVar(&o.LeaderElection.RetryPeriod, "leader-election-retry-period", o.LeaderElection.RetryPeriod, "how often replicas try to acquire or renew the Lease")
	vault.BindFlags(fs, &o.Vault)
	o.Logs.BindFlags(fs)
}

// Validate checks every flag without connecting to anything and returns
// all problems in one error (nil when there are none). It reads only the
// Vault token and secret ID files and the Vault CA file, through
// vault.New, which validates them and sends no request. The kubeconfig
// and the probe's TLS files are loaded, and host names resolved, when
// the provider starts.
func (o *Options) Validate() error {
	errs := []error{
		flagcheck.Kubeconfig(o.Kubeconfig),
		flagcheck.Workspace("--workspace", o.Workspace),
		flagcheck.BindAddress("--metrics-bind-address", o.MetricsBindAddress),
		flagcheck.BindAddress("--health-probe-bind-address", o.HealthProbeBindAddress),
		flagcheck.BindAddress("--pprof-bind-address", o.PprofBindAddress),
		flagcheck.Positive("--connect-timeout", o.ConnectTimeout),
		flagcheck.Positive("--shutdown-timeout", o.ShutdownTimeout),
	}
	if o.AtprotoWorkers < 1 {
		errs = append(errs, fmt.Errorf("--atproto-workers must be at least 1, got %d", o.AtprotoWorkers))
	}
	if o.AtprotoMaxBatch < 1 || o.AtprotoMaxBatch > pds.MaxWritesPerBatch {
		errs = append(errs, fmt.Errorf("want --atproto-max-batch between 1 and %d, got %d", pds.MaxWritesPerBatch, o.AtprotoMaxBatch))
	}
	errs = append(errs,
		flagcheck.Positive("--atproto-resync", o.AtprotoResync),
		validatePLCURL(o.PLCURL),
		flagcheck.Positive("--watch-flush-interval", o.WatchFlushInterval),
	)
	errs = append(errs, o.Mount.validate()...)
	errs = append(errs, o.Guest.validate()...)
	if _, err := netpolicy.ParsePrefixes(o.AllowPrivateNetworks); err != nil {
		errs = append(errs, fmt.Errorf("--allow-private-networks: %w", err))
	}
	errs = append(errs, validateMetricSources(o.FirehoseMetricSources), validateVault(o.Vault))
	errs = append(errs, o.LeaderElection.validate()...)
	return flagcheck.Join(errs...)
}

func (l LeaderElectionOptions) validate() []error {
	errs := []error{
		flagcheck.Positive("--leader-election-lease-duration", l.LeaseDuration),
		flagcheck.Positive("--leader-election-renew-deadline", l.RenewDeadline),
		flagcheck.Positive("--leader-election-retry-period", l.RetryPeriod),
	}
	if l.LeaseDuration <= l.RenewDeadline || l.RenewDeadline <= l.RetryPeriod {
		errs = append(errs, fmt.Errorf("want --leader-election-lease-duration (%s) > --leader-election-renew-deadline (%s) > --leader-election-retry-period (%s)", l.LeaseDuration, l.RenewDeadline, l.RetryPeriod))
	}
	if msgs := validation.IsDNS1123Label(l.Namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--leader-election-namespace %q: %s", l.Namespace, strings.Join(msgs, "; ")))
	}
	if msgs := validation.IsDNS1123Subdomain(l.ID); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--leader-election-id %q: %s", l.ID, strings.Join(msgs, "; ")))
	}
	return errs
}

func (m MountOptions) validate() []error {
	errs := []error{flagcheck.Positive("--tenant-probe-interval", m.ProbeInterval), m.validateMountURL()}
	if m.ProxyURL == "" {
		if m.CAFile != "" || m.ClientCertFile != "" || m.ClientKeyFile != "" {
			errs = append(errs, errors.New("--mountproxy-ca-file and --mountproxy-client-cert-file/-key-file need --mountproxy-url"))
		}
		if m.UserHeader != "" || m.GroupHeader != "" {
			errs = append(errs, errors.New("--mountproxy-user-header and --mountproxy-group-header need --mountproxy-url"))
		}
		return errs
	}
	return append(errs, m.validateProxy()...)
}

// validateMountURL checks --mount-url, when set.
func (m MountOptions) validateMountURL() error {
	if m.MountURL == "" {
		return nil
	}
	u, err := flagcheck.URL("--mount-url", m.MountURL)
	if err != nil {
		return err
	}
	if (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("--mount-url %q must be an https:// (or http://) URL with a host and no query or fragment", m.MountURL)
	}
	return nil
}

// validateProxy checks the flags of the mount proxy the prober asks, once
// --mountproxy-url is set: its URL, the probe's client certificate and CA,
// and the two identity headers.
func (m MountOptions) validateProxy() []error {
	var errs []error
	if u, err := flagcheck.URL("--mountproxy-url", m.ProxyURL); err != nil {
		errs = append(errs, err)
	} else if u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		errs = append(errs, fmt.Errorf("--mountproxy-url %q must be https://host:port", m.ProxyURL))
	}
	if m.CAFile == "" || m.ClientCertFile == "" || m.ClientKeyFile == "" {
		errs = append(errs, errors.New("--mountproxy-url needs --mountproxy-ca-file, --mountproxy-client-cert-file and --mountproxy-client-key-file"))
	}
	userErr := mountproxy.ValidateHeaderName("--mountproxy-user-header", m.UserHeader)
	groupErr := mountproxy.ValidateHeaderName("--mountproxy-group-header", m.GroupHeader)
	errs = append(errs, userErr, groupErr)
	if userErr == nil && groupErr == nil && http.CanonicalHeaderKey(m.UserHeader) == http.CanonicalHeaderKey(m.GroupHeader) {
		errs = append(errs, errors.New("--mountproxy-user-header and --mountproxy-group-header must differ"))
	}
	return errs
}

// validatePLCURL requires scheme://host[:port], as firehose sources are.
func validatePLCURL(raw string) error {
	if _, err := flagcheck.URL("--plc-url", raw); err != nil {
		return err
	}
	if _, err := firehose.NormalizeSource(raw); err != nil {
		return fmt.Errorf("--plc-url: %w", err)
	}
	return nil
}

// validateMetricSources requires host or host:port entries, as
// firehose.NewHub does.
func validateMetricSources(list string) error {
	for i, s := range bootstrap.SplitList(list) {
		switch {
		case strings.Contains(s, "@"):
			return fmt.Errorf("--firehose-metric-sources: entry %d must not carry credentials: want host or host:port", i+1)
		case strings.ContainsAny(s, "/?#"):
			return fmt.Errorf("--firehose-metric-sources: %q: want host or host:port, not a URL", s)
		}
	}
	return nil
}

// validateVault checks the --vault-* flags when --vault-address is set.
// vault.New reads the token and secret ID files (their content never
// appears in an error) and sends no request.
func validateVault(c vault.Config) error {
	if !c.Enabled() {
		return nil
	}
	if _, err := flagcheck.URL("--vault-address", strings.TrimSpace(c.Address)); err != nil {
		return err
	}
	if _, err := vault.New(c); err != nil {
		return err
	}
	return nil
}
