package pds_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/knotless-dev/knotless/internal/pds"
)

func TestValidateRecord(t *testing.T) {
	for _, tc := range []struct {
		name, collection, rkey, value string
		field                         string // "" = valid
	}{
		{"valid", coll, "self", `{"name":"x","n":1,"list":[1,2,{"a":true}],"nested":{"b":null}}`, ""},
		{"valid with $type", coll, "3jzfcijpj2z2a", `{"$type":"` + coll + `","n":-9007199254740991}`, ""},
		{"valid empty object", coll, "a:b.c~d_e-f", `{}`, ""},
		{"nested $type is free", coll, "a", `{"embed":{"$type":"app.bsky.embed.images"}}`, ""},
		{"invalid NSID", "not an nsid", "a", `{}`, "collection"},
		{"NSID with one segment", "thing", "a", `{}`, "collection"},
		{"invalid rkey with slash", coll, "a/b", `{}`, "rkey"},
		{"rkey dot", coll, ".", `{}`, "rkey"},
		{"empty rkey", coll, "", `{}`, "rkey"},
		{"float", coll, "a", `{"x":{"y":[0,1.5]}}`, "value.x.y[1]"},
		{"exponent is a float", coll, "a", `{"x":1e3}`, "value.x"},
		{"2^53+1", coll, "a", `{"n":9007199254740993}`, "value.n"},
		{"2^53", coll, "a", `{"n":9007199254740992}`, "value.n"},
		{"-(2^53+1)", coll, "a", `{"n":-9007199254740993}`, "value.n"},
		{"beyond int64", coll, "a", `{"n":123456789012345678901234567890}`, "value.n"},
		{"$type mismatch", coll, "a", `{"$type":"dev.knotless.other"}`, "value.$type"},
		{"$type not a string", coll, "a", `{"$type":1}`, "value.$type"},
		{"array", coll, "a", `[{"a":1}]`, "value"},
		{"string", coll, "a", `"x"`, "value"},
		{"null", coll, "a", `null`, "value"},
		{"empty", coll, "a", ``, "value"},
		{"invalid JSON", coll, "a", `{"a":}`, "value.a"},
		{"trailing data", coll, "a", `{} {}`, "value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := pds.ValidateRecord(tc.collection, tc.rkey, json.RawMessage(tc.value))
			if tc.field == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			var se *pds.SpecError
			if !errors.As(err, &se) {
				t.Fatalf("want *SpecError on %s, got %v", tc.field, err)
			}
			if se.Field != tc.field || se.Reason == "" {
				t.Fatalf("got field %q reason %q, want field %q", se.Field, se.Reason, tc.field)
			}
		})
	}
}

func TestValidateDIDAndHandle(t *testing.T) {
	for _, s := range []string{"did:plc:abc123", "did:web:example.com"} {
		if err := pds.ValidateDID(s); err != nil {
			t.Errorf("ValidateDID(%q) = %v", s, err)
		}
		if err := pds.ValidateHandleOrDID(s); err != nil {
			t.Errorf("ValidateHandleOrDID(%q) = %v", s, err)
		}
	}
	for _, s := range []string{"", "alice.test", "did:", "did:plc", "DID:plc:abc"} {
		var se *pds.SpecError
		if err := pds.ValidateDID(s); !errors.As(err, &se) {
			t.Errorf("ValidateDID(%q) = %v, want SpecError", s, err)
		}
	}
	if err := pds.ValidateHandleOrDID("alice.test"); err != nil {
		t.Errorf("ValidateHandleOrDID(alice.test) = %v", err)
	}
	for _, s := range []string{"", "alice", "-bad.test", "a..b", "did:"} {
		var se *pds.SpecError
		if err := pds.ValidateHandleOrDID(s); !errors.As(err, &se) {
			t.Errorf("ValidateHandleOrDID(%q) = %v, want SpecError", s, err)
		}
	}
}
