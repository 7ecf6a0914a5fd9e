/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gatewayv1alpha1 "github.com/knotless-dev/knotless/apis/gateway/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/pds"
)

// identityWait: the requester's identity or repo is not Ready.
const identityWait = 30 * time.Second

// Association is the content of a dev.knotless.gateway.association
// record.
type Association struct {
	Type      string           `json:"$type"`
	Hostname  string           `json:"hostname"`
	Lease     market.StrongRef `json:"lease"`
	Service   Service          `json:"service"`
	CreatedAt string           `json:"createdAt"`
}

// Service is the association's #service.
type Service struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Port      int32  `json:"port"`
}

// sameClaim: a and b claim the same hostname for the same lease and
// Service (the lease's CID and the creation time aside: a lease record
// the bidder updates is still the same lease).
func sameClaim(a, b *Association) bool {
	return a.Hostname == b.Hostname && a.Lease.URI == b.Lease.URI && a.Service == b.Service
}

// claimOf is the Gateway's claim for the lease of cc.
func (s *syncer) claimOf(lease *marketv1alpha1.RecordRef) *Association {
	return &Association{Type: lexicon.GatewayAssociation, Hostname: s.g.Spec.Hostname, Lease: market.StrongRef{URI: lease.URI, CID: lease.CID},
		Service:   Service{Namespace: s.g.Spec.Service.Namespace, Name: s.g.Spec.Service.Name, Port: s.g.Spec.Service.Port},
		CreatedAt: market.Time(s.now)}
}

// rewrite is the last claim written for a Gateway and when it may be
// written again if it does not show.
type rewrite struct {
	key  string
	next time.Time
	wait time.Duration
}

// publish makes the association record of the Gateway, for the lease of
// cc, the one in the requester's repo. done: the sync stops here with
// res and err (the conditions say why).
func (s *syncer) publish(cc *marketv1alpha1.ComputeContract) (res reconcile.Result, done bool, err error) {
	lease := cc.Status.Records.Lease
	if lease == nil || lease.URI == "" {
		s.notPublished(gatewayv1alpha1.ReasonTenantNotReady, fmt.Sprintf("ComputeContract %s names no lease yet", cc.Name))
		return reconcile.Result{RequeueAfter: tenantWait}, true, nil
	}
	ctx, cancel := context.WithTimeout(s.ctx, deadline)
	defer cancel()
	pub, err := s.repo(ctx, cc.Spec.RequesterDID)
	var ce *conditions.Error
	switch {
	case errors.As(err, &ce):
		s.notPublished(gatewayv1alpha1.ReasonIdentityNotReady, ce.Message)
		return reconcile.Result{RequeueAfter: identityWait}, true, nil
	case err != nil:
		return reconcile.Result{}, true, err
	}
	want := s.claimOf(lease)
	key := fmt.Sprintf("%s %s %v", want.Hostname, want.Lease.URI, want.Service)
	cur, err := pub.Get(ctx, lexicon.GatewayAssociation, want.Hostname)
	if err != nil {
		s.notPublished(gatewayv1alpha1.ReasonPublishFailed, "the requester's PDS did not answer")
		return reconcile.Result{}, true, err
	}
	if have := decodeClaim(cur); have != nil && sameClaim(have, want) {
		s.st.Association = &gatewayv1alpha1.RecordRef{URI: cur.URI, CID: cur.CID}
		s.set(gatewayv1alpha1.ConditionPublished, metav1.ConditionTrue, gatewayv1alpha1.ReasonPublished, "association record "+cur.URI+" is in the requester's repo")
		return reconcile.Result{}, false, nil
	}
	last := &rewrite{}
	if v, ok := s.r.rewrites.Load(s.g.UID); ok {
		last = v.(*rewrite)
	}
	if last.key == key && s.now.Before(last.next) {
		// Written already, and not shown: the PDS is looked at again
		// later, not written again at once.
		s.notPublished(gatewayv1alpha1.ReasonPublishFailed, "the requester's PDS does not show the association record written")
		return reconcile.Result{RequeueAfter: last.next.Sub(s.now)}, true, nil
	}
	wait := firstWait
	if last.key == key {
		wait = min(2*last.wait, lastWait)
	}
	wrote, err := ensure(ctx, pub, want.Hostname, want)
	if err != nil {
		s.notPublished(gatewayv1alpha1.ReasonPublishFailed, "the requester's PDS did not take the association record")
		return reconcile.Result{}, true, err
	}
	s.r.rewrites.Store(s.g.UID, &rewrite{key: key, next: s.now.Add(wait), wait: wait})
	s.r.prober().forget(s.g.UID)
	s.st.Association = &gatewayv1alpha1.RecordRef{URI: wrote.uri, CID: wrote.cid}
	s.log.Info("association record published", "hostname", want.Hostname, "uri", wrote.uri)
	s.set(gatewayv1alpha1.ConditionPublished, metav1.ConditionTrue, gatewayv1alpha1.ReasonPublished, "association record "+wrote.uri+" is in the requester's repo")
	return reconcile.Result{}, false, nil
}

// decodeClaim is the claim of an association record (nil: none).
func decodeClaim(rec *pds.Record) *Association {
	if rec == nil {
		return nil
	}
	var a Association
	if json.Unmarshal(rec.Value, &a) != nil {
		return nil
	}
	return &a
}

type recordRef struct{ uri, cid string }

// ensure writes value as the association record of hostname (nil:
// deletes it).
func ensure(ctx context.Context, pub market.Publisher, hostname string, value *Association) (*recordRef, error) {
	var v any
	if value != nil {
		v = value
	}
	res, err := pub.Publish(ctx, lexicon.GatewayAssociation, hostname, v)
	if err != nil {
		return nil, err
	}
	if res.After == nil {
		return &recordRef{}, nil
	}
	return &recordRef{uri: res.After.URI, cid: res.After.CID}, nil
}

// unpublish deletes the association record of the Gateway's hostname
// from the requester's repo when it is this Gateway's own claim (its
// hostname and Service; the lease of cc, when cc is known), and only if
// the Gateway holds the finalizer (it published): a record of another
// Gateway of the hostname, or of anyone else, stays. The repo is the
// contract's requester's, or without a contract the one status names,
// through an identity of the Gateway's namespace only (R22). A DID with
// no identity left has no repo knotless can write: nothing to do.
func (s *syncer) unpublish(cc *marketv1alpha1.ComputeContract) error {
	a := s.st.Association
	if a == nil || !controllerutil.ContainsFinalizer(s.g, Finalizer) {
		s.st.Association = nil
		return nil
	}
	did, ok := market.DIDOf(a.URI)
	if cc != nil {
		did, ok = cc.Spec.RequesterDID, cc.Spec.RequesterDID != ""
	}
	if !ok {
		s.st.Association = nil
		return nil
	}
	ctx, cancel := context.WithTimeout(s.ctx, deadline)
	defer cancel()
	pub, err := s.repo(ctx, did)
	var ce *conditions.Error
	if errors.As(err, &ce) && ce.Reason == marketv1alpha1.ReasonNotFound {
		s.log.Info("no identity of the Gateway's DID is left: its association record stays in the repo", "uri", a.URI)
		s.st.Association = nil
		return nil
	}
	if err != nil {
		return err
	}
	cur, err := pub.Get(ctx, lexicon.GatewayAssociation, s.g.Spec.Hostname)
	if err != nil {
		return err
	}
	if have := decodeClaim(cur); have != nil && s.ownClaim(have, cc) {
		if _, err := ensure(ctx, pub, s.g.Spec.Hostname, nil); err != nil {
			return err
		}
		s.log.Info("association record deleted", "hostname", s.g.Spec.Hostname, "uri", cur.URI)
	}
	s.st.Association = nil
	s.r.rewrites.Delete(s.g.UID)
	return nil
}

// ownClaim: a is this Gateway's claim: its hostname and Service, and
// the lease of cc when cc is known.
func (s *syncer) ownClaim(a *Association, cc *marketv1alpha1.ComputeContract) bool {
	sp := s.g.Spec
	if a.Hostname != sp.Hostname || a.Service != (Service{Namespace: sp.Service.Namespace, Name: sp.Service.Name, Port: sp.Service.Port}) {
		return false
	}
	return cc == nil || cc.Status.Records.Lease == nil || a.Lease.URI == cc.Status.Records.Lease.URI
}

// repo is the Publisher of did's repo through an identity of the
// Gateway's namespace (market.PublisherOf).
func (s *syncer) repo(ctx context.Context, did string) (market.Publisher, error) {
	return market.PublisherOf(ctx, s.r.Connect, s.r.Pool, s.c, s.lc, s.g.Namespace, did)
}
