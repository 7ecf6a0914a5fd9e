/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package engage

import (
	"context"
	"errors"
	"sort"
	"testing"
	"time"

	"github.com/kcp-dev/logicalcluster/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	mchandler "sigs.k8s.io/multicluster-runtime/pkg/handler"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/knotless-dev/knotless/apis"
)

// fakeWorkspace is a workspace whose cache lists from a fake client, as a
// scoped cluster's cache lists one logical cluster's objects.
type fakeWorkspace struct {
	cluster.Cluster
	name string
	c    client.Client
}

type listCache struct {
	cache.Cache
	c client.Client
}

func (l listCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return l.c.List(ctx, list, opts...)
}

func (f *fakeWorkspace) GetCache() cache.Cache    { return listCache{c: f.c} }
func (f *fakeWorkspace) GetClient() client.Client { return f.c }

// GetConfig is the scoped cluster's: the virtual workspace URL and the
// workspace's path.
func (f *fakeWorkspace) GetConfig() *rest.Config {
	return &rest.Config{Host: fakeConfig().Host + logicalcluster.Name(f.name).Path().RequestPath()}
}

// engage engages a fake workspace holding objs.
func engage(ctx context.Context, t *testing.T, p *exportProvider, name string, objs ...client.Object) *fakeWorkspace {
	t.Helper()
	ws := &fakeWorkspace{name: name, c: fake.NewClientBuilder().WithObjects(objs...).Build()}
	if err := (engager{e: p}).Engage(ctx, multicluster.ClusterName(name), ws); err != nil {
		t.Fatal(err)
	}
	return ws
}

func configMap(lc, ns, name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: ns, UID: types.UID(lc + "/" + name),
		Annotations: map[string]string{logicalcluster.AnnotationKey: lc},
	}}
}

func newTestProvider(t *testing.T) *exportProvider {
	t.Helper()
	p, err := New(fakeConfig(), "knotless.dev", Options{Scheme: apis.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	sh, err := newShared(fakeConfig(), p.opts.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	p.shared = map[string]*shared{fakeConfig().Host: sh}
	return p.exportProvider
}

func newQueue() workqueue.TypedRateLimitingInterface[mcreconcile.Request] {
	return workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[mcreconcile.Request]())
}

// drain returns the queued requests as cluster/namespace/name, sorted.
func drain(q workqueue.TypedRateLimitingInterface[mcreconcile.Request]) []string {
	var out []string
	for q.Len() > 0 {
		r, _ := q.Get()
		out = append(out, string(r.ClusterName)+"/"+r.Namespace+"/"+r.Name)
		q.Done(r)
	}
	sort.Strings(out)
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// startedSource returns a ConfigMap source started on q (with no wildcard
// cache yet, as before the first workspace).
func startedSource(t *testing.T, p *exportProvider, q workqueue.TypedRateLimitingInterface[mcreconcile.Request], preds ...predicate.TypedPredicate[client.Object]) *kindSource {
	t.Helper()
	src := (&Provider{exportProvider: p}).Kind(&corev1.ConfigMap{}, mchandler.TypedEnqueueRequestForObject[client.Object](), preds...)
	if err := src.Start(t.Context(), q); err != nil {
		t.Fatal(err)
	}
	if err := src.Start(t.Context(), q); err == nil {
		t.Fatal("a source started twice")
	}
	return src.(*kindSource)
}

func TestKindDeliversOnlyEngagedWorkspaces(t *testing.T) {
	p := newTestProvider(t)
	q := newQueue()
	s := startedSource(t, p, q)

	// Nothing is engaged: the shared informer's events are dropped.
	s.OnAdd(configMap("ws-a", "default", "one"), true)
	if got := drain(q); len(got) != 0 {
		t.Fatalf("events of a workspace not engaged were delivered: %v", got)
	}

	// Engaging ws-a delivers what it holds (its cache), then live events.
	ctx, disengage := context.WithCancel(t.Context())
	wsA := engage(ctx, t, p, "ws-a", configMap("ws-a", "default", "one"), configMap("ws-a", "other", "two"))
	if got, want := drain(q), []string{"ws-a/default/one", "ws-a/other/two"}; !equal(got, want) {
		t.Fatalf("initial creates: got %v, want %v", got, want)
	}
	s.OnUpdate(configMap("ws-a", "default", "one"), configMap("ws-a", "default", "one"))
	s.OnAdd(configMap("ws-b", "default", "three"), false)
	s.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "x", Obj: configMap("ws-a", "other", "two")})
	if got, want := drain(q), []string{"ws-a/default/one", "ws-a/other/two"}; !equal(got, want) {
		t.Fatalf("live events: got %v, want %v", got, want)
	}
	if cl, err := p.Get(t.Context(), "ws-a"); err != nil || cl.(*workspace).Cluster != wsA {
		t.Fatalf("Get(ws-a) = %v, %v", cl, err)
	}
	if p.Engaged() != 1 {
		t.Fatalf("engaged %d, want 1", p.Engaged())
	}

	// A removed workspace is gone at once: no events, not found.
	disengage()
	waitFor(t, func() bool { return p.Engaged() == 0 })
	s.OnAdd(configMap("ws-a", "default", "four"), false)
	if got := drain(q); len(got) != 0 {
		t.Fatalf("events of a removed workspace were delivered: %v", got)
	}
	if _, err := p.Get(t.Context(), "ws-a"); !errors.Is(err, multicluster.ErrClusterNotFound) {
		t.Fatalf("Get of a removed workspace: %v", err)
	}
}

func TestKindAppliesPredicates(t *testing.T) {
	p := newTestProvider(t)
	q := newQueue()
	onlyNamed := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetName() == "wanted" })
	s := startedSource(t, p, q, onlyNamed)
	engage(t.Context(), t, p, "ws", configMap("ws", "default", "wanted"), configMap("ws", "default", "other"))
	s.OnAdd(configMap("ws", "default", "other"), false)
	s.OnUpdate(configMap("ws", "default", "other"), configMap("ws", "default", "other"))
	s.OnDelete(configMap("ws", "default", "other"))
	if got, want := drain(q), []string{"ws/default/wanted"}; !equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestKindCreateEventsCarryInitialList(t *testing.T) {
	p := newTestProvider(t)
	q := newQueue()
	var initial []bool
	record := predicate.Funcs{CreateFunc: func(e event.CreateEvent) bool { initial = append(initial, e.IsInInitialList); return true }}
	s := startedSource(t, p, q, record)
	engage(t.Context(), t, p, "ws", configMap("ws", "default", "old"))
	s.OnAdd(configMap("ws", "default", "new"), false)
	if len(initial) != 2 || !initial[0] || initial[1] {
		t.Fatalf("IsInInitialList of replay and live create: %v, want [true false]", initial)
	}
}

// A workspace engaged again (the inner provider restarted) replaces the
// old one; the old engagement's end does not remove the new one.
func TestReengagedWorkspaceSurvivesOldDisengagement(t *testing.T) {
	p := newTestProvider(t)
	engage(t.Context(), t, p, "ws")
	old := p.workspace("ws")
	next := engage(t.Context(), t, p, "ws")
	p.disengage("ws", old)
	cl, err := p.Get(t.Context(), "ws")
	if err != nil || cl.(*workspace).Cluster != next {
		t.Fatalf("Get after the old engagement ended = %v, %v", cl, err)
	}
	p.disengage("ws", p.workspace("ws"))
	if p.Engaged() != 0 {
		t.Fatal("the current engagement's end did not remove it")
	}
}

func fakeConfig() *rest.Config { return &rest.Config{Host: "https://127.0.0.1:1"} }

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
