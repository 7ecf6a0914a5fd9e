package firehose

import (
	"sort"
	"sync"
)

// cursorTracker decides how far a stream's cursor may advance when events
// finish out of order (events of different DIDs run in parallel). Events
// are started in sequence order by the read loop; the safe cursor is the
// highest sequence number such that every started event up to it has
// finished. A cursor therefore never passes an event whose handler is
// still running (at-least-once).
type cursorTracker struct {
	mu sync.Mutex
	// pending holds started events in sequence order; done marks finished.
	pending []pendingSeq
	safe    int64
}

type pendingSeq struct {
	seq  int64
	done bool
}

func newCursorTracker(start int64) *cursorTracker { return &cursorTracker{safe: start} }

// Start records that the event seq was handed to a handler. Calls come in
// increasing seq order; an out-of-order or repeated seq is ignored (false).
func (t *cursorTracker) Start(seq int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	last := t.safe
	if n := len(t.pending); n > 0 {
		last = t.pending[n-1].seq
	}
	if seq <= last {
		return false
	}
	t.pending = append(t.pending, pendingSeq{seq: seq})
	return true
}

// Done records that the handler of seq finished and advances the safe
// cursor over every finished prefix.
func (t *cursorTracker) Done(seq int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := sort.Search(len(t.pending), func(i int) bool { return t.pending[i].seq >= seq })
	if i == len(t.pending) || t.pending[i].seq != seq {
		return
	}
	t.pending[i].done = true
	n := 0
	for n < len(t.pending) && t.pending[n].done {
		t.safe = t.pending[n].seq
		n++
	}
	t.pending = t.pending[n:]
}

// Safe returns the cursor: every event up to it has been handled.
func (t *cursorTracker) Safe() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.safe
}
