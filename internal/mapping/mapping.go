// Package mapping holds event handlers that map an object to the objects
// that refer to it, through a field index, within one engaged workspace.
package mapping

import (
	"context"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mchandler "sigs.k8s.io/multicluster-runtime/pkg/handler"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"
)

// ByIndex enqueues the objects of newList's kind, in the changed object's
// workspace and namespace, whose field index has the value key(changed).
func ByIndex(newList func() client.ObjectList, index string, key func(client.Object) string) mchandler.TypedEventHandlerFunc[client.Object, mcreconcile.Request] {
	return byIndex(newList, index, key, true)
}

// ByClusterIndex is ByIndex for cluster-scoped referrers: every object of
// newList's kind in the workspace whose index has the value key(changed).
func ByClusterIndex(newList func() client.ObjectList, index string, key func(client.Object) string) mchandler.TypedEventHandlerFunc[client.Object, mcreconcile.Request] {
	return byIndex(newList, index, key, false)
}

func byIndex(newList func() client.ObjectList, index string, key func(client.Object) string, sameNamespace bool) mchandler.TypedEventHandlerFunc[client.Object, mcreconcile.Request] {
	return func(name multicluster.ClusterName, cl cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
		return handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []mcreconcile.Request {
			list := newList()
			opts := []client.ListOption{client.MatchingFields{index: key(o)}}
			if sameNamespace {
				opts = append(opts, client.InNamespace(o.GetNamespace()))
			}
			if err := cl.GetCache().List(ctx, list, opts...); err != nil {
				log.FromContext(ctx).Error(err, "listing referrers", "index", index, "object", o.GetName())
				return nil
			}
			items, err := meta.ExtractList(list)
			if err != nil {
				return nil
			}
			reqs := make([]mcreconcile.Request, 0, len(items))
			for _, it := range items {
				if co, ok := it.(client.Object); ok {
					reqs = append(reqs, mcreconcile.Request{ClusterName: name, Request: reconcile.Request{NamespacedName: client.ObjectKeyFromObject(co)}})
				}
			}
			return reqs
		})
	}
}
