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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

	// measure runs run and returns records/s and what the provider, kcp and
	// the PDS used meanwhile (CPU in cores; kcp's is 0 for an external kcp).
	type usage struct{ rate, provider, kcp, pds float64 }
	measure := func(run func() error) (u usage, rss int64) {
		cpu := func() [3]float64 {
			var k float64
			if env.kcp.Process != nil {
				k = cpuSeconds(env.kcp.Process)
			}
			return [3]float64{cpuSeconds(env.provider.Process), k, cpuSeconds(env.pds.Process)}
		}
		c0, r0 := cpu(), kcpRequests(t)
		start := time.Now()
		if err := run(); err != nil {
			t.Fatal(err)
		}
		el := time.Since(start).Seconds()
		c1 := cpu()
		rss, _ = env.provider.RSS()
		t.Logf("provider requests to kcp: %.2f per record", float64(kcpRequests(t)-r0)/float64(n))
		return usage{float64(n) / el, (c1[0] - c0[0]) / el, (c1[1] - c0[1]) / el, (c1[2] - c0[2]) / el}, rss
	}
	// createAll creates count records with 16 concurrent clients, so that
	// creating them is not what is measured.
	createAll := func(c client.Client, prefix string, count int) error {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(16)
		for i := range count {
			g.Go(func() error {
				name := fmt.Sprintf("%s%05d", prefix, i)
				return createRetrying(gctx, c, record(name, "repo", name, fmt.Sprintf(`{"text":"%d"}`, i)))
			})
		}
		return g.Wait()
	}
	var lines []string
	line := func(what string, u usage, rss int64) {
		defer func() { t.Logf("FIGURE %s", lines[len(lines)-1]) }() // now, in case a later phase fails
		lines = append(lines, fmt.Sprintf("%-34s %7.1f/s (%.2fx ceiling); CPU cores: provider %.2f, kcp %.2f, PDS %.2f; provider RSS %.1f MiB",
			what, u.rate, u.rate/ceiling, u.provider, u.kcp, u.pds, float64(rss)/(1<<20)))
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

		u, rss := measure(func() error {
			t0 := time.Now()
			if err := createAll(one, mode.prefix, n); err != nil {
				return err
			}
			t.Logf("created %d records in %s", n, time.Since(t0))
			waitAllSynced(ctx, t, one, (round+1)*n, 30*time.Minute)
			return nil
		})
		line(fmt.Sprintf("knotless %s, 1 repo:", mode.name), u, rss)

		u, rss = measure(func() error {
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
		line(fmt.Sprintf("knotless %s, %d workspaces:", mode.name, w), u, rss)
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

// kcpRequests is the number of requests the provider has made to kcp
// (client-go's rest_client_requests_total, all codes and methods).
func kcpRequests(t *testing.T) int {
	m, err := env.provider.Metrics()
	if err != nil {
		t.Logf("reading provider metrics: %v", err)
		return 0
	}
	return int(framework.MetricSum(m, "rest_client_requests_total"))
}

// createRetrying creates obj, retrying for a minute while kcp answers with
// a server-side error (a saturated kcp times out quota evaluation), as any
// client would; an object that already exists counts as created.
func createRetrying(ctx context.Context, c client.Client, obj client.Object) error {
	var err error
	for delay := 100 * time.Millisecond; delay < time.Minute; delay *= 2 {
		err = c.Create(ctx, obj)
		switch {
		case err == nil || apierrors.IsAlreadyExists(err):
			return nil
		case apierrors.IsInternalError(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err), apierrors.IsTooManyRequests(err):
			obj.SetResourceVersion("")
			time.Sleep(delay)
		default:
			return err
		}
	}
	return err
}
