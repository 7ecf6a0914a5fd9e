/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package lexicon

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	lex "github.com/bluesky-social/indigo/atproto/lexicon"

	"github.com/knotless-dev/knotless/lexicons"
)

// records lists every record NSID constant.
var records = []string{Presence, Association, Request, Bid, Accept, Lease, Release, Reclaim, GatewayAssociation, GatewaySSH, SSHKeys}

const (
	defsNSID      = Namespace + ".defs"
	strongRefNSID = "com.atproto.repo.strongRef"
)

// embeddedFiles returns the JSON files of lexicons.FS.
func embeddedFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := fs.WalkDir(lexicons.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".json") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func readSchemaFile(t *testing.T, p string) lex.SchemaFile {
	t.Helper()
	b, err := lexicons.FS.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var sf lex.SchemaFile
	if err := json.Unmarshal(b, &sf); err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return sf
}

// TestEmbeddedMatchesDisk guards the //go:embed patterns: a JSON file added
// under lexicons/ in a directory they do not cover would be left out.
// lexicons/published/ is not embedded: it is the version of record the
// tree is checked against (publish.go).
func TestEmbeddedMatchesDisk(t *testing.T) {
	var onDisk []string
	err := fs.WalkDir(os.DirFS("../../lexicons"), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p == "published" {
			return fs.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".json") {
			onDisk = append(onDisk, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	embedded := embeddedFiles(t)
	slices.Sort(onDisk)
	slices.Sort(embedded)
	if !slices.Equal(onDisk, embedded) {
		t.Errorf("lexicons/ has %v, lexicons.FS embeds %v: fix the //go:embed line", onDisk, embedded)
	}
}

// TestSchemaFilesLoad loads every file on its own into a fresh catalog
// (with only the files it depends on) and resolves every ref in it.
func TestSchemaFilesLoad(t *testing.T) {
	files := embeddedFiles(t)
	if len(files) != len(records)+2 {
		t.Errorf("got %d lexicon files, want %d (the records, defs, strongRef): %v", len(files), len(records)+2, files)
	}
	for _, p := range files {
		t.Run(p, func(t *testing.T) {
			b, err := lexicons.FS.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			var sf lex.SchemaFile
			if err := json.Unmarshal(b, &sf); err != nil {
				t.Fatalf("parse: %v", err)
			}
			if sf.Lexicon != 1 {
				t.Errorf("lexicon = %d, want 1", sf.Lexicon)
			}
			if want := strings.ReplaceAll(sf.ID, ".", "/") + ".json"; p != want {
				t.Errorf("file of %s is %s, want %s", sf.ID, p, want)
			}

			cat := lex.NewBaseCatalog()
			for _, dep := range []string{strongRefNSID, defsNSID} {
				if dep == sf.ID {
					continue
				}
				if err := cat.AddSchemaFile(readSchemaFile(t, strings.ReplaceAll(dep, ".", "/")+".json")); err != nil {
					t.Fatalf("add %s: %v", dep, err)
				}
			}
			if err := cat.AddSchemaFile(sf); err != nil {
				t.Fatalf("add: %v", err)
			}

			var raw any
			if err := json.Unmarshal(b, &raw); err != nil {
				t.Fatal(err)
			}
			walkSchema(raw, "", func(node map[string]any, where string) {
				if node["type"] != "ref" {
					return
				}
				ref, _ := node["ref"].(string)
				if strings.HasPrefix(ref, "#") {
					ref = sf.ID + ref
				}
				if _, err := cat.Resolve(ref); err != nil {
					t.Errorf("%s: ref %q: %v", where, ref, err)
				}
			})
		})
	}
}

// walkSchema calls f on every schema node (a JSON object with a "type")
// of a lexicon file, with its path.
func walkSchema(v any, where string, f func(node map[string]any, where string)) {
	switch v := v.(type) {
	case map[string]any:
		if _, ok := v["type"].(string); ok {
			f(v, where)
		}
		for k, c := range v {
			walkSchema(c, where+"/"+k, f)
		}
	case []any:
		for _, c := range v {
			walkSchema(c, where+"/[]", f)
		}
	}
}

// TestSchemaConventions checks the rules every market lexicon follows:
// every def and property has a description, every string is bounded
// (maxLength or a format), every integer has a minimum, every record has a
// required createdAt datetime.
func TestSchemaConventions(t *testing.T) {
	for _, p := range embeddedFiles(t) {
		b, err := lexicons.FS.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var raw map[string]any
		if err := json.Unmarshal(b, &raw); err != nil {
			t.Fatal(err)
		}
		walkSchema(raw, p, func(node map[string]any, where string) {
			// the object under a record def is described by the def
			if d, _ := node["description"].(string); d == "" && !strings.HasSuffix(where, "/main/record") {
				t.Errorf("%s: no description", where)
			}
			switch node["type"] {
			case "string":
				_, hasMax := node["maxLength"]
				_, hasFormat := node["format"]
				if !hasMax && !hasFormat {
					t.Errorf("%s: string without maxLength or format", where)
				}
			case "integer":
				if _, ok := node["minimum"]; !ok {
					t.Errorf("%s: integer without minimum", where)
				}
			case "record":
				if k := node["key"]; k != "any" && k != "tid" {
					t.Errorf("%s: key %v, want any or tid", where, k)
				}
				rec, _ := node["record"].(map[string]any)
				req, _ := rec["required"].([]any)
				if !slices.Contains(req, any("createdAt")) {
					t.Errorf("%s: createdAt is not required", where)
				}
				props, _ := rec["properties"].(map[string]any)
				ca, _ := props["createdAt"].(map[string]any)
				if ca["type"] != "string" || ca["format"] != "datetime" {
					t.Errorf("%s: createdAt is not a datetime string: %v", where, ca)
				}
			}
		})
	}
}

func TestCatalogRecords(t *testing.T) {
	for _, nsid := range records {
		s, err := Catalog().Resolve(nsid)
		if err != nil {
			t.Errorf("%s: %v", nsid, err)
			continue
		}
		if _, ok := s.Def.(lex.SchemaRecord); !ok {
			t.Errorf("%s: %T, want a record schema", nsid, s.Def)
		}
		if !Known(nsid) {
			t.Errorf("Known(%s) = false", nsid)
		}
	}
	for _, nsid := range []string{defsNSID, strongRefNSID, Namespace + ".nope", "app.bsky.feed.post", "", "not an nsid"} {
		if Known(nsid) {
			t.Errorf("Known(%q) = true", nsid)
		}
	}
}

const (
	testDID  = "did:plc:ewvi7nxzyoun6zhxrhs64oiz"
	testCID  = "bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a"
	testTime = "2026-06-01T12:00:00.000Z"
)

func strongRef(collection string) map[string]any {
	return map[string]any{"uri": "at://" + testDID + "/" + collection + "/3lbdqbrdkys2a", "cid": testCID}
}

func price(amount int) map[string]any {
	return map[string]any{"amount": amount, "currency": "USD-cents"}
}

func shape() map[string]any {
	return map[string]any{"cpuMillis": 2000, "memoryMiB": 4096, "name": "medium"}
}

// goodRecords holds one valid record per kind, without $type.
func goodRecords() map[string]map[string]any {
	return map[string]map[string]any{
		Presence: {
			"offers": []any{map[string]any{
				"shape": shape(), "pricePerHour": price(12), "capacity": 4, "free": 3,
			}},
			"driver":            "process",
			"acceptingRequests": true,
			"network":           "dev.knotless.example/main",
			"updatedAt":         testTime,
			"createdAt":         testTime,
		},
		Association: {
			"subject":   testDID,
			"roles":     []any{"bidder", "requester"},
			"createdAt": testTime,
		},
		GatewaySSH: {
			"lease":      strongRef(Lease),
			"namespaces": []any{"web"},
			"createdAt":  testTime,
		},
		SSHKeys: {
			"keys":      []any{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIlR5lW4p4tmXOmFpBEVj0aGB0+KYHa4ovBkTb9ghh3h alice@laptop"},
			"createdAt": testTime,
		},
		GatewayAssociation: {
			"hostname":  "shop.example.com",
			"lease":     strongRef(Lease),
			"service":   map[string]any{"namespace": "web", "name": "shop", "port": 80},
			"createdAt": testTime,
		},
		Request: {
			"shape":           shape(),
			"maxPricePerHour": price(20),
			"bidDeadline":     testTime,
			"noticeSeconds":   3600,
			"replicaIndex":    0,
			"createdAt":       testTime,
		},
		Bid: {
			"request":      strongRef(Request),
			"pricePerHour": price(12),
			"validUntil":   testTime,
			"driver":       "process",
			"createdAt":    testTime,
		},
		Accept: {
			"bid":       strongRef(Bid),
			"request":   strongRef(Request),
			"confirmBy": testTime,
			"createdAt": testTime,
		},
		Lease: {
			"accept":        strongRef(Accept),
			"state":         "running",
			"caFingerprint": "sha256:" + strings.Repeat("ab", 32),
			"caBundle":      "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
			"endpoint":      "https://tenant.example:6443/clusters/root",
			"serviceId":     "did:plc:bidder#knotless_tenant_abc",
			"updatedAt":     testTime,
			"createdAt":     testTime,
		},
		Release: {
			"lease":     strongRef(Lease),
			"reason":    "replicas-lowered",
			"createdAt": testTime,
		},
		Reclaim: {
			"lease":          strongRef(Lease),
			"reason":         "maintenance",
			"terminateAfter": testTime,
			"createdAt":      testTime,
		},
	}
}

// set sets the value at a /-separated path (array indexes as numbers) in
// a decoded JSON document; a nil value deletes the key.
func set(t *testing.T, doc map[string]any, p string, v any) {
	t.Helper()
	keys := strings.Split(p, "/")
	var cur any = doc
	for _, k := range keys[:len(keys)-1] {
		switch c := cur.(type) {
		case map[string]any:
			cur = c[k]
		case []any:
			cur = c[0]
		}
	}
	m, ok := cur.(map[string]any)
	if !ok {
		t.Fatalf("set %s: parent is %T", p, cur)
	}
	last := keys[len(keys)-1]
	if v == nil {
		if _, ok := m[last]; !ok {
			t.Fatalf("set %s: no such field", p)
		}
		delete(m, last)
		return
	}
	m[last] = v
}

// mutated returns the JSON of the good record of collection, with $type
// set (when typ is not empty) and changed by edit.
func mutated(t *testing.T, collection, typ string, edit func(map[string]any)) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(goodRecords()[collection])
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if typ != "" {
		doc["$type"] = typ
	}
	if edit != nil {
		edit(doc)
	}
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestValidateRecordGood(t *testing.T) {
	if n := len(goodRecords()); n != len(records) {
		t.Fatalf("goodRecords has %d kinds, want %d", n, len(records))
	}
	for _, c := range records {
		for _, typ := range []string{"", c} {
			if err := ValidateRecord(c, mutated(t, c, typ, nil)); err != nil {
				t.Errorf("%s ($type %q): %v", c, typ, err)
			}
		}
	}
}

// TestValidateRecordOpenValues pins down what the validator lets through
// on purpose: values outside knownValues (an open set in lexicons) and
// fields no lexicon declares. Code acting on such fields must handle
// unknown values itself.
func TestValidateRecordOpenValues(t *testing.T) {
	cases := []struct {
		name, collection string
		edit             func(map[string]any)
	}{
		{"unknown lease state", Lease, func(d map[string]any) { d["state"] = "exploded" }},
		{"unknown driver", Presence, func(d map[string]any) { d["driver"] = "firecracker" }},
		{"unknown role", Association, func(d map[string]any) { d["roles"] = []any{"auditor"} }},
		{"extra field", Bid, func(d map[string]any) { d["comment"] = "hi" }},
	}
	for _, tc := range cases {
		if err := ValidateRecord(tc.collection, mutated(t, tc.collection, "", tc.edit)); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

type badCase struct {
	name       string
	collection string
	edit       func(t *testing.T, doc map[string]any)
	raw        string // the record JSON, instead of an edit of a good record
}

func del(p string) func(t *testing.T, doc map[string]any) {
	return func(t *testing.T, doc map[string]any) { set(t, doc, p, nil) }
}

func put(p string, v any) func(t *testing.T, doc map[string]any) {
	return func(t *testing.T, doc map[string]any) { set(t, doc, p, v) }
}

func badCases() []badCase {
	cases := []badCase{
		// presence
		{"missing offers", Presence, del("offers"), ""},
		{"missing acceptingRequests", Presence, del("acceptingRequests"), ""},
		{"missing offer capacity", Presence, del("offers/0/capacity"), ""},
		{"float price", Presence, put("offers/0/pricePerHour/amount", 1.5), ""},
		{"negative amount", Presence, put("offers/0/pricePerHour/amount", -1), ""},
		{"negative free", Presence, put("offers/0/free", -1), ""},
		{"zero cpu", Presence, put("offers/0/shape/cpuMillis", 0), ""},
		{"long currency", Presence, put("offers/0/pricePerHour/currency", strings.Repeat("c", 33)), ""},
		{"long driver", Presence, put("driver", strings.Repeat("d", 65)), ""},
		{"long network", Presence, put("network", strings.Repeat("n", 254)), ""},
		{"too many offers", Presence, func(t *testing.T, doc map[string]any) {
			offers := doc["offers"].([]any)
			for len(offers) <= 32 {
				offers = append(offers, offers[0])
			}
			doc["offers"] = offers
		}, ""},
		{"acceptingRequests not a boolean", Presence, put("acceptingRequests", "yes"), ""},
		{"bad updatedAt", Presence, put("updatedAt", "2026-06-01 12:00:00"), ""},
		// association
		{"missing subject", Association, del("subject"), ""},
		{"bad DID", Association, put("subject", "plc:ewvi7nxzyoun6zhxrhs64oiz"), ""},
		{"no roles", Association, put("roles", []any{}), ""},
		{"four roles", Association, put("roles", []any{"bidder", "requester", "operator", "bidder"}), ""},
		{"long role", Association, put("roles", []any{strings.Repeat("r", 33)}), ""},
		// request
		{"missing shape", Request, del("shape"), ""},
		{"missing memory", Request, del("shape/memoryMiB"), ""},
		{"float max price", Request, put("maxPricePerHour/amount", 1.5), ""},
		{"negative max price", Request, put("maxPricePerHour/amount", -5), ""},
		{"missing currency", Request, del("maxPricePerHour/currency"), ""},
		{"negative notice", Request, put("noticeSeconds", -1), ""},
		{"negative replicaIndex", Request, put("replicaIndex", -1), ""},
		{"long shape name", Request, put("shape/name", strings.Repeat("s", 64)), ""},
		{"bad bidDeadline", Request, put("bidDeadline", "tomorrow"), ""},
		{"datetime without timezone", Request, put("bidDeadline", "2026-06-01T12:00:00"), ""},
		// bid
		{"missing request", Bid, del("request"), ""},
		{"missing strongRef cid", Bid, del("request/cid"), ""},
		{"bad at-uri", Bid, put("request/uri", "https://example.com/dev.knotless.market.request/3lbdqbrdkys2a"), ""},
		{"bad cid", Bid, put("request/cid", "not a cid!"), ""},
		{"float bid price", Bid, put("pricePerHour/amount", 1.5), ""},
		{"negative bid price", Bid, put("pricePerHour/amount", -1), ""},
		{"bad validUntil", Bid, put("validUntil", "2026-13-01T12:00:00Z"), ""},
		// accept
		{"missing bid", Accept, del("bid"), ""},
		{"missing confirmBy", Accept, del("confirmBy"), ""},
		{"bad bid at-uri", Accept, put("bid/uri", "at://"+testDID+"/dev.knotless.market.bid/bad key"), ""},
		{"bad confirmBy", Accept, put("confirmBy", "1717243200"), ""},
		// lease
		{"missing state", Lease, del("state"), ""},
		{"missing accept", Lease, del("accept"), ""},
		{"bad accept at-uri", Lease, put("accept/uri", "at:///dev.knotless.market.accept/3lbdqbrdkys2a"), ""},
		{"long caFingerprint", Lease, put("caFingerprint", "sha256:"+strings.Repeat("ab", 50)), ""},
		{"endpoint not a URI", Lease, put("endpoint", "not a uri"), ""},
		{"long endpoint", Lease, put("endpoint", "https://x.example/"+strings.Repeat("a", 2048)), ""},
		{"long serviceId", Lease, put("serviceId", strings.Repeat("x", 513)), ""},
		{"long caBundle", Lease, put("caBundle", strings.Repeat("x", 16385)), ""},
		{"long reason", Lease, put("reason", strings.Repeat("x", 65)), ""},
		{"state not a string", Lease, put("state", 1), ""},
		// release
		{"missing reason", Release, del("reason"), ""},
		{"missing lease", Release, del("lease"), ""},
		{"bad lease at-uri", Release, put("lease/uri", "at://not a did/dev.knotless.market.lease/3lbdqbrdkys2a"), ""},
		{"long release reason", Release, put("reason", strings.Repeat("x", 65)), ""},
		// reclaim
		{"missing terminateAfter", Reclaim, del("terminateAfter"), ""},
		{"bad terminateAfter", Reclaim, put("terminateAfter", "2026-06-01T12:00:00-00:00"), ""},
		{"bad lease cid", Reclaim, put("lease/cid", "Qmb"+strings.Repeat("a", 43)), ""},
		{"long reclaim reason", Reclaim, put("reason", strings.Repeat("x", 65)), ""},
		// not JSON objects, or not ATProto data
		{"array", Bid, nil, `[]`},
		{"null", Bid, nil, `null`},
		{"number", Bid, nil, `5`},
		{"empty", Bid, nil, ``},
		{"invalid JSON", Bid, nil, `{"request":`},
		{"empty $type", Bid, nil, `{"$type": ""}`},
		{"$type not a string", Bid, nil, `{"$type": 1}`},
		{"too large", Bid, nil, `{"x": "` + strings.Repeat("x", 2<<20) + `"}`},
	}
	// every kind: no createdAt, a bad createdAt, another kind's $type, a
	// $type outside the namespace
	for _, c := range records {
		other := Presence
		if c == Presence {
			other = Lease
		}
		cases = append(cases,
			badCase{"missing createdAt", c, del("createdAt"), ""},
			badCase{"bad createdAt", c, put("createdAt", "yesterday"), ""},
			badCase{"wrong $type", c, put("$type", other), ""},
			badCase{"foreign $type", c, put("$type", "app.bsky.feed.post"), ""},
		)
	}
	return cases
}

func TestValidateRecordBad(t *testing.T) {
	for _, tc := range badCases() {
		t.Run(tc.collection+"/"+tc.name, func(t *testing.T) {
			rec := json.RawMessage(tc.raw)
			if tc.edit != nil {
				rec = mutated(t, tc.collection, "", func(doc map[string]any) { tc.edit(t, doc) })
			}
			err := ValidateRecord(tc.collection, rec)
			var lerr *Error
			if !errors.As(err, &lerr) {
				t.Fatalf("got %v (%T), want *Error", err, err)
			}
			if lerr.Collection != tc.collection {
				t.Errorf("Collection = %q, want %q", lerr.Collection, tc.collection)
			}
			if lerr.Reason == "" || len(lerr.Reason) > maxReason {
				t.Errorf("Reason %q: empty or longer than %d", lerr.Reason, maxReason)
			}
			if want := "record does not match lexicon " + tc.collection + ": "; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("Error() = %q, want prefix %q", err.Error(), want)
			}
			t.Log(err)
		})
	}
}

// TestValidateRecordNumbers: atdata alone would take 1.0 and 1e1 for
// integers and round integers beyond 2^53; ValidateRecord refuses them,
// naming the field.
func TestValidateRecordNumbers(t *testing.T) {
	good := string(mutated(t, Presence, "", nil))
	if !strings.Contains(good, `"amount":12`) {
		t.Fatalf("no amount 12 in %s", good)
	}
	for _, lit := range []string{"1.5", "12.0", "1.2e1", "1E1", "9007199254740992", "-9007199254740992", "99999999999999999999"} {
		rec := strings.Replace(good, `"amount":12`, `"amount":`+lit, 1)
		err := ValidateRecord(Presence, json.RawMessage(rec))
		var lerr *Error
		if !errors.As(err, &lerr) {
			t.Errorf("amount %s: got %v, want *Error", lit, err)
			continue
		}
		if !strings.Contains(lerr.Reason, "offers[0].pricePerHour.amount") {
			t.Errorf("amount %s: reason %q does not name the field", lit, lerr.Reason)
		}
	}
	for _, lit := range []string{"0", "9007199254740991"} {
		rec := strings.Replace(good, `"amount":12`, `"amount":`+lit, 1)
		if err := ValidateRecord(Presence, json.RawMessage(rec)); err != nil {
			t.Errorf("amount %s: %v", lit, err)
		}
	}
}

func TestValidateRecordCollections(t *testing.T) {
	good := mutated(t, Bid, "", nil)
	for _, c := range []string{
		"app.bsky.feed.post",   // outside the namespace
		Namespace + ".nope",    // in the namespace, no lexicon
		defsNSID,               // a lexicon, not a record
		strongRefNSID,          // a lexicon, not a record, not in the namespace
		"",                     // not an NSID
		"dev.knotless.market.", // not an NSID
		strings.Repeat("a.", 1000) + "b",
	} {
		err := ValidateRecord(c, good)
		var lerr *Error
		if !errors.As(err, &lerr) {
			t.Errorf("%q: got %v, want *Error", c, err)
			continue
		}
		if len(lerr.Collection) > maxNSID {
			t.Errorf("%q: Collection is %d bytes", c, len(lerr.Collection))
		}
	}
}

// TestValidateRecordReasonCapped feeds values indigo quotes in its
// messages.
func TestValidateRecordReasonCapped(t *testing.T) {
	long := strings.Repeat("x", 5000)
	for name, rec := range map[string]json.RawMessage{
		"at-uri authority": mutated(t, Bid, "", func(d map[string]any) {
			set(t, d, "request/uri", "at://"+long+".example/dev.knotless.market.request/3lbdqbrdkys2a")
		}),
		"$type": mutated(t, Bid, "dev.knotless.market."+long, nil),
		"at-uri collection": mutated(t, Bid, "", func(d map[string]any) {
			set(t, d, "request/uri", "at://"+testDID+"/"+long+"/3lbdqbrdkys2a")
		}),
	} {
		err := ValidateRecord(Bid, rec)
		var lerr *Error
		if !errors.As(err, &lerr) {
			t.Errorf("%s: got %v, want *Error", name, err)
			continue
		}
		if len(lerr.Reason) > maxReason {
			t.Errorf("%s: Reason is %d bytes", name, len(lerr.Reason))
		}
		t.Logf("%s: %v", name, err)
	}
}

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"0123456789", 10, "0123456789"},
		{"0123456789ab", 10, "0123456..."},
		{"012345€789", 10, "012345€789"[:6] + "..."},
	} {
		got := truncate(tc.in, tc.n)
		if got != tc.want {
			t.Errorf("truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
		if len(got) > tc.n {
			t.Errorf("truncate(%q, %d) is %d bytes", tc.in, tc.n, len(got))
		}
	}
}

// TestHostileShapes: a record nested thousands of levels deep or larger
// than MaxRecordBytes is refused before it is decoded, and cheaply.
func TestHostileShapes(t *testing.T) {
	deep := `{"$type":"dev.knotless.market.association","subject":"did:plc:ewvi7nxzyoun6zhxrhs64oiz","roles":["bidder"],"createdAt":"2026-12-01T00:00:00Z","x":` +
		strings.Repeat(`{"a":`, 5000) + "1" + strings.Repeat("}", 5000) + "}"
	start := time.Now()
	err := ValidateRecord(Association, json.RawMessage(deep))
	if err == nil || !strings.Contains(err.Error(), "nested deeper") {
		t.Fatalf("deep record: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Logf("a deep record took %s to refuse", took)
	}
	big := `{"$type":"dev.knotless.market.association","subject":"did:plc:ewvi7nxzyoun6zhxrhs64oiz","roles":["bidder"],"createdAt":"2026-12-01T00:00:00Z","pad":"` +
		strings.Repeat("x", MaxRecordBytes) + `"}`
	if err := ValidateRecord(Association, json.RawMessage(big)); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("big record: %v", err)
	}
	// Brackets inside strings do not count as nesting.
	ok := `{"$type":"dev.knotless.market.association","subject":"did:plc:ewvi7nxzyoun6zhxrhs64oiz","roles":["bidder"],"createdAt":"2026-12-01T00:00:00Z","note":"` +
		strings.Repeat("{[", 100) + `\"` + `"}`
	if err := ValidateRecord(Association, json.RawMessage(ok)); err != nil {
		t.Fatalf("brackets in a string: %v", err)
	}
}
