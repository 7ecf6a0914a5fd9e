package engage

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kcpcache "github.com/kcp-dev/apimachinery/v2/pkg/cache"
	"github.com/kcp-dev/logicalcluster/v3"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mcpcache "github.com/kcp-dev/multicluster-provider/pkg/cache"
)

// fakeWildcard serves one shared ConfigMap informer fed by a fake watch.
type fakeWildcard struct {
	mcpcache.WildcardCache
	informer toolscache.SharedIndexInformer
	counted  *countingInformer
}

func (f *fakeWildcard) GetInformer(context.Context, client.Object, ...cache.InformerGetOption) (cache.Informer, error) {
	return f.counted, nil
}

func (f *fakeWildcard) GetSharedInformer(runtime.Object) (toolscache.SharedIndexInformer, schema.GroupVersionKind, apimeta.RESTScopeName, error) {
	return f.informer, corev1.SchemeGroupVersion.WithKind("ConfigMap"), apimeta.RESTScopeNameNamespace, nil
}

// listOnly is a lister-watcher that starts with a list, not a watch-list
// stream (which the fake watch cannot serve).
type listOnly struct{ *toolscache.ListWatch }

func (listOnly) IsWatchListSemanticsUnSupported() bool { return true }

// countingInformer counts the handlers registered on the shared informer.
type countingInformer struct {
	toolscache.SharedIndexInformer
	handlers atomic.Int32
}

func (c *countingInformer) AddEventHandlerWithOptions(h toolscache.ResourceEventHandler, o toolscache.HandlerOptions) (toolscache.ResourceEventHandlerRegistration, error) {
	c.handlers.Add(1)
	return c.SharedIndexInformer.AddEventHandlerWithOptions(h, o)
}

func (c *countingInformer) AddIndexers(toolscache.Indexers) error { return nil }

func configMap(lc, name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", ResourceVersion: "1",
		Annotations: map[string]string{logicalcluster.AnnotationKey: lc}}}
}

// recorder records the names a handler was given.
type recorder struct {
	mu    sync.Mutex
	names []string
}

func (r *recorder) add(name string) { r.mu.Lock(); r.names = append(r.names, name); r.mu.Unlock() }
func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.names...)
}

func (r *recorder) handler() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerDetailedFuncs{
		AddFunc:    func(obj any, _ bool) { r.add("add " + obj.(client.Object).GetName()) },
		UpdateFunc: func(_, obj any) { r.add("update " + obj.(client.Object).GetName()) },
		DeleteFunc: func(obj any) { r.add("delete " + obj.(client.Object).GetName()) },
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFanoutRegistersOneHandlerAndDispatchesByCluster: many workspaces'
// handlers cost one handler on the shared informer; each gets its own
// workspace's objects (those in the store first, then live events) and
// nothing of other workspaces; a removed handler gets nothing more.
func TestFanoutRegistersOneHandlerAndDispatchesByCluster(t *testing.T) {
	fw := watch.NewFake()
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			return &corev1.ConfigMapList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: []corev1.ConfigMap{*configMap("a", "a-old"), *configMap("b", "b-old")}}, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return fw, nil },
	}
	shared := toolscache.NewSharedIndexInformer(listOnly{lw}, &corev1.ConfigMap{}, 0, toolscache.Indexers{kcpcache.ClusterIndexName: mcpcache.ClusterIndexFunc})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan struct{})
	go func() { shared.Run(ctx.Done()); close(done) }()
	defer func() { cancel(); <-done }()
	if !toolscache.WaitForCacheSync(ctx.Done(), shared.HasSynced) {
		t.Fatal("informer did not sync")
	}

	counted := &countingInformer{SharedIndexInformer: shared}
	f := newFanout(&fakeWildcard{informer: shared, counted: counted}, clientgoscheme.Scheme)
	regs := map[string]toolscache.ResourceEventHandlerRegistration{}
	recs := map[string]*recorder{}
	for _, lc := range []string{"a", "b", "c"} {
		inf, err := f.forCluster(logicalcluster.Name(lc)).GetInformer(ctx, &corev1.ConfigMap{})
		if err != nil {
			t.Fatal(err)
		}
		recs[lc] = &recorder{}
		for range 3 { // three controllers watching the kind in each workspace
			if regs[lc], err = inf.AddEventHandlerWithOptions(recs[lc].handler(), toolscache.HandlerOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := counted.handlers.Load(); n != 1 {
		t.Fatalf("%d handlers on the shared informer for 9 registrations, want 1", n)
	}
	waitFor(t, "registrations to sync", func() bool { return regs["a"].HasSynced() && regs["c"].HasSynced() })
	// The store's objects of each workspace, once per registration (the
	// first registration may also see the informer's own initial adds).
	if got := recs["a"].got(); len(got) < 3 || got[0] != "add a-old" {
		t.Fatalf("workspace a got %v", got)
	}
	for _, n := range recs["c"].got() {
		t.Fatalf("workspace c got %q, it has no objects", n)
	}

	fw.Add(configMap("b", "b-new"))
	fw.Modify(configMap("a", "a-old"))
	waitFor(t, "the update of a-old", func() bool {
		got := recs["a"].got()
		return len(got) >= 3 && got[len(got)-1] == "update a-old"
	})
	waitFor(t, "the add of b-new", func() bool {
		got := recs["b"].got()
		return len(got) > 0 && got[len(got)-1] == "add b-new"
	})
	for _, n := range recs["a"].got() {
		if n == "add b-new" || n == "add b-old" {
			t.Fatalf("workspace a got workspace b's %q", n)
		}
	}

	// A removed registration gets nothing more.
	inf, _ := f.forCluster("a").GetInformer(ctx, &corev1.ConfigMap{})
	f.mu.Lock()
	var d *dispatcher
	for _, x := range f.dispatchers {
		d = x
	}
	f.mu.Unlock()
	for r := range d.handlers["a"] {
		if err := inf.RemoveEventHandler(r); err != nil {
			t.Fatal(err)
		}
	}
	before := len(recs["a"].got())
	fw.Delete(configMap("a", "a-old"))
	fw.Add(configMap("b", "b-last"))
	waitFor(t, "the add of b-last", func() bool {
		got := recs["b"].got()
		return len(got) > 0 && got[len(got)-1] == "add b-last"
	})
	if after := len(recs["a"].got()); after != before {
		t.Fatalf("a removed registration got %v", recs["a"].got()[before:])
	}
}
