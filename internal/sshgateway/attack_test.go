package sshgateway

// Adversarial review of the SSH gateway (issue 32). Each test is one
// attack: the holes fail on the code they were written against, the
// defences that held pass.

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/go-logr/logr"
	"github.com/ipfs/go-cid"
	"github.com/ipfs/go-datastore"
	blockstore "github.com/ipfs/go-ipfs-blockstore"
	"github.com/ipld/go-car"
	carutil "github.com/ipld/go-car/util"
	"github.com/multiformats/go-multihash"
	"golang.org/x/crypto/ssh"
	"k8s.io/client-go/rest"

	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
)

// --- helpers ---------------------------------------------------------

// signedRepo signs getRecord proofs of an sshKeys record the way a PDS
// does.
type signedRepo struct {
	t     *testing.T
	did   string
	key   *atcrypto.PrivateKeyK256
	clock *syntax.TIDClock
}

func newSignedRepo(t *testing.T, did string) *signedRepo {
	t.Helper()
	key, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	return &signedRepo{t: t, did: did, key: key, clock: syntax.NewTIDClock(0)}
}

// identityAt is the repo's DID document: its key, its PDS at url.
func (r *signedRepo) identityAt(url string) identity.Identity {
	pub, err := r.key.PublicKey()
	if err != nil {
		r.t.Fatal(err)
	}
	return identity.Identity{DID: syntax.DID(r.did),
		Keys:     map[string]identity.VerificationMethod{"atproto": {Type: "Multikey", PublicKeyMultibase: pub.Multibase()}},
		Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: url}}}
}

// proof is a getRecord CAR of a commit by commitDID (the repo's DID when
// empty), signed with key (the repo's when nil), whose tree holds the
// sshKeys record listing keys.
func (r *signedRepo) proof(keys []string, commitDID string, key *atcrypto.PrivateKeyK256) []byte {
	r.t.Helper()
	if commitDID == "" {
		commitDID = r.did
	}
	if key == nil {
		key = r.key
	}
	blocks := map[cid.Cid][]byte{}
	put := func(b []byte) cid.Cid {
		c, err := cid.NewPrefixV1(cid.DagCBOR, multihash.SHA2_256).Sum(b)
		if err != nil {
			r.t.Fatal(err)
		}
		blocks[c] = b
		return c
	}
	ks := make([]any, len(keys))
	for i, k := range keys {
		ks[i] = k
	}
	raw, err := atdata.MarshalCBOR(map[string]any{"$type": lexicon.SSHKeys, "keys": ks, "createdAt": "2026-12-05T12:00:00.000Z"})
	if err != nil {
		r.t.Fatal(err)
	}
	tree := mst.NewEmptyTree()
	if _, err := tree.Insert([]byte(lexicon.SSHKeys+"/self"), put(raw)); err != nil {
		r.t.Fatal(err)
	}
	ctx := context.Background()
	bs := blockstore.NewBlockstore(datastore.NewMapDatastore()) //nolint:staticcheck // SA1019: indigo's mst takes this Blockstore
	data, err := tree.WriteDiffBlocks(ctx, bs)
	if err != nil {
		r.t.Fatal(err)
	}
	all, err := bs.AllKeysChan(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	for c := range all {
		blk, err := bs.Get(ctx, c)
		if err != nil {
			r.t.Fatal(err)
		}
		put(blk.RawData())
	}
	cm := repo.Commit{DID: commitDID, Version: repo.ATPROTO_REPO_VERSION, Data: *data, Rev: r.clock.Next().String()}
	if err := cm.Sign(key); err != nil {
		r.t.Fatal(err)
	}
	var cb bytes.Buffer
	if err := cm.MarshalCBOR(&cb); err != nil {
		r.t.Fatal(err)
	}
	root := put(cb.Bytes())
	var out bytes.Buffer
	if err := car.WriteHeader(&car.CarHeader{Roots: []cid.Cid{root}, Version: 1}, &out); err != nil {
		r.t.Fatal(err)
	}
	for c, b := range blocks {
		if err := carutil.LdWrite(&out, c.Bytes(), b); err != nil {
			r.t.Fatal(err)
		}
	}
	return out.Bytes()
}

func authorizedLine(k ssh.PublicKey) string {
	return string(bytes.TrimSpace(ssh.MarshalAuthorizedKey(k)))
}

// fakePDS answers getRecord with what answer returns; hits counts
// requests.
type fakePDS struct {
	srv    *httptest.Server
	hits   atomic.Int64
	mu     sync.Mutex
	answer func(w http.ResponseWriter, r *http.Request)
}

func newFakePDS(t *testing.T) *fakePDS {
	p := &fakePDS{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.hits.Add(1)
		p.mu.Lock()
		a := p.answer
		p.mu.Unlock()
		a(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *fakePDS) set(a func(w http.ResponseWriter, r *http.Request)) {
	p.mu.Lock()
	p.answer = a
	p.mu.Unlock()
}

func serveCAR(b []byte) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.ipld.car")
		_, _ = w.Write(b)
	}
}

func loopbackClient() *http.Client {
	return pds.NewHTTPClient(netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, nil), nil, 5*time.Second)
}

// start runs srv on a loopback listener until the test ends.
func start(t *testing.T, srv *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Log(err)
		}
	})
	return ln.Addr().String()
}

func dialAs(addr, user string, host ssh.PublicKey, keys ...ssh.Signer) (*ssh.Client, error) {
	return ssh.Dial("tcp", addr, &ssh.ClientConfig{User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(keys...)},
		HostKeyCallback: ssh.FixedHostKey(host), Timeout: 5 * time.Second})
}

// fakeTenant is a tenant API server: GET of pod web/shop-0, SARs (allow
// decides), and the exec (counted, answered 403).
type fakeTenant struct {
	srv       *httptest.Server
	podExists bool
	allow     func(user string) bool
	hang      bool
	mu        sync.Mutex
	gets      int
	sars      []string
	execs     []string // Impersonate-User of each exec
}

func newFakeTenant(t *testing.T, podExists bool, allow func(string) bool) *fakeTenant {
	ft := &fakeTenant{podExists: podExists, allow: allow}
	ft.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/namespaces/web/pods/shop-0":
			ft.mu.Lock()
			ft.gets++
			hang := ft.hang
			ft.mu.Unlock()
			if hang {
				<-r.Context().Done()
				return
			}
			if !ft.podExists {
				w.WriteHeader(http.StatusNotFound)
				_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
				return
			}
			_, _ = w.Write([]byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"shop-0","namespace":"web"}}`))
		case r.Method == http.MethodPost && r.URL.Path == "/apis/authorization.k8s.io/v1/subjectaccessreviews":
			// JSON or protobuf: the user is the one DID in the body.
			body, _ := io.ReadAll(r.Body)
			user := ""
			if i := bytes.Index(body, []byte("did:")); i >= 0 {
				end := i
				for end < len(body) && (body[end] == ':' || body[end] == '.' || body[end] >= 'a' && body[end] <= 'z' || body[end] >= '0' && body[end] <= '9') {
					end++
				}
				user = string(body[i:end])
			}
			ft.mu.Lock()
			ft.sars = append(ft.sars, user)
			ft.mu.Unlock()
			_ = json.NewEncoder(w).Encode(map[string]any{"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
				"status": map[string]any{"allowed": ft.allow(user)}})
		case strings.HasSuffix(r.URL.Path, "/exec"):
			ft.mu.Lock()
			ft.execs = append(ft.execs, r.Header.Get("Impersonate-User"))
			ft.mu.Unlock()
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403}`))
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(ft.srv.Close)
	return ft
}

func (ft *fakeTenant) counts() (gets, sars, execs int) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	return ft.gets, len(ft.sars), len(ft.execs)
}

func executorOf(tenants map[string]*fakeTenant) *Executor {
	targets := &Targets{}
	for name := range tenants {
		targets.Set(name, name, []string{"web"})
	}
	return &Executor{Targets: targets, Admin: func(_ context.Context, tenant string) (*rest.Config, error) {
		ft, ok := tenants[tenant]
		if !ok {
			return nil, errors.New("no tenant")
		}
		return &rest.Config{Host: ft.srv.URL}, nil
	}}
}

func aliceSession() Session {
	return Session{DID: "did:plc:alice", Tenant: "b-victim", Namespace: "web", Pod: "shop-0", Command: []string{"id"},
		Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard}
}

// --- holes -------------------------------------------------------------

// TestAttackProofLengthPrefixAmplification: a PDS answers getRecord with
// five bytes, a CAR section length of 32 MiB; go-car allocates the
// length before reading (util.LdRead, up to MaxAllowedSectionSize). An
// unauthenticated client names a DID whose PDS is the attacker's, once
// per auth attempt (the error is not cached), from 256 connections:
// gigabytes of allocation for kilobytes of traffic.
func TestAttackProofLengthPrefixAmplification(t *testing.T) {
	r := newSignedRepo(t, "did:plc:mallory")
	id := r.identityAt("http://127.0.0.1:1")
	body := binary.AppendUvarint(nil, 32<<20)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, _, err := verifiedRecord(t.Context(), &id, body); err == nil {
		t.Fatal("a five-byte proof was accepted")
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 4<<20 {
		t.Errorf("a %d-byte proof made the agent allocate %d MiB: a section longer than what is left of the answer must be refused before it is allocated", len(body), got>>20)
	}
}

// TestAttackPDSErrorsAreFetchedPerAttempt: a DID whose PDS answers 500
// (or hangs) is fetched again on every auth attempt and by every
// concurrent connection: failures are not kept and lookups of one DID
// are not shared, so an unauthenticated client drives unbounded
// requests from the agent to a host of its choosing.
func TestAttackPDSErrorsAreFetchedPerAttempt(t *testing.T) {
	p := newFakePDS(t)
	p.set(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(200 * time.Millisecond)
		w.WriteHeader(http.StatusInternalServerError)
	})
	r := newSignedRepo(t, "did:plc:mallory")
	dir := identity.NewMockDirectory()
	dir.Insert(r.identityAt(p.srv.URL))
	k := &Keys{Directory: dir, Client: loopbackClient(), TTL: time.Minute}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, _ = k.Lookup(t.Context(), "did:plc:mallory")
		}()
	}
	wg.Wait()
	for range 4 {
		_, _, _ = k.Lookup(t.Context(), "did:plc:mallory")
	}
	if n := p.hits.Load(); n > 1 {
		t.Errorf("12 auth attempts for one failing DID made %d requests to its PDS, want 1 (share concurrent lookups, keep a failure a while)", n)
	}
}

// TestAttackOldCommitRestoresARemovedKey: the user replaced key A with
// key B; the PDS (or anyone between, on a plain-http PDS) answers with
// the older commit, still validly signed, that lists A. The agent keeps
// no revision, so the removed key logs in again after the TTL.
func TestAttackOldCommitRestoresARemovedKey(t *testing.T) {
	p := newFakePDS(t)
	r := newSignedRepo(t, "did:plc:alice")
	stolen, current := signer(t), signer(t)
	oldProof := r.proof([]string{authorizedLine(stolen.PublicKey())}, "", nil)
	newProof := r.proof([]string{authorizedLine(current.PublicKey())}, "", nil)
	dir := identity.NewMockDirectory()
	dir.Insert(r.identityAt(p.srv.URL))
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	k := &Keys{Directory: dir, Client: loopbackClient(), TTL: time.Minute, Now: func() time.Time { return now }}

	p.set(serveCAR(newProof))
	_, keys, err := k.Lookup(t.Context(), "did:plc:alice")
	if err != nil || len(keys) != 1 || !bytes.Equal(keys[0].Marshal(), current.PublicKey().Marshal()) {
		t.Fatalf("the current proof: %v %v", keys, err)
	}
	now = now.Add(2 * time.Minute)
	p.set(serveCAR(oldProof))
	_, keys, _ = k.Lookup(t.Context(), "did:plc:alice")
	for _, key := range keys {
		if bytes.Equal(key.Marshal(), stolen.PublicKey().Marshal()) {
			t.Fatal("an older signed commit brought back a key the user removed: keep the newest rev seen per DID and refuse older ones")
		}
	}
}

// TestAttackKeysCacheIsFlushedByOneSource: the keys cache starts again
// when it holds 4096 DIDs; one attacker with 4096 DIDs (did:web of
// subdomains are free) flushes every other user's keys (R21: shared
// caches keep per-source quotas).
func TestAttackKeysCacheIsFlushedByOneSource(t *testing.T) {
	p := newFakePDS(t)
	p.set(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNotFound) })
	dir := identity.NewMockDirectory()
	svc := map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: p.srv.URL}}
	dir.Insert(identity.Identity{DID: "did:plc:alice", Services: svc})
	for i := range maxCached {
		dir.Insert(identity.Identity{DID: syntax.DID(fmt.Sprintf("did:web:m%d.evil.example", i)), Services: svc})
	}
	k := &Keys{Directory: dir, Client: loopbackClient(), TTL: time.Hour}
	if _, _, err := k.Lookup(t.Context(), "did:plc:alice"); !errors.Is(err, ErrNoKeys) {
		t.Fatal(err)
	}
	for i := range maxCached {
		_, _, _ = k.Lookup(t.Context(), fmt.Sprintf("did:web:m%d.evil.example", i))
	}
	before := p.hits.Load()
	_, _, _ = k.Lookup(t.Context(), "did:plc:alice")
	if p.hits.Load() != before {
		t.Error("one source's DIDs flushed alice's cached lookup: evict the oldest entries (and bound each PDS host), do not start again")
	}
}

// TestAttackHostileTenantBlocksOrCapturesSessions: the target names no
// tenant, so every tenant whose requester lists namespace web takes
// part. Tenant a-hostile (another requester) makes a pod web/shop-0 and
// lets everyone exec. (1) alice, let in only by b-victim, is now
// refused ("the pod is in more than one tenant"): any requester locks
// any user out of any other tenant. (2) While b-victim's pod is away
// (restarting), alice's session, and what she types, goes to the
// hostile pod. Either way a-hostile's API server sees her DID and
// target.
func TestAttackHostileTenantBlocksOrCapturesSessions(t *testing.T) {
	everyone := func(string) bool { return true }
	onlyAlice := func(u string) bool { return u == "did:plc:alice" }

	hostile, victim := newFakeTenant(t, true, everyone), newFakeTenant(t, true, onlyAlice)
	e := executorOf(map[string]*fakeTenant{"a-hostile": hostile, "b-victim": victim})
	_, err := e.Exec(t.Context(), aliceSession())
	if _, _, n := victim.counts(); n != 1 {
		t.Errorf("alice's session into her own tenant: %v, %d execs there: another tenant's pod of the same name locks her out", err, n)
	}
	if gets, sars, _ := hostile.counts(); gets+sars > 0 {
		t.Errorf("another requester's API server saw alice's session (%d pod reads, %d reviews naming her DID)", gets, sars)
	}

	hostile, victim = newFakeTenant(t, true, everyone), newFakeTenant(t, false, onlyAlice)
	e = executorOf(map[string]*fakeTenant{"a-hostile": hostile, "b-victim": victim})
	_, _ = e.Exec(t.Context(), aliceSession())
	if _, _, n := hostile.counts(); n != 0 {
		t.Errorf("alice's session went to another requester's tenant (%d execs there): a session must name its tenant", n)
	}
}

// TestAttackHungTenantHoldsOtherTenantsSessions: the tenants of a
// namespace are asked one after the other, with no time limit: a tenant
// whose API server does not answer holds every session into that
// namespace (default, web, ...) of every other tenant of the agent.
func TestAttackHungTenantHoldsOtherTenantsSessions(t *testing.T) {
	hung := newFakeTenant(t, true, func(string) bool { return true })
	hung.hang = true
	victim := newFakeTenant(t, true, func(u string) bool { return u == "did:plc:alice" })
	e := executorOf(map[string]*fakeTenant{"a-hung": hung, "b-victim": victim})
	ctx, cancel := context.WithTimeout(t.Context(), 25*time.Second)
	defer cancel()
	start := time.Now()
	_, _ = e.Exec(ctx, aliceSession())
	if _, _, n := victim.counts(); n != 1 || time.Since(start) > 15*time.Second {
		t.Errorf("with a tenant that does not answer, alice's session reached her own tenant %d times after %s: bound each tenant's check", n, time.Since(start).Round(time.Second))
	}
}

// TestAttackTTYSessionsLeakGoroutines: the size queue handed to the exec
// (sizes) ends only when the connection ends, and Resize is never
// closed; remotecommand reads it from a goroutine it does not join. One
// connection running short TTY sessions one after the other leaks a
// goroutine each (R10).
func TestAttackTTYSessionsLeakGoroutines(t *testing.T) {
	alice := signer(t)
	host := signer(t)
	srv := &Server{HostKey: host, Log: logr.Discard(),
		Lookup: func(context.Context, string) (string, []ssh.PublicKey, error) {
			return "did:plc:alice", []ssh.PublicKey{alice.PublicKey()}, nil
		},
		Exec: func(ctx context.Context, s Session) (int, error) {
			if s.TTY {
				// What remotecommand's handleResizes does.
				go func() {
					q := sizes{ctx: ctx, ch: s.Resize}
					for q.Next() != nil {
					}
				}()
			}
			return 0, nil
		}}
	addr := start(t, srv)
	c, err := dialAs(addr, "alice.test", host.PublicKey(), alice)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		run(t, c, "l1/web/shop-0", true)
	}
	time.Sleep(200 * time.Millisecond)
	base := runtime.NumGoroutine()
	for range 40 {
		run(t, c, "l1/web/shop-0", true)
	}
	time.Sleep(300 * time.Millisecond)
	if grown := runtime.NumGoroutine() - base; grown > 10 {
		t.Errorf("40 finished TTY sessions on one connection left %d goroutines: end the session's size queue (a per-session context, or close Resize) when the session ends", grown)
	}
}

// TestAttackClosedSessionKeepsItsExec: the exec runs with the
// connection's context, so a session the client closes keeps its exec
// (and its slot) until the command ends on its own.
func TestAttackClosedSessionKeepsItsExec(t *testing.T) {
	alice := signer(t)
	host := signer(t)
	ended := make(chan struct{}, 8)
	srv := &Server{HostKey: host, Log: logr.Discard(),
		Lookup: func(context.Context, string) (string, []ssh.PublicKey, error) {
			return "did:plc:alice", []ssh.PublicKey{alice.PublicKey()}, nil
		},
		Exec: func(ctx context.Context, s Session) (int, error) {
			<-ctx.Done() // a command that runs until it is stopped
			ended <- struct{}{}
			return 0, nil
		}}
	addr := start(t, srv)
	c, err := dialAs(addr, "alice.test", host.PublicKey(), alice)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start("l1/web/shop-0 sleep infinity"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	_ = s.Close()
	select {
	case <-ended:
	case <-time.After(3 * time.Second):
		t.Error("the exec of a session the client closed still runs: give each session its own context, ended when its channel closes")
	}
}

// TestAttackIdleAuthenticatedConnectionsAreKept: anyone with an ATProto
// account passes authentication (authorization is per session). A
// connection that opens no session is kept for ever: 32 addresses (or
// one IPv6 /59, counted per /64) hold all 256 connections of the
// gateway.
func TestAttackIdleAuthenticatedConnectionsAreKept(t *testing.T) {
	t.Parallel()
	mallory := signer(t)
	host := signer(t)
	srv := &Server{HostKey: host, Log: logr.Discard(),
		Lookup: func(context.Context, string) (string, []ssh.PublicKey, error) {
			return "did:web:mallory.example", []ssh.PublicKey{mallory.PublicKey()}, nil
		},
		Exec: func(context.Context, Session) (int, error) { return 0, ErrRefused }}
	addr := start(t, srv)
	c, err := dialAs(addr, "did:web:mallory.example", host.PublicKey(), mallory)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2*handshakeTimeout + 5*time.Second):
		t.Errorf("an authenticated connection with no session was kept %s: close connections idle for a while (and bound them per DID)", 2*handshakeTimeout+5*time.Second)
	}
}

// TestAttackShutdownWaitsForHandshakes: a connection that sends nothing
// holds Serve's return for the whole handshake timeout after the
// context ended (the handshake is not tied to it, nor is Lookup's
// context): shutdown is bounded by the clients, not the caller (R10).
func TestAttackShutdownWaitsForHandshakes(t *testing.T) {
	srv := &Server{HostKey: signer(t), Log: logr.Discard(),
		Lookup: func(context.Context, string) (string, []ssh.PublicKey, error) { return "", nil, errors.New("no") },
		Exec:   func(context.Context, Session) (int, error) { return 0, ErrRefused }}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(200 * time.Millisecond)
	stopped := time.Now()
	cancel()
	if err := <-done; err != nil {
		t.Log(err)
	}
	if took := time.Since(stopped); took > 2*time.Second {
		t.Errorf("Serve returned %s after its context ended: close connections still in their handshake too", took.Round(100*time.Millisecond))
	}
}

// --- defences that held ----------------------------------------------

// TestDefenceProofsOfAnotherRepoOrKey: a PDS cannot add a key to a
// DID's record: a valid proof of another repo, a commit of the DID
// signed by another key, a tampered block, a truncated or garbled CAR
// are all refused, without a panic; the genuine proof is accepted.
func TestDefenceProofsOfAnotherRepoOrKey(t *testing.T) {
	p := newFakePDS(t)
	alice, mallory := newSignedRepo(t, "did:plc:alice"), newSignedRepo(t, "did:plc:mallory")
	attacker := authorizedLine(signer(t).PublicKey())
	dir := identity.NewMockDirectory()
	dir.Insert(alice.identityAt(p.srv.URL))
	good := alice.proof([]string{authorizedLine(signer(t).PublicKey())}, "", nil)
	tampered := bytes.Replace(alice.proof([]string{attacker}, "", nil), []byte("ssh-ed25519"), []byte("ssh-ed25518"), 1)
	cases := map[string][]byte{
		"another repo's proof":       mallory.proof([]string{attacker}, "", nil),
		"signed by another key":      alice.proof([]string{attacker}, "", mallory.key),
		"a block that is not its ID": tampered,
		"truncated":                  good[:len(good)/2],
		"no blocks":                  good[:40],
	}
	for i := range 200 {
		b := bytes.Clone(good)
		b[(i*7919)%len(b)] ^= byte(i + 1)
		cases[fmt.Sprintf("garbled %d", i)] = b
	}
	for name, body := range cases {
		k := &Keys{Directory: dir, Client: loopbackClient()}
		p.set(serveCAR(body))
		_, keys, err := k.Lookup(t.Context(), "did:plc:alice")
		for _, key := range keys {
			if authorizedLine(key) == attacker {
				t.Errorf("%s: the attacker's key was accepted", name)
			}
		}
		if strings.HasPrefix(name, "garbled") {
			continue // a flip in a comment or padding may leave a valid proof
		}
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	k := &Keys{Directory: dir, Client: loopbackClient()}
	p.set(serveCAR(good))
	if _, keys, err := k.Lookup(t.Context(), "did:plc:alice"); err != nil || len(keys) != 1 {
		t.Errorf("the genuine proof: %v %v", keys, err)
	}
}

// TestDefencePDSAtForbiddenAddress: a DID document naming its PDS at a
// metadata, link-local or private address is not dialled (the agent's
// address policy, R18).
func TestDefencePDSAtForbiddenAddress(t *testing.T) {
	for _, url := range []string{"http://169.254.169.254", "http://[fe80::1]:80", "http://10.0.0.1", "http://[fd00:ec2::254]"} {
		dir := identity.NewMockDirectory()
		dir.Insert(identity.Identity{DID: "did:plc:mallory",
			Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: url}}})
		k := &Keys{Directory: dir, Client: loopbackClient()}
		if _, _, err := k.Lookup(t.Context(), "did:plc:mallory"); err == nil || !errors.Is(err, netpolicy.ErrDenied) {
			t.Errorf("%s: %v, want the address policy's refusal", url, err)
		}
	}
}

// TestDefenceCertificateOfAPublishedKey: a certificate is not its key:
// a certificate (from any CA) wrapping alice's published key, or signed
// by it, does not authenticate.
func TestDefenceCertificateOfAPublishedKey(t *testing.T) {
	alice := signer(t)
	f := serve(t, alice.PublicKey())
	_, caPriv, _ := ed25519.GenerateKey(rand.Reader)
	ca, _ := ssh.NewSignerFromKey(caPriv)
	for name, signWith := range map[string]ssh.Signer{"a CA's certificate of alice's key": ca, "a certificate alice's key signed": alice} {
		subject := alice
		if signWith == alice {
			subject = signer(t)
		}
		cert := &ssh.Certificate{Key: subject.PublicKey(), CertType: ssh.UserCert, ValidPrincipals: []string{"alice.test"},
			ValidBefore: ssh.CertTimeInfinity}
		if err := cert.SignCert(rand.Reader, signWith); err != nil {
			t.Fatal(err)
		}
		cs, err := ssh.NewCertSigner(cert, subject)
		if err != nil {
			t.Fatal(err)
		}
		if c, err := f.dial("alice.test", cs); err == nil {
			c.Close()
			t.Errorf("%s was let in", name)
		}
	}
}

// TestDefenceChannelsAndRequests: only sessions are served: no port
// forwarding (direct-tcpip, tcpip-forward), no env, a command past 8 KiB
// is refused, a fifth session at once is refused, and a flood of window
// changes does not block the session.
func TestDefenceChannelsAndRequests(t *testing.T) {
	alice := signer(t)
	f := serve(t, alice.PublicKey())
	c, err := f.dial("alice.test", alice)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Dial("tcp", "10.96.0.1:443"); err == nil {
		t.Error("direct-tcpip was accepted")
	}
	if ok, _, _ := c.SendRequest("tcpip-forward", true, ssh.Marshal(struct {
		Addr string
		Port uint32
	}{"0.0.0.0", 8080})); ok {
		t.Error("tcpip-forward was accepted")
	}
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Setenv("KUBECONFIG", "/etc/kubernetes/admin.conf"); err == nil {
		t.Error("env was accepted")
	}
	if err := s.Start("web/shop-0 " + strings.Repeat("x", maxCommand)); err == nil {
		t.Error("a command past 8 KiB was accepted")
	}
	s.Close()

	var held []*ssh.Session
	for range maxSessions {
		s, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, s)
	}
	if s, err := c.NewSession(); err == nil {
		s.Close()
		t.Error("a fifth session at once was accepted")
	}
	for _, s := range held {
		s.Close()
	}
	time.Sleep(100 * time.Millisecond)

	s, err = c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.RequestPty("xterm", 40, 120, ssh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for i := range 5000 {
			if s.WindowChange(40, 80+i%50) != nil {
				return
			}
		}
	}()
	done := make(chan error, 1)
	go func() { done <- s.Run("l1/web/shop-0") }()
	select {
	case err := <-done:
		t.Logf("the session: %v", err)
	case <-time.After(10 * time.Second):
		t.Error("a window-change flood blocked the session")
	}
}

// TestDefenceRefusalsSayNothing: what a refused client reads names no
// tenant, no check that failed, no error of a tenant or PDS (R17).
func TestDefenceRefusalsSayNothing(t *testing.T) {
	alice := signer(t)
	f := serve(t, alice.PublicKey())
	f.allowed["did:plc:alice"] = false
	c, err := f.dial("alice.test", alice)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, stderr, _ := run(t, c, "l1/kube-system/etcd-0 cat /etc/kubernetes/pki/ca.key", false)
	if stderr != "knotless: l1/kube-system/etcd-0: refused: no such pod, or did:plc:alice may not exec into it\r\n" {
		t.Errorf("the refusal says %q", stderr)
	}
}
