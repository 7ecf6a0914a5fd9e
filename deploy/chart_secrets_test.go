/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package deploy_test

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/knotless-dev/knotless/deploy"
)

// renderAll renders the chart with helm template and returns its
// Deployments, every object and the Secrets it rendered.
func renderAll(t *testing.T, root string, values map[string]any, files ...string) (map[string]*deploy.Workload, []deploy.Object, deploy.Secrets) {
	t.Helper()
	return renderWith(t, root, nil, values, files...)
}

func renderWith(t *testing.T, root string, flags []string, values map[string]any, files ...string) (map[string]*deploy.Workload, []deploy.Object, deploy.Secrets) {
	t.Helper()
	out, err := deploy.Template(t.Context(), root, filepath.Join(root, deploy.Chart), flags, values, files...)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := deploy.Workloads(out)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deploy.Objects(out)
	if err != nil {
		t.Fatal(err)
	}
	secrets, err := deploy.RenderedSecrets(objs)
	if err != nil {
		t.Fatal(err)
	}
	return ws, objs, secrets
}

func ciValues(root, name string) string {
	return filepath.Join(root, deploy.Chart, "ci", name+".yaml")
}

func names(objs []deploy.Object, kind string) []string {
	var out []string
	for _, o := range objs {
		if o.Kind == kind {
			out = append(out, o.Name)
		}
	}
	slices.Sort(out)
	return out
}

func parseCert(t *testing.T, pemData string) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode([]byte(pemData))
	if b == nil {
		t.Fatalf("no PEM block in %q", pemData)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// verify checks that the certificate of Secret name chains to the CA in
// the Secret ca (key ca.crt) for the usage, and returns it.
func verify(t *testing.T, s deploy.Secrets, name, ca string, usage x509.ExtKeyUsage, dnsName string) *x509.Certificate {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(s[ca]["ca.crt"])) {
		t.Fatalf("Secret %s: no CA in ca.crt", ca)
	}
	c := parseCert(t, s[name]["tls.crt"])
	if _, err := c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}, DNSName: dnsName}); err != nil {
		t.Errorf("Secret %s: its certificate does not verify against %s's CA: %v", name, ca, err)
	}
	if !strings.Contains(s[name]["tls.key"], "PRIVATE KEY") {
		t.Errorf("Secret %s: no private key", name)
	}
	return c
}

var generatedSecrets = []string{"knotless-front-proxy-client", "knotless-identity-headers", "knotless-mountproxy-serving", "knotless-probe", "knotless-requestheader-ca"}

// TestChartGeneratesMountPathSecrets: with only the kubeconfigs named, the
// chart renders the mount path's Secrets (header names the shim accepts,
// a serving certificate for the Service, the probe's and kcp-front-proxy's
// client certificates from one requestheader CA), and the Deployments
// mount them; with every Secret named, none. helm template has no
// cluster, so lookup finds nothing and each render makes new ones
// (TestChartKeepsMountPathSecretsOnUpgrade shows the other branch).
func TestChartGeneratesMountPathSecrets(t *testing.T) {
	root := repoRoot(t)
	ws, objs, s := renderAll(t, root, nil, ciValues(root, "generated-values"))
	if got := names(objs, "Secret"); !slices.Equal(got, generatedSecrets) {
		t.Fatalf("Secrets %v, want %v", got, generatedSecrets)
	}
	hex := regexp.MustCompile(`^X-Knotless-[0-9a-f]{16}-(User|Group|Extra-)$`)
	for _, k := range []string{"user-header", "group-header", "extra-header-prefix"} {
		if v := s["knotless-identity-headers"][k]; !hex.MatchString(v) {
			t.Errorf("header name %s = %q, want X-Knotless-<16 hex>-…", k, v)
		}
	}
	verify(t, s, "knotless-mountproxy-serving", "knotless-mountproxy-serving", x509.ExtKeyUsageServerAuth, "knotless-mountproxy.knotless-system.svc")
	for name, cn := range map[string]string{"knotless-probe": "knotless-probe", "knotless-front-proxy-client": "kcp-front-proxy"} {
		if c := verify(t, s, name, "knotless-requestheader-ca", x509.ExtKeyUsageClientAuth, ""); c.Subject.CommonName != cn {
			t.Errorf("Secret %s: CN %s, want %s", name, c.Subject.CommonName, cn)
		}
	}
	if s["knotless-mountproxy-serving"]["ca.crt"] == s["knotless-requestheader-ca"]["ca.crt"] {
		t.Error("one CA for the serving and the client certificates")
	}
	for _, w := range ws {
		mounts, err := w.Mounts()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mounts {
			for _, f := range m.Files {
				if _, ok := s[f.Secret][f.Key]; !ok && !strings.HasSuffix(f.Secret, "-kubeconfig") {
					t.Errorf("%s mounts %s/%s, which the chart did not make", w.Name, f.Secret, f.Key)
				}
			}
		}
	}
	_, _, again := renderAll(t, root, nil, ciValues(root, "generated-values"))
	if again["knotless-identity-headers"]["user-header"] == s["knotless-identity-headers"]["user-header"] {
		t.Error("two helm template runs made the same header name: not random")
	}
	if _, objs, _ := renderAll(t, root, nil, ciValues(root, "default-values")); len(names(objs, "Secret")) > 0 {
		t.Errorf("Secrets rendered although every one is named: %v", names(objs, "Secret"))
	}
}

// fakeAPIServer answers what helm's lookup asks (the v1 resources, and
// GET of a Secret) from a map, as an API server would.
type fakeAPIServer struct {
	mu      sync.Mutex
	secrets map[string]*corev1.Secret
}

func (f *fakeAPIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == "/api/v1" {
		_ = json.NewEncoder(w).Encode(&metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"}, GroupVersion: "v1",
			APIResources: []metav1.APIResource{{Name: "secrets", Namespaced: true, Kind: "Secret", Verbs: []string{"get", "list"}}}})
		return
	}
	ns, name, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/api/v1/namespaces/"), "/secrets/")
	f.mu.Lock()
	s := f.secrets[ns+"/"+name]
	f.mu.Unlock()
	if r.Method != http.MethodGet || !ok || s == nil {
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(&metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound})
		return
	}
	_ = json.NewEncoder(w).Encode(s)
}

func (f *fakeAPIServer) store(t *testing.T, objs []deploy.Object) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, o := range objs {
		if o.Kind != "Secret" {
			continue
		}
		s := &corev1.Secret{}
		if err := yaml.Unmarshal(o.Doc, s); err != nil {
			t.Fatal(err)
		}
		s.APIVersion, s.Kind = "v1", "Secret"
		f.secrets[s.Namespace+"/"+s.Name] = s
	}
}

// TestChartKeepsMountPathSecretsOnUpgrade renders with helm template
// --dry-run=server, with which helm's lookup asks an API server: here one
// that serves the Secrets of the first render. The second render (an
// upgrade) keeps every Secret's data; a deleted client certificate is made
// again from the kept CA. This is helm's own lookup over HTTP against a
// stand-in API server; e2e TestChartKeepsSecretsOnUpgradeInKCP does the
// same against kcp.
func TestChartKeepsMountPathSecretsOnUpgrade(t *testing.T) {
	root := repoRoot(t)
	api := &fakeAPIServer{secrets: map[string]*corev1.Secret{}}
	srv := httptest.NewServer(api)
	defer srv.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+srv.URL+`"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--dry-run=server", "--kubeconfig", kubeconfig}
	values := ciValues(root, "generated-values")
	_, objs, first := renderWith(t, root, flags, nil, values)
	if got := names(objs, "Secret"); !slices.Equal(got, generatedSecrets) {
		t.Fatalf("Secrets %v, want %v", got, generatedSecrets)
	}
	api.store(t, objs)
	_, _, second := renderWith(t, root, flags, nil, values)
	for _, name := range generatedSecrets {
		for k, v := range first[name] {
			if second[name][k] != v {
				t.Errorf("upgrade: Secret %s key %s changed", name, k)
			}
		}
	}

	api.mu.Lock()
	delete(api.secrets, "knotless-system/knotless-probe")
	api.mu.Unlock()
	_, _, third := renderWith(t, root, flags, nil, values)
	if third["knotless-probe"]["tls.crt"] == first["knotless-probe"]["tls.crt"] {
		t.Error("the deleted probe certificate was not made again")
	}
	verify(t, third, "knotless-probe", "knotless-requestheader-ca", x509.ExtKeyUsageClientAuth, "")
	if third["knotless-requestheader-ca"]["ca.crt"] != first["knotless-requestheader-ca"]["ca.crt"] {
		t.Error("the requestheader CA changed when a client certificate was made again")
	}
}

// TestChartCertManager: with certManager.enabled, Certificates (and the
// chart's own CA issuer) instead of made certificates; the header names
// are still made (they are no certificates) unless named.
func TestChartCertManager(t *testing.T) {
	root := repoRoot(t)
	ws, objs, _ := renderAll(t, root, nil, ciValues(root, "cert-manager-values"))
	wantCerts := []string{"knotless-ca", "knotless-front-proxy-client", "knotless-mountproxy-serving", "knotless-probe"}
	if got := names(objs, "Certificate"); !slices.Equal(got, wantCerts) {
		t.Errorf("Certificates %v, want %v", got, wantCerts)
	}
	if got := names(objs, "Issuer"); !slices.Equal(got, []string{"knotless-ca", "knotless-selfsigned"}) {
		t.Errorf("Issuers %v", got)
	}
	for name, issuer := range certIssuers(t, objs) {
		if name != "knotless-ca" && issuer != "Issuer/knotless-ca" {
			t.Errorf("Certificate %s issued by %s, want the chart's Issuer/knotless-ca", name, issuer)
		}
	}
	if got := names(objs, "Secret"); !slices.Equal(got, []string{"knotless-identity-headers"}) {
		t.Errorf("Secrets %v, want only the header names", got)
	}
	want := map[string][]string{
		"knotless-mountproxy": {"knotless-mountproxy-serving/tls.crt", "knotless-probe/ca.crt"},
		"knotless-provider":   {"knotless-mountproxy-serving/ca.crt", "knotless-probe/tls.key"},
	}
	for name, files := range want {
		mounts, err := ws[name].Mounts()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range mounts {
			for _, f := range m.Files {
				got = append(got, f.Secret+"/"+f.Key)
			}
		}
		for _, f := range files {
			if !slices.Contains(got, f) {
				t.Errorf("%s mounts %v, not %s", name, got, f)
			}
		}
	}
	if _, objs, _ := renderAll(t, root, nil, ciValues(root, "generated-values")); len(names(objs, "Certificate")) > 0 {
		t.Error("Certificates without certManager.enabled")
	}
}

// certIssuers maps each rendered Certificate to its issuerRef as
// "kind/name".
func certIssuers(t *testing.T, objs []deploy.Object) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, o := range objs {
		if o.Kind != "Certificate" {
			continue
		}
		var c struct {
			Spec struct {
				IssuerRef struct{ Name, Kind string } `json:"issuerRef"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(o.Doc, &c); err != nil {
			t.Fatalf("Certificate %s: %v", o.Name, err)
		}
		out[o.Name] = c.Spec.IssuerRef.Kind + "/" + c.Spec.IssuerRef.Name
	}
	return out
}

// TestChartCertManagerIssuerRef: certManager.issuerRef (often a shared
// ClusterIssuer) issues the serving certificate only. The client
// certificates (CN kcp-front-proxy, knotless-probe) and so the mount
// proxy's requestheader CA always come from the chart's own namespaced CA:
// whoever may request from a shared issuer must not be able to mint a
// kcp-front-proxy certificate the mount proxy takes identity headers from.
func TestChartCertManagerIssuerRef(t *testing.T) {
	root := repoRoot(t)
	corp := map[string]any{"name": "corp-ca", "kind": "ClusterIssuer"}
	ws, objs, _ := renderAll(t, root, map[string]any{
		"identityHeaders": map[string]any{"secretName": "headers"},
		"certManager":     map[string]any{"issuerRef": corp},
	}, ciValues(root, "cert-manager-values"))
	if got := names(objs, "Secret"); len(got) > 0 {
		t.Errorf("Secrets %v with cert-manager and named header names", got)
	}
	if got := names(objs, "Issuer"); !slices.Equal(got, []string{"knotless-ca", "knotless-selfsigned"}) {
		t.Errorf("Issuers %v with an issuerRef, want the chart's own CA issuer for the client certificates", got)
	}
	want := map[string]string{
		"knotless-ca":                 "Issuer/knotless-selfsigned",
		"knotless-front-proxy-client": "Issuer/knotless-ca",
		"knotless-probe":              "Issuer/knotless-ca",
		"knotless-mountproxy-serving": "ClusterIssuer/corp-ca",
	}
	if got := certIssuers(t, objs); !maps.Equal(got, want) {
		t.Errorf("Certificate issuers %v, want %v", got, want)
	}
	mounts, err := ws["knotless-mountproxy"].Mounts()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(mounts, func(m deploy.Mount) bool {
		return slices.ContainsFunc(m.Files, func(f deploy.File) bool { return f.Secret == "knotless-probe" && f.Key == "ca.crt" })
	}) {
		t.Errorf("mount proxy mounts %v, not the chart CA's knotless-probe/ca.crt as requestheader CA", mounts)
	}
	// Client certificates brought by the operator: no chart CA is needed.
	_, objs, _ = renderAll(t, root, map[string]any{
		"certManager": map[string]any{"issuerRef": corp},
		"mountproxy":  map[string]any{"requestHeaderCASecret": map[string]any{"name": "rh-ca"}},
		"provider":    map[string]any{"mount": map[string]any{"probeCertSecret": map[string]any{"name": "probe"}}},
	}, ciValues(root, "cert-manager-values"))
	if got := names(objs, "Issuer"); len(got) > 0 {
		t.Errorf("Issuers %v with an issuerRef and brought client certificates", got)
	}
	want = map[string]string{"knotless-mountproxy-serving": "ClusterIssuer/corp-ca"}
	if got := certIssuers(t, objs); !maps.Equal(got, want) {
		t.Errorf("Certificate issuers %v, want %v", got, want)
	}
}

// TestChartNamespaceOverride: every object goes to namespaceOverride,
// and the provider probes the mount proxy there.
func TestChartNamespaceOverride(t *testing.T) {
	root := repoRoot(t)
	for _, f := range []string{"full-values", "generated-values", "cert-manager-values"} {
		ws, objs, _ := renderAll(t, root, map[string]any{"namespaceOverride": "elsewhere"}, ciValues(root, f))
		for _, o := range objs {
			if o.Namespace != "elsewhere" {
				t.Errorf("%s: %s %s in namespace %q, want elsewhere", f, o.Kind, o.Name, o.Namespace)
			}
		}
		if p := ws["knotless-provider"]; p != nil && !slices.ContainsFunc(p.Container.Args, func(a string) bool {
			return strings.HasPrefix(a, "--mountproxy-url=https://knotless-mountproxy.elsewhere.svc:")
		}) && f != "full-values" {
			t.Errorf("%s: provider arguments %q do not name the mount proxy in elsewhere", f, p.Container.Args)
		}
	}
	_, objs, s := renderAll(t, root, map[string]any{"namespaceOverride": "elsewhere"}, ciValues(root, "generated-values"))
	verify(t, s, "knotless-mountproxy-serving", "knotless-mountproxy-serving", x509.ExtKeyUsageServerAuth, "knotless-mountproxy.elsewhere.svc")
	if len(objs) == 0 {
		t.Fatal("nothing rendered")
	}
}

// TestChartPodOptions: extraEnv and extraVolumes (global and per
// component) reach both Deployments, with strategy, topology spread
// (with the component's labels), Deployment labels and annotations; the
// default anti-affinity only with two or more replicas and no affinity.
func TestChartPodOptions(t *testing.T) {
	root := repoRoot(t)
	ws, objs, _ := renderAll(t, root, nil, ciValues(root, "full-values"))
	for _, name := range []string{"knotless-provider", "knotless-mountproxy"} {
		w := ws[name]
		if w == nil {
			t.Fatalf("no %s", name)
		}
		if !slices.ContainsFunc(w.Container.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMEMLIMIT" && e.Value == "900MiB" }) {
			t.Errorf("%s: env %v lacks extraEnv GOMEMLIMIT", name, w.Container.Env)
		}
		if !slices.ContainsFunc(w.Deployment.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "corp-ca" }) ||
			!slices.ContainsFunc(w.Container.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "corp-ca" && m.MountPath == "/etc/corp-ca" }) {
			t.Errorf("%s: no extraVolumes corp-ca volume and mount", name)
		}
		if w.Deployment.Labels["team"] != "platform" || w.Deployment.Spec.Template.Labels["team"] != "platform" {
			t.Errorf("%s: commonLabels missing", name)
		}
		if w.Deployment.Spec.Selector.MatchLabels["team"] != "" {
			t.Errorf("%s: commonLabels in the selector (immutable)", name)
		}
	}
	p, m := ws["knotless-provider"], ws["knotless-mountproxy"]
	if !slices.ContainsFunc(p.Container.Env, func(e corev1.EnvVar) bool { return e.Name == "GODEBUG" }) {
		t.Errorf("provider env %v lacks provider.extraEnv", p.Container.Env)
	}
	if slices.ContainsFunc(m.Container.Env, func(e corev1.EnvVar) bool { return e.Name == "GODEBUG" }) {
		t.Error("provider.extraEnv in the mount proxy")
	}
	if p.Deployment.Labels["tier"] != "control" || p.Deployment.Annotations["example.com/owner"] != "platform" {
		t.Errorf("provider Deployment labels %v annotations %v", p.Deployment.Labels, p.Deployment.Annotations)
	}
	if st := p.Deployment.Spec.Strategy; st.RollingUpdate == nil || st.RollingUpdate.MaxUnavailable.IntValue() != 0 || st.RollingUpdate.MaxSurge.IntValue() != 1 {
		t.Errorf("provider strategy %+v", st)
	}
	tsc := p.Deployment.Spec.Template.Spec.TopologySpreadConstraints
	if len(tsc) != 1 || tsc[0].LabelSelector == nil || tsc[0].LabelSelector.MatchLabels["app.kubernetes.io/name"] != "knotless-provider" {
		t.Errorf("provider topology spread %+v, want the component's labels as selector", tsc)
	}
	if a := m.Deployment.Spec.Template.Spec.Affinity; a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 ||
		len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 0 {
		t.Errorf("mountproxy.affinity not used as given: %+v", a)
	}
	for _, o := range objs {
		if o.Kind != "Deployment" && !strings.Contains(string(o.Doc), "team: platform") {
			t.Errorf("%s %s has no commonLabels", o.Kind, o.Name)
		}
	}

	// The default anti-affinity: preferred, by host, between the
	// component's pods, for 2 or more replicas.
	ws, _, _ = renderAll(t, root, map[string]any{"provider": map[string]any{"replicas": 1, "leaderElection": map[string]any{"enabled": false}}}, ciValues(root, "default-values"))
	if a := ws["knotless-provider"].Deployment.Spec.Template.Spec.Affinity; a != nil {
		t.Errorf("one provider replica has affinity %+v", a)
	}
	a := ws["knotless-mountproxy"].Deployment.Spec.Template.Spec.Affinity
	if a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 || a.PodAffinity != nil || a.NodeAffinity != nil {
		t.Fatalf("two mount proxy replicas: affinity %+v, want one preferred anti-affinity", a)
	}
	term := a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm
	if term.TopologyKey != "kubernetes.io/hostname" || term.LabelSelector.MatchLabels["app.kubernetes.io/name"] != "knotless-mountproxy" ||
		term.LabelSelector.MatchLabels["app.kubernetes.io/instance"] != "knotless" {
		t.Errorf("anti-affinity term %+v", term)
	}
}

// metricSources returns the string literals of each non-test Go file of
// the repository and of controller-runtime (whose metrics the provider
// serves).
func metricSources(t *testing.T, root string) [][]string {
	t.Helper()
	dirs := []string{root}
	out, err := exec.CommandContext(t.Context(), "go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/controller-runtime").Output()
	if err != nil {
		t.Fatalf("go list controller-runtime: %v", err)
	}
	dirs = append(dirs, strings.TrimSpace(string(out)))
	lit := regexp.MustCompile(`"([a-z_][a-z0-9_]*)"`)
	var files [][]string
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if e.IsDir() && (e.Name() == "bin" || e.Name() == "hack" || strings.HasPrefix(e.Name(), ".")) {
				return filepath.SkipDir
			}
			if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			var ls []string
			for _, m := range lit.FindAllStringSubmatch(string(b), -1) {
				ls = append(ls, m[1])
			}
			files = append(files, ls)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return files
}

// exported: name is a string literal of one file, or made of two or three
// of its literals as prometheus does (a prefix ending in _ and a name, or
// Namespace, Subsystem and Name joined by _).
func exported(name string, files [][]string) bool {
	for _, ls := range files {
		has := func(s string) bool { return s != "" && slices.Contains(ls, s) }
		if has(name) {
			return true
		}
		for i := 1; i < len(name); i++ {
			if name[i-1] == '_' && has(name[:i]) && has(name[i:]) {
				return true
			}
			if name[i] != '_' {
				continue
			}
			for j := i + 1; j < len(name); j++ {
				if name[j] == '_' && has(name[:i]) && has(name[i+1:j]) && has(name[j+1:]) {
					return true
				}
			}
		}
	}
	return false
}

// TestChartPrometheusRule: the PrometheusRule is valid YAML of its kind,
// every alert has a duration, a severity and a summary, and every metric
// its expressions select is one the code exports (or Prometheus's up).
func TestChartPrometheusRule(t *testing.T) {
	root := repoRoot(t)
	_, objs, _ := renderAll(t, root, map[string]any{"provider": map[string]any{"vault": map[string]any{"address": "https://vault:8200", "tokenSecret": map[string]any{"name": "t"}}}}, ciValues(root, "full-values"))
	var rule struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ObjectMeta `json:"metadata"`
		Spec       struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Alert       string            `json:"alert"`
					Expr        string            `json:"expr"`
					For         string            `json:"for,omitempty"`
					Labels      map[string]string `json:"labels"`
					Annotations map[string]string `json:"annotations"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	found := 0
	for _, o := range objs {
		if o.Kind == "PrometheusRule" {
			found++
			if err := yaml.UnmarshalStrict(o.Doc, &rule); err != nil {
				t.Fatalf("PrometheusRule: %v\n%s", err, o.Doc)
			}
		}
	}
	if found != 1 || rule.APIVersion != "monitoring.coreos.com/v1" {
		t.Fatalf("%d PrometheusRules (%s), want 1", found, rule.APIVersion)
	}
	files := metricSources(t, root)
	selector := regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\{`)
	alerts := 0
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			alerts++
			if r.Alert == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("rule %+v lacks a name, severity or summary", r)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
				}
			}
			ms := selector.FindAllStringSubmatch(r.Expr, -1)
			if len(ms) == 0 {
				t.Errorf("%s: no metric in %q", r.Alert, r.Expr)
			}
			for _, m := range ms {
				name := regexp.MustCompile(`_(bucket|count|sum)$`).ReplaceAllString(m[1], "")
				if name != "up" && !exported(name, files) {
					t.Errorf("%s: %s is not a metric the code exports", r.Alert, m[1])
				}
			}
		}
	}
	if alerts < 10 {
		t.Errorf("%d alerts", alerts)
	}
	if exported("knotless_no_such_metric_total", files) {
		t.Error("the check accepts a metric nobody exports")
	}
	if _, objs, _ := renderAll(t, root, nil, ciValues(root, "default-values")); len(names(objs, "PrometheusRule")) > 0 {
		t.Error("a PrometheusRule by default")
	}
}

// TestChartGuests: with provider.guests.kcpServer, the provider serves
// the GuestIdentityGrant webhook behind a Service of its own, with a
// serving certificate the chart makes for that Service (its CA in the
// same Secret, which the provider hands kcp), and the binary accepts the
// arguments; without kcpServer nothing of it is rendered; kcpServer
// without the CA that verifies it fails.
func TestChartGuests(t *testing.T) {
	root := repoRoot(t)
	guests := map[string]any{"provider": map[string]any{"guests": map[string]any{"kcpServer": "https://kcp.example.com:8443", "kcpCASecret": map[string]any{"name": "fp-ca"}}}}
	ws, objs, s := renderAll(t, root, guests, ciValues(root, "default-values"))
	if !slices.Contains(names(objs, "Service"), "knotless-provider-webhook") {
		t.Errorf("Services %v lack knotless-provider-webhook", names(objs, "Service"))
	}
	if got := names(objs, "Secret"); !slices.Equal(got, []string{"knotless-provider-webhook"}) {
		t.Errorf("Secrets %v, want the webhook's only", got)
	}
	verify(t, s, "knotless-provider-webhook", "knotless-provider-webhook", x509.ExtKeyUsageServerAuth, "knotless-provider-webhook.knotless-system.svc")
	p := ws["knotless-provider"]
	for _, want := range []string{"--guest-kcp-server=https://kcp.example.com:8443", "--admission-webhook-url=https://knotless-provider-webhook.knotless-system.svc:443", "--admission-webhook-bind-address=:9443"} {
		if !slices.Contains(p.Container.Args, want) {
			t.Errorf("provider arguments %q lack %s", p.Container.Args, want)
		}
	}
	if err := validate(t, p, s); err != nil {
		t.Errorf("the provider refuses the chart's guest arguments: %v", err)
	}
	if _, objs, _ := renderAll(t, root, nil, ciValues(root, "default-values")); slices.Contains(names(objs, "Service"), "knotless-provider-webhook") {
		t.Error("a webhook Service without provider.guests.kcpServer")
	}
	noCA := map[string]any{"provider": map[string]any{"guests": map[string]any{"kcpServer": "https://kcp.example.com:8443"}}}
	if _, err := deploy.Render(t.Context(), root, noCA, ciValues(root, "default-values")); err == nil || !strings.Contains(err.Error(), "provider.guests.kcpCASecret.name") {
		t.Errorf("kcpServer without its CA: %v", err)
	}
	plain := map[string]any{"provider": map[string]any{"guests": map[string]any{"kcpServer": "http://kcp.example.com:8080", "kcpCASecret": map[string]any{"name": "fp-ca"}}}}
	if _, err := deploy.Render(t.Context(), root, plain, ciValues(root, "default-values")); err == nil {
		t.Error("a plain-http kcpServer was rendered")
	}
}

// TestChartGateways: provider.gateways.caSecret mounts the Secret's CA
// bundle and passes it as --gateway-ca-file; without it, neither.
func TestChartGateways(t *testing.T) {
	root := repoRoot(t)
	with := map[string]any{"provider": map[string]any{"gateways": map[string]any{"caSecret": map[string]any{"name": "gw-ca", "key": "bundle.pem"}}}}
	ws, _, _ := renderAll(t, root, with, ciValues(root, "default-values"))
	p := ws["knotless-provider"]
	if !slices.Contains(p.Container.Args, "--gateway-ca-file=/etc/knotless/gateway-ca/ca.crt") {
		t.Errorf("provider arguments %q lack --gateway-ca-file", p.Container.Args)
	}
	if !slices.ContainsFunc(p.Deployment.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
		return v.Name == "gateway-ca" && v.Secret != nil && v.Secret.SecretName == "gw-ca" && len(v.Secret.Items) == 1 && v.Secret.Items[0].Key == "bundle.pem"
	}) || !slices.ContainsFunc(p.Container.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == "gateway-ca" && m.MountPath == "/etc/knotless/gateway-ca"
	}) {
		t.Errorf("no gateway-ca volume of Secret gw-ca and its mount: %+v", p.Deployment.Spec.Template.Spec.Volumes)
	}
	ws, _, _ = renderAll(t, root, nil, ciValues(root, "default-values"))
	if slices.ContainsFunc(ws["knotless-provider"].Container.Args, func(a string) bool { return strings.HasPrefix(a, "--gateway-ca-file") }) {
		t.Error("--gateway-ca-file without provider.gateways.caSecret")
	}
}
