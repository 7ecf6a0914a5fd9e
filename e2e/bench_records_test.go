package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/knotless-dev/knotless/e2e/framework"
)

// cpuSeconds returns the user+system CPU time of a process.
func cpuSeconds(p *framework.Process) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID()))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// TestRecordThroughput prints records/s of a plain sequential putRecord
// loop against the PDS (the ceiling) and of knotless reconciling N records
// in one repo and N records spread over W workspaces, with provider CPU
// and RSS. Run with KNOTLESS_E2E_BENCH=N[,W] (make bench-records); it
// asserts only that every record became Synced.
func TestRecordThroughput(t *testing.T) {
	spec := os.Getenv("KNOTLESS_E2E_BENCH")
	if spec == "" {
		t.Skip("set KNOTLESS_E2E_BENCH=N[,W] (make bench-records) to run")
	}
	defer failWithLogs(t)
	parts := strings.Split(spec, ",")
	n, _ := strconv.Atoi(parts[0])
	w := 10
	if len(parts) > 1 {
		w, _ = strconv.Atoi(parts[1])
	}
	ctx := t.Context()

	// Ceiling: a plain client writing sequentially.
	acct, err := env.pds.CreateAccount(ctx, env.prefix+"ceil.test")
	if err != nil {
		t.Fatal(err)
	}
	sess, err := env.pds.CreateSession(ctx, acct.Handle, acct.AppPassword)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := range n {
		in := map[string]any{"repo": acct.DID, "collection": testCollection, "rkey": fmt.Sprintf("c%05d", i), "record": map[string]any{"$type": testCollection, "text": fmt.Sprint(i)}}
		if err := env.pds.XRPC(ctx, "com.atproto.repo.putRecord", sess.AccessJWT, nil, in, nil); err != nil {
			t.Fatal(err)
		}
	}
	ceiling := float64(n) / time.Since(start).Seconds()

	measure := func(run func() error) (rate, cpu float64, rss int64) {
		cpu0 := cpuSeconds(env.provider.Process)
		start := time.Now()
		if err := run(); err != nil {
			t.Fatal(err)
		}
		el := time.Since(start)
		rss, _ = env.provider.RSS()
		return float64(n) / el.Seconds(), (cpuSeconds(env.provider.Process) - cpu0) / el.Seconds(), rss
	}

	// knotless, one repo.
	c, _ := repoWorkspace(ctx, t, env.prefix+"-bench1", env.prefix+"bench1.test", "")
	oneRate, oneCPU, oneRSS := measure(func() error {
		for i := range n {
			if err := c.Create(ctx, record(fmt.Sprintf("b%05d", i), "repo", fmt.Sprintf("b%05d", i), fmt.Sprintf(`{"text":"%d"}`, i))); err != nil {
				return err
			}
		}
		waitAllSynced(ctx, t, c, n, 30*time.Minute)
		return nil
	})

	// knotless, n records over w workspaces (workspaces and repos made first).
	clients := make([]client.Client, w)
	for i := range w {
		clients[i], _ = repoWorkspace(ctx, t, fmt.Sprintf("%s-benchw-%03d", env.prefix, i), fmt.Sprintf("%sbw%03d.test", env.prefix, i), "")
	}
	manyRate, manyCPU, manyRSS := measure(func() error {
		g, gctx := errgroup.WithContext(ctx)
		for i := range w {
			g.Go(func() error {
				per := n / w
				for j := range per {
					if err := clients[i].Create(gctx, record(fmt.Sprintf("m%05d", j), "repo", fmt.Sprintf("m%05d", j), fmt.Sprintf(`{"text":"%d"}`, j))); err != nil {
						return err
					}
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		for i := range w {
			waitAllSynced(ctx, t, clients[i], n/w, 30*time.Minute)
		}
		return nil
	})
	t.Logf("FIGURE records/s, %d records, same PDS, same run:", n)
	t.Logf("FIGURE   plain sequential putRecord loop (ceiling): %.1f/s", ceiling)
	t.Logf("FIGURE   knotless, 1 repo:                 %.1f/s (%.2fx ceiling), provider CPU %.2f cores, RSS %.1f MiB", oneRate, oneRate/ceiling, oneCPU, float64(oneRSS)/(1<<20))
	t.Logf("FIGURE   knotless, %d workspaces:           %.1f/s (%.2fx ceiling), provider CPU %.2f cores, RSS %.1f MiB", w, manyRate, manyRate/ceiling, manyCPU, float64(manyRSS)/(1<<20))
}
