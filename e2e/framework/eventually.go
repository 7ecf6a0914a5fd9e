package framework

import (
	"context"
	"fmt"
	"time"
)

// Eventually polls cond every 250ms until it returns true, returns an
// error, or timeout passes. The error names what was waited for and the
// last state cond reported.
func Eventually(ctx context.Context, timeout time.Duration, what string, cond func(context.Context) (bool, string, error)) error {
	return EventuallyEvery(ctx, 250*time.Millisecond, timeout, what, cond)
}

// EventuallyEvery is Eventually with another polling interval, for
// conditions that are expensive to check (large lists).
func EventuallyEvery(ctx context.Context, interval, timeout time.Duration, what string, cond func(context.Context) (bool, string, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := "never checked"
	for {
		ok, state, err := cond(ctx)
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if state != "" {
			last = state
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out after %s waiting for %s (last: %s)", timeout, what, last)
		case <-time.After(interval):
		}
	}
}
