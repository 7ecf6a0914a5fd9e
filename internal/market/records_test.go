package market

import (
	"testing"
	"time"
)

// TestParseTime: a record datetime becomes a time in UTC; one that is
// not a datetime, or that no Kubernetes time field can hold (a year
// beyond 9999 in UTC), is the zero time.
func TestParseTime(t *testing.T) {
	for in, want := range map[string]time.Time{
		"2026-06-01T12:00:00.000Z":      time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC),
		"2026-06-01T14:00:00+02:00":     time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC),
		"9999-12-31T23:59:59.999Z":      time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC),
		"9999-12-31T23:59:59.999-23:59": {},
		"0000-01-01T00:00:00+01:00":     {},
		"yesterday":                     {},
		"":                              {},
	} {
		got := ParseTime(in)
		if !got.Equal(want) || (!got.IsZero() && got.Location() != time.UTC) {
			t.Errorf("ParseTime(%q) = %v, want %v", in, got, want)
		}
	}
}
