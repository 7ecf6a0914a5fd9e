package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/deploy"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/mountproxy"
)

// installed is what TestContainerImages installs: the chart and the tag
// of its images.
type installed struct{ chart, tag string }

// install returns the chart and images to test, and skips the test when
// docker or the images are missing, unless KNOTLESS_E2E_IMAGES=required
// (CI), where that fails it. Without KNOTLESS_E2E_DIST those are the
// chart of the work tree and the images make images tags dev. With
// KNOTLESS_E2E_DIST=<dist>/<version> (CI, after make release) they come
// from the release only, as a new operator gets them: its SHA256SUMS are
// checked, the images' tags are removed and loaded again from the saved
// tarballs, and the chart is the packaged one (its default tag is the
// version). With KNOTLESS_E2E_DIST_BUILD=<file> too, the release is still
// being built (CI builds it beside the suite): awaitRelease waits for it.
func install(t *testing.T, root string) installed {
	t.Helper()
	required := os.Getenv("KNOTLESS_E2E_IMAGES") == "required"
	skip := func(format string, args ...any) {
		t.Helper()
		if required {
			t.Fatalf(format+" (KNOTLESS_E2E_IMAGES=required)", args...)
		}
		t.Skipf(format, args...)
	}
	if out, err := exec.CommandContext(t.Context(), "docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		skip("docker is unavailable, so the images are not run: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if _, err := deploy.Helm(root); err != nil {
		skip("the chart cannot be rendered: %v", err)
	}
	in := installed{chart: filepath.Join(root, deploy.Chart), tag: "dev"}
	if dist := os.Getenv("KNOTLESS_E2E_DIST"); dist != "" {
		awaitRelease(t, os.Getenv("KNOTLESS_E2E_DIST_BUILD"))
		in = fromRelease(t, dist)
	}
	commit := strings.TrimPrefix(framework.LDFlags(t.Context(), root), "-X github.com/knotless-dev/knotless/cmd/internal/buildinfo.Commit=")
	for _, name := range []string{"knotless-provider", "knotless-mountproxy"} {
		out, err := exec.CommandContext(t.Context(), "docker", "image", "inspect", "-f", `{{index .Config.Labels "org.opencontainers.image.revision"}}`, name+":"+in.tag).Output()
		if err != nil {
			skip("no image %s:%s: build it with make images", name, in.tag)
		}
		if got := strings.TrimSpace(string(out)); got != commit {
			t.Logf("image %s:%s was built from %s, the work tree is %s (make images builds it again)", name, in.tag, got, commit)
		}
	}
	return in
}

// fromRelease checks and loads the release in dir (make release's
// dist/<version>).
// awaitRelease waits until the build of the release that status names
// has ended (nothing to wait for when status is empty): .ci/run builds it
// in the background and writes status, "<exit code> <seconds> ..." (the
// step's CPU seconds and the machine's busy percent follow), when the
// build ends; a failed build fails the test with its log's name.
func awaitRelease(t *testing.T, status string) {
	t.Helper()
	if status == "" {
		return
	}
	begin := time.Now()
	for {
		b, err := os.ReadFile(status)
		if err == nil && len(strings.Fields(string(b))) >= 2 {
			rc, secs := strings.Fields(string(b))[0], strings.Fields(string(b))[1]
			if rc != "0" {
				t.Fatalf("the release's build failed (exit %s after %ss); its log is beside %s", rc, secs, status)
			}
			t.Logf("FIGURE waited for the release's build: %s (it took %ss)", time.Since(begin).Round(time.Second), secs)
			return
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("the release's build did not end (no %s)", status)
		case <-time.After(2 * time.Second):
		}
	}
}

func fromRelease(t *testing.T, dir string) installed {
	t.Helper()
	version := filepath.Base(dir)
	check := exec.CommandContext(t.Context(), "sha256sum", "--check", "--strict", "SHA256SUMS")
	check.Dir = dir
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("release %s: sha256sum --check: %v: %s", dir, err, out)
	}
	for _, name := range []string{"knotless-provider", "knotless-mountproxy"} {
		_ = exec.CommandContext(t.Context(), "docker", "rmi", name+":"+version).Run()
		if out, err := exec.CommandContext(t.Context(), "docker", "load", "-i", filepath.Join(dir, name+"-"+version+".image.tar.gz")).CombinedOutput(); err != nil {
			t.Fatalf("docker load of the release's %s: %v: %s", name, err, out)
		}
	}
	// The kubectl plugin runs from its tarball and says its version.
	plugin := t.TempDir()
	if out, err := exec.CommandContext(t.Context(), "tar", "-xzf", filepath.Join(dir, "kubectl-knotless-"+version+"-linux-amd64.tar.gz"), "-C", plugin).CombinedOutput(); err != nil {
		t.Fatalf("the release's kubectl-knotless tarball: %v: %s", err, out)
	}
	if out, err := exec.CommandContext(t.Context(), filepath.Join(plugin, "kubectl-knotless-"+version, "kubectl-knotless"), "version").CombinedOutput(); err != nil ||
		!strings.HasPrefix(string(out), "kubectl-knotless "+version+" (") {
		t.Errorf("the release's kubectl-knotless version: %q, %v", out, err)
	}
	nodeImageOfRelease(t, dir, version)
	t.Logf("installing release %s from %s only (its chart and saved images)", version, dir)
	return installed{chart: filepath.Join(dir, "knotless-"+version+".tgz"), tag: version}
}

// nodeImageOfRelease checks, when the release in dir has the kind
// driver's node image, that the agent's tarball carries a kind that runs
// and that its INSTALL names the tag the saved node image holds.
func nodeImageOfRelease(t *testing.T, dir, version string) {
	t.Helper()
	saved := filepath.Join(dir, "knotless-node-"+version+".image.tar.gz")
	if _, err := os.Stat(saved); err != nil {
		t.Logf("release %s has no node image (KNOTLESS_RELEASE_NODE_IMAGE=0)", version)
		return
	}
	agent := t.TempDir()
	if out, err := exec.CommandContext(t.Context(), "tar", "-xzf", filepath.Join(dir, "knotless-agent-"+version+"-linux-amd64.tar.gz"), "-C", agent).CombinedOutput(); err != nil {
		t.Fatalf("the release's agent tarball: %v: %s", err, out)
	}
	pkg := filepath.Join(agent, "knotless-agent-"+version)
	if out, err := exec.CommandContext(t.Context(), filepath.Join(pkg, "bin", "kind"), "version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "kind v") {
		t.Errorf("the agent tarball's kind: %q, %v", out, err)
	}
	_, tag, _ := strings.Cut(readFile(t, filepath.Join(pkg, "INSTALL")), "--node-image=")
	tag, _, _ = strings.Cut(tag, " ")
	manifest, err := exec.CommandContext(t.Context(), "tar", "-xzOf", saved, "manifest.json").Output()
	if err != nil || tag == "" || !strings.Contains(string(manifest), `"`+tag+`"`) {
		t.Errorf("the agent's INSTALL names node image %q; the saved node image's manifest: %.300s (%v)", tag, manifest, err)
	}
}

// argValue returns the value of --name in args (the suite's flags).
func argValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// flatKubeconfig returns the suite's admin kubeconfig with every file it
// names embedded, for a container that has only the one file.
func flatKubeconfig(t *testing.T, path string) string {
	t.Helper()
	raw, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := clientcmdapi.FlattenConfig(raw); err != nil {
		t.Fatal(err)
	}
	b, err := clientcmd.Write(*raw)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// container is a knotless image run with docker as the chart's pod would
// run it.
type container struct {
	name       string
	healthPort int
	metricPort int
	logs       *framework.Process
}

// runWorkload runs the workload's image with docker (--network host) with
// the arguments and environment the chart renders, its Secret files
// bind-mounted read-only where the chart mounts them, the pod's user,
// a read-only root file system and no capabilities; docker rm -f at the
// end of the test. Its log goes to the suite's artifacts (docker logs -f,
// a process of the suite, so failures print its tail).
func runWorkload(t *testing.T, w *deploy.Workload, replica string, secrets deploy.Secrets, healthPort, metricPort int) *container {
	t.Helper()
	ctx := t.Context()
	args, err := w.Args(secrets)
	if err != nil {
		t.Fatal(err)
	}
	vars, err := w.Env(secrets)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(env.dir, "containers", w.Name+replica)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	mounts, err := w.WriteMounts(dir, secrets)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("knotless-e2e-%s-%s%s", env.prefix, w.Name, replica)
	_ = exec.Command("docker", "rm", "-f", name).Run()
	run := []string{"run", "-d", "--name", name, "--network", "host", "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"}
	if sc := w.Deployment.Spec.Template.Spec.SecurityContext; sc != nil && sc.RunAsUser != nil {
		group := *sc.RunAsUser
		if sc.RunAsGroup != nil {
			group = *sc.RunAsGroup
		}
		run = append(run, "--user", fmt.Sprintf("%d:%d", *sc.RunAsUser, group))
	}
	for _, m := range mounts {
		run = append(run, "-v", filepath.Join(dir, m.Dir)+":"+m.Dir+":ro")
	}
	keys := make([]string, 0, len(vars))
	for k := range vars {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		run = append(run, "-e", k+"="+vars[k])
	}
	image := w.Container.Image
	run = append(append(run, image), args...)
	t.Cleanup(func() {
		if out, err := exec.Command("docker", "rm", "-f", name).CombinedOutput(); err != nil {
			t.Logf("docker rm -f %s: %v: %s", name, err, out)
		}
	})
	if out, err := exec.CommandContext(ctx, "docker", run...).CombinedOutput(); err != nil {
		t.Fatalf("docker run %s: %v: %s", image, err, out)
	}
	logs, err := framework.Start(env.dir, "container-"+w.Name+replica, "docker", []string{"logs", "-f", name}, nil)
	if err != nil {
		t.Fatal(err)
	}
	env.group.Add(logs)
	c := &container{name: name, healthPort: healthPort, metricPort: metricPort, logs: logs}
	t.Logf("%s: docker run --network host %s with %d arguments from the chart (log %s)", w.Name, image, len(args), logs.LogPath)
	return c
}

// waitReady waits until the container answers /readyz with 200.
func (c *container) waitReady(ctx context.Context, t *testing.T, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if err := framework.Eventually(ctx, timeout, c.name+" to be ready", func(ctx context.Context) (bool, string, error) {
		out, _ := exec.CommandContext(ctx, "docker", "inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}", c.name).Output()
		if state := strings.TrimSpace(string(out)); strings.HasPrefix(state, "false") {
			return false, "", fmt.Errorf("%s exited (%s):\n%s", c.name, state, c.logs.Tail(20))
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", c.healthPort))
		if err != nil {
			return false, err.Error(), nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status, nil
	}); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

func (c *container) metrics(t *testing.T) string {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", c.metricPort))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestContainerImages runs knotless-provider and knotless-mountproxy from
// their images (docker run --network host) with the arguments the Helm
// chart renders for the suite's kcp, PDS, Vault, kcp-front-proxy and
// certificates, in place of the suite's own processes, and runs an
// Application and a mount through them: an AtprotoRecord reaches the PDS
// with the app password from Vault, and alice lists a tenant's namespaces
// through kcp-front-proxy and the containerized shim.
func TestContainerImages(t *testing.T) {
	runLast(t)
	defer failWithLogs(t)
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	rel := install(t, repo)
	if env.frontProxy == nil || env.vault == nil || env.mountProxy == nil || env.mountProxy.Process == nil {
		t.Skip("the container test runs in the topology the suite starts (kcp-front-proxy, Vault, the mount proxy)")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()

	// The values a kcp operator would give the chart, here pointing at
	// the suite's processes; Secret names as docs/install.md makes them.
	main, shim := env.provider, env.mountProxy
	shimPort, err := strconv.Atoi(shim.Addr[strings.LastIndexByte(shim.Addr, ':')+1:])
	if err != nil {
		t.Fatal(err)
	}
	m := env.certs
	ports := map[string]int{"provider-health": freePort(t), "provider-metrics": freePort(t), "shim-health": freePort(t), "shim-metrics": freePort(t)}
	values := map[string]any{
		"workspace":       env.providerWS.String(),
		"identityHeaders": map[string]any{"secretName": "identity-headers"},
		"logging":         map[string]any{"level": "info", "encoder": "console"},
		"provider": map[string]any{
			"replicas":              1,
			"kubeconfigSecret":      map[string]any{"name": "provider-kubeconfig"},
			"leaderElection":        map[string]any{"id": "knotless-provider-" + env.prefix},
			"plcURL":                env.plc.URL,
			"allowPrivateNetworks":  framework.AllowedNetworks,
			"firehoseMetricSources": strings.TrimPrefix(env.pds.URL, "http://"),
			"atproto":               map[string]any{"resync": "3s"},
			"watchFlushInterval":    "1s",
			"vault": map[string]any{
				"address": env.vault.Addr,
				"appRole": map[string]any{"roleID": argValue(main.Args, "--vault-approle-role-id"), "secretIDSecret": map[string]any{"name": "vault-secret-id"}},
			},
			"mount": map[string]any{
				"url": env.frontProxy.URL, "proxyURL": "https://" + shim.Addr, "probeInterval": "2s",
				"caSecret": map[string]any{"name": "shim-serving-ca"}, "probeCertSecret": map[string]any{"name": "probe-cert"},
			},
			"ports": map[string]any{"health": ports["provider-health"], "metrics": ports["provider-metrics"]},
		},
		"mountproxy": map[string]any{
			"replicas":              1,
			"kubeconfigSecret":      map[string]any{"name": "shim-kubeconfig"},
			"servingCertSecret":     map[string]any{"name": "shim-serving"},
			"requestHeaderCASecret": map[string]any{"name": "shim-requestheader-ca"},
			"allowPrivateNetworks":  framework.AllowedNetworks,
			"reservedAddresses":     []string{env.frontProxy.URL},
			"ports":                 map[string]any{"https": shimPort, "health": ports["shim-health"], "metrics": ports["shim-metrics"]},
		},
	}
	kubeconfig := flatKubeconfig(t, main.Kubeconfig)
	secrets := deploy.Secrets{
		"identity-headers":      {"user-header": m.UserHeader, "group-header": m.GroupHeader, "extra-header-prefix": m.ExtraHeaderPrefix},
		"provider-kubeconfig":   {"kubeconfig": kubeconfig},
		"shim-kubeconfig":       {"kubeconfig": kubeconfig},
		"vault-secret-id":       {"secret-id": readFile(t, argValue(main.Args, "--vault-approle-secret-id-file"))},
		"shim-serving-ca":       {"ca.crt": readFile(t, m.ShimServingCAFile)},
		"probe-cert":            {"tls.crt": readFile(t, m.Probe.Cert), "tls.key": readFile(t, m.Probe.Key)},
		"shim-serving":          {"tls.crt": readFile(t, m.ShimServing.Cert), "tls.key": readFile(t, m.ShimServing.Key)},
		"shim-requestheader-ca": {"ca.crt": readFile(t, m.ShimRequestCAFile)},
	}
	ws, err := deploy.RenderChart(ctx, repo, rel.chart, values)
	if err != nil {
		t.Fatal(err)
	}
	pw, sw := ws["knotless-provider"], ws["knotless-mountproxy"]
	if pw == nil || sw == nil {
		t.Fatalf("rendered Deployments: %v", ws)
	}

	// The suite's provider and shim make way (the shim's address is the
	// one kcp-front-proxy's /tenants/ mapping names) and come back after.
	main.Stop(30 * time.Second)
	shim.Stop(30 * time.Second)
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		if err := main.Restart(ctx, env.group); err != nil {
			t.Errorf("restarting the suite's provider: %v", err)
		}
		if err := shim.Restart(ctx, env.group); err != nil {
			t.Errorf("restarting the suite's mount proxy: %v", err)
		}
	})
	pc := runWorkload(t, pw, "", secrets, ports["provider-health"], ports["provider-metrics"])
	sc := runWorkload(t, sw, "", secrets, ports["shim-health"], ports["shim-metrics"])
	t.Logf("FIGURE provider container ready in %s", pc.waitReady(ctx, t, 3*time.Minute).Round(100*time.Millisecond))
	t.Logf("FIGURE mount proxy container ready in %s", sc.waitReady(ctx, t, 2*time.Minute).Round(100*time.Millisecond))
	// The start-up line names the version and commit the image stamped.
	commit := strings.TrimPrefix(framework.LDFlags(ctx, repo), "-X github.com/knotless-dev/knotless/cmd/internal/buildinfo.Commit=")
	for _, c := range []*container{pc, sc} {
		tail := c.logs.Tail(200)
		if !strings.Contains(tail, "version") || !strings.Contains(tail, rel.tag) {
			t.Errorf("%s: no version %s in its start-up line", c.name, rel.tag)
		}
		if !strings.Contains(tail, commit) {
			t.Logf("%s: its start-up line does not name the work tree's commit %s (an image of another commit)", c.name, commit)
		}
	}

	// Application smoke test: a repo whose app password is in Vault, and
	// a record; the record reaches the PDS.
	acct, err := env.pds.CreateAccount(ctx, env.prefix+"ctr.test")
	if err != nil {
		t.Fatal(err)
	}
	c, lc := appWorkspace(ctx, t, env.prefix+"-container")
	vaultPath := fmt.Sprintf("knotless/%s/default/pds", lc)
	if _, err := env.vault.Write(ctx, "secret/data/"+vaultPath, map[string]any{"data": map[string]any{"password": acct.AppPassword}}); err != nil {
		t.Fatal(err)
	}
	app := shopApp(acct.Handle, "hello", "from the images")
	cred := &app.Spec.Components[0].Template.AtprotoRepo.Credential
	cred.SecretKeyRef, cred.Vault = nil, &atprotov1alpha1.VaultKeyRef{Mount: "secret", Path: vaultPath, Key: "password"}
	create(ctx, t, c, app)
	if err := framework.Eventually(ctx, 3*time.Minute, "Application shop Ready through the provider's image", func(ctx context.Context) (bool, string, error) {
		got := &appsv1alpha1.Application{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "shop"}, got); err != nil {
			return false, err.Error(), nil
		}
		return got.Status.Phase == "Ready" && got.Status.ObservedGeneration == got.Generation, string(got.Status.Phase), nil
	}); err != nil {
		dumpKnotless(ctx, t, c)
		t.Fatal(err)
	}
	if got := pdsText(ctx, t, acct.DID, "hello"); got != "from the images" {
		t.Fatalf("the record on the PDS says %q", got)
	}

	// Mount smoke test: the TenantCluster is probed Ready through the
	// shim's image, and alice lists the tenant's namespaces through
	// kcp-front-proxy and it.
	rt := newReadyTenant(ctx, t, env.prefix+"-container-mount")
	cfg, err := env.frontProxy.UserConfig("alice", root.Join(rt.ws).Join("tenant").String())
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	var nss *corev1.NamespaceList
	if err := framework.Eventually(ctx, time.Minute, "namespaces through the mount", func(ctx context.Context) (bool, string, error) {
		nss, err = cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		return err == nil, fmt.Sprint(err), nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(nss.Items, func(ns corev1.Namespace) bool { return ns.Name == "default" }) {
		t.Fatalf("namespaces through the mount: %v", nss.Items)
	}
	if text := sc.metrics(t); !strings.Contains(text, `knotless_mountproxy_requests_total{outcome="Forwarded"}`) {
		t.Error("the shim's image forwarded nothing, by its metrics")
	}
	tc := &computev1alpha1.TenantCluster{}
	if err := rt.c.Get(ctx, client.ObjectKey{Name: "tenant"}, tc); err != nil {
		t.Fatal(err)
	}

	// A second replica of the shim (the chart's mountproxy.replicas: 2)
	// is Ready only once its registry read every TenantCluster: the first
	// request after its /readyz turned 200 reaches the tenant.
	port2 := freePort(t)
	values["mountproxy"].(map[string]any)["ports"] = map[string]any{"https": port2, "health": freePort(t), "metrics": freePort(t)}
	ws2, err := deploy.RenderChart(ctx, repo, rel.chart, values)
	if err != nil {
		t.Fatal(err)
	}
	sw2 := ws2["knotless-mountproxy"]
	ports2 := sw2.Container.Ports
	health2, metrics2 := 0, 0
	for _, p := range ports2 {
		switch p.Name {
		case "health":
			health2 = int(p.ContainerPort)
		case "metrics":
			metrics2 = int(p.ContainerPort)
		}
	}
	sc2 := runWorkload(t, sw2, "-2", secrets, health2, metrics2)
	t.Logf("FIGURE second mount proxy replica ready in %s", sc2.waitReady(ctx, t, 2*time.Minute).Round(100*time.Millisecond))
	fp := frontProxyCert(t)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/tenants/%s/tenant/version", port2, rt.lc), nil)
	req.Header.Set(m.UserHeader, "alice")
	resp, err := shimClient(t, &fp).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the second replica's first request after it was Ready: %s %s, want 200 from the tenant", resp.Status, resp.Header.Get(mountproxy.ReasonHeader))
	}
	if !strings.Contains(sc2.logs.Tail(100), `"tenantClusters": `) || strings.Contains(sc2.logs.Tail(100), `"tenantClusters": 0`) {
		t.Errorf("the second replica's initial list did not name the TenantClusters:\n%s", sc2.logs.Tail(40))
	}
	t.Logf("through the images: Application Ready, record on the PDS, TenantCluster %s (%s), %d namespaces through the mount", tc.Status.Phase, tc.Status.TenantVersion, len(nss.Items))
}
