package e2e

import (
	"context"
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
// in one repo and N records spread over W workspaces, with applyWrites
// batching (the default) and without it (--atproto-max-batch=1), with
// provider CPU and RSS. The provider runs with its default resync for the
// measurement. Run with KNOTLESS_E2E_BENCH=N[,W] (make bench-records); it
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

	// Workspaces and repos are made once and shared by both modes.
	one, _ := repoWorkspace(ctx, t, env.prefix+"-bench1", env.prefix+"bench1.test", "")
	clients := make([]client.Client, w)
	for i := range w {
		clients[i], _ = repoWorkspace(ctx, t, fmt.Sprintf("%s-benchw-%03d", env.prefix, i), fmt.Sprintf("%sbw%03d.test", env.prefix, i), "")
	}
	orig := env.provider.Args
	defer func() {
		env.provider.Stop(20 * time.Second)
		env.provider.Args = orig
		if err := env.provider.Restart(context.WithoutCancel(ctx), env.group); err != nil {
			t.Errorf("restarting the provider with its test flags: %v", err)
		}
	}()

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
	createAll := func(c client.Client, prefix string, count int) error {
		for i := range count {
			name := fmt.Sprintf("%s%05d", prefix, i)
			if err := c.Create(ctx, record(name, "repo", name, fmt.Sprintf(`{"text":"%d"}`, i))); err != nil {
				return err
			}
		}
		return nil
	}
	var lines []string
	line := func(what string, rate, cpu float64, rss int64) {
		lines = append(lines, fmt.Sprintf("%-34s %7.1f/s (%.2fx ceiling), provider CPU %.2f cores, RSS %.1f MiB", what, rate, rate/ceiling, cpu, float64(rss)/(1<<20)))
	}
	for round, mode := range []struct {
		name, prefix string
		args         []string
	}{
		{"batched", "b", nil},
		{"unbatched", "u", []string{"--atproto-max-batch", "1"}},
	} {
		env.provider.Stop(20 * time.Second)
		env.provider.Args = append(withoutTestResync(orig), mode.args...)
		if err := env.provider.Restart(ctx, env.group); err != nil {
			t.Fatal(err)
		}
		waitQuiet(ctx, t)

		rate, cpu, rss := measure(func() error {
			if err := createAll(one, mode.prefix, n); err != nil {
				return err
			}
			waitAllSynced(ctx, t, one, (round+1)*n, 30*time.Minute)
			return nil
		})
		line(fmt.Sprintf("knotless %s, 1 repo:", mode.name), rate, cpu, rss)

		rate, cpu, rss = measure(func() error {
			g, _ := errgroup.WithContext(ctx)
			for i := range w {
				g.Go(func() error { return createAll(clients[i], mode.prefix, n/w) })
			}
			if err := g.Wait(); err != nil {
				return err
			}
			for i := range w {
				waitAllSynced(ctx, t, clients[i], (round+1)*(n/w), 30*time.Minute)
			}
			return nil
		})
		line(fmt.Sprintf("knotless %s, %d workspaces:", mode.name, w), rate, cpu, rss)
	}
	t.Logf("FIGURE records/s, %d records, same PDS, same run:", n)
	t.Logf("FIGURE %-34s %7.1f/s", "plain sequential putRecord loop:", ceiling)
	for _, l := range lines {
		t.Logf("FIGURE %s", l)
	}
}

// withoutTestResync drops --atproto-resync (the suite's short test value)
// from the provider's flags, keeping the rest.
func withoutTestResync(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == "--atproto-resync" {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// waitQuiet waits until the provider's record controller has no work
// queued or running, so a measurement does not include the start-up sync.
func waitQuiet(ctx context.Context, t *testing.T) {
	t.Helper()
	quiet := 0
	if err := framework.Eventually(ctx, 10*time.Minute, "record controller idle", func(context.Context) (bool, string, error) {
		m, err := env.provider.Metrics()
		if err != nil {
			return false, err.Error(), nil
		}
		busy := false
		for _, l := range strings.Split(m, "\n") {
			if (strings.HasPrefix(l, `workqueue_depth{controller="atprotorecord"`) || strings.HasPrefix(l, `controller_runtime_active_workers{controller="atprotorecord"`)) && !strings.HasSuffix(l, " 0") {
				busy = true
			}
		}
		if busy || !strings.Contains(m, `controller="atprotorecord"`) {
			quiet = 0
			return false, "busy", nil
		}
		quiet++
		return quiet >= 3, "idle", nil
	}); err != nil {
		t.Fatal(err)
	}
}
