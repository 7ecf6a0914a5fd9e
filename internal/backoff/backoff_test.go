package backoff

import (
	"testing"
	"time"
)

func TestDelayDoublesUpToMaxWithJitter(t *testing.T) {
	b := Backoff{Initial: time.Second, Max: 8 * time.Second}.WithDefaults()
	want := []time.Duration{1, 2, 4, 8, 8, 8}
	for attempt, w := range want {
		w *= time.Second
		for range 50 {
			d := b.Delay(attempt)
			if d > w || d < w-w/5 {
				t.Fatalf("attempt %d: delay %s outside [%s, %s]", attempt, d, w-w/5, w)
			}
		}
	}
	if got := (Backoff{}).WithDefaults(); got.Initial != time.Second || got.Max != 30*time.Second || got.Healthy != time.Minute {
		t.Fatalf("defaults: %+v", got)
	}
}

func TestScheduleResetsAfterAHealthyRun(t *testing.T) {
	s := NewSchedule(Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Healthy: 10 * time.Second})
	var got []time.Duration
	for _, ran := range []time.Duration{0, time.Second, 0, 0, 0, 0, 11 * time.Second, 0} {
		got = append(got, s.Next(ran))
	}
	// upper bounds: 100ms 200ms 400ms 800ms 1s 1s | reset: 100ms 200ms
	want := []time.Duration{100, 200, 400, 800, 1000, 1000, 100, 200}
	for i, w := range want {
		w *= time.Millisecond
		if got[i] > w || got[i] < w-w/5 {
			t.Fatalf("step %d: %s, want within 20%% below %s (all: %v)", i, got[i], w, got)
		}
	}
	// A delay is a duration, not a count: one second is a second.
	if d := (Backoff{Initial: time.Second, Max: time.Second}).Delay(0); d < 800*time.Millisecond || d > time.Second {
		t.Fatalf("1s backoff gave %s", d)
	}
}
