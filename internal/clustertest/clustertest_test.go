package clustertest

import (
	"context"
	"errors"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"

	"github.com/knotless-dev/knotless/apis"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/internal/ssa"
)

func TestGetter(t *testing.T) {
	ws := New()
	get := Getter(map[string]*Cluster{"lc1": ws})
	if cl, err := get(context.Background(), "lc1"); err != nil || cl != ws {
		t.Fatalf("lc1: %v, %v", cl, err)
	}
	if _, err := get(context.Background(), "lc2"); !errors.Is(err, multicluster.ErrClusterNotFound) {
		t.Fatalf("unknown workspace: %v, want ErrClusterNotFound", err)
	}
}

func TestKnotlessKindsHaveStatusSubresource(t *testing.T) {
	var kinds []string
	for _, o := range knotlessKinds(apis.NewScheme()) {
		kinds = append(kinds, kindOf(o))
	}
	slices.Sort(kinds)
	want := []string{"Application", "AtprotoRecord", "AtprotoRecordWatch", "AtprotoRepo", "ClusterClientCertificate", "Component", "ComputeContract", "ComputeVM",
		"Gateway", "GuestIdentityGrant", "MarketBidder", "MarketIdentity", "MarketNetwork", "MarketPresence", "MarketRequester", "SshGateway", "StateSync", "TenantCluster"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("kinds with a status subresource %v, want %v", kinds, want)
	}

	// An update does not write status; a status update does.
	ctx := context.Background()
	ws := New(&atprotov1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "r"}})
	repo := &atprotov1alpha1.AtprotoRepo{}
	key := client.ObjectKey{Namespace: "ns", Name: "r"}
	if err := ws.Client.Get(ctx, key, repo); err != nil {
		t.Fatal(err)
	}
	repo.Status.DID = "did:plc:x"
	if err := ws.Client.Update(ctx, repo); err != nil {
		t.Fatal(err)
	}
	if err := ws.Client.Get(ctx, key, repo); err != nil || repo.Status.DID != "" {
		t.Fatalf("Update wrote status %+v (%v)", repo.Status, err)
	}
	repo.Status.DID = "did:plc:x"
	if err := ws.Client.Status().Update(ctx, repo); err != nil {
		t.Fatal(err)
	}
	if err := ws.Client.Get(ctx, key, repo); err != nil || repo.Status.DID != "did:plc:x" {
		t.Fatalf("status update lost %+v (%v)", repo.Status, err)
	}
}

func TestRecorder(t *testing.T) {
	ws := New()
	obj := &atprotov1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "r"}}
	ws.GetEventRecorder("ctl").Eventf(obj, nil, "Warning", "Broken", "Sync", "it is %s", "broken")
	got := ws.Events.Events()
	want := []Event{{Controller: "ctl", Object: "ns/r", Type: "Warning", Reason: "Broken", Action: "Sync", Note: "it is broken"}}
	if !slices.Equal(got, want) {
		t.Fatalf("events %+v, want %+v", got, want)
	}
}

func kindOf(o client.Object) string {
	gvks, _, err := apis.NewScheme().ObjectKinds(o)
	if err != nil || len(gvks) == 0 {
		return "?"
	}
	return gvks[0].Kind
}

// The apply emulation keeps what the apply leaves out (spec) and removes
// only the finalizers the same manager applied before.
func TestApplyKeepsSpecAndOwnsFinalizers(t *testing.T) {
	ctx := context.Background()
	rec := &atprotov1alpha1.AtprotoRecord{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "r", UID: "uid-1", Finalizers: []string{"user/keep"}},
		Spec:       atprotov1alpha1.AtprotoRecordSpec{RepoRef: atprotov1alpha1.LocalObjectRef{Name: "repo"}, Collection: "a.b.c", RKey: "k"},
	}
	ws := New(rec)
	key := client.ObjectKeyFromObject(rec)
	get := func() *atprotov1alpha1.AtprotoRecord {
		t.Helper()
		got := &atprotov1alpha1.AtprotoRecord{}
		if err := ws.Client.Get(ctx, key, got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if err := ssa.Metadata(ctx, ws.Client, get(), []string{"a/one", "a/two"}, nil, "mgr-a"); err != nil {
		t.Fatal(err)
	}
	if err := ssa.Metadata(ctx, ws.Client, get(), []string{"a/one"}, nil, "mgr-a"); err != nil {
		t.Fatal(err)
	}
	got := get()
	if !slices.Equal(got.Finalizers, []string{"user/keep", "a/one"}) || got.Spec.Collection != "a.b.c" || got.Spec.RepoRef.Name != "repo" {
		t.Fatalf("after metadata applies: finalizers %v, spec %+v", got.Finalizers, got.Spec)
	}

	st := &atprotov1alpha1.AtprotoRecordStatus{CID: "cid", ObservedGeneration: 3}
	if err := ssa.Status(ctx, ws.Client, got, st, "mgr-a"); err != nil {
		t.Fatal(err)
	}
	if got := get(); got.Status.CID != "cid" || got.Status.ObservedGeneration != 3 || got.Spec.RKey != "k" {
		t.Fatalf("after a status apply: %+v", got)
	}

	other := got.DeepCopy()
	other.UID = "uid-2"
	if err := ssa.Metadata(ctx, ws.Client, other, nil, nil, "mgr-a"); !apierrors.IsConflict(err) {
		t.Fatalf("apply with another UID: %v, want Conflict", err)
	}
	other.Name = "missing"
	if err := ssa.Status(ctx, ws.Client, other, st, "mgr-a"); !apierrors.IsNotFound(err) {
		t.Fatalf("status apply of a missing object: %v, want NotFound", err)
	}
}
