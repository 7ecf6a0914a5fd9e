package market

import (
	"slices"
	"sync"
	"time"
)

// quotas bound what one source's feed keeps. A member's record (of a
// follower itself, its operator, or a participant an operator or a
// follower's identity vouches for) is charged to a sponsor: the follower
// or operator that is its author or vouches for it. Each sponsor has a
// pool of its own, so the participants one sponsor vouches for (sybils of
// its choosing, say) never take the place of another's; strangers
// (anyone else: only their bids on a follower's request are kept) have a
// pool of their own; and no author holds more than its share of either.
type quotas struct {
	// Records bounds the members' records one sponsor is charged with
	// (per source).
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
	refusedSponsor   = "sponsor"
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
	bySponsor map[string]int
	members   int
	strangers int
	// over are the members a quota refused records of: until a listing
	// of theirs that started after they fell under quota again ends,
	// their absence from the feed says nothing about their repo.
	over map[string]*overflow
}

type entry struct {
	did string
	// sponsor is charged with a member's record ("" for a stranger's).
	sponsor string
	seq     uint64
}

type overflow struct {
	refusals int
	still    bool
	listed   time.Time
	// sponsors are those the last refused record could be charged to.
	sponsors []string
}

func newLedger(limits quotas, refused func(reason string)) *ledger {
	return &ledger{limits: limits, refused: refused, recs: map[string]entry{}, byDID: map[string]int{}, bySponsor: map[string]int{}, over: map[string]*overflow{}}
}

// admit reports whether the record at uri, of did, may be kept, and
// accounts for it if so: a stranger's (sponsors empty) in the strangers'
// pool, a member's in the pool of the first of sponsors (those that vouch
// for did) with room. A new version of a record kept already is, charged
// as before. O(len(sponsors)).
func (l *ledger) admit(uri, did string, sponsors []string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	stranger := len(sponsors) == 0
	if e, ok := l.recs[uri]; ok {
		if (e.sponsor == "") == stranger && (stranger || slices.Contains(sponsors, e.sponsor)) {
			e.seq = l.seq
			l.recs[uri] = e
			return true
		}
		l.remove(uri, e)
	}
	sponsor, reason := l.room(did, sponsors)
	if reason != "" {
		if !stranger {
			o := l.over[did]
			if o == nil {
				o = &overflow{}
				l.over[did] = o
			}
			o.refusals++
			o.still = true
			o.sponsors = sponsors
		}
		if l.refused != nil {
			l.refused(reason)
		}
		return false
	}
	l.recs[uri] = entry{did: did, sponsor: sponsor, seq: l.seq}
	l.byDID[did]++
	if stranger {
		l.strangers++
	} else {
		l.bySponsor[sponsor]++
		l.members++
	}
	return true
}

// room returns the sponsor a new record of did is charged to, or which
// quota it would exceed.
func (l *ledger) room(did string, sponsors []string) (sponsor, refused string) {
	if len(sponsors) == 0 {
		switch {
		case l.byDID[did] >= l.limits.PerStranger:
			return "", refusedAuthor
		case l.strangers >= l.limits.Strangers:
			return "", refusedStrangers
		}
		return "", ""
	}
	if l.byDID[did] >= l.limits.PerAuthor {
		return "", refusedAuthor
	}
	for _, s := range sponsors {
		if l.bySponsor[s] < l.limits.Records {
			return s, ""
		}
	}
	return "", refusedSponsor
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
	if e.sponsor == "" {
		l.strangers--
		return
	}
	l.members--
	if l.bySponsor[e.sponsor]--; l.bySponsor[e.sponsor] <= 0 {
		delete(l.bySponsor, e.sponsor)
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
		if o.still && l.byDID[did] < l.limits.PerAuthor && slices.ContainsFunc(o.sponsors, func(s string) bool { return l.bySponsor[s] < l.limits.Records }) {
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
