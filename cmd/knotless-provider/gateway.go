/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"

	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"

	"github.com/knotless-dev/knotless/controllers/gateway"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/repoconn"
	"github.com/knotless-dev/knotless/internal/tenantreach"
)

// setupGateways registers the gateway controller: it publishes the
// requesters' association records and probes their hostnames through
// the bidders' gateways, whose certificates the system's roots and
// caFile (if set) verify.
func setupGateways(ctx context.Context, mgr mcmanager.Manager, caFile string, pool *repoconn.Pool, policy *netpolicy.Policy, reaches *tenantreach.Registry) error {
	roots, err := gatewayRoots(caFile)
	if err != nil {
		return err
	}
	if err := (&gateway.Reconciler{GetCluster: mgr.GetCluster, Reaches: reaches, Pool: pool, Policy: policy, Roots: roots}).SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the gateway controller: %w", err)
	}
	return nil
}

// gatewayRoots are the system's roots and the certificates of caFile.
func gatewayRoots(caFile string) (*x509.CertPool, error) {
	if caFile == "" {
		return nil, nil
	}
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--gateway-ca-file: %w", err)
	}
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--gateway-ca-file: %s holds no PEM certificate", caFile)
	}
	return roots, nil
}
