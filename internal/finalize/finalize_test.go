package finalize

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRetryUntilGiveUpAfter: a failed cleanup is tried again every
// RetryAfter while the object has been deleting for less than
// GiveUpAfter, and let go from then on.
func TestRetryUntilGiveUpAfter(t *testing.T) {
	deleted := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x", DeletionTimestamp: &metav1.Time{Time: deleted}}}
	failed := errors.New("the PDS does not answer")
	for _, c := range []struct {
		since time.Duration
		wait  bool
	}{
		{0, true},
		{GiveUpAfter - time.Nanosecond, true},
		{GiveUpAfter, false},
		{time.Hour, false},
	} {
		res, wait := Retry(context.Background(), obj, deleted.Add(c.since), failed, "the record")
		if wait != c.wait {
			t.Errorf("%s after the deletion: wait %v, want %v", c.since, wait, c.wait)
		}
		if want := map[bool]time.Duration{true: RetryAfter, false: 0}[c.wait]; res.RequeueAfter != want {
			t.Errorf("%s after the deletion: requeue after %s, want %s", c.since, res.RequeueAfter, want)
		}
	}
}
