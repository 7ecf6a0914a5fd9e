package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/kcp-dev/logicalcluster/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/knotless-dev/knotless/deploy"
	"github.com/knotless-dev/knotless/e2e/framework"
)

// TestChartKeepsSecretsOnUpgradeInKCP renders the chart the way
// `helm upgrade` does, with helm's lookup answered by the suite's kcp (a
// workspace of its own stands in for the cluster the chart goes to): the
// first render makes the mount path's Secrets, which are then created
// there; the next render keeps every one of them; once the probe's client
// certificate is deleted, the next render issues a new one from the kept
// requestheader CA. Cost: one workspace and three renders, a few seconds.
func TestChartKeepsSecretsOnUpgradeInKCP(t *testing.T) {
	defer failWithLogs(t)
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := deploy.Helm(repo); err != nil {
		t.Skipf("no helm (make tools): %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	name := env.prefix + "-chart"
	if err := framework.CreateWorkspace(ctx, env.admin, root, name, logicalcluster.NewPath("root:universal")); err != nil {
		t.Fatal(err)
	}
	if err := framework.WaitWorkspaceReady(ctx, env.admin, root, name, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	ws := root.Join(name)
	c, err := framework.ClientFor(env.admin, ws)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "knotless-system"}}); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--dry-run=server", "--kubeconfig", writeKubeconfig(t, env.admin, ws)}
	values := filepath.Join(repo, deploy.Chart, "ci", "generated-values.yaml")
	render := func() deploy.Secrets {
		t.Helper()
		out, err := deploy.Template(ctx, repo, filepath.Join(repo, deploy.Chart), flags, nil, values)
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
		return secrets
	}

	first := render()
	if len(first) == 0 {
		t.Fatal("the chart made no Secret with only the kubeconfigs named")
	}
	for name, data := range first {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "knotless-system", Name: name}, StringData: data}
		if err := c.Create(ctx, s); err != nil {
			t.Fatalf("creating the rendered Secret %s in kcp: %v", name, err)
		}
	}
	second := render()
	for name, data := range first {
		for k, v := range data {
			if second[name][k] != v {
				t.Errorf("upgrade: Secret %s key %s changed although the Secret exists", name, k)
			}
		}
	}

	if first["knotless-probe"] == nil {
		t.Fatalf("no knotless-probe Secret among %d rendered", len(first))
	}
	if err := c.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "knotless-system", Name: "knotless-probe"}}); err != nil {
		t.Fatal(err)
	}
	third := render()
	if third["knotless-probe"]["tls.crt"] == first["knotless-probe"]["tls.crt"] {
		t.Error("the deleted probe certificate was not made again")
	}
	if ca := "knotless-requestheader-ca"; third[ca]["ca.crt"] != first[ca]["ca.crt"] {
		t.Error("the requestheader CA changed when a client certificate was made again")
	}
	if err := c.DeleteAllOf(ctx, &corev1.Secret{}, client.InNamespace("knotless-system")); err != nil {
		t.Logf("cleaning up: %v", err)
	}
}
