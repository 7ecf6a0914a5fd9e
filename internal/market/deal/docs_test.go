package deal

import (
	"flag"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the transition tables of docs/market.md")

const (
	docsPath  = "../../../docs/market.md"
	bidderBeg = "<!-- the bidder's transitions: internal/market/deal BidderTransitions (go test ./internal/market/deal -run TestDocsShowTheTransitionTables -update) -->\n"
	tableEnd  = "<!-- end of table -->\n"
)

// TestDocsShowTheTransitionTables: docs/market.md shows the bidder's
// transition table as BidderTransitions has it.
func TestDocsShowTheTransitionTables(t *testing.T) {
	raw, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	beg := strings.Index(doc, bidderBeg)
	end := strings.Index(doc[max(beg, 0):], tableEnd)
	if beg < 0 || end < 0 {
		t.Fatalf("docs/market.md has no bidder's transition table between %q and %q", bidderBeg, tableEnd)
	}
	end += beg
	want := Markdown(BidderTransitions())
	if got := doc[beg+len(bidderBeg) : end]; got != want {
		if *update {
			if err := os.WriteFile(docsPath, []byte(doc[:beg+len(bidderBeg)]+want+doc[end:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("docs/market.md's bidder's transition table is not BidderTransitions (run with -update):\n%s", want)
	}
}
