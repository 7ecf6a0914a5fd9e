/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package market

import (
	"context"
	"errors"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
)

// A Reconciler's Connect, when set, is what Connect uses: no pool is
// asked (none is given here).
func TestConnectUsesTheConnectorWhenSet(t *testing.T) {
	refused := errors.New("refused by the test's connector")
	var asked string
	conn := func(_ context.Context, _ client.Client, cluster string, repo *atprotov1alpha1.AtprotoRepo) (Publisher, error) {
		asked = cluster + "/" + repo.Name
		return nil, refused
	}
	repo := &atprotov1alpha1.AtprotoRepo{}
	repo.Name = "alice"
	if _, err := Connect(t.Context(), conn, nil, nil, "lc", repo); !errors.Is(err, refused) || asked != "lc/alice" {
		t.Fatalf("Connect: %v, connector asked for %q", err, asked)
	}
}
