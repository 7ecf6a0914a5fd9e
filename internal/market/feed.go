package market

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/lexicon"
)

// Collections are the records a market feed keeps: everything a
// requester or a bidder reads of the other side.
func Collections() []string {
	return []string{lexicon.Association, lexicon.Request, lexicon.Bid, lexicon.Accept, lexicon.Lease, lexicon.Release, lexicon.Reclaim}
}

// Role is the side a follower of the feeds takes.
type Role string

// Roles.
const (
	RoleRequester Role = "requester"
	RoleBidder    Role = "bidder"
)

// Follower is a MarketRequester or MarketBidder that reads the market's
// records: its side, the DID it trades as, and the request that
// reconciles it.
type Follower struct {
	Role    Role
	DID     string
	Request mcreconcile.Request
	// Operator is the operator DID of the follower's network ("" if none).
	Operator string
	// Vouches are the DIDs the follower's identity approves in the other
	// side's role (bidders for a requester, requesters for a bidder).
	Vouches []string
}

// FeedsOptions configure Feeds; zero fields take defaults.
type FeedsOptions struct {
	// MaxRecords bounds the records of members one sponsor is charged
	// with on one source (default 20000): a follower with its own records
	// and those of the participants its identity approves, an operator of
	// a follower's network with its associations and the records of the
	// participants these name. MaxRecordsPerAuthor bounds those of one
	// member (default 10000). A record past a quota is refused: nothing
	// kept is pushed out for it, and no sponsor's records take the place
	// of another's.
	MaxRecords          int
	MaxRecordsPerAuthor int
	// MaxStrangerRecords bounds the records of strangers (nobody vouches
	// for them: only their bids on a follower's request are kept) one
	// source's feed keeps (default 10000), and MaxRecordsPerStranger
	// those of one stranger (default 100). They never take the place of
	// a member's.
	MaxStrangerRecords    int
	MaxRecordsPerStranger int
	// RefreshEvery bounds how often one repo is listed again on request
	// (View.Refresh; default 30 s).
	RefreshEvery time.Duration
	// Registry, if set, gets knotless_market_feed_invalid_records_total
	// and knotless_market_feed_refused_records_total.
	Registry prometheus.Registerer
	Log      logr.Logger
	// Now is the clock that says when a record was first seen (default
	// time.Now).
	Now func() time.Time
}

// Feeds shares the market's firehose subscriptions among every requester
// and bidder the provider reconciles: one subscription per source,
// whatever workspace its followers are in. It indexes the records by the
// record they answer, remembers when it first saw each version (deadlines
// are judged by the reader's clock, never by a record's own createdAt),
// and wakes the followers a changed record concerns: bidders for every
// request, a requester for a bid or lease that answers its records, a
// bidder for an accept or release of its bids and leases (found by DID:
// the follower registry is the index of requesters and bidders by DID
// over every engaged workspace).
//
// Only records of commits the firehose library verified (or of a listing
// from the repo's own PDS) are kept; each is validated against its
// lexicon first and an invalid one is counted and ignored.
type Feeds struct {
	hub     *firehose.Hub
	opts    FeedsOptions
	invalid *prometheus.CounterVec
	refused *prometheus.CounterVec

	mu        sync.Mutex
	ctx       context.Context
	stopped   bool
	wg        sync.WaitGroup
	feeds     map[string]*feed
	followers map[mcreconcile.Request]*following
	byDID     map[Role]map[string]map[mcreconcile.Request]bool
	triggers  map[Role]chan event.TypedGenericEvent[mcreconcile.Request]

	// interest is what the feeds keep, rebuilt (under mu) when followers
	// change and read without a lock by the subscriptions' Keep.
	interest atomic.Pointer[interest]
	// vouchers are the association records of every feed, by the DID
	// they name: an operator's repo and the repos it vouches for may be
	// on different PDSes, carried by different sources. Rebuilt (under
	// mu) when a feed's associations change or a feed goes; read without
	// a lock by Keep.
	vouchers atomic.Pointer[map[string][]*Rec]
}

// interest says whose records the feeds keep: of the participants the
// followers trade as, approve, or whose network's operator vouches for
// them. Records of anyone else on the firehose are not kept, so an
// account nobody vouches for cannot fill the provider's memory or push
// the records of live deals out of the feeds.
type interest struct {
	participants map[string]bool // followers' own DIDs
	requesters   map[string]bool // requester followers' DIDs
	operators    map[string]bool
	// approved are the DIDs a follower's identity approves, by role, and
	// the followers (their DIDs) that approve each.
	approved map[Role]map[string][]string
}

// maxFeedRecord bounds the size of a record the feeds keep: knotless's
// market records are well under 2 KiB.
const maxFeedRecord = 8 << 10

type following struct {
	Follower
	sources []string
}

// NewFeeds returns the feeds over hub. Add it to the manager (it is a
// runnable that needs leader election, like the hub).
func NewFeeds(hub *firehose.Hub, opts FeedsOptions) (*Feeds, error) {
	opts = opts.withDefaults()
	f := &Feeds{
		hub: hub, opts: opts,
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "knotless_market_feed_invalid_records_total",
			Help: "Market records read from firehoses for requests, bids and contracts that did not match their lexicon and were ignored.",
		}, []string{"collection"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "knotless_market_feed_refused_records_total",
			Help: "Market records a feed did not keep because their author (reason author), the followers or operators that vouch for it (sponsor) or the source's strangers (strangers) had reached their quota.",
		}, []string{"reason"}),
		feeds:     map[string]*feed{},
		followers: map[mcreconcile.Request]*following{},
		byDID:     map[Role]map[string]map[mcreconcile.Request]bool{RoleRequester: {}, RoleBidder: {}},
		triggers: map[Role]chan event.TypedGenericEvent[mcreconcile.Request]{
			RoleRequester: make(chan event.TypedGenericEvent[mcreconcile.Request], 4096),
			RoleBidder:    make(chan event.TypedGenericEvent[mcreconcile.Request], 4096),
		},
	}
	f.interest.Store(newInterest())
	f.vouchers.Store(&map[string][]*Rec{})
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{f.invalid, f.refused} {
			if err := opts.Registry.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return f, nil
}

func (o FeedsOptions) withDefaults() FeedsOptions {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.MaxRecords, 20_000)
	def(&o.MaxRecordsPerAuthor, 10_000)
	def(&o.MaxStrangerRecords, 10_000)
	def(&o.MaxRecordsPerStranger, 100)
	if o.RefreshEvery <= 0 {
		o.RefreshEvery = 30 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

func newInterest() *interest {
	return &interest{participants: map[string]bool{}, requesters: map[string]bool{}, operators: map[string]bool{}, approved: map[Role]map[string][]string{RoleRequester: {}, RoleBidder: {}}}
}

// newFeed is the feed of src, not yet subscribed.
func (f *Feeds) newFeed(src string) *feed {
	fd := &feed{source: src, users: map[mcreconcile.Request]bool{}, refreshed: map[string]time.Time{}, vouched: map[string]bool{},
		ledger: newLedger(quotas{Records: f.opts.MaxRecords, PerAuthor: f.opts.MaxRecordsPerAuthor, Strangers: f.opts.MaxStrangerRecords, PerStranger: f.opts.MaxRecordsPerStranger},
			func(reason string) { f.refused.WithLabelValues(reason).Inc() })}
	fd.idx.Store(&index{})
	return fd
}

// Start runs the feeds' indexers until ctx ends and waits for them.
func (f *Feeds) Start(ctx context.Context) error {
	f.mu.Lock()
	f.ctx = ctx
	for _, fd := range f.feeds {
		f.run(fd)
	}
	f.mu.Unlock()
	<-ctx.Done()
	f.mu.Lock()
	f.stopped = true // no indexer starts after this
	f.mu.Unlock()
	f.wg.Wait()
	return nil
}

// run starts fd's indexer; f.mu is held and f.ctx set.
func (f *Feeds) run(fd *feed) {
	ctx, cancel := context.WithCancel(f.ctx)
	fd.stop = cancel
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		fd.run(ctx, f)
	}()
}

// Source is the controller source through which the feeds wake the
// followers of role.
func (f *Feeds) Source(role Role) source.TypedSource[mcreconcile.Request] {
	return source.TypedChannel[mcreconcile.Request, mcreconcile.Request](f.triggers[role], handler.TypedFuncs[mcreconcile.Request, mcreconcile.Request]{
		GenericFunc: func(_ context.Context, e event.TypedGenericEvent[mcreconcile.Request], q workqueue.TypedRateLimitingInterface[mcreconcile.Request]) {
			q.Add(e.Object)
		},
	})
}

// wake enqueues reqs for their role's controller; a full channel drops
// them (every follower also looks again at its own deadlines).
func (f *Feeds) wake(role Role, reqs []mcreconcile.Request) {
	for _, r := range reqs {
		select {
		case f.triggers[role] <- event.TypedGenericEvent[mcreconcile.Request]{Object: r}:
		default:
		}
	}
}

// Market is what the market controllers read the other side's records
// through: Feeds, or a fake in unit tests.
type Market interface {
	// Follow registers fl as a reader of sources (firehose URLs of its
	// network) and returns its view of them.
	Follow(fl Follower, sources []string) (Reader, error)
	// Unfollow forgets the follower of req.
	Unfollow(req mcreconcile.Request)
	// Followers returns the followers of role that trade as did: the
	// index of requesters and bidders by DID over every engaged workspace.
	Followers(role Role, did string) []mcreconcile.Request
}

// Reader is a follower's view of the market's records.
type Reader interface {
	// Complete is nil when the view is complete: what is absent from it
	// is absent from the repos. Otherwise it says why not.
	Complete() error
	// Get returns the record at uri, or nil.
	Get(uri string) *Rec
	// Children returns the records of collection that answer the record
	// at uri (an accept is also a child of its request).
	Children(uri, collection string) []*Rec
	// Requests returns every request record.
	Requests() []*Rec
	// Vouches reports whether voucher's repo has an association record
	// naming subject with role.
	Vouches(voucher, subject, role string) bool
	// Refresh asks for did's records to be listed again (rate-limited).
	Refresh(did string)
	// List asks for did's records to be listed again now (a listing
	// already owed is not queued twice).
	List(did string)
	// Listed is when did's records were last listed from its PDS (the
	// zero time if never): what a listing that ended after a moment does
	// not hold was not in the repo then.
	Listed(did string) time.Time
}

var (
	_ Market = (*Feeds)(nil)
	_ Reader = View{}
)

// Follow registers fl as a reader of sources (firehose URLs of its
// network) and returns its view of them. Following again replaces the
// sources and DID; feeds nobody follows any more are dropped.
func (f *Feeds) Follow(fl Follower, sources []string) (Reader, error) {
	var norm []string
	for _, s := range sources {
		n, err := firehose.NormalizeSource(s)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(norm, n) {
			norm = append(norm, n)
		}
	}
	slices.Sort(norm)
	f.mu.Lock()
	defer f.mu.Unlock()
	prev := f.followers[fl.Request]
	for _, src := range norm {
		if f.feeds[src] != nil {
			continue
		}
		fd := f.newFeed(src)
		// The ledger refuses what is past a quota, and is the bound (its
		// sponsors' pools grow with the followers): the subscription
		// never pushes a record out.
		sub, err := f.hub.Subscribe(src, firehose.Filter{Collections: Collections(), Check: f.check, Keep: func(uri, did, col string, v json.RawMessage) bool {
			return f.keep(fd, uri, did, col, v)
		}}, math.MaxInt, firehose.State{})
		if err != nil {
			return nil, err
		}
		fd.sub = sub
		f.feeds[src] = fd
		if f.ctx != nil && !f.stopped {
			f.run(fd)
		}
	}
	v := View{refreshEvery: f.opts.RefreshEvery, now: f.opts.Now}
	for _, src := range norm {
		fd := f.feeds[src]
		fd.users[fl.Request] = true
		v.feeds = append(v.feeds, fd)
	}
	f.followers[fl.Request] = &following{Follower: fl, sources: norm}
	if prev != nil {
		f.index(prev.Follower, false)
		f.release(fl.Request, prev.sources, norm)
	}
	f.index(fl, true)
	f.rebuildInterest()
	return v, nil
}

// index adds fl to (or removes it from) the index by DID; f.mu is held.
func (f *Feeds) index(fl Follower, add bool) {
	m := f.byDID[fl.Role]
	if add {
		if m[fl.DID] == nil {
			m[fl.DID] = map[mcreconcile.Request]bool{}
		}
		m[fl.DID][fl.Request] = true
		return
	}
	delete(m[fl.DID], fl.Request)
	if len(m[fl.DID]) == 0 {
		delete(m, fl.DID)
	}
}

// rebuildInterest computes what the feeds keep from the followers, and
// asks every feed to list again the repos that became of interest (their
// records were not kept before); f.mu is held.
func (f *Feeds) rebuildInterest() {
	prev := f.interest.Load()
	next := newInterest()
	var fresh []string
	for _, fl := range f.followers {
		next.participants[fl.DID] = true
		if fl.Role == RoleRequester {
			next.requesters[fl.DID] = true
		}
		if fl.Operator != "" {
			next.operators[fl.Operator] = true
			if !prev.operators[fl.Operator] {
				fresh = append(fresh, fl.Operator)
			}
		}
		other := RoleBidder
		if fl.Role == RoleBidder {
			other = RoleRequester
		}
		for _, d := range fl.Vouches {
			if !slices.Contains(next.approved[other][d], fl.DID) {
				next.approved[other][d] = append(next.approved[other][d], fl.DID)
			}
			if prev.approved[other][d] == nil {
				fresh = append(fresh, d)
			}
		}
	}
	f.interest.Store(next)
	for _, fd := range f.feeds {
		ops := map[string]bool{}
		for req := range fd.users {
			if fl := f.followers[req]; fl != nil && fl.Operator != "" {
				ops[fl.Operator] = true
			}
		}
		fd.operators.Store(&ops)
	}
	left, ops := forsaken(prev, next)
	dids := slices.Concat(fresh, left, f.vouchedBy(ops))
	for _, fd := range f.feeds {
		for _, did := range dids {
			fd.sub.Refresh(did)
		}
	}
}

// forsaken returns the DIDs a sponsor no longer vouches for (a follower
// gone, an approval withdrawn) and the operators no follower's network
// names any more: their records stay charged to a sponsor that is gone
// until their repos are listed again (and kept, if still of interest,
// for a sponsor that vouches for them now), so a follower that changes
// what it vouches for leaves no records behind.
func forsaken(prev, next *interest) (dids, operators []string) {
	for d := range prev.participants {
		if !next.participants[d] {
			dids = append(dids, d)
		}
	}
	for role, m := range prev.approved {
		for d, sponsors := range m {
			if slices.ContainsFunc(sponsors, func(s string) bool { return !slices.Contains(next.approved[role][d], s) }) {
				dids = append(dids, d)
			}
		}
	}
	for op := range prev.operators {
		if !next.operators[op] {
			operators = append(operators, op)
		}
	}
	return slices.Concat(dids, operators), operators
}

// vouchedBy returns the DIDs the associations of operators in any feed
// name (O(associations), only when an operator is gone).
func (f *Feeds) vouchedBy(operators []string) []string {
	if len(operators) == 0 {
		return nil
	}
	var out []string
	for subject, recs := range *f.vouchers.Load() {
		if slices.ContainsFunc(recs, func(r *Rec) bool { return slices.Contains(operators, r.DID) }) {
			out = append(out, subject)
		}
	}
	return out
}

// rebuildVouchers gathers the association records of every feed
// (Feeds.vouchers); f.mu is held.
func (f *Feeds) rebuildVouchers() {
	all := map[string][]*Rec{}
	for _, fd := range f.feeds {
		for subject, recs := range fd.idx.Load().vouchers {
			all[subject] = append(all[subject], recs...)
		}
	}
	f.vouchers.Store(&all)
}

// sponsors are who vouch for did in role, whose quota its records are
// charged to (none: did is a stranger): did itself if it trades here as
// a follower, the followers whose identity approves it, and the
// operators of the networks that follow this feed that vouch for it (an
// association record any feed holds: the operator's repo may be on
// another source of the network), each for its own followers only.
// O(sponsors).
func (f *Feeds) sponsors(fd *feed, in *interest, did string, role Role) []string {
	var out []string
	if in.participants[did] {
		out = append(out, did)
	}
	out = append(out, in.approved[role][did]...)
	ops := fd.operators.Load()
	for _, r := range (*f.vouchers.Load())[did] {
		if ops != nil && (*ops)[r.DID] && slices.Contains(r.Association.Roles, string(role)) {
			out = append(out, r.DID)
		}
	}
	return out
}

// keep is the feeds' Keep: a record is kept when it is small, of a
// participant the followers deal with, and within its quotas (see
// ledger).
func (f *Feeds) keep(fd *feed, uri, did, collection string, value json.RawMessage) bool {
	sponsors, ok := f.wanted(fd, did, collection, value)
	if !ok {
		fd.ledger.drop(uri)
		return false
	}
	return fd.ledger.admit(uri, did, sponsors)
}

// wanted says whether a record is of interest, and whom it is charged to
// (no sponsor: its author is a stranger): operators' associations (to the
// operator); requests, accepts and releases of vouched requesters;
// leases and reclaims of vouched bidders; bids of vouched bidders; and,
// of strangers, only bids on a request of a requester follower (a
// requester records unvouched bids as such).
func (f *Feeds) wanted(fd *feed, did, collection string, value json.RawMessage) (sponsors []string, ok bool) {
	if len(value) > maxFeedRecord {
		return nil, false
	}
	in := f.interest.Load()
	switch collection {
	case lexicon.Association:
		return []string{did}, in.operators[did]
	case lexicon.Request, lexicon.Accept, lexicon.Release:
		sponsors = f.sponsors(fd, in, did, RoleRequester)
		return sponsors, len(sponsors) > 0
	case lexicon.Lease, lexicon.Reclaim:
		sponsors = f.sponsors(fd, in, did, RoleBidder)
		return sponsors, len(sponsors) > 0
	case lexicon.Bid:
		if sponsors = f.sponsors(fd, in, did, RoleBidder); len(sponsors) > 0 {
			return sponsors, true
		}
		var b struct {
			Request StrongRef `json:"request"`
		}
		if json.Unmarshal(value, &b) != nil {
			return nil, false
		}
		// Not only on a request the feed holds already: a full listing
		// may read the stranger's repo before the requester's, and
		// nothing would list the stranger again.
		requester, col, _ := SplitURI(b.Request.URI)
		return nil, in.requesters[requester] && col == lexicon.Request
	}
	return nil, false
}

// Unfollow forgets req; feeds nobody follows any more are dropped.
func (f *Feeds) Unfollow(req mcreconcile.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	prev := f.followers[req]
	if prev == nil {
		return
	}
	delete(f.followers, req)
	f.index(prev.Follower, false)
	f.release(req, prev.sources, nil)
	f.rebuildInterest()
}

// release drops req from the feeds of sources not in keep; f.mu is held.
func (f *Feeds) release(req mcreconcile.Request, sources, keep []string) {
	for _, src := range sources {
		if slices.Contains(keep, src) {
			continue
		}
		fd := f.feeds[src]
		if fd == nil {
			continue
		}
		delete(fd.users, req)
		if len(fd.users) == 0 {
			delete(f.feeds, src)
			f.hub.Unsubscribe(fd.sub)
			if fd.stop != nil {
				fd.stop()
			}
			f.rebuildVouchers()
		}
	}
}

// Followers returns the followers of role that trade as did (the index of
// requesters and bidders by DID over every engaged workspace).
func (f *Feeds) Followers(role Role, did string) []mcreconcile.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []mcreconcile.Request
	for req := range f.byDID[role][did] {
		out = append(out, req)
	}
	return out
}

// usersOf returns the followers of role that read the feed of src.
func (f *Feeds) usersOf(src string, role Role) []mcreconcile.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	fd := f.feeds[src]
	if fd == nil {
		return nil
	}
	var out []mcreconcile.Request
	for req := range fd.users {
		if fl := f.followers[req]; fl != nil && fl.Role == role {
			out = append(out, req)
		}
	}
	return out
}

// check validates a record from a firehose before a feed keeps it.
func (f *Feeds) check(collection string, value json.RawMessage) error {
	err := lexicon.ValidateRecord(collection, value)
	if err != nil {
		label := collection
		if !slices.Contains(Collections(), label) {
			label = "other"
		}
		f.invalid.WithLabelValues(label).Inc()
	}
	return err
}

// route wakes the followers that changed records concern: bidders for
// requests and leases (a lease of another bid ends a bid), the requester
// a bid, lease or reclaim answers, the bidder an accept or release
// answers; everyone of the feed for an association.
func (f *Feeds) route(src string, changed []*Rec, idx *index) {
	var requesters, bidders []mcreconcile.Request
	allBidders, all := false, false
	for _, r := range changed {
		parentDID, _, _ := SplitURI(r.Parent.URI)
		switch r.Collection {
		case lexicon.Request:
			allBidders = true
		case lexicon.Bid:
			requesters = append(requesters, f.Followers(RoleRequester, parentDID)...)
		case lexicon.Lease:
			requesters = append(requesters, f.Followers(RoleRequester, parentDID)...)
			allBidders = true
		case lexicon.Reclaim:
			if l := idx.recs[r.Parent.URI]; l != nil {
				requester, _, _ := SplitURI(l.Parent.URI)
				requesters = append(requesters, f.Followers(RoleRequester, requester)...)
			}
		case lexicon.Accept, lexicon.Release:
			bidders = append(bidders, f.Followers(RoleBidder, parentDID)...)
		case lexicon.Association:
			all = true
		}
	}
	if all || allBidders {
		bidders = f.usersOf(src, RoleBidder)
	}
	if all {
		requesters = f.usersOf(src, RoleRequester)
	}
	f.wake(RoleRequester, requesters)
	f.wake(RoleBidder, bidders)
}

// feed is one source's records.
type feed struct {
	source string
	sub    *firehose.Subscription
	stop   context.CancelFunc
	// users are guarded by Feeds.mu.
	users map[mcreconcile.Request]bool

	idx atomic.Pointer[index]
	// operators are the operators of the networks of the feed's users:
	// only their associations vouch for records on this feed. Rebuilt
	// under Feeds.mu with the interest.
	operators atomic.Pointer[map[string]bool]
	// ledger accounts for the records the subscription keeps, by author.
	ledger *ledger

	mu        sync.Mutex
	refreshed map[string]time.Time
	// vouched are the DIDs an operator's association (in any feed) named
	// since the feed started: their repos were listed again then (their
	// records may not have been kept before). Guarded by Feeds.mu.
	vouched map[string]bool
}

// index is one snapshot of a feed, never changed once stored.
type index struct {
	version  uint64
	built    bool
	health   firehose.Health
	recs     map[string]*Rec
	children map[string][]*Rec
	requests []*Rec
	// vouchers are the association records of a DID (their rkey), by
	// that DID.
	vouchers map[string][]*Rec
	// dids are the repos the feed holds records of.
	dids map[string]bool
}

// healthEvery is how often an idle feed reads its stream's health.
const healthEvery = time.Second

func (fd *feed) run(ctx context.Context, f *Feeds) {
	tick := time.NewTicker(healthEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-fd.sub.Changed():
			prev := fd.idx.Load()
			mark := fd.ledger.mark()
			state, health, version := fd.sub.Snapshot()
			fd.settle(state, mark)
			next, changed := build(prev, state, version, health, f.opts.Now(), f.opts.Log)
			fd.idx.Store(next)
			if len(changed) > 0 {
				f.listVouched(changed)
				f.route(fd.source, changed, next)
			}
		case <-tick.C:
			prev := fd.idx.Load()
			if h := fd.sub.Health(); h.Connected != prev.health.Connected || h.Full != prev.health.Full || !sameErr(h.Err, prev.health.Err) || !sameErr(h.ResyncErr, prev.health.ResyncErr) {
				next := *prev
				next.health = h
				fd.idx.Store(&next)
				if (prev.health.Full && !h.Full) || (!prev.health.Connected && h.Connected) {
					// A listing ended: every follower may decide now.
					f.wake(RoleRequester, f.usersOf(fd.source, RoleRequester))
					f.wake(RoleBidder, f.usersOf(fd.source, RoleBidder))
				}
			}
		}
	}
}

// settle forgets in the ledger what state (taken after mark) no longer
// holds, and lists again the members that are under their quota again:
// the records refused before may be kept now.
func (fd *feed) settle(state firehose.State, mark uint64) {
	under := fd.ledger.reconcile(func(uri string) bool { _, ok := state.Records[uri]; return ok }, mark)
	for did, refusals := range under {
		fd.ledger.settle(did, refusals, fd.sub.Listed(did))
		fd.sub.Refresh(did)
	}
}

// listVouched gathers the feeds' associations again when changed holds
// one, and has every feed a network of the association's operator
// follows list again the repos they newly name: a participant's records
// are kept only once it is vouched for, and they may come from another
// source of the network than the association.
func (f *Feeds) listVouched(changed []*Rec) {
	if !slices.ContainsFunc(changed, func(r *Rec) bool { return r.Collection == lexicon.Association }) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rebuildVouchers()
	for _, r := range changed {
		if r.Association == nil {
			continue
		}
		for _, fd := range f.feeds {
			if ops := fd.operators.Load(); ops != nil && (*ops)[r.DID] && !fd.vouched[r.Association.Subject] {
				fd.vouched[r.Association.Subject] = true
				fd.sub.Refresh(r.Association.Subject)
			}
		}
	}
}

func sameErr(a, b error) bool {
	if a == nil || b == nil {
		return (a == nil) == (b == nil)
	}
	return a.Error() == b.Error()
}

// build indexes a subscription's state, keeping what prev knew of records
// it saw already (when it first saw them), and returns the records that
// are new, changed or gone (as they were).
func build(prev *index, state firehose.State, version uint64, health firehose.Health, now time.Time, log logr.Logger) (*index, []*Rec) {
	next := &index{version: version, built: true, health: health, recs: make(map[string]*Rec, len(state.Records)), children: map[string][]*Rec{}, vouchers: map[string][]*Rec{}, dids: map[string]bool{}}
	var changed []*Rec
	for uri, r := range state.Records {
		rec := prev.recs[uri]
		if rec == nil || rec.CID != r.CID {
			var err error
			if rec, err = NewRec(r.URI, r.CID, r.Rev, r.Value, now); err != nil {
				log.V(1).Info("ignoring a market record", "uri", uri, "err", err)
				continue
			}
			changed = append(changed, rec)
		}
		next.recs[uri] = rec
		next.dids[rec.DID] = true
		if rec.Parent.URI != "" {
			next.children[rec.Parent.URI] = append(next.children[rec.Parent.URI], rec)
		}
		if rec.Accept != nil && rec.Accept.Request.URI != "" && rec.Accept.Request.URI != rec.Parent.URI {
			next.children[rec.Accept.Request.URI] = append(next.children[rec.Accept.Request.URI], rec)
		}
		if rec.Collection == lexicon.Request {
			next.requests = append(next.requests, rec)
		}
		if rec.Association != nil {
			next.vouchers[rec.RKey] = append(next.vouchers[rec.RKey], rec)
		}
	}
	for uri, rec := range prev.recs {
		if n := next.recs[uri]; n == nil {
			changed = append(changed, rec)
		}
	}
	return next, changed
}

// Rec is a market record a feed keeps, decoded.
type Rec struct {
	URI, CID, DID, Collection, RKey string
	// Rev of the commit that wrote it (empty when a listing found it).
	Rev string
	// FirstSeen is when this feed first saw this version, by the
	// provider's clock.
	FirstSeen time.Time
	// Parent is the record this one answers (a bid's request, an accept's
	// bid, a lease's accept, a release's or reclaim's lease).
	Parent StrongRef

	Request     *Request
	Bid         *Bid
	Accept      *Accept
	Lease       *Lease
	Release     *Release
	Reclaim     *Reclaim
	Association *Association
}

// Ref is the record's strong reference.
func (r *Rec) Ref() StrongRef { return StrongRef{URI: r.URI, CID: r.CID} }

// Reclaim is the content of a dev.knotless.market.reclaim record.
type Reclaim struct {
	Type           string                       `json:"$type"`
	Lease          StrongRef                    `json:"lease"`
	Reason         marketv1alpha1.ReclaimReason `json:"reason"`
	TerminateAfter string                       `json:"terminateAfter"`
	CreatedAt      string                       `json:"createdAt"`
}

// NewRec decodes a market record (already validated against its
// lexicon) first seen at firstSeen.
func NewRec(uri, cid, rev string, value json.RawMessage, firstSeen time.Time) (*Rec, error) {
	did, col, rkey := SplitURI(uri)
	if did == "" {
		return nil, fmt.Errorf("not an at-URI: %q", uri)
	}
	rec := &Rec{URI: uri, CID: cid, DID: did, Collection: col, RKey: rkey, Rev: rev, FirstSeen: firstSeen}
	r := struct{ Value json.RawMessage }{value}
	var err error
	switch col {
	case lexicon.Request:
		rec.Request = &Request{}
		err = json.Unmarshal(r.Value, rec.Request)
	case lexicon.Bid:
		rec.Bid = &Bid{}
		err = json.Unmarshal(r.Value, rec.Bid)
		rec.Parent = rec.Bid.Request
	case lexicon.Accept:
		rec.Accept = &Accept{}
		err = json.Unmarshal(r.Value, rec.Accept)
		rec.Parent = rec.Accept.Bid
	case lexicon.Lease:
		rec.Lease = &Lease{}
		err = json.Unmarshal(r.Value, rec.Lease)
		rec.Parent = rec.Lease.Accept
	case lexicon.Release:
		rec.Release = &Release{}
		err = json.Unmarshal(r.Value, rec.Release)
		rec.Parent = rec.Release.Lease
	case lexicon.Reclaim:
		rec.Reclaim = &Reclaim{}
		err = json.Unmarshal(r.Value, rec.Reclaim)
		rec.Parent = rec.Reclaim.Lease
	case lexicon.Association:
		rec.Association = &Association{}
		err = json.Unmarshal(r.Value, rec.Association)
	default:
		return nil, fmt.Errorf("collection %s is not a market record", col)
	}
	if err != nil {
		return nil, err
	}
	return rec, nil
}

// View is a follower's view of its network's feeds.
type View struct {
	feeds        []*feed
	refreshEvery time.Duration
	now          func() time.Time
}

// ErrIncomplete is returned by View.Complete while a feed is connecting or
// listing records: what is missing may be there.
var ErrIncomplete = errors.New("the network's firehoses are being read")

// Complete reports whether every feed of the view is connected and has
// no full listing outstanding, so that what is absent from it is absent
// from the repos; otherwise it says why not. (A repo listed again on
// request does not make the view incomplete: until the listing ends it
// holds what the firehose said.)
func (v View) Complete() error {
	if len(v.feeds) == 0 {
		return errors.New("the network lists no firehose")
	}
	for _, fd := range v.feeds {
		idx := fd.idx.Load()
		h := idx.health
		switch {
		case !idx.built:
			return ErrIncomplete
		case h.Full && h.ResyncErr != nil:
			return fmt.Errorf("listing the records of %s: %w", fd.source, h.ResyncErr)
		case !h.Connected && h.Err != nil:
			return fmt.Errorf("reading %s: %w", fd.source, h.Err)
		case h.Full || !h.Connected:
			return ErrIncomplete
		}
	}
	return nil
}

// Get returns the record at uri, or nil. When sources disagree, the
// version of the newer commit wins.
func (v View) Get(uri string) *Rec {
	var best *Rec
	for _, fd := range v.feeds {
		if r := fd.idx.Load().recs[uri]; r != nil && (best == nil || r.Rev > best.Rev) {
			best = r
		}
	}
	return best
}

// Children returns the records that answer the record at uri, of
// collection, one per URI.
func (v View) Children(uri, collection string) []*Rec {
	var out []*Rec
	for _, fd := range v.feeds {
		for _, r := range fd.idx.Load().children[uri] {
			if r.Collection != collection {
				continue
			}
			if i := slices.IndexFunc(out, func(o *Rec) bool { return o.URI == r.URI }); i >= 0 {
				if r.Rev > out[i].Rev {
					out[i] = r
				}
				continue
			}
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b *Rec) int { return strings.Compare(a.URI, b.URI) })
	return out
}

// Requests returns every request record of the view, one per URI.
func (v View) Requests() []*Rec {
	seen := map[string]int{}
	var out []*Rec
	for _, fd := range v.feeds {
		for _, r := range fd.idx.Load().requests {
			if i, ok := seen[r.URI]; ok {
				if r.Rev > out[i].Rev {
					out[i] = r
				}
				continue
			}
			seen[r.URI] = len(out)
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b *Rec) int { return strings.Compare(a.URI, b.URI) })
	return out
}

// Vouches reports whether voucher has an association record in its own
// repo that names subject with role.
func (v View) Vouches(voucher, subject, role string) bool {
	if voucher == "" || subject == "" {
		return false
	}
	r := v.Get(URI(voucher, lexicon.Association, subject))
	return r != nil && r.Association != nil && r.Association.Subject == subject && slices.Contains(r.Association.Roles, role)
}

// Listed implements Reader: the latest listing of did on any feed, but
// for a feed that refused records of did for a quota since (the listing
// may miss what is in the repo).
func (v View) Listed(did string) time.Time {
	var t time.Time
	for _, fd := range v.feeds {
		if l := fd.sub.Listed(did); l.After(t) && !fd.ledger.hides(did, l) {
			t = l
		}
	}
	return t
}

// List implements Reader.
func (v View) List(did string) {
	now := v.now()
	for _, fd := range v.carriers(did) {
		fd.mu.Lock()
		fd.refreshed[did] = now
		fd.mu.Unlock()
		fd.sub.Refresh(did)
	}
}

// carriers are the feeds that carry did's repo (they hold records of it):
// a listing on another would leave records its firehose never updates.
// When none holds any, all are.
func (v View) carriers(did string) []*feed {
	var out []*feed
	for _, fd := range v.feeds {
		if fd.idx.Load().dids[did] {
			out = append(out, fd)
		}
	}
	if len(out) == 0 {
		return v.feeds
	}
	return out
}

// Refresh lists did's market records again from its PDS on the feeds of
// the view that carry it, at most once per FeedsOptions.RefreshEvery per
// feed: a follower reconciles the repos it deals with from listRecords
// now and then, not from the firehose alone.
func (v View) Refresh(did string) {
	now := v.now()
	for _, fd := range v.carriers(did) {
		fd.mu.Lock()
		due := now.Sub(fd.refreshed[did]) >= v.refreshEvery
		if due {
			fd.refreshed[did] = now
			for k, t := range fd.refreshed {
				if now.Sub(t) > 10*v.refreshEvery {
					delete(fd.refreshed, k)
				}
			}
		}
		fd.mu.Unlock()
		if due {
			fd.sub.Refresh(did)
		}
	}
}
