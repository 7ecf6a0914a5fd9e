package firehose

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/api/agnostic"
	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/knotless-dev/knotless/internal/backoff"
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
}

func (q *resyncQueue) add(sub *Subscription, did, reason string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, it := range q.items {
		if it.sub == sub && (it.did == did || it.did == "") {
			return
		}
	}
	q.items = append(q.items, resyncReq{sub: sub, did: did, reason: reason})
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

func (q *resyncQueue) next() (resyncReq, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return resyncReq{}, false
	}
	it := q.items[0]
	q.items = q.items[1:]
	return it, true
}

// requestResync owes sub a listing of did ("" = everything) because of
// the event seq (0: none) and queues it.
func (s *stream) requestResync(sub *Subscription, did, reason string, seq int64) {
	sub.owe(did, reason, seq)
	s.resync.add(sub, did, reason)
}

// resyncLoop performs owed listings one at a time, retrying failed ones
// with backoff.
func (s *stream) resyncLoop(ctx context.Context) {
	schedule := backoff.NewSchedule(s.hub.opts.Backoff)
	for {
		req, ok := s.resync.next()
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-s.resync.wake:
				continue
			}
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
		if req.did == "" {
			err = s.resyncAll(ctx, req.sub)
		} else {
			err = s.resyncRepo(ctx, req.sub, req.did)
		}
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
		req.sub.resyncFailed(err)
		delay := schedule.Next(time.Since(started))
		s.log.Info("resync failed; retrying", "did", req.did, "reason", req.reason, "in", delay, "err", err)
		s.resync.add(req.sub, req.did, req.reason)
		if !backoff.Sleep(ctx, delay) {
			return
		}
	}
}

// listing is a repo's records in the subscription's collections, all as
// of commit rev.
type listing struct {
	rev     string
	records []Record
}

// resyncAll lists every followed repo and replaces the subscription's
// records.
func (s *stream) resyncAll(ctx context.Context, sub *Subscription) error {
	dids := sub.filter.DIDs
	if len(dids) == 0 {
		var err error
		if dids, err = s.listRepos(ctx); err != nil {
			return err
		}
	}
	for _, did := range dids {
		if len(sub.filter.DIDs) > 0 {
			// A DID the subscription names may live on a PDS this source
			// does not carry: its records would be listed once and never
			// updated by this stream.
			ok, err := s.carries(ctx, did)
			if err != nil {
				return err
			}
			if !ok {
				sub.replaceRepo(did, &listing{})
				continue
			}
		}
		if err := s.resyncRepo(ctx, sub, did); err != nil {
			return err
		}
	}
	if len(sub.filter.DIDs) == 0 {
		sub.dropReposExcept(dids)
	}
	return nil
}

// resyncRepo lists one repo and replaces its records, again if commits
// were applied meanwhile that the listing may not include.
func (s *stream) resyncRepo(ctx context.Context, sub *Subscription, did string) error {
	for range 5 {
		l, err := s.listRepo(ctx, did, sub.filter.Collections)
		if err != nil {
			return err
		}
		if sub.replaceRepo(did, l) {
			return nil
		}
	}
	return fmt.Errorf("repo %s kept changing while it was listed", did)
}

// client returns a client of did's own PDS, from its DID document. A DID
// that does not resolve is an error: a listing from the source instead
// would be unsigned, and a hostile source could make up another
// participant's records.
func (s *stream) client(ctx context.Context, did string) (*atclient.APIClient, error) {
	ident, err := s.hub.opts.Directory.LookupDID(ctx, syntax.DID(did))
	if err != nil {
		return nil, fmt.Errorf("resolving %s: %w", did, err)
	}
	if ident.PDSEndpoint() == "" {
		return nil, fmt.Errorf("%s names no PDS", did)
	}
	return &atclient.APIClient{Client: s.hub.opts.HTTPClient, Host: ident.PDSEndpoint()}, nil
}

// carries reports whether the source's firehose carries did's repo: the
// source is did's PDS, or it has the repo (a relay answers
// getLatestCommit for every repo it follows; another PDS does not).
func (s *stream) carries(ctx context.Context, did string) (bool, error) {
	ident, err := s.hub.opts.Directory.LookupDID(ctx, syntax.DID(did))
	if err != nil {
		// Without the DID's PDS the source cannot be told from it, and a
		// listing from the source would be unsigned: try again later.
		return false, fmt.Errorf("resolving %s: %w", did, err)
	}
	if ident.PDSEndpoint() == s.source {
		return true, nil
	}
	rev, err := latestRev(ctx, &atclient.APIClient{Client: s.hub.opts.HTTPClient, Host: s.source}, did)
	if err != nil {
		return false, err
	}
	return rev != "", nil
}

func (s *stream) listRepos(ctx context.Context) ([]string, error) {
	c := &atclient.APIClient{Client: s.hub.opts.HTTPClient, Host: s.source}
	var dids []string
	cursor := ""
	for {
		out, err := comatproto.SyncListRepos(ctx, c, cursor, 1000)
		if err != nil {
			return nil, fmt.Errorf("listing the repos of %s: %w", s.source, err)
		}
		for _, r := range out.Repos {
			if r.Active == nil || *r.Active {
				dids = append(dids, r.Did)
			}
		}
		if out.Cursor == nil || *out.Cursor == "" || len(out.Repos) == 0 {
			return dids, nil
		}
		cursor = *out.Cursor
	}
}

// listRepo reads a repo's records between two reads of its latest commit
// that agree, so the listing is exactly the repo as of that rev. A repo
// that is gone lists as empty.
func (s *stream) listRepo(ctx context.Context, did string, collections []string) (*listing, error) {
	c, err := s.client(ctx, did)
	if err != nil {
		return nil, err
	}
	for range 5 {
		before, err := latestRev(ctx, c, did)
		if err != nil {
			return nil, err
		}
		if before == "" {
			return &listing{}, nil
		}
		l := &listing{rev: before}
		for _, col := range collections {
			cursor := ""
			for {
				out, err := agnostic.RepoListRecords(ctx, c, col, cursor, 100, did, false)
				if err != nil {
					return nil, fmt.Errorf("listing %s of %s: %w", col, did, err)
				}
				for _, r := range out.Records {
					// A listing names its own records: drop any that claim
					// another repo or collection.
					if !strings.HasPrefix(r.Uri, "at://"+did+"/"+col+"/") {
						continue
					}
					var v json.RawMessage
					if r.Value != nil {
						v = *r.Value
					}
					l.records = append(l.records, Record{URI: r.Uri, CID: r.Cid, Value: v, Size: len(v)})
				}
				if out.Cursor == nil || *out.Cursor == "" || len(out.Records) == 0 {
					break
				}
				cursor = *out.Cursor
			}
		}
		after, err := latestRev(ctx, c, did)
		if err != nil {
			return nil, err
		}
		if after == before {
			return l, nil
		}
	}
	return nil, fmt.Errorf("repo %s kept changing while it was listed", did)
}

// latestRev returns the repo's current rev, or "" if the host does not
// have it (deleted, deactivated, taken down).
func latestRev(ctx context.Context, c *atclient.APIClient, did string) (string, error) {
	out, err := comatproto.SyncGetLatestCommit(ctx, c, did)
	if err != nil {
		var apiErr *atclient.APIError
		if errors.As(err, &apiErr) && apiErr.StatusCode == 400 && strings.HasPrefix(apiErr.Name, "Repo") {
			// RepoNotFound, RepoDeactivated, RepoTakendown, RepoSuspended
			return "", nil
		}
		return "", fmt.Errorf("reading the latest commit of %s: %w", did, err)
	}
	return out.Rev, nil
}
