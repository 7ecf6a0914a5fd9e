/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package lexicon

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestNoBreakingChangeSincePublished is CI's lexicon check: the
// lexicons of this tree against the version of record make
// lexicons-publish wrote (lexicons/published/). A breaking change must
// be a new NSID instead (docs/lexicons.md#evolution).
func TestNoBreakingChangeSincePublished(t *testing.T) {
	published, err := ReadPublished("../../lexicons/published")
	if err != nil {
		t.Fatal(err)
	}
	schemas, err := Schemas()
	if err != nil {
		t.Fatal(err)
	}
	if len(published) == 0 || len(schemas) == 0 {
		t.Fatalf("published %d schemas, the tree has %d: both must be there", len(published), len(schemas))
	}
	issues, err := Breaking(published, schemas)
	if err != nil {
		t.Fatal(err)
	}
	for _, is := range issues {
		t.Errorf("breaking change against lexicons/published: %s", is)
	}
}

// edit returns the schemas with nsid's schema changed by f (on its JSON
// as maps).
func edit(t *testing.T, schemas map[string][]byte, nsid string, f func(main map[string]any)) map[string][]byte {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(schemas[nsid], &doc); err != nil {
		t.Fatal(err)
	}
	f(doc["defs"].(map[string]any)["main"].(map[string]any))
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for k, v := range schemas {
		out[k] = v
	}
	out[nsid] = raw
	return out
}

func recordObject(main map[string]any) map[string]any {
	return main["record"].(map[string]any)
}

func properties(main map[string]any) map[string]any {
	return recordObject(main)["properties"].(map[string]any)
}

func TestBreakingChanges(t *testing.T) {
	schemas, err := Schemas()
	if err != nil {
		t.Fatal(err)
	}
	if issues, err := Breaking(schemas, schemas); err != nil || len(issues) != 0 {
		t.Fatalf("the tree against itself: %v %v", issues, err)
	}
	// A field of the bid every case below changes: the first required
	// string property.
	var field string
	edit(t, schemas, Bid, func(main map[string]any) {
		for _, r := range recordObject(main)["required"].([]any) {
			if p, _ := properties(main)[r.(string)].(map[string]any); p["type"] == "string" {
				field = r.(string)
				return
			}
		}
	})
	if field == "" {
		t.Fatal("the bid lexicon has no required string field to change")
	}
	cases := []struct {
		name     string
		after    map[string][]byte
		breaking string // "" = additive, passes
	}{
		{"field removed", edit(t, schemas, Bid, func(m map[string]any) {
			delete(properties(m), field)
			req := recordObject(m)["required"].([]any)
			recordObject(m)["required"] = removeString(req, field)
		}), "removed"},
		{"field renamed", edit(t, schemas, Bid, func(m map[string]any) {
			properties(m)[field+"Renamed"] = properties(m)[field]
			delete(properties(m), field)
			recordObject(m)["required"] = append(removeString(recordObject(m)["required"].([]any), field), field+"Renamed")
		}), "removed"},
		{"type narrowed (string to integer)", edit(t, schemas, Bid, func(m map[string]any) {
			properties(m)[field] = map[string]any{"type": "integer"}
		}), "type-change"},
		{"length narrowed", edit(t, schemas, Bid, func(m map[string]any) {
			properties(m)[field].(map[string]any)["maxLength"] = 3
		}), "string-length"},
		{"new required field", edit(t, schemas, Bid, func(m map[string]any) {
			properties(m)["newRequired"] = map[string]any{"type": "string"}
			recordObject(m)["required"] = append(recordObject(m)["required"].([]any), "newRequired")
		}), "object-required"},
		{"record key type changed", edit(t, schemas, Bid, func(m map[string]any) {
			m["key"] = "literal:self"
		}), "record-key-type"},
		{"NSID removed", func() map[string][]byte {
			out := edit(t, schemas, Bid, func(map[string]any) {})
			delete(out, Bid)
			return out
		}(), "removed"},
		{"new optional field", edit(t, schemas, Bid, func(m map[string]any) {
			properties(m)["note"] = map[string]any{"type": "string", "maxLength": 300}
		}), ""},
		{"new NSID", func() map[string][]byte {
			out := edit(t, schemas, Bid, func(map[string]any) {})
			out[Namespace+".example"] = []byte(`{"lexicon":1,"id":"dev.knotless.market.example","defs":{"main":{"type":"record","key":"tid","record":{"type":"object","properties":{"x":{"type":"string"}}}}}}`)
			return out
		}(), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			issues, err := Breaking(schemas, tc.after)
			if err != nil {
				t.Fatal(err)
			}
			joined := strings.Join(issues, "\n")
			switch {
			case tc.breaking == "" && len(issues) > 0:
				t.Errorf("an additive change was called breaking:\n%s", joined)
			case tc.breaking != "" && !strings.Contains(joined, tc.breaking):
				t.Errorf("want a breaking change %q, got:\n%s", tc.breaking, joined)
			}
		})
	}
}

func removeString(list []any, s string) []any {
	var out []any
	for _, v := range list {
		if v != s {
			out = append(out, v)
		}
	}
	return out
}

func TestAuthority(t *testing.T) {
	if got := Authority("dev.knotless.market.bid"); got != "market.knotless.dev" {
		t.Errorf("Authority = %q", got)
	}
}
