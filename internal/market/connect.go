/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package market

import (
	"context"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/repoconn"
)

// Connector opens the Publisher of a repo: a market Reconciler's Connect
// field, which tests set to publish to a fake PDS.
type Connector func(ctx context.Context, c client.Client, cluster string, repo *atprotov1alpha1.AtprotoRepo) (Publisher, error)

// Connect returns connect's Publisher for repo, or Client's over pool when
// connect is nil (a Reconciler's Connect left unset).
func Connect(ctx context.Context, connect Connector, pool *repoconn.Pool, c client.Client, cluster string, repo *atprotov1alpha1.AtprotoRepo) (Publisher, error) {
	if connect != nil {
		return connect(ctx, c, cluster, repo)
	}
	return Client(ctx, pool, c, cluster, repo)
}

// Forget drops what the market keeps for the follower of req (its object
// is gone): it is no longer followed and its inventory goes. m and invs
// may be nil.
func Forget(m Market, invs *Inventories, req mcreconcile.Request) {
	if m != nil {
		m.Unfollow(req)
	}
	if invs != nil {
		invs.Forget(engage.Key(req))
	}
}

// PublisherOf is the Publisher of did's repo as the workspace cluster
// has it in namespace: through the MarketIdentity of that namespace
// whose DID is did (IdentityRepo: Ready, its repo taken up). None is a
// *conditions.Error (NotFound, NotReady): a namespace reaches no other
// namespace's identity (R22).
func PublisherOf(ctx context.Context, connect Connector, pool *repoconn.Pool, c client.Client, cluster, namespace, did string) (Publisher, error) {
	var ids marketv1alpha1.MarketIdentityList
	if err := c.List(ctx, &ids, client.InNamespace(namespace)); err != nil {
		return nil, err
	}
	for _, id := range ids.Items {
		if did == "" || id.Status.DID != did {
			continue
		}
		_, repo, err := IdentityRepo(ctx, c, namespace, id.Name)
		if err != nil {
			return nil, err
		}
		return Connect(ctx, connect, pool, c, cluster, repo)
	}
	return nil, conditions.Errorf(marketv1alpha1.ReasonNotFound, nil, "no MarketIdentity of namespace %s is the contract's requester %s", namespace, did)
}

// DIDOf is the repo (DID) an at-URI names.
func DIDOf(uri string) (string, bool) {
	rest, ok := strings.CutPrefix(uri, "at://")
	if !ok {
		return "", false
	}
	did, _, _ := strings.Cut(rest, "/")
	return did, strings.HasPrefix(did, "did:")
}
