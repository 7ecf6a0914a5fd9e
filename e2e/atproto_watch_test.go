package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/netpolicy/nettest"
)

// watchCollection is written only by TestAtprotoRecordWatch, so a watch
// on every DID sees no other test's records.
const watchCollection = "dev.knotless.test.watched"

func recordWatch(name string, dids []string, collections ...string) *atprotov1alpha1.AtprotoRecordWatch {
	return &atprotov1alpha1.AtprotoRecordWatch{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: atprotov1alpha1.AtprotoRecordWatchSpec{
			Source:      atprotov1alpha1.WatchSource{URL: env.pds.URL},
			Collections: collections,
			DIDs:        dids,
		},
	}
}

// waitWatch polls a watch until ok accepts it and returns it.
func waitWatch(ctx context.Context, t *testing.T, c client.Client, name, what string, timeout time.Duration, ok func(*atprotov1alpha1.AtprotoRecordWatch) (bool, string)) *atprotov1alpha1.AtprotoRecordWatch {
	t.Helper()
	w := &atprotov1alpha1.AtprotoRecordWatch{}
	if err := framework.Eventually(ctx, timeout, "watch "+name+": "+what, func(ctx context.Context) (bool, string, error) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, w); err != nil {
			return false, err.Error(), nil
		}
		done, detail := ok(w)
		return done, detail + " | " + watchSummary(w), nil
	}); err != nil {
		t.Fatal(err)
	}
	return w
}

func watchSummary(w *atprotov1alpha1.AtprotoRecordWatch) string {
	s := w.Status
	cond := "no Ready condition"
	for _, c := range s.Conditions {
		if c.Type == atprotov1alpha1.ConditionReady {
			cond = fmt.Sprintf("Ready=%s %s: %s", c.Status, c.Reason, c.Message)
		}
	}
	return fmt.Sprintf("%s; cursor %d, seen %d, matched %d, errors %d, records %d", cond, s.Cursor, s.Seen, s.Matched, s.Errors, len(s.Records))
}

func watchReason(reason string) func(*atprotov1alpha1.AtprotoRecordWatch) (bool, string) {
	return func(w *atprotov1alpha1.AtprotoRecordWatch) (bool, string) {
		for _, c := range w.Status.Conditions {
			if c.Type == atprotov1alpha1.ConditionReady && c.Reason == reason && c.ObservedGeneration == w.Generation {
				return true, ""
			}
		}
		return false, "want reason " + reason
	}
}

// writer writes records to a repo as a plain ATProto client would, and
// remembers what the repo holds.
type writer struct {
	account *framework.Account
	token   string
	mu      sync.Mutex
	// want maps at-URI to CID of every record that should exist.
	want map[string]string
	ops  int
}

func newWriter(ctx context.Context, t *testing.T, handle string) *writer {
	t.Helper()
	a, err := env.pds.CreateAccount(ctx, handle)
	if err != nil {
		t.Fatal(err)
	}
	return &writer{account: a, token: a.AccessJWT, want: map[string]string{}}
}

func (w *writer) put(ctx context.Context, collection, rkey, text string) error {
	var out struct {
		URI string `json:"uri"`
		CID string `json:"cid"`
	}
	in := map[string]any{"repo": w.account.DID, "collection": collection, "rkey": rkey, "record": map[string]any{"$type": collection, "text": text}}
	if err := env.pds.XRPC(ctx, "com.atproto.repo.putRecord", w.token, nil, in, &out); err != nil {
		return fmt.Errorf("put %s/%s: %w", collection, rkey, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.want[out.URI] = out.CID
	w.ops++
	return nil
}

func (w *writer) del(ctx context.Context, collection, rkey string) error {
	in := map[string]any{"repo": w.account.DID, "collection": collection, "rkey": rkey}
	if err := env.pds.XRPC(ctx, "com.atproto.repo.deleteRecord", w.token, nil, in, nil); err != nil {
		return fmt.Errorf("delete %s/%s: %w", collection, rkey, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.want, "at://"+w.account.DID+"/"+collection+"/"+rkey)
	w.ops++
	return nil
}

func (w *writer) latestRev(ctx context.Context) (string, error) {
	var out struct {
		Rev string `json:"rev"`
	}
	err := env.pds.XRPC(ctx, "com.atproto.sync.getLatestCommit", "", url.Values{"did": {w.account.DID}}, nil, &out)
	return out.Rev, err
}

// only keeps the wanted records of one collection.
func (w *writer) only(collection string) map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]string{}
	for uri, cid := range w.want {
		if strings.Contains(uri, "/"+collection+"/") {
			out[uri] = cid
		}
	}
	return out
}

func watchedRecords(w *atprotov1alpha1.AtprotoRecordWatch) map[string]string {
	out := map[string]string{}
	for _, r := range w.Status.Records {
		out[r.URI] = r.CID
	}
	return out
}

func sameRecords(want map[string]string) func(*atprotov1alpha1.AtprotoRecordWatch) (bool, string) {
	return func(w *atprotov1alpha1.AtprotoRecordWatch) (bool, string) {
		got := watchedRecords(w)
		if maps.Equal(got, want) {
			return true, ""
		}
		var missing, extra []string
		for uri, cid := range want {
			if got[uri] != cid {
				missing = append(missing, uri)
			}
		}
		for uri := range got {
			if _, ok := want[uri]; !ok {
				extra = append(extra, uri)
			}
		}
		slices.Sort(missing)
		slices.Sort(extra)
		return false, fmt.Sprintf("%d missing or stale %v, %d extra %v", len(missing), head(missing), len(extra), head(extra))
	}
}

func head(s []string) []string {
	if len(s) > 3 {
		return s[:3]
	}
	return s
}

func metricValue(t *testing.T, name, source string) string {
	t.Helper()
	text, err := env.provider.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, name+"{") && strings.Contains(line, `source="`+source+`"`) {
			return line[strings.LastIndex(line, " ")+1:]
		}
	}
	return ""
}

// TestAtprotoRecordWatch: watches on one collection see records created,
// updated and deleted by a plain client, in order; other collections and
// DIDs are not reported; records that existed before the watch are listed;
// watches in two workspaces share one connection.
func TestAtprotoRecordWatch(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	alice := newWriter(ctx, t, env.prefix+"wa.test")
	bob := newWriter(ctx, t, env.prefix+"wb.test")
	const other = "dev.knotless.test.other"
	// Written before any watch exists: found by the initial listing.
	for _, err := range []error{alice.put(ctx, watchCollection, "before", "before"), bob.put(ctx, watchCollection, "before", "before")} {
		if err != nil {
			t.Fatal(err)
		}
	}

	c1, _ := appWorkspace(ctx, t, env.prefix+"-watch1")
	c2, _ := appWorkspace(ctx, t, env.prefix+"-watch2")
	create(ctx, t, c1, recordWatch("alice-notes", []string{alice.account.DID}, watchCollection))
	create(ctx, t, c2, recordWatch("all-notes", nil, watchCollection))
	waitWatch(ctx, t, c1, "alice-notes", "Following", time.Minute, watchReason(atprotov1alpha1.ReasonFollowing))
	waitWatch(ctx, t, c2, "all-notes", "Following", time.Minute, watchReason(atprotov1alpha1.ReasonFollowing))
	w := waitWatch(ctx, t, c1, "alice-notes", "the record written before it", time.Minute, sameRecords(alice.only(watchCollection)))
	if w.Status.LastResync == nil || w.Status.LastResync.Reason != "Initial" {
		t.Fatalf("lastResync %+v, want the Initial listing", w.Status.LastResync)
	}
	if got := metricValue(t, "knotless_firehose_subscriptions", pdsMetricSource()); got != "2" {
		t.Fatalf("subscriptions on the PDS: %q, want 2 (two workspaces)", got)
	}
	if got := metricValue(t, "knotless_firehose_connected", pdsMetricSource()); got != "1" {
		t.Fatalf("connections to the PDS: %q, want 1 shared by both watches", got)
	}

	steps := []func() error{
		func() error { return alice.put(ctx, watchCollection, "n1", "one") },
		func() error { return alice.put(ctx, other, "x", "other collection") },
		func() error { return bob.put(ctx, watchCollection, "b1", "bob's") },
		func() error { return alice.put(ctx, watchCollection, "n1", "two") },
		func() error { return alice.put(ctx, watchCollection, "n2", "three") },
		func() error { return alice.del(ctx, watchCollection, "n2") },
		func() error { return alice.put(ctx, watchCollection, "n1", "four") },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	wantAlice := alice.only(watchCollection)
	waitWatch(ctx, t, c1, "alice-notes", "alice's notes after the writes", time.Minute, sameRecords(wantAlice))
	// create n1, update n1, create n2, delete n2, update n1: applied in
	// order, each once (the last update wins, n2 is gone).
	w = waitWatch(ctx, t, c1, "alice-notes", "5 matched operations", 30*time.Second, func(w *atprotov1alpha1.AtprotoRecordWatch) (bool, string) {
		return w.Status.Matched == 5, fmt.Sprintf("matched %d", w.Status.Matched)
	})
	for _, r := range w.Status.Records {
		if strings.HasSuffix(r.URI, "/n1") {
			if r.Value == nil || !strings.Contains(string(r.Value.Raw), `"four"`) {
				t.Fatalf("n1 value %v, want the last update", r.Value)
			}
		}
	}
	rev, err := alice.latestRev(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Status.Repos) != 1 || w.Status.Repos[0].DID != alice.account.DID || w.Status.Repos[0].Rev != rev {
		t.Fatalf("repos %+v, want only alice at rev %s", w.Status.Repos, rev)
	}
	if w.Status.Errors != 0 || w.Status.Cursor == 0 || w.Status.LastEventTime == nil {
		t.Fatalf("errors %d cursor %d lastEventTime %v", w.Status.Errors, w.Status.Cursor, w.Status.LastEventTime)
	}

	all := alice.only(watchCollection)
	maps.Copy(all, bob.only(watchCollection))
	waitWatch(ctx, t, c2, "all-notes", "every DID's notes", time.Minute, func(w *atprotov1alpha1.AtprotoRecordWatch) (bool, string) {
		// Other tests' accounts may write the same collection: compare
		// only alice's and bob's.
		got := map[string]string{}
		for uri, cid := range watchedRecords(w) {
			if strings.Contains(uri, alice.account.DID) || strings.Contains(uri, bob.account.DID) {
				got[uri] = cid
			}
		}
		return maps.Equal(got, all), fmt.Sprintf("%d of %d", len(got), len(all))
	})

	// A bad spec is refused at admission, naming the field.
	w = waitWatch(ctx, t, c1, "alice-notes", "current", time.Second, func(*atprotov1alpha1.AtprotoRecordWatch) (bool, string) { return true, "" })
	w.Spec.Collections = []string{"not an nsid"}
	if err := c1.Update(ctx, w); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.collections[0]") {
		t.Errorf("a collection that is not an NSID: %v, want Invalid naming spec.collections[0]", err)
	}
}

// followedRepo creates an account (handle <prefix><h>.test) and a workspace
// (<prefix>-<ws>) with a Following watch "notes" on the account's
// testCollection records.
func followedRepo(ctx context.Context, t *testing.T, h, ws string) (*writer, client.Client) {
	t.Helper()
	wr := newWriter(ctx, t, env.prefix+h+".test")
	c, _ := appWorkspace(ctx, t, env.prefix+"-"+ws)
	create(ctx, t, c, recordWatch("notes", []string{wr.account.DID}, testCollection))
	waitWatch(ctx, t, c, "notes", "Following", time.Minute, watchReason(atprotov1alpha1.ReasonFollowing))
	return wr, c
}

// TestAtprotoRecordWatchSurvivesProviderKill: the provider is killed (-9)
// while records are written; after the restart the watch holds exactly the
// records written, and each operation was matched once.
func TestAtprotoRecordWatchSurvivesProviderKill(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	wr, c := followedRepo(ctx, t, "wk", "watchkill")

	const n = 80
	errs := make(chan error, 1)
	go func() {
		defer close(errs)
		for i := range n {
			var err error
			switch i % 10 {
			case 9: // delete an earlier record
				err = wr.del(ctx, testCollection, fmt.Sprintf("k%03d", i-5))
			case 7: // update an earlier record
				err = wr.put(ctx, testCollection, fmt.Sprintf("k%03d", i-3), fmt.Sprintf("update %d", i))
			default:
				err = wr.put(ctx, testCollection, fmt.Sprintf("k%03d", i), fmt.Sprintf("v%d", i))
			}
			if err != nil {
				errs <- err
				return
			}
			time.Sleep(40 * time.Millisecond)
		}
	}()
	// Kill once the watch has persisted some, but not all, events.
	waitWatch(ctx, t, c, "notes", "some records persisted", time.Minute, func(w *atprotov1alpha1.AtprotoRecordWatch) (bool, string) {
		return len(w.Status.Records) >= 10, ""
	})
	env.provider.Kill9()
	before := &atprotov1alpha1.AtprotoRecordWatch{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "notes"}, before); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed the provider at cursor %d with %d records persisted", before.Status.Cursor, len(before.Status.Records))
	if err := env.provider.Restart(ctx, env.group); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	waitWatch(ctx, t, c, "notes", "exactly the records written", 2*time.Minute, sameRecords(wr.only(testCollection)))
	w := waitWatch(ctx, t, c, "notes", "each operation matched once", 30*time.Second, func(w *atprotov1alpha1.AtprotoRecordWatch) (bool, string) {
		return w.Status.Matched == int64(wr.ops), fmt.Sprintf("matched %d, operations %d", w.Status.Matched, wr.ops)
	})
	if w.Status.LastResync == nil || w.Status.LastResync.Reason != "Initial" || w.Status.Errors != 0 {
		t.Fatalf("after the restart: lastResync %+v, errors %d; want only the initial listing and no errors", w.Status.LastResync, w.Status.Errors)
	}
	if w.Status.Cursor <= before.Status.Cursor {
		t.Fatalf("cursor %d did not advance past %d", w.Status.Cursor, before.Status.Cursor)
	}
}

// TestAtprotoRecordWatchPDSRestart: a stopped PDS makes the watch say
// SourceUnreachable; once it is back the watch reconnects from its cursor
// and loses nothing written before the stop or after the start.
func TestAtprotoRecordWatchPDSRestart(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	wr, c := followedRepo(ctx, t, "wp", "watchpds")
	for i := range 5 {
		if err := wr.put(ctx, testCollection, fmt.Sprintf("a%d", i), "before the stop"); err != nil {
			t.Fatal(err)
		}
	}
	env.pds.Stop(20 * time.Second)
	defer func() {
		if env.pds.Exited() {
			if err := env.pds.Restart(context.WithoutCancel(ctx), env.group); err != nil {
				t.Errorf("restarting the PDS: %v", err)
			}
		}
	}()
	waitWatch(ctx, t, c, "notes", "SourceUnreachable", time.Minute, watchReason(atprotov1alpha1.ReasonSourceUnreachable))
	if err := env.pds.Restart(ctx, env.group); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := wr.put(ctx, testCollection, fmt.Sprintf("b%d", i), "after the start"); err != nil {
			t.Fatal(err)
		}
	}
	waitWatch(ctx, t, c, "notes", "Following again", 2*time.Minute, watchReason(atprotov1alpha1.ReasonFollowing))
	w := waitWatch(ctx, t, c, "notes", "all 10 records", time.Minute, sameRecords(wr.only(testCollection)))
	if w.Status.Matched != 10 || w.Status.Errors != 0 {
		t.Fatalf("matched %d errors %d, want 10 and 0", w.Status.Matched, w.Status.Errors)
	}
	if got := metricValue(t, "knotless_firehose_reconnects_total", pdsMetricSource()); got == "" {
		t.Fatal("no reconnect counted")
	}
}

// pdsMetricSource is the PDS's label in the firehose metrics: its
// host:port, which the suite's provider names in --firehose-metric-sources.
func pdsMetricSource() string { return strings.TrimPrefix(env.pds.URL, "http://") }

// TestAtprotoWatchSurvivesDeadNeighbour: mallory, with an account on the
// shared PDS, points her DID document at a closed port. A watch of every
// repo of that PDS still lists alice's record and follows, mallory's repo
// counted as an error. Before, the watch's whole listing failed on
// mallory's repo and was retried forever (R21): anyone with an account
// on a PDS could stall every watch and market feed of it. Costs about
// 5 s of the suite, and a restart of the provider.
func TestAtprotoWatchSurvivesDeadNeighbour(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	const collection = "dev.knotless.test.neighbour"
	alice := newWriter(ctx, t, env.prefix+"dna.test")
	if err := alice.put(ctx, collection, "hello", "a neighbour"); err != nil {
		t.Fatal(err)
	}
	mallory, err := env.pds.CreateAccount(ctx, env.prefix+"dnm.test")
	if err != nil {
		t.Fatal(err)
	}
	movePDSEndpoint(ctx, t, mallory.DID, "http://"+nettest.ClosedAddr(t))
	// The provider may have read mallory's document before the move (to
	// verify her account's first commit for another test's watch of this
	// PDS) and keeps it for an hour: kill and restart it, so that it
	// reads the moved one (every watch of this PDS lists it again then).
	env.provider.Kill9()
	if err := env.provider.Restart(ctx, env.group); err != nil {
		t.Fatal(err)
	}

	c, _ := appWorkspace(ctx, t, env.prefix+"-neighbour")
	create(ctx, t, c, recordWatch("all", nil, collection))
	w := waitWatch(ctx, t, c, "all", "alice's record, Following", 3*time.Minute, func(w *atprotov1alpha1.AtprotoRecordWatch) (bool, string) {
		if ok, why := watchReason(atprotov1alpha1.ReasonFollowing)(w); !ok {
			return false, why
		}
		got := watchedRecords(w)
		for uri, cid := range alice.only(collection) {
			if got[uri] != cid {
				return false, "alice's record not listed"
			}
		}
		return true, ""
	})
	if w.Status.Errors == 0 {
		t.Errorf("errors %d, want mallory's repo counted", w.Status.Errors)
	}
	for _, r := range w.Status.Repos {
		if r.DID == mallory.DID {
			t.Errorf("mallory's repo listed: %+v", r)
		}
	}
}
