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
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// secret is the content of the test's credential files and the password
// of its URLs: no error may repeat it.
const secret = "s3cret-value"

const (
	userHeader  = "X-Knotless-0123456789abcdef-User"
	groupHeader = "X-Knotless-fedcba9876543210-Group"
)

// parse binds a fresh Options to a flag set and parses args.
func parse(t *testing.T, args ...string) *Options {
	t.Helper()
	o := NewOptions()
	fs := flag.NewFlagSet("knotless-provider", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parsing %q: %v", args, err)
	}
	return o
}

func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestFlags: the flag names and their defaults are NewOptions'.
func TestFlags(t *testing.T) {
	t.Setenv("KUBECONFIG", "/from/env")
	o := NewOptions()
	fs := flag.NewFlagSet("knotless-provider", flag.ContinueOnError)
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
		"admission-webhook-bind-address", "admission-webhook-ca-file", "admission-webhook-cert-dir", "admission-webhook-url",
		"allow-private-networks", "atproto-max-batch", "atproto-resync", "atproto-workers", "bootstrap-only",
		"connect-timeout", "context", "firehose-metric-sources", "gateway-ca-file", "guest-kcp-ca-file", "guest-kcp-server",
		"guest-kcp-tls-server-name", "health-probe-bind-address", "kubeconfig",
		"leader-elect", "leader-election-id", "leader-election-lease-duration", "leader-election-namespace",
		"leader-election-renew-deadline", "leader-election-retry-period",
		"metrics-bind-address", "mount-url", "mountproxy-ca-file", "mountproxy-client-cert-file",
		"mountproxy-client-key-file", "mountproxy-group-header", "mountproxy-url", "mountproxy-user-header",
		"plc-url", "pprof-bind-address", "shutdown-timeout", "tenant-probe-interval", "vault-address",
		"vault-approle-mount", "vault-approle-role-id", "vault-approle-secret-id-file", "vault-ca-file",
		"vault-prefix", "vault-timeout", "vault-token-file", "watch-flush-interval", "workspace",
	}
	if !slices.Equal(names, want) {
		t.Errorf("flags:\ngot  %q\nwant %q", names, want)
	}
	for name, def := range map[string]string{
		"workspace": "root:knotless", "metrics-bind-address": "127.0.0.1:8080", "health-probe-bind-address": "127.0.0.1:8081",
		"pprof-bind-address": "0", "connect-timeout": "20s", "shutdown-timeout": "30s", "atproto-workers": "64",
		"atproto-max-batch": "200", "atproto-resync": "2m0s", "plc-url": "https://plc.directory", "watch-flush-interval": "2s",
		"tenant-probe-interval": "30s", "vault-approle-mount": "approle", "vault-prefix": "knotless", "vault-timeout": "10s",
	} {
		if got := fs.Lookup(name).DefValue; got != def {
			t.Errorf("--%s defaults to %q, want %q", name, got, def)
		}
	}
}

// TestValidateAcceptsWhatTheSuiteAndDevPass: the flags the e2e suite
// (e2e/main_test.go, e2e/framework) and make dev (hack/dev.sh) give the
// provider are valid.
func TestValidateAcceptsWhatTheSuiteAndDevPass(t *testing.T) {
	t.Setenv("VAULT_TOKEN", "")
	dir := t.TempDir()
	secretID := writeFile(t, filepath.Join(dir, "vault-secret-id"), secret)
	for name, args := range map[string][]string{
		"e2e": {
			"--pprof-bind-address", "127.0.0.1:40001", "--kubeconfig", "/e2e/admin.kubeconfig", "--workspace", "root:e2e-abc-org:knotless",
			"--health-probe-bind-address", "127.0.0.1:40002", "--metrics-bind-address", "127.0.0.1:40003",
			"--atproto-resync", "3s", "--plc-url", "http://127.0.0.1:40004", "--watch-flush-interval", "1s",
			"--allow-private-networks", "127.0.0.1/32", "--firehose-metric-sources", "127.0.0.1:40005",
			"--vault-address", "http://127.0.0.1:40006", "--vault-approle-role-id", "0d6b3c0e-role", "--vault-approle-secret-id-file", secretID, "--vault-prefix", "knotless",
			"--mountproxy-url", "https://127.0.0.1:40007", "--mount-url", "https://127.0.0.1:40008",
			"--mountproxy-ca-file", "/e2e/shim-ca.crt", "--mountproxy-client-cert-file", "/e2e/probe.crt", "--mountproxy-client-key-file", "/e2e/probe.key",
			"--mountproxy-user-header", userHeader, "--mountproxy-group-header", groupHeader, "--tenant-probe-interval", "2s",
			"--atproto-max-batch", "1",
			"--leader-elect", "--leader-election-lease-duration", "6s", "--leader-election-renew-deadline", "4s", "--leader-election-retry-period", "1s",
		},
		"e2e bootstrap-only":       {"--kubeconfig", "/e2e/admin.kubeconfig", "--workspace", "root:e2e-abc-org:knotless", "--bootstrap-only"},
		"e2e unreachable kcp":      {"--kubeconfig", "/e2e/unreachable.kubeconfig", "--connect-timeout", "2s"},
		"e2e malformed kubeconfig": {"--kubeconfig", "/e2e/malformed.kubeconfig"},
		"make dev": {
			"--kubeconfig", "/dev/admin.kubeconfig", "--workspace", "root:knotless",
			"--metrics-bind-address", "127.0.0.1:8080", "--health-probe-bind-address", "127.0.0.1:8081",
			"--vault-address", "http://127.0.0.1:8200", "--vault-approle-role-id", "role", "--vault-approle-secret-id-file", secretID, "--vault-prefix", "knotless",
			"--plc-url", "http://127.0.0.1:2582", "--allow-private-networks", "127.0.0.1/32",
		},
	} {
		t.Run(name, func(t *testing.T) {
			if err := parse(t, args...).Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	t.Setenv("VAULT_TOKEN", "")
	dir := t.TempDir()
	tokenFile := writeFile(t, filepath.Join(dir, "token"), secret)
	secretIDFile := writeFile(t, filepath.Join(dir, "secret-id"), secret)
	emptyFile := writeFile(t, filepath.Join(dir, "empty"), "")
	missing := filepath.Join(dir, "missing")
	withVault := func(o *Options) {
		o.Vault.Address = "https://vault.example:8200"
		o.Vault.TokenFile = tokenFile
	}
	withGuests := func(o *Options) {
		o.Guest = GuestOptions{Server: "https://10.0.0.1:6443", CAFile: "/fp-ca.crt", WebhookBindAddress: "0.0.0.0:9443", WebhookCertDir: "/certs",
			WebhookURL: "https://10.0.0.2:9443", WebhookCAFile: "/webhook-ca.crt"}
	}
	withMount := func(o *Options) {
		o.Mount.ProxyURL = "https://127.0.0.1:9443"
		o.Mount.CAFile, o.Mount.ClientCertFile, o.Mount.ClientKeyFile = "/ca.crt", "/probe.crt", "/probe.key"
		o.Mount.UserHeader, o.Mount.GroupHeader = userHeader, groupHeader
	}
	for _, tc := range []struct {
		name   string
		env    string // VAULT_TOKEN
		change func(*Options)
		// want are the parts of the error; none: valid.
		want []string
	}{
		{name: "defaults with a kubeconfig", change: func(*Options) {}},
		{name: "no kubeconfig", change: func(o *Options) { o.Kubeconfig = "" }, want: []string{"no kubeconfig: pass --kubeconfig or set KUBECONFIG"}},
		{name: "invalid workspace path", change: func(o *Options) { o.Workspace = "root:Not_Valid" }, want: []string{`--workspace "root:Not_Valid" is not a valid workspace path`}},
		{name: "empty workspace path", change: func(o *Options) { o.Workspace = "" }, want: []string{"--workspace"}},
		{name: "nested workspace path", change: func(o *Options) { o.Workspace = "root:org:knotless" }},
		{name: "leader election", change: func(o *Options) { o.LeaderElection.Enabled = true }},
		{name: "lease shorter than the renew deadline", change: func(o *Options) { o.LeaderElection.LeaseDuration = 5 * time.Second },
			want: []string{"want --leader-election-lease-duration (5s) > --leader-election-renew-deadline (10s) > --leader-election-retry-period (2s)"}},
		{name: "retry period not positive", change: func(o *Options) { o.LeaderElection.RetryPeriod = 0 }, want: []string{"--leader-election-retry-period"}},
		{name: "lease namespace not a DNS label", change: func(o *Options) { o.LeaderElection.Namespace = "Kube_System" }, want: []string{`--leader-election-namespace "Kube_System"`}},
		{name: "lease name not a DNS subdomain", change: func(o *Options) { o.LeaderElection.ID = "knotless provider" }, want: []string{`--leader-election-id "knotless provider"`}},

		{name: "endpoints disabled", change: func(o *Options) {
			o.MetricsBindAddress, o.HealthProbeBindAddress, o.PprofBindAddress = "0", "0", "0"
		}},
		{name: "endpoints on every address", change: func(o *Options) {
			o.MetricsBindAddress, o.HealthProbeBindAddress, o.PprofBindAddress = ":8080", "[::1]:8081", "0.0.0.0:0"
		}},
		{name: "metrics address without a port", change: func(o *Options) { o.MetricsBindAddress = "127.0.0.1" }, want: []string{`--metrics-bind-address "127.0.0.1" must be host:port, or 0 to disable it`}},
		{name: "empty metrics address", change: func(o *Options) { o.MetricsBindAddress = "" }, want: []string{"--metrics-bind-address"}},
		{name: "probe address with a named port", change: func(o *Options) { o.HealthProbeBindAddress = "localhost:http" }, want: []string{"--health-probe-bind-address"}},
		{name: "pprof port out of range", change: func(o *Options) { o.PprofBindAddress = "127.0.0.1:65536" }, want: []string{"--pprof-bind-address"}},

		{name: "no connect timeout", change: func(o *Options) { o.ConnectTimeout = 0 }, want: []string{"--connect-timeout must be positive"}},
		{name: "negative shutdown timeout", change: func(o *Options) { o.ShutdownTimeout = -time.Second }, want: []string{"--shutdown-timeout must be positive, got -1s"}},

		{name: "no record workers", change: func(o *Options) { o.AtprotoWorkers = 0 }, want: []string{"--atproto-workers must be at least 1"}},
		{name: "one record worker", change: func(o *Options) { o.AtprotoWorkers = 1 }},
		{name: "batch above the PDS limit", change: func(o *Options) { o.AtprotoMaxBatch = 201 }, want: []string{"--atproto-max-batch between 1 and 200"}},
		{name: "empty batches", change: func(o *Options) { o.AtprotoMaxBatch = 0 }, want: []string{"--atproto-max-batch between 1 and 200"}},
		{name: "no batching", change: func(o *Options) { o.AtprotoMaxBatch = 1 }},
		{name: "no resync", change: func(o *Options) { o.AtprotoResync = 0 }, want: []string{"--atproto-resync must be positive"}},
		{name: "no watch flush interval", change: func(o *Options) { o.WatchFlushInterval = 0 }, want: []string{"--watch-flush-interval must be positive"}},

		{name: "PLC URL with a path", change: func(o *Options) { o.PLCURL = "https://plc.example/x" }, want: []string{"--plc-url", "no path"}},
		{name: "PLC URL over ftp", change: func(o *Options) { o.PLCURL = "ftp://plc.example" }, want: []string{"--plc-url", "scheme must be http or https"}},
		{name: "PLC URL with credentials", change: func(o *Options) { o.PLCURL = "https://plc:" + secret + "@plc.example" }, want: []string{"--plc-url must not carry credentials"}},
		{name: "PLC URL that does not parse", change: func(o *Options) { o.PLCURL = "https://plc.example:port" }, want: []string{"--plc-url is not a URL"}},
		{name: "local PLC", change: func(o *Options) { o.PLCURL = "http://127.0.0.1:2582" }},

		{name: "private networks", change: func(o *Options) { o.AllowPrivateNetworks = "127.0.0.1/32, 10.0.0.0/8,fd00::/8" }},
		{name: "public range allowed as private", change: func(o *Options) { o.AllowPrivateNetworks = "0.0.0.0/0" }, want: []string{"--allow-private-networks"}},
		{name: "metadata range allowed", change: func(o *Options) { o.AllowPrivateNetworks = "169.254.0.0/16" }, want: []string{"--allow-private-networks", "only loopback, private and shared ranges"}},
		{name: "network that does not parse", change: func(o *Options) { o.AllowPrivateNetworks = "localhost" }, want: []string{"--allow-private-networks", "neither a CIDR range nor an IP address"}},

		{name: "metric sources", change: func(o *Options) { o.FirehoseMetricSources = "bsky.network, 127.0.0.1:2583" }},
		{name: "metric source as a URL", change: func(o *Options) { o.FirehoseMetricSources = "wss://bsky.network" }, want: []string{"--firehose-metric-sources", "want host or host:port"}},
		{name: "metric source with credentials", change: func(o *Options) { o.FirehoseMetricSources = "u:" + secret + "@bsky.network" }, want: []string{"--firehose-metric-sources: entry 1 must not carry credentials"}},

		{name: "Vault with a token file", change: withVault},
		{name: "Vault with VAULT_TOKEN", env: secret, change: func(o *Options) { o.Vault.Address = "https://vault.example:8200" }},
		{name: "Vault with AppRole", change: func(o *Options) {
			o.Vault.Address, o.Vault.AppRole.RoleID, o.Vault.AppRole.SecretIDFile = "http://127.0.0.1:8200", "role", secretIDFile
		}},
		{name: "Vault flags without an address are unused", change: func(o *Options) { o.Vault.TokenFile = missing }},
		{name: "Vault address over ftp", change: func(o *Options) { withVault(o); o.Vault.Address = "ftp://vault.example" }, want: []string{`vault: address "ftp://vault.example" is not an http(s):// or unix:// URL`}},
		{name: "Vault address with credentials", change: func(o *Options) { withVault(o); o.Vault.Address = "https://root:" + secret + "@vault.example:8200" }, want: []string{"--vault-address must not carry credentials"}},
		{name: "negative Vault timeout", change: func(o *Options) { withVault(o); o.Vault.Timeout = -time.Second }, want: []string{"vault: timeout -1s is negative"}},
		{name: "Vault prefix with ..", change: func(o *Options) { withVault(o); o.Vault.Prefix = "knotless/../other" }, want: []string{"vault: prefix", `".." is not allowed`}},
		{name: "Vault AppRole mount with a space", change: func(o *Options) { withVault(o); o.Vault.AppRole.MountPath = "app role" }, want: []string{"vault: AppRole mount"}},
		{name: "Vault token file missing", change: func(o *Options) { withVault(o); o.Vault.TokenFile = missing }, want: []string{"vault: token file", "no such file"}},
		{name: "Vault token file empty", change: func(o *Options) { withVault(o); o.Vault.TokenFile = emptyFile }, want: []string{"vault: token file", "is empty"}},
		{name: "Vault token and AppRole", change: func(o *Options) { withVault(o); o.Vault.AppRole.RoleID = "role" }, want: []string{"vault: both a token and an AppRole role ID are configured; choose one"}},
		{name: "Vault AppRole without a secret ID", change: func(o *Options) {
			o.Vault.Address, o.Vault.AppRole.RoleID = "https://vault.example:8200", "role"
		}, want: []string{"vault: AppRole needs a secret ID (--vault-approle-secret-id-file)"}},
		{name: "Vault AppRole secret ID file missing", change: func(o *Options) {
			o.Vault.Address, o.Vault.AppRole.RoleID, o.Vault.AppRole.SecretIDFile = "https://vault.example:8200", "role", missing
		}, want: []string{"vault: AppRole secret ID file"}},
		{name: "Vault without authentication", change: func(o *Options) { o.Vault.Address = "https://vault.example:8200" }, want: []string{"vault: no authentication configured"}},
		{name: "Vault CA file missing", change: func(o *Options) { withVault(o); o.Vault.CAFile = missing }, want: []string{"vault:", "missing"}},

		{name: "mount proxy", change: withMount},
		{name: "mount proxy with a mount URL", change: func(o *Options) { withMount(o); o.Mount.MountURL = "https://front-proxy.example:8443/base/" }},
		{name: "mount proxy over http", change: func(o *Options) { withMount(o); o.Mount.ProxyURL = "http://127.0.0.1:9443" }, want: []string{`--mountproxy-url "http://127.0.0.1:9443" must be https://host:port`}},
		{name: "mount proxy URL with a path", change: func(o *Options) { withMount(o); o.Mount.ProxyURL = "https://127.0.0.1:9443/tenants/" }, want: []string{"must be https://host:port"}},
		{name: "mount proxy URL without a host", change: func(o *Options) { withMount(o); o.Mount.ProxyURL = "https:///" }, want: []string{"must be https://host:port"}},
		{name: "mount proxy URL with credentials", change: func(o *Options) { withMount(o); o.Mount.ProxyURL = "https://probe:" + secret + "@127.0.0.1:9443" }, want: []string{"--mountproxy-url must not carry credentials"}},
		{name: "mount proxy without the probe's TLS files", change: func(o *Options) { withMount(o); o.Mount.CAFile = "" }, want: []string{"--mountproxy-url needs --mountproxy-ca-file, --mountproxy-client-cert-file and --mountproxy-client-key-file"}},
		{name: "probe TLS files without the mount proxy", change: func(o *Options) { o.Mount.ClientKeyFile = "/probe.key" }, want: []string{"--mountproxy-ca-file and --mountproxy-client-cert-file/-key-file need --mountproxy-url"}},
		{name: "probe headers without the mount proxy", change: func(o *Options) { o.Mount.UserHeader = userHeader }, want: []string{"--mountproxy-user-header and --mountproxy-group-header need --mountproxy-url"}},
		{name: "mount proxy headers missing", change: func(o *Options) { withMount(o); o.Mount.UserHeader, o.Mount.GroupHeader = "", "" }, want: []string{"--mountproxy-user-header is required", "--mountproxy-group-header is required"}},
		{name: "standard mount proxy user header", change: func(o *Options) { withMount(o); o.Mount.UserHeader = "X-Remote-User" }, want: []string{"--mountproxy-user-header", "standard name"}},
		{name: "guessable mount proxy group header", change: func(o *Options) { withMount(o); o.Mount.GroupHeader = "X-Group" }, want: []string{"--mountproxy-group-header", "shorter than"}},
		{name: "mount proxy header without random part", change: func(o *Options) { withMount(o); o.Mount.GroupHeader = "X-Knotless-Probe-Group-Header" }, want: []string{"--mountproxy-group-header", "no run of 16 hex digits"}},
		{name: "one header for user and group", change: func(o *Options) { withMount(o); o.Mount.GroupHeader = strings.ToLower(userHeader) }, want: []string{"--mountproxy-user-header and --mountproxy-group-header must differ"}},
		{name: "guests", change: withGuests},
		{name: "guests over http", change: func(o *Options) { withGuests(o); o.Guest.Server = "http://10.0.0.1:6443" }, want: []string{`--guest-kcp-server "http://10.0.0.1:6443" must be https://host:port`}},
		{name: "guests without the webhook's files", change: func(o *Options) { withGuests(o); o.Guest.WebhookCAFile = "" }, want: []string{"--guest-kcp-server needs --guest-kcp-ca-file, --admission-webhook-cert-dir and --admission-webhook-ca-file"}},
		{name: "webhook URL with a path", change: func(o *Options) { withGuests(o); o.Guest.WebhookURL = "https://10.0.0.2:9443/admit" }, want: []string{"--admission-webhook-url", "must be https://host:port"}},
		{name: "webhook files without guests", change: func(o *Options) { o.Guest.WebhookCertDir = "/certs" }, want: []string{"need --guest-kcp-server"}},
		{name: "webhook bind address", change: func(o *Options) { withGuests(o); o.Guest.WebhookBindAddress = "9443" }, want: []string{`--admission-webhook-bind-address "9443" must be host:port`}},
		{name: "no probe interval", change: func(o *Options) { o.Mount.ProbeInterval = 0 }, want: []string{"--tenant-probe-interval must be positive"}},
		{name: "mount URL over ftp", change: func(o *Options) { o.Mount.MountURL = "ftp://front-proxy.example" }, want: []string{`--mount-url "ftp://front-proxy.example" must be an https:// (or http://) URL`}},
		{name: "mount URL without a host", change: func(o *Options) { o.Mount.MountURL = "front-proxy.example:8443" }, want: []string{"--mount-url"}},
		{name: "mount URL with a query", change: func(o *Options) { o.Mount.MountURL = "https://front-proxy.example?x=1" }, want: []string{"--mount-url"}},
		{name: "mount URL with credentials", change: func(o *Options) { o.Mount.MountURL = "https://admin:" + secret + "@front-proxy.example" }, want: []string{"--mount-url must not carry credentials"}},

		{name: "every problem at once", change: func(o *Options) {
			o.Kubeconfig, o.AtprotoWorkers, o.WatchFlushInterval, o.AllowPrivateNetworks = "", 0, 0, "0.0.0.0/0"
			withMount(o)
			o.Mount.UserHeader = "X-Remote-User"
		}, want: []string{"no kubeconfig", "--atproto-workers must be at least 1", "--watch-flush-interval must be positive", "--allow-private-networks", "standard name"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("VAULT_TOKEN", tc.env)
			o := NewOptions()
			o.Kubeconfig = "/kcp/admin.kubeconfig"
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
