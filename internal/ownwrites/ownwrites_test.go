package ownwrites

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/ssa"
)

// lagging writes to server and reads from cached, which the test brings
// up to date by hand (a watch that runs behind).
type lagging struct {
	client.Client
	cached map[client.ObjectKey]client.Object
}

func (l *lagging) Get(_ context.Context, k client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	o, ok := l.cached[k]
	if !ok || reflect.TypeOf(o) != reflect.TypeOf(obj) {
		return apierrors.NewNotFound(schema.GroupResource{}, k.Name)
	}
	setInto(obj, o)
	return nil
}

func (l *lagging) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	o := (&client.ListOptions{}).ApplyOptions(opts)
	item := reflect.PointerTo(reflect.ValueOf(list).Elem().FieldByName("Items").Type().Elem())
	var out []runtime.Object
	for _, obj := range l.cached {
		if reflect.TypeOf(obj) == item && (o.Namespace == "" || obj.GetNamespace() == o.Namespace) &&
			(o.LabelSelector == nil || o.LabelSelector.Matches(labels.Set(obj.GetLabels()))) {
			out = append(out, obj.DeepCopyObject())
		}
	}
	return meta.SetList(list, out)
}

// fakeWithWatch makes a lagging a client.WithWatch (for the interceptor).
type fakeWithWatch struct{ *lagging }

func (f fakeWithWatch) Watch(context.Context, client.ObjectList, ...client.ListOption) (watch.Interface, error) {
	return nil, errors.New("no watch")
}

// catchUp copies the server's object into the cache (or removes it).
func (l *lagging) catchUp(t *testing.T, obj client.Object) {
	t.Helper()
	got := obj.DeepCopyObject().(client.Object)
	switch err := l.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), got); {
	case apierrors.IsNotFound(err):
		delete(l.cached, client.ObjectKeyFromObject(obj))
	case err != nil:
		t.Fatal(err)
	default:
		l.cached[client.ObjectKeyFromObject(obj)] = got
	}
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func setup(t *testing.T, objs ...client.Object) (*lagging, *Store, *clock, client.Client) {
	t.Helper()
	server := clustertest.NewClientBuilder().WithObjects(objs...).Build()
	l := &lagging{Client: server, cached: map[client.ObjectKey]client.Object{}}
	for _, o := range objs {
		l.catchUp(t, o)
	}
	clk := &clock{t: time.Unix(1000, 0)}
	s := New(clk.now)
	return l, s, clk, s.Client("ws1", l)
}

func TestStatusWriteIsReadBackBeforeTheCacheHasIt(t *testing.T) {
	ctx := context.Background()
	mr := &marketv1alpha1.MarketRequester{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mr"}}
	l, s, _, c := setup(t, mr)

	got := &marketv1alpha1.MarketRequester{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(mr), got); err != nil {
		t.Fatal(err)
	}
	want := got.Status.DeepCopy()
	want.Phase = marketv1alpha1.PhasePending
	if err := ssa.WriteStatus(ctx, c, got, &got.Status, want, ssa.StatusOptions{Manager: "m"}); err != nil {
		t.Fatal(err)
	}
	// The cache still has no phase; the wrapped client reads the write.
	raw := &marketv1alpha1.MarketRequester{}
	if err := l.Get(ctx, client.ObjectKeyFromObject(mr), raw); err != nil || raw.Status.Phase != "" {
		t.Fatalf("the cache should lag: %q %v", raw.Status.Phase, err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(mr), got); err != nil || got.Status.Phase != marketv1alpha1.PhasePending {
		t.Fatalf("read after write: %q %v, want Pending", got.Status.Phase, err)
	}
	var list marketv1alpha1.MarketRequesterList
	if err := c.List(ctx, &list, client.InNamespace("ns")); err != nil || len(list.Items) != 1 || list.Items[0].Status.Phase != marketv1alpha1.PhasePending {
		t.Fatalf("list after write: %+v %v", list.Items, err)
	}
	// A second pass that decides the same status writes nothing.
	before := got.ResourceVersion
	if err := ssa.WriteStatus(ctx, c, got, &got.Status, want, ssa.StatusOptions{Manager: "m"}); err != nil {
		t.Fatal(err)
	}
	srv := &marketv1alpha1.MarketRequester{}
	if err := l.Client.Get(ctx, client.ObjectKeyFromObject(mr), srv); err != nil || srv.ResourceVersion != before {
		t.Fatalf("an unchanged status was written again: %s -> %s (%v)", before, srv.ResourceVersion, err)
	}

	// Once the cache has caught up, the store lets go.
	l.catchUp(t, mr)
	if err := c.Get(ctx, client.ObjectKeyFromObject(mr), got); err != nil || got.Status.Phase != marketv1alpha1.PhasePending {
		t.Fatalf("after catching up: %q %v", got.Status.Phase, err)
	}
	if s.Len() != 0 {
		t.Fatalf("the store holds %d writes after the cache caught up", s.Len())
	}
}

func bid(name string) *marketv1alpha1.Bid {
	return &marketv1alpha1.Bid{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), Labels: map[string]string{"x": "y"}},
		Status: marketv1alpha1.BidStatus{State: marketv1alpha1.BidOpen}}
}

func TestMadeObjects(t *testing.T) {
	ctx := context.Background()
	l, _, _, c := setup(t)
	b := bid("a")
	if err := c.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	var list marketv1alpha1.BidList
	if err := c.List(ctx, &list, client.InNamespace("ns")); err != nil || len(list.Items) != 1 {
		t.Fatalf("a made object is listed by namespace: %d %v", len(list.Items), err)
	}
	if err := c.List(ctx, &list, client.InNamespace("other")); err != nil || len(list.Items) != 0 {
		t.Fatalf("not in another namespace: %d %v", len(list.Items), err)
	}
	// A list by label is the cache's alone (the store does not match
	// selectors).
	if err := c.List(ctx, &list, client.InNamespace("ns"), client.MatchingLabels{"x": "y"}); err != nil || len(list.Items) != 0 {
		t.Fatalf("by label: %d %v", len(list.Items), err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(b), &marketv1alpha1.Bid{}); err != nil {
		t.Fatalf("a made object is read: %v", err)
	}
	// Another workspace's client does not see it.
	other := New(nil).Client("ws2", l)
	if err := other.Get(ctx, client.ObjectKeyFromObject(b), &marketv1alpha1.Bid{}); !apierrors.IsNotFound(err) {
		t.Fatalf("another store: %v", err)
	}
	// Only the knotless kinds are kept (not the Secrets a controller
	// writes).
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}}
	if err := c.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(cm), &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a ConfigMap was kept: %v", err)
	}
}

// TestDeletesAreTheCaches: what the store does not say about deletes. An
// object the controller deleted is what the cache says it is (being
// finalized, with a deletionTimestamp); one the cache showed and then no
// longer has is gone, however recent the store's write of it.
func TestDeletesAreTheCaches(t *testing.T) {
	ctx := context.Background()
	held := bid("held")
	held.Finalizers = []string{"agent"}
	l, _, _, c := setup(t, held, bid("other"))

	got := &marketv1alpha1.Bid{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(held), got); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	// Deleted again from the lagging cache's copy: nothing is sent.
	deletes := 0
	counting := New(nil)
	cc := counting.Client("ws1", interceptor.NewClient(fakeWithWatch{l}, interceptor.Funcs{Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
		deletes++
		return c.Delete(ctx, obj, opts...)
	}}))
	stale := &marketv1alpha1.Bid{}
	if err := l.Get(ctx, client.ObjectKeyFromObject(bid("other")), stale); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := cc.Delete(ctx, stale); err != nil {
			t.Fatal(err)
		}
	}
	if deletes != 1 {
		t.Fatalf("an object deleted twice from a stale copy: %d deletes sent, want 1", deletes)
	}
	again := bid("other")
	again.UID = "" // made again: a new UID
	if err := l.Create(ctx, again); err != nil {
		t.Fatal(err)
	}
	l.catchUp(t, bid("other"))
	l.catchUp(t, held)
	if err := c.Get(ctx, client.ObjectKeyFromObject(held), got); err != nil || got.DeletionTimestamp.IsZero() {
		t.Fatalf("an object being finalized reads as such: %v %v", got.DeletionTimestamp, err)
	}

	// Our write of "other", then someone else deletes it.
	other := &marketv1alpha1.Bid{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(bid("other")), other); err != nil {
		t.Fatal(err)
	}
	other.Status.State = marketv1alpha1.BidLost
	if err := c.Update(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(other), other); err != nil || other.Status.State != marketv1alpha1.BidLost {
		t.Fatalf("read after write: %v %v", other.Status.State, err)
	}
	if err := l.Delete(ctx, other); err != nil {
		t.Fatal(err)
	}
	l.catchUp(t, other)
	if err := c.Get(ctx, client.ObjectKeyFromObject(other), other); !apierrors.IsNotFound(err) {
		t.Fatalf("an object deleted by another reads: %v", err)
	}
	var list marketv1alpha1.BidList
	if err := c.List(ctx, &list, client.InNamespace("ns")); err != nil || len(list.Items) != 1 || list.Items[0].Name != "held" {
		t.Fatalf("list after deletes: %+v %v", list.Items, err)
	}
}

func TestTheCacheWinsWhenNewerOrLate(t *testing.T) {
	ctx := context.Background()
	b := bid("a")
	l, s, clk, c := setup(t, b)
	got := &marketv1alpha1.Bid{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(b), got); err != nil {
		t.Fatal(err)
	}
	got.Status.Message = "1"
	if err := c.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	// Someone else writes after us, and the cache shows theirs.
	theirs := got.DeepCopy()
	theirs.Status.Message = "2"
	if err := l.Update(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	l.catchUp(t, b)
	if err := c.Get(ctx, client.ObjectKeyFromObject(b), got); err != nil || got.Status.Message != "2" {
		t.Fatalf("a newer object in the cache: %q %v, want 2", got.Status.Message, err)
	}

	// A write the cache never shows is forgotten after TTL.
	got.Status.Message = "3"
	if err := c.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(b), got); err != nil || got.Status.Message != "3" {
		t.Fatalf("read after write: %q %v", got.Status.Message, err)
	}
	clk.t = clk.t.Add(TTL + time.Second)
	if err := c.Get(ctx, client.ObjectKeyFromObject(b), got); err != nil || got.Status.Message != "2" {
		t.Fatalf("after TTL: %q %v, want the cache's 2", got.Status.Message, err)
	}
	if s.Len() != 0 {
		t.Fatalf("the store holds %d writes after TTL", s.Len())
	}
}
