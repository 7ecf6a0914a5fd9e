/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package sshgateway

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sync/singleflight"

	"github.com/knotless-dev/knotless/internal/lexicon"
)

// Bounds of a DID's keys.
const (
	// MaxRecordProof bounds what is read of a getRecord answer (the
	// commit, the tree's path to the record, the record).
	MaxRecordProof = 256 << 10
	// DefaultTTL is how long a DID's keys (or that it has none) are
	// kept.
	DefaultTTL = time.Minute
	// maxCached bounds the DIDs kept; past it, expired entries go, then
	// any one.
	maxCached = 4096
	// failTTL is how long a lookup that failed (the PDS did not answer)
	// is kept: a client cannot make the agent ask a PDS at every attempt.
	failTTL = 15 * time.Second
)

// ErrNoKeys: the DID publishes no SSH keys (no record, or none valid).
var ErrNoKeys = errors.New("no SSH keys published")

// Keys reads the SSH keys a DID publishes in its own repo
// (dev.knotless.gateway.sshKeys, record key self) from its PDS as its
// DID document names it: the getRecord proof (the signed commit and the
// record's path in the repo's tree) is checked against the DID's key,
// so neither the PDS nor anyone between can add a key. What is found,
// or that nothing is, is kept TTL.
type Keys struct {
	// Directory resolves handles and DIDs (bidirectionally for handles).
	Directory identity.Directory
	// Client reaches the PDSes: the agent's address policy, no redirect.
	Client *http.Client
	// TTL is how long a lookup is kept (default DefaultTTL).
	TTL time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time

	mu    sync.Mutex
	byDID map[string]cached
	// revs is the newest commit revision seen of each DID: an older
	// (replayed) commit is refused.
	revs    map[string]string
	flights singleflight.Group
}

type cached struct {
	keys  []ssh.PublicKey
	err   error
	until time.Time
}

func (k *Keys) now() time.Time {
	if k.Now != nil {
		return k.Now()
	}
	return time.Now()
}

func (k *Keys) ttl() time.Duration {
	if k.TTL > 0 {
		return k.TTL
	}
	return DefaultTTL
}

// Lookup resolves user (a DID, or a handle whose DID document names it
// back) and returns its DID and its published keys. A user with no keys
// is ErrNoKeys; one that does not resolve is an error that says so.
// Concurrent lookups of one DID share one read; what a read found is
// kept TTL, a failure failTTL.
func (k *Keys) Lookup(ctx context.Context, user string) (string, []ssh.PublicKey, error) {
	id, err := k.resolve(ctx, user)
	if err != nil {
		return "", nil, err
	}
	did := id.DID.String()
	k.mu.Lock()
	c, ok := k.byDID[did]
	k.mu.Unlock()
	if ok && k.now().Before(c.until) {
		return did, c.keys, c.err
	}
	v, _, _ := k.flights.Do(did, func() (any, error) {
		keys, err := k.fetch(ctx, id)
		ttl := k.ttl()
		if err != nil && !errors.Is(err, ErrNoKeys) {
			ttl = failTTL
		}
		c := cached{keys: keys, err: err, until: k.now().Add(ttl)}
		k.keep(did, c)
		return c, nil
	})
	c = v.(cached)
	return did, c.keys, c.err
}

// keep caches c for did, making room if the cache is full.
func (k *Keys) keep(did string, c cached) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.byDID == nil {
		k.byDID = map[string]cached{}
	}
	if len(k.byDID) >= maxCached {
		now := k.now()
		for d, e := range k.byDID {
			if !now.Before(e.until) {
				delete(k.byDID, d)
			}
		}
		for d := range k.byDID {
			if len(k.byDID) < maxCached {
				break
			}
			delete(k.byDID, d)
		}
	}
	k.byDID[did] = c
}

// newer records rev as did's newest commit, unless an older one: false.
func (k *Keys) newer(did, rev string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.revs == nil {
		k.revs = map[string]string{}
	}
	if last, ok := k.revs[did]; ok && rev < last {
		return false
	}
	if _, ok := k.revs[did]; !ok && len(k.revs) >= maxCached {
		for d := range k.revs {
			delete(k.revs, d)
			break
		}
	}
	k.revs[did] = rev
	return true
}

// resolve is user's identity: a DID, or a handle (its DID document must
// name it back: the directory checks both ways).
func (k *Keys) resolve(ctx context.Context, user string) (*identity.Identity, error) {
	if strings.HasPrefix(user, "did:") {
		did, err := syntax.ParseDID(user)
		if err != nil {
			return nil, errors.New("not a DID")
		}
		id, err := k.Directory.LookupDID(ctx, did)
		if err != nil {
			return nil, fmt.Errorf("the DID does not resolve: %w", err)
		}
		return id, nil
	}
	h, err := syntax.ParseHandle(strings.ToLower(user))
	if err != nil {
		return nil, errors.New("not a DID or a handle")
	}
	id, err := k.Directory.LookupHandle(ctx, h)
	if err != nil {
		return nil, fmt.Errorf("the handle does not resolve: %w", err)
	}
	return id, nil
}

// fetch reads and checks the sshKeys record of id from its PDS.
func (k *Keys) fetch(ctx context.Context, id *identity.Identity) ([]ssh.PublicKey, error) {
	pds := id.PDSEndpoint()
	if pds == "" {
		return nil, errors.New("the DID document names no PDS")
	}
	q := url.Values{"did": {id.DID.String()}, "collection": {lexicon.SSHKeys}, "rkey": {"self"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(pds, "/")+"/xrpc/com.atproto.sync.getRecord?"+q.Encode(), nil)
	if err != nil {
		return nil, errors.New("the DID document's PDS is not a URL")
	}
	resp, err := k.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the DID's PDS did not answer: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxRecordProof+1))
	if err != nil {
		return nil, fmt.Errorf("the DID's PDS: %w", err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound || (resp.StatusCode == http.StatusBadRequest && bytes.Contains(body, []byte("RecordNotFound"))):
		return nil, ErrNoKeys
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("the DID's PDS answered %d", resp.StatusCode)
	case len(body) > MaxRecordProof:
		return nil, fmt.Errorf("the DID's PDS answered more than %d bytes", MaxRecordProof)
	}
	raw, rev, err := verifiedRecord(ctx, id, body)
	if err != nil {
		return nil, err
	}
	if !k.newer(id.DID.String(), rev) {
		return nil, errors.New("the PDS answered with an older commit than it did before")
	}
	return parseKeys(raw)
}

// verifiedRecord is the sshKeys record (JSON) of the getRecord proof
// car and its commit's revision, once the commit is id's, signed by its
// key, and the record is on its tree. A hostile proof that makes the
// verifier panic is an invalid proof; so is one whose sections claim
// more than it holds (checked before the CAR reader allocates them).
func verifiedRecord(ctx context.Context, id *identity.Identity, car []byte) (raw json.RawMessage, rev string, err error) {
	defer func() {
		if p := recover(); p != nil {
			raw, rev, err = nil, "", errors.New("the record's proof is invalid")
		}
	}()
	if err := sectionsFit(car); err != nil {
		return nil, "", err
	}
	commit, r, err := repo.LoadRepoFromCAR(ctx, bytes.NewReader(car))
	if err != nil {
		return nil, "", fmt.Errorf("the record's proof is invalid: %w", err)
	}
	if commit.DID != id.DID.String() {
		return nil, "", errors.New("the record's proof is a commit of another repo")
	}
	key, err := id.PublicKey()
	if err != nil {
		return nil, "", errors.New("the DID document has no usable key")
	}
	if err := commit.VerifySignature(key); err != nil {
		return nil, "", errors.New("the record's commit is not signed by the DID's key")
	}
	cbor, _, err := r.GetRecordBytes(ctx, syntax.NSID(lexicon.SSHKeys), syntax.RecordKey("self"))
	if err != nil {
		return nil, "", ErrNoKeys
	}
	v, err := atdata.UnmarshalCBOR(cbor)
	if err != nil {
		return nil, "", errors.New("the record is not valid")
	}
	raw, err = json.Marshal(v)
	return raw, commit.Rev, err
}

// sectionsFit: every section of car (its header, then its blocks, each
// a length and that many bytes) lies within car.
func sectionsFit(car []byte) error {
	for rest := car; len(rest) > 0; {
		n, w := binary.Uvarint(rest)
		if w <= 0 || n > uint64(len(rest)-w) {
			return errors.New("the record's proof is invalid: a section longer than the proof")
		}
		rest = rest[w+int(n):]
	}
	return nil
}

// parseKeys are the valid keys of an sshKeys record; none is ErrNoKeys.
func parseKeys(raw json.RawMessage) ([]ssh.PublicKey, error) {
	if err := lexicon.ValidateRecord(lexicon.SSHKeys, raw); err != nil {
		return nil, ErrNoKeys
	}
	var rec struct {
		Keys []string `json:"keys"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, ErrNoKeys
	}
	var keys []ssh.PublicKey
	for _, line := range rec.Keys {
		key, _, options, rest, err := ssh.ParseAuthorizedKey([]byte(line))
		if err != nil || len(options) > 0 || len(bytes.TrimSpace(rest)) > 0 {
			continue
		}
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		return nil, ErrNoKeys
	}
	return keys, nil
}
