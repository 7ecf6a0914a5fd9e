/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package options

import (
	"flag"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// secret is the password of the test's URLs: no error may repeat it.
const secret = "s3cret-value"

const (
	userHeader  = "X-Knotless-0123456789abcdef-User"
	groupHeader = "X-Knotless-fedcba9876543210-Group"
	extraPrefix = "X-Knotless-00112233445566aa-Extra-"
)

// parse binds a fresh Options to a flag set and parses args.
func parse(t *testing.T, args ...string) *Options {
	t.Helper()
	o := NewOptions()
	fs := flag.NewFlagSet("knotless-mountproxy", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parsing %q: %v", args, err)
	}
	return o
}

// valid returns options that pass: the defaults with the required flags.
func valid() *Options {
	o := NewOptions()
	o.Kubeconfig = "/kcp/admin.kubeconfig"
	o.Files.ServingCert, o.Files.ServingKey, o.Files.RequestHeaderCA = "/shim.crt", "/shim.key", "/requestheader-ca.crt"
	o.Headers.User, o.Headers.Group, o.Headers.ExtraPrefix = userHeader, groupHeader, extraPrefix
	return o
}

// TestFlags: the flag names and their defaults are NewOptions'.
func TestFlags(t *testing.T) {
	t.Setenv("KUBECONFIG", "/from/env")
	o := NewOptions()
	fs := flag.NewFlagSet("knotless-mountproxy", flag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if want := NewOptions(); !reflect.DeepEqual(o, want) {
		t.Errorf("parsing no flags changed the options:\ngot  %+v\nwant %+v", o, want)
	}
	if o.Kubeconfig != "/from/env" {
		t.Errorf("--kubeconfig defaults to %q, want $KUBECONFIG", o.Kubeconfig)
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.HasPrefix(f.Name, "zap-") {
			names = append(names, f.Name)
		}
	})
	want := []string{
		"allow-private-networks", "authorization-cache-denied-ttl", "authorization-cache-size", "authorization-cache-ttl",
		"bind-address", "connect-timeout", "context", "health-probe-bind-address", "kubeconfig", "metrics-bind-address",
		"path-prefix", "probe-client-names", "requestheader-allowed-names", "requestheader-client-ca-file",
		"requestheader-extra-headers-prefix", "requestheader-group-headers", "requestheader-username-headers",
		"reserved-addresses", "shutdown-timeout", "tenant-response-header-timeout", "tls-cert-file", "tls-private-key-file", "workspace",
	}
	if !slices.Equal(names, want) {
		t.Errorf("flags:\ngot  %q\nwant %q", names, want)
	}
	for name, def := range map[string]string{
		"workspace": "root:knotless", "bind-address": "127.0.0.1:9443", "requestheader-allowed-names": "kcp-front-proxy,knotless-probe",
		"probe-client-names": "knotless-probe", "authorization-cache-ttl": "10s", "authorization-cache-denied-ttl": "5s",
		"authorization-cache-size": "10000", "tenant-response-header-timeout": "1m0s", "path-prefix": "/tenants/",
		"metrics-bind-address": "127.0.0.1:8090", "health-probe-bind-address": "127.0.0.1:8091", "connect-timeout": "20s", "shutdown-timeout": "30s",
	} {
		if got := fs.Lookup(name).DefValue; got != def {
			t.Errorf("--%s defaults to %q, want %q", name, got, def)
		}
	}
}

// TestValidateAcceptsWhatTheSuiteAndDevPass: the flags the e2e suite
// (e2e/framework/mount.go, TestMountProxyBadFlags' common flags) and make
// dev (hack/dev.sh with hack/mountdev's shim_args) give the shim are
// valid.
func TestValidateAcceptsWhatTheSuiteAndDevPass(t *testing.T) {
	shim := []string{
		"--allow-private-networks", "127.0.0.1/32", "--reserved-addresses", "https://127.0.0.1:40001",
		"--tls-cert-file", "/e2e/shim.crt", "--tls-private-key-file", "/e2e/shim.key", "--requestheader-client-ca-file", "/e2e/shim-requestheader-ca.crt",
		"--requestheader-username-headers", userHeader, "--requestheader-group-headers", groupHeader, "--requestheader-extra-headers-prefix", extraPrefix,
	}
	for name, args := range map[string][]string{
		"e2e": append([]string{
			"--health-probe-bind-address", "127.0.0.1:40002", "--metrics-bind-address", "127.0.0.1:40003",
			"--kubeconfig", "/e2e/admin.kubeconfig", "--workspace", "root:e2e-abc-org:knotless", "--bind-address", "127.0.0.1:40004",
		}, shim...),
		"e2e bad-flag base": append([]string{
			"--kubeconfig", "/e2e/admin.kubeconfig", "--bind-address", "127.0.0.1:0", "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		}, shim...),
		"make dev": append([]string{
			"--kubeconfig", "/dev/admin.kubeconfig", "--workspace", "root:knotless",
			"--metrics-bind-address", "127.0.0.1:8090", "--health-probe-bind-address", "127.0.0.1:8091", "--bind-address", "127.0.0.1:9443",
		}, shim...),
	} {
		t.Run(name, func(t *testing.T) {
			if err := parse(t, args...).Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Options)
		// want are the parts of the error; none: valid.
		want []string
	}{
		{name: "defaults with the required flags", change: func(*Options) {}},
		{name: "no kubeconfig", change: func(o *Options) { o.Kubeconfig = "" }, want: []string{"no kubeconfig: pass --kubeconfig or set KUBECONFIG"}},
		{name: "invalid workspace path", change: func(o *Options) { o.Workspace = "root:Not_Valid" }, want: []string{`--workspace "root:Not_Valid" is not a valid workspace path`}},

		{name: "listener on a free port", change: func(o *Options) { o.BindAddress = "127.0.0.1:0" }},
		{name: "listener on every address", change: func(o *Options) { o.BindAddress = ":9443" }},
		{name: "listener without a port", change: func(o *Options) { o.BindAddress = "127.0.0.1" }, want: []string{`--bind-address "127.0.0.1" must be host:port`}},
		{name: "listener disabled", change: func(o *Options) { o.BindAddress = "0" }, want: []string{"--bind-address"}},
		{name: "endpoints disabled", change: func(o *Options) { o.MetricsBindAddress, o.HealthProbeBindAddress = "0", "0" }},
		{name: "metrics address without a port", change: func(o *Options) { o.MetricsBindAddress = "localhost" }, want: []string{`--metrics-bind-address "localhost" must be host:port, or 0 to disable it`}},
		{name: "empty probe address", change: func(o *Options) { o.HealthProbeBindAddress = "" }, want: []string{"--health-probe-bind-address"}},

		{name: "no connect timeout", change: func(o *Options) { o.ConnectTimeout = 0 }, want: []string{"--connect-timeout must be positive"}},
		{name: "no shutdown timeout", change: func(o *Options) { o.ShutdownTimeout = 0 }, want: []string{"--shutdown-timeout must be positive"}},

		{name: "no TLS files", change: func(o *Options) { o.Files.ServingCert, o.Files.ServingKey, o.Files.RequestHeaderCA = "", "", "" }, want: []string{"--tls-cert-file, --tls-private-key-file and --requestheader-client-ca-file are required"}},
		{name: "no serving key", change: func(o *Options) { o.Files.ServingKey = "" }, want: []string{"are required"}},
		{name: "no requestheader CA", change: func(o *Options) { o.Files.RequestHeaderCA = "" }, want: []string{"are required"}},

		{name: "no identity header names", change: func(o *Options) { o.Headers.User, o.Headers.Group, o.Headers.ExtraPrefix = "", "", "" }, want: []string{
			"the --requestheader-username-headers is required", "the --requestheader-group-headers is required", "the --requestheader-extra-headers-prefix is required",
		}},
		{name: "the standard identity header names", change: func(o *Options) {
			o.Headers.User, o.Headers.Group, o.Headers.ExtraPrefix = "X-Remote-User", "X-Remote-Group", "X-Remote-Extra-"
		}, want: []string{"--requestheader-username-headers", "--requestheader-group-headers", "--requestheader-extra-headers-prefix", "standard name"}},
		{name: "a guessable user header", change: func(o *Options) { o.Headers.User = "X-User" }, want: []string{"--requestheader-username-headers", "shorter than"}},
		{name: "Impersonate-User as the user header", change: func(o *Options) { o.Headers.User = "Impersonate-User-0123456789abcdef" }, want: []string{"standard name"}},
		{name: "a group header without a random part", change: func(o *Options) { o.Headers.Group = "X-Knotless-Caller-Group-Header" }, want: []string{"--requestheader-group-headers", "no run of 16 hex digits"}},
		{name: "an extra prefix with an underscore", change: func(o *Options) { o.Headers.ExtraPrefix = "X-Knotless_00112233445566aa-Extra-" }, want: []string{"--requestheader-extra-headers-prefix", "only letters, digits and '-'"}},
		{name: "one header for user and group", change: func(o *Options) { o.Headers.Group = strings.ToLower(userHeader) }, want: []string{headerFlags, "must be distinct"}},
		{name: "user header under the extra prefix", change: func(o *Options) { o.Headers.User = extraPrefix + "User" }, want: []string{headerFlags, "must be distinct"}},

		{name: "any certificate of the CA may assert identities", change: func(o *Options) { o.RequestHeaderAllowedNames = "" }},
		{name: "several allowed names", change: func(o *Options) {
			o.RequestHeaderAllowedNames, o.ProbeClientNames = "kcp-front-proxy, probe-a,probe-b", "probe-a,probe-b"
		}},
		{name: "no probe", change: func(o *Options) { o.RequestHeaderAllowedNames, o.ProbeClientNames = "kcp-front-proxy", "" }},
		{name: "a probe that may not assert identities", change: func(o *Options) { o.RequestHeaderAllowedNames = "kcp-front-proxy" }, want: []string{`--probe-client-names: "knotless-probe" is not in --requestheader-allowed-names`}},

		{name: "private networks", change: func(o *Options) { o.AllowPrivateNetworks = "127.0.0.1/32,192.168.0.0/16" }},
		{name: "metadata range allowed", change: func(o *Options) { o.AllowPrivateNetworks = "169.254.0.0/16" }, want: []string{"--allow-private-networks", "only loopback, private and shared ranges"}},
		{name: "IPv4-mapped range", change: func(o *Options) { o.AllowPrivateNetworks = "::ffff:10.0.0.0/104" }, want: []string{"--allow-private-networks", "write IPv4 ranges as IPv4"}},

		{name: "reserved addresses", change: func(o *Options) {
			o.ReservedAddresses = "https://front-proxy.example, front-proxy.invalid:443, wss://kcp.example:6443/clusters/root, [::1]:8443"
		}},
		{name: "reserved address without a port", change: func(o *Options) { o.ReservedAddresses = "front-proxy.example" }, want: []string{`--reserved-addresses: "front-proxy.example" has no port`}},
		{name: "reserved URL of an unknown scheme without a port", change: func(o *Options) { o.ReservedAddresses = "grpc://kcp.example" }, want: []string{"--reserved-addresses", "has no port"}},
		{name: "reserved URL with credentials", change: func(o *Options) { o.ReservedAddresses = "https://admin:" + secret + "@front-proxy.example" }, want: []string{"--reserved-addresses: entry 1 must not carry credentials"}},

		{name: "no authorization cache", change: func(o *Options) { o.Authorization.Size = 0 }, want: []string{"--authorization-cache-size must be positive"}},
		{name: "no authorization TTL", change: func(o *Options) { o.Authorization.AllowTTL = 0 }, want: []string{"--authorization-cache-ttl must be positive"}},
		{name: "negative denied TTL", change: func(o *Options) { o.Authorization.DenyTTL = -time.Second }, want: []string{"--authorization-cache-denied-ttl must be positive"}},
		{name: "no tenant response header timeout", change: func(o *Options) { o.TenantResponseHeaderTimeout = 0 }, want: []string{"--tenant-response-header-timeout must be positive"}},

		{name: "another path prefix", change: func(o *Options) { o.PathPrefix = "/mounts/knotless/" }},
		{name: "path prefix without slashes", change: func(o *Options) { o.PathPrefix = "tenants" }, want: []string{`--path-prefix "tenants" must start and end with /`}},
		{name: "path prefix without the trailing slash", change: func(o *Options) { o.PathPrefix = "/tenants" }, want: []string{"must start and end with /"}},
		{name: "empty path prefix", change: func(o *Options) { o.PathPrefix = "" }, want: []string{"--path-prefix"}},

		{name: "every problem at once", change: func(o *Options) {
			o.Workspace, o.Files.ServingCert, o.Headers.User, o.Authorization.Size, o.PathPrefix = "root:Not_Valid", "", "", 0, "tenants"
		}, want: []string{"not a valid workspace path", "are required", "--requestheader-username-headers is required", "--authorization-cache-size must be positive", "must start and end with /"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := valid()
			tc.change(o)
			err := o.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("want an error containing %q, got none", tc.want)
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("want an error containing %q, got %q", w, msg)
				}
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("want one line, got %q", msg)
			}
			if strings.Contains(msg, secret) {
				t.Errorf("the error repeats a secret: %q", msg)
			}
		})
	}
}
