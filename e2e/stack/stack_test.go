// Package stack_test checks the test stack itself (PLC, PDS, Vault dev
// server) without kcp: the fixtures in e2e/framework start it, an account
// logs in with its app password, and nothing is lost when the PDS is
// killed and restarted.
package stack_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/knotless-dev/knotless/e2e/framework"
)

func TestStackStarts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the PLC, the PDS (Node 22) and Vault: skipped in -short mode")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("KNOTLESS_E2E_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(root, "e2e", "_artifacts", time.Now().Format("20060102-150405"))
	}
	dir = filepath.Join(dir, "stack")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	g := &framework.Group{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(g.Tails(40))
		}
		g.StopAll()
		t.Logf("logs in %s", dir)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	start := time.Now()
	plc, err := framework.StartPLC(ctx, g, root, dir)
	if err != nil {
		t.Fatalf("starting the PLC: %v", err)
	}
	t.Logf("PLC ready in %s at %s", time.Since(start).Round(time.Millisecond), plc.URL)

	start = time.Now()
	pds, err := framework.StartPDS(ctx, g, root, dir, plc.URL)
	if err != nil {
		t.Fatalf("starting the PDS: %v", err)
	}
	t.Logf("PDS ready in %s at %s", time.Since(start).Round(time.Millisecond), pds.URL)

	start = time.Now()
	acct, err := pds.CreateAccount(ctx, "alice.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("account %s (%s) with app password created in %s", acct.Handle, acct.DID, time.Since(start).Round(time.Millisecond))

	login := func(what, password string) *framework.Session {
		t.Helper()
		start := time.Now()
		s, err := pds.CreateSession(ctx, acct.Handle, password)
		if err != nil {
			t.Fatalf("%s: login: %v", what, err)
		}
		took := time.Since(start)
		var got framework.Session
		if err := pds.XRPC(ctx, "com.atproto.server.getSession", s.AccessJWT, nil, nil, &got); err != nil {
			t.Fatalf("%s: getSession: %v", what, err)
		}
		if got.DID != acct.DID || got.Handle != acct.Handle {
			t.Fatalf("%s: getSession says %s (%s), want %s (%s)", what, got.Handle, got.DID, acct.Handle, acct.DID)
		}
		t.Logf("%s: login took %s", what, took.Round(time.Millisecond))
		return s
	}
	sess := login("app password", acct.AppPassword)

	// A record written before the restart must be there after it.
	const collection, rkey = "dev.knotless.test.note", "stack"
	if err := pds.XRPC(ctx, "com.atproto.repo.putRecord", sess.AccessJWT, nil, map[string]any{
		"repo": acct.DID, "collection": collection, "rkey": rkey,
		"record": map[string]any{"$type": collection, "text": "kept"},
	}, nil); err != nil {
		t.Fatalf("putRecord: %v", err)
	}

	pds.Kill9()
	start = time.Now()
	if err := pds.Restart(ctx, g); err != nil {
		t.Fatalf("restarting the PDS after kill -9: %v", err)
	}
	t.Logf("PDS restarted (after kill -9) in %s", time.Since(start).Round(time.Millisecond))
	login("after restart, app password", acct.AppPassword)
	login("after restart, password", acct.Password)
	var rec struct {
		Value map[string]any `json:"value"`
	}
	if err := pds.XRPC(ctx, "com.atproto.repo.getRecord", "", url.Values{
		"repo": {acct.DID}, "collection": {collection}, "rkey": {rkey},
	}, nil, &rec); err != nil {
		t.Fatalf("getRecord after restart: %v", err)
	}
	if rec.Value["text"] != "kept" {
		t.Fatalf("record after restart: %v, want text=kept", rec.Value)
	}

	vaultBin := filepath.Join(root, "bin", "vault")
	if _, err := os.Stat(vaultBin); err != nil {
		t.Logf("no %s (make stack-deps builds it): Vault part not run", vaultBin)
		return
	}
	start = time.Now()
	v, err := framework.StartVault(ctx, g, vaultBin, dir)
	if err != nil {
		t.Fatalf("starting Vault: %v", err)
	}
	t.Logf("Vault ready in %s at %s", time.Since(start).Round(time.Millisecond), v.Addr)
	audit := filepath.Join(dir, "vault-audit.log")
	if err := v.EnableAudit(ctx, audit); err != nil {
		t.Fatalf("enabling the audit device: %v", err)
	}
	if _, err := v.Write(ctx, "secret/data/knotless/stack", map[string]any{
		"data": map[string]any{"appPassword": acct.AppPassword},
	}); err != nil {
		t.Fatalf("writing a KV v2 secret: %v", err)
	}
	got, err := v.Read(ctx, "secret/data/knotless/stack")
	if err != nil {
		t.Fatalf("reading the KV v2 secret: %v", err)
	}
	if data, _ := got["data"].(map[string]any); data["appPassword"] != acct.AppPassword {
		t.Fatalf("KV v2 secret: got %v, want appPassword set", redact(got))
	}
	if _, err := v.Read(ctx, "secret/data/knotless/missing"); !framework.IsVaultStatus(err, 404) {
		t.Fatalf("reading a missing secret: got %v, want a 404", err)
	}
	if fi, err := os.Stat(audit); err != nil || fi.Size() == 0 {
		t.Fatalf("audit log %s: %v, want a non-empty file", audit, err)
	}
}

// redact shows a KV v2 response's shape without its values.
func redact(resp map[string]any) string {
	data, _ := resp["data"].(map[string]any)
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	return fmt.Sprintf("data keys %v, metadata %v", keys, resp["metadata"])
}
