/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package network

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
)

func TestValidate(t *testing.T) {
	ok := marketv1alpha1.MarketNetworkSpec{Firehoses: []string{"https://relay.example"}, PDSHosts: []string{"https://PDS.example/"}, OperatorDID: "did:plc:ewvi7nxzyoun6zhxrhs64oiz"}
	for _, tc := range []struct {
		name   string
		mutate func(*marketv1alpha1.MarketNetworkSpec)
		want   string // substring of the error; empty: valid
	}{
		{"valid", func(*marketv1alpha1.MarketNetworkSpec) {}, ""},
		{"no firehose", func(s *marketv1alpha1.MarketNetworkSpec) { s.Firehoses = nil }, "spec.firehoses: at least one"},
		{"firehose with a path", func(s *marketv1alpha1.MarketNetworkSpec) { s.Firehoses = []string{"https://relay.example/xrpc"} }, "spec.firehoses[0]"},
		{"firehose with credentials", func(s *marketv1alpha1.MarketNetworkSpec) { s.Firehoses = []string{"https://u:p@relay.example"} }, "spec.firehoses[0]"},
		{"ws scheme", func(s *marketv1alpha1.MarketNetworkSpec) { s.Firehoses = []string{"wss://relay.example"} }, "spec.firehoses[0]"},
		{"pds host with a query", func(s *marketv1alpha1.MarketNetworkSpec) { s.PDSHosts = []string{"https://pds.example?x=1"} }, "spec.pdsHosts[0]"},
		{"other namespace", func(s *marketv1alpha1.MarketNetworkSpec) { s.Namespace = "com.example.market" }, "has the lexicons of dev.knotless.market only"},
		{"not a namespace", func(s *marketv1alpha1.MarketNetworkSpec) { s.Namespace = "nope" }, "is not an NSID namespace"},
		{"bad operator", func(s *marketv1alpha1.MarketNetworkSpec) { s.OperatorDID = "did:plc" }, "spec.operatorDID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := *ok.DeepCopy()
			tc.mutate(&spec)
			err := Validate(&spec)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestNormalizeHost(t *testing.T) {
	got, err := NormalizeHost("https://PDS.Example:443/")
	if err != nil || got != "https://pds.example:443" {
		t.Fatalf("NormalizeHost = %q, %v", got, err)
	}
}

func TestName(t *testing.T) {
	n := &marketv1alpha1.MarketNetwork{ObjectMeta: metav1.ObjectMeta{Name: "main"}}
	if got := Name(n); got != "dev.knotless.market/main" {
		t.Errorf("Name = %q", got)
	}
}
