// Package marketnetwork checks MarketNetworks: their firehoses, PDS hosts,
// lexicon namespace and operator DID. It is the only status writer of
// MarketNetwork (field manager FieldManager) and never writes spec, so no
// restart clears a network's configuration (seed defect D03).
package marketnetwork

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/ssa"
)

const (
	// Name is the controller's name.
	Name = "marketnetwork"
	// FieldManager owns MarketNetwork status.
	FieldManager = "knotless-marketnetwork"
)

// Reconciler reconciles MarketNetworks in every engaged workspace.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(mgr mcmanager.Manager) error {
	return engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&marketv1alpha1.MarketNetwork{}, predicate.GenerationChangedPredicate{}).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{
			RateLimiter:           workqueue.NewTypedItemExponentialFailureRateLimiter[mcreconcile.Request](time.Second, time.Minute),
			ReconciliationTimeout: time.Minute,
		}).
		Complete(r)
}

// Reconcile implements mcreconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	cl, err := r.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("getting workspace %s: %w", req.ClusterName, err)
	}
	c := cl.GetClient()
	n := &marketv1alpha1.MarketNetwork{}
	if err := c.Get(ctx, req.NamespacedName, n); err != nil || !n.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	st := n.Status.DeepCopy()
	st.ObservedGeneration = n.Generation
	cond := metav1.Condition{Type: marketv1alpha1.ConditionReady, ObservedGeneration: n.Generation}
	if err := Validate(&n.Spec); err != nil {
		st.Phase = marketv1alpha1.PhaseFailed
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, marketv1alpha1.ReasonInvalidSpec, err.Error()
	} else {
		st.Phase = marketv1alpha1.PhaseReady
		cond.Status, cond.Reason = metav1.ConditionTrue, marketv1alpha1.ReasonReady
		cond.Message = fmt.Sprintf("%d firehose(s), namespace %s", len(n.Spec.Firehoses), Namespace(&n.Spec))
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	return reconcile.Result{}, ssa.WriteStatus(ctx, c, n, &n.Status, st, ssa.StatusOptions{
		Manager:  FieldManager,
		Event:    ssa.ConditionChanged(n.Status.Conditions, st.Conditions, marketv1alpha1.ConditionReady),
		Recorder: cl.GetEventRecorder(Name),
		Action:   "Validate",
	})
}

// NetworkName is how the market's records name a network: its lexicon namespace
// and its name, "<namespace>/<name>" (a requester and a bidder trade in a
// network of the same name and namespace in their own workspaces).
func NetworkName(n *marketv1alpha1.MarketNetwork) string {
	return Namespace(&n.Spec) + "/" + n.Name
}

// Namespace is the network's lexicon namespace (the default when unset).
func Namespace(spec *marketv1alpha1.MarketNetworkSpec) string {
	if spec.Namespace == "" {
		return lexicon.Namespace
	}
	return spec.Namespace
}

// Validate checks what the schema cannot: each firehose and PDS host is a
// source URL knotless can follow, the namespace is one knotless has
// lexicons for, and the operator is a DID.
func Validate(spec *marketv1alpha1.MarketNetworkSpec) error {
	if len(spec.Firehoses) == 0 {
		return errors.New("spec.firehoses: at least one firehose is required")
	}
	for i, f := range spec.Firehoses {
		if _, err := firehose.NormalizeSource(f); err != nil {
			return fmt.Errorf("spec.firehoses[%d]: %w", i, err)
		}
	}
	for i, h := range spec.PDSHosts {
		if _, err := NormalizeHost(h); err != nil {
			return fmt.Errorf("spec.pdsHosts[%d]: %w", i, err)
		}
	}
	if ns := Namespace(spec); ns != lexicon.Namespace {
		if _, err := syntax.ParseNSID(ns + ".x"); err != nil {
			return fmt.Errorf("spec.namespace: %q is not an NSID namespace", ns)
		}
		return fmt.Errorf("spec.namespace: knotless has the lexicons of %s only, not %s", lexicon.Namespace, ns)
	}
	if spec.OperatorDID != "" {
		if _, err := syntax.ParseDID(spec.OperatorDID); err != nil {
			return fmt.Errorf("spec.operatorDID: %w", err)
		}
	}
	return nil
}

// NormalizeHost returns a PDS host URL as scheme://host[:port] in lower
// case, so that hosts written differently compare equal.
func NormalizeHost(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("%q: want http(s)://host[:port] with no path, query or credentials", raw)
	}
	return u.Scheme + "://" + strings.ToLower(u.Host), nil
}
