package marketrequester

import (
	"testing"
	"time"
)

// TestRetryWaitOfAnyAttempt: the wait before asking again doubles with
// every empty round up to maxRetry, and an attempt the status lost (0: a
// status write that did not land, so the request record is there but
// status.requests[].attempt is not) waits one window instead of
// panicking with a negative shift (e2e TestMarketDeal's race-b crashed
// its reconcile every pass under load).
func TestRetryWaitOfAnyAttempt(t *testing.T) {
	for _, tc := range []struct {
		attempt int32
		want    time.Duration
	}{{0, 5 * time.Second}, {1, 5 * time.Second}, {2, 10 * time.Second}, {4, 40 * time.Second}, {20, maxRetry}, {-3, 5 * time.Second}} {
		if got := retryWait(5, tc.attempt); got != tc.want {
			t.Errorf("attempt %d: wait %s, want %s", tc.attempt, got, tc.want)
		}
	}
}
