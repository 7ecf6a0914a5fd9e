package pds

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

const (
	// maxSafeInteger is the largest integer every ATProto implementation
	// (JavaScript included) holds exactly: 2^53-1.
	maxSafeInteger = 1<<53 - 1
	maxDepth       = 64
)

// ValidateRecord checks a record before anything is sent: collection must be
// an NSID, rkey a record key, value a JSON object without floats and without
// integers outside ±(2^53-1), and a top-level "$type", if present, must equal
// the collection. Errors are *SpecError.
func ValidateRecord(collection, rkey string, value json.RawMessage) error {
	_, err := recordMap(collection, rkey, value)
	return err
}

// ValidateDID checks DID syntax.
func ValidateDID(s string) error {
	if _, err := syntax.ParseDID(s); err != nil {
		return &SpecError{Field: "did", Reason: err.Error()}
	}
	return nil
}

// ValidateHandleOrDID checks that s is a handle or a DID.
func ValidateHandleOrDID(s string) error {
	if _, err := syntax.ParseAtIdentifier(s); err != nil {
		return &SpecError{Field: "identifier", Reason: err.Error()}
	}
	return nil
}

func validateKey(collection, rkey string) error {
	if _, err := syntax.ParseNSID(collection); err != nil {
		return &SpecError{Field: "collection", Reason: err.Error()}
	}
	if _, err := syntax.ParseRecordKey(rkey); err != nil {
		return &SpecError{Field: "rkey", Reason: err.Error()}
	}
	return nil
}

// recordMap validates a record and returns it as a map (numbers kept as
// json.Number, so they are re-encoded exactly) with "$type" set.
func recordMap(collection, rkey string, value json.RawMessage) (map[string]any, error) {
	if err := validateKey(collection, rkey); err != nil {
		return nil, err
	}
	if err := CheckValue(value); err != nil {
		return nil, err
	}

	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return nil, &SpecError{Field: "value", Reason: "invalid JSON: " + err.Error()}
	}
	if t, ok := m["$type"]; ok {
		if s, _ := t.(string); s != collection {
			return nil, &SpecError{Field: "value.$type", Reason: fmt.Sprintf("must equal the collection %q", collection)}
		}
	} else {
		m["$type"] = collection
	}
	return m, nil
}

// CheckValue checks that value is one JSON object, nested at most 64
// levels, without floats and without integers outside ±(2^53-1). Errors
// are *SpecError naming the field (value.a.b[2]).
func CheckValue(value json.RawMessage) error {
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return &SpecError{Field: "value", Reason: "must be a JSON object"}
	}
	if err := checkObject(dec, "value", 1); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &SpecError{Field: "value", Reason: "unexpected data after the JSON object"}
	}
	return nil
}

// checkObject walks the members of an object whose '{' was read.
func checkObject(dec *json.Decoder, path string, depth int) error {
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return invalidJSON(path, err)
		}
		key, _ := tok.(string)
		if err := checkValue(dec, path+"."+key, depth); err != nil {
			return err
		}
	}
	return closeDelim(dec, path)
}

func checkValue(dec *json.Decoder, path string, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return invalidJSON(path, err)
	}
	switch t := tok.(type) {
	case json.Delim:
		if depth >= maxDepth {
			return &SpecError{Field: path, Reason: fmt.Sprintf("nested deeper than %d levels", maxDepth)}
		}
		if t == '{' {
			return checkObject(dec, path, depth+1)
		}
		for i := 0; dec.More(); i++ {
			if err := checkValue(dec, fmt.Sprintf("%s[%d]", path, i), depth+1); err != nil {
				return err
			}
		}
		return closeDelim(dec, path)
	case json.Number:
		s := t.String()
		if strings.ContainsAny(s, ".eE") {
			return &SpecError{Field: path, Reason: "floats are not allowed in ATProto records (use an integer or a string)"}
		}
		if n, err := strconv.ParseInt(s, 10, 64); err != nil || n > maxSafeInteger || n < -maxSafeInteger {
			return &SpecError{Field: path, Reason: "integer outside ±(2^53-1) (use a string)"}
		}
	}
	return nil
}

func closeDelim(dec *json.Decoder, path string) error {
	if _, err := dec.Token(); err != nil {
		return invalidJSON(path, err)
	}
	return nil
}

func invalidJSON(path string, err error) error {
	return &SpecError{Field: path, Reason: "invalid JSON: " + err.Error()}
}
