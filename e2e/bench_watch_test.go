package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/events"
	"github.com/bluesky-social/indigo/events/schedulers/sequential"
	"github.com/go-logr/logr"
	"github.com/gorilla/websocket"
	"golang.org/x/sync/errgroup"
	"sigs.k8s.io/controller-runtime/pkg/client"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

const benchCollection = "dev.knotless.bench.event"

// TestWatchThroughput prints the events/s internal/firehose (what every
// AtprotoRecordWatch runs on) sustains replaying N events from the local
// PDS, verifying every commit, next to indigo's own events consumer with a
// no-op handler reading the same stream (the ceiling), in the same run;
// then the lag from a write to the record being applied, and to it being
// visible in a watch's status in kcp, under a steady write load of R
// writes/s. Run with KNOTLESS_E2E_WATCH_BENCH=N[,R] (make bench-watch).
func TestWatchThroughput(t *testing.T) {
	spec := os.Getenv("KNOTLESS_E2E_WATCH_BENCH")
	if spec == "" {
		t.Skip("set KNOTLESS_E2E_WATCH_BENCH=N[,R] (make bench-watch) to run")
	}
	defer failWithLogs(t)
	parts := strings.Split(spec, ",")
	n, _ := strconv.Atoi(parts[0])
	rate := 20
	if len(parts) > 1 {
		rate, _ = strconv.Atoi(parts[1])
	}
	ctx := t.Context()

	// N events: four repos written in parallel.
	const repos = 4
	writers := make([]*writer, repos)
	for i := range writers {
		writers[i] = newWriter(ctx, t, fmt.Sprintf("%swb%d.test", env.prefix, i))
	}
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for i, w := range writers {
		g.Go(func() error {
			for j := range n / repos {
				if err := w.put(gctx, benchCollection, fmt.Sprintf("r%d-%05d", i, j), fmt.Sprintf("event %d", j)); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE %-44s %d commits in %s (%.1f/s)", "written to the PDS (4 repos in parallel):", n/repos*repos, time.Since(start).Round(time.Millisecond), float64(n/repos*repos)/time.Since(start).Seconds())

	// Ceiling: indigo's consumer, sequential scheduler, no-op handler.
	events1, head, took := indigoReplay(ctx, t)
	ceiling := float64(events1) / took.Seconds()
	t.Logf("FIGURE %-44s %d events in %s: %.0f events/s", "indigo consumer, no-op handler (ceiling):", events1, took.Round(time.Millisecond), ceiling)

	// knotless: the same stream through internal/firehose, every commit
	// verified (structure, prevData, signature via the PLC) and applied to
	// a subscription on every DID.
	dir := identity.NewCacheDirectory(&identity.BaseDirectory{PLCURL: env.plc.URL, SkipHandleVerification: true}, 10000, time.Hour, time.Minute, time.Minute)
	// Gather (the wait for more subscriptions before the first connection)
	// is not what is measured.
	hub, err := firehose.NewHub(firehose.Options{Directory: dir, Log: logr.Discard(), Gather: time.Millisecond,
		Policy: netpolicy.New([]netip.Prefix{netip.MustParsePrefix(framework.AllowedNetworks)}, nil)})
	if err != nil {
		t.Fatal(err)
	}
	hctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = hub.Start(hctx); close(done) }()
	defer func() { stop(); <-done }()
	start = time.Now()
	sub, err := hub.Subscribe(env.pds.URL, firehose.Filter{Collections: []string{benchCollection}}, 500, firehose.State{Cursor: 1})
	if err != nil {
		t.Fatal(err)
	}
	var st firehose.State
	for {
		st, _, _ = sub.Snapshot()
		if st.Cursor >= head {
			break
		}
		if time.Since(start) > 10*time.Minute {
			t.Fatalf("replay stuck at cursor %d of %d", st.Cursor, head)
		}
		time.Sleep(5 * time.Millisecond)
	}
	took = time.Since(start)
	knotless := float64(events1) / took.Seconds()
	t.Logf("FIGURE %-44s %d events in %s: %.0f events/s (%.2fx the ceiling); %d commits applied, %d matched ops, %d rejected, last resync %+v", "knotless firehose, verified + applied:", events1, took.Round(time.Millisecond), knotless, knotless/ceiling, st.Seen, st.Matched, st.Errors, st.LastResync)
	hub.Unsubscribe(sub)
	if st.Errors != 0 {
		t.Fatalf("%d events rejected on a healthy PDS", st.Errors)
	}

	// Lag under a steady load: one writer at rate/s, a live subscription
	// and an AtprotoRecordWatch in kcp on its DID.
	lw := newWriter(ctx, t, env.prefix+"wlag.test")
	c, _ := appWorkspace(ctx, t, env.prefix+"-watchbench")
	create(ctx, t, c, recordWatch("lag", []string{lw.account.DID}, benchCollection))
	waitWatch(ctx, t, c, "lag", "Following", time.Minute, watchReason(atprotov1alpha1.ReasonFollowing))
	live, err := hub.Subscribe(env.pds.URL, firehose.Filter{Collections: []string{benchCollection}, DIDs: []string{lw.account.DID}}, 500, firehose.State{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, h, _ := live.Snapshot(); h.Connected && !h.Resyncing {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var (
		mu       sync.Mutex
		written  = map[string]time.Time{}
		applied  = map[string]time.Duration{}
		inKCP    = map[string]time.Duration{}
		finished atomic.Bool
	)
	pg, pctx := errgroup.WithContext(ctx)
	pg.Go(func() error { // firehose: poll the subscription
		for !finished.Load() || len(applied) < len(written) {
			st, _, _ := live.Snapshot()
			now := time.Now()
			mu.Lock()
			for uri := range st.Records {
				if w, ok := written[uri]; ok {
					if _, seen := applied[uri]; !seen {
						applied[uri] = now.Sub(w)
					}
				}
			}
			mu.Unlock()
			if pctx.Err() != nil {
				return pctx.Err()
			}
			time.Sleep(2 * time.Millisecond)
		}
		return nil
	})
	pg.Go(func() error { // kcp: poll the watch's status
		for !finished.Load() || len(inKCP) < len(written) {
			w := &atprotov1alpha1.AtprotoRecordWatch{}
			if err := c.Get(pctx, client.ObjectKey{Namespace: "default", Name: "lag"}, w); err != nil {
				return err
			}
			now := time.Now()
			mu.Lock()
			for _, r := range w.Status.Records {
				if wt, ok := written[r.URI]; ok {
					if _, seen := inKCP[r.URI]; !seen {
						inKCP[r.URI] = now.Sub(wt)
					}
				}
			}
			mu.Unlock()
			time.Sleep(100 * time.Millisecond)
		}
		return nil
	})
	const seconds = 15
	tick := time.NewTicker(time.Second / time.Duration(rate))
	for i := range rate * seconds {
		<-tick.C
		rkey := fmt.Sprintf("lag%05d", i)
		if err := lw.put(ctx, benchCollection, rkey, "lag"); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		written["at://"+lw.account.DID+"/"+benchCollection+"/"+rkey] = time.Now()
		mu.Unlock()
	}
	tick.Stop()
	finished.Store(true)
	wait := make(chan error, 1)
	go func() { wait <- pg.Wait() }()
	select {
	case err := <-wait:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("not every write was seen: %d applied, %d in kcp, of %d", len(applied), len(inKCP), len(written))
	}
	t.Logf("FIGURE %-44s %s", fmt.Sprintf("lag write -> applied (%d/s for %ds):", rate, seconds), percentiles(applied))
	t.Logf("FIGURE %-44s %s", "lag write -> in the watch's status in kcp:", percentiles(inKCP))
}

func percentiles(m map[string]time.Duration) string {
	var d []time.Duration
	for _, v := range m {
		d = append(d, v)
	}
	slices.Sort(d)
	if len(d) == 0 {
		return "no samples"
	}
	at := func(p float64) time.Duration { return d[min(len(d)-1, int(p*float64(len(d))))] }
	return fmt.Sprintf("p50 %s, p99 %s, max %s (n=%d)", at(0.5).Round(time.Millisecond), at(0.99).Round(time.Millisecond), d[len(d)-1].Round(time.Millisecond), len(d))
}

// indigoReplay reads the PDS's firehose from cursor 1 with indigo's
// consumer and a no-op handler until it goes quiet for a second. It
// returns the events read, the last seq and the time to the last event.
func indigoReplay(ctx context.Context, t *testing.T) (int, int64, time.Duration) {
	t.Helper()
	u := "ws" + strings.TrimPrefix(env.pds.URL, "http") + "/xrpc/com.atproto.sync.subscribeRepos?cursor=1"
	start := time.Now()
	con, resp, err := websocket.DefaultDialer.DialContext(ctx, u, http.Header{})
	if err != nil {
		t.Fatal(err)
	}
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	var count atomic.Int64
	var last atomic.Int64
	var lastAt atomic.Int64
	sched := sequential.NewScheduler("ceiling", func(_ context.Context, ev *events.XRPCStreamEvent) error {
		count.Add(1)
		if seq, ok := ev.GetSequence(); ok {
			last.Store(seq)
		}
		lastAt.Store(time.Now().UnixNano())
		return nil
	})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		_ = events.HandleRepoStream(rctx, con, sched, nil)
		close(done)
	}()
	for {
		time.Sleep(100 * time.Millisecond)
		if at := lastAt.Load(); at != 0 && time.Since(time.Unix(0, at)) > time.Second {
			break
		}
	}
	cancel()
	_ = con.Close()
	<-done
	return int(count.Load()), last.Load(), time.Unix(0, lastAt.Load()).Sub(start)
}
