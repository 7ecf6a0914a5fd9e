package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"time"

	"github.com/bluesky-social/indigo/api/agnostic"
	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// MaxWritesPerBatch is the largest ApplyWrites batch the PDS accepts.
const MaxWritesPerBatch = 200

// Record is a record as the PDS returned it.
type Record struct {
	URI   string
	CID   string
	Value json.RawMessage
}

// WriteResult is what the PDS reported for a write. Rev is the repo revision
// of the commit; it is empty when the write changed nothing (the PDS answers
// 200 without a commit), in which case CID is the unchanged record's CID.
type WriteResult struct {
	URI string
	CID string
	Rev string
}

// Changed reports whether the write produced a commit.
func (r *WriteResult) Changed() bool { return r.Rev != "" }

// WriteOp is the kind of a Write in ApplyWrites.
type WriteOp string

const (
	// OpCreate fails (HTTP 500 from the PDS, failing the whole batch) if the
	// key exists: use OpUpdate for records that may exist, and re-read after
	// a 500 to learn what is there.
	OpCreate WriteOp = "create"
	// OpUpdate replaces an existing record (the PDS answers 500 if it is missing).
	OpUpdate WriteOp = "update"
	// OpDelete removes a record (the PDS answers 500 if it is missing).
	OpDelete WriteOp = "delete"
)

// Write is one operation of an ApplyWrites batch. Value is ignored for OpDelete.
type Write struct {
	Op         WriteOp
	Collection string
	Rkey       string
	Value      json.RawMessage
}

// ApplyResult is the outcome of ApplyWrites: Results[i] belongs to writes[i]
// (CID is empty for deletes). Rev is empty if the batch changed nothing.
type ApplyResult struct {
	Rev     string
	Results []WriteResult
}

// LatestRev returns the revision of the repo's latest commit
// (com.atproto.sync.getLatestCommit).
func (c *Client) LatestRev(ctx context.Context) (string, error) {
	head, err := c.latestCommit(ctx)
	if err != nil {
		return "", err
	}
	return head.Rev, nil
}

// GetRecord reads a record; a missing one is ErrRecordNotFound.
func (c *Client) GetRecord(ctx context.Context, collection, rkey string) (*Record, error) {
	if err := validateKey(collection, rkey); err != nil {
		return nil, err
	}
	if err := c.ready(ctx); err != nil {
		return nil, err
	}
	did, _ := c.Info()
	out, err := agnostic.RepoGetRecord(ctx, c.lex(), "", collection, did, rkey)
	if err != nil {
		return nil, fmt.Errorf("pds: get %s/%s: %w", collection, rkey, err)
	}
	r := &Record{URI: out.Uri}
	if out.Cid != nil {
		r.CID = *out.Cid
	}
	if out.Value != nil {
		r.Value = *out.Value
	}
	return r, nil
}

// ListRecords lists the repo's records of one collection, at most limit
// of them (pages of 100 are read until limit or the end).
func (c *Client) ListRecords(ctx context.Context, collection string, limit int) ([]Record, error) {
	if _, err := syntax.ParseNSID(collection); err != nil {
		return nil, &SpecError{Field: "collection", Reason: err.Error()}
	}
	if err := c.ready(ctx); err != nil {
		return nil, err
	}
	did, _ := c.Info()
	var out []Record
	cursor := ""
	for len(out) < limit {
		page, err := agnostic.RepoListRecords(ctx, c.lex(), collection, cursor, int64(min(100, limit-len(out))), did, false)
		if err != nil {
			return nil, fmt.Errorf("pds: list %s: %w", collection, err)
		}
		for _, r := range page.Records {
			rec := Record{URI: r.Uri, CID: r.Cid}
			if r.Value != nil {
				rec.Value = *r.Value
			}
			out = append(out, rec)
		}
		if page.Cursor == nil || *page.Cursor == "" || *page.Cursor == cursor || len(page.Records) == 0 {
			break
		}
		cursor = *page.Cursor
	}
	return out, nil
}

// PutRecord creates or replaces a record. swapCID == nil writes
// unconditionally; otherwise the record's current CID must equal *swapCID or
// the PDS refuses with ErrInvalidSwap. The value is checked with
// ValidateRecord first, and "$type" is set to the collection if absent.
func (c *Client) PutRecord(ctx context.Context, collection, rkey string, value json.RawMessage, swapCID *string) (*WriteResult, error) {
	rec, err := recordMap(collection, rkey, value)
	if err != nil {
		return nil, err
	}
	if err := validateSwap(swapCID); err != nil {
		return nil, err
	}
	if err := c.ready(ctx); err != nil {
		return nil, err
	}
	did, _ := c.Info()
	// agnostic's input has omitempty on swapRecord; the generated
	// comatproto one sends null, which the PDS reads as "create only".
	start := time.Now()
	out, err := agnostic.RepoPutRecord(ctx, c.lex(), &agnostic.RepoPutRecord_Input{
		Repo: did, Collection: collection, Rkey: rkey, Record: rec, SwapRecord: swapCID,
	})
	c.observeWrite("putRecord", start, err)
	if err != nil {
		return nil, fmt.Errorf("pds: put %s/%s: %w", collection, rkey, err)
	}
	res := &WriteResult{URI: out.Uri, CID: out.Cid}
	if out.Commit != nil {
		res.Rev = out.Commit.Rev
	}
	return res, nil
}

// DeleteRecord deletes a record; deleting a missing record succeeds. With
// swapCID != nil the record's current CID must equal it (ErrInvalidSwap).
func (c *Client) DeleteRecord(ctx context.Context, collection, rkey string, swapCID *string) error {
	if err := validateKey(collection, rkey); err != nil {
		return err
	}
	if err := validateSwap(swapCID); err != nil {
		return err
	}
	if err := c.ready(ctx); err != nil {
		return err
	}
	did, _ := c.Info()
	in := struct {
		Repo       string  `json:"repo"`
		Collection string  `json:"collection"`
		Rkey       string  `json:"rkey"`
		SwapRecord *string `json:"swapRecord,omitempty"`
	}{did, collection, rkey, swapCID}
	start := time.Now()
	err := c.lex().LexDo(ctx, http.MethodPost, "", "com.atproto.repo.deleteRecord", nil, in, nil)
	c.observeWrite("deleteRecord", start, err)
	if err != nil {
		return fmt.Errorf("pds: delete %s/%s: %w", collection, rkey, err)
	}
	return nil
}

// ApplyWrites applies up to MaxWritesPerBatch writes to the repo in one
// commit, all or nothing. OpCreate on an existing key (and OpUpdate/OpDelete
// on a missing one) makes the PDS fail the whole batch with a 500
// (*StatusError): use OpUpdate for records known to exist, and after a 500
// re-read the records to find out which write was wrong.
func (c *Client) ApplyWrites(ctx context.Context, writes []Write) (*ApplyResult, error) {
	return c.applyWrites(ctx, writes, nil)
}

// applyWrites is ApplyWrites with an optional swapCommit: the PDS applies
// the batch only if the repo's latest commit is still *swapCommit
// (ErrInvalidSwap otherwise).
func (c *Client) applyWrites(ctx context.Context, writes []Write, swapCommit *string) (*ApplyResult, error) {
	if len(writes) == 0 {
		return &ApplyResult{}, nil
	}
	if len(writes) > MaxWritesPerBatch {
		return nil, &SpecError{Field: "writes", Reason: fmt.Sprintf("%d writes, at most %d per batch", len(writes), MaxWritesPerBatch)}
	}
	did, _ := c.Info()
	in := &agnostic.RepoApplyWrites_Input{Repo: did, SwapCommit: swapCommit}
	for i, w := range writes {
		elem, err := writeElem(w)
		if err != nil {
			var se *SpecError
			if errors.As(err, &se) {
				se.Field = fmt.Sprintf("writes[%d].%s", i, se.Field)
			}
			return nil, err
		}
		in.Writes = append(in.Writes, elem)
	}
	if err := c.ready(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	out, err := agnostic.RepoApplyWrites(ctx, c.lex(), in)
	c.observeWrite("applyWrites", start, err)
	if err != nil {
		return nil, fmt.Errorf("pds: applyWrites (%d writes): %w", len(writes), err)
	}
	res := &ApplyResult{Results: make([]WriteResult, len(writes))}
	if out.Commit != nil {
		res.Rev = out.Commit.Rev
	}
	for i, w := range writes {
		r := WriteResult{URI: "at://" + did + "/" + w.Collection + "/" + w.Rkey, Rev: res.Rev}
		if i < len(out.Results) {
			switch o := out.Results[i]; {
			case o.RepoApplyWrites_CreateResult != nil:
				r.URI, r.CID = o.RepoApplyWrites_CreateResult.Uri, o.RepoApplyWrites_CreateResult.Cid
			case o.RepoApplyWrites_UpdateResult != nil:
				r.URI, r.CID = o.RepoApplyWrites_UpdateResult.Uri, o.RepoApplyWrites_UpdateResult.Cid
			}
		}
		res.Results[i] = r
	}
	return res, nil
}

// JSONEqual compares two JSON documents by value (numbers as written).
func JSONEqual(a, b []byte) bool {
	var va, vb any
	da := json.NewDecoder(bytes.NewReader(a))
	da.UseNumber()
	db := json.NewDecoder(bytes.NewReader(b))
	db.UseNumber()
	if da.Decode(&va) != nil || db.Decode(&vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

func writeElem(w Write) (*agnostic.RepoApplyWrites_Input_Writes_Elem, error) {
	if w.Op == OpDelete {
		if err := validateKey(w.Collection, w.Rkey); err != nil {
			return nil, err
		}
		return &agnostic.RepoApplyWrites_Input_Writes_Elem{RepoApplyWrites_Delete: &agnostic.RepoApplyWrites_Delete{
			Collection: w.Collection, Rkey: w.Rkey}}, nil
	}
	if w.Op != OpCreate && w.Op != OpUpdate {
		return nil, &SpecError{Field: "op", Reason: fmt.Sprintf("%q is not create, update or delete", w.Op)}
	}
	rec, err := recordMap(w.Collection, w.Rkey, w.Value)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	raw := json.RawMessage(b)
	if w.Op == OpCreate {
		rkey := w.Rkey
		return &agnostic.RepoApplyWrites_Input_Writes_Elem{RepoApplyWrites_Create: &agnostic.RepoApplyWrites_Create{
			Collection: w.Collection, Rkey: &rkey, Value: &raw}}, nil
	}
	return &agnostic.RepoApplyWrites_Input_Writes_Elem{RepoApplyWrites_Update: &agnostic.RepoApplyWrites_Update{
		Collection: w.Collection, Rkey: w.Rkey, Value: &raw}}, nil
}

func validateSwap(swapCID *string) error {
	if swapCID == nil {
		return nil
	}
	if _, err := syntax.ParseCID(*swapCID); err != nil {
		return &SpecError{Field: "swapCID", Reason: err.Error()}
	}
	return nil
}

// ServiceAuth asks the PDS for an inter-service token of the repo's
// account (com.atproto.server.getServiceAuth) for the service aud and the
// method lxm, expiring at exp: how the account proves who it is to
// another service (a tenant apiserver) without handing it a credential.
// The token is the caller's to use at once; it is never stored.
func (c *Client) ServiceAuth(ctx context.Context, aud, lxm string, exp time.Time) (string, error) {
	if err := c.ready(ctx); err != nil {
		return "", err
	}
	out, err := comatproto.ServerGetServiceAuth(ctx, c.lex(), aud, exp.Unix(), lxm)
	if err != nil {
		return "", err
	}
	return out.Token, nil
}
