// Command lexpublish publishes knotless's lexicons the ATProto way (make
// lexicons-publish; docs/lexicons.md#publishing): one
// com.atproto.lexicon.schema record per NSID in the repo of the account
// that controls the NSIDs' authority domain, refused as a whole when a
// schema would break the version that repo holds. After publishing it
// writes the schemas into --published (lexicons/published/), the version
// of record that `go test ./internal/lexicon/` checks every later change
// against, and prints the DNS TXT records that point the authority
// domains at the account.
//
//	lexpublish --pds https://pds.example.com --identifier lexicons.knotless.dev \
//	    --app-password-file ~/.config/knotless/lexicons.app-password
//
// --allow-private-networks lets it reach a PDS on a loopback or private
// address (a local PDS: the e2e suite's, make dev's).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "lexpublish: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("lexpublish", flag.ContinueOnError)
	host := fs.String("pds", "", "the PDS of the account that controls the NSIDs' authority (https URL)")
	identifier := fs.String("identifier", "", "that account's handle or DID")
	passwordFile := fs.String("app-password-file", "", "a file holding an app password of that account")
	published := fs.String("published", "lexicons/published", "where the published version of record is kept")
	private := fs.String("allow-private-networks", "", "comma-separated CIDRs a PDS may be at besides public addresses (e.g. 127.0.0.0/8)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *host == "" || *identifier == "" || *passwordFile == "" {
		return fmt.Errorf("--pds, --identifier and --app-password-file are required")
	}
	raw, err := os.ReadFile(*passwordFile)
	if err != nil {
		return err
	}
	prefixes, err := netpolicy.ParsePrefixes(*private)
	if err != nil {
		return fmt.Errorf("--allow-private-networks: %w", err)
	}
	c, err := pds.Connect(ctx, *host, *identifier, strings.TrimSpace(string(raw)), pds.Options{
		Policy: netpolicy.New(prefixes, nil),
		Store:  &pds.MemoryStore{},
	})
	if err != nil {
		return err
	}
	schemas, err := lexicon.Schemas()
	if err != nil {
		return err
	}
	done, err := lexicon.Publish(ctx, c, schemas)
	if err != nil {
		return err
	}
	did, _ := c.Info()
	if err := os.MkdirAll(*published, 0o755); err != nil {
		return err
	}
	authorities := map[string]bool{}
	for _, p := range done {
		state := "unchanged"
		if p.Changed {
			state = "published"
		}
		fmt.Printf("%-40s %-10s at://%s/%s/%s (%s)\n", p.NSID, state, did, lexicon.SchemaCollection, p.NSID, p.CID)
		if err := os.WriteFile(filepath.Join(*published, p.NSID+".json"), schemas[p.NSID], 0o644); err != nil {
			return err
		}
		authorities[lexicon.Authority(p.NSID)] = true
	}
	fmt.Printf("\nDNS: the authority domains must name %s:\n", did)
	keys := make([]string, 0, len(authorities))
	for a := range authorities {
		keys = append(keys, a)
	}
	slices.Sort(keys)
	for _, a := range keys {
		fmt.Printf("  _lexicon.%s. TXT \"did=%s\"\n", a, did)
	}
	return nil
}
