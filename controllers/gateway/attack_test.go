package gateway

// Adversarial tests of the Gateway controller (a review of
// 8d24e77..984a9cf). TestAttack* are the holes it found, each failing on
// 984a9cf and fixed since; TestDefence* are defences that held.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	gatewayv1alpha1 "github.com/knotless-dev/knotless/apis/gateway/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/finalize"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/serviceauth"
	"github.com/knotless-dev/knotless/internal/tenantreach"
)

const host = "shop.example.com"

var loopbackAddr = regexp.MustCompile(`127\.0\.0\.1:[0-9]+`)

// reconcileIn reconciles Gateway ns/name.
func (f *fixture) reconcileIn(t *testing.T, ns, name string) reconcile.Result {
	t.Helper()
	res, err := f.r.Reconcile(t.Context(), mcreconcile.Request{ClusterName: ws, Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func (f *fixture) getIn(t *testing.T, ns, name string) *gatewayv1alpha1.Gateway {
	t.Helper()
	g := &gatewayv1alpha1.Gateway{}
	if err := f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, g); err != nil {
		t.Fatal(err)
	}
	return g
}

func (f *fixture) record(t *testing.T) *pds.Record {
	t.Helper()
	rec, _ := f.repo.Get(t.Context(), lexicon.GatewayAssociation, host)
	return rec
}

// ---------------------------------------------------------------------
// Holes (these failed on 984a9cf)
// ---------------------------------------------------------------------

// TestAttackForgedAssociationStatusDeletesTheHoldersRecord: a Gateway
// that never held the hostname (no finalizer, no contract) but whose
// status.association a workspace user wrote (gateways/status is in the
// maximal permission policy) makes the controller delete the record of
// the Gateway that does hold the hostname: the ContractNotFound path
// unpublishes whatever status.association names, by spec.hostname.
func TestAttackForgedAssociationStatusDeletesTheHoldersRecord(t *testing.T) {
	evil := gw("evil", host, t0.Add(time.Minute))
	evil.Spec.ContractRef.Name = "no-such-contract"
	evil.Status.Association = &gatewayv1alpha1.RecordRef{URI: "at://" + shop + "/" + lexicon.GatewayAssociation + "/" + host, CID: "bafyforged"}
	f := newFixture(t, "gw.fit.example:443", gw("shop", host, t0), evil)
	f.reconcile(t, "shop")
	if f.record(t) == nil {
		t.Fatal("setup: the holder published nothing")
	}
	f.reconcile(t, "evil")
	if f.record(t) == nil {
		t.Fatal("a Gateway with no contract and a forged status.association deleted the holder's association record")
	}
}

// TestAttackDeletingHolderDeletesTheSuccessorsRecord: while the holder's
// finalizer is pending (its deletion requested, its record not deleted
// yet), holder() already gives the hostname to the next Gateway, which
// publishes its claim under the same record key; the old holder's
// finalizer then deletes the record by hostname: the successor's claim
// is gone while it says Published.
func TestAttackDeletingHolderDeletesTheSuccessorsRecord(t *testing.T) {
	second := gw("second", host, t0.Add(time.Minute))
	second.Spec.Service.Name = "web2"
	f := newFixture(t, "gw.fit.example:443", gw("first", host, t0), second)
	f.reconcile(t, "first")
	if err := f.cl.Client.Delete(t.Context(), f.get(t, "first")); err != nil {
		t.Fatal(err)
	}
	// The hostname watch wakes the second Gateway before the first one's
	// finalizer has run.
	f.reconcile(t, "second")
	f.reconcile(t, "first")
	pub, _ := f.conds(t, "second")
	if rec := f.record(t); rec == nil && pub.Status == metav1.ConditionTrue {
		t.Fatal("the old holder's finalizer deleted the successor's record; the successor still says Published")
	}
}

// TestAttackHostnameSquattedAcrossNamespaces: a Gateway of another
// namespace that publishes nothing (its contract does not exist) but was
// made first blocks the hostname for every namespace of the workspace,
// forever; and the HostnameTaken message names the other namespace's
// Gateway (R17/R22: nothing of another namespace resolves or shows).
func TestAttackHostnameSquattedAcrossNamespaces(t *testing.T) {
	squat := gw("squat", host, t0)
	squat.Namespace, squat.Spec.ContractRef.Name = "other", "nothing"
	f := newFixture(t, "gw.fit.example:443", squat, gw("shop", host, t0.Add(time.Minute)))
	f.reconcileIn(t, "other", "squat")
	f.reconcile(t, "shop")
	pub, _ := f.conds(t, "shop")
	if pub.Status != metav1.ConditionTrue {
		t.Errorf("a Gateway that claims nothing (ContractNotFound, another namespace) holds the hostname: %s %q", pub.Reason, pub.Message)
	}
	if strings.Contains(pub.Message, "other/") {
		t.Errorf("the condition names another namespace's Gateway: %q", pub.Message)
	}
}

// neverThere is a hostile PDS: it takes every write and never shows the
// record again.
type neverThere struct{ market.Publisher }

func (neverThere) Get(context.Context, string, string) (*pds.Record, error) { return nil, nil }

// TestAttackHostilePDSKeepsAOneSecondLoop: a requester's PDS (the
// requester's choice) that never returns the record makes every
// reconcile write it again, and every write restarts the one-second
// "fresh" window: the Gateway is reconciled, written and probed through
// the bidder's gateway every second, forever (a RequeueAfter loop that
// the workqueue's rate limiter never sees).
func TestAttackHostilePDSKeepsAOneSecondLoop(t *testing.T) {
	f := newFixture(t, "gw.fit.example:443", gw("shop", host, t0))
	f.probed = Probed{Reason: gatewayv1alpha1.ReasonWaiting, Message: "no route"}
	hostile := neverThere{f.repo}
	f.r.Connect = func(context.Context, client.Client, string, *atprotov1alpha1.AtprotoRepo) (market.Publisher, error) {
		return hostile, nil
	}
	for i := 0; i < 120; i++ {
		f.reconcile(t, "shop")
		f.r.prober().wait()
		f.now = f.now.Add(time.Second)
	}
	// Written again only after 1, 2, 4, ... s: at most 8 writes in two
	// minutes, and a probe per write at most (each new write probes again
	// at once), plus the backoff's.
	if f.repo.Writes > 8 || f.probeCount() > 20 {
		t.Fatalf("after two minutes: %d writes, %d probes", f.repo.Writes, f.probeCount())
	}
}

// TestAttackStalledGatewayHoldsAWorker: the probe runs inside Reconcile,
// and a bidder's gateway that accepts and never answers holds the
// reconcile for probeTimeout (10 s). The controller has 4 workers for
// every workspace of the provider: a requester that is its own (hostile)
// bidder starves every other workspace's Gateways (publication and
// deletion) with a handful of Gateways.
func TestAttackStalledGatewayHoldsAWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("takes probeTimeout")
	}
	f := newFixture(t, "gw.fit.example:443", gw("shop", host, t0))
	f.r.Probe = func(ctx context.Context, _, _ string) Probed {
		<-ctx.Done()
		return Probed{Reason: gatewayv1alpha1.ReasonGatewayUnreachable, Message: "did not answer"}
	}
	start := time.Now()
	f.reconcile(t, "shop")
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("one reconcile held a worker for %s waiting for the bidder's gateway", d.Round(time.Second))
	}
	f.r.prober().wait()
}

// TestAttackUnreachableGatewayNeverBacksOff: a gateway that never
// answers is probed every 10 s forever, with no backoff (together with
// the 10 s a stalled probe takes, each such Gateway keeps half a worker
// busy).
func TestAttackUnreachableGatewayNeverBacksOff(t *testing.T) {
	f := newFixture(t, "gw.fit.example:443", gw("shop", host, t0))
	f.probed = Probed{Reason: gatewayv1alpha1.ReasonGatewayUnreachable, Message: "did not answer"}
	var res reconcile.Result
	for i := 0; i < 12; i++ {
		f.reconcile(t, "shop")
		f.r.prober().wait()
		res = f.reconcile(t, "shop")
		f.now = f.now.Add(res.RequeueAfter)
	}
	if res.RequeueAfter != lastWait || f.probeCount() != 12 {
		t.Fatalf("after 12 failed probes the next is in %s (%d probes), want %s", res.RequeueAfter, f.probeCount(), lastWait)
	}
}

// TestAttackProbeTellsPrivateAddressesApart: a lease's gateway is the
// bidder's choice, and a requester can be its own bidder. With a
// private range allowed (the provider's PDSes on a private network), the
// Ready message tells a closed port, a TLS server the provider does not
// trust, and one whose trusted certificate names another host apart: a
// scan of the operator's network (R17). repoconn and the mount proxy
// answer every such failure at a private address alike
// (netpolicy.TracePrivate); the probe does not.
func TestAttackProbeTellsPrivateAddressesApart(t *testing.T) {
	loopback := netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, nil)
	trusted := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer trusted.Close()
	roots := x509.NewCertPool()
	roots.AddCert(trusted.Certificate())

	crt, key, err := certutil.GenerateSelfSignedCertKey("internal.corp", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(crt, key)
	if err != nil {
		t.Fatal(err)
	}
	untrusted := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	untrusted.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	untrusted.StartTLS()
	defer untrusted.Close()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	_ = l.Close()

	seen := map[string]string{}
	for what, p := range map[string]Probed{
		"a closed port":                        Probe(t.Context(), loopback, roots, closed, host),
		"an untrusted TLS server":              Probe(t.Context(), loopback, roots, strings.TrimPrefix(untrusted.URL, "https://"), "internal.corp"),
		"a trusted server naming another host": Probe(t.Context(), loopback, roots, strings.TrimPrefix(trusted.URL, "https://"), "internal.corp"),
	} {
		msg := strings.NewReplacer(host, "HOST", "internal.corp", "HOST").Replace(loopbackAddr.ReplaceAllString(p.Message, "ADDR"))
		seen[p.Reason+": "+msg] = what
	}
	if len(seen) > 1 {
		t.Errorf("failures at private addresses read differently: %v", seen)
	}
}

// TestAttackLeaseGatewayIsAnyText: deal.TenantOf takes a lease's gateway
// when net.SplitHostPort does: its host may be any text without "/@ \t"
// (newlines, quotes, bidi overrides), which then shows in the
// requester's status.address, status.url's neighbour, the printer
// column and every Ready message.
func TestAttackLeaseGatewayIsAnyText(t *testing.T) {
	crt, _, err := certutil.GenerateSelfSignedCertKey("tenant", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	fp, _ := market.CAFingerprint(crt)
	const fit = "did:plc:fit"
	for _, bad := range []string{
		"gw.example\nReady=True:443",
		"gw.example\r\n:443",
		"\u202egw.example:443",
		"click-\"here\"-now:443",
		"gw.example\x00:443",
	} {
		l := &market.Lease{State: deal.LeaseRunning, Endpoint: "https://127.0.0.1:7443/clusters/root", CABundle: string(crt), CAFingerprint: fp,
			ServiceID: serviceauth.Audience(fit, "vm-uid"), Gateway: bad}
		tn, err := deal.TenantOf(fit, l)
		if err != nil {
			t.Fatal(err)
		}
		if tn.Gateway != "" {
			t.Errorf("lease gateway %q taken as an address", bad)
		}
	}
}

// TestAttackAssociationCollectionWritableByAtprotoRecord: R22 says
// collections another kind owns cannot be written through an
// AtprotoRecord; the Gateway kind now owns dev.knotless.gateway.
// association, yet an AtprotoRecord may write or delete any hostname's
// record in the repo (around HostnameTaken, and under a Gateway's feet).
func TestAttackAssociationCollectionWritableByAtprotoRecord(t *testing.T) {
	if atprotov1alpha1.OwnedCollection(lexicon.GatewayAssociation) == "" {
		t.Fatalf("%s is not an owned collection: an AtprotoRecord may write it", lexicon.GatewayAssociation)
	}
}

// TestAttackHostnameTakenOrphansTheRecord: a Gateway that published (a
// cache that had not seen an older Gateway of the hostname yet) and then
// finds it is not the holder forgets status.association without
// deleting the record: the record, routing its Service, stays in the
// repo, and its deletion deletes nothing.
func TestAttackHostnameTakenOrphansTheRecord(t *testing.T) {
	late := gw("late", host, t0.Add(time.Minute))
	late.Spec.Service.Name = "late"
	f := newFixture(t, "gw.fit.example:443", late)
	f.reconcile(t, "late")
	if f.record(t) == nil {
		t.Fatal("setup: nothing published")
	}
	// The older Gateway shows up in the cache (its contract is not
	// mounted: it publishes nothing of its own).
	older := gw("older", host, t0)
	older.ResourceVersion = ""
	older.Spec.ContractRef.Name = "web-9"
	if err := f.cl.Client.Create(t.Context(), older); err != nil {
		t.Fatal(err)
	}
	if !f.get(t, "older").CreationTimestamp.Equal(&metav1.Time{Time: t0}) {
		t.Skip("the fake client does not keep a creation time")
	}
	f.reconcile(t, "late")
	pub, _ := f.conds(t, "late")
	if pub.Reason == gatewayv1alpha1.ReasonHostnameTaken && f.get(t, "late").Status.Association == nil && f.record(t) != nil {
		t.Fatal("HostnameTaken dropped status.association but left the record (routing the late Gateway's Service) in the repo")
	}
}

// ---------------------------------------------------------------------
// Defences that hold
// ---------------------------------------------------------------------

// TestDefenceForgedContractIsNeverMounted: a workspace user may create a
// requester ComputeContract (market.knotless.dev is in the maximal
// policy) with any DID, phase and lease in its status; it has no Reach
// (the registry is keyed by UID, filled only by the requester's
// controller), so nothing is published or probed.
func TestDefenceForgedContractIsNeverMounted(t *testing.T) {
	forged := &marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "forged", UID: "forged-uid"},
		Spec: marketv1alpha1.ComputeContractSpec{Side: marketv1alpha1.SideRequester, RequesterDID: shop, BidderDID: "did:plc:evil"},
		Status: marketv1alpha1.ComputeContractStatus{Phase: marketv1alpha1.ContractActive,
			Records: marketv1alpha1.ContractRecords{Lease: &marketv1alpha1.RecordRef{URI: "at://did:plc:evil/dev.knotless.market.lease/x", CID: "bafyx"}}}}
	g := gw("evil", "evil.example.com", t0)
	g.Spec.ContractRef.Name = "forged"
	f := newFixture(t, "169.254.169.254:80", g, forged)
	f.reconcile(t, "evil")
	pub, _ := f.conds(t, "evil")
	if pub.Reason != gatewayv1alpha1.ReasonTenantNotReady || f.repo.Writes != 0 || len(f.probes) != 0 {
		t.Fatalf("a forged contract: %+v, %d writes, probes %v", pub, f.repo.Writes, f.probes)
	}
	// A bidder's side contract is not the requester's tenant.
	bidder := &marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sold", UID: "cc-uid2"},
		Spec: marketv1alpha1.ComputeContractSpec{Side: marketv1alpha1.SideBidder, RequesterDID: shop},
		Status: marketv1alpha1.ComputeContractStatus{Phase: marketv1alpha1.ContractActive,
			Records: marketv1alpha1.ContractRecords{Lease: &marketv1alpha1.RecordRef{URI: lease, CID: "bafylease"}}}}
	g = gw("sold", "sold.example.com", t0)
	g.Spec.ContractRef.Name = "sold"
	f = newFixture(t, "gw.fit.example:443", g, bidder)
	f.reaches.Put(ws, "cc-uid2", tenantreach.Reach{Tenant: deal.Tenant{Gateway: "gw.fit.example:443"}})
	f.reconcile(t, "sold")
	if pub, _ := f.conds(t, "sold"); pub.Reason != gatewayv1alpha1.ReasonContractNotFound || f.repo.Writes != 0 {
		t.Fatalf("a bidder's contract: %+v", pub)
	}
}

// TestDefenceReferencesStayInTheNamespace (R22): a Gateway of another
// namespace naming web-0 does not find default's contract; one whose own
// namespace has a mounted contract of the shop DID but no MarketIdentity
// does not publish through default's identity; and a forged
// status.association naming the shop DID deletes nothing from another
// namespace.
func TestDefenceReferencesStayInTheNamespace(t *testing.T) {
	stray := gw("stray", "stray.example.com", t0)
	stray.Namespace = "other"
	cc := &marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Namespace: "third", Name: "web-0", UID: "cc-third"},
		Spec: marketv1alpha1.ComputeContractSpec{Side: marketv1alpha1.SideRequester, RequesterDID: shop, BidderDID: "did:plc:fit"},
		Status: marketv1alpha1.ComputeContractStatus{Phase: marketv1alpha1.ContractActive,
			Records: marketv1alpha1.ContractRecords{Lease: &marketv1alpha1.RecordRef{URI: lease, CID: "bafylease"}}}}
	third := gw("third", "third.example.com", t0)
	third.Namespace = "third"
	forged := gw("forged", host, t0.Add(time.Hour))
	forged.Namespace, forged.Spec.ContractRef.Name = "other", "none"
	forged.Status.Association = &gatewayv1alpha1.RecordRef{URI: "at://" + shop + "/" + lexicon.GatewayAssociation + "/" + host}
	f := newFixture(t, "gw.fit.example:443", gw("shop", host, t0), stray, cc, third, forged)
	f.reaches.Put(ws, "cc-third", tenantreach.Reach{Tenant: deal.Tenant{Gateway: "gw.fit.example:443"}})
	f.reconcile(t, "shop")
	f.reconcileIn(t, "other", "stray")
	if pub := clustertest.Condition(t, f.getIn(t, "other", "stray").Status.Conditions, gatewayv1alpha1.ConditionPublished); pub.Reason != gatewayv1alpha1.ReasonContractNotFound {
		t.Errorf("another namespace's contract resolved: %+v", pub)
	}
	f.reconcileIn(t, "third", "third")
	if pub := clustertest.Condition(t, f.getIn(t, "third", "third").Status.Conditions, gatewayv1alpha1.ConditionPublished); pub.Reason != gatewayv1alpha1.ReasonIdentityNotReady {
		t.Errorf("another namespace's identity used: %+v", pub)
	}
	f.reconcileIn(t, "other", "forged")
	if f.record(t) == nil || f.repo.Writes != 1 {
		t.Errorf("a forged status.association in another namespace touched default's repo (%d writes)", f.repo.Writes)
	}
}

// TestDefenceProbeNeverDialsMetadata: whatever a lease names, the probe
// does not connect to metadata, link-local, unspecified or embedded
// forms of them, even with loopback and private ranges allowed, and it
// takes no proxy from the environment.
func TestDefenceProbeNeverDialsMetadata(t *testing.T) {
	t.Setenv("HTTPS_PROXY", "http://127.0.0.1:1")
	open := netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8")}, nil)
	for _, addr := range []string{"169.254.169.254:80", "[::ffff:169.254.169.254]:443", "[fd00:ec2::254]:443", "0.0.0.0:443",
		"[64:ff9b::a9fe:a9fe]:443", "[fe80::1]:443", "100.100.100.200:80", "168.63.129.16:80", "[::]:443"} {
		p := Probe(t.Context(), open, nil, addr, host)
		if p.Reason != gatewayv1alpha1.ReasonGatewayUnreachable || !(strings.Contains(p.Message, "may dial") || strings.Contains(p.Message, "did not answer for")) {
			t.Errorf("%s: %+v", addr, p)
		}
	}
	var got *http.Request
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r }))
	defer srv.Close()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	if p := Probe(t.Context(), open, roots, strings.TrimPrefix(srv.URL, "https://"), host); p.Reason != gatewayv1alpha1.ReasonServing {
		t.Fatalf("through HTTPS_PROXY? %+v", p)
	}
	if got == nil || got.Header.Get("Authorization") != "" || got.Header.Get("Cookie") != "" || got.Method != http.MethodGet {
		t.Errorf("the probe sent %+v", got)
	}
}

// TestDefenceProbeBoundsAndQuotesNothing: a gateway answering with huge
// headers, or a bogus reason, is not read past the bound and not quoted.
func TestDefenceProbeBoundsAndQuotesNothing(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Big", strings.Repeat("A", 200<<10)+"SECRET")
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	loop := netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, nil)
	p := Probe(t.Context(), loop, roots, strings.TrimPrefix(srv.URL, "https://"), host)
	if p.Reason != gatewayv1alpha1.ReasonGatewayUnreachable || strings.Contains(p.Message, "SECRET") || len(p.Message) > 300 {
		t.Errorf("huge headers: %s %q", p.Reason, p.Message[:min(len(p.Message), 300)])
	}
}

// failing is a PDS that takes nothing.
type failing struct{ market.Publisher }

func (failing) Publish(context.Context, string, string, any) (*pds.EnsureResult, error) {
	return nil, errors.New("pds down")
}

// TestDefenceFinalizerLetsGo: a record that cannot be deleted holds the
// Gateway for finalize.GiveUpAfter at most, then it goes with a RecordLeft event.
func TestDefenceFinalizerLetsGo(t *testing.T) {
	f := newFixture(t, "gw.fit.example:443", gw("shop", host, t0))
	f.reconcile(t, "shop")
	f.r.Connect = func(context.Context, client.Client, string, *atprotov1alpha1.AtprotoRepo) (market.Publisher, error) {
		return failing{f.repo}, nil
	}
	if err := f.cl.Client.Delete(t.Context(), f.get(t, "shop")); err != nil {
		t.Fatal(err)
	}
	del := f.get(t, "shop").DeletionTimestamp.Time
	f.now = del.Add(10 * time.Second)
	if res := f.reconcile(t, "shop"); res.RequeueAfter == 0 || !controllerutil.ContainsFinalizer(f.get(t, "shop"), Finalizer) {
		t.Fatalf("let go at once: %+v", res)
	}
	f.now = del.Add(finalize.GiveUpAfter + time.Second)
	f.reconcile(t, "shop")
	if err := f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "shop"}, &gatewayv1alpha1.Gateway{}); err == nil {
		t.Fatal("the Gateway is held past finalize.GiveUpAfter")
	}
	if rs := f.cl.Events.Reasons(); len(rs) == 0 || rs[len(rs)-1] != "RecordLeft" {
		t.Errorf("events %v", rs)
	}
}

// TestDefenceOddInputs: odd inputs (no lease URI, an at-URI
// that is no DID, an IPv6 gateway) neither panic nor publish.
func TestDefenceOddInputs(t *testing.T) {
	g := gw("odd", host, t0)
	g.Status.Association = &gatewayv1alpha1.RecordRef{URI: "at://"}
	g.Spec.ContractRef.Name = "none"
	f := newFixture(t, "[::1]:8443", g)
	f.reconcile(t, "odd")
	if a := f.get(t, "odd").Status.Association; a != nil {
		t.Errorf("an at-URI with no DID kept: %+v", a)
	}
	if u := URL(host, "[::1]:8443"); u != "https://"+host+":8443/" {
		t.Errorf("URL %q", u)
	}
	for _, uri := range []string{"", "at://", "at:///x", "https://did:plc:x/", "at://did:plc:x"} {
		if did, ok := market.DIDOf(uri); ok && did != "did:plc:x" {
			t.Errorf("didOf(%q) = %q", uri, did)
		}
	}
}
