package firehose

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bluesky-social/indigo/api/agnostic"
	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/knotless-dev/knotless/internal/backoff"
	"github.com/knotless-dev/knotless/internal/bodylimit"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// resyncQueue holds owed listings, one per (subscription, DID); DID ""
// is a full listing.
type resyncQueue struct {
	mu    sync.Mutex
	items []resyncReq
	wake  chan struct{}
}

type resyncReq struct {
	sub    *Subscription
	did    string
	reason string
	// refused counts the times this listing was refused as too large in
	// a row; it is not tried again before notBefore.
	refused   int
	notBefore time.Time
}

func (q *resyncQueue) add(sub *Subscription, did, reason string) {
	q.push(resyncReq{sub: sub, did: did, reason: reason})
}

// push queues req unless a listing that covers it is owed already.
func (q *resyncQueue) push(req resyncReq) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, it := range q.items {
		if it.sub == req.sub && (it.did == req.did || it.did == "") {
			return
		}
	}
	q.items = append(q.items, req)
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *resyncQueue) drop(sub *Subscription) {
	q.mu.Lock()
	defer q.mu.Unlock()
	kept := q.items[:0]
	for _, it := range q.items {
		if it.sub != sub {
			kept = append(kept, it)
		}
	}
	q.items = kept
}

// next takes the first listing due at now. If none is, it returns how
// long until one is (0: none is queued).
func (q *resyncQueue) next(now time.Time) (resyncReq, time.Duration, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var wait time.Duration
	for i, it := range q.items {
		if d := it.notBefore.Sub(now); d > 0 {
			if wait == 0 || d < wait {
				wait = d
			}
			continue
		}
		q.items = slices.Delete(q.items, i, i+1)
		return it, 0, true
	}
	return resyncReq{}, wait, false
}

// wait returns when a listing is queued, after d (if not 0), or false
// when ctx ends.
func (q *resyncQueue) wait(ctx context.Context, d time.Duration) bool {
	var due <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		due = t.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-q.wake:
	case <-due:
	}
	return true
}

// requestResync owes sub a listing of did ("" = everything) because of
// the event seq (0: none) and queues it.
func (s *stream) requestResync(sub *Subscription, did, reason string, seq int64) {
	sub.owe(did, reason, seq)
	s.resync.add(sub, did, reason)
}

// resyncLoop performs owed listings one at a time, retrying failed ones
// with backoff. A listing refused as too large waits on its own, longer
// backoff, while the other subscriptions' listings go on.
func (s *stream) resyncLoop(ctx context.Context) {
	schedule := backoff.NewSchedule(s.hub.opts.Backoff)
	for {
		req, wait, ok := s.resync.next(time.Now())
		if !ok {
			if !s.resync.wait(ctx, wait) {
				return
			}
			continue
		}
		s.mu.Lock()
		_, subscribed := s.subs[req.sub]
		live := s.connected && req.sub.joined(s.gen)
		s.mu.Unlock()
		if !subscribed {
			continue
		}
		if req.did == "" && !live {
			// A full listing must start after the connection it continues
			// with; the next connection asks for it again.
			continue
		}
		started := time.Now()
		var err error
		var private atomic.Bool
		lctx := netpolicy.TracePrivate(ctx, &private)
		err = privateFailure(s.list(lctx, req), &private)
		if err == nil {
			schedule = backoff.NewSchedule(s.hub.opts.Backoff)
			req.sub.resynced(req.did, req.reason)
			s.hub.opts.Metrics.resync(s.label, req.reason)
			s.log.V(1).Info("resynced", "did", req.did, "reason", req.reason)
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if req.did != "" && repoFailed(err) && !errors.Is(err, ErrListingTooLarge) {
			// Tried again only while owed: the repo may have left the
			// source meanwhile (listings of a stream run one at a time, so
			// nothing else cleared it during this one).
			if req.sub.owes(req.did) {
				req.sub.unlistRepo(req.did, req.reason, err)
				s.refuse(req, err)
			}
			continue
		}
		req.sub.resyncFailed(err)
		if errors.Is(err, ErrListingTooLarge) {
			s.refuse(req, err)
			continue
		}
		delay := schedule.Next(time.Since(started))
		s.log.Info("resync failed; retrying", "did", req.did, "reason", req.reason, "in", delay, "err", err)
		s.resync.add(req.sub, req.did, req.reason)
		if !backoff.Sleep(ctx, delay) {
			return
		}
	}
}

// list runs one listing. A panic while it runs (a hostile PDS's record
// through a subscription's check, indigo decoding what it left out) fails
// the listing with ErrFaultyListing, tried again with backoff, instead of
// crashing the provider every workspace shares (R21).
func (s *stream) list(ctx context.Context, req resyncReq) (err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Info("a listing panicked; trying again later", "did", req.did, "reason", req.reason, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			err = ErrFaultyListing
			if req.did != "" {
				err = repoFailure{err} // its records did it
			}
		}
	}()
	if req.did == "" {
		return s.resyncAll(ctx, req.sub, req.reason)
	}
	return s.resyncRepo(ctx, req.sub, req.did, nil)
}

// refuse queues a listing refused as too large, or one repo's listing
// that failed on the repo's own account (repoFailed), again after the
// limits' retry backoff; the stream's other listings do not wait for it.
func (s *stream) refuse(req resyncReq, err error) {
	delay := s.hub.opts.Listing.Retry.Delay(req.refused)
	s.log.Info("listing refused; trying again later", "did", req.did, "reason", req.reason, "in", delay, "err", err)
	req.refused++
	req.notBefore = time.Now().Add(delay)
	s.resync.push(req)
}

// listing is a repo's records in the subscription's collections, all as
// of commit rev.
type listing struct {
	rev     string
	records []Record
}

// resyncAll lists every followed repo and replaces the subscription's
// records, within the limits of a listing of the source.
func (s *stream) resyncAll(ctx context.Context, sub *Subscription, reason string) error {
	src := s.hub.opts.Listing.sourceBudget()
	dids := sub.filter.DIDs
	if len(dids) == 0 {
		var err error
		if dids, err = s.listRepos(ctx, src); err != nil {
			return err
		}
	}
	for _, did := range dids {
		if len(sub.filter.DIDs) > 0 {
			// A DID the subscription names may live on a PDS this source
			// does not carry: its records would be listed once and never
			// updated by this stream.
			ok, err := s.carries(ctx, did)
			if repoFailed(err) && ctx.Err() == nil {
				s.unlistRepo(sub, did, reason, err)
				continue
			}
			if err != nil {
				return err
			}
			if !ok {
				sub.replaceRepo(did, &listing{})
				continue
			}
		}
		var private atomic.Bool
		err := privateFailure(s.resyncRepoGuarded(netpolicy.TracePrivate(ctx, &private), sub, did, src), &private)
		switch {
		case err == nil:
			sub.relisted(did)
		case repoTooLarge(err):
			s.skipRepo(sub, did, reason, err)
		case repoFailed(err) && ctx.Err() == nil:
			s.unlistRepo(sub, did, reason, err)
		default:
			return err
		}
	}
	if len(sub.filter.DIDs) == 0 {
		sub.dropReposExcept(dids)
	}
	return nil
}

// skipRepo leaves out of a full listing one repo past its own listing
// bounds: its records are not kept, it stays owed (so the subscription
// says ListingTooLarge while Resyncing) and its listing is tried again
// after the refusal backoff, while the full listing goes on with the
// source's other repos. What was read of it still counts against the
// source's budget, so many such repos refuse the source.
func (s *stream) skipRepo(sub *Subscription, did, reason string, err error) {
	sub.refuseRepo(did, reason, err)
	s.refuse(resyncReq{sub: sub, did: did, reason: reason}, err)
}

// unlistRepo leaves out of a full listing one repo whose listing failed
// on the repo's own account: its DID does not resolve, the PDS its
// document names (not the source) failed, or it kept changing. What is
// known of it is kept, it stays owed (the subscription says why while
// Resyncing) and its listing is tried again after the refusal backoff,
// while the full listing goes on. Before, the whole listing failed and
// was retried forever: anyone with an account on a PDS could stall every
// watch and market feed of it by naming a dead PDS in their DID document
// (R21).
func (s *stream) unlistRepo(sub *Subscription, did, reason string, err error) {
	sub.unlistRepo(did, reason, err)
	s.refuse(resyncReq{sub: sub, did: did, reason: reason}, err)
}

// repoFailure marks a listing error that is the repo's own (see
// unlistRepo), not the source's.
type repoFailure struct{ error }

func (f repoFailure) Unwrap() error { return f.error }

func repoFailed(err error) bool {
	var f repoFailure
	return errors.As(err, &f)
}

// resyncRepoGuarded is resyncRepo within a full listing: a panic (a
// record of the repo that panics a subscription's check) is the repo's
// own failure, which leaves it unlisted, not the whole listing's (R21).
func (s *stream) resyncRepoGuarded(ctx context.Context, sub *Subscription, did string, src *budget) (err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Info("listing a repo panicked; leaving it out", "did", did, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			err = repoFailure{fmt.Errorf("listing %s: %w", did, ErrFaultyListing)}
		}
	}()
	return s.resyncRepo(ctx, sub, did, src)
}

// resyncRepo lists one repo and replaces its records, again if commits
// were applied meanwhile that the listing may not include. Within a full
// listing, src is the source's budget (nil otherwise).
func (s *stream) resyncRepo(ctx context.Context, sub *Subscription, did string, src *budget) error {
	for range 5 {
		mark := src.mark()
		l, err := s.listRepo(ctx, did, sub.filter.Collections, src)
		if err != nil {
			return err
		}
		if sub.replaceRepo(did, l) {
			return nil
		}
		if err := src.restore(mark); err != nil {
			return repoFailure{fmt.Errorf("repo %s changed while it was listed: %w", did, err)}
		}
	}
	return repoFailure{fmt.Errorf("repo %s kept changing while it was listed", did)}
}

// api is a client of host for listings: every response body is capped
// at the limits' PageBytes, and a request that fails on its way to a
// loopback, private or shared address fails with ErrPrivateUnreachable.
func (s *stream) api(host string) *atclient.APIClient {
	c := *s.hub.opts.HTTPClient
	c.Transport = privateFailures{bodylimit.Transport(c.Transport, s.hub.opts.Listing.PageBytes)}
	return &atclient.APIClient{Client: &c, Host: host}
}

// privateFailures marks with ErrPrivateUnreachable the errors of requests
// that tried to connect to a private address (netpolicy.Private), except
// the address policy's refusals, so that a listing from such a host
// reads alike whatever went wrong (R17).
type privateFailures struct{ next http.RoundTripper }

func (p privateFailures) RoundTrip(req *http.Request) (*http.Response, error) {
	var private atomic.Bool
	resp, err := p.next.RoundTrip(req.WithContext(netpolicy.TracePrivate(req.Context(), &private)))
	if err != nil && private.Load() && !errors.Is(err, netpolicy.ErrDenied) {
		return nil, fmt.Errorf("%w: %w", ErrPrivateUnreachable, err)
	}
	return resp, err
}

// privateFailure marks with ErrPrivateUnreachable the error of a listing
// any of whose requests (to the source, a PDS or a DID document's host)
// went to a loopback, private or shared address: whatever went wrong, a
// refused or silent port, a certificate, any HTTP status or a body that
// does not decode, reads alike to the watch (R17), so a user cannot scan
// the operator's networks by naming a PDS there in a DID document. The
// address policy's refusals (AddressNotAllowed) and the listing bounds
// (ListingTooLarge: only a server that answers page after page, or one
// body past PageBytes, reaches them) keep their reasons.
func privateFailure(err error, private *atomic.Bool) error {
	if err == nil || !private.Load() || errors.Is(err, netpolicy.ErrDenied) || errors.Is(err, ErrListingTooLarge) || errors.Is(err, ErrPrivateUnreachable) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrPrivateUnreachable, err)
}

// ErrDIDUnresolved is wrapped by a listing's error when a DID's document
// could not be read.
var ErrDIDUnresolved = errors.New("the DID does not resolve")

// lookup resolves did through the hub's directory. The cause of a
// failure goes to the log only: the DID's owner chooses where its
// document is read from (a did:web host, at a private address too), and
// how that failed (refused, silent, a certificate, an HTTP status) must
// not read differently in a watch's message (R17); the directory caches
// failures, so a retry would not even make a connection that
// privateFailure could see.
//
// The failure is the repo's own (repoFailure) when the DID does not
// exist or is a did:web, whose owner chooses the host its document is
// read from; a did:plc that fails otherwise is the PLC directory's (the
// operator's) failure, which fails the whole listing: a directory outage
// must not end a listing as if every repo were empty.
func (s *stream) lookup(ctx context.Context, did string) (*identity.Identity, error) {
	ident, err := s.hub.opts.Directory.LookupDID(ctx, syntax.DID(did))
	if err != nil {
		s.log.V(1).Info("DID resolution failed", "did", did, "error", err.Error())
		unresolved := fmt.Errorf("resolving %s: %w", did, ErrDIDUnresolved)
		if errors.Is(err, identity.ErrDIDNotFound) || !strings.HasPrefix(did, "did:plc:") || tombstoned(err) {
			return nil, repoFailure{unresolved}
		}
		return nil, unresolved
	}
	return ident, nil
}

// tombstoned reports whether the PLC directory answered that the DID is
// gone (410: its owner tombstoned it while a PDS may still list the
// repo). indigo names no error for it, only the status in its message.
func tombstoned(err error) bool {
	return strings.Contains(err.Error(), "PLC directory status 410")
}

// isSource reports whether endpoint, a PDS a DID document names, is the
// source itself (the same URL, case and a final slash aside).
func (s *stream) isSource(endpoint string) bool {
	n, err := NormalizeSource(endpoint)
	return err == nil && n == s.source
}

// client returns a client of did's own PDS, from its DID document. A DID
// that does not resolve is an error: a listing from the source instead
// would be unsigned, and a hostile source could make up another
// participant's records. Its errors are the repo's own (repoFailure),
// but for a failure of the PLC directory (see lookup).
func (s *stream) client(ctx context.Context, did string) (*atclient.APIClient, error) {
	ident, err := s.lookup(ctx, did)
	if err != nil {
		return nil, err
	}
	if ident.PDSEndpoint() == "" {
		return nil, repoFailure{fmt.Errorf("%s names no PDS", did)}
	}
	return s.api(ident.PDSEndpoint()), nil
}

// carries reports whether the source's firehose carries did's repo: the
// source is did's PDS, or it has the repo (a relay answers
// getLatestCommit for every repo it follows; another PDS does not).
func (s *stream) carries(ctx context.Context, did string) (bool, error) {
	ident, err := s.lookup(ctx, did)
	if err != nil {
		// Without the DID's PDS the source cannot be told from it, and a
		// listing from the source would be unsigned: try again later.
		return false, err
	}
	if s.isSource(ident.PDSEndpoint()) {
		return true, nil
	}
	rev, err := latestRev(ctx, s.api(s.source), did, s.hub.opts.Listing.PageBytes)
	if err != nil {
		return false, err
	}
	return rev != "", nil
}

// listRepos pages the source's listRepos, within the limits: at most
// Repos active repos and Pages pages, their DIDs charged to src.
func (s *stream) listRepos(ctx context.Context, src *budget) ([]string, error) {
	c := s.api(s.source)
	var dids []string
	cursor := ""
	for {
		if err := src.page(); err != nil {
			return nil, fmt.Errorf("listing the repos of %s: %w", s.source, err)
		}
		out, err := comatproto.SyncListRepos(ctx, c, cursor, 1000)
		if err != nil {
			return nil, fmt.Errorf("listing the repos of %s: %w", s.source, tooLarge(err, s.hub.opts.Listing.PageBytes))
		}
		for _, r := range out.Repos {
			if r.Active != nil && !*r.Active {
				continue
			}
			if len(dids) >= s.hub.opts.Listing.Repos {
				return nil, fmt.Errorf("listing the repos of %s: %w", s.source, &limitError{what: "repos in the source's listRepos", limit: int64(s.hub.opts.Listing.Repos), whole: true})
			}
			if err := src.take(0, int64(len(r.Did))); err != nil {
				return nil, fmt.Errorf("listing the repos of %s: %w", s.source, err)
			}
			dids = append(dids, r.Did)
		}
		if out.Cursor == nil || *out.Cursor == "" || len(out.Repos) == 0 {
			return dids, nil
		}
		cursor = *out.Cursor
	}
}

// listRepo reads a repo's records between two reads of its latest commit
// that agree, so the listing is exactly the repo as of that rev. A repo
// that is gone lists as empty. Each try is one listing within the limits
// (and charged to src, the source's budget, if not nil).
func (s *stream) listRepo(ctx context.Context, did string, collections []string, src *budget) (*listing, error) {
	c, err := s.client(ctx, did)
	if err != nil {
		return nil, err
	}
	l, err := s.listRepoAt(ctx, c, did, collections, src)
	var limit *limitError
	if err != nil && !s.isSource(c.Host) && !errors.As(err, &limit) {
		// The PDS the DID document names failed, not the source. (A
		// bound keeps its own handling: a repo's is the repo's, the
		// source's refuses the source.)
		err = repoFailure{err}
	}
	return l, err
}

// listRepoAt is listRepo's listing from c, the repo's own PDS.
func (s *stream) listRepoAt(ctx context.Context, c *atclient.APIClient, did string, collections []string, src *budget) (*listing, error) {
	for range 5 {
		before, err := latestRev(ctx, c, did, s.hub.opts.Listing.PageBytes)
		if err != nil {
			return nil, err
		}
		if before == "" {
			return &listing{}, nil
		}
		l := &listing{rev: before}
		mark := src.mark()
		b := s.hub.opts.Listing.repoBudget(src)
		for _, col := range collections {
			if err := listCollection(ctx, c, did, col, l, b); err != nil {
				err = tooLarge(err, s.hub.opts.Listing.PageBytes)
				return nil, fmt.Errorf("listing %s of %s: %w", col, did, err)
			}
		}
		after, err := latestRev(ctx, c, did, s.hub.opts.Listing.PageBytes)
		if err != nil {
			return nil, err
		}
		if after == before {
			return l, nil
		}
		if err := src.restore(mark); err != nil {
			return nil, repoFailure{fmt.Errorf("repo %s changed while it was listed: %w", did, err)}
		}
	}
	return nil, repoFailure{fmt.Errorf("repo %s kept changing while it was listed", did)}
}

// listCollection pages listRecords of one collection of did into l,
// charging b.
func listCollection(ctx context.Context, c *atclient.APIClient, did, col string, l *listing, b *budget) error {
	cursor := ""
	for {
		if err := b.page(); err != nil {
			return err
		}
		out, err := agnostic.RepoListRecords(ctx, c, col, cursor, 100, did, false)
		if err != nil {
			return err
		}
		for _, r := range out.Records {
			var v json.RawMessage
			if r.Value != nil {
				v = *r.Value
			}
			// Every record read is charged, also one dropped below:
			// else a repo of records it drops reads without a bound
			// but the pages' (R21).
			if err := b.take(1, int64(len(r.Uri)+len(r.Cid)+len(v))); err != nil {
				return err
			}
			// A listing names its own records: drop any that claim
			// another repo or collection.
			if !strings.HasPrefix(r.Uri, "at://"+did+"/"+col+"/") {
				continue
			}
			l.records = append(l.records, Record{URI: r.Uri, CID: r.Cid, Value: v, Size: len(v)})
		}
		if out.Cursor == nil || *out.Cursor == "" || len(out.Records) == 0 {
			return nil
		}
		cursor = *out.Cursor
	}
}

// latestRev returns the repo's current rev, or "" if the host does not
// have it (deleted, deactivated, taken down). An answer past limit (c's
// body limit) refuses the listing as too large, like a listing page.
func latestRev(ctx context.Context, c *atclient.APIClient, did string, limit int64) (string, error) {
	out, err := comatproto.SyncGetLatestCommit(ctx, c, did)
	if err != nil {
		var apiErr *atclient.APIError
		if errors.As(err, &apiErr) && apiErr.StatusCode == 400 && strings.HasPrefix(apiErr.Name, "Repo") {
			// RepoNotFound, RepoDeactivated, RepoTakendown, RepoSuspended
			return "", nil
		}
		return "", fmt.Errorf("reading the latest commit of %s: %w", did, tooLarge(err, limit))
	}
	return out.Rev, nil
}
