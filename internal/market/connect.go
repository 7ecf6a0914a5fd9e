/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package market

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
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
