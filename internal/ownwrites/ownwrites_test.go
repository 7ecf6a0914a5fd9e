package ownwrites

import (
	"context"
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
	"sigs.k8s.io/controller-runtime/pkg/client"

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

func TestMadeAndDeletedObjects(t *testing.T) {
	ctx := context.Background()
	l, _, _, c := setup(t)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", Labels: map[string]string{"x": "y"}}}
	if err := c.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	var list corev1.ConfigMapList
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
	if err := c.Get(ctx, client.ObjectKeyFromObject(cm), &corev1.ConfigMap{}); err != nil {
		t.Fatalf("a made object is read: %v", err)
	}
	// Another workspace's client does not see it.
	other := New(nil).Client("ws2", l)
	if err := other.Get(ctx, client.ObjectKeyFromObject(cm), &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Fatalf("another store: %v", err)
	}

	l.catchUp(t, cm)
	if err := c.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if err := l.Get(ctx, client.ObjectKeyFromObject(cm), &corev1.ConfigMap{}); err != nil {
		t.Fatalf("the cache should still have it: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(cm), &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a deleted object is read: %v", err)
	}
	if err := c.List(ctx, &list, client.InNamespace("ns")); err != nil || len(list.Items) != 0 {
		t.Fatalf("a deleted object is listed: %d %v", len(list.Items), err)
	}
}

func TestTheCacheWinsWhenNewerOrLate(t *testing.T) {
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}, Data: map[string]string{"v": "0"}}
	l, s, clk, c := setup(t, cm)
	got := &corev1.ConfigMap{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(cm), got); err != nil {
		t.Fatal(err)
	}
	got.Data["v"] = "1"
	if err := c.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	// Someone else writes after us, and the cache shows theirs.
	theirs := got.DeepCopy()
	theirs.Data["v"] = "2"
	if err := l.Update(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	l.catchUp(t, cm)
	if err := c.Get(ctx, client.ObjectKeyFromObject(cm), got); err != nil || got.Data["v"] != "2" {
		t.Fatalf("a newer object in the cache: %v %v, want 2", got.Data, err)
	}

	// A write the cache never shows is forgotten after TTL.
	got.Data["v"] = "3"
	if err := c.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(cm), got); err != nil || got.Data["v"] != "3" {
		t.Fatalf("read after write: %v %v", got.Data, err)
	}
	clk.t = clk.t.Add(TTL + time.Second)
	if err := c.Get(ctx, client.ObjectKeyFromObject(cm), got); err != nil || got.Data["v"] != "2" {
		t.Fatalf("after TTL: %v %v, want the cache's 2", got.Data, err)
	}
	if s.Len() != 0 {
		t.Fatalf("the store holds %d writes after TTL", s.Len())
	}
}
