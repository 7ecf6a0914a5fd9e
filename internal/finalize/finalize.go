// Package finalize is how a controller lets a deleted object go when the
// cleanup its finalizer guards (a record on a PDS, a binding or a Secret
// on a tenant) fails: it tries again every RetryAfter, and after
// GiveUpAfter since the deletion it lets the object go with what is left
// there, so that a PDS or a tenant that never answers cannot hold an
// object (and its namespace) for ever. The caller says what was left (an
// Event) where the user should clean it up by hand.
package finalize

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

const (
	// GiveUpAfter is how long after its deletion an object waits for a
	// cleanup that fails.
	GiveUpAfter = 2 * time.Minute
	// RetryAfter is how soon a failed cleanup is tried again.
	RetryAfter = 10 * time.Second
)

// Retry reports whether obj, being deleted, waits for the cleanup of what
// (a phrase: "the Gateway's association record"), which failed with err,
// and the result to try again with. Within GiveUpAfter of the deletion it
// logs that what is not cleaned up yet and returns true; after it, it logs
// that obj goes with what left behind and returns false: the caller
// removes the finalizer.
func Retry(ctx context.Context, obj client.Object, now time.Time, err error, what string) (reconcile.Result, bool) {
	since := now.Sub(obj.GetDeletionTimestamp().Time)
	if since < GiveUpAfter {
		log.FromContext(ctx).Info(what+" is not cleaned up yet: tried again in "+RetryAfter.String(), "error", err.Error(), "since", since.String())
		return reconcile.Result{RequeueAfter: RetryAfter}, true
	}
	log.FromContext(ctx).Info("letting the object go with "+what+" left behind", "error", err.Error(), "since", since.String())
	return reconcile.Result{}, false
}
