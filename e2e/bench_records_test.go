package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/bootstrap"
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
	wc   client.WithWatch
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
	return benchRepo{c: c, wc: watchClient(t, name), did: acct.DID, sess: sess.AccessJWT}
}

// watchSynced starts counting the AtprotoRecords of r whose names start
// with prefix that are Synced for their generation, from one list and a
// watch: listing every record once a second, as waitAllSynced does, costs
// kcp more CPU than the records' own writes once there are thousands.
// The returned func waits until count are Synced; if the watch ends
// early it falls back to waitAllSynced for all want records of r.
func watchSynced(ctx context.Context, t *testing.T, r benchRepo, prefix string, count, want int) func() {
	t.Helper()
	var list atprotov1alpha1.AtprotoRecordList
	if err := r.wc.List(ctx, &list, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	wi, err := r.wc.Watch(ctx, &atprotov1alpha1.AtprotoRecordList{}, client.InNamespace("default"), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		t.Fatal(err)
	}
	synced := map[string]bool{}
	isSynced := func(rec *atprotov1alpha1.AtprotoRecord) bool {
		c := meta.FindStatusCondition(rec.Status.Conditions, atprotov1alpha1.ConditionSynced)
		return strings.HasPrefix(rec.Name, prefix) && c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == rec.Generation
	}
	for i := range list.Items {
		if isSynced(&list.Items[i]) {
			synced[list.Items[i].Name] = true
		}
	}
	done := make(chan bool, 1)
	go func() {
		defer wi.Stop()
		for ev := range wi.ResultChan() {
			rec, ok := ev.Object.(*atprotov1alpha1.AtprotoRecord)
			if !ok {
				continue
			}
			synced[rec.Name] = isSynced(rec)
			n := 0
			for _, v := range synced {
				if v {
					n++
				}
			}
			if n >= count {
				done <- true
				return
			}
		}
		done <- false
	}()
	return func() {
		t.Helper()
		if !<-done {
			t.Logf("the watch of %s* ended early; listing", prefix)
			waitAllSynced(ctx, t, r.c, want, 30*time.Minute)
		}
	}
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
	type usage struct {
		rate, provider, kcp, pds, kcpPerRecord, writes float64
		// breakdown of the writes and reads per record: the user's (or the
		// plain client's) writes, the provider's requests by method
		breakdown string
	}
	profiles := 0
	measure := func(run func(writes *atomic.Int64) error) usage {
		profiles++
		stopProfile := profileKCP(ctx, t, filepath.Join(env.dir, fmt.Sprintf("kcp-cpu-%d.pprof", profiles)))
		defer stopProfile()
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
		c0, r0 := cpu(), providerRequests(t)
		start := time.Now()
		if err := run(&writes); err != nil {
			t.Fatal(err)
		}
		el := time.Since(start).Seconds()
		c1, r1 := cpu(), providerRequests(t)
		if c1[0] < c0[0] { // the provider did not run
			c1[0] = c0[0]
		}
		u := usage{
			rate: float64(n) / el, provider: (c1[0] - c0[0]) / el, kcp: (c1[1] - c0[1]) / el, pds: (c1[2] - c0[2]) / el,
			kcpPerRecord: (c1[1] - c0[1]) / float64(n),
		}
		total := float64(writes.Load())
		u.breakdown = fmt.Sprintf("client %.2f", float64(writes.Load())/float64(n))
		for _, m := range []string{"POST", "PUT", "PATCH", "DELETE", "GET"} {
			d := r1[m] - r0[m]
			if d <= 0 {
				continue
			}
			if m != "GET" {
				total += d
			}
			u.breakdown += fmt.Sprintf(", provider %s %.2f", m, d/float64(n))
		}
		for _, c := range []string{"atprotorecord", "atprotorepo"} {
			if d := r1["reconcile "+c] - r0["reconcile "+c]; d > 0 {
				u.breakdown += fmt.Sprintf(", %s reconciles %.2f", c, d/float64(n))
			}
		}
		u.writes = total / float64(n)
		return u
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
		l += fmt.Sprintf("); kcp writes/record %.2f (%s), kcp CPU/record %.0f ms; CPU cores: provider %.2f, kcp %.2f, PDS %.2f", u.writes, u.breakdown, u.kcpPerRecord*1000, u.provider, u.kcp, u.pds)
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

		wait := watchSynced(ctx, t, one, mode.prefix, n, (round+1)*n)
		u := measure(func(writes *atomic.Int64) error {
			t0 := time.Now()
			if err := createAll(one.c, mode.prefix, n, writes); err != nil {
				return err
			}
			t.Logf("created %d records in %s", n, time.Since(t0))
			wait()
			return nil
		})
		line(fmt.Sprintf("knotless %s, 1 repo:", mode.name), u, declOne)

		waits := make([]func(), w)
		for i := range w {
			waits[i] = watchSynced(ctx, t, many[i], mode.prefix, n/w, (round+1)*(n/w))
		}
		u = measure(func(writes *atomic.Int64) error {
			g, _ := errgroup.WithContext(ctx)
			for i := range w {
				g.Go(func() error { return createAll(many[i].c, mode.prefix, n/w, writes) })
			}
			if err := g.Wait(); err != nil {
				return err
			}
			for _, wait := range waits {
				wait()
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

// profileKCP takes a CPU profile of the suite's kcp (its /debug/pprof)
// for 15 seconds, or less when the returned func is called
// earlier, into path; profiles show where kcp's CPU per record goes.
func profileKCP(ctx context.Context, t *testing.T, path string) func() {
	if env.kcp.Process == nil {
		return func() {}
	}
	// /debug/pprof needs system:masters: the shard admin (context
	// shard-base of kcp's admin kubeconfig).
	raw, err := clientcmd.LoadFromFile(env.kcp.Kubeconfig)
	if err != nil {
		return func() {}
	}
	cfg, err := clientcmd.NewNonInteractiveClientConfig(*raw, "shard-base", &clientcmd.ConfigOverrides{}, nil).ClientConfig()
	if err != nil {
		t.Logf("kcp profile: %v", err)
		return func() {}
	}
	base, err := bootstrap.BaseURL(cfg.Host)
	if err != nil {
		return func() {}
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return func() {}
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, err := http.NewRequestWithContext(pctx, http.MethodGet, base+"/debug/pprof/profile?seconds=15", nil)
		if err != nil {
			return
		}
		resp, err := hc.Do(req)
		if err != nil {
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Logf("kcp profile: %s", resp.Status)
			return
		}
		b, err := io.ReadAll(resp.Body)
		if err == nil {
			err = os.WriteFile(path, b, 0o644)
		}
		if err != nil {
			t.Logf("kcp profile: %v", err)
		}
	}()
	return func() {
		select {
		case <-done:
		case <-time.After(16 * time.Second):
		}
		cancel()
		<-done
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

// waitQuiet waits until the provider's record and repo controllers have
// no work queued or running, so a measurement does not include the
// start-up sync (the repos' checks and prunes included).
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
			for _, c := range []string{"atprotorecord", "atprotorepo"} {
				if (strings.HasPrefix(l, `workqueue_depth{controller="`+c+`"`) || strings.HasPrefix(l, `controller_runtime_active_workers{controller="`+c+`"`)) && !strings.HasSuffix(l, " 0") {
					busy = true
				}
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

// providerRequests is the number of requests the provider has made to
// kcp by method (client-go's rest_client_requests_total) and of its
// reconciles by "reconcile <controller>", none when it does not run.
func providerRequests(t *testing.T) map[string]float64 {
	out := map[string]float64{}
	if env.provider.Exited() {
		return out
	}
	m, err := env.provider.Metrics()
	if err != nil {
		t.Logf("reading provider metrics: %v", err)
		return out
	}
	for _, l := range strings.Split(m, "\n") {
		key, label := "", ""
		switch {
		case strings.HasPrefix(l, "rest_client_requests_total{"):
			label = `method="`
		case strings.HasPrefix(l, "controller_runtime_reconcile_total{"):
			label, key = `controller="`, "reconcile "
		default:
			continue
		}
		_, rest, ok := strings.Cut(l, label)
		name, _, _ := strings.Cut(rest, `"`)
		if i := strings.LastIndexByte(l, ' '); ok && i > 0 {
			v, _ := strconv.ParseFloat(l[i+1:], 64)
			out[key+name] += v
		}
	}
	return out
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

// watchClient is a kcp-admin client of workspace name (under the suite's
// root) that can watch: the benches count with one list and a watch
// rather than by listing again and again.
func watchClient(t *testing.T, name string) client.WithWatch {
	t.Helper()
	cfg, err := bootstrap.ForWorkspace(env.admin, root.Join(name))
	if err != nil {
		t.Fatal(err)
	}
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: framework.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return wc
}
