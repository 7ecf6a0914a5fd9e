/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package pds

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// NewWriteLatency returns the histogram Options.WriteLatency observes:
// seconds of each write call to a PDS (the XRPC round trip, not the
// session's refresh), by call (putRecord, deleteRecord, applyWrites) and
// result (ok, error). Both labels have a fixed set of values.
func NewWriteLatency() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "knotless_pds_write_duration_seconds",
		Help:    "Seconds of each write to a PDS (putRecord, deleteRecord, applyWrites), by call and result (ok, error).",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20},
	}, []string{"call", "result"})
}

// observeWrite records one write call that started at start.
func (c *Client) observeWrite(call string, start time.Time, err error) {
	if c.writeLatency == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	c.writeLatency.WithLabelValues(call, result).Observe(time.Since(start).Seconds())
}
