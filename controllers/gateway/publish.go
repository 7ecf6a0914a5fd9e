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
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gatewayv1alpha1 "github.com/knotless-dev/knotless/apis/gateway/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
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
	h := s.g.Spec.Hostname
	want := &Association{Type: lexicon.GatewayAssociation, Hostname: h, Lease: market.StrongRef{URI: lease.URI, CID: lease.CID},
		Service:   Service{Namespace: s.g.Spec.Service.Namespace, Name: s.g.Spec.Service.Name, Port: s.g.Spec.Service.Port},
		CreatedAt: market.Time(s.now)}
	cur, err := pub.Get(ctx, lexicon.GatewayAssociation, h)
	if err == nil && cur != nil {
		var have Association
		if json.Unmarshal(cur.Value, &have) == nil && sameClaim(&have, want) {
			s.st.Association = &gatewayv1alpha1.RecordRef{URI: cur.URI, CID: cur.CID}
			s.set(gatewayv1alpha1.ConditionPublished, metav1.ConditionTrue, gatewayv1alpha1.ReasonPublished, "association record "+cur.URI+" is in the requester's repo")
			return reconcile.Result{}, false, nil
		}
	}
	var wrote *recordRef
	if err == nil {
		wrote, err = ensure(ctx, pub, h, want)
	}
	if err != nil {
		s.notPublished(gatewayv1alpha1.ReasonPublishFailed, "the requester's PDS did not take the association record: "+conditions.Quote(err.Error()))
		return reconcile.Result{}, true, err
	}
	s.st.Association = &gatewayv1alpha1.RecordRef{URI: wrote.uri, CID: wrote.cid}
	s.r.written.Store(s.g.UID, s.now)
	s.log.Info("association record published", "hostname", h, "uri", wrote.uri)
	s.set(gatewayv1alpha1.ConditionPublished, metav1.ConditionTrue, gatewayv1alpha1.ReasonPublished, "association record "+wrote.uri+" is in the requester's repo")
	return reconcile.Result{}, false, nil
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

// unpublish deletes the association record this Gateway published, if
// any (status.association): from the repo of the DID its at-URI names,
// through that DID's identity in the Gateway's namespace. A DID with no
// identity left has no repo knotless can write: nothing to do.
func (s *syncer) unpublish() error {
	a := s.st.Association
	if a == nil {
		return nil
	}
	did, ok := didOf(a.URI)
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
	if _, err := ensure(ctx, pub, s.g.Spec.Hostname, nil); err != nil {
		return err
	}
	s.log.Info("association record deleted", "hostname", s.g.Spec.Hostname, "uri", a.URI)
	s.st.Association = nil
	return nil
}

// didOf is the repo (DID) of an at-URI.
func didOf(uri string) (string, bool) {
	rest, ok := strings.CutPrefix(uri, "at://")
	if !ok {
		return "", false
	}
	did, _, _ := strings.Cut(rest, "/")
	return did, strings.HasPrefix(did, "did:")
}

// repo is the Publisher of did's repo: the MarketIdentity of the
// Gateway's namespace that is did (market.IdentityRepo: Ready, and its
// repo taken up). None is a *conditions.Error (NotFound, NotReady).
func (s *syncer) repo(ctx context.Context, did string) (market.Publisher, error) {
	var ids marketv1alpha1.MarketIdentityList
	if err := s.c.List(ctx, &ids, client.InNamespace(s.g.Namespace)); err != nil {
		return nil, err
	}
	for _, id := range ids.Items {
		if did == "" || id.Status.DID != did {
			continue
		}
		_, repo, err := market.IdentityRepo(ctx, s.c, s.g.Namespace, id.Name)
		if err != nil {
			return nil, err
		}
		return market.Connect(ctx, s.r.Connect, s.r.Pool, s.c, s.lc, repo)
	}
	return nil, conditions.Errorf(marketv1alpha1.ReasonNotFound, nil, "no MarketIdentity of namespace %s is the contract's requester %s", s.g.Namespace, did)
}
