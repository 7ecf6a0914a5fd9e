/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package lexicon

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"unicode/utf8"

	"github.com/knotless-dev/knotless/internal/pds"
)

// FuzzValidateRecord: whatever a firehose or a listing sends, ValidateRecord
// answers without panicking, with a bounded *Error when it refuses; what it
// accepts is one JSON object within the limits, of its collection, and
// stays valid as every consumer decodes it (encoding/json, last key wins):
// re-encoded, it validates again.
func FuzzValidateRecord(f *testing.F) {
	f.Add(Association, []byte(attackBase+`}`))
	f.Add(Association, []byte(attackBase+`,"$type":"dev.knotless.market.bid"}`))
	f.Add(Association, []byte(`{"subject":"not a did",`+attackBase[1:]+`}`))
	f.Add(Association, []byte(attackBase+`,"x":{"y":[{"z":null}]},"s":"\\\"{{{"}`))
	f.Add(Association, []byte(attackBase+`,"x":9007199254740991,"y":"\ud800"}`))
	f.Add(Bid, []byte(attackBase+`}`))
	f.Add("dev.knotless.market.", []byte(`{}`))
	if doc, err := os.ReadFile("../../docs/lexicons.md"); err == nil {
		for _, m := range jsonBlock.FindAllSubmatch(doc, -1) {
			var head struct {
				Type string `json:"$type"`
			}
			_ = json.Unmarshal(m[1], &head)
			f.Add(head.Type, m[1])
		}
	}
	f.Fuzz(func(t *testing.T, collection string, value []byte) {
		err := ValidateRecord(collection, value)
		if err != nil {
			var lerr *Error
			if !errors.As(err, &lerr) {
				t.Fatalf("error %T %v, want *lexicon.Error", err, err)
			}
			if len(lerr.Reason) > maxReason || len(lerr.Collection) > maxNSID {
				t.Fatalf("error of %d+%d bytes", len(lerr.Collection), len(lerr.Reason))
			}
			if !utf8.ValidString(lerr.Reason) && utf8.ValidString(collection) && utf8.Valid(value) {
				t.Fatalf("reason %q is not UTF-8", lerr.Reason)
			}
			return
		}
		checkAccepted(t, collection, value)
	})
}

// checkAccepted asserts what ValidateRecord promises of a record it took.
func checkAccepted(t *testing.T, collection string, value []byte) {
	t.Helper()
	if !Known(collection) {
		t.Fatalf("accepted a record of %q, not a market record type", collection)
	}
	if len(value) > MaxRecordBytes || !utf8.Valid(value) || depth(value) > maxDepth || !json.Valid(value) {
		t.Fatalf("accepted %d bytes outside the limits", len(value))
	}
	if err := pds.CheckValue(value); err != nil {
		t.Fatalf("accepted a value the PDS client refuses: %v", err)
	}
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("accepted a value that is not an object: %v", err)
	}
	if typ, ok := m["$type"]; ok && typ != collection {
		t.Fatalf("accepted $type %v as %s", typ, collection)
	}
	again, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := ValidateRecord(collection, again); err != nil {
		t.Fatalf("accepted %q, but a consumer decodes %q, which is invalid: %v", value, again, err)
	}
}
