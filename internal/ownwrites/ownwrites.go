// Package ownwrites lets a controller read its own writes before its
// informer cache shows them.
//
// A controller reads from a cache that a watch fills. Under load (kcp busy
// with a market's deals) the watch runs seconds behind, and the next pass
// of the same object reads what was there before the last pass wrote: it
// decides again from a stale status and writes again what is already
// written — a write that changes nothing but costs kcp as much as one that
// does (docs/market.md, What bounds the market's speed). Store remembers
// each object a controller wrote, as the server answered, until the cache
// has it or a short time has passed, and Client lays those objects over
// what the cache reads: the newer of the two by resourceVersion, and
// objects it made that the cache has not shown yet. A delete is left to
// the cache (an object with finalizers lives on, and the cache shows its
// deletionTimestamp), and an object the cache once showed and no longer
// has is gone whatever the store holds.
//
// Only typed objects of the knotless kinds are remembered: the objects
// controllers decide on, not the Secrets they write. A resourceVersion
// that is not a number (kcp's and Kubernetes' are etcd revisions) is never
// compared: the cache's object is taken.
package ownwrites

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/knotless-dev/knotless/internal/names"
)

// TTL is how long a write is laid over the cache at most: longer than a
// loaded watch lags, short enough that a write the cache never shows (its
// object changed by someone else, whose newer version the cache holds by
// then) is soon forgotten.
const TTL = 30 * time.Second

// Store holds the objects written through its clients, by workspace. Its
// zero value is an empty store on time.Now.
type Store struct {
	now func() time.Time
	mu  sync.Mutex
	m   map[key]entry
	// deleted is when each object (by UID) was deleted through the
	// store's clients: a pass that still sees it in a lagging cache and
	// deletes it again sends nothing.
	deleted map[types.UID]time.Time
	// expired is when entries older than TTL were last dropped.
	expired time.Time
}

type key struct {
	cluster         string
	gvk             schema.GroupVersionKind
	namespace, name string
}

type entry struct {
	obj     client.Object
	uid     types.UID
	rv      uint64
	written time.Time
	// seen is set once the cache showed this object (by UID): from then
	// on the cache's NotFound means it is gone.
	seen bool
}

// New returns an empty store; now is its clock (nil: time.Now).
func New(now func() time.Time) *Store { return &Store{now: now} }

func (s *Store) clock() time.Time {
	if s.now == nil {
		return time.Now()
	}
	return s.now()
}

// Client returns c (the client of workspace cluster) with the store laid
// over its reads and fed by its writes.
func (s *Store) Client(cluster string, c client.Client) client.Client {
	return &wrapped{Client: c, s: s, cluster: cluster}
}

// Len is how many writes the store holds (for tests and metrics).
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

func rvOf(o client.Object) (uint64, bool) {
	rv, err := strconv.ParseUint(o.GetResourceVersion(), 10, 64)
	return rv, err == nil
}

// remember keeps obj as written.
func (s *Store) remember(k key, obj client.Object) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	s.expire(now)
	if s.m == nil {
		s.m = map[key]entry{}
	}
	rv, ok := rvOf(obj)
	if !ok {
		delete(s.m, k)
		return
	}
	old, had := s.m[k]
	if had && old.uid == obj.GetUID() && old.rv > rv {
		return // an older answer that came back later
	}
	cp, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		return
	}
	s.m[k] = entry{obj: cp, uid: obj.GetUID(), rv: rv, written: now, seen: had && old.seen && old.uid == obj.GetUID()}
}

// forget drops what the store holds of k, deleted: the object uid.
func (s *Store) forget(k key, uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, k)
	if uid == "" {
		return
	}
	if s.deleted == nil {
		s.deleted = map[types.UID]time.Time{}
	}
	s.deleted[uid] = s.clock()
}

// deletedLately reports whether the object uid was deleted through the
// store less than TTL ago.
func (s *Store) deletedLately(uid types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(s.clock())
	_, ok := s.deleted[uid]
	return ok && uid != ""
}

// expire drops the entries older than TTL, at most once a second (s.mu
// held).
func (s *Store) expire(now time.Time) {
	if now.Sub(s.expired) < time.Second {
		return
	}
	s.expired = now
	for k, e := range s.m {
		if now.Sub(e.written) > TTL {
			delete(s.m, k)
		}
	}
	for uid, at := range s.deleted {
		if now.Sub(at) > TTL {
			delete(s.deleted, uid)
		}
	}
}

// overlay returns what to read for k given what the cache read (nil: not
// there): the cache's object, the store's newer write, or the store's
// write of an object the cache has not shown yet (nil when there is none).
// It forgets writes the cache has caught up with or no longer has.
func (s *Store) overlay(k key, cached client.Object) client.Object {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(s.clock())
	e, ok := s.m[k]
	switch {
	case !ok:
		return cached
	case cached == nil && e.seen: // shown, then gone: deleted
		delete(s.m, k)
		return nil
	case cached == nil:
		return e.obj
	}
	rv, ok := rvOf(cached)
	switch {
	case !ok || cached.GetUID() != e.uid:
		delete(s.m, k)
		return cached
	case rv >= e.rv:
		delete(s.m, k) // the cache caught up
		return cached
	}
	e.seen = true
	s.m[k] = e
	return e.obj
}

// inNamespace returns the objects of gvk in namespace of cluster that the
// store made and the cache has not shown yet, but those among listed (by
// name).
func (s *Store) inNamespace(cluster string, gvk schema.GroupVersionKind, namespace string, listed map[string]bool) []client.Object {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(s.clock())
	var out []client.Object
	for k, e := range s.m {
		if k.cluster != cluster || k.gvk != gvk || k.namespace != namespace || listed[k.name] || e.seen {
			continue
		}
		out = append(out, e.obj)
	}
	return out
}

type wrapped struct {
	client.Client
	s       *Store
	cluster string
}

func (w *wrapped) keyOf(obj runtime.Object, namespace, name string) (key, bool) {
	if _, ok := obj.(runtime.Unstructured); ok {
		return key{}, false
	}
	gvk, err := apiutil.GVKForObject(obj, w.Scheme())
	if err != nil || !strings.HasSuffix(gvk.Group, names.GroupSuffix) {
		return key{}, false
	}
	return key{cluster: w.cluster, gvk: gvk, namespace: namespace, name: name}, true
}

// setInto copies src into dst (the same Go type).
func setInto(dst, src runtime.Object) bool {
	dv, sv := reflect.ValueOf(dst), reflect.ValueOf(src.DeepCopyObject())
	if dv.Type() != sv.Type() || dv.Kind() != reflect.Pointer {
		return false
	}
	dv.Elem().Set(sv.Elem())
	return true
}

// Get reads obj from the cache, or the store's newer write of it.
func (w *wrapped) Get(ctx context.Context, k client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	err := w.Client.Get(ctx, k, obj, opts...)
	sk, ok := w.keyOf(obj, k.Namespace, k.Name)
	if !ok || (err != nil && !apierrors.IsNotFound(err)) {
		return err
	}
	var cached client.Object
	if err == nil {
		cached = obj
	}
	got := w.s.overlay(sk, cached)
	if got == nil || got == cached {
		return err
	}
	if !setInto(obj, got) {
		return err
	}
	return nil
}

// List lists from the cache with the store laid over: newer writes
// replace what the cache has and, for a list by namespace only, objects
// made but not yet in the cache are added.
func (w *wrapped) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := w.Client.List(ctx, list, opts...); err != nil {
		return err
	}
	if _, ok := list.(runtime.Unstructured); ok {
		return nil
	}
	o := (&client.ListOptions{}).ApplyOptions(opts)
	gvk, err := apiutil.GVKForObject(list, w.Scheme())
	if err != nil {
		return nil
	}
	gvk.Kind = strings.TrimSuffix(gvk.Kind, "List")
	items, err := meta.ExtractList(list)
	if err != nil {
		return nil
	}
	out := make([]runtime.Object, 0, len(items))
	listed := map[string]bool{}
	for _, it := range items {
		obj, ok := it.(client.Object)
		if !ok {
			return nil
		}
		listed[obj.GetName()] = true
		switch got := w.s.overlay(key{cluster: w.cluster, gvk: gvk, namespace: obj.GetNamespace(), name: obj.GetName()}, obj); {
		case got == obj:
			out = append(out, obj)
		case got != nil:
			out = append(out, got.DeepCopyObject())
		}
	}
	if o.LabelSelector == nil && o.FieldSelector == nil && o.Namespace != "" {
		for _, obj := range w.s.inNamespace(w.cluster, gvk, o.Namespace, listed) {
			out = append(out, obj.DeepCopyObject())
		}
	}
	return meta.SetList(list, out)
}

// applied remembers what an apply answered (the apply configuration
// holds the server's object once it returns).
func (w *wrapped) applied(obj runtime.ApplyConfiguration) {
	u, ok := obj.(interface{ UnstructuredContent() map[string]any })
	if !ok {
		return
	}
	content := &unstructured.Unstructured{Object: u.UnstructuredContent()}
	typed, err := w.Scheme().New(content.GroupVersionKind())
	if err != nil {
		return
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(content.Object, typed); err != nil {
		return
	}
	w.wrote(typed)
}

func (w *wrapped) wrote(obj runtime.Object) {
	o, ok := obj.(client.Object)
	if !ok {
		return
	}
	if k, ok := w.keyOf(o, o.GetNamespace(), o.GetName()); ok {
		w.s.remember(k, o)
	}
}

// Apply applies and remembers the server's answer.
func (w *wrapped) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	if err := w.Client.Apply(ctx, obj, opts...); err != nil {
		return err
	}
	w.applied(obj)
	return nil
}

// Create creates and remembers the server's answer.
func (w *wrapped) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if err := w.Client.Create(ctx, obj, opts...); err != nil {
		return err
	}
	w.wrote(obj)
	return nil
}

// Update updates and remembers the server's answer.
func (w *wrapped) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := w.Client.Update(ctx, obj, opts...); err != nil {
		return err
	}
	w.wrote(obj)
	return nil
}

// Patch patches and remembers the server's answer.
func (w *wrapped) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if err := w.Client.Patch(ctx, obj, patch, opts...); err != nil {
		return err
	}
	w.wrote(obj)
	return nil
}

// Delete deletes and forgets what the store holds of obj: from then on
// the cache says whether it is there (with a deletionTimestamp while
// finalizers hold it) or gone. The same object (by UID) deleted again
// within TTL, as a lagging cache still shows it, sends nothing.
func (w *wrapped) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	k, ok := w.keyOf(obj, obj.GetNamespace(), obj.GetName())
	if ok && w.s.deletedLately(obj.GetUID()) {
		return nil
	}
	if err := w.Client.Delete(ctx, obj, opts...); err != nil {
		return err
	}
	if ok {
		w.s.forget(k, obj.GetUID())
	}
	return nil
}

// Status returns the status writer, whose writes are remembered too.
func (w *wrapped) Status() client.SubResourceWriter {
	return &statusWriter{SubResourceWriter: w.Client.Status(), w: w}
}

type statusWriter struct {
	client.SubResourceWriter
	w *wrapped
}

func (s *statusWriter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if err := s.SubResourceWriter.Update(ctx, obj, opts...); err != nil {
		return err
	}
	s.w.wrote(obj)
	return nil
}

func (s *statusWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if err := s.SubResourceWriter.Patch(ctx, obj, patch, opts...); err != nil {
		return err
	}
	s.w.wrote(obj)
	return nil
}

func (s *statusWriter) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	if err := s.SubResourceWriter.Apply(ctx, obj, opts...); err != nil {
		return err
	}
	s.w.applied(obj)
	return nil
}
