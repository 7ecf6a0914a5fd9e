/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package clock holds what controllers need of time: the current time,
// which a test may set through a Reconciler's Now field, and how often an
// object with nothing due is looked at again.
package clock

import (
	"cmp"
	"time"
)

// DefaultResync is how often an object with nothing due is looked at
// again when its Reconciler's Resync is zero.
const DefaultResync = 2 * time.Minute

// Now returns now(), or the wall clock's time when now is nil (a
// Reconciler's Now field left unset).
func Now(now func() time.Time) time.Time {
	if now != nil {
		return now()
	}
	return time.Now()
}

// Resync returns d, or DefaultResync when d is zero.
func Resync(d time.Duration) time.Duration {
	return cmp.Or(d, DefaultResync)
}
