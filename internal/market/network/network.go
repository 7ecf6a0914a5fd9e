/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package network holds what the market controllers know of a
// MarketNetwork's spec: whether it is usable (Validate, which the
// marketnetwork controller reports and the identity, bidder and requester
// controllers check before they trade in it), its lexicon namespace, how
// records name it, and how PDS hosts compare.
package network

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/lexicon"
)

// Name is how the market's records name a network: its lexicon namespace
// and its name, "<namespace>/<name>" (a requester and a bidder trade in a
// network of the same name and namespace in their own workspaces).
func Name(n *marketv1alpha1.MarketNetwork) string {
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
