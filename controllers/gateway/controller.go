/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package gateway reconciles Gateways: the requester's half of serving a
// Service of its tenant on a public hostname (issue 32). For a Gateway
// whose contract is Active and mounted it publishes, in the requester's
// own repo, the dev.knotless.gateway.association record of the hostname
// (record key: the hostname; the lease it rests on; the Service), which
// the agent of the bidder running the tenant reads from the network and
// serves (controllers/gatewayroute). It then probes the hostname through
// the gateway the lease names and says whether a request reached the
// Service (Ready). Deleting the Gateway, or its contract ending, deletes
// the record, and with it the route.
//
// Nothing passes to the bidder's side but the signed record (R20): the
// requester's provider writes only its own repo.
package gateway

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	gatewayv1alpha1 "github.com/knotless-dev/knotless/apis/gateway/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clock"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/finalize"
	"github.com/knotless-dev/knotless/internal/mapping"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/predicates"
	"github.com/knotless-dev/knotless/internal/repoconn"
	"github.com/knotless-dev/knotless/internal/ssa"
	"github.com/knotless-dev/knotless/internal/tenantreach"
)

const (
	// Name is the controller's name.
	Name = "gateway"
	// FieldManager owns Gateway status and finalizer.
	FieldManager = "knotless-gateway"
	// Finalizer deletes the Gateway's association record.
	Finalizer = "gateway.knotless.dev/association"

	byContract = "gateway.knotless.dev/contract"
	byHostname = "gateway.knotless.dev/hostname"
)

// Waits of the controller.
const (
	// tenantWait: the contract's tenant is not mounted yet.
	tenantWait = 15 * time.Second
	// servingWait: the hostname is served; probed again.
	servingWait = 5 * time.Minute
	deadline    = 30 * time.Second
)

// Reconciler reconciles Gateways in every engaged workspace.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
	// Reaches is how the requester's side reaches each mounted tenant,
	// with what the bidder's lease says (its gateway among it).
	Reaches *tenantreach.Registry
	// Pool logs in to the requesters' repos; Connect, when set, replaces
	// it (tests).
	Pool    *repoconn.Pool
	Connect market.Connector
	// Policy is the provider's address policy, which the probes dial
	// through.
	Policy *netpolicy.Policy
	// Roots are the current roots that verify the gateways'
	// certificates (nil, or a nil pool: the system's).
	Roots func() *x509.CertPool
	// Probe, when set, replaces the request through the gateway (tests).
	Probe func(ctx context.Context, address, hostname string) Probed
	// Now is the clock (default time.Now).
	Now func() time.Time

	once   sync.Once
	probes *prober
	// rewrites are the claims written, by Gateway UID: a claim that does
	// not show in the repo after it was written is written again only
	// after a wait that doubles (a PDS that drops it cannot make a loop).
	rewrites sync.Map
}

// prober is the Reconciler's prober (made on first use).
func (r *Reconciler) prober() *prober {
	r.once.Do(func() {
		probe := r.Probe
		if probe == nil {
			probe = func(ctx context.Context, address, hostname string) Probed {
				var roots *x509.CertPool
				if r.Roots != nil {
					roots = r.Roots()
				}
				return Probe(ctx, r.Policy, roots, address, hostname)
			}
		}
		r.probes = newProber(probe, func() time.Time { return clock.Now(r.Now) })
	})
	return r.probes
}

// SetupWithManager registers the controller: a Gateway is looked at when
// its spec changes, when its contract changes phase or lease, and when
// another Gateway of its hostname comes or goes.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr mcmanager.Manager) error {
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &gatewayv1alpha1.Gateway{}, byContract, func(o client.Object) []string {
		return []string{o.(*gatewayv1alpha1.Gateway).Spec.ContractRef.Name}
	}); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &gatewayv1alpha1.Gateway{}, byHostname, func(o client.Object) []string {
		return []string{o.(*gatewayv1alpha1.Gateway).Spec.Hostname}
	}); err != nil {
		return err
	}
	newList := func() client.ObjectList { return &gatewayv1alpha1.GatewayList{} }
	if err := mgr.GetLocalManager().Add(r.prober()); err != nil {
		return err
	}
	return engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&gatewayv1alpha1.Gateway{}, predicates.SpecOrLifecycleChanged()).
		Watches(&marketv1alpha1.ComputeContract{}, mapping.ByIndex(newList, byContract, func(o client.Object) string { return o.GetName() }),
			contractChanged()).
		Watches(&gatewayv1alpha1.Gateway{}, mapping.ByClusterIndex(newList, byHostname, func(o client.Object) string {
			return o.(*gatewayv1alpha1.Gateway).Spec.Hostname
		}), predicates.SpecOrLifecycleChanged()).
		WatchesRawSource(r.prober().source()).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{
			MaxConcurrentReconciles: 4,
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[mcreconcile.Request](time.Second, 5*time.Minute),
			ReconciliationTimeout:   time.Minute,
		}).
		Complete(r)
}

// contractChanged passes a contract's creation, deletion and the updates
// that change its phase or its lease record (the lease's gateway).
func contractChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*marketv1alpha1.ComputeContract)
			n, ok2 := e.ObjectNew.(*marketv1alpha1.ComputeContract)
			if !ok1 || !ok2 {
				return false
			}
			return o.Status.Phase != n.Status.Phase || leaseCID(o) != leaseCID(n)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

func leaseCID(cc *marketv1alpha1.ComputeContract) string {
	if cc.Status.Records.Lease == nil {
		return ""
	}
	return cc.Status.Records.Lease.CID
}

// Reconcile implements mcreconcile.Reconciler: load, sync, one status
// write.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	cl, err := r.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("getting workspace %s: %w", req.ClusterName, err)
	}
	s := &syncer{r: r, ctx: ctx, c: cl.GetClient(), lc: string(req.ClusterName), now: clock.Now(r.Now), log: log.FromContext(ctx)}
	s.g = &gatewayv1alpha1.Gateway{}
	if err := s.c.Get(ctx, req.NamespacedName, s.g); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	s.st = s.g.Status.DeepCopy()
	s.st.ObservedGeneration = s.g.Generation
	if !s.g.DeletionTimestamp.IsZero() {
		return s.finalize()
	}
	res, err := s.sync(req)
	if werr := ssa.WriteStatus(ctx, s.c, s.g, &s.g.Status, s.st, ssa.StatusOptions{
		Manager: FieldManager, Event: ssa.ConditionChanged(s.g.Status.Conditions, s.st.Conditions, gatewayv1alpha1.ConditionReady),
		Recorder: cl.GetEventRecorder(Name), Action: "Serve",
	}); werr != nil {
		return reconcile.Result{}, werr
	}
	return res, err
}

// syncer is one reconcile of one Gateway.
type syncer struct {
	r   *Reconciler
	ctx context.Context
	c   client.Client
	lc  string
	now time.Time
	log logr.Logger
	g   *gatewayv1alpha1.Gateway
	st  *gatewayv1alpha1.GatewayStatus
}

// set sets the condition typ of the status.
func (s *syncer) set(typ string, status metav1.ConditionStatus, reason, msg string) {
	conditions.Set(&s.st.Conditions, typ, s.g.Generation, status, reason, msg)
}

// notPublished says why nothing is published: both conditions False.
func (s *syncer) notPublished(reason, msg string) {
	s.set(gatewayv1alpha1.ConditionPublished, metav1.ConditionFalse, reason, msg)
	s.set(gatewayv1alpha1.ConditionReady, metav1.ConditionFalse, reason, msg)
}

// sync publishes the record when the contract's tenant is mounted, and
// probes the hostname through the lease's gateway.
func (s *syncer) sync(req mcreconcile.Request) (reconcile.Result, error) {
	t, err := s.r.Reaches.Lookup(s.ctx, s.c, s.lc, s.g.Namespace, s.g.Spec.ContractRef.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	if t.Gone {
		// No tenant (no such requester's contract, or it is not Active):
		// the record goes, the contract's changes wake the Gateway.
		reason := gatewayv1alpha1.ReasonContractNotActive
		if t.CC == nil {
			reason = gatewayv1alpha1.ReasonContractNotFound
		}
		s.notPublished(reason, t.Why)
		s.st.URL, s.st.Address = "", ""
		return reconcile.Result{}, s.unpublish(t.CC)
	}
	if !t.Mounted {
		s.notPublished(gatewayv1alpha1.ReasonTenantNotReady, t.Why)
		return reconcile.Result{RequeueAfter: tenantWait}, nil
	}
	if holder, err := s.holder(); err != nil {
		return reconcile.Result{}, err
	} else if holder != nil {
		return reconcile.Result{}, s.taken(holder, t.CC)
	}
	if !controllerutil.ContainsFinalizer(s.g, Finalizer) {
		if err := ssa.Metadata(s.ctx, s.c, s.g, []string{Finalizer}, nil, FieldManager); err != nil {
			return reconcile.Result{}, err
		}
	}
	if res, done, err := s.publish(t.CC); done {
		return res, err
	}
	gw := t.Reach.Tenant.Gateway
	s.st.Address, s.st.URL = gw, URL(s.g.Spec.Hostname, gw)
	if gw == "" {
		s.set(gatewayv1alpha1.ConditionReady, metav1.ConditionFalse, gatewayv1alpha1.ReasonNoGateway, "the bidder's lease names no gateway: its agent serves no hostnames for this tenant")
		return reconcile.Result{}, nil
	}
	return s.probe(req, gw), nil
}

// holder is the Gateway of this workspace that holds the hostname if it
// is not this one: the oldest of the Gateways of the hostname that claim
// it, that is hold the finalizer (they published, or were about to; one
// being deleted holds it until its record is gone), and this one. Made
// in the same second (creation times have seconds only), one that
// claims wins over this one if it does not yet, then the first by
// namespace and name. A Gateway that claims nothing (its contract is
// not mounted, say) holds nothing.
func (s *syncer) holder() (*gatewayv1alpha1.Gateway, error) {
	var list gatewayv1alpha1.GatewayList
	if err := s.c.List(s.ctx, &list, client.MatchingFields{byHostname: s.g.Spec.Hostname}); err != nil {
		return nil, err
	}
	first := s.g
	for i := range list.Items {
		o := &list.Items[i]
		if o.UID == s.g.UID || o.Spec.Hostname != s.g.Spec.Hostname || !controllerutil.ContainsFinalizer(o, Finalizer) {
			continue
		}
		if older(o, first) {
			first = o
		}
	}
	if first.UID == s.g.UID {
		return nil, nil
	}
	return first, nil
}

// older: a's claim comes before b's (holder).
func older(a, b *gatewayv1alpha1.Gateway) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	if ca, cb := controllerutil.ContainsFinalizer(a, Finalizer), controllerutil.ContainsFinalizer(b, Finalizer); ca != cb {
		return ca
	}
	return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
}

// taken: holder holds the hostname. This Gateway claims nothing; a
// record of its own claim (written before it saw the holder) goes,
// unless the holder claims the same.
func (s *syncer) taken(holder *gatewayv1alpha1.Gateway, cc *marketv1alpha1.ComputeContract) error {
	who := "another Gateway of this workspace"
	if holder.Namespace == s.g.Namespace {
		who = "Gateway " + holder.Name
	}
	s.notPublished(gatewayv1alpha1.ReasonHostnameTaken, fmt.Sprintf("%s, made earlier, claims hostname %s", who, s.g.Spec.Hostname))
	s.st.URL, s.st.Address = "", ""
	if holder.Namespace == s.g.Namespace && holder.Spec.ContractRef == s.g.Spec.ContractRef && holder.Spec.Service == s.g.Spec.Service {
		s.st.Association = nil
		return nil
	}
	return s.unpublish(cc)
}

// URL is where hostname is reached through the gateway at address: its
// port shows unless it is 443.
func URL(hostname, address string) string {
	if address == "" {
		return ""
	}
	if _, port, err := net.SplitHostPort(address); err == nil && port != "443" {
		return "https://" + hostname + ":" + port + "/"
	}
	return "https://" + hostname + "/"
}

// finalize deletes the association record, then lets the Gateway go. A
// record that cannot be deleted (its repo's PDS does not answer) is let
// go after finalize.GiveUpAfter, with an Event that says so.
func (s *syncer) finalize() (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(s.g, Finalizer) {
		return reconcile.Result{}, nil
	}
	if err := s.unpublish(s.contract()); err != nil {
		if res, wait := finalize.Retry(s.ctx, s.g, s.now, err, "the Gateway's association record"); wait {
			return res, nil
		}
		if cl, cerr := s.r.GetCluster(s.ctx, multicluster.ClusterName(s.lc)); cerr == nil {
			cl.GetEventRecorder(Name).Eventf(s.g, nil, "Warning", "RecordLeft", "Delete",
				"the association record of %s could not be deleted from the repo: delete it there", s.g.Spec.Hostname)
		}
	}
	s.r.prober().forget(s.g.UID)
	s.r.rewrites.Delete(s.g.UID)
	return reconcile.Result{}, ssa.RemoveFinalizer(s.ctx, s.c, s.g, Finalizer)
}

// contract is the Gateway's contract if it is a requester's contract
// of its namespace, else nil.
func (s *syncer) contract() *marketv1alpha1.ComputeContract {
	cc := &marketv1alpha1.ComputeContract{}
	if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: s.g.Namespace, Name: s.g.Spec.ContractRef.Name}, cc); err != nil || cc.Spec.Side != marketv1alpha1.SideRequester {
		return nil
	}
	return cc
}
