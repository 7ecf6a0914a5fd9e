/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package options holds knotless-agent's flags: NewOptions sets their
// defaults, AddFlags binds them and Validate checks them before the agent
// connects to anything or starts a VM.
package options

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/knotless-dev/knotless/cmd/internal/flagcheck"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// Options are knotless-agent's flags.
type Options struct {
	// Kubeconfig of the bidder's workspace (--kubeconfig, default
	// $KUBECONFIG) and its context (--context): the agent needs nothing
	// else of kcp.
	Kubeconfig, Context string
	// ProcessRoot is where the process driver keeps its VMs.
	ProcessRoot string
	// KCP is the kcp binary the process driver starts as tenant
	// apiservers.
	KCP string
	// TenantHost is the address the tenants' apiservers listen on (both
	// drivers).
	TenantHost string
	// NodeImage is the kind driver's node image (make node-image); the
	// agent has the kind driver only when it is set.
	NodeImage string
	// Kind is the kind binary of the kind driver (the pinned v0.33.0).
	Kind string
	// KindRoot is where the kind driver keeps what it knows of its VMs.
	KindRoot string
	// KindPathPrefix is put first in the PATH of kind and docker (the
	// docker shim hack/node-image/docker-runtime.sh prints, where needed).
	KindPathPrefix string
	// PreloadImages are loaded into every new kind VM (--preload-image,
	// repeated).
	PreloadImages stringList
	// WebhookAddress is the host:port of the service-auth webhook the
	// process driver's tenants ask who a bearer token is (an IP address
	// and a fixed port: the tenants keep it while they run).
	WebhookAddress string
	// WebhookDir keeps the webhook's serving certificate and its CA.
	WebhookDir string
	// PLCURL is the PLC directory that resolves the callers' DIDs.
	PLCURL string
	// AllowPrivateNetworks are the comma-separated loopback/private
	// ranges DID resolution may reach (did:web hosts, the PLC).
	AllowPrivateNetworks string
	// GatewayAddress is the host:port the gateway serves Gateway
	// hostnames on (TLS, SNI); empty: no gateway.
	GatewayAddress string
	// GatewayPublicAddress is the gateway's address as requesters' DNS
	// names lead to it (host:port), which the leases carry; default
	// GatewayAddress.
	GatewayPublicAddress string
	// GatewayCertFile and GatewayKeyFile are the gateway's certificate
	// (for the bidder's domain, e.g. *.gw.example.com) and key, read
	// again when they change (R08); it serves only hostnames they cover.
	GatewayCertFile, GatewayKeyFile string
	// GatewayDir keeps which lease holds each hostname, across restarts.
	GatewayDir string
	// SSHAddress is the host:port the SSH gateway listens on; empty: no
	// SSH gateway. It needs the gateway (GatewayAddress), which follows
	// the requesters' records.
	SSHAddress string
	// SSHPublicAddress is the SSH gateway's address as users reach it,
	// which the leases carry; default SSHAddress.
	SSHPublicAddress string
	// SSHDir keeps the SSH gateway's host key.
	SSHDir string
	// SSHKeyTTL is how long a DID's published SSH keys are kept.
	SSHKeyTTL time.Duration
	// MetricsBindAddress and HealthProbeBindAddress ("0" disables).
	MetricsBindAddress, HealthProbeBindAddress string
	Logs                                       zap.Options
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		Kubeconfig:  os.Getenv("KUBECONFIG"),
		ProcessRoot: "/var/lib/knotless-agent",
		KCP:         "kcp",
		TenantHost:  "127.0.0.1",
		Kind:        "kind",
		KindRoot:    "/var/lib/knotless-agent-kind",
		// Not the provider's (8080, 8081) nor the mount proxy's (8090,
		// 8091): the three may run on one machine (TestDefaultPortsDoNotClash).
		MetricsBindAddress:     "127.0.0.1:8092",
		HealthProbeBindAddress: "127.0.0.1:8093",
		WebhookAddress:         "127.0.0.1:8094",
		WebhookDir:             "/var/lib/knotless-agent-webhook",
		GatewayDir:             "/var/lib/knotless-agent-gateway",
		SSHDir:                 "/var/lib/knotless-agent-ssh",
		SSHKeyTTL:              time.Minute,
		PLCURL:                 "https://plc.directory",
	}
}

// AddFlags binds the options to fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig of the bidder's workspace (the agent needs no other)")
	fs.StringVar(&o.Context, "context", o.Context, "kubeconfig context (default: the current one)")
	fs.StringVar(&o.ProcessRoot, "process-root", o.ProcessRoot, "directory where the process driver keeps its VMs (absolute)")
	fs.StringVar(&o.KCP, "kcp", o.KCP, "the kcp binary the process driver runs as tenant apiservers (a path, or a name looked up in PATH)")
	fs.StringVar(&o.TenantHost, "tenant-host", o.TenantHost, "IP address the tenants' apiservers listen on (both drivers)")
	fs.StringVar(&o.NodeImage, "node-image", o.NodeImage, "node image of the kind driver (make node-image prints it); without it the agent has no kind driver")
	fs.StringVar(&o.Kind, "kind", o.Kind, "the kind binary of the kind driver (a path, or a name looked up in PATH)")
	fs.StringVar(&o.KindRoot, "kind-root", o.KindRoot, "directory where the kind driver keeps its VMs (absolute)")
	fs.StringVar(&o.KindPathPrefix, "kind-path-prefix", o.KindPathPrefix, "directory put first in the PATH of kind and docker (the docker shim hack/node-image/docker-runtime.sh prints, on machines that need it)")
	fs.Var(&o.PreloadImages, "preload-image", "an image of the agent's docker loaded into every new kind VM before it runs (repeatable; for nodes that cannot pull)")
	fs.StringVar(&o.WebhookAddress, "webhook-address", o.WebhookAddress, "loopback IP:port of the service-auth webhook the tenants authenticate bearer tokens with (a kind VM reaches it on its docker network's gateway, at the same port) (keep it fixed: running tenants keep the address they started with)")
	fs.StringVar(&o.WebhookDir, "webhook-dir", o.WebhookDir, "directory that keeps the webhook's serving certificate and CA (absolute)")
	fs.StringVar(&o.PLCURL, "plc-url", o.PLCURL, "PLC directory that resolves the DIDs of service-auth tokens")
	fs.StringVar(&o.AllowPrivateNetworks, "allow-private-networks", o.AllowPrivateNetworks, "comma-separated loopback/private CIDR ranges (or addresses) DID resolution may reach; empty allows public addresses only")
	fs.StringVar(&o.GatewayAddress, "gateway-address", o.GatewayAddress, "host:port the gateway serves the requesters' hostnames on, over TLS (dev.knotless.gateway.association records of live leases); empty: no gateway")
	fs.StringVar(&o.GatewayPublicAddress, "gateway-public-address", o.GatewayPublicAddress, "host:port of the gateway as the requesters' hostnames lead to it (their DNS records), published in the leases of tenants it serves; default --gateway-address")
	fs.StringVar(&o.GatewayCertFile, "gateway-cert-file", o.GatewayCertFile, "the gateway's TLS certificate (PEM, with its chain), for the bidder's domain: only hostnames it covers are served; read again when it changes")
	fs.StringVar(&o.GatewayKeyFile, "gateway-key-file", o.GatewayKeyFile, "the key of --gateway-cert-file")
	fs.StringVar(&o.SSHAddress, "ssh-address", o.SSHAddress, "host:port the SSH gateway listens on (ssh <handle-or-did>@host -- <tenant>/<namespace>/<pod> [command]), for dev.knotless.gateway.ssh records of live leases; needs --gateway-address; empty: no SSH gateway")
	fs.StringVar(&o.SSHPublicAddress, "ssh-public-address", o.SSHPublicAddress, "host:port of the SSH gateway as users reach it, published in the leases of tenants it serves; default --ssh-address")
	fs.StringVar(&o.SSHDir, "ssh-dir", o.SSHDir, "directory that keeps the SSH gateway's host key (made on first start; absolute)")
	fs.DurationVar(&o.SSHKeyTTL, "ssh-key-ttl", o.SSHKeyTTL, "how long a DID's published SSH keys (or that it publishes none) are kept: a key removed from its repo is refused after this long")
	fs.StringVar(&o.GatewayDir, "gateway-dir", o.GatewayDir, "directory that keeps which lease holds each hostname the gateway serves, so that a restart gives none to another lease (absolute)")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "host:port of the metrics endpoint (0 disables)")
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", o.HealthProbeBindAddress, "host:port of /healthz and /readyz (0 disables)")
	o.Logs.BindFlags(fs)
}

// Validate checks every option, reporting all problems at once.
func (o *Options) Validate() error {
	errs := []error{flagcheck.Kubeconfig(o.Kubeconfig)}
	if !filepath.IsAbs(o.ProcessRoot) {
		errs = append(errs, fmt.Errorf("--process-root: %q is not an absolute path", o.ProcessRoot))
	}
	if _, err := lookPath(o.KCP); err != nil {
		errs = append(errs, fmt.Errorf("--kcp: %w", err))
	}
	if o.NodeImage != "" {
		if _, err := lookPath(o.Kind); err != nil {
			errs = append(errs, fmt.Errorf("--kind: %w", err))
		}
		if !filepath.IsAbs(o.KindRoot) {
			errs = append(errs, fmt.Errorf("--kind-root: %q is not an absolute path", o.KindRoot))
		}
		if o.KindPathPrefix != "" && !filepath.IsAbs(o.KindPathPrefix) {
			errs = append(errs, fmt.Errorf("--kind-path-prefix: %q is not an absolute path", o.KindPathPrefix))
		}
	} else if len(o.PreloadImages) > 0 {
		errs = append(errs, errors.New("--preload-image: the agent has no kind driver (--node-image)"))
	}
	for _, img := range o.PreloadImages {
		if img == "" || strings.HasPrefix(img, "-") || strings.ContainsAny(img, " \t\n") {
			errs = append(errs, fmt.Errorf("--preload-image: %q is not an image reference", img))
		}
	}
	if net.ParseIP(o.TenantHost) == nil {
		errs = append(errs, fmt.Errorf("--tenant-host: %q is not an IP address", o.TenantHost))
	}
	errs = append(errs, o.validateServiceAuth()...)
	errs = append(errs, o.validateGateway()...)
	errs = append(errs, o.validateSSH()...)
	errs = append(errs, flagcheck.BindAddress("--metrics-bind-address", o.MetricsBindAddress),
		flagcheck.BindAddress("--health-probe-bind-address", o.HealthProbeBindAddress))
	return flagcheck.Join(errs...)
}

// validateServiceAuth checks the flags of the service-auth webhook.
func (o *Options) validateServiceAuth() []error {
	var errs []error
	// Loopback only: the webhook authenticates no caller (anyone who
	// reaches it learns whether a token is valid), and the process
	// driver's tenants run on this machine.
	if host, port, err := net.SplitHostPort(o.WebhookAddress); err != nil || !net.ParseIP(host).IsLoopback() || port == "" || port == "0" {
		errs = append(errs, fmt.Errorf("--webhook-address: %q is not a loopback IP:port with a fixed port", o.WebhookAddress))
	}
	if !filepath.IsAbs(o.WebhookDir) {
		errs = append(errs, fmt.Errorf("--webhook-dir: %q is not an absolute path", o.WebhookDir))
	}
	if _, err := flagcheck.URL("--plc-url", o.PLCURL); err != nil {
		errs = append(errs, err)
	}
	if _, err := netpolicy.ParsePrefixes(o.AllowPrivateNetworks); err != nil {
		errs = append(errs, fmt.Errorf("--allow-private-networks: %w", err))
	}
	return errs
}

// validateGateway checks the gateway's flags: all or none.
func (o *Options) validateGateway() []error {
	if o.GatewayAddress == "" {
		if o.GatewayCertFile != "" || o.GatewayKeyFile != "" || o.GatewayPublicAddress != "" {
			return []error{errors.New("--gateway-cert-file, --gateway-key-file, --gateway-public-address: the agent has no gateway (--gateway-address)")}
		}
		return nil
	}
	var errs []error
	if _, port, err := net.SplitHostPort(o.GatewayAddress); err != nil || port == "" {
		errs = append(errs, fmt.Errorf("--gateway-address: %q is not a host:port", o.GatewayAddress))
	}
	if o.GatewayPublicAddress != "" {
		if host, port, err := net.SplitHostPort(o.GatewayPublicAddress); err != nil || host == "" || port == "" || len(o.GatewayPublicAddress) > 261 {
			errs = append(errs, fmt.Errorf("--gateway-public-address: %q is not a host:port", o.GatewayPublicAddress))
		}
	}
	if !filepath.IsAbs(o.GatewayDir) {
		errs = append(errs, fmt.Errorf("--gateway-dir: %q is not an absolute path", o.GatewayDir))
	}
	if o.GatewayCertFile == "" || o.GatewayKeyFile == "" {
		errs = append(errs, errors.New("--gateway-address: --gateway-cert-file and --gateway-key-file are required"))
	}
	return errs
}

// validateSSH checks the SSH gateway's flags.
func (o *Options) validateSSH() []error {
	if o.SSHAddress == "" {
		if o.SSHPublicAddress != "" {
			return []error{errors.New("--ssh-public-address: the agent has no SSH gateway (--ssh-address)")}
		}
		return nil
	}
	var errs []error
	if _, port, err := net.SplitHostPort(o.SSHAddress); err != nil || port == "" {
		errs = append(errs, fmt.Errorf("--ssh-address: %q is not a host:port", o.SSHAddress))
	}
	if o.GatewayAddress == "" {
		errs = append(errs, errors.New("--ssh-address needs --gateway-address (the gateway follows the requesters' records)"))
	}
	if o.SSHPublicAddress != "" {
		if host, port, err := net.SplitHostPort(o.SSHPublicAddress); err != nil || host == "" || port == "" || len(o.SSHPublicAddress) > 261 {
			errs = append(errs, fmt.Errorf("--ssh-public-address: %q is not a host:port", o.SSHPublicAddress))
		}
	}
	if !filepath.IsAbs(o.SSHDir) {
		errs = append(errs, fmt.Errorf("--ssh-dir: %q is not an absolute path", o.SSHDir))
	}
	if o.SSHKeyTTL <= 0 {
		errs = append(errs, fmt.Errorf("--ssh-key-ttl: %s is not positive", o.SSHKeyTTL))
	}
	return errs
}

// SSHPublic is the SSH gateway's address the leases carry; empty
// without one.
func (o *Options) SSHPublic() string {
	if o.SSHPublicAddress != "" {
		return o.SSHPublicAddress
	}
	return o.SSHAddress
}

// GatewayPublic is the gateway's address the leases carry: the public
// address, or the address it listens on; empty without a gateway.
func (o *Options) GatewayPublic() string {
	if o.GatewayPublicAddress != "" {
		return o.GatewayPublicAddress
	}
	return o.GatewayAddress
}

// KindPath is the resolved kind binary (after Validate).
func (o *Options) KindPath() string {
	p, _ := lookPath(o.Kind)
	return p
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

// Set implements flag.Value.
func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// KCPPath is the resolved kcp binary (after Validate).
func (o *Options) KCPPath() string {
	p, _ := lookPath(o.KCP)
	return p
}

func lookPath(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%q is not an executable: %w", name, err)
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	return abs, nil
}
