package firehose

import "testing"

func TestCursorAdvancesOnlyOverFinishedPrefix(t *testing.T) {
	c := newCursorTracker(10)
	for _, s := range []int64{11, 12, 13, 15} {
		if !c.Start(s) {
			t.Fatalf("start %d refused", s)
		}
	}
	if c.Start(12) {
		t.Fatal("a repeated seq was accepted")
	}
	steps := []struct {
		done int64
		want int64
	}{
		{13, 10}, // 11 and 12 still running
		{15, 10},
		{11, 11}, // 12 still running
		{12, 15}, // everything up to 15 finished
	}
	for _, s := range steps {
		c.Done(s.done)
		if got := c.Safe(); got != s.want {
			t.Fatalf("after done(%d): safe %d, want %d", s.done, got, s.want)
		}
	}
	c.Done(99) // unknown: ignored
	if c.Safe() != 15 {
		t.Fatal("an unknown seq moved the cursor")
	}
	if !c.Start(16) {
		t.Fatal("16 refused")
	}
	if c.Safe() != 15 {
		t.Fatal("a started event moved the cursor")
	}
}
