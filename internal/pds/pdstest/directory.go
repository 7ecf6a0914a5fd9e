package pdstest

import (
	"strings"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// Identity is the DID document of the fake account: handle Handle, PDS at
// pdsURL.
func Identity(pdsURL string) identity.Identity {
	return identity.Identity{
		DID:         syntax.DID(DID),
		Handle:      syntax.Handle(Handle),
		AlsoKnownAs: []string{"at://" + Handle},
		Services:    map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: pdsURL}},
	}
}

// Directory is a DID directory that knows the fake account, its PDS at
// pdsURL (a loopback name matches a fake PDS, which listens on 127.0.0.1,
// at the same port only: see Localhost).
func Directory(pdsURL string) *identity.MockDirectory {
	d := identity.NewMockDirectory()
	d.Insert(Identity(pdsURL))
	return d
}

// Localhost is the URL u of a fake PDS (http://127.0.0.1:<port>) as the
// reference PDS's DID documents name theirs: http://localhost:<port>.
func Localhost(u string) string { return strings.Replace(u, "://127.0.0.1:", "://localhost:", 1) }

// Directory is a DID directory in which the fake account lives on f.
func (f *PDS) Directory() *identity.MockDirectory { return Directory(f.URL()) }
