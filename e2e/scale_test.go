package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/knotless-dev/knotless/e2e/framework"
)

// memory is what the provider holds at one moment: RSS, live heap (after a
// garbage collection) and goroutines.
type memory struct {
	rss, heap  int64
	goroutines int
}

// providerMemory forces a garbage collection (by taking a heap profile,
// saved as heap-<label>.pprof among the suite's logs, next to the
// goroutines in goroutine-<label>.txt) and reads RSS, the in-use heap and
// the goroutine count.
func providerMemory(t *testing.T, label string) memory {
	t.Helper()
	if err := env.provider.Profile("heap?gc=1", filepath.Join(env.dir, "heap-"+label+".pprof")); err != nil {
		t.Fatal(err)
	}
	if err := env.provider.Profile("goroutine?debug=1", filepath.Join(env.dir, "goroutine-"+label+".txt")); err != nil {
		t.Fatal(err)
	}
	var m memory
	var err error
	if m.rss, err = env.provider.RSS(); err != nil {
		t.Fatal(err)
	}
	text, err := env.provider.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	m.heap = int64(framework.MetricSum(text, "go_memstats_heap_inuse_bytes"))
	m.goroutines = int(framework.MetricSum(text, "go_goroutines"))
	return m
}

// TestEngagementAtScale reports engagement time and provider memory for N
// workspaces (KNOTLESS_E2E_SCALE=N; `make bench-engage`): RSS, live heap
// and goroutines at N=0 and N, and their share per engaged workspace. It
// prints figures and asserts only that every Application became Ready.
// Heap profiles at both points are kept among the suite's logs
// (go tool pprof -base heap-0.pprof heap-N.pprof).
func TestEngagementAtScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KNOTLESS_E2E_SCALE"))
	if n <= 0 {
		t.Skip("set KNOTLESS_E2E_SCALE=N (make bench-engage) to run")
	}
	defer failWithLogs(t)
	ctx := t.Context()
	before := providerMemory(t, "0")
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
	after := providerMemory(t, strconv.Itoa(n))
	per := func(a, b int64) float64 { return float64(a-b) / 1024 / float64(n) }
	t.Logf("FIGURE %d workspaces created and engaged (Application Ready) in %s (%.2f workspaces/s)", n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds())
	t.Logf("FIGURE provider RSS %.1f MiB at N=0, %.1f MiB at N=%d: %.1f KiB per engaged workspace", float64(before.rss)/(1<<20), float64(after.rss)/(1<<20), n, per(after.rss, before.rss))
	t.Logf("FIGURE provider live heap %.1f MiB at N=0, %.1f MiB at N=%d: %.1f KiB per engaged workspace", float64(before.heap)/(1<<20), float64(after.heap)/(1<<20), n, per(after.heap, before.heap))
	t.Logf("FIGURE provider goroutines %d at N=0, %d at N=%d: %.1f per engaged workspace", before.goroutines, after.goroutines, n, float64(after.goroutines-before.goroutines)/float64(n))
	t.Logf("profiles: %s/{heap-0.pprof,heap-%d.pprof,goroutine-0.txt,goroutine-%d.txt}", env.dir, n, n)
}
