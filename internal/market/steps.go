/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package market

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The market steps of knotless_market_step_seconds: each from the moment
// the side that acts could act, by its own clock, to the write that acts
// succeeding.
const (
	// StepRequestBid (bidder): a request's version first read → the bid
	// record written.
	StepRequestBid = "request_bid"
	// StepDeadlineAccept (requester): the request's bid deadline → the
	// accept record written.
	StepDeadlineAccept = "deadline_accept"
	// StepAcceptLease (bidder): an accept's version first read → the lease
	// record answering it (confirmed or declined) written.
	StepAcceptLease = "accept_lease"
	// StepLeaseActive (requester): the ComputeContract made when the lease
	// was read → its status written Active (the VM runs, the tenant is
	// mounted and Ready).
	StepLeaseActive = "lease_active"
)

// Steps returns the values of the step label.
func Steps() []string {
	return []string{StepRequestBid, StepDeadlineAccept, StepAcceptLease, StepLeaseActive}
}

// NewStepSeconds returns the histogram of the market steps' latencies,
// by step (one of Steps(): the label has four values).
func NewStepSeconds() *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "knotless_market_step_seconds",
		Help:    "Seconds of each market step, from when this side could act (by its own clock) to its write succeeding, by step: request_bid and accept_lease (bidder), deadline_accept and lease_active (requester).",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
	}, []string{"step"})
	for _, s := range Steps() {
		h.WithLabelValues(s)
	}
	return h
}

// ObserveStep records that step, begun at since, ended at end. Nothing is
// recorded without a histogram or a start; a start after the end (clocks)
// counts as 0.
func ObserveStep(h *prometheus.HistogramVec, step string, since, end time.Time) {
	if h == nil || since.IsZero() {
		return
	}
	h.WithLabelValues(step).Observe(max(end.Sub(since), 0).Seconds())
}
