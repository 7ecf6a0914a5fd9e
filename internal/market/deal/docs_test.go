package deal

import (
	"flag"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the transition tables of docs/market.md")

const (
	docsPath     = "../../../docs/market.md"
	bidderBeg    = "<!-- the bidder's transitions: internal/market/deal BidderTransitions (go test ./internal/market/deal -run TestDocsShowTheTransitionTables -update) -->\n"
	requesterBeg = "<!-- the requester's transitions: internal/market/deal RequesterTransitions (go test ./internal/market/deal -run TestDocsShowTheTransitionTables -update) -->\n"
	contractBeg  = "<!-- the contract's transitions: internal/market/deal ContractTransitions (go test ./internal/market/deal -run TestDocsShowTheTransitionTables -update) -->\n"
	tableEnd     = "<!-- end of table -->\n"
)

// TestDocsShowTheTransitionTables: docs/market.md shows the bidder's and
// the requester's transition tables as BidderTransitions and
// RequesterTransitions have them.
func TestDocsShowTheTransitionTables(t *testing.T) {
	for _, tc := range []struct {
		side, beg string
		table     []Transition
	}{{"bidder", bidderBeg, BidderTransitions()}, {"requester", requesterBeg, RequesterTransitions()}, {"contract", contractBeg, ContractTransitions()}} {
		t.Run(tc.side, func(t *testing.T) { docsTable(t, tc.side, tc.beg, tc.table) })
	}
}

// docsTable checks (or with -update rewrites) one side's table.
func docsTable(t *testing.T, side, begin string, table []Transition) {
	raw, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	beg := strings.Index(doc, begin)
	end := strings.Index(doc[max(beg, 0):], tableEnd)
	if beg < 0 || end < 0 {
		t.Fatalf("docs/market.md has no %s's transition table between %q and %q", side, begin, tableEnd)
	}
	end += beg
	want := Markdown(table)
	if got := doc[beg+len(begin) : end]; got != want {
		if *update {
			if err := os.WriteFile(docsPath, []byte(doc[:beg+len(begin)]+want+doc[end:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("docs/market.md's %s's transition table is not its Transitions (run with -update):\n%s", side, want)
	}
}
