package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	tenancyv1alpha1 "github.com/kcp-dev/sdk/apis/tenancy/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/pds"
)

const testCollection = "dev.knotless.test.note"

// appWorkspace creates a socialweb-application workspace and returns a
// client for it and its logical cluster name.
func appWorkspace(ctx context.Context, t *testing.T, name string) (client.Client, string) {
	t.Helper()
	if err := framework.CreateWorkspace(ctx, env.admin, root, name, env.appType); err != nil {
		t.Fatal(err)
	}
	if err := framework.WaitWorkspaceReady(ctx, env.admin, root, name, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	pc, err := framework.ClientFor(env.admin, root)
	if err != nil {
		t.Fatal(err)
	}
	ws := &tenancyv1alpha1.Workspace{}
	if err := pc.Get(ctx, client.ObjectKey{Name: name}, ws); err != nil {
		t.Fatal(err)
	}
	c, err := framework.ClientFor(env.admin, root.Join(name))
	if err != nil {
		t.Fatal(err)
	}
	return c, ws.Spec.Cluster
}

func secretRepo(name, identifier, secret string) *atprotov1alpha1.AtprotoRepo {
	return &atprotov1alpha1.AtprotoRepo{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: atprotov1alpha1.AtprotoRepoSpec{
			PDS: atprotov1alpha1.PDS{URL: env.pds.URL},
			Credential: atprotov1alpha1.Credential{
				Identifier:   identifier,
				SecretKeyRef: &atprotov1alpha1.SecretKeyRef{Name: secret, Key: "password"},
			},
		},
	}
}

func passwordSecret(name, password string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		StringData: map[string]string{"password": password},
	}
}

func record(name, repo, rkey, value string) *atprotov1alpha1.AtprotoRecord {
	return &atprotov1alpha1.AtprotoRecord{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: atprotov1alpha1.AtprotoRecordSpec{
			RepoRef:    atprotov1alpha1.LocalObjectRef{Name: repo},
			Collection: testCollection,
			RKey:       rkey,
			Value:      apiextensionsv1.JSON{Raw: []byte(value)},
		},
	}
}

func create(ctx context.Context, t *testing.T, c client.Client, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := c.Create(ctx, o, client.FieldOwner("e2e-user")); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
}

// waitRepo waits until the repo's Ready condition has the reason.
func waitRepo(ctx context.Context, t *testing.T, c client.Client, name, reason string) *atprotov1alpha1.AtprotoRepo {
	t.Helper()
	repo := &atprotov1alpha1.AtprotoRepo{}
	if err := framework.Eventually(ctx, 90*time.Second, fmt.Sprintf("AtprotoRepo %s Ready reason %s", name, reason), func(ctx context.Context) (bool, string, error) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, repo); err != nil {
			return false, err.Error(), nil
		}
		cond := meta.FindStatusCondition(repo.Status.Conditions, atprotov1alpha1.ConditionReady)
		if cond == nil {
			return false, "no Ready condition", nil
		}
		return cond.Reason == reason && cond.ObservedGeneration == repo.Generation, cond.Reason + ": " + cond.Message, nil
	}); err != nil {
		t.Fatal(err)
	}
	return repo
}

// waitRecord waits until the record's Synced condition has the reason for
// its current generation and ok (if given) holds.
func waitRecord(ctx context.Context, t *testing.T, c client.Client, name, reason string, ok func(*atprotov1alpha1.AtprotoRecord) bool) *atprotov1alpha1.AtprotoRecord {
	t.Helper()
	rec := &atprotov1alpha1.AtprotoRecord{}
	if err := framework.Eventually(ctx, 2*time.Minute, fmt.Sprintf("AtprotoRecord %s Synced reason %s", name, reason), func(ctx context.Context) (bool, string, error) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, rec); err != nil {
			return false, err.Error(), nil
		}
		cond := meta.FindStatusCondition(rec.Status.Conditions, atprotov1alpha1.ConditionSynced)
		if cond == nil {
			return false, "no Synced condition", nil
		}
		done := cond.Reason == reason && cond.ObservedGeneration == rec.Generation && rec.Status.ObservedGeneration == rec.Generation
		if done && ok != nil {
			done = ok(rec)
		}
		return done, cond.Reason + ": " + cond.Message, nil
	}); err != nil {
		t.Fatal(err)
	}
	return rec
}

type pdsRecord struct {
	URI   string          `json:"uri"`
	CID   string          `json:"cid"`
	Value json.RawMessage `json:"value"`
}

// getRecord reads a record straight from the suite's PDS with a plain
// XRPC call.
func getRecord(ctx context.Context, did, collection, rkey string) (*pdsRecord, error) {
	return getRecordFrom(ctx, env.pds, did, collection, rkey)
}

// getRecordFrom reads a record from pds with a plain XRPC call.
func getRecordFrom(ctx context.Context, pds *framework.PDS, did, collection, rkey string) (*pdsRecord, error) {
	var out pdsRecord
	if err := pds.XRPC(ctx, "com.atproto.repo.getRecord", "", url.Values{"repo": {did}, "collection": {collection}, "rkey": {rkey}}, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func isNotFound(err error) bool {
	var xe *framework.XRPCError
	return errors.As(err, &xe) && xe.Name == "RecordNotFound"
}

func field(raw json.RawMessage, key string) string {
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return fmt.Sprint(m[key])
}

// TestAtprotoRecordLifecycle: a repo becomes Ready through a Secret; a
// record is created, updated, restored after a change and a deletion
// behind knotless's back, and deleted — each step checked with a direct
// getRecord to the PDS.
func TestAtprotoRecordLifecycle(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	c, _ := appWorkspace(ctx, t, env.prefix+"-records")
	acct, err := env.pds.CreateAccount(ctx, env.prefix+"rec.test")
	if err != nil {
		t.Fatal(err)
	}
	create(ctx, t, c, passwordSecret("cred", acct.AppPassword), secretRepo("repo", acct.Handle, "cred"))
	repo := waitRepo(ctx, t, c, "repo", atprotov1alpha1.ReasonReady)
	if repo.Status.DID != acct.DID || repo.Status.Handle != acct.Handle || repo.Status.Rev == "" {
		t.Fatalf("repo status %+v, want did %s handle %s and a rev", repo.Status, acct.DID, acct.Handle)
	}

	create(ctx, t, c, record("note", "repo", "self", `{"text":"hello","n":1}`))
	rec := waitRecord(ctx, t, c, "note", atprotov1alpha1.ReasonSynced, nil)
	got, err := getRecord(ctx, acct.DID, testCollection, "self")
	if err != nil {
		t.Fatal(err)
	}
	if got.CID != rec.Status.CID || got.URI != rec.Status.URI || field(got.Value, "text") != "hello" {
		t.Fatalf("PDS has %s %s %s; status says %s %s", got.URI, got.CID, got.Value, rec.Status.URI, rec.Status.CID)
	}
	if len(rec.OwnerReferences) != 0 || len(rec.Finalizers) != 0 {
		t.Errorf("record owner references %v, finalizers %v: want none (the record is in the repo's inventory on the PDS)", rec.OwnerReferences, rec.Finalizers)
	}
	if _, err := getRecord(ctx, acct.DID, pds.InventoryCollection, pds.MarkerKey(string(repo.UID), pds.Key{Collection: testCollection, RKey: "self"})); err != nil {
		t.Errorf("the record's marker in the repo's inventory: %v", err)
	}

	// Update: compare-and-swap on the last observed CID.
	rec.Spec.Value = apiextensionsv1.JSON{Raw: []byte(`{"text":"hello again","n":2}`)}
	if err := c.Update(ctx, rec, client.FieldOwner("e2e-user")); err != nil {
		t.Fatal(err)
	}
	old := rec.Status.CID
	rec = waitRecord(ctx, t, c, "note", atprotov1alpha1.ReasonSynced, func(r *atprotov1alpha1.AtprotoRecord) bool { return r.Status.CID != old })
	if got, err = getRecord(ctx, acct.DID, testCollection, "self"); err != nil || got.CID != rec.Status.CID || field(got.Value, "text") != "hello again" {
		t.Fatalf("after update the PDS has %+v (%v); status CID %s", got, err, rec.Status.CID)
	}

	// Changed behind knotless's back: restored on the next resync.
	sess, err := env.pds.CreateSession(ctx, acct.Handle, acct.Password)
	if err != nil {
		t.Fatal(err)
	}
	tampered := map[string]any{"repo": acct.DID, "collection": testCollection, "rkey": "self", "record": map[string]any{"$type": testCollection, "text": "tampered"}}
	if err := env.pds.XRPC(ctx, "com.atproto.repo.putRecord", sess.AccessJWT, nil, tampered, nil); err != nil {
		t.Fatal(err)
	}
	waitPDS(ctx, t, "the tampered record to be restored", func() (bool, string) {
		got, err := getRecord(ctx, acct.DID, testCollection, "self")
		if err != nil {
			return false, err.Error()
		}
		return field(got.Value, "text") == "hello again", string(got.Value)
	})
	// Deleted behind knotless's back: restored too.
	del := map[string]any{"repo": acct.DID, "collection": testCollection, "rkey": "self"}
	if err := env.pds.XRPC(ctx, "com.atproto.repo.deleteRecord", sess.AccessJWT, nil, del, nil); err != nil {
		t.Fatal(err)
	}
	waitPDS(ctx, t, "the deleted record to be restored", func() (bool, string) {
		got, err := getRecord(ctx, acct.DID, testCollection, "self")
		if err != nil {
			return false, err.Error()
		}
		return field(got.Value, "text") == "hello again", string(got.Value)
	})
	waitEvent(ctx, t, c, "note", "Restored")

	// Delete: the object goes at once, and its record (with its marker)
	// leaves the PDS.
	if err := c.Delete(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := framework.Eventually(ctx, time.Minute, "the AtprotoRecord to be gone", func(ctx context.Context) (bool, string, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(rec), &atprotov1alpha1.AtprotoRecord{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), nil
	}); err != nil {
		t.Fatal(err)
	}
	waitPDS(ctx, t, "the deleted record to leave the PDS", func() (bool, string) {
		_, err := getRecord(ctx, acct.DID, testCollection, "self")
		return isNotFound(err), fmt.Sprint(err)
	})
	if inv := listCollection(ctx, t, env.pds, acct.DID, pds.InventoryCollection); len(inv) != 0 {
		t.Fatalf("the repo's inventory still lists %v", inv)
	}
}

func waitPDS(ctx context.Context, t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	if err := framework.Eventually(ctx, time.Minute, what, func(context.Context) (bool, string, error) {
		ok, state := cond()
		return ok, state, nil
	}); err != nil {
		t.Fatal(err)
	}
}

func waitEvent(ctx context.Context, t *testing.T, c client.Client, object, reason string) {
	t.Helper()
	if err := framework.Eventually(ctx, time.Minute, fmt.Sprintf("an Event %s for %s", reason, object), func(ctx context.Context) (bool, string, error) {
		var evs corev1.EventList
		if err := c.List(ctx, &evs, client.InNamespace("default")); err != nil {
			return false, err.Error(), nil
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == object && e.Reason == reason {
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("%d events", len(evs.Items)), nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestAtprotoRepoCredentials: a Vault credential under the prefix of the
// repo's workspace and namespace works; a wrong password, an unreachable
// PDS, a Secret that exists only in another workspace, a Vault path of
// another workspace and one of another namespace of the same workspace
// (R19) are refused with a reason, and none of them is read.
func TestAtprotoRepoCredentials(t *testing.T) {
	if env.vault == nil {
		t.Skip("KNOTLESS_E2E_SKIP_VAULT is set")
	}
	defer failWithLogs(t)
	ctx := t.Context()
	ca, lcA := appWorkspace(ctx, t, env.prefix+"-cred-a")
	cb, lcB := appWorkspace(ctx, t, env.prefix+"-cred-b")
	acct, err := env.pds.CreateAccount(ctx, env.prefix+"cred.test")
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{lcA + "/default", lcB + "/default", lcA + "/other"} {
		if _, err := env.vault.Write(ctx, "secret/data/knotless/"+dir+"/account", map[string]any{"data": map[string]any{"password": acct.AppPassword}}); err != nil {
			t.Fatal(err)
		}
	}
	create(ctx, t, cb, passwordSecret("only-in-b", acct.AppPassword))

	vaultRepo := func(name, dir string) *atprotov1alpha1.AtprotoRepo {
		r := secretRepo(name, acct.Handle, "")
		r.Spec.Credential.SecretKeyRef = nil
		r.Spec.Credential.Vault = &atprotov1alpha1.VaultKeyRef{Mount: "secret", Path: "knotless/" + dir + "/account", Key: "password"}
		return r
	}
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	unreachable := secretRepo("unreachable", acct.Handle, "cred")
	unreachable.Spec.PDS.URL = fmt.Sprintf("http://127.0.0.1:%d", port)
	create(ctx, t, ca,
		passwordSecret("cred", acct.AppPassword),
		passwordSecret("wrong", "aaaa-bbbb-cccc-dddd"),
		vaultRepo("from-vault", lcA+"/default"),
		vaultRepo("foreign-vault", lcB+"/default"),
		vaultRepo("other-namespace", lcA+"/other"),
		secretRepo("foreign-secret", acct.Handle, "only-in-b"),
		secretRepo("wrong-password", acct.Handle, "wrong"),
		unreachable,
	)
	if r := waitRepo(ctx, t, ca, "from-vault", atprotov1alpha1.ReasonReady); r.Status.DID != acct.DID {
		t.Errorf("from-vault: DID %q, want %q", r.Status.DID, acct.DID)
	}
	waitRepo(ctx, t, ca, "foreign-vault", atprotov1alpha1.ReasonCredentialNotFound)
	waitRepo(ctx, t, ca, "other-namespace", atprotov1alpha1.ReasonCredentialNotFound)
	waitRepo(ctx, t, ca, "foreign-secret", atprotov1alpha1.ReasonCredentialNotFound)
	waitRepo(ctx, t, ca, "wrong-password", atprotov1alpha1.ReasonAuthenticationFailed)
	waitRepo(ctx, t, ca, "unreachable", atprotov1alpha1.ReasonPDSUnreachable)

	// Nothing under B's prefix, or under another namespace of A, was read
	// by the provider.
	audit, err := os.ReadFile(env.vaultAudit)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(audit), "\n") {
		if !strings.Contains(line, `"type":"request"`) || !strings.Contains(line, `"operation":"read"`) {
			continue
		}
		if strings.Contains(line, "knotless/"+lcB+"/") || strings.Contains(line, "knotless/"+lcA+"/other/") {
			t.Errorf("Vault audit log shows a read outside the repo's namespace prefix: %s", line)
		}
	}
	// No secret in status or events.
	var repos atprotov1alpha1.AtprotoRepoList
	if err := ca.List(ctx, &repos); err != nil {
		t.Fatal(err)
	}
	var evs corev1.EventList
	if err := ca.List(ctx, &evs); err != nil {
		t.Fatal(err)
	}
	dump, _ := json.Marshal([]any{repos.Items, evs.Items})
	if strings.Contains(string(dump), acct.AppPassword) {
		t.Error("the app password appears in a status or an event")
	}
	if logs, err := os.ReadFile(env.provider.LogPath); err == nil && strings.Contains(string(logs), acct.AppPassword) {
		t.Error("the app password appears in the provider's log")
	}
}

// TestAtprotoInvalidSpec: bad records say InvalidSpec naming the field and
// nothing is written to the PDS.
func TestAtprotoInvalidSpec(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	c, _ := appWorkspace(ctx, t, env.prefix+"-invalid")
	acct, err := env.pds.CreateAccount(ctx, env.prefix+"inv.test")
	if err != nil {
		t.Fatal(err)
	}
	create(ctx, t, c, passwordSecret("cred", acct.AppPassword), secretRepo("repo", acct.Handle, "cred"))
	waitRepo(ctx, t, c, "repo", atprotov1alpha1.ReasonReady)
	// What the schema can say is refused at admission, naming the field.
	refused := map[string]*atprotov1alpha1.AtprotoRecord{
		"spec.collection": record("bad-nsid", "repo", "a", `{"text":"x"}`),
		"spec.rkey":       record("bad-rkey", "repo", "a/b", `{"text":"x"}`),
	}
	refused["spec.collection"].Spec.Collection = "not an nsid"
	for field, r := range refused {
		if err := c.Create(ctx, r); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v, want Invalid naming %s", r.Name, err, field)
		}
	}
	// A collection another kind owns is refused at admission, naming it
	// (R22).
	for name, owned := range map[string]struct{ collection, owner string }{
		"owned-presence":  {"dev.knotless.market.presence", "MarketPresence"},
		"owned-release":   {"DEV.Knotless.Market.release", "MarketRequester"},
		"owned-inventory": {"dev.knotless.inventory", "inventory"},
	} {
		r := record(name, "repo", "o", `{}`)
		r.Spec.Collection = owned.collection
		if err := c.Create(ctx, r); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), owned.owner) {
			t.Errorf("%s: %v, want Invalid naming %s", owned.collection, err, owned.owner)
		}
	}
	// What only the controller can judge is a condition.
	bad := map[string]*atprotov1alpha1.AtprotoRecord{
		"float":  record("bad-float", "repo", "b", `{"x":1.5}`),
		"bigint": record("bad-bigint", "repo", "c", `{"x":9007199254740993}`),
		"$type":  record("bad-type", "repo", "d", `{"$type":"app.bsky.feed.post","text":"x"}`),
	}
	for _, r := range bad {
		create(ctx, t, c, r)
	}
	for _, r := range bad {
		got := waitRecord(ctx, t, c, r.Name, atprotov1alpha1.ReasonInvalidSpec, nil)
		msg := meta.FindStatusCondition(got.Status.Conditions, atprotov1alpha1.ConditionSynced).Message
		if ready := meta.FindStatusCondition(got.Status.Conditions, atprotov1alpha1.ConditionReady); ready == nil || ready.Reason != atprotov1alpha1.ReasonInvalidSpec {
			t.Errorf("%s: Ready %+v, want InvalidSpec like Synced", r.Name, ready)
		}
		if !strings.Contains(msg, "value") {
			t.Errorf("%s: message %q does not name the value", r.Name, msg)
		}
	}
	// repoRef, collection and rkey cannot change: the message says what to do.
	moved := bad["float"].DeepCopy()
	if err := c.Get(ctx, client.ObjectKeyFromObject(moved), moved); err != nil {
		t.Fatal(err)
	}
	moved.Spec.RKey = "elsewhere"
	if err := c.Update(ctx, moved); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "delete the AtprotoRecord and create it again") {
		t.Errorf("changing rkey: %v, want Invalid saying to delete and recreate", err)
	}
	var list struct {
		Records []json.RawMessage `json:"records"`
	}
	if err := env.pds.XRPC(ctx, "com.atproto.repo.listRecords", "", url.Values{"repo": {acct.DID}, "collection": {testCollection}}, nil, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Records) != 0 {
		t.Fatalf("invalid records reached the PDS: %s", list.Records)
	}
}
