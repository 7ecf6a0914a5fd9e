package lexicon

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// attackBase is a valid association record without its closing brace.
const attackBase = `{"$type":"dev.knotless.market.association","subject":"did:plc:ewvi7nxzyoun6zhxrhs64oiz","roles":["bidder"],"createdAt":"2026-12-01T00:00:00Z"`

// validateSafely runs ValidateRecord, failing the test on a panic, a
// non-*Error error or an over-long reason; a slow answer is logged (no
// timed assertions: CPU cost is a figure, not a test).
func validateSafely(t *testing.T, name, collection string, value []byte) (err error) {
	t.Helper()
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			t.Errorf("%s: ValidateRecord panicked: %v", name, p)
			err = errors.New("panic")
		}
		if took := time.Since(start); took > 500*time.Millisecond {
			t.Logf("%s: took %s", name, took)
		}
	}()
	err = ValidateRecord(collection, json.RawMessage(value))
	if err == nil {
		return nil
	}
	var lerr *Error
	if !errors.As(err, &lerr) {
		t.Errorf("%s: error %T %v, want *lexicon.Error", name, err, err)
		return err
	}
	if len(lerr.Reason) > maxReason {
		t.Errorf("%s: reason is %d bytes", name, len(lerr.Reason))
	}
	if len(lerr.Collection) > maxNSID {
		t.Errorf("%s: collection is %d bytes", name, len(lerr.Collection))
	}
	return err
}

// TestAttackValidateRecordRefuses: hostile values are refused with a
// bounded *Error, without panicking, quickly.
func TestAttackValidateRecordRefuses(t *testing.T) {
	long := strings.Repeat("A", 100000)
	nest := func(n int) string { return strings.Repeat("[", n) + "1" + strings.Repeat("]", n) }
	cases := map[string]string{
		"empty":                      ``,
		"whitespace":                 "  \n\t ",
		"null":                       `null`,
		"array":                      `[` + attackBase + `}]`,
		"string":                     `"` + attackBase + `"`,
		"number":                     `12`,
		"true":                       `true`,
		"truncated object":           attackBase,
		"only brace":                 `{`,
		"trailing object":            attackBase + `}{}`,
		"trailing garbage":           attackBase + `}garbage`,
		"oversized":                  attackBase + `,"pad":"` + strings.Repeat("x", MaxRecordBytes) + `"}`,
		"oversized in key":           attackBase + `,"` + long + `":1}`,
		"key quoted in reason":       attackBase + `,"` + strings.Repeat("k", 5000) + `":1.5}`,
		"17 levels":                  attackBase + `,"x":` + nest(16) + `}`,
		"deep arrays":                attackBase + `,"x":` + nest(100000) + `}`,
		"deep unclosed":              attackBase + `,"x":` + strings.Repeat(`{"a":`, 20000),
		"escapes then deep":          attackBase + `,"s":"\\\"{{{","x":` + nest(16) + `}`,
		"escaped backslash deep":     attackBase + `,"s":"\\\\","x":` + nest(16) + `}`,
		"many escape runs deep":      attackBase + `,"s":"` + strings.Repeat(`\\\"{{{`, 2000) + `","x":` + nest(16) + `}`,
		"closing brackets in str":    attackBase + `,"s":"]]]]]]]]]]]]]]]]]]]]}}}}}}}}}}","x":` + nest(16) + `}`,
		"1e400":                      attackBase + `,"x":1e400}`,
		"-1e400":                     attackBase + `,"x":-1e400}`,
		"huge integer":               attackBase + `,"x":` + strings.Repeat("9", 5000) + `}`,
		"2^53":                       attackBase + `,"x":9007199254740992}`,
		"float":                      attackBase + `,"x":0.5}`,
		"negative zero float":        attackBase + `,"x":-0.0}`,
		"leading zero":               attackBase + `,"x":01}`,
		"NaN":                        attackBase + `,"x":NaN}`,
		"Infinity":                   attackBase + `,"x":Infinity}`,
		"$type other":                attackBase + `,"$type":"app.bsky.feed.post"}`,
		"$type number":               `{"$type":5,` + attackBase[len(`{"$type":"dev.knotless.market.association",`):] + `}`,
		"$type null":                 `{"$type":null,` + attackBase[len(`{"$type":"dev.knotless.market.association",`):] + `}`,
		"$type object":               `{"$type":{"a":1},` + attackBase[len(`{"$type":"dev.knotless.market.association",`):] + `}`,
		"$type long":                 `{"$type":"dev.knotless.market.` + long + `",` + attackBase[len(`{"$type":"dev.knotless.market.association",`):] + `}`,
		"$type other collection":     `{"$type":"dev.knotless.market.bid",` + attackBase[len(`{"$type":"dev.knotless.market.association",`):] + `}`,
		"invalid UTF-8 in subject":   `{"$type":"dev.knotless.market.association","subject":"did:plc:ewvi7nxzyoun6zhxrhs64oi` + "\xff" + `","roles":["bidder"],"createdAt":"2026-12-01T00:00:00Z"}`,
		"raw NUL in string":          attackBase + ",\"x\":\"a\x00b\"}",
		"raw NUL outside string":     attackBase + "\x00}",
		"escaped NUL in DID":         `{"$type":"dev.knotless.market.association","subject":"did:plc:ewvi7nxzyoun6zhxrhs64oiz\u0000","roles":["bidder"],"createdAt":"2026-12-01T00:00:00Z"}`,
		"escaped NUL in datetime":    `{"$type":"dev.knotless.market.association","subject":"did:plc:ewvi7nxzyoun6zhxrhs64oiz","roles":["bidder"],"createdAt":"2026-12-01T00:00:00Z\u0000"}`,
		"long DID":                   `{"subject":"did:plc:` + long + `","roles":["bidder"],"createdAt":"2026-12-01T00:00:00Z"}`,
		"duplicate $type last bad":   attackBase + `,"$type":"dev.knotless.market.bid"}`,
		"duplicate subject last bad": attackBase + `,"subject":"not a did"}`,
		"bad escape":                 attackBase + `,"x":"\q"}`,
		"unterminated string":        attackBase + `,"x":"abc}`,
		"unbalanced close":           attackBase + `}]}`,
		"BOM":                        "\xef\xbb\xbf" + attackBase + `}`,
	}
	for name, v := range cases {
		if err := validateSafely(t, name, Association, []byte(v)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Non-market collections and hostile collection names, with a good value.
	for _, c := range []string{"", "\x00", "dev.knotless.market.association\x00", "dev.knotless.market.association ", "DEV.KNOTLESS.MARKET.ASSOCIATION", long, "dev.knotless.market." + long} {
		if err := validateSafely(t, "collection "+truncate(c, 40), c, []byte(attackBase+`}`)); err == nil {
			t.Errorf("collection %q: accepted", truncate(c, 40))
		}
	}
}

// TestAttackValidateRecordDepthScan: brackets, escaped quotes and escaped
// backslashes inside strings do not confuse the depth scan: such a record
// is accepted at the deepest allowed nesting, and depth() agrees with a
// real parse.
func TestAttackValidateRecordDepthScan(t *testing.T) {
	nest := func(n int) string { return strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n) }
	for name, s := range map[string]string{
		"escaped quote then braces": `\\\"{{{`,
		"repeated":                  strings.Repeat(`\\\"{{{[[[`, 500),
		"trailing backslash":        `{{{\\`,
		"only backslashes":          `\\\\\\\\`,
		"unicode escapes":           `\u007b\u005b\u0022{[`,
		"closers":                   `]]]]}}}}\"]]]`,
	} {
		// 15 levels inside the record object: 16 in all.
		rec := attackBase + `,"s":"` + s + `","x":` + nest(15) + `,"t":"` + s + `"}`
		if err := validateSafely(t, name, Association, []byte(rec)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if d := depth([]byte(rec)); d != 16 {
			t.Errorf("%s: depth %d, want 16", name, d)
		}
		deeper := attackBase + `,"s":"` + s + `","x":` + nest(16) + `}`
		if err := validateSafely(t, name+" deeper", Association, []byte(deeper)); err == nil {
			t.Errorf("%s: 17 levels accepted", name)
		}
	}
}

// TestAttackValidateRecordEdgeValuesAccepted: values that are valid
// ATProto data stay accepted and do not crash: negative zero integer,
// \u0000 in a free string, lone surrogates (decoded as U+FFFD), the
// largest safe integers, and whitespace around the object.
func TestAttackValidateRecordEdgeValuesAccepted(t *testing.T) {
	for name, v := range map[string]string{
		"negative zero":      attackBase + `,"x":-0}`,
		"escaped NUL":        attackBase + `,"x":"\u0000"}`,
		"lone surrogate":     attackBase + `,"x":"\ud800"}`,
		"max safe":           attackBase + `,"x":9007199254740991,"y":-9007199254740991}`,
		"whitespace around":  " \n" + attackBase + "} \n",
		"no $type":           `{"subject":"did:plc:ewvi7nxzyoun6zhxrhs64oiz","roles":["bidder"],"createdAt":"2026-12-01T00:00:00Z"}`,
		"unknown field deep": attackBase + `,"x":{"y":[{"z":null}]}}`,
	} {
		if err := validateSafely(t, name, Association, []byte(v)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestAttackValidateRecordDuplicateKeys: with duplicate keys the last one
// wins (as for encoding/json, which every consumer of the raw value
// uses): whatever ValidateRecord accepted decodes, last-wins, to a
// record of the collection with a valid subject.
func TestAttackValidateRecordDuplicateKeys(t *testing.T) {
	rest := attackBase[len(`{"$type":"dev.knotless.market.association",`):]
	for name, v := range map[string]string{
		"$type other first":   `{"$type":"dev.knotless.market.bid",` + `"$type":"dev.knotless.market.association",` + rest + `}`,
		"subject bad first":   `{"subject":"not a did",` + attackBase[1:] + `}`,
		"$type bad last":      attackBase + `,"$type":"dev.knotless.market.bid"}`,
		"subject bad last":    attackBase + `,"subject":"x"}`,
		"roles bad last":      attackBase + `,"roles":"bidder"}`,
		"createdAt bad last":  attackBase + `,"createdAt":"yesterday"}`,
		"createdAt bad first": `{"createdAt":"yesterday",` + attackBase[1:] + `}`,
	} {
		err := validateSafely(t, name, Association, []byte(v))
		var m struct {
			Type    string `json:"$type"`
			Subject string `json:"subject"`
			Roles   any    `json:"roles"`
			Created string `json:"createdAt"`
		}
		decErr := json.Unmarshal([]byte(v), &m)
		consumerOK := decErr == nil && m.Type == Association && m.Subject == "did:plc:ewvi7nxzyoun6zhxrhs64oiz" && m.Created == "2026-12-01T00:00:00Z"
		if _, isList := m.Roles.([]any); !isList {
			consumerOK = false
		}
		if err == nil && !consumerOK {
			t.Errorf("%s: accepted, but a consumer decodes %+v (%v)", name, m, decErr)
		}
	}
}

// TestAttackValidateRecordInvalidUTF8: ATProto strings are UTF-8. A
// listing from a hostile PDS reaches Filter.Check as raw JSON bytes
// (agnostic.RepoListRecords keeps json.RawMessage), so invalid UTF-8 in a
// record must be refused, not silently decoded as U+FFFD while the raw
// bytes are kept.
func TestAttackValidateRecordInvalidUTF8(t *testing.T) {
	for name, v := range map[string]string{
		"in a free string": attackBase + ",\"x\":\"a\xff\xfeb\"}",
		"in a key":         attackBase + ",\"\xff\":1}",
		"overlong NUL":     attackBase + ",\"x\":\"\xc0\x80\"}",
		"surrogate bytes":  attackBase + ",\"x\":\"\xed\xa0\x80\"}",
	} {
		if err := validateSafely(t, name, Association, []byte(v)); err == nil {
			t.Errorf("%s: invalid UTF-8 accepted", name)
		}
	}
}
