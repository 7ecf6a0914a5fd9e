/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package lexicon

import (
	"encoding/json"
	"os"
	"regexp"
	"testing"
)

// jsonBlock matches a ```json fenced block of a Markdown file.
var jsonBlock = regexp.MustCompile("(?ms)^```json[ \t]*\n(.*?)^```[ \t]*$")

// TestDocExamples validates every ```json block of docs/lexicons.md as the
// record its "$type" names, and requires an example of every record type.
func TestDocExamples(t *testing.T) {
	doc, err := os.ReadFile("../../docs/lexicons.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := jsonBlock.FindAllSubmatch(doc, -1)
	if len(blocks) == 0 {
		t.Fatal("docs/lexicons.md has no ```json blocks")
	}
	seen := map[string]int{}
	for i, m := range blocks {
		var head struct {
			Type string `json:"$type"`
		}
		if err := json.Unmarshal(m[1], &head); err != nil {
			t.Errorf("block %d: not JSON: %v\n%s", i+1, err, m[1])
			continue
		}
		if head.Type == "" {
			t.Errorf("block %d: no $type\n%s", i+1, m[1])
			continue
		}
		seen[head.Type]++
		if err := ValidateRecord(head.Type, m[1]); err != nil {
			t.Errorf("block %d (%s): %v", i+1, head.Type, err)
		}
	}
	for _, c := range records {
		if seen[c] == 0 {
			t.Errorf("docs/lexicons.md has no example of %s", c)
		}
	}
}
