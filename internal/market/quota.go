package market

import (
	"sync"
	"time"
)

// quotas bound what one source's feed keeps. Members (a follower itself,
// its operator, the participants an operator or a follower's identity
// vouches for) and strangers (anyone else: only their bids on a
// follower's request are kept) have separate pools, so a stranger's
// records never take the place of one a follower depends on; and no
// author holds more than its share of either pool.
type quotas struct {
	// Records bounds the members' records (per source).
	Records int
	// PerAuthor bounds one member's records.
	PerAuthor int
	// Strangers bounds the strangers' records (per source).
	Strangers int
	// PerStranger bounds one stranger's records.
	PerStranger int
}

// Quota refusal reasons (the label of
// knotless_market_feed_refused_records_total).
const (
	refusedAuthor    = "author"
	refusedSource    = "source"
	refusedStrangers = "strangers"
)

// ledger is one feed's account of the records its subscription keeps:
// every record the subscription holds went through admit, so a record
// past a quota is refused instead of pushing another out (the
// subscription is sized to never evict). Entries of records the
// subscription dropped since (a delete, a listing without them) are
// forgotten by reconcile. Every operation is O(1) but reconcile, which
// is O(records) once per snapshot, like the feed's index.
type ledger struct {
	limits  quotas
	refused func(reason string)

	mu        sync.Mutex
	seq       uint64
	recs      map[string]entry
	byDID     map[string]int
	members   int
	strangers int
	// over are the members a quota refused records of: until a listing
	// of theirs that started after they fell under quota again ends,
	// their absence from the feed says nothing about their repo.
	over map[string]*overflow
}

type entry struct {
	did      string
	stranger bool
	seq      uint64
}

type overflow struct {
	refusals int
	still    bool
	listed   time.Time
}

func newLedger(limits quotas, refused func(reason string)) *ledger {
	return &ledger{limits: limits, refused: refused, recs: map[string]entry{}, byDID: map[string]int{}, over: map[string]*overflow{}}
}

// admit reports whether the record at uri, of did, may be kept, and
// accounts for it if so. A new version of a record kept already is.
func (l *ledger) admit(uri, did string, stranger bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	if e, ok := l.recs[uri]; ok {
		if e.stranger == stranger {
			e.seq = l.seq
			l.recs[uri] = e
			return true
		}
		l.remove(uri, e)
	}
	if reason := l.full(did, stranger); reason != "" {
		if !stranger {
			o := l.over[did]
			if o == nil {
				o = &overflow{}
				l.over[did] = o
			}
			o.refusals++
			o.still = true
		}
		if l.refused != nil {
			l.refused(reason)
		}
		return false
	}
	l.recs[uri] = entry{did: did, stranger: stranger, seq: l.seq}
	l.byDID[did]++
	if stranger {
		l.strangers++
	} else {
		l.members++
	}
	return true
}

// full says which quota a new record of did would exceed ("" if none).
func (l *ledger) full(did string, stranger bool) string {
	per, pool, used := l.limits.PerAuthor, l.limits.Records, l.members
	if stranger {
		per, pool, used = l.limits.PerStranger, l.limits.Strangers, l.strangers
	}
	switch {
	case l.byDID[did] >= per:
		return refusedAuthor
	case used >= pool && stranger:
		return refusedStrangers
	case used >= pool:
		return refusedSource
	}
	return ""
}

// drop forgets the record at uri (the subscription does not keep it).
func (l *ledger) drop(uri string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.recs[uri]; ok {
		l.remove(uri, e)
	}
}

func (l *ledger) remove(uri string, e entry) {
	delete(l.recs, uri)
	if l.byDID[e.did]--; l.byDID[e.did] <= 0 {
		delete(l.byDID, e.did)
	}
	if e.stranger {
		l.strangers--
	} else {
		l.members--
	}
}

// mark is taken before a snapshot of the subscription: what was admitted
// up to it and is not in the snapshot was dropped since.
func (l *ledger) mark() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq
}

// reconcile forgets the records admitted up to mark that held does not
// have, and returns the members over quota that are under it again (with
// their refusal counts, for settle).
func (l *ledger) reconcile(held func(uri string) bool, mark uint64) map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	for uri, e := range l.recs {
		if e.seq <= mark && !held(uri) {
			l.remove(uri, e)
		}
	}
	var under map[string]int
	for did, o := range l.over {
		if o.still && l.byDID[did] < l.limits.PerAuthor && l.members < l.limits.Records {
			if under == nil {
				under = map[string]int{}
			}
			under[did] = o.refusals
		}
	}
	return under
}

// settle notes that did, under quota again, is listed anew: listings
// that ended by listed do not count (unless records were refused since
// reconcile counted refusals).
func (l *ledger) settle(did string, refusals int, listed time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if o := l.over[did]; o != nil && o.refusals == refusals {
		o.still, o.listed = false, listed
	}
}

// hides reports whether a listing of did that ended at listed may miss
// records of did that are in its repo (a quota refused them).
func (l *ledger) hides(did string, listed time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	o := l.over[did]
	switch {
	case o == nil:
		return false
	case o.still || !listed.After(o.listed):
		return true
	}
	delete(l.over, did)
	return false
}

// counts returns the members' and strangers' records kept.
func (l *ledger) counts() (members, strangers int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.members, l.strangers
}
