package atprotorepo

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/cluster"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/inventory"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/repoconn"
	"github.com/knotless-dev/knotless/internal/ssa"
)

// errNotSynced: a prune waits for the workspace's cache, which would
// declare nothing before it synced.
var errNotSynced = errors.New("the workspace's cache has not synced yet")

// pruner prunes the inventory of the repos of one workspace.
type pruner struct {
	r       *Reconciler
	cl      cluster.Cluster
	cluster string
	events  events.EventRecorder
}

// prune connects to the repo's PDS and prunes its inventory.
func (p *pruner) prune(ctx context.Context, repo *atprotov1alpha1.AtprotoRepo, keep func(context.Context, pds.Key) bool) error {
	if !inventory.Synced(ctx, p.cl) {
		return errNotSynced
	}
	pc, err := p.r.Pool.Connect(ctx, p.cl.GetClient(), p.cluster, repo)
	if err != nil {
		return err
	}
	return p.pruneWith(ctx, pc, repo, keep)
}

// pruneWith deletes, with pc, every record of the repo's inventory that
// keep does not keep; a Normal Event Pruned says how many went.
func (p *pruner) pruneWith(ctx context.Context, pc *pds.Client, repo *atprotov1alpha1.AtprotoRepo, keep func(context.Context, pds.Key) bool) error {
	if !inventory.Synced(ctx, p.cl) {
		return errNotSynced
	}
	n, err := pc.Prune(ctx, inventory.Owner(repo), nil, keep)
	if n > 0 {
		p.events.Eventf(repo, nil, corev1.EventTypeNormal, "Pruned", "Prune", "deleted %d records from the PDS that knotless wrote and no AtprotoRecord declares any more", n)
	}
	if err != nil {
		return fmt.Errorf("pruning the repo's inventory: %w", repoconn.Classify(err))
	}
	return nil
}

// reportDeletion says on a repo being deleted why its deletion waits (the
// records it wrote cannot be deleted yet) and returns err.
func (p *pruner) reportDeletion(ctx context.Context, repo *atprotov1alpha1.AtprotoRepo, err error) error {
	reason := conditions.ReasonOf(err, "Error")
	if errors.Is(err, errNotSynced) {
		return err
	}
	st := repo.Status.DeepCopy()
	conditions.SetReady(&st.Conditions, repo.Generation, metav1.ConditionFalse, reason, "the repo goes once the records it wrote are deleted from the PDS: "+err.Error())
	if werr := ssa.WriteStatus(ctx, p.cl.GetClient(), repo, &repo.Status, st, ssa.StatusOptions{
		Manager:  FieldManager,
		Event:    ssa.ConditionChanged(repo.Status.Conditions, st.Conditions, atprotov1alpha1.ConditionReady),
		Recorder: p.events,
		Action:   "Delete",
	}); werr != nil {
		return werr
	}
	return err
}
