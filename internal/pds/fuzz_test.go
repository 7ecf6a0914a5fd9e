package pds

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// FuzzValidateRecord: the check of every record knotless writes (the
// collection, key and value come from a user's object). It refuses with a
// *SpecError naming a field, never panics; what it accepts has an NSID, a
// record key and a "$type" equal to the collection, and the record it
// sends (recordMap, re-encoded) passes again.
func FuzzValidateRecord(f *testing.F) {
	const coll = "dev.knotless.test.note"
	for _, c := range [][3]string{
		{coll, "self", `{"name":"x","n":1,"list":[1,2,{"a":true}],"nested":{"b":null}}`},
		{coll, "3jzfcijpj2z2a", `{"$type":"` + coll + `","n":-9007199254740991}`},
		{coll, "a:b.c~d_e-f", `{"embed":{"$type":"app.bsky.embed.images"}}`},
		{coll, "a", `{"x":{"y":[0,1.5]}}`},
		{coll, "a", `{"n":9007199254740993,"m":-0,"s":"\u0000\ud800"}`},
		{coll, "a", `{"$type":1}`},
		{coll, "a", `{"a":} {}`},
		{"thing", "a/b", `[{"a":1}]`},
	} {
		f.Add(c[0], c[1], []byte(c[2]))
	}
	f.Fuzz(func(t *testing.T, collection, rkey string, value []byte) {
		m, err := recordMap(collection, rkey, value)
		if err != nil {
			var se *SpecError
			if !errors.As(err, &se) || se.Field == "" || se.Reason == "" {
				t.Fatalf("error %T %v, want a *SpecError naming a field", err, err)
			}
			return
		}
		if ValidateRecord(collection, rkey, value) != nil {
			t.Fatal("recordMap accepts what ValidateRecord refuses")
		}
		if _, err := syntax.ParseNSID(collection); err != nil {
			t.Fatalf("accepted collection %q: %v", collection, err)
		}
		if _, err := syntax.ParseRecordKey(rkey); err != nil {
			t.Fatalf("accepted key %q: %v", rkey, err)
		}
		if m["$type"] != collection {
			t.Fatalf("$type %v, collection %s", m["$type"], collection)
		}
		sent, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("accepted %q, which does not encode: %v", value, err)
		}
		if err := ValidateRecord(collection, rkey, sent); err != nil {
			t.Fatalf("accepted %q, but sends %q, which is invalid: %v", value, sent, err)
		}
	})
}
