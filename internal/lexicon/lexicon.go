/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package lexicon validates the records of the knotless compute market
// (dev.knotless.market.*) against their ATProto lexicons, which are embedded
// from the repository's lexicons/ directory (package lexicons) and checked
// with indigo's atproto/lexicon validator.
//
// Every market record is validated before knotless writes it and when it is
// read from a firehose; see docs/lexicons.md.
package lexicon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/bluesky-social/indigo/atproto/atdata"
	lex "github.com/bluesky-social/indigo/atproto/lexicon"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/lexicons"
)

// Namespace is the NSID prefix of every market lexicon.
const Namespace = "dev.knotless.market"

// GatewayNamespace is the NSID prefix of the gateway lexicons: records a
// requester publishes for the gateways of its bidders.
const GatewayNamespace = "dev.knotless.gateway"

// GatewayAssociation is the NSID of a requester's claim of a hostname
// for a Service of its tenant, served by the bidder's gateway.
const GatewayAssociation = GatewayNamespace + ".association"

// GatewaySSH is the NSID of a requester's request that the bidder of a
// lease let SSH sessions into pods of its tenant.
const GatewaySSH = GatewayNamespace + ".ssh"

// SSHKeys is the NSID of a DID's SSH public keys (record key self), with
// which knotless SSH gateways let sessions in as that DID.
const SSHKeys = GatewayNamespace + ".sshKeys"

// ours reports whether collection is in a namespace knotless has record
// lexicons for.
func ours(collection string) bool {
	return strings.HasPrefix(collection, Namespace+".") || strings.HasPrefix(collection, GatewayNamespace+".")
}

// The NSIDs (collections) of the market's record types.
const (
	Presence    = Namespace + ".presence"
	Association = Namespace + ".association"
	Request     = Namespace + ".request"
	Bid         = Namespace + ".bid"
	Accept      = Namespace + ".accept"
	Lease       = Namespace + ".lease"
	Release     = Namespace + ".release"
	Reclaim     = Namespace + ".reclaim"
)

// maxReason caps Error.Reason: indigo's messages may quote (parts of) the
// record, which comes from the network.
const maxReason = 300

// maxNSID is the longest NSID the ATProto spec allows; a longer collection
// is cut to this length in Error.Collection.
const maxNSID = 317

// Error is returned by ValidateRecord when a record does not match its
// lexicon (or its collection has no lexicon).
type Error struct {
	// Collection is the NSID the record was validated as.
	Collection string
	// Reason says what is wrong, at most 300 bytes.
	Reason string
}

func (e *Error) Error() string {
	return "record does not match lexicon " + e.Collection + ": " + e.Reason
}

func newError(collection, reason string) *Error {
	return &Error{Collection: truncate(collection, maxNSID), Reason: truncate(reason, maxReason)}
}

// truncate cuts s to at most n bytes, on a UTF-8 boundary, marking the cut
// with "...".
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "..."
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

var loadCatalog = sync.OnceValues(func() (*lex.BaseCatalog, error) {
	c := lex.NewBaseCatalog()
	if err := c.LoadEmbedFS(lexicons.FS); err != nil {
		return nil, err
	}
	return c, nil
})

// Catalog returns the catalog of the embedded lexicons: the market's and the
// com.atproto ones they refer to. It is loaded once; as the files are
// embedded at build time (and a test loads them), a load failure is a bug
// and panics.
func Catalog() lex.Catalog {
	c, err := loadCatalog()
	if err != nil {
		panic(fmt.Sprintf("lexicon: the embedded lexicons (package lexicons) do not load: %v", err))
	}
	return c
}

// Known reports whether collection is a record type of knotless, that is
// an NSID in Namespace or GatewayNamespace with a record lexicon in
// Catalog().
func Known(collection string) bool {
	if !ours(collection) {
		return false
	}
	s, err := Catalog().Resolve(collection)
	if err != nil {
		return false
	}
	_, ok := s.Def.(lex.SchemaRecord)
	return ok
}

// ValidateRecord checks that value, the JSON of a record, matches the
// lexicon of collection, one of knotless's record NSIDs. value may carry
// "$type"; if it does, it must equal collection. Numbers must be integers
// in ±(2^53-1) written without a fraction or exponent (ATProto data has no
// floats). Errors are *Error.
//
// The check is indigo's lexicon.ValidateRecord with
// StrictRecursiveValidation: required fields, types, formats (datetime,
// did, at-uri, cid: syntax only), string and array lengths, integer
// minimums. knownValues are not enforced: they are an open set by the
// lexicon spec, so a caller acting on a field like lease.state must handle
// values it does not know. Fields the lexicon does not declare are allowed.
func ValidateRecord(collection string, value json.RawMessage) error {
	if _, err := syntax.ParseNSID(collection); err != nil {
		return newError(collection, "collection is not an NSID")
	}
	if !ours(collection) {
		return newError(collection, "not a knotless collection (outside "+Namespace+" and "+GatewayNamespace+")")
	}
	if !Known(collection) {
		return newError(collection, "no record lexicon for this collection")
	}

	if trimmed := bytes.TrimSpace(value); len(trimmed) == 0 || trimmed[0] != '{' {
		return newError(collection, "record is not a JSON object")
	}
	if len(value) > MaxRecordBytes {
		return newError(collection, fmt.Sprintf("record is larger than %d bytes", MaxRecordBytes))
	}
	if !utf8.Valid(value) {
		// The decoders would turn the bytes into U+FFFD while the raw
		// value, kept by a subscription, still carries them.
		return newError(collection, "record is not valid UTF-8")
	}
	if depth(value) > maxDepth {
		return newError(collection, fmt.Sprintf("record is nested deeper than %d levels", maxDepth))
	}
	// atdata alone would take 1.0 or 1e2 for integers and round integers
	// beyond 2^53 (it decodes numbers as float64).
	if err := pds.CheckValue(value); err != nil {
		return newError(collection, err.Error())
	}
	data, err := atdata.UnmarshalJSON(value)
	if err != nil {
		return newError(collection, "record is not ATProto data: "+err.Error())
	}
	switch t, ok := data["$type"]; {
	case !ok:
		data["$type"] = collection
	case t != collection:
		ts, _ := t.(string)
		return newError(collection, fmt.Sprintf("$type %q is not the collection", truncate(ts, maxNSID)))
	}

	if err := lex.ValidateRecord(Catalog(), data, collection, lex.StrictRecursiveValidation); err != nil {
		return newError(collection, err.Error())
	}
	return nil
}

// MaxRecordBytes is the largest market record (JSON) knotless writes or
// accepts from a firehose; the market's records are a few KiB.
const MaxRecordBytes = 64 << 10

// maxDepth bounds how deeply a market record nests (the lexicons need 4).
const maxDepth = 16

// depth returns how deeply the JSON value nests objects and arrays (a
// scan of the bytes, before anything is decoded).
func depth(value []byte) int {
	d, most, inString, escaped := 0, 0, false, false
	for _, c := range value {
		switch {
		case escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			d++
			most = max(most, d)
		case c == '}' || c == ']':
			d--
		}
	}
	return most
}
