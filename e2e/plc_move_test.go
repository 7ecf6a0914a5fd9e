package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
)

// movePDSEndpoint makes the DID document of did, an account of the
// suite's PDS, name endpoint as its PDS: an update operation signed with
// the PDS's PLC rotation key (which every account it creates lists) is
// sent to the suite's PLC. A repo reaches its PDS at the URL its DID
// document names, on that URL's port (pds.SameHost); a test that puts a
// proxy in front of the PDS on another port says so here, as an operator
// of a PDS behind a TLS terminator does, before the provider first reads
// the document.
//
// The account is deleted when the test ends: its document names a server
// that goes with the test, and a PDS's listing that names a repo whose
// PDS cannot be reached fails for every later watch of that PDS.
func movePDSEndpoint(ctx context.Context, t *testing.T, did, endpoint string) {
	t.Helper()
	t.Cleanup(func() { deleteAccount(t, did) })
	updatePLC(ctx, t, did, func(op map[string]any) {
		services, _ := op["services"].(map[string]any)
		pdsService, _ := services["atproto_pds"].(map[string]any)
		if pdsService == nil {
			t.Fatalf("the document of %s names no PDS: %v", did, op)
		}
		pdsService["endpoint"] = endpoint
	})
}

// updatePLC changes the DID document of did, an account of the suite's
// PDS: its last PLC operation, changed by change, is sent to the suite's
// PLC as the next one, signed with the PDS's PLC rotation key (which
// every account it creates lists).
func updatePLC(ctx context.Context, t *testing.T, did string, change func(op map[string]any)) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(env.pds.DataDir, "secrets.json"))
	if err != nil {
		t.Fatal(err)
	}
	var secrets struct {
		RotationKey string `json:"plcRotationKeyK256PrivateKeyHex"`
	}
	if err := json.Unmarshal(raw, &secrets); err != nil {
		t.Fatal(err)
	}
	keyBytes, err := hex.DecodeString(secrets.RotationKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := atcrypto.ParsePrivateBytesK256(keyBytes)
	if err != nil {
		t.Fatal(err)
	}

	var audit []struct {
		CID       string         `json:"cid"`
		Operation map[string]any `json:"operation"`
	}
	plcDo(ctx, t, http.MethodGet, env.plc.URL+"/"+did+"/log/audit", nil, &audit)
	if len(audit) == 0 {
		t.Fatalf("the PLC has no operation of %s", did)
	}
	last := audit[len(audit)-1]
	op := last.Operation
	change(op)
	delete(op, "sig")
	op["prev"] = last.CID
	signPLC(t, key, op)
	body, err := json.Marshal(op)
	if err != nil {
		t.Fatal(err)
	}
	plcDo(ctx, t, http.MethodPost, env.plc.URL+"/"+did, body, nil)
}

// plcDo sends one request to the suite's PLC and decodes its answer into
// out (when not nil).
func plcDo(ctx context.Context, t *testing.T, method, u string, body []byte, out any) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PLC %s %s: %s: %s", method, u, resp.Status, msg)
	}
	if out != nil {
		if err := json.Unmarshal(msg, out); err != nil {
			t.Fatalf("PLC %s %s: %v", method, u, err)
		}
	}
}

// signPLC signs the PLC operation op (without its sig) with key and sets
// its sig.
func signPLC(t *testing.T, key atcrypto.PrivateKey, op map[string]any) {
	t.Helper()
	unsigned, err := atdata.MarshalCBOR(op)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := key.HashAndSign(unsigned)
	if err != nil {
		t.Fatal(err)
	}
	op["sig"] = base64.RawURLEncoding.EncodeToString(sig)
}

// deleteAccount deletes did's account from the suite's PDS as its admin.
func deleteAccount(t *testing.T, did string) {
	t.Helper()
	body, err := json.Marshal(map[string]string{"did": did})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, env.pds.URL+"/xrpc/com.atproto.admin.deleteAccount", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.SetBasicAuth("admin", env.pds.AdminPassword)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("deleting the account %s: %v", did, err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		t.Errorf("deleting the account %s: %s: %s", did, resp.Status, msg)
	}
}
