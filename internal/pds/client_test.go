package pds_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/pds/pdstest"
)

const coll = "dev.knotless.test.thing"

// countingStore is a MemoryStore that counts saves and can be made to fail.
type countingStore struct {
	pds.MemoryStore
	mu    sync.Mutex
	saves int
	fail  bool
}

func (s *countingStore) Save(ctx context.Context, sess *pds.Session) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return errors.New("store unavailable")
	}
	s.saves++
	return s.MemoryStore.Save(ctx, sess)
}

func (s *countingStore) setFail(v bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = v
}

func (s *countingStore) stored(t *testing.T) pds.Session {
	t.Helper()
	sess, err := s.Load(context.Background())
	if err != nil || sess == nil {
		t.Fatalf("no stored session (err %v)", err)
	}
	return *sess
}

func connect(t *testing.T, f *pdstest.PDS, store pds.SessionStore) *pds.Client {
	t.Helper()
	c, err := pds.Connect(context.Background(), f.URL(), pdstest.Handle, pdstest.Password, pds.Options{Policy: local, Store: store})
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	return c
}

// checkNoSecrets fails if an error text contains the password or a token.
func checkNoSecrets(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if s := err.Error(); strings.Contains(s, pdstest.Password) || strings.Contains(s, "jwt-") {
		t.Fatalf("error leaks a secret: %s", s)
	}
}

func TestConnectResumesStoredSessionWithoutLogin(t *testing.T) {
	f := pdstest.New(t)
	store := &countingStore{}
	c := connect(t, f, store)
	if did, handle := c.Info(); did != pdstest.DID || handle != pdstest.Handle {
		t.Fatalf("Info() = %s, %s", did, handle)
	}
	first := store.stored(t)

	// A restart: new Client, same store. Also by DID.
	connect(t, f, store)
	if _, err := pds.Connect(context.Background(), f.URL(), pdstest.DID, pdstest.Password, pds.Options{Policy: local, Store: store}); err != nil {
		t.Fatal(err)
	}
	if n := f.Calls("com.atproto.server.createSession"); n != 1 {
		t.Fatalf("createSession called %d times, want 1", n)
	}
	if n := f.Calls("com.atproto.server.getSession"); n != 2 {
		t.Fatalf("getSession called %d times, want 2", n)
	}
	if got := store.stored(t); got != first {
		t.Fatalf("stored session changed on resume")
	}
}

func TestConnectLogsInForAnotherHostOrAccount(t *testing.T) {
	f := pdstest.New(t)
	store := &countingStore{}
	connect(t, f, store)
	s := store.stored(t)
	s.Host = "https://other.example"
	_ = store.Save(context.Background(), &s)
	connect(t, f, store)
	if n := f.Calls("com.atproto.server.createSession"); n != 2 {
		t.Fatalf("createSession called %d times, want 2 (stored session was for another host)", n)
	}
	if got := store.stored(t); got.Host != f.URL() {
		t.Fatalf("stored host %q", got.Host)
	}
}

func TestConnectRefreshesExpiredStoredSessionAndSavesIt(t *testing.T) {
	f := pdstest.New(t)
	store := &countingStore{}
	connect(t, f, store)
	old := store.stored(t)
	f.ExpireAccess()

	connect(t, f, store)
	if n := f.Calls("com.atproto.server.createSession"); n != 1 {
		t.Fatalf("createSession called %d times, want 1", n)
	}
	if n := f.Calls("com.atproto.server.refreshSession"); n != 1 {
		t.Fatalf("refreshSession called %d times, want 1", n)
	}
	got := store.stored(t)
	if got.AccessJWT == old.AccessJWT || got.RefreshJWT == old.RefreshJWT || !f.AccessValid(got.AccessJWT) {
		t.Fatalf("refreshed tokens were not saved")
	}
}

func TestConnectLogsInWhenRefreshTokenIsRevoked(t *testing.T) {
	f := pdstest.New(t)
	store := &countingStore{}
	connect(t, f, store)
	f.RevokeAll()
	connect(t, f, store)
	if n := f.Calls("com.atproto.server.createSession"); n != 2 {
		t.Fatalf("createSession called %d times, want 2", n)
	}
	if !f.AccessValid(store.stored(t).AccessJWT) {
		t.Fatal("new session not saved")
	}
}

func TestConnectDoesNotLogInWhenRateLimited(t *testing.T) {
	f := pdstest.New(t)
	store := &countingStore{}
	connect(t, f, store)
	reset := time.Now().Add(90 * time.Second).Truncate(time.Second)
	f.SetRateLimit(http.Header{"Ratelimit-Reset": {strconv.FormatInt(reset.Unix(), 10)}, "Retry-After": {"1"}})

	_, err := pds.Connect(context.Background(), f.URL(), pdstest.Handle, pdstest.Password, pds.Options{Policy: local, Store: store})
	var rl *pds.RateLimitedError
	if !errors.As(err, &rl) {
		t.Fatalf("want RateLimitedError, got %v", err)
	}
	if !rl.Reset.Equal(reset) {
		t.Fatalf("Reset = %v, want %v (from RateLimit-Reset)", rl.Reset, reset)
	}
	if n := f.Calls("com.atproto.server.createSession"); n != 1 {
		t.Fatalf("createSession called %d times, want 1", n)
	}
}

func TestRateLimitedWriteUsesRetryAfter(t *testing.T) {
	f := pdstest.New(t)
	c := connect(t, f, &countingStore{})
	f.SetRateLimit(http.Header{"Retry-After": {"30"}})
	before := time.Now()
	_, err := c.PutRecord(context.Background(), coll, "a", json.RawMessage(`{"n":1}`), nil)
	var rl *pds.RateLimitedError
	if !errors.As(err, &rl) {
		t.Fatalf("want RateLimitedError, got %v", err)
	}
	if rl.Reset.Before(before.Add(30*time.Second)) || rl.Reset.After(time.Now().Add(30*time.Second)) {
		t.Fatalf("Reset = %v, want now+30s", rl.Reset)
	}
}

func TestWriteWithExpiredTokenRefreshesOnceRetriesOnceAndPersists(t *testing.T) {
	f := pdstest.New(t)
	store := &countingStore{}
	c := connect(t, f, store)
	old := store.stored(t)
	f.ExpireAccess()

	res, err := c.PutRecord(context.Background(), coll, "a", json.RawMessage(`{"n":1}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Changed() || res.CID == "" {
		t.Fatalf("result %+v", res)
	}
	if n := f.Calls("com.atproto.server.refreshSession"); n != 1 {
		t.Fatalf("refreshSession called %d times, want 1", n)
	}
	if n := f.Calls("com.atproto.repo.putRecord"); n != 2 {
		t.Fatalf("putRecord called %d times, want 2 (expired + retry)", n)
	}
	got := store.stored(t)
	if got.RefreshJWT == old.RefreshJWT || !f.AccessValid(got.AccessJWT) {
		t.Fatal("refreshed session was not persisted")
	}
}

func TestConcurrentWritesWithExpiredTokenRefreshOnce(t *testing.T) {
	f := pdstest.New(t)
	c := connect(t, f, &countingStore{})
	f.ExpireAccess()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			_, err := c.PutRecord(context.Background(), coll, fmt.Sprintf("k%d", i), json.RawMessage(`{"n":1}`), nil)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := f.Calls("com.atproto.server.refreshSession"); n != 1 {
		t.Fatalf("refreshSession called %d times, want 1", n)
	}
}

func TestRefreshThatCannotBeSavedBlocksWritesUntilSaved(t *testing.T) {
	f := pdstest.New(t)
	store := &countingStore{}
	c := connect(t, f, store)
	f.ExpireAccess()
	store.setFail(true)
	_, err := c.PutRecord(context.Background(), coll, "a", json.RawMessage(`{"n":1}`), nil)
	if err == nil || !strings.Contains(err.Error(), "saving session") {
		t.Fatalf("want a save error, got %v", err)
	}
	_, err = c.PutRecord(context.Background(), coll, "a", json.RawMessage(`{"n":1}`), nil)
	if err == nil {
		t.Fatal("write went through while the session was not persisted")
	}
	store.setFail(false)
	if _, err := c.PutRecord(context.Background(), coll, "a", json.RawMessage(`{"n":1}`), nil); err != nil {
		t.Fatal(err)
	}
	if !f.AccessValid(store.stored(t).AccessJWT) {
		t.Fatal("current session not persisted")
	}
	if n := f.Calls("com.atproto.server.refreshSession"); n != 1 {
		t.Fatalf("refreshSession called %d times, want 1", n)
	}
}

func TestRecordLifecycle(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	c := connect(t, f, &countingStore{})

	if _, err := c.GetRecord(ctx, coll, "a"); !errors.Is(err, pds.ErrRecordNotFound) {
		t.Fatalf("want ErrRecordNotFound, got %v", err)
	}
	v1 := json.RawMessage(`{"name":"one","n":9007199254740991}`)
	put, err := c.PutRecord(ctx, coll, "a", v1, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Unconditional put must not send swapRecord (null would mean create-only).
	if _, sent := f.PutBodies()[0]["swapRecord"]; sent {
		t.Fatalf("unconditional put sent swapRecord: %s", f.PutBodies()[0]["swapRecord"])
	}
	got, err := c.GetRecord(ctx, coll, "a")
	if err != nil {
		t.Fatal(err)
	}
	if got.CID != put.CID || got.URI != "at://"+pdstest.DID+"/"+coll+"/a" {
		t.Fatalf("read back %+v, put %+v", got, put)
	}
	var value map[string]any
	d := json.NewDecoder(strings.NewReader(string(got.Value)))
	d.UseNumber()
	if err := d.Decode(&value); err != nil || value["$type"] != coll || value["n"] != json.Number("9007199254740991") {
		t.Fatalf("stored value %s", got.Value)
	}

	// Same value again: 200 without commit.
	same, err := c.PutRecord(ctx, coll, "a", v1, nil)
	if err != nil || same.Changed() || same.CID != put.CID {
		t.Fatalf("no-op put = %+v, %v", same, err)
	}

	v2 := json.RawMessage(`{"name":"two"}`)
	upd, err := c.PutRecord(ctx, coll, "a", v2, &put.CID)
	if err != nil || !upd.Changed() {
		t.Fatalf("swap put = %+v, %v", upd, err)
	}
	_, err = c.PutRecord(ctx, coll, "a", json.RawMessage(`{"name":"three"}`), &put.CID) // stale
	if !errors.Is(err, pds.ErrInvalidSwap) {
		t.Fatalf("want ErrInvalidSwap, got %v", err)
	}
	var ire *pds.InvalidRequestError
	if errors.As(err, &ire) {
		t.Fatal("InvalidSwap must not also be an InvalidRequestError")
	}

	if err := c.DeleteRecord(ctx, coll, "a", &put.CID); !errors.Is(err, pds.ErrInvalidSwap) {
		t.Fatalf("delete with stale swap: want ErrInvalidSwap, got %v", err)
	}
	if err := c.DeleteRecord(ctx, coll, "a", &upd.CID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteRecord(ctx, coll, "a", nil); err != nil {
		t.Fatalf("deleting a missing record: %v", err)
	}
	if _, err := c.GetRecord(ctx, coll, "a"); !errors.Is(err, pds.ErrRecordNotFound) {
		t.Fatalf("want ErrRecordNotFound after delete, got %v", err)
	}

	rev, err := c.LatestRev(ctx)
	if err != nil || rev == "" {
		t.Fatalf("LatestRev = %q, %v", rev, err)
	}
}

func TestApplyWrites(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	c := connect(t, f, &countingStore{})

	res, err := c.ApplyWrites(ctx, []pds.Write{
		{Op: pds.OpCreate, Collection: coll, Rkey: "a", Value: json.RawMessage(`{"n":1}`)},
		{Op: pds.OpCreate, Collection: coll, Rkey: "b", Value: json.RawMessage(`{"n":2}`)},
		{Op: pds.OpCreate, Collection: coll, Rkey: "c", Value: json.RawMessage(`{"n":3}`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Rev == "" || len(res.Results) != 3 || res.Results[1].CID == "" {
		t.Fatalf("result %+v", res)
	}
	got, err := c.GetRecord(ctx, coll, "b")
	if err != nil || got.CID != res.Results[1].CID {
		t.Fatalf("read back b: %+v, %v", got, err)
	}

	res, err = c.ApplyWrites(ctx, []pds.Write{
		{Op: pds.OpUpdate, Collection: coll, Rkey: "a", Value: json.RawMessage(`{"n":10}`)},
		{Op: pds.OpDelete, Collection: coll, Rkey: "c"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if a, err := c.GetRecord(ctx, coll, "a"); err != nil || a.CID != res.Results[0].CID {
		t.Fatalf("read back a: %+v, %v", a, err)
	}
	if _, err := c.GetRecord(ctx, coll, "c"); !errors.Is(err, pds.ErrRecordNotFound) {
		t.Fatalf("c not deleted: %v", err)
	}

	// Create on an existing key fails the whole batch with a 500.
	_, err = c.ApplyWrites(ctx, []pds.Write{
		{Op: pds.OpCreate, Collection: coll, Rkey: "d", Value: json.RawMessage(`{"n":4}`)},
		{Op: pds.OpCreate, Collection: coll, Rkey: "a", Value: json.RawMessage(`{"n":5}`)},
	})
	var se *pds.StatusError
	if !errors.As(err, &se) || se.StatusCode != 500 {
		t.Fatalf("want StatusError 500, got %v", err)
	}
	if _, err := c.GetRecord(ctx, coll, "d"); !errors.Is(err, pds.ErrRecordNotFound) {
		t.Fatalf("batch was partially applied: %v", err)
	}

	// Invalid input is refused before anything is sent.
	_, err = c.ApplyWrites(ctx, []pds.Write{{Op: pds.OpCreate, Collection: coll, Rkey: "x", Value: json.RawMessage(`{"f":1.5}`)}})
	var spec *pds.SpecError
	if !errors.As(err, &spec) || spec.Field != "writes[0].value.f" {
		t.Fatalf("want SpecError for writes[0].value.f, got %v", err)
	}
	if _, err := c.ApplyWrites(ctx, make([]pds.Write, pds.MaxWritesPerBatch+1)); !errors.As(err, &spec) {
		t.Fatalf("want SpecError for a too large batch, got %v", err)
	}
}

func TestWrongPasswordIsAuthenticationErrorWithoutSecrets(t *testing.T) {
	f := pdstest.New(t)
	_, err := pds.Connect(context.Background(), f.URL(), pdstest.Handle, "wrong-"+pdstest.Password, pds.Options{Policy: local, Store: &countingStore{}})
	if !errors.Is(err, pds.ErrAuthentication) {
		t.Fatalf("want ErrAuthentication, got %v", err)
	}
	if strings.Contains(err.Error(), "wrong-") {
		t.Fatalf("error leaks the password: %v", err)
	}
	_, err = pds.Connect(context.Background(), f.URL(), "nobody.test", pdstest.Password, pds.Options{Policy: local, Store: &countingStore{}})
	if !errors.Is(err, pds.ErrAuthentication) {
		t.Fatalf("unknown account: want ErrAuthentication, got %v", err)
	}
	checkNoSecrets(t, err)
}

func TestErrorsNeverContainSecrets(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	store := &countingStore{}
	c := connect(t, f, store)

	// The PDS echoes the Authorization header in an InvalidToken message.
	f.SetEchoAuth(true)
	f.InvalidateAccess() // access token no longer valid, not expired
	_, err := c.PutRecord(ctx, coll, "a", json.RawMessage(`{"n":1}`), nil)
	if !errors.Is(err, pds.ErrAuthentication) {
		t.Fatalf("want ErrAuthentication, got %v", err)
	}
	checkNoSecrets(t, err)

	// Stored session with dead tokens and a wrong password.
	f.RevokeAll()
	_, err = pds.Connect(ctx, f.URL(), pdstest.Handle, "x-"+pdstest.Password, pds.Options{Policy: local, Store: store})
	if !errors.Is(err, pds.ErrAuthentication) {
		t.Fatalf("want ErrAuthentication, got %v", err)
	}
	checkNoSecrets(t, err)

	s := store.stored(t)
	for _, text := range []string{fmt.Sprint(s), fmt.Sprintf("%+v", &s), fmt.Sprintf("%#v", s)} {
		if strings.Contains(text, "jwt-") {
			t.Fatalf("Session formatting leaks tokens: %s", text)
		}
	}
}

func TestUnreachable(t *testing.T) {
	ctx := context.Background()

	t.Run("closed port", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		_, err = pds.Connect(ctx, "http://"+addr, pdstest.Handle, pdstest.Password, pds.Options{Policy: local, Store: &countingStore{}})
		if !errors.Is(err, pds.ErrUnreachable) {
			t.Fatalf("want ErrUnreachable, got %v", err)
		}
		checkNoSecrets(t, err)
	})

	t.Run("no answer within the client timeout", func(t *testing.T) {
		block := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }))
		t.Cleanup(srv.Close)
		t.Cleanup(func() { close(block) })
		hc := &http.Client{Timeout: 100 * time.Millisecond}
		_, err := pds.Connect(ctx, srv.URL, pdstest.Handle, pdstest.Password, pds.Options{Policy: local, Store: &countingStore{}, HTTPClient: hc})
		if !errors.Is(err, pds.ErrUnreachable) {
			t.Fatalf("want ErrUnreachable, got %v", err)
		}
	})

	t.Run("untrusted TLS certificate", func(t *testing.T) {
		srv := httptest.NewTLSServer(http.NotFoundHandler())
		t.Cleanup(srv.Close)
		_, err := pds.Connect(ctx, srv.URL, pdstest.Handle, pdstest.Password, pds.Options{Policy: local, Store: &countingStore{}})
		if !errors.Is(err, pds.ErrUnreachable) {
			t.Fatalf("want ErrUnreachable, got %v", err)
		}
	})

	t.Run("caller's context ended is not unreachable", func(t *testing.T) {
		f := pdstest.New(t)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := pds.Connect(cctx, f.URL(), pdstest.Handle, pdstest.Password, pds.Options{Policy: local, Store: &countingStore{}})
		if !errors.Is(err, context.Canceled) || errors.Is(err, pds.ErrUnreachable) {
			t.Fatalf("want context.Canceled, got %v", err)
		}
	})
}

func TestConnectRejectsBadArguments(t *testing.T) {
	ctx := context.Background()
	var spec *pds.SpecError
	for _, tc := range []struct {
		host, id, pw string
		store        pds.SessionStore
		field        string
	}{
		{"pds.example", pdstest.Handle, pdstest.Password, &pds.MemoryStore{}, "host"},
		{"ftp://pds.example", pdstest.Handle, pdstest.Password, &pds.MemoryStore{}, "host"},
		{"https://pds.example/xrpc", pdstest.Handle, pdstest.Password, &pds.MemoryStore{}, "host"},
		{"https://pds.example", "", pdstest.Password, &pds.MemoryStore{}, "identifier"},
		{"https://pds.example", pdstest.Handle, "", &pds.MemoryStore{}, "password"},
		{"https://pds.example", pdstest.Handle, pdstest.Password, nil, "Options.Store"},
	} {
		_, err := pds.Connect(ctx, tc.host, tc.id, tc.pw, pds.Options{Store: tc.store})
		if !errors.As(err, &spec) || spec.Field != tc.field {
			t.Errorf("Connect(%q, %q): want SpecError on %s, got %v", tc.host, tc.id, tc.field, err)
		}
		checkNoSecrets(t, err)
	}
}

// TestListRecords: every record of the collection, across pages, up to
// the limit; other collections are not listed.
func TestListRecords(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	c := connect(t, f, &countingStore{})
	for i := range 120 {
		if _, err := c.PutRecord(ctx, coll, fmt.Sprintf("r%03d", i), json.RawMessage(`{"n":1}`), nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.PutRecord(ctx, "dev.knotless.test.other", "x", json.RawMessage(`{}`), nil); err != nil {
		t.Fatal(err)
	}
	all, err := c.ListRecords(ctx, coll, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 120 || all[0].URI != "at://"+pdstest.DID+"/"+coll+"/r000" || all[119].CID == "" {
		t.Fatalf("listed %d records (first %+v)", len(all), all[0])
	}
	some, err := c.ListRecords(ctx, coll, 30)
	if err != nil || len(some) != 30 {
		t.Fatalf("limit 30: %d records, %v", len(some), err)
	}
	if _, err := c.ListRecords(ctx, "not an nsid", 10); err == nil {
		t.Fatal("an invalid collection was listed")
	}
}

// TestAttackHugeRetryAfterWaitsTheMost: a PDS answers 429 with a
// Retry-After or a RateLimit-Reset (relative or absolute) of any size. The write waits
// the longest wait, not what the multiplication wrapped to (Retry-After
// 9223372037 seconds wrapped to a reset in the past: no wait at all).
func TestAttackHugeRetryAfterWaitsTheMost(t *testing.T) {
	f := pdstest.New(t)
	c := connect(t, f, &countingStore{})
	for _, h := range []http.Header{{"Retry-After": {"9223372037"}}, {"Retry-After": {"99999999999999"}}, {"Ratelimit-Reset": {"999999999"}}, {"Ratelimit-Reset": {"9223372036854775807"}}} {
		f.SetRateLimit(h)
		_, err := c.PutRecord(context.Background(), coll, "a", json.RawMessage(`{"n":1}`), nil)
		if wait, ok := pds.RateLimitWait(err, time.Now()); !ok || wait < pds.MaxRateLimitWait-time.Second {
			t.Errorf("%v: wait %v, %v; want about %v", h, wait, ok, pds.MaxRateLimitWait)
		}
	}
}
