/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package options holds knotless-agent's flags: NewOptions sets their
// defaults, AddFlags binds them and Validate checks them before the agent
// connects to anything or starts a VM.
package options

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"

	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/knotless-dev/knotless/cmd/internal/flagcheck"
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
	// TenantHost is the address the process driver's tenants listen on.
	TenantHost string
	// MetricsBindAddress and HealthProbeBindAddress ("0" disables).
	MetricsBindAddress, HealthProbeBindAddress string
	Logs                                       zap.Options
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		Kubeconfig:             os.Getenv("KUBECONFIG"),
		ProcessRoot:            "/var/lib/knotless-agent",
		KCP:                    "kcp",
		TenantHost:             "127.0.0.1",
		MetricsBindAddress:     "127.0.0.1:8090",
		HealthProbeBindAddress: "127.0.0.1:8091",
	}
}

// AddFlags binds the options to fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig of the bidder's workspace (the agent needs no other)")
	fs.StringVar(&o.Context, "context", o.Context, "kubeconfig context (default: the current one)")
	fs.StringVar(&o.ProcessRoot, "process-root", o.ProcessRoot, "directory where the process driver keeps its VMs (absolute)")
	fs.StringVar(&o.KCP, "kcp", o.KCP, "the kcp binary the process driver runs as tenant apiservers (a path, or a name looked up in PATH)")
	fs.StringVar(&o.TenantHost, "tenant-host", o.TenantHost, "IP address the process driver's tenant apiservers listen on")
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
	if net.ParseIP(o.TenantHost) == nil {
		errs = append(errs, fmt.Errorf("--tenant-host: %q is not an IP address", o.TenantHost))
	}
	errs = append(errs, flagcheck.BindAddress("--metrics-bind-address", o.MetricsBindAddress),
		flagcheck.BindAddress("--health-probe-bind-address", o.HealthProbeBindAddress))
	return flagcheck.Join(errs...)
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
