package firehose

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// errIdentity marks a commit that could not be checked because the DID's
// identity could not be resolved (as opposed to a commit that is wrong).
var errIdentity = errors.New("identity not resolved")

// handle processes one event for the subscriptions joined to its
// connection. It runs on the DID's worker.
func (s *stream) handle(ctx context.Context, j job) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	switch ev := j.ev; {
	case ev.RepoCommit != nil:
		s.handleCommit(ctx, j.seq, ev.RepoCommit, j.subs)
	case ev.RepoSync != nil:
		subs := interested(j.subs, ev.RepoSync.Did)
		if len(subs) == 0 {
			return
		}
		commit, err := repo.VerifySyncMessage(ctx, s.hub.opts.Directory, ev.RepoSync)
		if err == nil && commit.DID != ev.RepoSync.Did {
			// indigo checks the signature of the DID inside the CAR only:
			// another repo's signed commit must not relist this one.
			err = fmt.Errorf("invalid #sync: signed for %s, sent for %s", commit.DID, ev.RepoSync.Did)
		}
		if err != nil {
			if ctx.Err() != nil {
				return // stopping: the event is replayed
			}
			s.reject(subs, ev.RepoSync.Did, j.seq, err)
			return
		}
		// The repo is now at this commit, whatever came before: list it,
		// unless that commit is already applied (a PDS also sends #sync
		// for a new account's first commit).
		for _, sub := range subs {
			if sub.behind(ev.RepoSync.Did, ev.RepoSync.Rev) {
				s.requestResync(sub, ev.RepoSync.Did, ResyncSync, j.seq)
			}
		}
	case ev.RepoIdentity != nil:
		// The DID's key or PDS may have changed.
		_ = s.hub.opts.Directory.Purge(ctx, syntax.DID(ev.RepoIdentity.Did).AtIdentifier())
	}
}

func interested(subs []*Subscription, did string) []*Subscription {
	var out []*Subscription
	for _, sub := range subs {
		if sub.filter.wantsDID(did) {
			out = append(out, sub)
		}
	}
	return out
}

func (s *stream) handleCommit(ctx context.Context, seq int64, msg *comatproto.SyncSubscribeRepos_Commit, subs []*Subscription) {
	subs = interested(subs, msg.Repo)
	if len(subs) == 0 {
		return
	}
	u, err := verifyCommit(ctx, s.hub.opts.Directory, msg, func(collection string) bool {
		for _, sub := range subs {
			if sub.filter.wantsCollection(collection) {
				return true
			}
		}
		return false
	})
	if err != nil {
		if ctx.Err() == nil { // stopping: the event is replayed
			s.reject(subs, msg.Repo, seq, err)
		}
		return
	}
	u.seq = seq
	for _, sub := range subs {
		if s.apply(sub, u) {
			s.requestResync(sub, u.did, ResyncPrevDataMismatch, seq)
		}
	}
}

// apply applies a verified commit to one subscription. A panic of that
// subscription's check (a hostile record) rejects the commit for it
// alone: the other subscriptions of the source still get it.
func (s *stream) apply(sub *Subscription, u *commitUpdate) (resync bool) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Info("a commit panicked a subscription's check; rejected for it", "did", u.did, "seq", u.seq, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			s.hub.opts.Metrics.rejected(s.label)
			sub.rejected()
			resync = false
		}
	}()
	return sub.apply(u)
}

// reject handles an event that failed verification: an unresolved
// identity makes the repo be listed (its commits cannot be trusted until
// then); anything else is counted and dropped.
func (s *stream) reject(subs []*Subscription, did string, seq int64, err error) {
	if errors.Is(err, errIdentity) {
		s.log.Info("commit not verified for want of the DID's identity; the repo will be listed", "did", did, "seq", seq, "err", err)
		for _, sub := range subs {
			s.requestResync(sub, did, ResyncUnverified, seq)
		}
		return
	}
	s.log.Info("rejected an event that failed verification", "did", did, "seq", seq, "err", err)
	s.hub.opts.Metrics.rejected(s.label)
	for _, sub := range subs {
		sub.rejected()
	}
}

// verifyCommit checks a commit message (well-formed, ops match the MST,
// prevData matches the inverted tree, the commit is signed by the DID's
// current key) and extracts the ops of the wanted collections with their
// values.
//
// indigo's verifier dereferences what a hostile source can leave out (a
// CAR whose MST lacks an op's record panicked it: FuzzFrame's corpus
// d060f44225fda9b0); a panic while verifying is an invalid commit of that
// source, never a crash of the process every workspace shares (R21).
func verifyCommit(ctx context.Context, dir identity.Directory, msg *comatproto.SyncSubscribeRepos_Commit, wanted func(string) bool) (up *commitUpdate, err error) {
	defer func() {
		if p := recover(); p != nil {
			up, err = nil, fmt.Errorf("invalid commit: its blocks do not hold what its ops name (%v)", p)
		}
	}()
	r, err := repo.VerifyCommitMessage(ctx, msg)
	if err != nil {
		return nil, fmt.Errorf("invalid commit: %w", err)
	}
	commit, _, err := repo.LoadCommitFromCAR(ctx, bytes.NewReader(msg.Blocks))
	if err != nil {
		return nil, fmt.Errorf("invalid commit: %w", err)
	}
	if err := commit.VerifyStructure(); err != nil {
		return nil, fmt.Errorf("invalid commit: %w", err)
	}
	if commit.DID != msg.Repo {
		return nil, fmt.Errorf("invalid commit: signed for %s, sent for %s", commit.DID, msg.Repo)
	}
	ident, err := dir.LookupDID(ctx, syntax.DID(msg.Repo))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", errIdentity, msg.Repo, err)
	}
	key, err := ident.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("invalid commit: the identity of %s has no usable key: %w", msg.Repo, err)
	}
	if err := commit.VerifySignature(key); err != nil {
		return nil, fmt.Errorf("invalid commit signature: %w", err)
	}
	u := &commitUpdate{did: msg.Repo, rev: msg.Rev, data: commit.Data.String()}
	if msg.PrevData != nil {
		u.prevData = msg.PrevData.String()
	}
	u.time, _ = time.Parse(time.RFC3339Nano, msg.Time)
	for _, op := range msg.Ops {
		col, rkey, err := syntax.ParseRepoPath(op.Path)
		if err != nil {
			return nil, fmt.Errorf("invalid commit: op path %q: %w", op.Path, err)
		}
		if !wanted(col.String()) {
			continue
		}
		o := opUpdate{action: op.Action, collection: col.String(), rkey: rkey.String()}
		if op.Cid != nil {
			o.cid = op.Cid.String()
		}
		if op.Action != "delete" {
			raw, _, err := r.GetRecordBytes(ctx, col, rkey)
			if err != nil {
				return nil, fmt.Errorf("invalid commit: record %s: %w", op.Path, err)
			}
			v, err := atdata.UnmarshalCBOR(raw)
			if err != nil {
				return nil, fmt.Errorf("invalid commit: record %s: %w", op.Path, err)
			}
			if o.value, err = json.Marshal(v); err != nil {
				return nil, fmt.Errorf("record %s: %w", op.Path, err)
			}
		}
		u.ops = append(u.ops, o)
	}
	return u, nil
}
