/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package options

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func valid(t *testing.T) *Options {
	t.Helper()
	kcp := filepath.Join(t.TempDir(), "kcp")
	if err := os.WriteFile(kcp, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	o := NewOptions()
	o.Kubeconfig, o.KCP, o.ProcessRoot = "/bidder.kubeconfig", kcp, "/var/lib/knotless-agent"
	return o
}

// TestFlags: every option has a flag with NewOptions' default.
func TestFlags(t *testing.T) {
	o := NewOptions()
	fs := flag.NewFlagSet("knotless-agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--kubeconfig", "/k", "--process-root", "/r", "--kcp", "/bin/kcp", "--tenant-host", "10.0.0.1", "--metrics-bind-address", "0", "--health-probe-bind-address", ":9",
		"--node-image", "knotless.dev/node:v1", "--kind", "/bin/kind", "--kind-root", "/kr", "--kind-path-prefix", "/shim", "--preload-image", "a:1", "--preload-image", "b:2"}); err != nil {
		t.Fatal(err)
	}
	if o.NodeImage != "knotless.dev/node:v1" || o.Kind != "/bin/kind" || o.KindRoot != "/kr" || o.KindPathPrefix != "/shim" || len(o.PreloadImages) != 2 || o.PreloadImages[1] != "b:2" {
		t.Errorf("kind flags not bound: %+v", o)
	}
	if o.Kubeconfig != "/k" || o.ProcessRoot != "/r" || o.KCP != "/bin/kcp" || o.TenantHost != "10.0.0.1" || o.MetricsBindAddress != "0" || o.HealthProbeBindAddress != ":9" {
		t.Errorf("flags not bound: %+v", o)
	}
}

// TestValidate: each bad value is refused with the flag named, all at
// once; the valid options pass.
func TestValidate(t *testing.T) {
	if err := valid(t).Validate(); err != nil {
		t.Fatalf("valid options refused: %v", err)
	}
	withKind := valid(t)
	withKind.NodeImage, withKind.Kind, withKind.PreloadImages = "knotless.dev/node:v1", withKind.KCP, []string{"test/server:1"}
	if err := withKind.Validate(); err != nil {
		t.Fatalf("valid kind options refused: %v", err)
	}
	withGateway := valid(t)
	withGateway.GatewayAddress, withGateway.GatewayCertFile, withGateway.GatewayKeyFile = ":8443", "/c", "/k"
	if err := withGateway.Validate(); err != nil || withGateway.GatewayPublic() != ":8443" {
		t.Fatalf("valid gateway options refused: %v (public %q)", err, withGateway.GatewayPublic())
	}
	withGateway.GatewayPublicAddress = "gw.fit.example:443"
	if err := withGateway.Validate(); err != nil || withGateway.GatewayPublic() != "gw.fit.example:443" {
		t.Fatalf("a public gateway address refused: %v (public %q)", err, withGateway.GatewayPublic())
	}
	for _, c := range []struct {
		flag string
		bad  func(*Options)
	}{
		{"kubeconfig", func(o *Options) { o.Kubeconfig = "" }},
		{"--process-root", func(o *Options) { o.ProcessRoot = "relative/dir" }},
		{"--kcp", func(o *Options) { o.KCP = "/no/such/kcp" }},
		{"--tenant-host", func(o *Options) { o.TenantHost = "localhost" }},
		{"--metrics-bind-address", func(o *Options) { o.MetricsBindAddress = "nope" }},
		{"--health-probe-bind-address", func(o *Options) { o.HealthProbeBindAddress = "nope" }},
		{"--kind", func(o *Options) { o.NodeImage, o.Kind = "img", "/no/such/kind" }},
		{"--kind-root", func(o *Options) { o.NodeImage, o.Kind, o.KindRoot = "img", o.KCP, "relative" }},
		{"--kind-path-prefix", func(o *Options) { o.NodeImage, o.Kind, o.KindPathPrefix = "img", o.KCP, "shim" }},
		{"--preload-image", func(o *Options) { o.PreloadImages = []string{"a:1"} }},
		{"--webhook-address", func(o *Options) { o.WebhookAddress = "127.0.0.1:0" }},
		{"--webhook-address", func(o *Options) { o.WebhookAddress = "localhost:8094" }},
		{"--webhook-address", func(o *Options) { o.WebhookAddress = "0.0.0.0:8094" }},
		{"--webhook-address", func(o *Options) { o.WebhookAddress = "[::]:8094" }},
		{"--webhook-dir", func(o *Options) { o.WebhookDir = "relative" }},
		{"--plc-url", func(o *Options) { o.PLCURL = "http://user:pw@plc" }},
		{"--allow-private-networks", func(o *Options) { o.AllowPrivateNetworks = "not-a-range" }},
		{"--preload-image", func(o *Options) { o.NodeImage, o.Kind, o.PreloadImages = "img", o.KCP, []string{"--privileged"} }},
		{"--gateway-public-address", func(o *Options) { o.GatewayPublicAddress = "gw.example:443" }},
		{"--ssh-address needs --gateway-address", func(o *Options) { o.SSHAddress = ":2222" }},
		{"--ssh-public-address", func(o *Options) { o.SSHPublicAddress = "gw.example:22" }},
		{"--ssh-dir", func(o *Options) {
			o.GatewayAddress, o.GatewayCertFile, o.GatewayKeyFile, o.SSHAddress, o.SSHDir = ":8443", "/c", "/k", ":2222", "ssh"
		}},
		{"--ssh-key-ttl", func(o *Options) {
			o.GatewayAddress, o.GatewayCertFile, o.GatewayKeyFile, o.SSHAddress, o.SSHKeyTTL = ":8443", "/c", "/k", ":2222", 0
		}},
		{"--gateway-public-address", func(o *Options) {
			o.GatewayAddress, o.GatewayCertFile, o.GatewayKeyFile, o.GatewayPublicAddress = ":8443", "/c", "/k", "gw.example"
		}},
		{"--gateway-public-address", func(o *Options) {
			o.GatewayAddress, o.GatewayCertFile, o.GatewayKeyFile, o.GatewayPublicAddress = ":8443", "/c", "/k", ":443"
		}},
	} {
		o := valid(t)
		c.bad(o)
		err := o.Validate()
		if err == nil || !strings.Contains(err.Error(), c.flag) {
			t.Errorf("%s: %v", c.flag, err)
		}
	}
}
