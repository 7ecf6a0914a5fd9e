package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kcp-dev/logicalcluster/v3"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
)

var root = logicalcluster.NewPath("root")

// newApplicationWorkspace creates a socialweb-application workspace as the
// user of cfg, waits for it and its bindings, then creates an Application
// in it and waits until the provider reports it Ready for its current
// generation. It returns the time from workspace creation to that.
func newApplicationWorkspace(ctx context.Context, cfg *rest.Config, name string) (time.Duration, error) {
	start := time.Now()
	if err := framework.CreateWorkspace(ctx, cfg, root, name, env.appType); err != nil {
		return 0, err
	}
	if err := framework.WaitWorkspaceReady(ctx, cfg, root, name, 2*time.Minute); err != nil {
		return 0, err
	}
	if err := createApplication(ctx, cfg, root.Join(name), "app"); err != nil {
		return 0, err
	}
	if err := waitApplicationReady(ctx, cfg, root.Join(name), "app", 2*time.Minute); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func createApplication(ctx context.Context, cfg *rest.Config, ws logicalcluster.Path, name string) error {
	c, err := framework.ClientFor(cfg, ws)
	if err != nil {
		return err
	}
	app := &appsv1alpha1.Application{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	app.Spec.Description = "e2e"
	if err := c.Create(ctx, app, client.FieldOwner("e2e-user")); client.IgnoreAlreadyExists(err) != nil {
		return fmt.Errorf("creating Application in %s: %w", ws, err)
	}
	return nil
}

func waitApplicationReady(ctx context.Context, cfg *rest.Config, ws logicalcluster.Path, name string, timeout time.Duration) error {
	c, err := framework.ClientFor(cfg, ws)
	if err != nil {
		return err
	}
	return framework.Eventually(ctx, timeout, fmt.Sprintf("Application %s in %s to be Ready", name, ws), func(ctx context.Context) (bool, string, error) {
		app := &appsv1alpha1.Application{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, app); err != nil {
			return false, err.Error(), nil
		}
		st := app.Status
		ok := st.Phase == appsv1alpha1.ApplicationReady && st.ObservedGeneration == app.Generation &&
			meta.IsStatusConditionTrue(st.Conditions, appsv1alpha1.ConditionReady)
		return ok, fmt.Sprintf("phase %q observedGeneration %d/%d", st.Phase, st.ObservedGeneration, app.Generation), nil
	})
}

// TestWorkspacesCreatedAfterStartupAreEngaged: 20 workspaces created after
// the provider started, half by kcp-admin and half by an unprivileged token
// user, all initialize with their bindings Ready, and an Application in
// each becomes Ready (R13, R15).
func TestWorkspacesCreatedAfterStartupAreEngaged(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	const n = 20
	users := make([]*rest.Config, n)
	who := make([]string, n)
	for i := range users {
		users[i], who[i] = env.admin, "kcp-admin"
		if i%2 == 1 {
			cfg, err := env.kcp.UserConfig("alice")
			if err != nil {
				t.Logf("no unprivileged user on an existing kcp (%v); using kcp-admin", err)
				continue
			}
			users[i], who[i] = cfg, "alice"
		}
	}

	var mu sync.Mutex
	durations := make([]time.Duration, 0, n)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(5)
	for i := range n {
		g.Go(func() error {
			name := fmt.Sprintf("%s-engage-%02d", env.prefix, i)
			d, err := newApplicationWorkspace(gctx, users[i], name)
			if err != nil {
				return fmt.Errorf("%s (created by %s): %w", name, who[i], err)
			}
			mu.Lock()
			durations = append(durations, d)
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	sort.Slice(durations, func(i, j int) bool { return durations[i] < durations[j] })
	rss, _ := env.provider.RSS()
	t.Logf("FIGURE workspace creation -> Application Ready: median %s, min %s, max %s over %d workspaces",
		durations[n/2].Round(time.Millisecond), durations[0].Round(time.Millisecond), durations[n-1].Round(time.Millisecond), n)
	t.Logf("FIGURE provider RSS after engaging %d workspaces: %.1f MiB", n, float64(rss)/(1<<20))

	// R05: Application status has exactly one writer.
	c, err := framework.ClientFor(env.admin, root.Join(env.prefix+"-engage-00"))
	if err != nil {
		t.Fatal(err)
	}
	app := &appsv1alpha1.Application{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "app"}, app); err != nil {
		t.Fatal(err)
	}
	for _, mf := range app.ManagedFields {
		if mf.Subresource == "status" && mf.Manager != "knotless-application" {
			t.Errorf("status written by %q too", mf.Manager)
		}
		if mf.Subresource == "" && mf.Manager == "knotless-application" {
			t.Errorf("the controller wrote the main resource: %s", mf.FieldsV1)
		}
	}

	metrics, err := env.provider.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics, "knotless_engaged_workspaces") {
		t.Errorf("metrics lack knotless_engaged_workspaces")
	}
}

// TestWorkspaceInitializesWithoutProvider: with the provider stopped and
// no bidder workspaces, a socialweb-application workspace still
// initializes (its type binds only exports that exist; R15). Once the
// provider is back, the workspace is engaged.
func TestWorkspaceInitializesWithoutProvider(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	env.provider.Stop(20 * time.Second)
	name := env.prefix + "-alone"
	if err := framework.CreateWorkspace(ctx, env.admin, root, name, env.appType); err != nil {
		t.Fatal(err)
	}
	if err := framework.WaitWorkspaceReady(ctx, env.admin, root, name, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := createApplication(ctx, env.admin, root.Join(name), "app"); err != nil {
		t.Fatal(err)
	}
	if err := env.provider.Restart(ctx, env.group); err != nil {
		t.Fatal(err)
	}
	if err := waitApplicationReady(ctx, env.admin, root.Join(name), "app", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// TestProviderKilledWhileWorkspacesAreCreated: kill -9 the provider while
// workspaces are being created; after a restart every workspace is engaged
// and nothing was re-created by hand.
func TestProviderKilledWhileWorkspacesAreCreated(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	const n = 8
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-kill-%02d", env.prefix, i)
	}
	g, gctx := errgroup.WithContext(ctx)
	for i, name := range names {
		g.Go(func() error {
			time.Sleep(time.Duration(i) * 300 * time.Millisecond)
			if err := framework.CreateWorkspace(gctx, env.admin, root, name, env.appType); err != nil {
				return err
			}
			if err := framework.WaitWorkspaceReady(gctx, env.admin, root, name, 2*time.Minute); err != nil {
				return err
			}
			return createApplication(gctx, env.admin, root.Join(name), "app")
		})
	}
	time.Sleep(time.Second)
	env.provider.Kill9()
	t.Logf("killed the provider (pid %d) while workspaces were being created", env.provider.PID())
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := env.provider.Restart(ctx, env.group); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if err := waitApplicationReady(ctx, env.admin, root.Join(name), "app", 2*time.Minute); err != nil {
			t.Error(err)
		}
	}
}
