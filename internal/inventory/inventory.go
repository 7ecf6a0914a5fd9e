// Package inventory ties the AtprotoRecords of a workspace to the
// inventory knotless keeps in each repo on the PDS (pds.InventoryCollection:
// one marker per record, written in the record's own commit). The record
// and repo controllers share it: the record controller prunes the record
// of an AtprotoRecord that was deleted, the repo controller prunes
// everything the inventory lists that no AtprotoRecord declares any more
// (after a provider restart: objects deleted while no provider ran), and
// everything when the repo goes.
//
// A prune judges from the workspace's cache, so it first waits until the
// cache is synced (Synced): a cache that is not filled yet would declare
// nothing, and every record would look orphaned.
package inventory

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/internal/names"
	"github.com/knotless-dev/knotless/internal/pds"
)

// Owner is the owner the markers of a repo's records name: the
// AtprotoRepo's UID, so that two AtprotoRepos of one account (in two
// workspaces, say) each prune only what they wrote.
func Owner(repo *atprotov1alpha1.AtprotoRepo) string { return string(repo.UID) }

// KeyOf is the record an AtprotoRecord declares.
func KeyOf(rec *atprotov1alpha1.AtprotoRecord) pds.Key {
	return pds.Key{Collection: rec.Spec.Collection, RKey: rec.Spec.RKey}
}

// indexValue is the value of names.RecordsByKey for record k of repo.
func indexValue(repo string, k pds.Key) string {
	return repo + "/" + k.Collection + "/" + k.RKey
}

// IndexByKey is the extractor of the field index names.RecordsByKey:
// repo name, collection and record key of an AtprotoRecord.
func IndexByKey(o client.Object) []string {
	rec, ok := o.(*atprotov1alpha1.AtprotoRecord)
	if !ok {
		return nil
	}
	return []string{indexValue(rec.Spec.RepoRef.Name, KeyOf(rec))}
}

// Declared returns the keep function of a prune of repo: whether an
// AtprotoRecord of the repo's namespace that names the repo declares
// the key (being deleted or not: an object that still exists is not
// pruned; its deletion prunes it). A failed read keeps the record:
// nothing is deleted on doubt.
func Declared(c client.Reader, repo *atprotov1alpha1.AtprotoRepo) func(context.Context, pds.Key) bool {
	return func(ctx context.Context, k pds.Key) bool {
		var list atprotov1alpha1.AtprotoRecordList
		if err := c.List(ctx, &list, client.InNamespace(repo.Namespace), client.MatchingFields{names.RecordsByKey: indexValue(repo.Name, k)}); err != nil {
			return true
		}
		return len(list.Items) > 0
	}
}

// Nothing keeps any record: the keep function of the prune of a repo
// that is being deleted.
func Nothing(context.Context, pds.Key) bool { return false }

// Synced waits until the workspace's cache has synced its informers (or
// ctx ends) and reports whether it has.
func Synced(ctx context.Context, cl cluster.Cluster) bool {
	return cl.GetCache().WaitForCacheSync(ctx)
}
