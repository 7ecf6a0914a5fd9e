package sshgateway

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	gatewayv1alpha1 "github.com/knotless-dev/knotless/apis/gateway/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/market/markettest"
	"github.com/knotless-dev/knotless/internal/tenantreach"
)

const (
	ws      = "ws-shop"
	shop    = "did:plc:shop"
	lease   = "at://did:plc:fit/dev.knotless.market.lease/3lease"
	hostKey = "SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s"
)

type fixture struct {
	r       *Reconciler
	cl      *clustertest.Cluster
	repo    *markettest.Repo
	reaches *tenantreach.Registry
}

func readyCond() []metav1.Condition {
	return []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.Now()}}
}

// newFixture is the requester's workspace: shop's Ready identity, its
// Active contract web-0 mounted with a lease naming the SSH gateway
// address (and hostKey), and objs.
func newFixture(t *testing.T, address string, objs ...client.Object) *fixture {
	t.Helper()
	f := &fixture{repo: markettest.New(shop), reaches: &tenantreach.Registry{}}
	cc := &marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-0", UID: "cc-uid"},
		Spec: marketv1alpha1.ComputeContractSpec{Side: marketv1alpha1.SideRequester, RequesterDID: shop, BidderDID: "did:plc:fit"},
		Status: marketv1alpha1.ComputeContractStatus{Phase: marketv1alpha1.ContractActive,
			Records: marketv1alpha1.ContractRecords{Lease: &marketv1alpha1.RecordRef{URI: lease, CID: "bafylease"}}}}
	repo := &atprotov1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "shop"}}
	repo.Status.DID, repo.Status.Conditions = shop, readyCond()
	id := &marketv1alpha1.MarketIdentity{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "shop"},
		Spec: marketv1alpha1.MarketIdentitySpec{RepoRef: marketv1alpha1.LocalRef{Name: "shop"}}}
	id.Status.DID, id.Status.Conditions = shop, readyCond()
	f.cl = clustertest.New(append(objs, cc, repo, id)...)
	tn := deal.Tenant{Endpoint: "https://tenant.example:6443"}
	if address != "" {
		tn.SSHAddress, tn.SSHHostKey = address, hostKey
	}
	f.reaches.Put(ws, cc.UID, tenantreach.Reach{Tenant: tn, Client: func(context.Context, time.Time) (kubernetes.Interface, error) { return nil, nil }})
	f.r = &Reconciler{GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{ws: f.cl}), Reaches: f.reaches,
		Connect: func(context.Context, client.Client, string, *atprotov1alpha1.AtprotoRepo) (market.Publisher, error) {
			return f.repo, nil
		}}
	return f
}

func sshgw(name string, namespaces ...string) *gatewayv1alpha1.SshGateway {
	return &gatewayv1alpha1.SshGateway{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(name + "-uid"), Generation: 1},
		Spec: gatewayv1alpha1.SshGatewaySpec{ContractRef: gatewayv1alpha1.ContractRef{Name: "web-0"}, Namespaces: namespaces}}
}

func (f *fixture) reconcile(t *testing.T, name string) {
	t.Helper()
	if _, err := f.r.Reconcile(t.Context(), mcreconcile.Request{ClusterName: ws, Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}}); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) get(t *testing.T, name string) *gatewayv1alpha1.SshGateway {
	t.Helper()
	g := &gatewayv1alpha1.SshGateway{}
	if err := f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: name}, g); err != nil {
		t.Fatal(err)
	}
	return g
}

func (f *fixture) record(t *testing.T, name string) *sshRecord {
	t.Helper()
	rec, _ := f.repo.Get(t.Context(), lexicon.GatewaySSH, "default."+name)
	if rec == nil {
		return nil
	}
	var r sshRecord
	if err := json.Unmarshal(rec.Value, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// TestSshGatewayPublishes: the record names the contract's lease and the
// namespaces (sorted), once; the status has the lease's address, host
// key and the command; a change of namespaces is published; deletion
// deletes the record.
func TestSshGatewayPublishes(t *testing.T) {
	f := newFixture(t, "ssh.fit.example:2222", sshgw("shell", "web", "jobs"))
	f.reconcile(t, "shell")
	r := f.record(t, "shell")
	if r == nil || r.Lease.URI != lease || !slices.Equal(r.Namespaces, []string{"jobs", "web"}) {
		t.Fatalf("record %+v", r)
	}
	g := f.get(t, "shell")
	if g.Status.Address != "ssh.fit.example:2222" || g.Status.HostKey != hostKey || g.Status.Record == nil ||
		g.Status.Tenant != "3lease" || g.Status.Command != "ssh -p 2222 <handle-or-did>@ssh.fit.example -- 3lease/<namespace>/<pod> [command]" || !controllerutil.ContainsFinalizer(g, Finalizer) {
		t.Fatalf("status %+v", g.Status)
	}
	if c := clustertest.Condition(t, g.Status.Conditions, gatewayv1alpha1.ConditionReady); c.Status != metav1.ConditionTrue {
		t.Fatalf("Ready %+v", c)
	}
	f.reconcile(t, "shell")
	if f.repo.Writes != 1 {
		t.Fatalf("%d writes, want 1", f.repo.Writes)
	}
	g.Spec.Namespaces = []string{"web"}
	g.Generation++
	if err := f.cl.Client.Update(t.Context(), g); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "shell")
	if r := f.record(t, "shell"); r == nil || !slices.Equal(r.Namespaces, []string{"web"}) || f.repo.Writes != 2 {
		t.Fatalf("after the change: %+v (%d writes)", r, f.repo.Writes)
	}
	if err := f.cl.Client.Delete(t.Context(), f.get(t, "shell")); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "shell")
	if f.record(t, "shell") != nil {
		t.Fatal("the record stays after the SshGateway was deleted")
	}
}

// TestSshGatewayWaits: no SSH gateway in the lease: published, not
// Ready; the contract ending deletes the record; a record that is not
// this SshGateway's (another lease) is left alone.
func TestSshGatewayWaits(t *testing.T) {
	f := newFixture(t, "", sshgw("shell", "web"))
	f.reconcile(t, "shell")
	g := f.get(t, "shell")
	if c := clustertest.Condition(t, g.Status.Conditions, gatewayv1alpha1.ConditionReady); c.Reason != gatewayv1alpha1.ReasonNoGateway || f.record(t, "shell") == nil {
		t.Fatalf("Ready %+v", c)
	}
	cc := &marketv1alpha1.ComputeContract{}
	_ = f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "web-0"}, cc)
	cc.Status.Phase = marketv1alpha1.ContractCompleted
	if err := f.cl.Client.Status().Update(t.Context(), cc); err != nil {
		t.Fatal(err)
	}
	f.reaches.Delete(ws, cc.UID)
	f.reconcile(t, "shell")
	if c := clustertest.Condition(t, f.get(t, "shell").Status.Conditions, gatewayv1alpha1.ConditionPublished); c.Reason != gatewayv1alpha1.ReasonContractNotActive || f.record(t, "shell") != nil {
		t.Fatalf("after the contract ended: %+v, record %+v", c, f.record(t, "shell"))
	}

	f = newFixture(t, "ssh.fit.example:22", sshgw("shell", "web"))
	f.reconcile(t, "shell")
	other, _ := json.Marshal(map[string]any{"$type": lexicon.GatewaySSH, "lease": map[string]any{"uri": "at://did:plc:fit/dev.knotless.market.lease/other", "cid": "bafyx"},
		"namespaces": []string{"web"}, "createdAt": "2026-12-05T10:00:00Z"})
	f.repo.Put(lexicon.GatewaySSH, "default.shell", other)
	cc = &marketv1alpha1.ComputeContract{}
	_ = f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "web-0"}, cc)
	cc.Status.Phase = marketv1alpha1.ContractCompleted
	_ = f.cl.Client.Status().Update(t.Context(), cc)
	f.reconcile(t, "shell")
	if f.record(t, "shell") == nil {
		t.Fatal("a record of another lease was deleted")
	}
}
