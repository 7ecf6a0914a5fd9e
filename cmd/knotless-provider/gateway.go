/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package main

import (
	"context"
	"fmt"
	"time"

	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"

	"github.com/knotless-dev/knotless/controllers/gateway"
	"github.com/knotless-dev/knotless/controllers/sshgateway"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/repoconn"
	"github.com/knotless-dev/knotless/internal/tenantreach"
	"github.com/knotless-dev/knotless/internal/tlsfiles"
)

// setupGateways registers the gateway and sshgateway controllers. The
// first publishes the
// requesters' association records and probes their hostnames through
// the bidders' gateways, whose certificates the system's roots and
// caFile (if set; read again when it changes, R08) verify.
func setupGateways(ctx context.Context, mgr mcmanager.Manager, caFile string, pool *repoconn.Pool, policy *netpolicy.Policy, reaches *tenantreach.Registry) error {
	r := &gateway.Reconciler{GetCluster: mgr.GetCluster, Reaches: reaches, Pool: pool, Policy: policy}
	if caFile != "" {
		roots, err := tlsfiles.NewCA(caFile, true, 10*time.Second)
		if err != nil {
			return fmt.Errorf("--gateway-ca-file: %w", err)
		}
		r.Roots = roots.Pool
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the gateway controller: %w", err)
	}
	if err := (&sshgateway.Reconciler{GetCluster: mgr.GetCluster, Reaches: reaches, Pool: pool}).SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the sshgateway controller: %w", err)
	}
	return nil
}
