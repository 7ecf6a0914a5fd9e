// Package clustertest gives reconcilers that take a cluster getter a fake
// workspace for unit tests (as kcp-operator's reconciler tests do):
// Cluster is a controller-runtime cluster.Cluster whose client is
// controller-runtime's fake client with the project's scheme, and Getter
// turns a set of them into the GetCluster func of a Reconciler.
//
// multicluster-runtime v0.24.1 ships no fake cluster (its providers wrap
// real clusters), hence this package.
package clustertest

import (
	"context"
	"fmt"
	"io/fs"
	"reflect"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	"sigs.k8s.io/yaml"

	"github.com/knotless-dev/knotless/apis"
	"github.com/knotless-dev/knotless/exports"
	"github.com/knotless-dev/knotless/internal/names"
)

// Cluster is a fake workspace. GetClient, GetAPIReader, GetScheme,
// GetRESTMapper, GetEventRecorder and GetCache (WaitForCacheSync only)
// are implemented; the other methods of
// cluster.Cluster are not (calling one panics: the embedded interface is
// nil), so a reconciler that starts using one fails its tests loudly.
type Cluster struct {
	cluster.Cluster

	// Client is the fake client every reconcile of this cluster uses.
	Client client.WithWatch
	// Events records what the reconcilers emitted.
	Events *Recorder
	// Unsynced makes GetCache().WaitForCacheSync report false, as a
	// workspace whose informers have not synced yet.
	Unsynced bool
}

// GetCache implements cluster.Cluster with a cache whose only method is
// WaitForCacheSync (the fake client holds every object from the start;
// the others panic).
func (c *Cluster) GetCache() cache.Cache { return syncCache{c: c} }

type syncCache struct {
	cache.Cache
	c *Cluster
}

// WaitForCacheSync reports whether the fake workspace counts as synced.
func (s syncCache) WaitForCacheSync(context.Context) bool { return !s.c.Unsynced }

// NewClientBuilder returns a fake client builder with apis.NewScheme(),
// the status subresource of every knotless kind (a status write and a
// spec write do not overwrite each other, as on kcp) and server-side apply
// of the knotless kinds emulated (see applier: the fake client's own would
// empty their spec). Use it to add indexes, then NewWithClient; setting
// other interceptor funcs replaces the emulation.
func NewClientBuilder() *fake.ClientBuilder {
	s := apis.NewScheme()
	return fake.NewClientBuilder().WithScheme(s).WithStatusSubresource(knotlessKinds(s)...).WithInterceptorFuncs((&applier{withStatus: statusSubresources()}).funcs())
}

// New returns a cluster whose fake client holds objs.
func New(objs ...client.Object) *Cluster {
	return NewWithClient(NewClientBuilder().WithObjects(objs...).Build())
}

// NewWithClient returns a cluster around c.
func NewWithClient(c client.WithWatch) *Cluster {
	return &Cluster{Client: c, Events: &Recorder{}}
}

// GetClient implements cluster.Cluster.
func (c *Cluster) GetClient() client.Client { return c.Client }

// GetAPIReader implements cluster.Cluster; it reads through the fake client.
func (c *Cluster) GetAPIReader() client.Reader { return c.Client }

// GetScheme implements cluster.Cluster.
func (c *Cluster) GetScheme() *runtime.Scheme { return c.Client.Scheme() }

// GetRESTMapper implements cluster.Cluster.
func (c *Cluster) GetRESTMapper() meta.RESTMapper { return c.Client.RESTMapper() }

// GetEventRecorder implements cluster.Cluster: events go to c.Events under
// the reporting controller's name.
func (c *Cluster) GetEventRecorder(name string) events.EventRecorder {
	return &namedRecorder{r: c.Events, controller: name}
}

// Getter returns a cluster getter (the GetCluster field of a Reconciler)
// that serves clusters by name; an unknown name is an error wrapping
// multicluster.ErrClusterNotFound. clusters must not change while the
// getter is in use.
func Getter(clusters map[string]*Cluster) func(context.Context, multicluster.ClusterName) (cluster.Cluster, error) {
	return func(_ context.Context, name multicluster.ClusterName) (cluster.Cluster, error) {
		if c, ok := clusters[string(name)]; ok && c != nil {
			return c, nil
		}
		return nil, fmt.Errorf("workspace %q: %w", name, multicluster.ErrClusterNotFound)
	}
}

// Event is one recorded event.
type Event struct {
	// Controller is the name the recorder was asked for.
	Controller string
	// Object is the name of the regarding object (namespace/name, or name).
	Object                     string
	Type, Reason, Action, Note string
}

// Recorder records events in memory; it is safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	events []Event
}

// Events returns the events recorded so far, oldest first.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

// Reasons returns the reasons of the events recorded so far, oldest first.
func (r *Recorder) Reasons() []string {
	var out []string
	for _, e := range r.Events() {
		out = append(out, e.Reason)
	}
	return out
}

type namedRecorder struct {
	r          *Recorder
	controller string
}

// Eventf implements events.EventRecorder.
func (n *namedRecorder) Eventf(regarding, _ runtime.Object, eventtype, reason, action, note string, args ...any) {
	e := Event{Controller: n.controller, Type: eventtype, Reason: reason, Action: action, Note: fmt.Sprintf(note, args...)}
	if o, ok := regarding.(client.Object); ok {
		e.Object = client.ObjectKeyFromObject(o).String()
	}
	n.r.mu.Lock()
	defer n.r.mu.Unlock()
	n.r.events = append(n.r.events, e)
}

// knotlessKinds returns an object of every kind in a *.knotless.dev group
// of s whose exported schema (exports.FS) has a status subresource.
func knotlessKinds(s *runtime.Scheme) []client.Object {
	withStatus := statusSubresources()
	var out []client.Object
	for gvk, t := range s.AllKnownTypes() {
		if !strings.HasSuffix(gvk.Group, names.GroupSuffix) || !withStatus[gvk.GroupKind()] {
			continue
		}
		if o, ok := reflect.New(t).Interface().(client.Object); ok {
			out = append(out, o)
		}
	}
	return out
}

// statusSubresources are the kinds of the generated APIResourceSchemas
// that have a status subresource: the fake client treats status as kcp
// does for these, and as part of the object for the others.
func statusSubresources() map[schema.GroupKind]bool {
	out := map[schema.GroupKind]bool{}
	files, err := fs.Glob(exports.FS, "apiresourceschema-*.yaml")
	if err != nil {
		panic(err)
	}
	for _, f := range files {
		data, err := exports.FS.ReadFile(f)
		if err != nil {
			panic(err)
		}
		var ars struct {
			Spec struct {
				Group string `json:"group"`
				Names struct {
					Kind string `json:"kind"`
				} `json:"names"`
				Versions []struct {
					Subresources struct {
						Status *struct{} `json:"status"`
					} `json:"subresources"`
				} `json:"versions"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(data, &ars); err != nil {
			panic(fmt.Sprintf("%s: %v", f, err))
		}
		for _, v := range ars.Spec.Versions {
			if v.Subresources.Status != nil {
				out[schema.GroupKind{Group: ars.Spec.Group, Kind: ars.Spec.Names.Kind}] = true
			}
		}
	}
	return out
}

// Condition returns the condition of type typ among conds, and fails the
// test when there is none.
func Condition(tb testing.TB, conds []metav1.Condition, typ string) *metav1.Condition {
	tb.Helper()
	c := meta.FindStatusCondition(conds, typ)
	if c == nil {
		tb.Fatalf("no %s condition in %+v", typ, conds)
	}
	return c
}
