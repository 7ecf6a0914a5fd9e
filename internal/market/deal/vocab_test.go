package deal

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/knotless-dev/knotless/lexicons"
)

// knownValues returns the knownValues of property prop of the record of
// the lexicon file (dev/knotless/market/<file>.json).
func knownValues(t *testing.T, file, prop string) []string {
	t.Helper()
	raw, err := lexicons.FS.ReadFile("dev/knotless/market/" + file + ".json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Defs struct {
			Main struct {
				Record struct {
					Properties map[string]struct {
						KnownValues []string `json:"knownValues"`
					} `json:"properties"`
				} `json:"record"`
			} `json:"main"`
		} `json:"defs"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	p, ok := doc.Defs.Main.Record.Properties[prop]
	if !ok || len(p.KnownValues) == 0 {
		t.Fatalf("%s.json: %s has no knownValues", file, prop)
	}
	return p.KnownValues
}

func strs[S ~string](vs []S) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return out
}

// TestVocabularyMatchesLexicons: every typed constant of a record field
// is one of the lexicon's knownValues, and every known value has a
// constant.
func TestVocabularyMatchesLexicons(t *testing.T) {
	for _, c := range []struct {
		file, prop string
		consts     []string
	}{
		{"lease", "state", strs(LeaseStates())},
		{"lease", "reason", strs(LeaseReasons())},
		{"release", "reason", strs(ReleaseReasons())},
		{"reclaim", "reason", strs(ReclaimReasons())},
	} {
		known := knownValues(t, c.file, c.prop)
		for _, v := range c.consts {
			if !slices.Contains(known, v) {
				t.Errorf("%s.%s: constant %q is not a known value of the lexicon %v", c.file, c.prop, v, known)
			}
		}
		for _, v := range known {
			if !slices.Contains(c.consts, v) {
				t.Errorf("%s.%s: known value %q has no constant in package deal", c.file, c.prop, v)
			}
		}
	}
}

// TestContractReasonsAreNotRecordValues: a reason no record carries is
// not one a record could carry (a requester could not tell them apart).
func TestContractReasonsAreNotRecordValues(t *testing.T) {
	records := append(append(strs(LeaseReasons()), strs(ReleaseReasons())...), strs(ReclaimReasons())...)
	for _, r := range []ContractReason{AcceptWithdrawn, ReclaimedEarly, BidderUnresponsive, LeaseWithdrawn, EndedByBidder} {
		if slices.Contains(records, string(r)) {
			t.Errorf("contract reason %q is also a record's reason", r)
		}
	}
}
