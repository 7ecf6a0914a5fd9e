package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/ssa"
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

// benchRepo is a workspace with a Ready AtprotoRepo "repo" and a session
// of its account for plain clients.
type benchRepo struct {
	c    client.Client
	did  string
	sess string // access JWT
}

func newBenchRepo(ctx context.Context, t *testing.T, name, handle string) benchRepo {
	t.Helper()
	c, _ := appWorkspace(ctx, t, name)
	acct, err := env.pds.CreateAccount(ctx, handle)
	if err != nil {
		t.Fatal(err)
	}
	create(ctx, t, c, passwordSecret("cred", acct.AppPassword), secretRepo("repo", acct.Handle, "cred"))
	waitRepo(ctx, t, c, "repo", atprotov1alpha1.ReasonReady)
	sess, err := env.pds.CreateSession(ctx, acct.Handle, acct.AppPassword)
	if err != nil {
		t.Fatal(err)
	}
	return benchRepo{c: c, did: acct.DID, sess: sess.AccessJWT}
}

// declarative does what any declarative client of a record must do, and
// nothing more: create the object in kcp, put the record on the PDS, write
// the object's status (server-side apply of the status subresource, as
// knotless does) from the PDS's answer. It counts its writes to kcp.
func declarative(ctx context.Context, r benchRepo, name string, i int, writes *atomic.Int64) error {
	rec := record(name, "repo", name, fmt.Sprintf(`{"text":"%d"}`, i))
	if err := createRetrying(ctx, r.c, rec, writes); err != nil {
		return err
	}
	var out struct {
		URI    string `json:"uri"`
		CID    string `json:"cid"`
		Commit struct {
			Rev string `json:"rev"`
		} `json:"commit"`
	}
	in := map[string]any{"repo": r.did, "collection": testCollection, "rkey": name, "record": map[string]any{"$type": testCollection, "text": fmt.Sprint(i)}}
	if err := env.pds.XRPC(ctx, "com.atproto.repo.putRecord", r.sess, nil, in, &out); err != nil {
		return err
	}
	now := metav1.Now()
	st := atprotov1alpha1.AtprotoRecordStatus{ObservedGeneration: rec.Generation, URI: out.URI, CID: out.CID, Rev: out.Commit.Rev}
	for _, typ := range []string{atprotov1alpha1.ConditionSynced, atprotov1alpha1.ConditionReady} {
		st.Conditions = append(st.Conditions, metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: atprotov1alpha1.ReasonSynced,
			Message: "the record on the PDS equals spec", ObservedGeneration: rec.Generation, LastTransitionTime: now})
	}
	for delay := 100 * time.Millisecond; ; delay *= 2 {
		writes.Add(1)
		err := ssa.Status(ctx, r.c, rec, &st, "bench-declarative")
		if err == nil || delay > 30*time.Second || !(apierrors.IsInternalError(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err)) {
			return err
		}
		time.Sleep(delay)
	}
}

// TestRecordThroughput prints records/s of knotless reconciling N new
// records in one repo and N records spread over W workspaces, with
// applyWrites batching (the default) and without it
// (--atproto-max-batch=1), next to two ceilings measured against the same
// PDS and kcp in the same run:
//
//   - a plain sequential putRecord loop (the PDS alone);
//   - a declarative plain client with the same concurrency as the user's
//     creates (16 per workspace): create the object in kcp, putRecord,
//     write the object's status; the provider is stopped meanwhile.
//
// For each it prints the writes to kcp per record (for knotless: the
// user's create and the provider's writes) and kcp's CPU per record, and
// the CPU that the provider, kcp and the PDS used. The provider runs with
// its default resync for the measurement. Run with KNOTLESS_E2E_BENCH=N[,W]
// (make bench-records); it asserts only that every record became Synced.
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

	// Workspaces and repos are made once and shared by every measurement.
	one := newBenchRepo(ctx, t, env.prefix+"-bench1", env.prefix+"bench1.test")
	many := make([]benchRepo, w)
	for i := range w {
		many[i] = newBenchRepo(ctx, t, fmt.Sprintf("%s-benchw-%03d", env.prefix, i), fmt.Sprintf("%sbw%03d.test", env.prefix, i))
	}
	orig := env.provider.Args
	defer func() {
		env.provider.Stop(20 * time.Second)
		env.provider.Args = orig
		if err := env.provider.Restart(context.WithoutCancel(ctx), env.group); err != nil {
			t.Errorf("restarting the provider with its test flags: %v", err)
		}
	}()

	// usage is a measurement: records/s, CPU cores of the provider, kcp
	// (0 for an external kcp) and the PDS, kcp CPU seconds per record,
	// writes to kcp per record.
	type usage struct{ rate, provider, kcp, pds, kcpPerRecord, writes float64 }
	measure := func(run func(writes *atomic.Int64) error) usage {
		cpu := func() [3]float64 {
			var k, p float64
			if env.kcp.Process != nil {
				k = cpuSeconds(env.kcp.Process)
			}
			if !env.provider.Exited() {
				p = cpuSeconds(env.provider.Process)
			}
			return [3]float64{p, k, cpuSeconds(env.pds.Process)}
		}
		var writes atomic.Int64
		c0, w0 := cpu(), providerWrites(t)
		start := time.Now()
		if err := run(&writes); err != nil {
			t.Fatal(err)
		}
		el := time.Since(start).Seconds()
		c1, w1 := cpu(), providerWrites(t)
		if c1[0] < c0[0] { // the provider did not run
			c1[0] = c0[0]
		}
		return usage{
			rate: float64(n) / el, provider: (c1[0] - c0[0]) / el, kcp: (c1[1] - c0[1]) / el, pds: (c1[2] - c0[2]) / el,
			kcpPerRecord: (c1[1] - c0[1]) / float64(n),
			writes:       float64(writes.Load()+int64(max(w1-w0, 0))) / float64(n),
		}
	}
	// createAll creates count records with 16 concurrent clients, so that
	// creating them is not what is measured.
	createAll := func(c client.Client, prefix string, count int, writes *atomic.Int64) error {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(16)
		for i := range count {
			g.Go(func() error {
				name := fmt.Sprintf("%s%05d", prefix, i)
				return createRetrying(gctx, c, record(name, "repo", name, fmt.Sprintf(`{"text":"%d"}`, i)), writes)
			})
		}
		return g.Wait()
	}
	// declareAll is createAll for the declarative ceiling.
	declareAll := func(r benchRepo, prefix string, count int, writes *atomic.Int64) error {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(16)
		for i := range count {
			g.Go(func() error { return declarative(gctx, r, fmt.Sprintf("%s%05d", prefix, i), i, writes) })
		}
		return g.Wait()
	}
	var lines []string
	line := func(what string, u usage, ceil float64) {
		rss, _ := env.provider.RSS()
		l := fmt.Sprintf("%-40s %7.1f/s (%.2fx putRecord", what, u.rate, u.rate/ceiling)
		if ceil > 0 {
			l += fmt.Sprintf(", %.2fx declarative", u.rate/ceil)
		}
		l += fmt.Sprintf("); kcp writes/record %.2f, kcp CPU/record %.0f ms; CPU cores: provider %.2f, kcp %.2f, PDS %.2f", u.writes, u.kcpPerRecord*1000, u.provider, u.kcp, u.pds)
		if !env.provider.Exited() {
			l += fmt.Sprintf("; provider RSS %.1f MiB", float64(rss)/(1<<20))
		}
		lines = append(lines, l)
		t.Logf("FIGURE %s", l) // now, in case a later phase fails
	}

	// The declarative ceiling, with the provider stopped; its objects are
	// deleted before the provider runs again.
	env.provider.Stop(20 * time.Second)
	u := measure(func(writes *atomic.Int64) error { return declareAll(one, "d", n, writes) })
	declOne := u.rate
	line("declarative ceiling, 1 repo:", u, 0)
	u = measure(func(writes *atomic.Int64) error {
		g, _ := errgroup.WithContext(ctx)
		for i := range w {
			g.Go(func() error { return declareAll(many[i], "d", n/w, writes) })
		}
		return g.Wait()
	})
	declMany := u.rate
	line(fmt.Sprintf("declarative ceiling, %d workspaces:", w), u, 0)
	for _, r := range append([]benchRepo{one}, many...) {
		if err := r.c.DeleteAllOf(ctx, &atprotov1alpha1.AtprotoRecord{}, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
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

		u := measure(func(writes *atomic.Int64) error {
			t0 := time.Now()
			if err := createAll(one.c, mode.prefix, n, writes); err != nil {
				return err
			}
			t.Logf("created %d records in %s", n, time.Since(t0))
			waitAllSynced(ctx, t, one.c, (round+1)*n, 30*time.Minute)
			return nil
		})
		line(fmt.Sprintf("knotless %s, 1 repo:", mode.name), u, declOne)

		u = measure(func(writes *atomic.Int64) error {
			g, _ := errgroup.WithContext(ctx)
			for i := range w {
				g.Go(func() error { return createAll(many[i].c, mode.prefix, n/w, writes) })
			}
			if err := g.Wait(); err != nil {
				return err
			}
			for i := range w {
				waitAllSynced(ctx, t, many[i].c, (round+1)*(n/w), 30*time.Minute)
			}
			return nil
		})
		line(fmt.Sprintf("knotless %s, %d workspaces:", mode.name, w), u, declMany)
	}
	t.Logf("FIGURE records/s, %d records, same PDS and kcp, same run:", n)
	t.Logf("FIGURE %-40s %7.1f/s", "plain sequential putRecord loop:", ceiling)
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

// providerWrites is the number of writes (every method but GET) the
// provider has made to kcp (client-go's rest_client_requests_total), 0
// when it does not run.
func providerWrites(t *testing.T) int {
	if env.provider.Exited() {
		return 0
	}
	m, err := env.provider.Metrics()
	if err != nil {
		t.Logf("reading provider metrics: %v", err)
		return 0
	}
	n := 0.0
	for _, l := range strings.Split(m, "\n") {
		if !strings.HasPrefix(l, "rest_client_requests_total{") || strings.Contains(l, `method="GET"`) {
			continue
		}
		if i := strings.LastIndexByte(l, ' '); i > 0 {
			v, _ := strconv.ParseFloat(l[i+1:], 64)
			n += v
		}
	}
	return int(n)
}

// createRetrying creates obj, retrying for a minute while kcp answers with
// a server-side error (a saturated kcp times out quota evaluation), as any
// client would; an object that already exists counts as created. Each
// attempt adds one to writes.
func createRetrying(ctx context.Context, c client.Client, obj client.Object, writes *atomic.Int64) error {
	var err error
	for delay := 100 * time.Millisecond; delay < time.Minute; delay *= 2 {
		writes.Add(1)
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
