package engage

import (
	"context"
	"sync"
	"time"

	kcpcache "github.com/kcp-dev/apimachinery/v2/pkg/cache"
	"github.com/kcp-dev/logicalcluster/v3"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mcpcache "github.com/kcp-dev/multicluster-provider/pkg/cache"
)

// fanout gives every engaged workspace a view of one wildcard cache (one
// virtual workspace URL) whose informers do not register an event handler
// on the shared informer per workspace. multicluster-provider v0.8.0's
// scoped informers add one handler per controller, watched kind and
// workspace, and client-go gives each handler a listener with its own
// buffer and two goroutines, which is most of the memory a workspace
// costs. Here each shared informer gets one handler, which hands an event
// to the handlers of the object's logical cluster only.
//
// multicluster-provider would make this unnecessary if its scoped cache
// registered per-cluster handlers with one dispatcher per informer (as
// this type does), or let the provider choose the scoped cache.
type fanout struct {
	base   mcpcache.WildcardCache
	scheme *runtime.Scheme

	mu          sync.Mutex
	dispatchers map[toolscache.SharedIndexInformer]*dispatcher
}

func newFanout(base mcpcache.WildcardCache, scheme *runtime.Scheme) *fanout {
	return &fanout{base: base, scheme: scheme, dispatchers: map[toolscache.SharedIndexInformer]*dispatcher{}}
}

// forCluster returns the wildcard cache as one logical cluster's scoped
// cache should see it.
func (f *fanout) forCluster(lc logicalcluster.Name) mcpcache.WildcardCache {
	return &clusterView{WildcardCache: f.base, f: f, lc: lc}
}

// dispatcherFor returns the dispatcher of the shared informer of obj's kind.
func (f *fanout) dispatcherFor(obj runtime.Object, inf cache.Informer) (*dispatcher, error) {
	shared, _, _, err := f.base.GetSharedInformer(obj)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.dispatchers[shared]
	if !ok {
		d = &dispatcher{informer: inf, indexer: shared.GetIndexer(), handlers: map[logicalcluster.Name]map[*registration]struct{}{}}
		f.dispatchers[shared] = d
	}
	return d, nil
}

// clusterView is a wildcard cache whose informers register handlers for
// one logical cluster with the fanout's dispatchers; reads go to the
// wildcard cache unchanged.
type clusterView struct {
	mcpcache.WildcardCache
	f  *fanout
	lc logicalcluster.Name
}

func (v *clusterView) GetInformer(ctx context.Context, obj client.Object, opts ...cache.InformerGetOption) (cache.Informer, error) {
	inf, err := v.WildcardCache.GetInformer(ctx, obj, opts...)
	if err != nil {
		return nil, err
	}
	d, err := v.f.dispatcherFor(obj, inf)
	if err != nil {
		return nil, err
	}
	return &clusterInformer{Informer: inf, d: d, lc: v.lc}, nil
}

func (v *clusterView) GetInformerForKind(ctx context.Context, gvk schema.GroupVersionKind, opts ...cache.InformerGetOption) (cache.Informer, error) {
	inf, err := v.WildcardCache.GetInformerForKind(ctx, gvk, opts...)
	if err != nil {
		return nil, err
	}
	obj, err := v.f.scheme.New(gvk)
	if err != nil {
		// A kind the scheme does not know (unstructured): the library's
		// own per-cluster handlers.
		return inf, nil
	}
	d, err := v.f.dispatcherFor(obj, inf)
	if err != nil {
		return nil, err
	}
	return &clusterInformer{Informer: inf, d: d, lc: v.lc}, nil
}

// clusterInformer is a shared informer as one logical cluster's handlers
// use it.
type clusterInformer struct {
	cache.Informer
	d  *dispatcher
	lc logicalcluster.Name
}

func (i *clusterInformer) AddEventHandler(h toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error) {
	return i.d.add(i.lc, h, toolscache.HandlerOptions{})
}

func (i *clusterInformer) AddEventHandlerWithResyncPeriod(h toolscache.ResourceEventHandler, period time.Duration) (toolscache.ResourceEventHandlerRegistration, error) {
	return i.d.add(i.lc, h, toolscache.HandlerOptions{ResyncPeriod: &period})
}

func (i *clusterInformer) AddEventHandlerWithOptions(h toolscache.ResourceEventHandler, o toolscache.HandlerOptions) (toolscache.ResourceEventHandlerRegistration, error) {
	return i.d.add(i.lc, h, o)
}

func (i *clusterInformer) RemoveEventHandler(reg toolscache.ResourceEventHandlerRegistration) error {
	if r, ok := reg.(*registration); ok {
		i.d.remove(r)
		return nil
	}
	return i.Informer.RemoveEventHandler(reg)
}

// dispatcher is the one handler of a shared informer: it passes each
// event to the handlers registered for the object's logical cluster.
type dispatcher struct {
	informer cache.Informer
	indexer  toolscache.Indexer

	mu       sync.RWMutex
	shared   toolscache.ResourceEventHandlerRegistration // added with the first handler
	handlers map[logicalcluster.Name]map[*registration]struct{}
}

// registration is one cluster's handler; it has synced when the shared
// registration has (its cluster's objects already in the store were
// delivered before add returned it). Its callbacks run one at a time and
// in order: the initial adds first, then the live events, as a shared
// informer's own listener would call them.
type registration struct {
	d       *dispatcher
	lc      logicalcluster.Name
	mu      sync.Mutex
	handler toolscache.ResourceEventHandler
}

func (r *registration) HasSynced() bool { return r.d.sharedRegistration().HasSynced() }

func (r *registration) HasSyncedChecker() toolscache.DoneChecker {
	return r.d.sharedRegistration().HasSyncedChecker()
}

func (d *dispatcher) sharedRegistration() toolscache.ResourceEventHandlerRegistration {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.shared
}

// add registers h for lc and delivers lc's objects already in the store
// as initial adds (as a new listener of a shared informer gets them).
func (d *dispatcher) add(lc logicalcluster.Name, h toolscache.ResourceEventHandler, o toolscache.HandlerOptions) (toolscache.ResourceEventHandlerRegistration, error) {
	r := &registration{d: d, lc: lc, handler: h}
	// Held until the initial adds are delivered: live events for r wait.
	r.mu.Lock()
	defer r.mu.Unlock()
	d.mu.Lock()
	if d.shared == nil {
		shared, err := d.informer.AddEventHandlerWithOptions(d, o)
		if err != nil {
			d.mu.Unlock()
			return nil, err
		}
		d.shared = shared
	}
	if d.handlers[lc] == nil {
		d.handlers[lc] = map[*registration]struct{}{}
	}
	d.handlers[lc][r] = struct{}{}
	existing, err := d.indexer.ByIndex(kcpcache.ClusterIndexName, mcpcache.ClusterIndexKey(lc))
	d.mu.Unlock()
	if err != nil {
		d.remove(r)
		return nil, err
	}
	for _, obj := range existing {
		h.OnAdd(obj, true)
	}
	return r, nil
}

func (d *dispatcher) remove(r *registration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.handlers[r.lc], r)
	if len(d.handlers[r.lc]) == 0 {
		delete(d.handlers, r.lc)
	}
}

// handlersOf returns the registrations of obj's logical cluster.
func (d *dispatcher) handlersOf(obj any) []*registration {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	o, ok := obj.(client.Object)
	if !ok {
		return nil
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	regs := d.handlers[logicalcluster.From(o)]
	out := make([]*registration, 0, len(regs))
	for r := range regs {
		out = append(out, r)
	}
	return out
}

// deliver calls one callback of r's handler, after its initial adds.
func (r *registration) deliver(call func(toolscache.ResourceEventHandler)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	call(r.handler)
}

// OnAdd, OnUpdate and OnDelete make the dispatcher the shared informer's
// handler.
func (d *dispatcher) OnAdd(obj any, initial bool) {
	for _, r := range d.handlersOf(obj) {
		r.deliver(func(h toolscache.ResourceEventHandler) { h.OnAdd(obj, initial) })
	}
}

func (d *dispatcher) OnUpdate(oldObj, newObj any) {
	for _, r := range d.handlersOf(newObj) {
		r.deliver(func(h toolscache.ResourceEventHandler) { h.OnUpdate(oldObj, newObj) })
	}
}

func (d *dispatcher) OnDelete(obj any) {
	for _, r := range d.handlersOf(obj) {
		r.deliver(func(h toolscache.ResourceEventHandler) { h.OnDelete(obj) })
	}
}
