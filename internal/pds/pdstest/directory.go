package pdstest

import (
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
// pdsURL (a loopback name matches any fake PDS: they all listen on
// 127.0.0.1).
func Directory(pdsURL string) *identity.MockDirectory {
	d := identity.NewMockDirectory()
	d.Insert(Identity(pdsURL))
	return d
}

// Directory is a DID directory in which the fake account lives on f.
func (f *PDS) Directory() *identity.MockDirectory { return Directory(f.URL()) }
