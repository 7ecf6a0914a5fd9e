package e2e

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
)

// TestEngagementAtScale reports engagement time and provider memory for N
// workspaces (KNOTLESS_E2E_SCALE=N; `make bench-engage`). It prints
// figures and asserts only that every Application became Ready.
func TestEngagementAtScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KNOTLESS_E2E_SCALE"))
	if n <= 0 {
		t.Skip("set KNOTLESS_E2E_SCALE=N (make bench-engage) to run")
	}
	defer failWithLogs(t)
	ctx := t.Context()
	before, err := env.provider.RSS()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(10)
	for i := range n {
		g.Go(func() error {
			_, err := newApplicationWorkspace(gctx, env.admin, fmt.Sprintf("%s-scale-%04d", env.prefix, i))
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	after, err := env.provider.RSS()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE %d workspaces created and engaged (Application Ready) in %s (%.2f workspaces/s)", n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds())
	t.Logf("FIGURE provider RSS %.1f MiB before, %.1f MiB after; %.1f KiB per engaged workspace",
		float64(before)/(1<<20), float64(after)/(1<<20), float64(after-before)/1024/float64(n))
}
