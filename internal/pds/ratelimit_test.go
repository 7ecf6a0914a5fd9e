package pds_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/knotless-dev/knotless/internal/pds"
)

// TestRateLimitWaitIsBounded (from an attack): a reset however far ahead
// (a PDS's RateLimit-Reset of 99999999999, or a zero now) waits at most
// MaxRateLimitWait, never a negative wait; past or absent resets are no
// wait at all.
func TestRateLimitWaitIsBounded(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name string
		err  error
		now  time.Time
		want time.Duration
		ok   bool
	}{
		{"far future, wrapped", fmt.Errorf("x: %w", &pds.RateLimitedError{Reset: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)}), now, pds.MaxRateLimitWait, true},
		{"zero now", &pds.RateLimitedError{Reset: now}, time.Time{}, pds.MaxRateLimitWait, true},
		{"30 s", &pds.RateLimitedError{Reset: now.Add(30 * time.Second)}, now, 31 * time.Second, true},
		{"past", &pds.RateLimitedError{Reset: now.Add(-time.Second)}, now, 0, false},
		{"no reset", &pds.RateLimitedError{}, now, 0, false},
		{"another error", errors.New("x"), now, 0, false},
	} {
		got, ok := pds.RateLimitWait(tc.err, tc.now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}
