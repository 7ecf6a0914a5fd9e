/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package lexicon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	lex "github.com/bluesky-social/indigo/atproto/lexicon"
	"github.com/bluesky-social/indigo/lex/lexlint"

	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/lexicons"
)

// SchemaCollection is where ATProto publishes a lexicon: one record per
// NSID (record key = the NSID) in the repo of the account that controls
// the NSID's authority domain (its _lexicon TXT record names that DID).
const SchemaCollection = "com.atproto.lexicon.schema"

// Schemas returns the lexicons knotless publishes (its own namespace; not
// the com.atproto ones it refers to), by NSID, as their files hold them.
func Schemas() (map[string][]byte, error) {
	out := map[string][]byte{}
	err := fs.WalkDir(lexicons.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".json") {
			return err
		}
		raw, err := fs.ReadFile(lexicons.FS, path)
		if err != nil {
			return err
		}
		var head struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(raw, &head); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if strings.HasPrefix(head.ID, "dev.knotless.") {
			out[head.ID] = raw
		}
		return nil
	})
	return out, err
}

// Breaking returns the changes from before to after (schemas by NSID)
// that break a record or a reader of the published version, in a stable
// order: everything indigo's lexlint.BreakingChanges reports (a changed
// type, required or nullable set, enum, const, format, ref or closed
// union at level error; a changed length, size or range at level warn,
// which is breaking here because every knotless installation validates
// the records it reads against its own copy of the lexicons, so a wider
// bound is refused by older readers and a narrower one refuses older
// writers), what lexlint lets pass but readers depend on (a removed NSID,
// definition or object field: a rename is a removal), and what makes
// after invalid (lexlint.LintSchemaFile at level error). Adding optional
// fields, definitions, knownValues and NSIDs is not breaking.
func Breaking(before, after map[string][]byte) ([]string, error) {
	var issues []string
	for _, nsid := range sortedKeys(after) {
		sf, err := parseSchema(after[nsid])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", nsid, err)
		}
		for _, is := range lexlint.LintSchemaFile(sf) {
			if is.LintLevel == "error" {
				issues = append(issues, fmt.Sprintf("%s: invalid (%s): %s", nsid, is.LintName, is.Message))
			}
		}
	}
	for _, nsid := range sortedKeys(before) {
		now, ok := after[nsid]
		if !ok {
			issues = append(issues, nsid+": removed")
			continue
		}
		was, err := parseSchema(before[nsid])
		if err != nil {
			return nil, fmt.Errorf("%s (published): %w", nsid, err)
		}
		is, err := parseSchema(now)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", nsid, err)
		}
		for _, li := range lexlint.BreakingChanges(was, is) {
			issues = append(issues, fmt.Sprintf("%s: %s: %s", nsid, li.LintName, li.Message))
		}
		var a, b map[string]any
		if err := json.Unmarshal(before[nsid], &a); err != nil {
			return nil, err
		}
		if err := json.Unmarshal(now, &b); err != nil {
			return nil, err
		}
		issues = append(issues, removed(nsid, "defs", a["defs"], b["defs"], true)...)
	}
	return issues, nil
}

// removed walks two JSON trees of a schema and reports every definition
// (at the top) and every object property of a that b lacks.
func removed(nsid, path string, a, b any, defs bool) []string {
	am, ok := a.(map[string]any)
	if !ok {
		return nil
	}
	bm, _ := b.(map[string]any)
	var out []string
	for _, k := range sortedKeys(am) {
		bv, has := bm[k]
		switch {
		case defs && !has:
			out = append(out, fmt.Sprintf("%s: definition %q removed", nsid, k))
		case k == "properties" && !defs:
			props, _ := am[k].(map[string]any)
			bprops, _ := bv.(map[string]any)
			for _, p := range sortedKeys(props) {
				if _, ok := bprops[p]; !ok {
					out = append(out, fmt.Sprintf("%s: field %q of %s removed", nsid, p, path))
				}
				out = append(out, removed(nsid, path+"."+p, props[p], bprops[p], false)...)
			}
		default:
			out = append(out, removed(nsid, path+"."+k, am[k], bv, false)...)
		}
	}
	return out
}

func parseSchema(raw []byte) (*lex.SchemaFile, error) {
	var sf lex.SchemaFile
	if err := json.Unmarshal(raw, &sf); err != nil {
		return nil, err
	}
	// Refs are resolved against the file's NSID as a catalog does.
	if err := sf.FinishParse(); err != nil {
		return nil, err
	}
	return &sf, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// ReadPublished reads the schemas last published (the files make
// lexicons-publish wrote into dir, <nsid>.json); a missing dir is none.
func ReadPublished(dir string) (map[string][]byte, error) {
	out := map[string][]byte{}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if nsid, ok := strings.CutSuffix(e.Name(), ".json"); ok && !e.IsDir() {
			raw, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				return nil, err
			}
			out[nsid] = raw
		}
	}
	return out, nil
}

// SchemaRecord is a schema as a com.atproto.lexicon.schema record: the
// schema file's object with its $type.
func SchemaRecord(schema []byte) (json.RawMessage, error) {
	var m map[string]any
	if err := json.Unmarshal(schema, &m); err != nil {
		return nil, err
	}
	m["$type"] = SchemaCollection
	return json.Marshal(m)
}

// schemaOf is the schema a com.atproto.lexicon.schema record holds.
func schemaOf(record json.RawMessage) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(record, &m); err != nil {
		return nil, err
	}
	delete(m, "$type")
	return json.Marshal(m)
}

// Published is what Publish did with one NSID.
type Published struct {
	NSID string
	// Changed is false when the repo held the same schema already.
	Changed bool
	// CID of the record now in the repo.
	CID string
}

// ErrBreaking is returned by Publish when a schema would break the
// version the repo holds.
var ErrBreaking = errors.New("breaking lexicon change")

// Publish writes every schema as a com.atproto.lexicon.schema record into
// the client's repo, after reading what the repo holds: a change that
// breaks a published version (Breaking) is refused for all of them, and
// nothing is written. The repo's account must control the NSIDs'
// authority (docs/lexicons.md#publishing).
func Publish(ctx context.Context, c *pds.Client, schemas map[string][]byte) ([]Published, error) {
	before := map[string][]byte{}
	for _, nsid := range sortedKeys(schemas) {
		rec, err := c.GetRecord(ctx, SchemaCollection, nsid)
		if errors.Is(err, pds.ErrRecordNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if before[nsid], err = schemaOf(rec.Value); err != nil {
			return nil, fmt.Errorf("%s: the published record: %w", nsid, err)
		}
	}
	issues, err := Breaking(before, schemas)
	if err != nil {
		return nil, err
	}
	if len(issues) > 0 {
		return nil, fmt.Errorf("%w against the published version:\n  %s", ErrBreaking, strings.Join(issues, "\n  "))
	}
	var out []Published
	for _, nsid := range sortedKeys(schemas) {
		rec, err := SchemaRecord(schemas[nsid])
		if err != nil {
			return nil, err
		}
		res, err := c.Ensure(ctx, SchemaCollection, nsid, rec)
		if err != nil {
			return out, fmt.Errorf("%s: %w", nsid, err)
		}
		p := Published{NSID: nsid, Changed: res.Wrote}
		if res.After != nil {
			p.CID = res.After.CID
		}
		out = append(out, p)
	}
	return out, nil
}

// Authority is the domain that controls an NSID's schema: the NSID
// without its name, reversed (dev.knotless.market.bid →
// market.knotless.dev). Its TXT record _lexicon.<authority> says
// "did=<the DID whose repo publishes it>".
func Authority(nsid string) string {
	parts := strings.Split(nsid, ".")
	parts = parts[:len(parts)-1]
	slices.Reverse(parts)
	return strings.Join(parts, ".")
}
