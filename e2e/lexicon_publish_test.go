package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	lex "github.com/bluesky-social/indigo/atproto/lexicon"

	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
)

// TestLexiconsPublish runs make lexicons-publish's command against the
// suite's PDS as the account of the NSIDs' authority: every lexicon is a
// com.atproto.lexicon.schema record there (a lexicon the reference PDS
// knows, so it validates the record on write), equal to the tree's file, and a catalog made only of the
// published records validates a market record; a second run changes
// nothing; a breaking change is refused and writes nothing.
func TestLexiconsPublish(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "lexpublish")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./hack/lexpublish")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./hack/lexpublish: %v: %s", err, out)
	}
	acct, err := env.pds.CreateAccount(ctx, env.prefix+"lex.test")
	if err != nil {
		t.Fatal(err)
	}
	pwFile := filepath.Join(dir, "app-password")
	if err := os.WriteFile(pwFile, []byte(acct.AppPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	published := filepath.Join(dir, "published")
	publish := func() string {
		t.Helper()
		cmd := exec.CommandContext(ctx, bin, "--pds", env.pds.URL, "--identifier", acct.Handle, "--app-password-file", pwFile,
			"--published", published, "--allow-private-networks", "127.0.0.1/32")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("lexpublish: %v:\n%s", err, out)
		}
		return string(out)
	}
	out := publish()
	t.Logf("lexpublish:\n%s", out)
	schemas, err := lexicon.Schemas()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `_lexicon.market.knotless.dev. TXT "did=`+acct.DID+`"`) {
		t.Errorf("no DNS TXT record for market.knotless.dev naming %s in the output", acct.DID)
	}

	catalog := lex.NewBaseCatalog()
	for nsid, want := range schemas {
		if !strings.Contains(out, nsid) || strings.Count(out, " published ") != len(schemas) {
			t.Errorf("%s: not reported published", nsid)
		}
		rec, err := getRecord(ctx, acct.DID, lexicon.SchemaCollection, nsid)
		if err != nil {
			t.Fatalf("%s: getRecord: %v", nsid, err)
		}
		var sf lex.SchemaFile
		if err := json.Unmarshal(rec.Value, &sf); err != nil {
			t.Fatalf("%s: the published record is no schema: %v", nsid, err)
		}
		if err := catalog.AddSchemaFile(sf); err != nil {
			t.Errorf("%s: the published schema does not load: %v", nsid, err)
		}
		var got, exp map[string]any
		_ = json.Unmarshal(rec.Value, &got)
		_ = json.Unmarshal(want, &exp)
		delete(got, "$type")
		gb, _ := json.Marshal(got)
		eb, _ := json.Marshal(exp)
		if string(gb) != string(eb) {
			t.Errorf("%s: the published schema differs from the tree's", nsid)
		}
		if file, err := os.ReadFile(filepath.Join(published, nsid+".json")); err != nil || string(file) != string(want) {
			t.Errorf("%s: not written to --published: %v", nsid, err)
		}
	}
	// The standard schemas the market's refer to come from the tree (the
	// PDS publishes com.atproto's, not this account).
	if err := catalog.AddSchemaFile(mustSchema(t, repo, "lexicons/com/atproto/repo/strongRef.json")); err != nil {
		t.Fatal(err)
	}
	association := map[string]any{"$type": lexicon.Association, "subject": acct.DID, "roles": []any{"bidder"}, "createdAt": time.Now().UTC().Format("2006-01-02T15:04:05.000Z")}
	if err := lex.ValidateRecord(catalog, association, lexicon.Association, lex.StrictRecursiveValidation); err != nil {
		t.Errorf("a catalog of the published schemas does not validate an association record: %v", err)
	}

	if out := publish(); strings.Contains(out, " published ") || strings.Count(out, " unchanged ") != len(schemas) {
		t.Errorf("a second run must change nothing:\n%s", out)
	}

	// A breaking change (the bid's price removed) is refused against
	// the published version, and no record changes.
	loopback, err := netpolicy.ParsePrefixes("127.0.0.1/32")
	if err != nil {
		t.Fatal(err)
	}
	c, err := pds.Connect(ctx, env.pds.URL, acct.Handle, acct.AppPassword, pds.Options{Policy: netpolicy.New(loopback, nil), Store: &pds.MemoryStore{}})
	if err != nil {
		t.Fatal(err)
	}
	before, err := getRecord(ctx, acct.DID, lexicon.SchemaCollection, lexicon.Bid)
	if err != nil {
		t.Fatal(err)
	}
	broken := map[string][]byte{}
	for k, v := range schemas {
		broken[k] = v
	}
	var bid map[string]any
	_ = json.Unmarshal(schemas[lexicon.Bid], &bid)
	record := bid["defs"].(map[string]any)["main"].(map[string]any)["record"].(map[string]any)
	delete(record["properties"].(map[string]any), "pricePerHour")
	record["required"] = []any{"request", "validUntil", "createdAt"}
	broken[lexicon.Bid], _ = json.Marshal(bid)
	if _, err := lexicon.Publish(ctx, c, broken); !errors.Is(err, lexicon.ErrBreaking) {
		t.Fatalf("publishing a bid without its price: want ErrBreaking, got %v", err)
	} else {
		t.Logf("refused: %v", err)
	}
	after, err := getRecord(ctx, acct.DID, lexicon.SchemaCollection, lexicon.Bid)
	if err != nil {
		t.Fatal(err)
	}
	if after.CID != before.CID {
		t.Errorf("the refused publish changed the bid's schema record (%s → %s)", before.CID, after.CID)
	}
}

func mustSchema(t *testing.T, repo, path string) lex.SchemaFile {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repo, path))
	if err != nil {
		t.Fatal(err)
	}
	var sf lex.SchemaFile
	if err := json.Unmarshal(raw, &sf); err != nil {
		t.Fatal(err)
	}
	return sf
}
