// Package backoff is the reconnect/restart schedule shared by knotless's
// long-running loops: exponential from Initial to Max, with jitter, reset
// after a healthy run. Durations are time.Duration throughout (the relay's
// bug of treating a count of nanoseconds as seconds cannot happen here).
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff bounds how fast a loop retries. Zero fields take the defaults
// (1s initial, 30s max, 1m healthy).
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
	// Healthy is how long a run must last before the next failure starts
	// the schedule from Initial again.
	Healthy time.Duration
}

// WithDefaults fills zero fields: 1s initial, 30s max, 1m healthy.
func (b Backoff) WithDefaults() Backoff {
	if b.Initial <= 0 {
		b.Initial = time.Second
	}
	if b.Max <= 0 {
		b.Max = 30 * time.Second
	}
	if b.Healthy <= 0 {
		b.Healthy = time.Minute
	}
	return b
}

// Delay returns the wait before retry number attempt (0-based): doubling
// from Initial, capped at Max, with up to 20% jitter taken off.
func (b Backoff) Delay(attempt int) time.Duration {
	d := b.Initial
	for i := 0; i < attempt && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	return d - time.Duration(rand.Int64N(int64(d)/5+1))
}

// Schedule counts consecutive failures of one loop.
type Schedule struct {
	b       Backoff
	attempt int
}

// NewSchedule returns a schedule over b (defaults filled).
func NewSchedule(b Backoff) *Schedule { return &Schedule{b: b.WithDefaults()} }

// Next returns the wait after a run that lasted ranFor and failed: a run
// longer than Healthy resets the schedule first.
func (s *Schedule) Next(ranFor time.Duration) time.Duration {
	if ranFor >= s.b.Healthy {
		s.attempt = 0
	}
	d := s.b.Delay(s.attempt)
	s.attempt++
	return d
}

// Attempt is the number of consecutive failures so far.
func (s *Schedule) Attempt() int { return s.attempt }

// Sleep waits d or until ctx ends; it reports whether the wait completed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
