package atprotorecordwatch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	dto "github.com/prometheus/client_model/go"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/internal/backoff"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

func TestValidateNamesTheField(t *testing.T) {
	good := atprotov1alpha1.AtprotoRecordWatchSpec{
		Source:      atprotov1alpha1.WatchSource{URL: "https://pds.example"},
		Collections: []string{"dev.knotless.note"},
		DIDs:        []string{"did:plc:abc"},
	}
	if err := Validate(&good); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		edit func(*atprotov1alpha1.AtprotoRecordWatchSpec)
		want string
	}{
		{func(s *atprotov1alpha1.AtprotoRecordWatchSpec) { s.Source.URL = "wss://pds.example" }, "spec.source.url"},
		{func(s *atprotov1alpha1.AtprotoRecordWatchSpec) { s.Source.URL = "https://pds.example/xrpc" }, "spec.source.url"},
		{func(s *atprotov1alpha1.AtprotoRecordWatchSpec) {
			s.Collections = []string{"ok.nsid.here", "not an nsid"}
		}, "spec.collections[1]"},
		{func(s *atprotov1alpha1.AtprotoRecordWatchSpec) { s.DIDs = []string{"alice.test"} }, "spec.dids[0]"},
	} {
		s := good
		s.Collections = append([]string(nil), good.Collections...)
		tc.edit(&s)
		err := Validate(&s)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("got %v, want an error naming %s", err, tc.want)
		}
	}
}

// A status written from a state reads back as the same state, so a
// restarted provider resumes exactly where the status says.
func TestStatusRoundTrip(t *testing.T) {
	obj := &atprotov1alpha1.AtprotoRecordWatch{ObjectMeta: metav1.ObjectMeta{Generation: 3}}
	obj.Spec.Source.URL = "http://pds"
	big := `{"text":"` + strings.Repeat("x", ValueLimit) + `"}`
	st := firehose.State{
		Cursor: 42, Seen: 7, Matched: 9, Errors: 1, Evicted: 2,
		LastEventTime: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC),
		Records: firehose.LoadRecords([]firehose.Record{
			{URI: "at://did:plc:a/c.n/2", CID: "b2", Rev: "r2", Value: []byte(`{"text":"two"}`)},
			{URI: "at://did:plc:a/c.n/1", CID: "b1", Rev: "r1", Value: []byte(big)},
		}),
		Repos:      map[string]firehose.Repo{"did:plc:a": {Rev: "r2", Data: "d2"}},
		LastResync: &firehose.Resync{Reason: firehose.ResyncInitial, Time: time.Date(2026, 11, 29, 11, 0, 0, 0, time.UTC)},
	}
	status := buildStatus(obj, &obj.Status, st, firehose.Health{Connected: true})
	if status.Records[0].URI != "at://did:plc:a/c.n/2" || status.Records[1].Value != nil || status.Records[1].ValueBytes != int32(len(big)) {
		t.Fatalf("records %+v: want newest first, the big value left out with its size", status.Records)
	}
	if c := status.Conditions[0]; c.Reason != atprotov1alpha1.ReasonFollowing || c.Status != metav1.ConditionTrue {
		t.Fatalf("condition %+v", c)
	}
	again := buildStatus(obj, status, stateFromStatus(status), firehose.Health{Connected: true})
	if !apiequality.Semantic.DeepEqual(status, again) {
		t.Fatalf("round trip changed the status:\n%+v\n%+v", status, again)
	}
	down := buildStatus(obj, status, st, firehose.Health{Err: errors.New("dial tcp: connection refused")})
	if c := down.Conditions[0]; c.Reason != atprotov1alpha1.ReasonSourceUnreachable || !strings.Contains(c.Message, "connection refused") {
		t.Fatalf("condition while down %+v", c)
	}
}

// A listing refused as too large by the hub's limits is ListingTooLarge
// on Ready, with the hub's message (which bound), not Resyncing.
func TestListingTooLargeShowsOnReady(t *testing.T) {
	obj := &atprotov1alpha1.AtprotoRecordWatch{}
	obj.Spec.Source.URL = "http://pds"
	tooLarge := fmt.Errorf("listing the repos of http://pds: %w", firehose.ErrListingTooLarge)
	c := buildStatus(obj, &obj.Status, firehose.State{}, firehose.Health{Connected: true, Resyncing: true, Full: true, ResyncErr: tooLarge}).Conditions[0]
	if c.Status != metav1.ConditionFalse || c.Reason != atprotov1alpha1.ReasonListingTooLarge || c.Message != tooLarge.Error() {
		t.Fatalf("condition %+v, want False/ListingTooLarge with the listing's error", c)
	}
}

// An address the policy refuses, for the connection or for a listing, is
// named as such on Ready; other listing failures stay Resyncing with the
// error.
func TestRefusedAddressesShowOnReady(t *testing.T) {
	obj := &atprotov1alpha1.AtprotoRecordWatch{}
	obj.Spec.Source.URL = "http://pds"
	denied := fmt.Errorf("connecting to http://pds: %w", &net.OpError{Op: "dial", Net: "tcp", Err: &netpolicy.DeniedError{Addr: netip.MustParseAddrPort("10.0.0.1:80"), Reason: "private"}})
	for _, tc := range []struct {
		health firehose.Health
		reason string
	}{
		{firehose.Health{Err: denied}, atprotov1alpha1.ReasonAddressNotAllowed},
		{firehose.Health{Connected: true, Resyncing: true, ResyncErr: denied}, atprotov1alpha1.ReasonAddressNotAllowed},
		{firehose.Health{Connected: true, Resyncing: true, ResyncErr: errors.New("API request failed (HTTP 302)")}, atprotov1alpha1.ReasonResyncing},
	} {
		c := buildStatus(obj, &obj.Status, firehose.State{}, tc.health).Conditions[0]
		if c.Status != metav1.ConditionFalse || c.Reason != tc.reason || c.Message == "" {
			t.Fatalf("health %+v: condition %+v, want %s", tc.health, c, tc.reason)
		}
		if !strings.Contains(c.Message, "not allowed") && !strings.Contains(c.Message, "302") {
			t.Fatalf("message %q does not name the failure", c.Message)
		}
	}
}

const (
	lc = "2x7uf0bml0q9ms3b"
	ns = "shop"
)

// newHub returns a hub that dials nothing but public addresses
// (netpolicy.New(nil, nil) refuses loopback) and its metrics. Unless
// started, it connects nowhere: its subscriptions stay Connecting.
func newHub(t *testing.T, start bool) (*firehose.Hub, *firehose.Metrics) {
	t.Helper()
	m, err := firehose.NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := firehose.NewHub(firehose.Options{
		Directory: identity.NewMockDirectory(), Policy: netpolicy.New(nil, nil), Metrics: m,
		Gather: 10 * time.Millisecond, Backoff: backoff.Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	if start {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			_ = h.Start(ctx)
			close(done)
		}()
		t.Cleanup(func() {
			cancel()
			<-done
		})
	}
	return h, m
}

// subscriptions is the number of subscriptions the hub holds (every
// source here is labelled "other").
func subscriptions(t *testing.T, m *firehose.Metrics) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Subscriptions.WithLabelValues("other").Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetGauge().GetValue()
}

func watchOf(url string, collections ...string) *atprotov1alpha1.AtprotoRecordWatch {
	return &atprotov1alpha1.AtprotoRecordWatch{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "watch", UID: "watch-uid", Generation: 1},
		Spec:       atprotov1alpha1.AtprotoRecordWatchSpec{Source: atprotov1alpha1.WatchSource{URL: url}, Collections: collections},
	}
}

func setup(h *firehose.Hub, objs ...client.Object) (*Reconciler, *clustertest.Cluster) {
	ws := clustertest.New(objs...)
	return &Reconciler{GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{lc: ws}), Hub: h}, ws
}

func reconcileWatch(t *testing.T, r *Reconciler) reconcile.Result {
	t.Helper()
	res, err := r.Reconcile(context.Background(), mcreconcile.Request{ClusterName: lc, Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "watch"}}})
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	return res
}

func getWatch(t *testing.T, ws *clustertest.Cluster) *atprotov1alpha1.AtprotoRecordWatch {
	t.Helper()
	w := &atprotov1alpha1.AtprotoRecordWatch{}
	if err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "watch"}, w); err != nil {
		t.Fatal(err)
	}
	return w
}

func (r *Reconciler) subscribed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.watches)
}

// A watch whose spec Validate refuses is Ready=False/InvalidSpec naming
// the field, is not subscribed and is not requeued; an unchanged status is
// not written again.
func TestInvalidWatchIsInvalidSpecWithoutSubscription(t *testing.T) {
	for _, tc := range []struct {
		name  string
		watch *atprotov1alpha1.AtprotoRecordWatch
		field string
	}{
		{"bad NSID", watchOf("https://pds.example", "dev.knotless.note", "not an nsid"), "spec.collections[1]"},
		{"websocket URL", watchOf("wss://pds.example", "dev.knotless.note"), "spec.source.url"},
		{"URL with a path", watchOf("https://pds.example/xrpc", "dev.knotless.note"), "spec.source.url"},
		{"bad DID", func() *atprotov1alpha1.AtprotoRecordWatch {
			w := watchOf("https://pds.example", "dev.knotless.note")
			w.Spec.DIDs = []string{"alice.test"}
			return w
		}(), "spec.dids[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, m := newHub(t, false)
			r, ws := setup(h, tc.watch)
			if res := reconcileWatch(t, r); res != (reconcile.Result{}) {
				t.Fatalf("result %+v: an invalid spec waits for a change, not a requeue", res)
			}
			w := getWatch(t, ws)
			c := clustertest.Condition(t, w.Status.Conditions, atprotov1alpha1.ConditionReady)
			if c.Status != metav1.ConditionFalse || c.Reason != atprotov1alpha1.ReasonInvalidSpec || !strings.Contains(c.Message, tc.field) ||
				c.ObservedGeneration != 1 || w.Status.ObservedGeneration != 1 {
				t.Fatalf("status %+v, want Ready=False/InvalidSpec naming %s", w.Status, tc.field)
			}
			if n, s := r.subscribed(), subscriptions(t, m); n != 0 || s != 0 {
				t.Fatalf("%d watches, %v hub subscriptions for an invalid spec", n, s)
			}
			reconcileWatch(t, r)
			if again := getWatch(t, ws); again.ResourceVersion != w.ResourceVersion {
				t.Fatal("an unchanged InvalidSpec status was written again")
			}
		})
	}
}

// A valid watch subscribes once on the hub, reports Connecting while the
// (unstarted) hub has not connected, and is requeued to flush; a spec
// that becomes invalid drops the subscription.
func TestValidWatchSubscribesAndReportsConnecting(t *testing.T) {
	ctx := context.Background()
	h, m := newHub(t, false)
	r, ws := setup(h, watchOf("https://pds.example", "dev.knotless.note"))
	if res := reconcileWatch(t, r); res.RequeueAfter != 2*time.Second {
		t.Fatalf("result %+v, want the default flush interval", res)
	}
	w := getWatch(t, ws)
	if c := clustertest.Condition(t, w.Status.Conditions, atprotov1alpha1.ConditionReady); c.Status != metav1.ConditionFalse || c.Reason != atprotov1alpha1.ReasonConnecting || !strings.Contains(c.Message, "https://pds.example") || c.ObservedGeneration != 1 {
		t.Fatalf("Ready = %+v, want Connecting", c)
	}
	if w.Status.ObservedGeneration != 1 || w.Status.Cursor != 0 || len(w.Status.Records) != 0 {
		t.Fatalf("status %+v", w.Status)
	}
	if n, s := r.subscribed(), subscriptions(t, m); n != 1 || s != 1 {
		t.Fatalf("%d watches, %v hub subscriptions; want 1", n, s)
	}
	r.mu.Lock()
	sub := r.watches[lc+"|"+ns+"/watch"].sub
	r.mu.Unlock()

	r.FlushInterval = 5 * time.Second
	if res := reconcileWatch(t, r); res.RequeueAfter != 5*time.Second {
		t.Fatalf("result %+v, want FlushInterval", res)
	}
	r.mu.Lock()
	same := r.watches[lc+"|"+ns+"/watch"].sub == sub
	r.mu.Unlock()
	if !same || subscriptions(t, m) != 1 {
		t.Fatal("an unchanged watch subscribed again")
	}

	// The spec changes to an invalid one: the subscription goes.
	w = getWatch(t, ws)
	w.Spec.Collections = []string{"not an nsid"}
	w.Generation = 2
	if err := ws.Client.Update(ctx, w); err != nil {
		t.Fatal(err)
	}
	reconcileWatch(t, r)
	if c := clustertest.Condition(t, getWatch(t, ws).Status.Conditions, atprotov1alpha1.ConditionReady); c.Reason != atprotov1alpha1.ReasonInvalidSpec || c.ObservedGeneration != 2 {
		t.Fatalf("Ready = %+v, want InvalidSpec for generation 2", c)
	}
	if n, s := r.subscribed(), subscriptions(t, m); n != 0 || s != 0 {
		t.Fatalf("%d watches, %v hub subscriptions after the spec became invalid", n, s)
	}
}

// A source the address policy refuses (loopback, with a policy that
// allows only public addresses) is reported as AddressNotAllowed; no
// connection is made, so nothing listens on the port.
func TestRefusedSourceIsAddressNotAllowed(t *testing.T) {
	h, _ := newHub(t, true)
	r, ws := setup(h, watchOf("http://127.0.0.1:9", "dev.knotless.note"))
	deadline := time.Now().Add(10 * time.Second)
	var c *metav1.Condition
	for {
		reconcileWatch(t, r)
		c = clustertest.Condition(t, getWatch(t, ws).Status.Conditions, atprotov1alpha1.ConditionReady)
		if c.Reason != atprotov1alpha1.ReasonConnecting || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if c.Status != metav1.ConditionFalse || c.Reason != atprotov1alpha1.ReasonAddressNotAllowed || !strings.Contains(c.Message, "not allowed") {
		t.Fatalf("Ready = %+v, want AddressNotAllowed", c)
	}
}

// A watch that is gone, or being deleted, is unsubscribed from the hub.
func TestDeletedWatchIsUnsubscribed(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		finalizers []string
	}{
		{"gone", nil},
		{"being deleted", []string{"test.knotless.dev/hold"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, m := newHub(t, false)
			obj := watchOf("https://pds.example", "dev.knotless.note")
			obj.Finalizers = tc.finalizers
			r, ws := setup(h, obj)
			reconcileWatch(t, r)
			if n, s := r.subscribed(), subscriptions(t, m); n != 1 || s != 1 {
				t.Fatalf("%d watches, %v hub subscriptions; want 1", n, s)
			}
			if err := ws.Client.Delete(ctx, getWatch(t, ws)); err != nil {
				t.Fatal(err)
			}
			if res := reconcileWatch(t, r); res != (reconcile.Result{}) {
				t.Fatalf("result %+v", res)
			}
			if n, s := r.subscribed(), subscriptions(t, m); n != 0 || s != 0 {
				t.Fatalf("%d watches, %v hub subscriptions after the deletion", n, s)
			}
		})
	}
}
