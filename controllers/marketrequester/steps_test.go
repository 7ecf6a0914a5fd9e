/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package marketrequester

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/driver/drivertest"
	"github.com/knotless-dev/knotless/internal/market"
)

// stepCounts returns how many times each market step was observed, and
// the seconds observed in all.
func stepCounts(t *testing.T, h *prometheus.HistogramVec) (map[string]uint64, map[string]float64) {
	t.Helper()
	n, sum := map[string]uint64{}, map[string]float64{}
	for _, s := range market.Steps() {
		m := &dto.Metric{}
		if err := h.WithLabelValues(s).(prometheus.Histogram).Write(m); err != nil {
			t.Fatal(err)
		}
		n[s], sum[s] = m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
	}
	return n, sum
}

// TestMarketStepsAreObservedOnce: one deal from request to Active
// observes each market step once, at the write that ends it (not again
// on later reconciles), with the time the fake clock moved in between.
func TestMarketStepsAreObservedOnce(t *testing.T) {
	m := newMarket(t, bidderObj("fit", 30, 2))
	steps := market.NewStepSeconds()
	m.req.StepSeconds, m.bid.StepSeconds = steps, steps
	m.round()
	if n, _ := stepCounts(t, steps); n[market.StepRequestBid] != 1 || n[market.StepDeadlineAccept] != 0 {
		t.Fatalf("after the bid: %v", n)
	}
	m.clock.advance(11 * time.Second)
	m.round()
	m.round()
	cc := contracts(t, m.shop)
	if len(cc) != 1 || cc[0].Status.Phase != marketv1alpha1.ContractProvisioning {
		t.Fatalf("contracts %+v", cc)
	}
	// lease → Active counts from the contract's creationTimestamp, which
	// the API server sets at the create and the fake client leaves unset:
	// set it as the server would have, by the test's clock.
	cc[0].CreationTimestamp = metav1.NewTime(m.clock.now())
	if err := m.shop.Client.Update(context.Background(), &cc[0]); err != nil {
		t.Fatal(err)
	}
	if got := contracts(t, m.shop)[0].CreationTimestamp; !got.Time.Equal(m.clock.now()) {
		t.Fatalf("creationTimestamp %v not kept by the fake client", got)
	}
	m.clock.advance(3 * time.Second)
	m.runVM(m.bidders["fit"], drivertest.TestCA(t))
	m.round()
	m.round()
	m.tenantReady()
	m.round()
	if cc := contracts(t, m.shop); cc[0].Status.Phase != marketv1alpha1.ContractActive {
		t.Fatalf("contract %s, want Active", cc[0].Status.Phase)
	}
	m.clock.advance(time.Minute)
	m.round()
	m.round()
	n, sum := stepCounts(t, steps)
	for _, s := range market.Steps() {
		if n[s] != 1 {
			t.Errorf("step %s observed %d times, want 1 (all: %v)", s, n[s], n)
		}
	}
	// The deadline passed 1s before the clock's 11s step (bid window 10s).
	if got := sum[market.StepDeadlineAccept]; got <= 0 || got > 11 {
		t.Errorf("deadline → accept %vs", got)
	}
	if got := sum[market.StepLeaseActive]; got < 3 {
		t.Errorf("lease → Active %vs, want the 3s the clock moved at least", got)
	}
	t.Logf("seconds by step: %v", sum)
}
