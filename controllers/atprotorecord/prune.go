package atprotorecord

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mchandler "sigs.k8s.io/multicluster-runtime/pkg/handler"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/internal/inventory"
	"github.com/knotless-dev/knotless/internal/pds"
)

// tombstone is what is left of a deleted AtprotoRecord until its record
// is pruned: the object's UID, its repo and the record it declared.
type tombstone struct {
	uid  types.UID
	repo string
	key  pds.Key
}

// tombstones are the deleted AtprotoRecords whose records are not pruned
// yet, by request. They live in memory only: what a restart loses, the
// repo controller's prune of the whole inventory finds.
type tombstones struct {
	mu sync.Mutex
	m  map[mcreconcile.Request][]tombstone
}

func (t *tombstones) add(req mcreconcile.Request, ts ...tombstone) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[mcreconcile.Request][]tombstone{}
	}
	for _, x := range ts {
		if !slices.Contains(t.m[req], x) {
			t.m[req] = append(t.m[req], x)
		}
	}
}

// take removes and returns the tombstones of req but that of the object
// with UID live (which exists).
func (t *tombstones) take(req mcreconcile.Request, live types.UID) []tombstone {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out, keep []tombstone
	for _, x := range t.m[req] {
		if live != "" && x.uid == live {
			keep = append(keep, x)
			continue
		}
		out = append(out, x)
	}
	if len(keep) > 0 {
		t.m[req] = keep
	} else {
		delete(t.m, req)
	}
	return out
}

// remember is the handler of AtprotoRecord deletions: it keeps a
// tombstone of the object, then enqueues its name.
func (r *Reconciler) remember() mchandler.TypedEventHandlerFunc[client.Object, mcreconcile.Request] {
	return func(name multicluster.ClusterName, _ cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
		return handler.TypedFuncs[client.Object, mcreconcile.Request]{
			DeleteFunc: func(_ context.Context, e event.TypedDeleteEvent[client.Object], q workqueue.TypedRateLimitingInterface[mcreconcile.Request]) {
				rec, ok := e.Object.(*atprotov1alpha1.AtprotoRecord)
				if !ok {
					return
				}
				req := mcreconcile.Request{ClusterName: name, Request: reconcile.Request{NamespacedName: client.ObjectKeyFromObject(rec)}}
				r.deleted.add(req, tombstone{uid: rec.UID, repo: rec.Spec.RepoRef.Name, key: inventory.KeyOf(rec)})
				q.Add(req)
			},
		}
	}
}

// pruneDeleted prunes the records of req's deleted objects but the live
// one (UID live). A tombstone whose prune fails stays, and the error
// backs the request off.
func (r *Reconciler) pruneDeleted(ctx context.Context, cl cluster.Cluster, req mcreconcile.Request, live types.UID) (reconcile.Result, error) {
	ts := r.deleted.take(req, live)
	for i, t := range ts {
		if err := r.prune(ctx, cl, req, t); err != nil {
			r.deleted.add(req, ts[i:]...)
			if wait, ok := pds.RateLimitWait(err, time.Now()); ok {
				return reconcile.Result{RequeueAfter: wait}, nil
			}
			return reconcile.Result{}, fmt.Errorf("deleting the record %s of the deleted AtprotoRecord %s: %w", t.key, req.Name, err)
		}
	}
	return reconcile.Result{}, nil
}

// prune deletes the record of a deleted AtprotoRecord from the PDS, with
// its marker, when the repo's inventory lists it and no AtprotoRecord
// declares it any more. It connects even while the repo is suspended:
// clean-up goes on (R04).
func (r *Reconciler) prune(ctx context.Context, cl cluster.Cluster, req mcreconcile.Request, t tombstone) error {
	c := cl.GetClient()
	repo := &atprotov1alpha1.AtprotoRepo{}
	err := c.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: t.repo}, repo)
	switch {
	case apierrors.IsNotFound(err):
		log.FromContext(ctx).Info("the record of a deleted AtprotoRecord stays on the PDS: its AtprotoRepo is gone", "repo", t.repo, "record", t.key.String())
		return nil
	case err != nil:
		return err
	case !repo.DeletionTimestamp.IsZero():
		return nil // the repo's own prune deletes everything it wrote
	case repo.Status.DID == "":
		return nil // never connected: it wrote nothing
	}
	if !inventory.Synced(ctx, cl) {
		return errors.New("the workspace's cache has not synced")
	}
	pc := r.Pool.Get(string(req.ClusterName), repo)
	if pc == nil {
		if pc, err = r.Pool.Connect(ctx, c, string(req.ClusterName), repo); err != nil {
			return err
		}
	}
	n, err := pc.Prune(ctx, inventory.Owner(repo), []pds.Key{t.key}, inventory.Declared(c, repo))
	if err != nil {
		return err
	}
	if n > 0 {
		log.FromContext(ctx).V(1).Info("deleted the record of a deleted AtprotoRecord", "repo", repo.Name, "record", t.key.String())
	}
	return nil
}
