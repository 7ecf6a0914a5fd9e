/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package clock

import (
	"testing"
	"time"
)

func TestNow(t *testing.T) {
	fixed := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if got := Now(func() time.Time { return fixed }); !got.Equal(fixed) {
		t.Errorf("Now(set) = %v, want %v", got, fixed)
	}
	before := time.Now()
	if got := Now(nil); got.Before(before) || got.After(time.Now()) {
		t.Errorf("Now(nil) = %v, not the wall clock's time", got)
	}
}

func TestResync(t *testing.T) {
	if got := Resync(0); got != DefaultResync {
		t.Errorf("Resync(0) = %v, want %v", got, DefaultResync)
	}
	if got := Resync(time.Second); got != time.Second {
		t.Errorf("Resync(1s) = %v", got)
	}
}
