package gateway

import (
	"context"
	"encoding/json"
	"sync"
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
	ws    = "ws-shop"
	shop  = "did:plc:shop"
	lease = "at://did:plc:fit/dev.knotless.market.lease/3lease"
)

var t0 = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)

type fixture struct {
	r       *Reconciler
	cl      *clustertest.Cluster
	repo    *markettest.Repo
	reaches *tenantreach.Registry
	probed  Probed
	mu      sync.Mutex
	probes  []string
	now     time.Time
}

func (f *fixture) probeCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.probes)
}

// settle reconciles Gateway name, lets its probe end, and reconciles it
// again (as the probe's end wakes it).
func (f *fixture) settle(t *testing.T, name string) reconcile.Result {
	t.Helper()
	f.reconcile(t, name)
	f.r.prober().wait()
	return f.reconcile(t, name)
}

func readyCond() []metav1.Condition {
	return []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.NewTime(t0)}}
}

// newFixture is the requester's workspace: shop's Ready identity and
// repo, its Active contract web-0 (mounted, its lease naming the
// gateway gw), and objs.
func newFixture(t *testing.T, gw string, objs ...client.Object) *fixture {
	t.Helper()
	f := &fixture{now: t0, repo: markettest.New(shop), probed: Probed{Reason: gatewayv1alpha1.ReasonServing, Message: "answered"}}
	cc := &marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-0", UID: "cc-uid"},
		Spec: marketv1alpha1.ComputeContractSpec{Side: marketv1alpha1.SideRequester, RequesterDID: shop, BidderDID: "did:plc:fit"},
		Status: marketv1alpha1.ComputeContractStatus{Phase: marketv1alpha1.ContractActive,
			Records: marketv1alpha1.ContractRecords{Lease: &marketv1alpha1.RecordRef{URI: lease, CID: "bafylease"}}}}
	repo := &atprotov1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "shop"}}
	repo.Status.DID, repo.Status.Conditions = shop, readyCond()
	id := &marketv1alpha1.MarketIdentity{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "shop"},
		Spec: marketv1alpha1.MarketIdentitySpec{RepoRef: marketv1alpha1.LocalRef{Name: "shop"}}}
	id.Status.DID, id.Status.Conditions = shop, readyCond()
	f.cl = clustertest.NewWithClient(clustertest.NewClientBuilder().
		WithIndex(&gatewayv1alpha1.Gateway{}, byHostname, func(o client.Object) []string { return []string{o.(*gatewayv1alpha1.Gateway).Spec.Hostname} }).
		WithObjects(append(objs, cc, repo, id)...).Build())
	f.reaches = &tenantreach.Registry{}
	f.reaches.Put(ws, cc.UID, tenantreach.Reach{Tenant: deal.Tenant{Endpoint: "https://tenant.example:6443", Gateway: gw},
		Client: func(context.Context, time.Time) (kubernetes.Interface, error) { return nil, nil }})
	f.r = &Reconciler{GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{ws: f.cl}), Reaches: f.reaches,
		Connect: func(context.Context, client.Client, string, *atprotov1alpha1.AtprotoRepo) (market.Publisher, error) {
			return f.repo, nil
		},
		Probe: func(_ context.Context, address, hostname string) Probed {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.probes = append(f.probes, hostname+"@"+address)
			return f.probed
		},
		Now: func() time.Time { return f.now }}
	return f
}

func gw(name, host string, created time.Time) *gatewayv1alpha1.Gateway {
	return &gatewayv1alpha1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(name + "-uid"), Generation: 1,
		CreationTimestamp: metav1.NewTime(created)},
		Spec: gatewayv1alpha1.GatewaySpec{ContractRef: gatewayv1alpha1.ContractRef{Name: "web-0"}, Hostname: host,
			Service: gatewayv1alpha1.ServiceRef{Namespace: "default", Name: "web", Port: 80}}}
}

func (f *fixture) reconcile(t *testing.T, name string) reconcile.Result {
	t.Helper()
	res, err := f.r.Reconcile(t.Context(), mcreconcile.Request{ClusterName: ws, Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func (f *fixture) get(t *testing.T, name string) *gatewayv1alpha1.Gateway {
	t.Helper()
	g := &gatewayv1alpha1.Gateway{}
	if err := f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: name}, g); err != nil {
		t.Fatal(err)
	}
	return g
}

func (f *fixture) conds(t *testing.T, name string) (published, ready *metav1.Condition) {
	t.Helper()
	g := f.get(t, name)
	return clustertest.Condition(t, g.Status.Conditions, gatewayv1alpha1.ConditionPublished), clustertest.Condition(t, g.Status.Conditions, gatewayv1alpha1.ConditionReady)
}

// TestGatewayPublishesAndProbes: the association record of the hostname
// goes into the requester's repo (keyed by the hostname, naming the
// contract's lease and the Service), once; the hostname is probed
// through the lease's gateway; the status has the URL and the address.
func TestGatewayPublishesAndProbes(t *testing.T) {
	f := newFixture(t, "gw.fit.example:8443", gw("shop", "shop.example.com", t0))
	res := f.settle(t, "shop")
	rec, _ := f.repo.Get(t.Context(), lexicon.GatewayAssociation, "shop.example.com")
	if rec == nil {
		t.Fatal("no association record")
	}
	var a Association
	if err := json.Unmarshal(rec.Value, &a); err != nil || a.Hostname != "shop.example.com" || a.Lease.URI != lease || a.Lease.CID != "bafylease" ||
		a.Service != (Service{Namespace: "default", Name: "web", Port: 80}) {
		t.Fatalf("record %s: %v", rec.Value, err)
	}
	g := f.get(t, "shop")
	if g.Status.Association == nil || g.Status.Association.URI != rec.URI || g.Status.Association.CID != rec.CID ||
		g.Status.URL != "https://shop.example.com:8443/" || g.Status.Address != "gw.fit.example:8443" || !controllerutil.ContainsFinalizer(g, Finalizer) {
		t.Fatalf("status %+v", g.Status)
	}
	pub, ready := f.conds(t, "shop")
	if pub.Status != metav1.ConditionTrue || ready.Status != metav1.ConditionTrue || ready.Reason != gatewayv1alpha1.ReasonServing {
		t.Fatalf("conditions %+v %+v", pub, ready)
	}
	if f.probeCount() != 1 || f.probes[0] != "shop.example.com@gw.fit.example:8443" || res.RequeueAfter != servingWait {
		t.Fatalf("probes %v, requeue %s", f.probes, res.RequeueAfter)
	}
	// Again, later, and with a newer version of the lease: nothing is
	// written (the claim is the same).
	f.now = f.now.Add(time.Hour)
	cc := &marketv1alpha1.ComputeContract{}
	_ = f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "web-0"}, cc)
	cc.Status.Records.Lease.CID = "bafylease2"
	if err := f.cl.Client.Status().Update(t.Context(), cc); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "shop")
	if f.repo.Writes != 1 {
		t.Fatalf("%d writes, want 1", f.repo.Writes)
	}
	// The Service changes: the record follows.
	g = f.get(t, "shop")
	g.Spec.Service.Port = 8080
	g.Generation++
	if err := f.cl.Client.Update(t.Context(), g); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "shop")
	rec, _ = f.repo.Get(t.Context(), lexicon.GatewayAssociation, "shop.example.com")
	if err := json.Unmarshal(rec.Value, &a); err != nil || a.Service.Port != 8080 || f.repo.Writes != 2 || f.get(t, "shop").Status.Association.CID != rec.CID {
		t.Fatalf("record %s after the port changed (%d writes)", rec.Value, f.repo.Writes)
	}
}

// TestGatewayReady: Ready follows the probe; an upstream refusal is
// named, and the Gateway is looked at again soon.
func TestGatewayReady(t *testing.T) {
	f := newFixture(t, "gw.fit.example:443", gw("shop", "shop.example.com", t0))
	f.probed = Probed{Reason: gatewayv1alpha1.ReasonNoReadyEndpoint, Message: "no ready endpoint"}
	// Not served: probed again after 1 s (the gateway reads a new record
	// within a second or two), then 2 s, 4 s, ...
	res := f.reconcile(t, "shop")
	if _, ready := f.conds(t, "shop"); ready.Reason != gatewayv1alpha1.ReasonWaiting || res.RequeueAfter != probeTimeout+time.Second {
		t.Errorf("while probing: %+v, requeue %s", ready, res.RequeueAfter)
	}
	f.r.prober().wait()
	res = f.reconcile(t, "shop")
	pub, ready := f.conds(t, "shop")
	if pub.Status != metav1.ConditionTrue || ready.Status != metav1.ConditionFalse || ready.Reason != gatewayv1alpha1.ReasonNoReadyEndpoint || res.RequeueAfter != firstWait {
		t.Fatalf("%+v %+v, requeue %s", pub, ready, res.RequeueAfter)
	}
	f.now = f.now.Add(res.RequeueAfter)
	if res := f.settle(t, "shop"); res.RequeueAfter != 2*firstWait {
		t.Errorf("the second probe: requeue %s, want %s", res.RequeueAfter, 2*firstWait)
	}
	if u := f.get(t, "shop").Status.URL; u != "https://shop.example.com/" {
		t.Errorf("URL %q on port 443", u)
	}
}

// TestGatewayNoGateway: a lease that names no gateway publishes the
// record (the bidder may start one) but is not Ready, and nothing is
// probed.
func TestGatewayNoGateway(t *testing.T) {
	f := newFixture(t, "", gw("shop", "shop.example.com", t0))
	f.settle(t, "shop")
	pub, ready := f.conds(t, "shop")
	if pub.Status != metav1.ConditionTrue || ready.Reason != gatewayv1alpha1.ReasonNoGateway || f.probeCount() != 0 {
		t.Fatalf("%+v %+v, probes %v", pub, ready, f.probes)
	}
}

// TestGatewayHostnameTaken: of two Gateways of one hostname, the older
// holds it; the other publishes nothing and says who holds it. When the
// holder goes, its record goes, and the other takes the hostname.
func TestGatewayHostnameTaken(t *testing.T) {
	f := newFixture(t, "gw.fit.example:443", gw("first", "shop.example.com", t0), gw("second", "shop.example.com", t0.Add(time.Minute)))
	f.reconcile(t, "first")
	f.reconcile(t, "second")
	pub, ready := f.conds(t, "second")
	if pub.Reason != gatewayv1alpha1.ReasonHostnameTaken || ready.Status != metav1.ConditionFalse || f.get(t, "second").Status.Association != nil || f.repo.Writes != 1 {
		t.Fatalf("%+v %+v (%d writes)", pub, ready, f.repo.Writes)
	}
	first := f.get(t, "first")
	if err := f.cl.Client.Delete(t.Context(), first); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "first")
	if rec, _ := f.repo.Get(t.Context(), lexicon.GatewayAssociation, "shop.example.com"); rec != nil {
		t.Fatal("the deleted Gateway's record stays")
	}
	f.reconcile(t, "second")
	if pub, _ := f.conds(t, "second"); pub.Status != metav1.ConditionTrue {
		t.Fatalf("the remaining Gateway: %+v", pub)
	}
}

// TestGatewayDeletedOrContractEnded: deleting the Gateway deletes its
// record and lets it go; a contract that ended deletes the record too.
func TestGatewayDeletedOrContractEnded(t *testing.T) {
	f := newFixture(t, "gw.fit.example:443", gw("shop", "shop.example.com", t0))
	f.reconcile(t, "shop")
	cc := &marketv1alpha1.ComputeContract{}
	_ = f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "web-0"}, cc)
	cc.Status.Phase = marketv1alpha1.ContractCompleted
	if err := f.cl.Client.Status().Update(t.Context(), cc); err != nil {
		t.Fatal(err)
	}
	f.reaches.Delete(ws, cc.UID)
	f.reconcile(t, "shop")
	pub, _ := f.conds(t, "shop")
	if rec, _ := f.repo.Get(t.Context(), lexicon.GatewayAssociation, "shop.example.com"); rec != nil || pub.Reason != gatewayv1alpha1.ReasonContractNotActive ||
		f.get(t, "shop").Status.Association != nil || f.get(t, "shop").Status.URL != "" {
		t.Fatalf("after the contract ended: record %v, %+v", rec, pub)
	}

	f = newFixture(t, "gw.fit.example:443", gw("shop", "shop.example.com", t0))
	f.reconcile(t, "shop")
	if err := f.cl.Client.Delete(t.Context(), f.get(t, "shop")); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "shop")
	if rec, _ := f.repo.Get(t.Context(), lexicon.GatewayAssociation, "shop.example.com"); rec != nil {
		t.Fatal("record left after the Gateway was deleted")
	}
	if err := f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "shop"}, &gatewayv1alpha1.Gateway{}); err == nil {
		t.Fatal("the deleted Gateway was kept")
	}
}

// TestGatewayWaits: no contract, a contract not mounted yet, or no
// identity of the requester's DID: nothing is published and the
// condition says why.
func TestGatewayWaits(t *testing.T) {
	f := newFixture(t, "gw.fit.example:443", gw("nocontract", "a.example.com", t0))
	g := f.get(t, "nocontract")
	g.Spec.ContractRef.Name = "web-9"
	_ = f.cl.Client.Update(t.Context(), g)
	f.reconcile(t, "nocontract")
	if pub, _ := f.conds(t, "nocontract"); pub.Reason != gatewayv1alpha1.ReasonContractNotFound {
		t.Errorf("no contract: %+v", pub)
	}

	f = newFixture(t, "gw.fit.example:443", gw("shop", "shop.example.com", t0))
	f.reaches.Delete(ws, "cc-uid")
	if res := f.reconcile(t, "shop"); res.RequeueAfter != tenantWait {
		t.Errorf("not mounted: requeue %s", res.RequeueAfter)
	}
	if pub, _ := f.conds(t, "shop"); pub.Reason != gatewayv1alpha1.ReasonTenantNotReady {
		t.Errorf("not mounted: %+v", pub)
	}

	f = newFixture(t, "gw.fit.example:443", gw("shop", "shop.example.com", t0))
	id := &marketv1alpha1.MarketIdentity{}
	_ = f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "shop"}, id)
	id.Status.DID = "did:plc:someone-else"
	_ = f.cl.Client.Status().Update(t.Context(), id)
	f.reconcile(t, "shop")
	if pub, _ := f.conds(t, "shop"); pub.Reason != gatewayv1alpha1.ReasonIdentityNotReady || f.repo.Writes != 0 {
		t.Errorf("no identity of the DID: %+v", pub)
	}
}

// TestGatewayHostnameTakenInTheSameSecond: a Gateway made in the same
// second as one that already holds the hostname does not take it, whatever
// their names.
func TestGatewayHostnameTakenInTheSameSecond(t *testing.T) {
	f := newFixture(t, "gw.fit.example:443", gw("shop", "shop.example.com", t0))
	f.settle(t, "shop")
	again := gw("again", "shop.example.com", t0)
	again.ResourceVersion = ""
	if err := f.cl.Client.Create(t.Context(), again); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "again")
	if pub, _ := f.conds(t, "again"); pub.Reason != gatewayv1alpha1.ReasonHostnameTaken || f.repo.Writes != 1 {
		t.Fatalf("the later claim in the same second: %+v (%d writes)", pub, f.repo.Writes)
	}
}
