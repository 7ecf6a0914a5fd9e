/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package deploy_test

import (
	"flag"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	mountproxyoptions "github.com/knotless-dev/knotless/cmd/knotless-mountproxy/options"
	provideroptions "github.com/knotless-dev/knotless/cmd/knotless-provider/options"
	"github.com/knotless-dev/knotless/deploy"
	"github.com/knotless-dev/knotless/e2e/framework"
)

const (
	userHeader  = "X-Knotless-0123456789abcdef-User"
	groupHeader = "X-Knotless-fedcba9876543210-Group"
	extraPrefix = "X-Knotless-00112233445566778899-Extra-"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := deploy.Helm(root); err != nil {
		t.Skipf("helm is not built, so the chart is not rendered: %v", err)
	}
	return root
}

// secretsFor returns contents for every Secret key the workload reads:
// a CA for CA bundles, a certificate and key for TLS Secrets, valid
// header names, and a placeholder elsewhere.
// Secrets the chart rendered (the mount path's, made by the chart) are
// taken as rendered.
func secretsFor(t *testing.T, w *deploy.Workload, rendered deploy.Secrets) deploy.Secrets {
	t.Helper()
	ca, err := framework.NewCA("chart-test")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Issue("knotless-probe")
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := framework.PEMs(cert)
	if err != nil {
		t.Fatal(err)
	}
	s := deploy.Secrets{}
	put := func(name, k string) {
		if v, ok := rendered[name][k]; ok {
			if s[name] == nil {
				s[name] = map[string]string{}
			}
			s[name][k] = v
			return
		}
		if s[name] == nil {
			s[name] = map[string]string{}
		}
		v := "placeholder"
		switch {
		case k == "tls.crt":
			v = string(crt)
		case k == "tls.key":
			v = string(key)
		case strings.HasSuffix(k, "ca.crt"):
			v = string(ca.PEM)
		case k == "user-header":
			v = userHeader
		case k == "group-header":
			v = groupHeader
		case k == "extra-header-prefix":
			v = extraPrefix
		}
		s[name][k] = v
	}
	mounts, err := w.Mounts()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		for _, f := range m.Files {
			put(f.Secret, f.Key)
		}
	}
	for _, e := range w.Container.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			put(e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
		}
	}
	return s
}

// validate parses the workload's arguments with its binary's flags and
// runs the binary's Validate on them, with the mounted files written
// where the flags point.
func validate(t *testing.T, w *deploy.Workload, rendered deploy.Secrets) error {
	t.Helper()
	secrets := secretsFor(t, w, rendered)
	args, err := w.Args(secrets)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mounts, err := w.WriteMounts(dir, secrets)
	if err != nil {
		t.Fatal(err)
	}
	args = deploy.Rebase(args, mounts, dir)
	fs := flag.NewFlagSet(w.Name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var v func() error
	switch {
	case strings.HasSuffix(w.Name, "-provider"):
		o := provideroptions.NewOptions()
		o.AddFlags(fs)
		v = o.Validate
	case strings.HasSuffix(w.Name, "-mountproxy"):
		o := mountproxyoptions.NewOptions()
		o.AddFlags(fs)
		v = o.Validate
	default:
		t.Fatalf("unknown workload %s", w.Name)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%s: the binary does not parse the chart's arguments %q: %v", w.Name, args, err)
	}
	if fs.NArg() > 0 {
		t.Fatalf("%s: arguments left over: %q", w.Name, fs.Args())
	}
	return v()
}

// checkPod: probes on the pod address at the ports the binaries listen
// on, a non-root numeric user, no identity header name in the pod spec.
func checkPod(t *testing.T, w *deploy.Workload) {
	t.Helper()
	c := w.Container
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for _, a := range c.Args {
		name, value, _ := strings.Cut(a, "=")
		if name == "--health-probe-bind-address" || name == "--metrics-bind-address" || name == "--bind-address" {
			port := map[string]string{"--health-probe-bind-address": "health", "--metrics-bind-address": "metrics", "--bind-address": "https"}[name]
			if want := ":" + strconv.Itoa(int(ports[port])); value != want {
				t.Errorf("%s: %s=%s, want %s (every address of the pod, the %s port)", w.Name, name, value, want, port)
			}
		}
	}
	for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.StrVal != "health" {
			t.Errorf("%s: probe %+v is not an HTTP probe of the health port", w.Name, p)
		}
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("%s: readiness probe %s, want /readyz", w.Name, c.ReadinessProbe.HTTPGet.Path)
	}
	sc := w.Deployment.Spec.Template.Spec.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Errorf("%s: pod security context %+v does not run as a non-root user", w.Name, sc)
	}
	for _, a := range c.Args {
		if strings.Contains(a, "X-Knotless-") {
			t.Errorf("%s: an identity header name in the pod spec: %s", w.Name, a)
		}
	}
}

// TestChartArgumentsAreAcceptedByTheBinaries renders the chart with each
// of its ci/ value files and checks that each container's arguments parse
// with its binary's flags and pass its Validate.
func TestChartArgumentsAreAcceptedByTheBinaries(t *testing.T) {
	root := repoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, deploy.Chart, "ci", "*.yaml"))
	if err != nil || len(files) < 3 {
		t.Fatalf("value files: %v %v", files, err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			ws, _, rendered := renderAll(t, root, nil, f)
			if len(ws) == 0 {
				t.Fatal("no Deployment rendered")
			}
			for _, w := range ws {
				checkPod(t, w)
				if err := validate(t, w, rendered); err != nil {
					t.Errorf("%s: the binary refuses the chart's arguments: %v", w.Name, err)
				}
			}
		})
	}
}

// TestChartDefaults: leader election and two replicas of each by default,
// the provider probes this release's mount proxy Service, Vault flags
// only with an address.
func TestChartDefaults(t *testing.T) {
	root := repoRoot(t)
	ws, err := deploy.Render(t.Context(), root, nil, filepath.Join(root, deploy.Chart, "ci", "default-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p, m := ws["knotless-provider"], ws["knotless-mountproxy"]
	if p == nil || m == nil {
		t.Fatalf("Deployments: %v", ws)
	}
	for _, w := range []*deploy.Workload{p, m} {
		if r := w.Deployment.Spec.Replicas; r == nil || *r != 2 {
			t.Errorf("%s: replicas %v, want 2", w.Name, r)
		}
	}
	for _, want := range []string{"--leader-elect=true", "--mountproxy-url=https://knotless-mountproxy.knotless-system.svc:9443", "--mount-url=https://kcp.example.com:8443"} {
		if !slices.Contains(p.Container.Args, want) {
			t.Errorf("provider arguments %q lack %s", p.Container.Args, want)
		}
	}
	for _, a := range p.Container.Args {
		if strings.HasPrefix(a, "--vault-") {
			t.Errorf("a Vault flag without provider.vault.address: %s", a)
		}
	}
	if img := p.Container.Image; img != "knotless-provider:dev" {
		t.Errorf("provider image %s, want knotless-provider:dev (make images)", img)
	}
}

// TestChartBadValues: values the binaries would refuse are refused by
// them (the test above would catch a chart that renders them), and values
// the chart itself refuses fail helm template with a message.
func TestChartBadValues(t *testing.T) {
	root := repoRoot(t)
	base := filepath.Join(root, deploy.Chart, "ci", "default-values.yaml")
	for _, tc := range []struct {
		name     string
		values   map[string]any
		workload string
		want     string
	}{
		{"lease shorter than the renew deadline", map[string]any{"provider": map[string]any{"leaderElection": map[string]any{"leaseDuration": "5s"}}}, "knotless-provider", "--leader-election-lease-duration"},
		{"path prefix without slashes", map[string]any{"mountproxy": map[string]any{"pathPrefix": "tenants"}}, "knotless-mountproxy", "--path-prefix"},
		{"metadata range for tenants", map[string]any{"mountproxy": map[string]any{"allowPrivateNetworks": "169.254.0.0/16"}}, "knotless-mountproxy", "--allow-private-networks"},
		{"plain-http mount proxy", map[string]any{"provider": map[string]any{"mount": map[string]any{"proxyURL": "http://shim:9443"}}}, "knotless-provider", "--mountproxy-url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, err := deploy.Render(t.Context(), root, tc.values, base)
			if err != nil {
				t.Fatal(err)
			}
			err = validate(t, ws[tc.workload], nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want an error naming %s", err, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   string
	}{
		// values.schema.json: a wrong type or an unknown key fails before
		// any template runs.
		{"replicas as a word", map[string]any{"provider": map[string]any{"replicas": "two"}}, "replicas"},
		{"a misspelt key", map[string]any{"mountproxy": map[string]any{"replicass": 2}}, "replicass"},
		{"a port out of range", map[string]any{"mountproxy": map[string]any{"ports": map[string]any{"https": 70000}}}, "https"},
		{"an unknown log encoder", map[string]any{"logging": map[string]any{"encoder": "xml"}}, "encoder"},
		{"replicas without leader election", map[string]any{"provider": map[string]any{"leaderElection": map[string]any{"enabled": false}}}, "needs provider.leaderElection.enabled"},
		{"Vault without credentials", map[string]any{"provider": map[string]any{"vault": map[string]any{"address": "https://vault:8200"}}}, "provider.vault.address needs"},
		{"a namespace as a number", map[string]any{"namespaceOverride": 5}, "namespaceOverride"},
		{"a namespace that is no name", map[string]any{"namespaceOverride": "Knotless_System"}, "namespaceOverride"},
		{"extraEnv as a map", map[string]any{"extraEnv": map[string]any{"A": "b"}}, "extraEnv"},
		{"an env entry without a name", map[string]any{"provider": map[string]any{"extraEnv": []any{map[string]any{"value": "b"}}}}, "name"},
		{"extraVolumes as a string", map[string]any{"extraVolumes": "ca"}, "extraVolumes"},
		{"an unknown strategy", map[string]any{"mountproxy": map[string]any{"strategy": map[string]any{"type": "BlueGreen"}}}, "type"},
		{"a spread constraint without a key", map[string]any{"provider": map[string]any{"topologySpreadConstraints": []any{map[string]any{"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}}}}, "topologyKey"},
		{"a Deployment label that is no string", map[string]any{"provider": map[string]any{"deploymentLabels": map[string]any{"tier": 1}}}, "tier"},
		{"commonLabels as a list", map[string]any{"commonLabels": []any{"a"}}, "commonLabels"},
		{"certManager.enabled as a word", map[string]any{"certManager": map[string]any{"enabled": "yes"}}, "enabled"},
		{"an issuer kind cert-manager has not", map[string]any{"certManager": map[string]any{"issuerRef": map[string]any{"kind": "Vault"}}}, "kind"},
		{"validity in words", map[string]any{"mountPathSecrets": map[string]any{"validityDays": "ten"}}, "validityDays"},
		{"an alert ratio as a word", map[string]any{"metrics": map[string]any{"prometheusRule": map[string]any{"reconcileErrorRatio": "high"}}}, "reconcileErrorRatio"},
		{"an alert ratio above 1", map[string]any{"metrics": map[string]any{"prometheusRule": map[string]any{"mountProxyErrorRatio": 5}}}, "mountProxyErrorRatio"},
		{"a CA named for a generated serving certificate", map[string]any{"mountproxy": map[string]any{"servingCertSecret": map[string]any{"name": ""}}}, "name both or neither"},
		{"a probe certificate named for a generated CA", map[string]any{"mountproxy": map[string]any{"requestHeaderCASecret": map[string]any{"name": ""}}}, "name both or neither"},
		{"no identity header Secret without the mount proxy", map[string]any{"identityHeaders": map[string]any{"secretName": ""}, "mountproxy": map[string]any{"enabled": false}, "provider": map[string]any{"mount": map[string]any{"proxyURL": "https://shim.example.com:9443"}}}, "identityHeaders.secretName"},
		{"no mount proxy CA without the mount proxy", map[string]any{"mountproxy": map[string]any{"enabled": false}, "provider": map[string]any{"mount": map[string]any{"proxyURL": "https://shim.example.com:9443", "caSecret": map[string]any{"name": ""}}}}, "provider.mount.caSecret.name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := deploy.Render(t.Context(), root, tc.values, base)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("helm template: %v, want an error with %q", err, tc.want)
			}
		})
	}
}
