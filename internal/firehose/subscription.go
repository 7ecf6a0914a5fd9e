package firehose

import (
	"cmp"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// Filter selects what a subscription keeps.
type Filter struct {
	// Collections are the NSIDs kept (at least one).
	Collections []string
	// DIDs, if not empty, are the only repos followed.
	DIDs []string
	// Check, if set, is called with every record (of a commit or of a
	// listing) before it is kept. A record it refuses is not kept (a
	// version kept before is dropped) and is counted in State.Invalid. It
	// is called with the subscription's lock held: it must not block.
	Check func(collection string, value json.RawMessage) error
	// Keep, if set, says whether a record (already past Check) is of
	// interest: one it declines is not kept (a version kept before is
	// dropped) and not counted. It is called with the subscription's lock
	// held: it must not block. uri is the record's at-URI (of repo did).
	Keep func(uri, did, collection string, value json.RawMessage) bool
}

// declines reports whether the filter's Keep does not want a record.
func (f Filter) declines(uri, did, collection string, value json.RawMessage) bool {
	return f.Keep != nil && !f.Keep(uri, did, collection, value)
}

// rejects reports whether the filter's Check refuses a record.
func (f Filter) rejects(collection string, value json.RawMessage) bool {
	return f.Check != nil && f.Check(collection, value) != nil
}

func (f Filter) wantsDID(did string) bool {
	return len(f.DIDs) == 0 || slices.Contains(f.DIDs, did)
}

func (f Filter) wantsCollection(c string) bool { return slices.Contains(f.Collections, c) }

// Record is one matching record.
type Record struct {
	URI string
	CID string
	// Rev of the commit that wrote it; empty when a resync listed it.
	Rev   string
	Value json.RawMessage
	// Size is the length of the value's JSON, kept by a consumer that
	// stores records without large values.
	Size int
	// order is when the record last changed (larger is newer).
	order int64
}

// DID returns the repo of the record.
func (r Record) DID() string {
	did, _, _ := strings.Cut(strings.TrimPrefix(r.URI, "at://"), "/")
	return did
}

// collection returns the record's collection.
func (r Record) collection() string {
	parts := strings.SplitN(strings.TrimPrefix(r.URI, "at://"), "/", 3)
	if len(parts) < 2 {
		return ""
	}
	return parts[1]
}

// Repo is how far a subscription has applied one repo.
type Repo struct {
	Rev  string
	Data string
}

// Resync describes the last listing of records.
type Resync struct {
	Reason string
	Time   time.Time
	DID    string
}

// Resync reasons.
const (
	ResyncInitial          = "Initial"
	ResyncOutdatedCursor   = "OutdatedCursor"
	ResyncFutureCursor     = "FutureCursor"
	ResyncPrevDataMismatch = "PrevDataMismatch"
	ResyncSync             = "Sync"
	ResyncUnverified       = "Unverified"
	ResyncReconnect        = "Reconnect"
	// ResyncRefresh: the consumer asked for a repo to be listed again
	// (Subscription.Refresh), not trusting the stream alone.
	ResyncRefresh = "Refresh"
)

// State is what a subscription has applied. Records and Repos are
// consistent with Cursor: every event up to Cursor is reflected, and
// events after it may be too (replaying them changes nothing, because
// commits at or below a repo's Rev are skipped).
type State struct {
	Cursor        int64
	LastEventTime time.Time
	Seen          int64
	Matched       int64
	Errors        int64
	Evicted       int64
	// Invalid counts records Filter.Check refused.
	Invalid    int64
	Records    map[string]Record
	Repos      map[string]Repo
	LastResync *Resync
}

// RecordsNewestFirst returns the records, most recently changed first.
func (s *State) RecordsNewestFirst() []Record {
	out := slices.Collect(maps.Values(s.Records))
	slices.SortFunc(out, func(a, b Record) int {
		if a.order != b.order {
			if a.order > b.order {
				return -1
			}
			return 1
		}
		return strings.Compare(a.URI, b.URI)
	})
	return out
}

// Health is the stream's connection state as a subscription sees it.
type Health struct {
	Connected bool
	// Err is the last connection error while not connected.
	Err error
	// Resyncing is true while the subscription's records are being listed.
	Resyncing bool
	// Full is true while all of them are (a new subscription, a cursor the
	// source lost): what the subscription holds may miss any repo. While
	// only some repos are listed again, Resyncing is true and Full false.
	Full bool
	// ResyncErr is the last failed listing's error while Resyncing.
	ResyncErr error
}

// Subscription is one consumer of a stream (an AtprotoRecordWatch).
type Subscription struct {
	stream *stream
	filter Filter
	max    int

	mu    sync.Mutex
	state State
	// version increases with every change of state.
	version uint64
	// changed gets a token (never blocking) at every change of version.
	changed chan struct{}
	// gen is the connection generation the subscription has seen every
	// event of (0: none yet).
	gen uint64
	// full is set while a full resync is owed or running, for fullReason.
	full       bool
	fullReason string
	// hold caps the cursor while a repo resync is owed (holding): the
	// event that asked for it must be replayed if the provider stops first.
	hold    int64
	holding bool
	pending map[string]bool
	order   int64
	// resyncErr is the last listing's error (nil once one succeeds).
	resyncErr error
	// refused holds the repos a full listing left out as too large, with
	// the error: none of their records are kept (listed or committed)
	// until a listing of the repo succeeds.
	refused map[string]error
	// unlisted holds the repos a full listing left out because their
	// own listing failed (the DID does not resolve, its PDS cannot be
	// reached), with the error: what the firehose said of them is kept
	// and applied until a listing of the repo succeeds.
	unlisted map[string]error
	// listed is when each repo's records were last listed (replaced).
	listed map[string]time.Time
	// ages are the records' URIs, the one changed longest ago first, so
	// that eviction takes the oldest without a scan. An entry whose record
	// changed or went since is stale: skipped, and compacted away when
	// stale entries outnumber live ones.
	ages []aged
	// byDID holds the URIs of each repo's records, so that replacing a
	// repo's records does not scan every record.
	byDID map[string]map[string]struct{}
}

// aged is a record's place in the order records changed.
type aged struct {
	order int64
	uri   string
}

func newSubscription(filter Filter, maxRecords int, initial State) *Subscription {
	if initial.Records == nil {
		initial.Records = map[string]Record{}
	}
	if initial.Repos == nil {
		initial.Repos = map[string]Repo{}
	}
	s := &Subscription{filter: filter, max: maxRecords, state: initial, pending: map[string]bool{}, refused: map[string]error{}, unlisted: map[string]error{}, changed: make(chan struct{}, 1), listed: map[string]time.Time{}, byDID: map[string]map[string]struct{}{}}
	// Loaded records keep their relative order (callers pass newest
	// first through LoadRecords).
	for _, r := range initial.Records {
		s.order = max(s.order, r.order)
		s.ages = append(s.ages, aged{order: r.order, uri: r.URI})
		s.index(r)
	}
	slices.SortFunc(s.ages, func(a, b aged) int {
		return cmp.Or(cmp.Compare(a.order, b.order), strings.Compare(a.uri, b.uri))
	})
	s.full = initial.Cursor == 0
	return s
}

// index adds r to its repo's URIs (s.mu is held).
func (s *Subscription) index(r Record) {
	did := r.DID()
	uris := s.byDID[did]
	if uris == nil {
		uris = map[string]struct{}{}
		s.byDID[did] = uris
	}
	uris[r.URI] = struct{}{}
}

// put keeps r as the newest change (s.mu is held).
func (s *Subscription) put(r Record) {
	s.order++
	r.order = s.order
	s.state.Records[r.URI] = r
	s.index(r)
	s.ages = append(s.ages, aged{order: r.order, uri: r.URI})
	if len(s.ages) > 2*len(s.state.Records)+64 {
		live := make([]aged, 0, len(s.state.Records))
		for _, a := range s.ages {
			if s.current(a) {
				live = append(live, a)
			}
		}
		s.ages = live
	}
}

// current reports whether a is the place of a record kept now.
func (s *Subscription) current(a aged) bool {
	r, ok := s.state.Records[a.uri]
	return ok && r.order == a.order
}

// remove forgets the record at uri, if kept (s.mu is held).
func (s *Subscription) remove(uri string) {
	r, ok := s.state.Records[uri]
	if !ok {
		return
	}
	delete(s.state.Records, uri)
	did := r.DID()
	delete(s.byDID[did], uri)
	if len(s.byDID[did]) == 0 {
		delete(s.byDID, did)
	}
}

// removeRepo forgets did's records (s.mu is held).
func (s *Subscription) removeRepo(did string) {
	for uri := range s.byDID[did] {
		s.remove(uri)
	}
}

// bump marks a change of state (s.mu is held) and wakes a Changed reader.
func (s *Subscription) bump() {
	s.version++
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// Changed returns a channel that receives a value after the subscription
// changed (records, health of a listing, counters): a reader that waits
// on it and then takes a Snapshot sees every change, coalesced.
func (s *Subscription) Changed() <-chan struct{} { return s.changed }

// Refresh asks for did's records to be listed again from its PDS, as if
// the stream had missed commits: a consumer that acts on records of a few
// repos reconciles from listRecords now and then, not from the firehose
// alone (the firehose is at-least-once and drops slow consumers). A
// listing already owed is not queued twice.
func (s *Subscription) Refresh(did string) {
	if s.stream == nil || did == "" {
		return
	}
	s.stream.requestResync(s, did, ResyncRefresh, 0)
}

// Listed returns when did's records were last listed from its PDS by
// this subscription (the zero time if never): a record absent from a
// listing that ended after a moment is absent from the repo then, whatever
// the firehose delivered.
func (s *Subscription) Listed(did string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listed[did]
}

// LoadRecords builds a record map from records listed newest first, as a
// status carries them.
func LoadRecords(newestFirst []Record) map[string]Record {
	out := make(map[string]Record, len(newestFirst))
	for i, r := range newestFirst {
		r.order = int64(len(newestFirst) - i)
		out[r.URI] = r
	}
	return out
}

// Snapshot returns a copy of the state, with the cursor every applied
// event is complete up to, the stream's health and the state's version.
func (s *Subscription) Snapshot() (State, Health, uint64) {
	safe, gen, health := s.stream.position()
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state
	st.Records = maps.Clone(s.state.Records)
	st.Repos = maps.Clone(s.state.Repos)
	if s.state.LastResync != nil {
		r := *s.state.LastResync
		st.LastResync = &r
	}
	if !s.full && s.gen != 0 && s.gen == gen && safe > st.Cursor {
		st.Cursor = safe
	}
	if s.holding && st.Cursor > s.hold {
		st.Cursor = max(s.state.Cursor, s.hold)
	}
	health.Resyncing = s.resyncing()
	health.Full = s.full
	if health.Resyncing {
		health.ResyncErr = s.listingErr()
	}
	return st, health, s.version
}

// Health returns the stream's health as the subscription sees it, without
// copying its records.
func (s *Subscription) Health() Health {
	_, _, health := s.stream.position()
	s.mu.Lock()
	defer s.mu.Unlock()
	health.Resyncing = s.resyncing()
	health.Full = s.full
	if health.Resyncing {
		health.ResyncErr = s.listingErr()
	}
	return health
}

// settle folds the stream's safe cursor into the state when a connection
// ends, so the next connection's skip rule sees it.
func (s *Subscription) settle(safe int64, gen uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.full || s.gen != gen {
		return
	}
	c := safe
	if s.holding && c > s.hold {
		c = s.hold
	}
	if c > s.state.Cursor {
		s.state.Cursor = c
		s.bump()
	}
}

// owedFull returns the reason of an owed full resync ("" if none).
func (s *Subscription) owedFull() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.full && s.state.Cursor != 0 {
		return ""
	}
	return cmp.Or(s.fullReason, ResyncInitial)
}

func (s *Subscription) cursor() (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state.Cursor, s.full
}

// commitUpdate is a verified commit, reduced to what subscriptions need.
type commitUpdate struct {
	seq      int64
	did      string
	rev      string
	data     string
	prevData string
	time     time.Time
	ops      []opUpdate
}

type opUpdate struct {
	action     string // create, update, delete
	collection string
	rkey       string
	cid        string
	value      json.RawMessage
}

// apply applies a verified commit. It returns whether the repo must be
// resynced (its prevData does not follow what was applied).
func (s *Subscription) apply(u *commitUpdate) (resync bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u.seq <= s.state.Cursor {
		return false
	}
	if s.refused[u.did] != nil {
		return false
	}
	rs := s.state.Repos[u.did]
	if rs.Rev != "" && u.rev <= rs.Rev {
		return false
	}
	resync = rs.Data != "" && u.prevData != "" && u.prevData != rs.Data
	// The filter decides on every op before any is applied: a check that
	// panics (a hostile record) leaves the subscription as it was, not
	// half the commit applied.
	const (
		skip = iota
		drop
		invalid
		put
	)
	do := make([]int, len(u.ops))
	for i, op := range u.ops {
		uri := "at://" + u.did + "/" + op.collection + "/" + op.rkey
		switch {
		case !s.filter.wantsCollection(op.collection):
			do[i] = skip
		case op.action == "delete":
			do[i] = drop
		case s.filter.rejects(op.collection, op.value):
			do[i] = invalid
		case s.filter.declines(uri, u.did, op.collection, op.value):
			do[i] = drop
		default:
			do[i] = put
		}
	}
	for i, op := range u.ops {
		if do[i] == skip {
			continue
		}
		s.state.Matched++
		uri := "at://" + u.did + "/" + op.collection + "/" + op.rkey
		switch do[i] {
		case drop:
			s.remove(uri)
		case invalid:
			s.remove(uri)
			s.state.Invalid++
		case put:
			s.put(Record{URI: uri, CID: op.cid, Rev: u.rev, Value: op.value, Size: len(op.value)})
		}
	}
	s.evict()
	s.state.Seen++
	s.state.Repos[u.did] = Repo{Rev: u.rev, Data: u.data}
	if !u.time.IsZero() {
		s.state.LastEventTime = u.time
	}
	s.bump()
	return resync
}

// evict forgets the records changed longest ago while there are more
// than max (s.mu is held): amortized O(1) per record, as each place in
// ages is taken once.
func (s *Subscription) evict() {
	for len(s.state.Records) > s.max && len(s.ages) > 0 {
		a := s.ages[0]
		s.ages = s.ages[1:]
		if s.current(a) {
			s.remove(a.uri)
			s.state.Evicted++
		}
	}
}

// behind reports whether a commit at rev is newer than what was applied
// for did (a #sync at or below the applied rev changes nothing).
func (s *Subscription) behind(did, rev string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return rev > s.state.Repos[did].Rev
}

// rejected counts an event that failed verification.
func (s *Subscription) rejected() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state.Errors++
	s.bump()
}

// resyncFailed counts a failed listing and keeps its error for Health.
func (s *Subscription) resyncFailed(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state.Errors++
	s.resyncErr = err
	s.bump()
}

func (s *Subscription) join(gen uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen = gen
}

func (s *Subscription) joined(gen uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen == gen
}

// reset forgets the cursor (the source does not know it): everything is
// listed again.
func (s *Subscription) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state.Cursor = 0
	s.full = true
	s.bump()
}

// owe records that a repo (did) or everything (did == "") must be listed
// again because of the event seq (0: no event).
func (s *Subscription) owe(did, reason string, seq int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bump()
	if did == "" {
		if !s.full || s.fullReason == "" {
			s.fullReason = reason
		}
		s.full = true
		return
	}
	if s.unlisted[did] != nil && len(s.filter.DIDs) == 0 {
		seq = 0 // see unlistRepo
	}
	if seq > 0 && (!s.holding || seq-1 < s.hold) {
		s.hold, s.holding = seq-1, true
	}
	s.pending[did] = true
}

// replaceRepo replaces the records of did by a listing. It refuses (false)
// when commits newer than the listing were applied meanwhile: the listing
// may miss them, so the repo must be listed again.
func (s *Subscription) replaceRepo(did string, l *listing) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	rs, known := s.state.Repos[did]
	if known && l.rev != "" && rs.Rev > l.rev {
		return false
	}
	// The filter decides on every record before the repo is replaced: a
	// check that panics (a hostile record) leaves the repo as it was.
	keep := make([]bool, len(l.records))
	var invalid int64
	for i, r := range l.records {
		switch {
		case s.filter.rejects(r.collection(), r.Value):
			invalid++
		case !s.filter.declines(r.URI, did, r.collection(), r.Value):
			keep[i] = true
		}
	}
	s.removeRepo(did)
	s.state.Invalid += invalid
	for i, r := range l.records {
		if keep[i] {
			s.put(r)
		}
	}
	s.evict()
	s.listed[did] = time.Now()
	if l.rev == "" {
		delete(s.state.Repos, did)
	} else {
		s.state.Repos[did] = Repo{Rev: l.rev}
	}
	s.bump()
	return true
}

// refuseRepo forgets did's records and repo, and owes a listing of it
// that was refused as too large with err.
func (s *Subscription) refuseRepo(did, reason string, err error) {
	s.owe(did, reason, 0)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removeRepo(did)
	delete(s.state.Repos, did)
	delete(s.listed, did)
	s.refused[did] = err
	delete(s.unlisted, did)
	s.state.Errors++
	s.bump()
}

// unlistRepo owes a listing of did that failed with err, keeping what
// is known of the repo. In a subscription of every repo, the cursor is
// not held for it (nor for any later event of it): a stranger's repo
// would otherwise hold the saved cursor back for good.
func (s *Subscription) unlistRepo(did, reason string, err error) {
	s.owe(did, reason, 0)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unlisted[did] = err
	s.state.Errors++
	s.releaseHold()
	s.bump()
}

// owes reports whether a listing of did is still owed (its repo may have
// left the source, or been listed by a full listing, since it was queued).
func (s *Subscription) owes(did string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending[did]
}

// releaseHold stops holding the cursor back once no listing is owed
// that the subscription waits for (s.mu is held).
func (s *Subscription) releaseHold() {
	if !s.resyncing() {
		s.holding = false
	}
}

// resyncing reports whether a listing is owed that the subscription
// waits for: a full one, or a repo's, except a stranger's repo that
// could not be listed on its own account (unlisted) in a subscription of
// every repo of the source. That one is counted in Errors, and a watch of
// the whole source goes on as Following: its owner could otherwise keep
// every such watch Resyncing (R21). (s.mu is held.)
func (s *Subscription) resyncing() bool {
	if s.full {
		return true
	}
	for did := range s.pending {
		if _, unlisted := s.unlisted[did]; !unlisted || len(s.filter.DIDs) > 0 {
			return true
		}
	}
	return false
}

// listingErr is the error Health shows while Resyncing: the last failed
// listing's, else a refused or unlisted repo's (s.mu is held).
func (s *Subscription) listingErr() error {
	if s.resyncErr != nil {
		return s.resyncErr
	}
	for _, err := range s.refused {
		return err
	}
	if len(s.filter.DIDs) > 0 {
		// Only a subscription that names the repos shows their failures:
		// a stranger's text does not reach a watch of every repo.
		for _, err := range s.unlisted {
			return err
		}
	}
	return nil
}

// dropReposExcept forgets the records and repos of DIDs not in dids (the
// source no longer carries them).
func (s *Subscription) dropReposExcept(dids []string) {
	keep := make(map[string]bool, len(dids))
	for _, d := range dids {
		keep[d] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for did := range s.byDID {
		if !keep[did] {
			s.removeRepo(did)
		}
	}
	for did := range s.state.Repos {
		if !keep[did] {
			delete(s.state.Repos, did)
		}
	}
	for did := range s.listed {
		if !keep[did] {
			delete(s.listed, did)
		}
	}
	for _, m := range []map[string]error{s.refused, s.unlisted} {
		for did := range m {
			if !keep[did] {
				delete(m, did)
				delete(s.pending, did)
			}
		}
	}
	if len(s.pending) == 0 {
		s.holding = false
	}
	s.bump()
}

// relisted records that a full listing listed did, which a listing
// before had refused or left unlisted: it is no longer owed.
func (s *Subscription) relisted(did string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refused[did] == nil && s.unlisted[did] == nil {
		return
	}
	delete(s.refused, did)
	delete(s.unlisted, did)
	delete(s.pending, did)
	s.releaseHold()
	s.bump()
}

// resynced records a finished listing.
func (s *Subscription) resynced(did, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if did == "" {
		s.full, s.fullReason = false, ""
		s.releaseHold()
	} else {
		delete(s.pending, did)
		delete(s.refused, did)
		delete(s.unlisted, did)
		s.releaseHold()
	}
	s.state.LastResync = &Resync{Reason: reason, Time: time.Now(), DID: did}
	s.resyncErr = nil
	s.bump()
}
