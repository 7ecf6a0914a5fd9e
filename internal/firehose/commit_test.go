package firehose

import (
	"bytes"
	"context"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	lexutil "github.com/bluesky-social/indigo/lex/util"
	"github.com/ipfs/go-cid"
	"github.com/ipfs/go-datastore"
	blockstore "github.com/ipfs/go-ipfs-blockstore"
	"github.com/ipld/go-car"
	carutil "github.com/ipld/go-car/util"
	"github.com/multiformats/go-multihash"
)

// testRepo builds signed commits the way a PDS does, for crafting
// firehose frames in unit tests.
type testRepo struct {
	t      *testing.T
	did    string
	key    *atcrypto.PrivateKeyK256
	tree   mst.Tree
	blocks map[cid.Cid][]byte
	clock  *syntax.TIDClock
	seq    int64
}

func newTestRepo(t *testing.T, did string) *testRepo {
	t.Helper()
	key, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	return &testRepo{t: t, did: did, key: key, tree: mst.NewEmptyTree(), blocks: map[cid.Cid][]byte{}, clock: syntax.NewTIDClock(0)}
}

// identity returns the repo's identity signed with key (its own when nil).
func (r *testRepo) identity(key *atcrypto.PrivateKeyK256) identity.Identity {
	if key == nil {
		key = r.key
	}
	pub, err := key.PublicKey()
	if err != nil {
		r.t.Fatal(err)
	}
	return identity.Identity{
		DID:  syntax.DID(r.did),
		Keys: map[string]identity.VerificationMethod{"atproto": {Type: "Multikey", PublicKeyMultibase: pub.Multibase()}},
	}
}

// identityAt is the repo's identity with its PDS at url (listings go to a
// DID's own PDS).
func (r *testRepo) identityAt(url string) identity.Identity {
	id := r.identity(nil)
	id.Services = map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: url}}
	return id
}

func (r *testRepo) put(data []byte) cid.Cid {
	c, err := cid.NewPrefixV1(cid.DagCBOR, multihash.SHA2_256).Sum(data)
	if err != nil {
		r.t.Fatal(err)
	}
	r.blocks[c] = data
	return c
}

type testOp struct {
	action, path string
	value        map[string]any
}

// commit applies ops and returns the firehose frame for them.
func (r *testRepo) commit(ops ...testOp) *comatproto.SyncSubscribeRepos_Commit {
	r.t.Helper()
	prev, err := r.tree.RootCID()
	if err != nil {
		r.t.Fatal(err)
	}
	var repoOps []*comatproto.SyncSubscribeRepos_RepoOp
	for _, op := range ops {
		ro := &comatproto.SyncSubscribeRepos_RepoOp{Action: op.action, Path: op.path}
		old, _ := r.tree.Get([]byte(op.path))
		if old != nil {
			l := lexutil.LexLink(*old)
			ro.Prev = &l
		}
		if op.action == "delete" {
			if _, err := r.tree.Remove([]byte(op.path)); err != nil {
				r.t.Fatal(err)
			}
		} else {
			raw, err := atdata.MarshalCBOR(op.value)
			if err != nil {
				r.t.Fatal(err)
			}
			c := r.put(raw)
			if _, err := r.tree.Insert([]byte(op.path), c); err != nil {
				r.t.Fatal(err)
			}
			l := lexutil.LexLink(c)
			ro.Cid = &l
		}
		repoOps = append(repoOps, ro)
	}
	// Every node of the tree: a tree built afresh has only dirty nodes.
	full := mst.NewEmptyTree()
	for k, v := range r.treeMap() {
		if _, err := full.Insert([]byte(k), v); err != nil {
			r.t.Fatal(err)
		}
	}
	ctx := context.Background()
	bs := blockstore.NewBlockstore(datastore.NewMapDatastore()) //nolint:staticcheck // SA1019: indigo's mst.Tree.WriteDiffBlocks takes this package's Blockstore
	dataCID, err := full.WriteDiffBlocks(ctx, bs)
	if err != nil {
		r.t.Fatal(err)
	}
	keys, err := bs.AllKeysChan(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	for c := range keys {
		blk, err := bs.Get(ctx, c)
		if err != nil {
			r.t.Fatal(err)
		}
		r.put(blk.RawData()) // the store lists keys as raw CIDs; nodes are dag-cbor
	}
	rev := r.clock.Next().String()
	cm := repo.Commit{DID: r.did, Version: repo.ATPROTO_REPO_VERSION, Data: *dataCID, Rev: rev}
	if err := cm.Sign(r.key); err != nil {
		r.t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := cm.MarshalCBOR(&buf); err != nil {
		r.t.Fatal(err)
	}
	commitCID := r.put(buf.Bytes())
	var carBuf bytes.Buffer
	if err := car.WriteHeader(&car.CarHeader{Roots: []cid.Cid{commitCID}, Version: 1}, &carBuf); err != nil {
		r.t.Fatal(err)
	}
	for c, b := range r.blocks {
		if err := carutil.LdWrite(&carBuf, c.Bytes(), b); err != nil {
			r.t.Fatal(err)
		}
	}
	r.seq++
	prevLink := lexutil.LexLink(*prev)
	return &comatproto.SyncSubscribeRepos_Commit{
		Repo: r.did, Rev: rev, Seq: r.seq, Time: time.Now().UTC().Format(time.RFC3339Nano),
		Blocks: carBuf.Bytes(), Ops: repoOps, PrevData: &prevLink, Commit: lexutil.LexLink(commitCID),
	}
}

func (r *testRepo) treeMap() map[string]cid.Cid {
	m := map[string]cid.Cid{}
	if err := r.tree.WriteToMap(m); err != nil {
		r.t.Fatal(err)
	}
	return m
}

// corruptLink returns a link to a block that is not the record.
func corruptLink(t *testing.T, r *testRepo) *lexutil.LexLink {
	t.Helper()
	c := r.put([]byte{0xa1, 0x61, 0x78, 0x01}) // {"x": 1}
	l := lexutil.LexLink(c)
	return &l
}
