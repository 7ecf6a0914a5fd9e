package serviceauth

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/go-logr/logr"
	"github.com/golang-jwt/jwt/v5"
	authenticationv1 "k8s.io/api/authentication/v1"
)

const (
	alice  = syntax.DID("did:plc:alice000000000000000000")
	bidder = "did:plc:bidder00000000000000000"
)

// allowed are the DIDs the tenant of the tests lets in.
var allowed = []string{string(alice)}

// countingDir is a directory of one identity that counts its lookups and
// purges.
type countingDir struct {
	*identity.MockDirectory
	lookups, purges atomic.Int64
}

func (d *countingDir) LookupDID(ctx context.Context, did syntax.DID) (*identity.Identity, error) {
	d.lookups.Add(1)
	return d.MockDirectory.LookupDID(ctx, did)
}

func (d *countingDir) Purge(ctx context.Context, atid syntax.AtIdentifier) error {
	d.purges.Add(1)
	return nil
}

func newDir(t *testing.T, did syntax.DID) (*countingDir, atcrypto.PrivateKey) {
	t.Helper()
	key, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := key.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	dir := identity.NewMockDirectory()
	dir.Insert(identity.Identity{DID: did, Handle: "alice.test",
		Keys: map[string]identity.VerificationMethod{"atproto": {Type: "Multikey", PublicKeyMultibase: pub.Multibase()}}})
	return &countingDir{MockDirectory: dir}, key
}

func sign(t *testing.T, key atcrypto.PrivateKey, iss syntax.DID, aud string, ttl time.Duration, method string) string {
	t.Helper()
	var lxm *syntax.NSID
	if method != "" {
		m := syntax.NSID(method)
		lxm = &m
	}
	tok, err := auth.SignServiceAuth(iss, aud, ttl, lxm, key)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestValidateAcceptsATokenForTheTenant(t *testing.T) {
	dir, key := newDir(t, alice)
	aud := Audience(bidder, "vm-1")
	for _, m := range []string{Method, MountMethod} {
		did, lxm, err := NewValidator(dir).Validate(t.Context(), sign(t, key, alice, aud, time.Minute, m), aud, allowed)
		if err != nil || did != alice || lxm != m {
			t.Fatalf("Validate = %q, %q, %v; want %s, %s", did, lxm, err, alice, m)
		}
	}
}

func TestAudienceNamesTheVM(t *testing.T) {
	a, b := Audience(bidder, "vm-1"), Audience(bidder, "vm-2")
	if a == b || !strings.HasPrefix(a, bidder+"#knotless_tenant_") {
		t.Fatalf("audiences %q %q", a, b)
	}
	if _, err := syntax.ParseDID(strings.SplitN(a, "#", 2)[0]); err != nil {
		t.Fatal(err)
	}
}

// The attacks: every token below is refused, with ErrInvalid.
func TestAttackTokensAreRefused(t *testing.T) {
	dir, key := newDir(t, alice)
	other, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	aud := Audience(bidder, "vm-1")
	good := sign(t, key, alice, aud, time.Minute, Method)
	forged := good[:strings.LastIndexByte(good, '.')+1] + strings.Repeat("A", len(good)-strings.LastIndexByte(good, '.')-1)
	expired := func() string {
		claims := jwt.MapClaims{"iss": string(alice), "aud": aud, "lxm": Method, "iat": time.Now().Add(-3 * time.Minute).Unix(), "exp": time.Now().Add(-2 * time.Minute).Unix()}
		return signClaims(t, key, claims)
	}()
	for _, c := range []struct{ name, token string }{
		{"another tenant's audience", sign(t, key, alice, Audience(bidder, "vm-2"), time.Minute, Method)},
		{"the bidder's DID as audience", sign(t, key, alice, bidder, time.Minute, Method)},
		{"another method", sign(t, key, alice, aud, time.Minute, "com.atproto.repo.createRecord")},
		{"no method", sign(t, key, alice, aud, time.Minute, "")},
		{"signed by a key not in the DID document", sign(t, other, alice, aud, time.Minute, Method)},
		{"a forged signature", forged},
		{"expired", expired},
		{"valid for an hour", sign(t, key, alice, aud, time.Hour, Method)},
		{"an issuer the tenant does not let in", sign(t, key, "did:plc:nobody00000000000000000", aud, time.Minute, Method)},
		{"not a JWT", "hello"},
		{"too long", good + strings.Repeat("A", MaxToken)},
		{"alg none", signClaims(t, nil, jwt.MapClaims{"iss": string(alice), "aud": aud, "lxm": Method, "iat": time.Now().Unix(), "exp": time.Now().Add(time.Minute).Unix()})},
	} {
		t.Run(c.name, func(t *testing.T) {
			did, _, err := NewValidator(dir).Validate(t.Context(), c.token, aud, allowed)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate = %q, %v; want ErrInvalid", did, err)
			}
		})
	}
	if _, _, err := NewValidator(dir).Validate(t.Context(), good, "", allowed); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a tenant with no audience accepted a token: %v", err)
	}
}

// signClaims signs claims with key (ES256K), or with alg none when key is
// nil.
func signClaims(t *testing.T, key atcrypto.PrivateKey, claims jwt.MapClaims) string {
	t.Helper()
	if key == nil {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodNone, claims).SignedString(jwt.UnsafeAllowNoneSignatureType)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	return signRaw(t, key, payload)
}

// signRaw signs the JSON payload as it is with key (ES256K).
func signRaw(t *testing.T, key atcrypto.PrivateKey, payload []byte) string {
	t.Helper()
	// The header of a token indigo makes.
	base := sign(t, key, alice, "did:plc:x", time.Minute, Method)
	head := base[:strings.IndexByte(base, '.')]
	signing := head + "." + base64.RawURLEncoding.EncodeToString(payload)
	sig, err := jwt.GetSigningMethod("ES256K").Sign(signing, key)
	if err != nil {
		t.Fatal(err)
	}
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// Forged tokens make the issuer's document be purged (and so resolved
// again) at most once per PurgeInterval, however many arrive.
func TestAttackForgedTokensPurgeAtMostOncePerInterval(t *testing.T) {
	dir, _ := newDir(t, alice)
	other, _ := atcrypto.GeneratePrivateKeyK256()
	v := NewValidator(dir)
	now := time.Now()
	v.dir.(*purgeLimited).now = func() time.Time { return now }
	aud := Audience(bidder, "vm-1")
	for range 100 {
		if _, _, err := v.Validate(t.Context(), sign(t, other, alice, aud, time.Minute, Method), aud, allowed); !errors.Is(err, ErrInvalid) {
			t.Fatal(err)
		}
	}
	if got := dir.purges.Load(); got != 1 {
		t.Fatalf("100 forged tokens purged %d times, want 1", got)
	}
	now = now.Add(PurgeInterval)
	_, _, _ = v.Validate(t.Context(), sign(t, other, alice, aud, time.Minute, Method), aud, allowed)
	if got := dir.purges.Load(); got != 2 {
		t.Fatalf("after the interval: %d purges, want 2", got)
	}
	t.Logf("FIGURE 101 forged tokens over one interval: %d purges, %d lookups", dir.purges.Load(), dir.lookups.Load())
}

// A long-lived token is refused before its issuer is resolved.
func TestLongLivedTokenIsRefusedWithoutResolving(t *testing.T) {
	dir, key := newDir(t, alice)
	aud := Audience(bidder, "vm-1")
	if _, _, err := NewValidator(dir).Validate(t.Context(), sign(t, key, alice, aud, time.Hour, Method), aud, allowed); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
	if n := dir.lookups.Load(); n != 0 {
		t.Fatalf("%d lookups", n)
	}
}

func review(t *testing.T, h http.Handler, path, token string) (int, authenticationv1.TokenReview) {
	t.Helper()
	body, _ := json.Marshal(authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
	var out authenticationv1.TokenReview
	_ = json.Unmarshal(rec.Body.Bytes(), &out)
	return rec.Code, out
}

func TestWebhookAuthenticatesTheDIDForTheVMItNames(t *testing.T) {
	dir, key := newDir(t, alice)
	auds := map[string]string{"vm-1": Audience(bidder, "vm-1"), "vm-2": Audience(bidder, "vm-2")}
	h := &Webhook{Validator: NewValidator(dir), Log: logr.Discard(), Tenant: func(_ context.Context, id string) (string, []string, error) {
		return auds[id], allowed, nil
	}}
	tok := sign(t, key, alice, auds["vm-1"], time.Minute, Method)

	code, out := review(t, h, WebhookPath+"vm-1", tok)
	if code != http.StatusOK || !out.Status.Authenticated || out.Status.User.Username != string(alice) || len(out.Status.User.Groups) != 0 {
		t.Fatalf("%d %+v", code, out.Status)
	}
	// A token for the mount is the DID's mount user, not the DID.
	code, out = review(t, h, WebhookPath+"vm-1", sign(t, key, alice, auds["vm-1"], time.Minute, MountMethod))
	if !out.Status.Authenticated || out.Status.User.Username != string(alice)+"#mount" || out.Status.User.UID != string(alice)+"#mount" {
		t.Fatalf("mount token: %d %+v", code, out.Status)
	}
	if _, err := syntax.ParseDID(MountUser(string(alice))); err == nil {
		t.Fatal("a mount's user parses as a DID: the agent would take it for a DID the tenant lets in")
	}
	// The same token posted for another VM, or one the agent does not
	// know, is refused, and the refusal says nothing of why.
	for _, p := range []string{WebhookPath + "vm-2", WebhookPath + "nope"} {
		code, out := review(t, h, p, tok)
		if code != http.StatusOK || out.Status.Authenticated || out.Status.Error != "invalid token" {
			t.Fatalf("%s: %d %+v", p, code, out.Status)
		}
	}
	for _, p := range []string{"/", WebhookPath, WebhookPath + "a/b"} {
		if code, _ := review(t, h, p, tok); code != http.StatusNotFound {
			t.Fatalf("%s: %d", p, code)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, WebhookPath+"vm-1", strings.NewReader(strings.Repeat("x", maxReview+1))))
	if rec.Code != http.StatusBadRequest {
		t.Fatalf("oversized body: %d", rec.Code)
	}
}

func TestServingCertIsKeptAndServesItsAddress(t *testing.T) {
	dir := t.TempDir()
	pair, ca, err := ServingCert(dir, "127.0.0.1")
	if err != nil || len(ca) == 0 || len(pair.Certificate) < 2 {
		t.Fatal(err)
	}
	_, again, err := ServingCert(dir, "127.0.0.1")
	if err != nil || !bytes.Equal(ca, again) {
		t.Fatalf("the CA changed on a second start: %v", err)
	}
	if _, _, err := ServingCert(dir, "127.0.0.2"); err == nil {
		t.Fatal("the certificate of another address was served, or replaced")
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), []byte("broken"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ServingCert(dir, "127.0.0.1"); err == nil {
		t.Fatal("a broken key was replaced: the tenants' CA would change")
	}
	if err := os.Remove(filepath.Join(dir, "tls.key")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "tls.crt")); err != nil {
		t.Fatal(err)
	}
	if _, other, err := ServingCert(dir, "127.0.0.2"); err != nil || bytes.Equal(ca, other) {
		t.Fatalf("no new certificate once both files were removed: %v", err)
	}
}

func TestIsAudienceOf(t *testing.T) {
	aud := Audience(bidder, "vm-1")
	if !IsAudienceOf(aud, bidder) {
		t.Fatalf("%q is not an audience of %s", aud, bidder)
	}
	for _, c := range []struct{ aud, did string }{
		{aud, "did:plc:other0000000000000000000"},
		{bidder, bidder},
		{bidder + "#knotless_tenant_", bidder},
		{bidder + "#atproto_pds", bidder},
		{aud + "#x", bidder},
		{strings.ToUpper(aud), bidder},
		{aud, ""},
	} {
		if IsAudienceOf(c.aud, c.did) {
			t.Errorf("%q taken as an audience of %q", c.aud, c.did)
		}
	}
}

// BenchmarkWebhookReview is the agent's work for one TokenReview of a
// valid token whose issuer's document is cached (the tenant keeps a
// review WebhookCacheTTL, so this runs once per token per 10 s).
func BenchmarkWebhookReview(b *testing.B) {
	t := &testing.T{}
	dir, key := newDir(t, alice)
	aud := Audience(bidder, "vm-1")
	h := &Webhook{Validator: NewValidator(dir), Log: logr.Discard(), Tenant: func(context.Context, string) (string, []string, error) { return aud, allowed, nil }}
	tok := sign(t, key, alice, aud, time.Minute, Method)
	body, _ := json.Marshal(authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: tok}})
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, WebhookPath+"vm-1", bytes.NewReader(body)))
		if !bytes.Contains(rec.Body.Bytes(), []byte(`"authenticated":true`)) {
			b.Fatal(rec.Body.String())
		}
	}
}

// Tokens the pre-check refuses cost no DID resolution and no purge:
// another issuer than the tenant lets in, another audience or method, an
// unsigned token (from the review: these made the agent fetch a document
// each, or filled the purge limiter).
func TestAttackRefusedBeforeResolving(t *testing.T) {
	dir, key := newDir(t, alice)
	aud := Audience(bidder, "vm-1")
	v := NewValidator(dir)
	none := signClaims(t, nil, jwt.MapClaims{"iss": string(alice), "aud": aud, "lxm": Method, "iat": time.Now().Unix(), "exp": time.Now().Add(time.Minute).Unix()})
	for i := range 300 {
		for _, tok := range []string{
			sign(t, key, syntax.DID(fmt.Sprintf("did:plc:stranger%016d", i)), aud, time.Minute, Method),
			sign(t, key, alice, Audience(bidder, "vm-2"), time.Minute, Method),
			sign(t, key, alice, aud, time.Minute, "com.atproto.repo.listRecords"),
			none,
		} {
			if _, _, err := v.Validate(t.Context(), tok, aud, allowed); !errors.Is(err, ErrInvalid) {
				t.Fatal(err)
			}
		}
	}
	if l, p := dir.lookups.Load(), dir.purges.Load(); l != 0 || p != 0 {
		t.Fatalf("1200 refused tokens: %d lookups, %d purges; want none", l, p)
	}
}

// A token that names an allowed issuer as "ISS" and another as "iss" is
// refused before anything is resolved or purged (from the review: indigo
// purges the map's "iss").
func TestAttackIssuerNamedTwice(t *testing.T) {
	dir, key := newDir(t, alice)
	aud := Audience(bidder, "vm-1")
	now := time.Now()
	// "iss" first, "ISS" last: the struct takes the last, indigo's map
	// the exact key.
	payload := fmt.Sprintf(`{"iss":"did:web:victim.example","aud":%q,"lxm":%q,"iat":%d,"exp":%d,"ISS":%q}`, aud, Method, now.Unix(), now.Add(time.Minute).Unix(), alice)
	tok := signRaw(t, key, []byte(payload))
	if _, _, err := NewValidator(dir).Validate(t.Context(), tok, aud, allowed); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
	if l, p := dir.lookups.Load(), dir.purges.Load(); l != 0 || p != 0 {
		t.Fatalf("%d lookups, %d purges", l, p)
	}
}
