package e2e

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
)

var reconcilesRE = regexp.MustCompile(`(?m)^controller_runtime_reconcile_total\{controller="(application|component)",result="[a-z_]+"\} (\d+)`)

// appsReconciles is the number of reconciles the application and component
// controllers have finished.
func appsReconciles(t *testing.T) int {
	t.Helper()
	m, err := env.provider.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, sm := range reconcilesRE.FindAllStringSubmatch(m, -1) {
		n, _ := strconv.Atoi(sm[2])
		total += n
	}
	return total
}

// TestApplicationThroughput prints the reconciles per second the
// application and component controllers sustain while W workspaces each get
// an Application with C components (one repo and C-1 records on the real
// PDS) and all become Ready, with the provider's CPU and RSS. Run with
// KNOTLESS_E2E_APPS_BENCH=W,C (make bench-apps); it asserts only that every
// Application became Ready.
func TestApplicationThroughput(t *testing.T) {
	spec := os.Getenv("KNOTLESS_E2E_APPS_BENCH")
	if spec == "" {
		t.Skip("set KNOTLESS_E2E_APPS_BENCH=W,C (make bench-apps) to run")
	}
	defer failWithLogs(t)
	parts := strings.Split(spec, ",")
	w, _ := strconv.Atoi(parts[0])
	comps := 10
	if len(parts) > 1 {
		comps, _ = strconv.Atoi(parts[1])
	}
	ctx := t.Context()

	// Workspaces, accounts and credentials first; they are not measured.
	clients := make([]client.Client, w)
	apps := make([]*appsv1alpha1.Application, w)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := range w {
		g.Go(func() error {
			c, err := appWorkspaceNoT(gctx, fmt.Sprintf("%s-appbench-%03d", env.prefix, i))
			if err != nil {
				return err
			}
			acct, err := env.pds.CreateAccount(gctx, fmt.Sprintf("%sab%03d.test", env.prefix, i))
			if err != nil {
				return err
			}
			if err := c.Create(gctx, passwordSecret("cred", acct.AppPassword)); err != nil {
				return err
			}
			var recs []string
			for j := 1; j < comps; j++ {
				recs = append(recs, fmt.Sprintf("r%02d", j), fmt.Sprint(j))
			}
			clients[i], apps[i] = c, shopApp(acct.Handle, recs...)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}

	r0, cpu0 := appsReconciles(t), cpuSeconds(env.provider.Process)
	start := time.Now()
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range w {
		g.Go(func() error { return clients[i].Create(gctx, apps[i]) })
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	for i := range w {
		waitApp(ctx, t, clients[i], appsv1alpha1.ApplicationReady, 30*time.Minute)
	}
	el := time.Since(start).Seconds()
	n := appsReconciles(t) - r0
	rss, _ := env.provider.RSS()
	t.Logf("FIGURE %d workspaces x %d components: all Ready in %.1fs; application+component reconciles %d (%.1f/s, %.1f per component); provider CPU %.2f cores, RSS %.1f MiB",
		w, comps, el, n, float64(n)/el, float64(n)/float64(w*comps), (cpuSeconds(env.provider.Process)-cpu0)/el, float64(rss)/(1<<20))
}
