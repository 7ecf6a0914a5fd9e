package marketpresence

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/markettest"
	"github.com/knotless-dev/knotless/internal/pds"
)

const otherDID = "did:plc:vwzwgnygau7ed7b7wt5ux7y2"

// TestAttackForgedRecordURI: a user forges status.record.uri of a
// MarketPresence to name another account's record; that account's repo
// exists only in another namespace. Deleting the presence connects to no
// repo outside the namespace, touches no record of the other account,
// and lets the object go.
func TestAttackForgedRecordURI(t *testing.T) {
	for _, uri := range []string{
		"at://" + otherDID + "/" + lexicon.Presence + "/b",
		"at://" + otherDID,
		"at://" + otherDID + "/../" + did + "/x",
		"at:///" + otherDID,
		"",
		strings.Repeat("at://", 1000),
	} {
		t.Run(uri[:min(len(uri), 60)], func(t *testing.T) {
			objs := fixtures()
			p := objs[2].(*marketv1alpha1.MarketPresence)
			p.Finalizers = []string{Finalizer}
			p.Status.Record = &marketv1alpha1.PublishedRecord{URI: uri, CID: "bafyforged"}
			victimRepo := &atprotov1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: "victim", Name: "repo"}}
			victimRepo.Status = atprotov1alpha1.AtprotoRepoStatus{DID: otherDID, Conditions: readyCond()}
			victimRepo2 := victimRepo.DeepCopy()
			victimRepo2.Name = "other-repo"
			own := markettest.New(did)
			victim := markettest.New(otherDID)
			victim.Put(lexicon.Presence, "b", []byte(`{"victim":true}`))
			r, ws, _ := setup(own, append(objs, victimRepo, victimRepo2)...)
			var connected []string
			r.Connect = func(_ context.Context, _ client.Client, _ string, repo *atprotov1alpha1.AtprotoRepo) (market.Publisher, error) {
				connected = append(connected, repo.Namespace+"/"+repo.Name)
				if repo.Namespace != ns || repo.Status.DID == otherDID {
					return victim, nil
				}
				return own, nil
			}
			if err := ws.Client.Delete(context.Background(), get(t, ws)); err != nil {
				t.Fatal(err)
			}
			reconcileIt(t, r)
			for _, c := range connected {
				if !strings.HasPrefix(c, ns+"/") {
					t.Errorf("deletion connected to %s, a repo of another namespace", c)
				}
			}
			if victim.Writes != 0 {
				t.Errorf("%d writes to the other account's repo", victim.Writes)
			}
			if rec, _ := victim.Get(context.Background(), lexicon.Presence, "b"); rec == nil {
				t.Error("the other account's presence record was deleted")
			}
			err := ws.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "b"}, &marketv1alpha1.MarketPresence{})
			if !apierrors.IsNotFound(err) {
				t.Errorf("the presence is still there after finalizing: %v", err)
			}
		})
	}
}

// TestAttackTamperedRecordIsRewritten: the presence record on the PDS is
// changed behind knotless's back to invalid JSON or another shape; the
// next reconcile writes the desired record again, which matches the
// lexicon, and status names what was written.
func TestAttackTamperedRecordIsRewritten(t *testing.T) {
	repo := markettest.New(did)
	r, ws, _ := setup(repo, fixtures()...)
	reconcileIt(t, r)
	orig, _ := repo.Get(context.Background(), lexicon.Presence, "b")
	if orig == nil {
		t.Fatal("nothing published")
	}
	good := string(orig.Value)
	if !strings.Contains(good, `"amount":25`) || !strings.Contains(good, `"driver":"process"`) {
		t.Fatalf("unexpected record %s", good)
	}
	tampered := map[string]string{
		"not JSON":            `not json`,
		"truncated":           good[:len(good)/2],
		"empty":               ``,
		"null":                `null`,
		"array":               `[` + good + `]`,
		"empty object":        `{}`,
		"string amount":       strings.Replace(good, `"amount":25`, `"amount":"25"`, 1),
		"float amount":        strings.Replace(good, `"amount":25`, `"amount":25.0`, 1),
		"huge amount":         strings.Replace(good, `"amount":25`, `"amount":1e400`, 1),
		"other $type":         strings.Replace(good, `"$type":"`+lexicon.Presence+`"`, `"$type":"app.bsky.feed.post"`, 1),
		"bad updatedAt":       strings.Replace(good, `"updatedAt":"2026-12-01T12:00:00Z"`, `"updatedAt":"never"`, 1),
		"no updatedAt":        strings.Replace(good, `,"updatedAt":"2026-12-01T12:00:00Z"`, ``, 1),
		"extra field":         strings.TrimSuffix(good, "}") + `,"evil":true}`,
		"duplicate last":      strings.TrimSuffix(good, "}") + `,"driver":"evil"}`,
		"deep":                strings.TrimSuffix(good, "}") + `,"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`,
		"invalid UTF-8 field": strings.Replace(good, `"driver":"process"`, "\"driver\":\"process\",\"x\":\"\xff\"", 1),
	}
	for name, v := range tampered {
		repo.Put(lexicon.Presence, "b", []byte(v))
		before := repo.Writes
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("%s: reconcile panicked: %v", name, p)
				}
			}()
			reconcileIt(t, r)
		}()
		rec, _ := repo.Get(context.Background(), lexicon.Presence, "b")
		if rec == nil || !pds.JSONEqual(rec.Value, orig.Value) {
			got := "<none>"
			if rec != nil {
				got = string(rec.Value)
			}
			t.Errorf("%s: record %.200s was not rewritten to the desired one", name, got)
			continue
		}
		if err := lexicon.ValidateRecord(lexicon.Presence, rec.Value); err != nil {
			t.Errorf("%s: the rewritten record does not match the lexicon: %v", name, err)
		}
		if repo.Writes != before+1 {
			t.Errorf("%s: %d writes, want 1", name, repo.Writes-before)
		}
		p := get(t, ws)
		if p.Status.Phase != marketv1alpha1.PhaseReady || p.Status.Record == nil || p.Status.Record.CID != rec.CID {
			t.Errorf("%s: status %+v, want Ready naming CID %s", name, p.Status, rec.CID)
		}
	}
}
