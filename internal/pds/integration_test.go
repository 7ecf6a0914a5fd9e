package pds_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/pds"
)

// TestAgainstReferencePDS runs the client against @atproto/pds with a local
// PLC (hack/stack), checking every step with a plain getRecord.
func TestAgainstReferencePDS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PLC and the reference PDS")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{
		filepath.Join(root, "hack", "stack", "node_modules", ".knotless-install-stamp"),
		framework.NodeBin(root),
	} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("test stack not installed (run hack/stack/install.sh or `make stack-deps`): %v", err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	g := &framework.Group{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(g.Tails(30))
		}
		g.StopAll()
	})
	plc, err := framework.StartPLC(ctx, g, root, dir)
	if err != nil {
		t.Fatal(err)
	}
	server, err := framework.StartPDS(ctx, g, root, dir, plc.URL)
	if err != nil {
		t.Fatal(err)
	}
	acct, err := server.CreateAccount(ctx, "alice.test")
	if err != nil {
		t.Fatal(err)
	}

	// plain reads the record without this package: (cid, value) or the XRPC error name.
	plain := func(rkey string) (cid string, value map[string]any, errName string) {
		t.Helper()
		var out struct {
			CID   string         `json:"cid"`
			Value map[string]any `json:"value"`
		}
		err := server.XRPC(ctx, "com.atproto.repo.getRecord", "", url.Values{
			"repo": {acct.DID}, "collection": {coll}, "rkey": {rkey},
		}, nil, &out)
		var xe *framework.XRPCError
		if errors.As(err, &xe) {
			return "", nil, xe.Name
		}
		if err != nil {
			t.Fatal(err)
		}
		return out.CID, out.Value, ""
	}

	store := &countingStore{}
	opts := pds.Options{Policy: local, Store: store}
	c, err := pds.Connect(ctx, server.URL, acct.Handle, acct.AppPassword, opts)
	if err != nil {
		t.Fatal(err)
	}
	if did, handle := c.Info(); did != acct.DID || handle != acct.Handle {
		t.Fatalf("Info() = %s, %s; want %s, %s", did, handle, acct.DID, acct.Handle)
	}
	first := store.stored(t)

	// A restart resumes: no login, so the stored tokens stay the same.
	if _, err = pds.Connect(ctx, server.URL, acct.Handle, acct.AppPassword, opts); err != nil {
		t.Fatal(err)
	}
	if store.stored(t) != first {
		t.Fatal("Connect with a valid stored session logged in again")
	}

	// An expired access token in the store is refreshed, not replaced by a login.
	secrets, err := os.ReadFile(filepath.Join(server.DataDir, "secrets.json"))
	if err != nil {
		t.Fatal(err)
	}
	var sec struct {
		JWTSecret string `json:"jwtSecret"`
	}
	if err := json.Unmarshal(secrets, &sec); err != nil {
		t.Fatal(err)
	}
	expired := first
	expired.AccessJWT = expireJWT(t, first.AccessJWT, sec.JWTSecret)
	if err := store.Save(ctx, &expired); err != nil {
		t.Fatal(err)
	}
	if c, err = pds.Connect(ctx, server.URL, acct.Handle, acct.AppPassword, opts); err != nil {
		t.Fatal(err)
	}
	if got := store.stored(t); got.RefreshJWT == first.RefreshJWT || got.AccessJWT == expired.AccessJWT {
		t.Fatal("expired session was not refreshed and saved")
	}

	// Put, read back.
	p1, err := c.PutRecord(ctx, coll, "k1", json.RawMessage(`{"n":1,"big":9007199254740991}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	cid, value, _ := plain("k1")
	if cid != p1.CID || !p1.Changed() || value["$type"] != coll || value["n"] != float64(1) {
		t.Fatalf("after put: plain getRecord cid %s value %v; put %+v", cid, value, p1)
	}
	if r, err := c.GetRecord(ctx, coll, "k1"); err != nil || r.CID != p1.CID {
		t.Fatalf("GetRecord = %+v, %v", r, err)
	}

	// The same value again: no commit.
	if same, err := c.PutRecord(ctx, coll, "k1", json.RawMessage(`{"n":1,"big":9007199254740991}`), nil); err != nil || same.Changed() || same.CID != p1.CID {
		t.Fatalf("no-op put = %+v, %v", same, err)
	}

	// Put with swap, and a stale swap.
	p2, err := c.PutRecord(ctx, coll, "k1", json.RawMessage(`{"n":2}`), &p1.CID)
	if err != nil {
		t.Fatal(err)
	}
	if cid, _, _ := plain("k1"); cid != p2.CID {
		t.Fatalf("after swap put: plain cid %s, want %s", cid, p2.CID)
	}
	if _, err := c.PutRecord(ctx, coll, "k1", json.RawMessage(`{"n":3}`), &p1.CID); !errors.Is(err, pds.ErrInvalidSwap) {
		t.Fatalf("stale swap: want ErrInvalidSwap, got %v", err)
	}
	if cid, _, _ := plain("k1"); cid != p2.CID {
		t.Fatal("a refused swap changed the record")
	}
	if rev, err := c.LatestRev(ctx); err != nil || rev != p2.Rev {
		t.Fatalf("LatestRev = %q, %v; want %q", rev, err, p2.Rev)
	}

	// Delete with swap; a missing record deletes fine and reads as RecordNotFound.
	if err := c.DeleteRecord(ctx, coll, "k1", &p2.CID); err != nil {
		t.Fatal(err)
	}
	if _, _, name := plain("k1"); name != "RecordNotFound" {
		t.Fatalf("after delete: plain getRecord error %q", name)
	}
	if err := c.DeleteRecord(ctx, coll, "k1", nil); err != nil {
		t.Fatalf("deleting a missing record: %v", err)
	}
	if _, err := c.GetRecord(ctx, coll, "k1"); !errors.Is(err, pds.ErrRecordNotFound) {
		t.Fatalf("want ErrRecordNotFound, got %v", err)
	}

	// ApplyWrites: create three, then update one and delete one.
	res, err := c.ApplyWrites(ctx, []pds.Write{
		{Op: pds.OpCreate, Collection: coll, Rkey: "a", Value: json.RawMessage(`{"n":1}`)},
		{Op: pds.OpCreate, Collection: coll, Rkey: "b", Value: json.RawMessage(`{"n":2}`)},
		{Op: pds.OpCreate, Collection: coll, Rkey: "c", Value: json.RawMessage(`{"n":3}`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, rkey := range []string{"a", "b", "c"} {
		if cid, _, _ := plain(rkey); cid == "" || cid != res.Results[i].CID {
			t.Fatalf("after applyWrites: %s plain cid %q, result %+v", rkey, cid, res.Results[i])
		}
	}
	res, err = c.ApplyWrites(ctx, []pds.Write{
		{Op: pds.OpUpdate, Collection: coll, Rkey: "a", Value: json.RawMessage(`{"n":10}`)},
		{Op: pds.OpDelete, Collection: coll, Rkey: "b"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if cid, value, _ := plain("a"); cid != res.Results[0].CID || value["n"] != float64(10) {
		t.Fatalf("after update: a = %s %v", cid, value)
	}
	if _, _, name := plain("b"); name != "RecordNotFound" {
		t.Fatalf("after delete: b error %q", name)
	}

	// What the documentation promises about failing batches.
	for _, tc := range []struct {
		name string
		w    pds.Write
	}{
		{"create on an existing key", pds.Write{Op: pds.OpCreate, Collection: coll, Rkey: "a", Value: json.RawMessage(`{"n":11}`)}},
		{"update on a missing key", pds.Write{Op: pds.OpUpdate, Collection: coll, Rkey: "missing", Value: json.RawMessage(`{"n":1}`)}},
		{"delete on a missing key", pds.Write{Op: pds.OpDelete, Collection: coll, Rkey: "missing"}},
	} {
		_, err := c.ApplyWrites(ctx, []pds.Write{
			{Op: pds.OpCreate, Collection: coll, Rkey: "d", Value: json.RawMessage(`{"n":4}`)}, tc.w,
		})
		var se *pds.StatusError
		if !errors.As(err, &se) || se.StatusCode != 500 {
			t.Errorf("%s: want a 500 StatusError, got %v", tc.name, err)
		}
		if _, _, name := plain("d"); name != "RecordNotFound" {
			t.Errorf("%s: the batch was partially applied", tc.name)
		}
	}

	// A record an owner keeps: the record and its marker in one commit;
	// the prune deletes both and leaves another writer's record alone.
	owned := pds.Key{Collection: coll, RKey: "owned"}
	if r, err := c.EnsureOwned(ctx, "uid-1", owned, json.RawMessage(`{"n":1}`), nil); err != nil || !r.Wrote {
		t.Fatalf("EnsureOwned = %+v, %v", r, err)
	}
	if cid, _, _ := plain("owned"); cid == "" {
		t.Fatal("the owned record is not on the PDS")
	}
	if inv, err := c.Inventory(ctx, "uid-1"); err != nil || len(inv) != 1 || inv[0] != owned {
		t.Fatalf("Inventory = %v, %v", inv, err)
	}
	if n, err := c.Prune(ctx, "uid-1", nil, func(context.Context, pds.Key) bool { return false }); err != nil || n != 1 {
		t.Fatalf("Prune = %d, %v", n, err)
	}
	if _, _, name := plain("owned"); name != "RecordNotFound" {
		t.Fatalf("after the prune: owned error %q", name)
	}
	if cid, _, _ := plain("a"); cid == "" {
		t.Fatal("the prune deleted a record without a marker")
	}
	if inv, err := c.Inventory(ctx, "uid-1"); err != nil || len(inv) != 0 {
		t.Fatalf("Inventory after the prune = %v, %v", inv, err)
	}

	// Wrong app password: typed, and no secret in the text.
	_, err = pds.Connect(ctx, server.URL, acct.Handle, "wrong-"+acct.AppPassword, pds.Options{Policy: local, Store: &countingStore{}})
	if !errors.Is(err, pds.ErrAuthentication) {
		t.Fatalf("wrong password: want ErrAuthentication, got %v", err)
	}
	if strings.Contains(err.Error(), acct.AppPassword) {
		t.Fatalf("error leaks the password: %v", err)
	}
}

// expireJWT re-signs an access token (HS256 with the PDS's JWT secret, as
// the PDS signs them) with an expiry in the past.
func expireJWT(t *testing.T, token, secret string) string {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("access token is not a JWT")
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims map[string]any
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Fatal(err)
	}
	now := time.Now().Unix()
	claims["iat"], claims["exp"] = now-3600, now-60
	payload, _ := json.Marshal(claims)
	signed := parts[0] + "." + base64.RawURLEncoding.EncodeToString(payload)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(signed))
	return signed + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}
