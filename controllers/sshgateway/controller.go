/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package sshgateway reconciles SshGateways: the requester's half of SSH
// sessions into its tenant's pods (issue 32). For an SshGateway whose
// contract is Active and mounted it publishes, in the requester's own
// repo, a dev.knotless.gateway.ssh record (record key: the SshGateway's
// namespace and name, RecordKey) naming the contract's lease and the
// namespaces sessions may reach; the agent of the bidder running the tenant reads it from the
// network and lets sessions in (internal/sshgateway). The status says
// where to connect and the host key to expect, from the bidder's signed
// lease. Deleting the SshGateway, or its contract ending, deletes the
// record.
package sshgateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
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
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/mapping"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/predicates"
	"github.com/knotless-dev/knotless/internal/repoconn"
	"github.com/knotless-dev/knotless/internal/ssa"
	"github.com/knotless-dev/knotless/internal/tenantreach"
)

const (
	// Name is the controller's name.
	Name = "sshgateway"
	// FieldManager owns SshGateway status and finalizer.
	FieldManager = "knotless-sshgateway"
	// Finalizer deletes the SshGateway's record.
	Finalizer = "gateway.knotless.dev/ssh"

	byContract = "gateway.knotless.dev/ssh-contract"

	tenantWait   = 15 * time.Second
	identityWait = 30 * time.Second
	deadline     = 30 * time.Second
)

// Reconciler reconciles SshGateways in every engaged workspace.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
	// Reaches is how the requester's side reaches each mounted tenant,
	// with what the bidder's lease says (its SSH gateway among it).
	Reaches *tenantreach.Registry
	// Pool logs in to the requesters' repos; Connect, when set, replaces
	// it (tests).
	Pool    *repoconn.Pool
	Connect market.Connector
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// SetupWithManager registers the controller: an SshGateway is looked at
// when its spec changes and when its contract changes phase or lease.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr mcmanager.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &gatewayv1alpha1.SshGateway{}, byContract, func(o client.Object) []string {
		return []string{o.(*gatewayv1alpha1.SshGateway).Spec.ContractRef.Name}
	}); err != nil {
		return err
	}
	return engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&gatewayv1alpha1.SshGateway{}, predicates.SpecOrLifecycleChanged()).
		Watches(&marketv1alpha1.ComputeContract{}, mapping.ByIndex(func() client.ObjectList { return &gatewayv1alpha1.SshGatewayList{} }, byContract,
			func(o client.Object) string { return o.GetName() }), leaseChanged()).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{
			MaxConcurrentReconciles: 2,
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[mcreconcile.Request](time.Second, 5*time.Minute),
			ReconciliationTimeout:   time.Minute,
		}).
		Complete(r)
}

// leaseChanged passes a contract's creation, deletion and the updates
// that change its phase or its lease record (the lease's SSH gateway).
func leaseChanged() predicate.Predicate {
	cid := func(o client.Object) string {
		cc, ok := o.(*marketv1alpha1.ComputeContract)
		if !ok || cc.Status.Records.Lease == nil {
			return ""
		}
		return string(cc.Status.Phase) + " " + cc.Status.Records.Lease.CID
	}
	return predicate.Funcs{
		UpdateFunc:  func(e event.UpdateEvent) bool { return cid(e.ObjectOld) != cid(e.ObjectNew) },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// Reconcile implements mcreconcile.Reconciler: load, sync, one status
// write.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	cl, err := r.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("getting workspace %s: %w", req.ClusterName, err)
	}
	s := &syncer{r: r, ctx: ctx, c: cl.GetClient(), lc: string(req.ClusterName), now: clock.Now(r.Now), log: log.FromContext(ctx)}
	s.g = &gatewayv1alpha1.SshGateway{}
	if err := s.c.Get(ctx, req.NamespacedName, s.g); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	s.st = s.g.Status.DeepCopy()
	s.st.ObservedGeneration = s.g.Generation
	if !s.g.DeletionTimestamp.IsZero() {
		return s.finalize(cl)
	}
	res, err := s.sync()
	if werr := ssa.WriteStatus(ctx, s.c, s.g, &s.g.Status, s.st, ssa.StatusOptions{
		Manager: FieldManager, Event: ssa.ConditionChanged(s.g.Status.Conditions, s.st.Conditions, gatewayv1alpha1.ConditionReady),
		Recorder: cl.GetEventRecorder(Name), Action: "Serve",
	}); werr != nil {
		return reconcile.Result{}, werr
	}
	return res, err
}

// syncer is one reconcile of one SshGateway.
type syncer struct {
	r   *Reconciler
	ctx context.Context
	c   client.Client
	lc  string
	now time.Time
	log logr.Logger
	g   *gatewayv1alpha1.SshGateway
	st  *gatewayv1alpha1.SshGatewayStatus
}

// nothing says why nothing is published: both conditions False.
func (s *syncer) nothing(reason, msg string) {
	conditions.Set(&s.st.Conditions, gatewayv1alpha1.ConditionPublished, s.g.Generation, metav1.ConditionFalse, reason, msg)
	conditions.Set(&s.st.Conditions, gatewayv1alpha1.ConditionReady, s.g.Generation, metav1.ConditionFalse, reason, msg)
	s.st.Address, s.st.HostKey, s.st.Tenant, s.st.Command = "", "", "", ""
}

// sshRecord is the content of a dev.knotless.gateway.ssh record.
type sshRecord struct {
	Type       string           `json:"$type"`
	Lease      market.StrongRef `json:"lease"`
	Namespaces []string         `json:"namespaces"`
	CreatedAt  string           `json:"createdAt"`
}

// sync publishes the record when the contract's tenant is mounted.
func (s *syncer) sync() (reconcile.Result, error) {
	t, err := s.r.Reaches.Lookup(s.ctx, s.c, s.lc, s.g.Namespace, s.g.Spec.ContractRef.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	if t.Gone {
		reason := gatewayv1alpha1.ReasonContractNotActive
		if t.CC == nil {
			reason = gatewayv1alpha1.ReasonContractNotFound
		}
		s.nothing(reason, t.Why)
		return reconcile.Result{}, s.unpublish(t.CC)
	}
	lease := t.CC.Status.Records.Lease
	if !t.Mounted || lease == nil || lease.URI == "" {
		s.nothing(gatewayv1alpha1.ReasonTenantNotReady, t.Why)
		return reconcile.Result{RequeueAfter: tenantWait}, nil
	}
	if !controllerutil.ContainsFinalizer(s.g, Finalizer) {
		if err := ssa.Metadata(s.ctx, s.c, s.g, []string{Finalizer}, nil, FieldManager); err != nil {
			return reconcile.Result{}, err
		}
	}
	ctx, cancel := context.WithTimeout(s.ctx, deadline)
	defer cancel()
	pub, err := market.PublisherOf(ctx, s.r.Connect, s.r.Pool, s.c, s.lc, s.g.Namespace, t.CC.Spec.RequesterDID)
	var ce *conditions.Error
	switch {
	case errors.As(err, &ce):
		s.nothing(gatewayv1alpha1.ReasonIdentityNotReady, ce.Message)
		return reconcile.Result{RequeueAfter: identityWait}, nil
	case err != nil:
		return reconcile.Result{}, err
	}
	namespaces := slices.Sorted(slices.Values(s.g.Spec.Namespaces))
	cur, err := pub.Get(ctx, lexicon.GatewaySSH, RecordKey(s.g))
	if err != nil {
		s.nothing(gatewayv1alpha1.ReasonPublishFailed, "the requester's PDS did not answer")
		return reconcile.Result{}, err
	}
	if have := decode(cur); have == nil || have.Lease.URI != lease.URI || !slices.Equal(have.Namespaces, namespaces) {
		want := &sshRecord{Type: lexicon.GatewaySSH, Lease: market.StrongRef{URI: lease.URI, CID: lease.CID}, Namespaces: namespaces, CreatedAt: market.Time(s.now)}
		res, err := pub.Publish(ctx, lexicon.GatewaySSH, RecordKey(s.g), want)
		if err != nil {
			s.nothing(gatewayv1alpha1.ReasonPublishFailed, "the requester's PDS did not take the record")
			return reconcile.Result{}, err
		}
		cur = res.After
		s.log.Info("ssh record published", "namespaces", namespaces)
	}
	if cur != nil {
		s.st.Record = &gatewayv1alpha1.RecordRef{URI: cur.URI, CID: cur.CID}
	}
	conditions.Set(&s.st.Conditions, gatewayv1alpha1.ConditionPublished, s.g.Generation, metav1.ConditionTrue, gatewayv1alpha1.ReasonPublished, "the dev.knotless.gateway.ssh record is in the requester's repo")
	s.ready(t.Reach.Tenant.SSHAddress, t.Reach.Tenant.SSHHostKey, lease.URI[strings.LastIndex(lease.URI, "/")+1:])
	return reconcile.Result{}, nil
}

// RecordKey is the key of an SshGateway's record: its namespace and
// name (both DNS names, so a valid record key, unique in the repo).
func RecordKey(g *gatewayv1alpha1.SshGateway) string {
	return g.Namespace + "." + g.Name
}

// ready says where sessions go, from the lease: its SSH gateway, host
// key, and the tenant's name there (the lease's record key).
func (s *syncer) ready(address, hostKey, tenant string) {
	s.st.Address, s.st.HostKey, s.st.Tenant, s.st.Command = address, hostKey, tenant, ""
	if address == "" {
		conditions.Set(&s.st.Conditions, gatewayv1alpha1.ConditionReady, s.g.Generation, metav1.ConditionFalse, gatewayv1alpha1.ReasonNoGateway, "the bidder's lease names no SSH gateway: its agent serves none")
		return
	}
	host, port, _ := net.SplitHostPort(address) // deal.TenantOf checked it
	s.st.Command = fmt.Sprintf("ssh -p %s <handle-or-did>@%s -- %s/<namespace>/<pod> [command]", port, host, tenant)
	conditions.Set(&s.st.Conditions, gatewayv1alpha1.ConditionReady, s.g.Generation, metav1.ConditionTrue, gatewayv1alpha1.ReasonPublished,
		fmt.Sprintf("sessions go to %s, whose host key is %s", address, hostKey))
}

// decode is the content of a record (nil: none, or not one).
func decode(rec *pds.Record) *sshRecord {
	if rec == nil {
		return nil
	}
	var r sshRecord
	if json.Unmarshal(rec.Value, &r) != nil {
		return nil
	}
	return &r
}

// unpublish deletes the SshGateway's record when it holds the finalizer
// and the record is its own (it names the contract's lease, when the
// contract is known).
func (s *syncer) unpublish(cc *marketv1alpha1.ComputeContract) error {
	a := s.st.Record
	s.st.Record = nil
	if a == nil || !controllerutil.ContainsFinalizer(s.g, Finalizer) {
		return nil
	}
	did, ok := market.DIDOf(a.URI)
	if cc != nil {
		did, ok = cc.Spec.RequesterDID, cc.Spec.RequesterDID != ""
	}
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(s.ctx, deadline)
	defer cancel()
	pub, err := market.PublisherOf(ctx, s.r.Connect, s.r.Pool, s.c, s.lc, s.g.Namespace, did)
	var ce *conditions.Error
	if errors.As(err, &ce) && ce.Reason == marketv1alpha1.ReasonNotFound {
		return nil
	}
	if err != nil {
		s.st.Record = a
		return err
	}
	cur, err := pub.Get(ctx, lexicon.GatewaySSH, RecordKey(s.g))
	if err != nil {
		s.st.Record = a
		return err
	}
	// Only its own: the contract's lease, or without the contract the
	// version it published.
	have := decode(cur)
	if have == nil || (cc != nil && cc.Status.Records.Lease != nil && have.Lease.URI != cc.Status.Records.Lease.URI) ||
		((cc == nil || cc.Status.Records.Lease == nil) && cur.CID != a.CID) {
		return nil
	}
	if _, err := pub.Publish(ctx, lexicon.GatewaySSH, RecordKey(s.g), nil); err != nil {
		s.st.Record = a
		return err
	}
	s.log.Info("ssh record deleted", "uri", a.URI)
	return nil
}

// finalize deletes the record, then lets the SshGateway go (after
// finalize.GiveUpAfter if the record cannot be deleted).
func (s *syncer) finalize(cl cluster.Cluster) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(s.g, Finalizer) {
		return reconcile.Result{}, nil
	}
	cc := &marketv1alpha1.ComputeContract{}
	if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: s.g.Namespace, Name: s.g.Spec.ContractRef.Name}, cc); err != nil || cc.Spec.Side != marketv1alpha1.SideRequester {
		cc = nil
	}
	if err := s.unpublish(cc); err != nil {
		if res, wait := finalize.Retry(s.ctx, s.g, s.now, err, "the SshGateway's record"); wait {
			return res, nil
		}
		cl.GetEventRecorder(Name).Eventf(s.g, nil, "Warning", "RecordLeft", "Delete", "the dev.knotless.gateway.ssh record %s could not be deleted from the repo: delete it there", RecordKey(s.g))
	}
	return reconcile.Result{}, ssa.RemoveFinalizer(s.ctx, s.c, s.g, Finalizer)
}
