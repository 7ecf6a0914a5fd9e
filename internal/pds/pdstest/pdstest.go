// Package pdstest is an in-memory PDS for tests: an httptest server that
// answers the XRPC calls knotless makes (sessions, getRecord, putRecord,
// deleteRecord, applyWrites, getLatestCommit) with the reference PDS's
// semantics for sessions, swaps and applyWrites. It has one account (DID,
// Handle, Password). Tokens it issues contain "jwt-" so tests can look for
// leaks. It does not import internal/pds, so the pds package's own tests
// can use it.
package pdstest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// The fake PDS's one account.
const (
	DID      = "did:plc:alice000000000000000000"
	Handle   = "alice.test"
	Password = "hunter2-app-password"
)

// PDS is a fake PDS. Its methods are safe for concurrent use.
type PDS struct {
	srv *httptest.Server

	mu        sync.Mutex
	seq       int
	access    map[string]bool // valid access tokens
	expired   map[string]bool // access tokens that answer ExpiredToken
	refresh   map[string]bool // valid refresh tokens
	calls     map[string]int  // per NSID
	records   map[string]record
	rev       int
	rateLimit http.Header // if set, the next request gets 429 with these headers
	echoAuth  bool        // InvalidToken messages echo the Authorization header
	putBodies []map[string]json.RawMessage
	// applyBatches is the number of writes of each applyWrites call.
	applyBatches []int
	// beforeApply, if set, runs (under the lock) before the next
	// applyWrites is decided: a writer racing with the client.
	beforeApply func()
	// hold, if set, makes the next getLatestCommit wait until it is closed.
	hold <-chan struct{}
}

type record struct {
	value json.RawMessage
	cid   string
}

// New starts a fake PDS with no records; it stops when the test ends.
func New(t testing.TB) *PDS {
	t.Helper()
	f := &PDS{
		access: map[string]bool{}, expired: map[string]bool{}, refresh: map[string]bool{},
		calls: map[string]int{}, records: map[string]record{},
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

// URL is the PDS's base URL (http://127.0.0.1:port).
func (f *PDS) URL() string { return f.srv.URL }

// Calls returns how many requests for the XRPC method nsid arrived.
func (f *PDS) Calls(nsid string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[nsid]
}

// ExpireAccess makes every issued access token answer ExpiredToken.
func (f *PDS) ExpireAccess() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for tok := range f.access {
		f.expired[tok] = true
	}
	f.access = map[string]bool{}
}

// RevokeAll invalidates every token (access answers ExpiredToken, refresh
// is revoked).
func (f *PDS) RevokeAll() {
	f.ExpireAccess()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refresh = map[string]bool{}
}

// InvalidateAccess makes every issued access token answer InvalidToken
// (not verifiable, as opposed to expired).
func (f *PDS) InvalidateAccess() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.access = map[string]bool{}
}

// SetEchoAuth makes InvalidToken messages echo the request's
// Authorization header, as a careless PDS might.
func (f *PDS) SetEchoAuth(v bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.echoAuth = v
}

// SetRateLimit makes the next request fail with 429 RateLimitExceeded and
// the headers h.
func (f *PDS) SetRateLimit(h http.Header) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rateLimit = h
}

// AccessValid reports whether tok is a currently valid access token.
func (f *PDS) AccessValid(tok string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.access[tok]
}

// PutBodies returns the request bodies of every putRecord call so far.
func (f *PDS) PutBodies() []map[string]json.RawMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.putBodies)
}

// ApplyBatches returns the number of writes of each applyWrites call so
// far.
func (f *PDS) ApplyBatches() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.applyBatches)
}

// HoldNextLatestCommit makes the next getLatestCommit wait until hold is
// closed (other requests are served meanwhile).
func (f *PDS) HoldNextLatestCommit(hold <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hold = hold
}

// RaceNextApply makes another writer put value at collection/rkey (a new
// commit) just before the next applyWrites is decided, as if it raced with
// the client between its read and its write.
func (f *PDS) RaceNextApply(collection, rkey string, value json.RawMessage) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.beforeApply = func() {
		f.records[collection+"/"+rkey] = record{value: value, cid: CIDOf(value)}
		f.rev++
	}
}

// Record returns the stored value and CID of collection/rkey, and whether
// it exists.
func (f *PDS) Record(collection, rkey string) (value json.RawMessage, cid string, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.records[collection+"/"+rkey]
	return r.value, r.cid, ok
}

// SetRecord stores value (which should carry its "$type") at
// collection/rkey in a new commit, as another client of the account would;
// a nil value deletes the record.
func (f *PDS) SetRecord(collection, rkey string, value json.RawMessage) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if value == nil {
		delete(f.records, collection+"/"+rkey)
	} else {
		f.records[collection+"/"+rkey] = record{value: value, cid: CIDOf(value)}
	}
	f.rev++
}

// Keys returns the collection/rkey of every stored record, sorted.
func (f *PDS) Keys() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.records))
}

// issue creates a session's tokens (under the lock).
func (f *PDS) issue() map[string]any {
	f.seq++
	a, r := fmt.Sprintf("jwt-access-%d", f.seq), fmt.Sprintf("jwt-refresh-%d", f.seq)
	f.access[a], f.refresh[r] = true, true
	return map[string]any{"accessJwt": a, "refreshJwt": r, "did": DID, "handle": Handle, "active": true}
}

// CIDOf is the CID the fake PDS gives a record value (not a real CID:
// a stable digest with a CID-like prefix).
func CIDOf(v []byte) string {
	h := sha256.Sum256(v)
	return "bafyrei" + strings.ToLower(hex.EncodeToString(h[:]))[:40]
}

// serve answers one XRPC request, holding the lock throughout (but for a
// held getLatestCommit).
func (f *PDS) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	nsid := strings.TrimPrefix(r.URL.Path, "/xrpc/")
	f.calls[nsid]++

	reply := func(code int, v any) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	fail := func(code int, name, msg string) { reply(code, map[string]string{"error": name, "message": msg}) }

	if f.rateLimit != nil {
		for k, v := range f.rateLimit {
			w.Header()[k] = v
		}
		f.rateLimit = nil
		fail(http.StatusTooManyRequests, "RateLimitExceeded", "Rate Limit Exceeded")
		return
	}
	bearer := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	authed := func() bool {
		switch {
		case f.expired[bearer]:
			fail(400, "ExpiredToken", "Token has expired")
		case !f.access[bearer]:
			msg := "Token could not be verified"
			if f.echoAuth {
				msg += ": " + r.Header.Get("Authorization")
			}
			fail(400, "InvalidToken", msg)
		default:
			return true
		}
		return false
	}
	var body map[string]json.RawMessage
	if r.Method == http.MethodPost && r.ContentLength != 0 {
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			fail(400, "InvalidRequest", "bad json")
			return
		}
	}
	str := func(k string) string {
		var s string
		_ = json.Unmarshal(body[k], &s)
		return s
	}
	commit := func() map[string]string {
		f.rev++
		return map[string]string{"cid": "bafycommit" + strconv.Itoa(f.rev), "rev": fmt.Sprintf("3rev%09d", f.rev)}
	}

	switch nsid {
	case "com.atproto.server.createSession":
		id := str("identifier")
		if (id != Handle && id != DID) || str("password") != Password {
			fail(401, "AuthenticationRequired", "Invalid identifier or password")
			return
		}
		reply(200, f.issue())
	case "com.atproto.server.refreshSession":
		if !f.refresh[bearer] {
			fail(400, "ExpiredToken", "Token has been revoked")
			return
		}
		delete(f.refresh, bearer)
		reply(200, f.issue())
	case "com.atproto.server.getSession":
		if authed() {
			reply(200, map[string]any{"did": DID, "handle": Handle, "active": true})
		}
	case "com.atproto.sync.getLatestCommit":
		if f.hold != nil {
			hold := f.hold
			f.hold = nil
			f.mu.Unlock()
			<-hold
			f.mu.Lock()
		}
		reply(200, map[string]string{"cid": "bafycommit" + strconv.Itoa(f.rev), "rev": fmt.Sprintf("3rev%09d", f.rev)})
	case "com.atproto.repo.getRecord":
		q := r.URL.Query()
		key := q.Get("collection") + "/" + q.Get("rkey")
		rec, ok := f.records[key]
		if q.Get("repo") != DID || !ok {
			fail(400, "RecordNotFound", "Could not locate record: at://"+q.Get("repo")+"/"+key)
			return
		}
		reply(200, map[string]any{"uri": "at://" + DID + "/" + key, "cid": rec.cid, "value": rec.value})
	case "com.atproto.repo.listRecords":
		// Pages in rkey order; the cursor is the last rkey returned.
		q := r.URL.Query()
		prefix := q.Get("collection") + "/"
		limit, err := strconv.Atoi(q.Get("limit"))
		if err != nil || limit <= 0 {
			limit = 50
		}
		var keys []string
		for k := range f.records {
			if strings.HasPrefix(k, prefix) && (q.Get("cursor") == "" || strings.TrimPrefix(k, prefix) > q.Get("cursor")) {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		out := map[string]any{"records": []any{}}
		if len(keys) > limit {
			keys = keys[:limit]
			out["cursor"] = strings.TrimPrefix(keys[limit-1], prefix)
		}
		recs := make([]any, 0, len(keys))
		for _, k := range keys {
			recs = append(recs, map[string]any{"uri": "at://" + DID + "/" + k, "cid": f.records[k].cid, "value": f.records[k].value})
		}
		out["records"] = recs
		reply(200, out)
	case "com.atproto.repo.putRecord":
		if !authed() {
			return
		}
		f.putBodies = append(f.putBodies, body)
		key := str("collection") + "/" + str("rkey")
		var rec map[string]any
		if json.Unmarshal(body["record"], &rec) != nil || rec["$type"] != str("collection") {
			fail(400, "InvalidRecord", "Record/$type must match the collection")
			return
		}
		cur, exists := f.records[key]
		if swap, ok := body["swapRecord"]; ok {
			if string(swap) == "null" && exists || string(swap) != "null" && (!exists || str("swapRecord") != cur.cid) {
				fail(400, "InvalidSwap", "Record was at "+cur.cid)
				return
			}
		}
		cid := CIDOf(body["record"])
		out := map[string]any{"uri": "at://" + DID + "/" + key, "cid": cid}
		if !exists || cur.cid != cid {
			f.records[key] = record{value: body["record"], cid: cid}
			out["commit"] = commit()
		}
		reply(200, out)
	case "com.atproto.repo.deleteRecord":
		if !authed() {
			return
		}
		key := str("collection") + "/" + str("rkey")
		cur, exists := f.records[key]
		if _, ok := body["swapRecord"]; ok && (!exists || str("swapRecord") != cur.cid) {
			fail(400, "InvalidSwap", "Record was at "+cur.cid)
			return
		}
		if !exists {
			reply(200, map[string]any{})
			return
		}
		delete(f.records, key)
		reply(200, map[string]any{"commit": commit()})
	case "com.atproto.repo.applyWrites":
		if !authed() {
			return
		}
		var writes []map[string]json.RawMessage
		_ = json.Unmarshal(body["writes"], &writes)
		f.applyBatches = append(f.applyBatches, len(writes))
		if f.beforeApply != nil {
			f.beforeApply()
			f.beforeApply = nil
		}
		if _, ok := body["swapCommit"]; ok && str("swapCommit") != "bafycommit"+strconv.Itoa(f.rev) {
			fail(400, "InvalidSwap", "Commit was at bafycommit"+strconv.Itoa(f.rev))
			return
		}

		next := map[string]record{}
		for k, v := range f.records {
			next[k] = v
		}
		var results []map[string]any
		for _, wr := range writes {
			var typ, coll, rkey string
			_ = json.Unmarshal(wr["$type"], &typ)
			_ = json.Unmarshal(wr["collection"], &coll)
			_ = json.Unmarshal(wr["rkey"], &rkey)
			key := coll + "/" + rkey
			_, exists := next[key]
			op := strings.TrimPrefix(typ, "com.atproto.repo.applyWrites#")
			if op == "create" && exists || op != "create" && !exists {
				fail(500, "InternalServerError", "Internal Server Error")
				return
			}
			if op == "delete" {
				delete(next, key)
				results = append(results, map[string]any{"$type": typ + "Result"})
				continue
			}
			if strings.Contains(string(wr["value"]), `"lexiconInvalid"`) {
				fail(400, "InvalidRecord", "Invalid record: lexiconInvalid is not allowed")
				return
			}
			cid := CIDOf(wr["value"])
			next[key] = record{value: wr["value"], cid: cid}
			results = append(results, map[string]any{"$type": typ + "Result", "uri": "at://" + DID + "/" + key, "cid": cid})
		}
		f.records = next
		reply(200, map[string]any{"commit": commit(), "results": results})
	default:
		fail(501, "MethodNotImplemented", "Method Not Implemented")
	}
}
