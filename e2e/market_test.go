package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kcp-dev/logicalcluster/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/bootstrap"
	"github.com/knotless-dev/knotless/internal/lexicon"
)

// marketWorkspace creates a market-bidder workspace the way a user does,
// with `kubectl ws create --type` as the unprivileged token user alice
// (kcp-admin on an existing kcp), and returns a client for it as that
// user.
func marketWorkspace(ctx context.Context, t *testing.T, name string) client.Client {
	t.Helper()
	return userWorkspace(ctx, t, name, "market-bidder")
}

// userWorkspace creates a workspace of one of knotless's WorkspaceTypes
// (by name) as alice with kubectl ws create --type and returns alice's
// client for it.
func userWorkspace(ctx context.Context, t *testing.T, name, wsType string) client.Client {
	t.Helper()
	return userWorkspaceAs(ctx, t, name, wsType, "alice")
}

// userWorkspaceAs is userWorkspace as another token user of the suite.
func userWorkspaceAs(ctx context.Context, t *testing.T, name, wsType, user string) client.Client {
	t.Helper()
	return userWorkspaceOn(ctx, t, env.home(), name, wsType, user)
}

// userWorkspaceOn is userWorkspaceAs on the installation in.
func userWorkspaceOn(ctx context.Context, t *testing.T, in *installation, name, wsType, user string) client.Client {
	t.Helper()
	cfg, err := in.kcp.UserConfig(user)
	if err != nil {
		t.Logf("no unprivileged user on an existing kcp (%v); using kcp-admin", err)
		cfg = in.admin
	}
	kubeconfig := writeKubeconfig(t, cfg, root)
	typ := in.providerWS.Join(wsType).String()
	cmd := exec.CommandContext(ctx, filepath.Join(filepath.Dir(env.kcpBin), "kubectl-ws"), "create", name, "--type", typ)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl ws create %s --type %s: %v\n%s", name, typ, err, out)
	}
	if err := framework.WaitWorkspaceReady(ctx, in.admin, root, name, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	c, err := framework.ClientFor(cfg, root.Join(name))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// writeKubeconfig writes a kubeconfig for cfg's user whose current
// workspace is ws.
func writeKubeconfig(t *testing.T, cfg *rest.Config, ws logicalcluster.Path) string {
	t.Helper()
	wsCfg, err := bootstrap.ForWorkspace(cfg, ws)
	if err != nil {
		t.Fatal(err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kcp"] = &clientcmdapi.Cluster{Server: wsCfg.Host, CertificateAuthority: cfg.CAFile, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken, ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, ClientCertificate: cfg.CertFile, ClientKey: cfg.KeyFile}
	kc.Contexts["kcp"] = &clientcmdapi.Context{Cluster: "kcp", AuthInfo: "user"}
	kc.CurrentContext = "kcp"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// participant creates an account on pds and, in the workspace, its
// password Secret, AtprotoRepo and MarketIdentity (on network), and
// waits until the identity is Ready.
func participant(ctx context.Context, t *testing.T, c client.Client, pds *framework.PDS, handle, name, network string, assoc ...marketv1alpha1.Association) *framework.Account {
	t.Helper()
	acct, err := pds.CreateAccount(ctx, handle)
	if err != nil {
		t.Fatal(err)
	}
	repo := secretRepo(name, acct.Handle, name+"-password")
	repo.Spec.PDS.URL = pds.URL
	create(ctx, t, c, passwordSecret(name+"-password", acct.AppPassword), repo, marketIdentity(name, name, network, assoc...))
	waitMarket(ctx, t, c, &marketv1alpha1.MarketIdentity{}, name, "MarketIdentity Ready", func(o client.Object) (bool, string) {
		id := o.(*marketv1alpha1.MarketIdentity)
		return ready(id.Status.Conditions, id.Generation), summary(id.Status.Phase, id.Status.Conditions)
	})
	return acct
}

func network(name string, firehoses []string, operator string) *marketv1alpha1.MarketNetwork {
	return &marketv1alpha1.MarketNetwork{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       marketv1alpha1.MarketNetworkSpec{Firehoses: firehoses, OperatorDID: operator},
	}
}

func marketIdentity(name, repo, network string, assoc ...marketv1alpha1.Association) *marketv1alpha1.MarketIdentity {
	return &marketv1alpha1.MarketIdentity{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: marketv1alpha1.MarketIdentitySpec{
			RepoRef: marketv1alpha1.LocalRef{Name: repo}, NetworkRef: marketv1alpha1.ClusterRef{Name: network},
			ApprovedAssociations: assoc,
		},
	}
}

func bidder(name, id, network string, amount int64) *marketv1alpha1.MarketBidder {
	return &marketv1alpha1.MarketBidder{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: marketv1alpha1.MarketBidderSpec{
			IdentityRef: marketv1alpha1.LocalRef{Name: id}, NetworkRef: marketv1alpha1.ClusterRef{Name: network},
			Offers: []marketv1alpha1.Offer{{Name: "small", CPUMillis: 1000, MemoryMiB: 1024, Capacity: 2,
				PricePerHour: marketv1alpha1.Price{Amount: amount, Currency: "USD-cents"}}},
		},
	}
}

func ready(conds []metav1.Condition, gen int64) bool {
	c := meta.FindStatusCondition(conds, marketv1alpha1.ConditionReady)
	return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == gen
}

func summary(phase marketv1alpha1.Phase, conds []metav1.Condition) string {
	parts := []string{"phase " + string(phase)}
	for _, c := range conds {
		parts = append(parts, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, "; ")
}

// waitMarket waits until ok holds for the object.
func waitMarket(ctx context.Context, t *testing.T, c client.Client, obj client.Object, name, what string, ok func(client.Object) (bool, string)) {
	t.Helper()
	key := client.ObjectKey{Name: name}
	if _, clusterScoped := obj.(*marketv1alpha1.MarketNetwork); !clusterScoped {
		key.Namespace = "default"
	}
	if err := framework.Eventually(ctx, 2*time.Minute, fmt.Sprintf("%s %s", what, name), func(ctx context.Context) (bool, string, error) {
		if err := c.Get(ctx, key, obj); err != nil {
			return false, err.Error(), nil
		}
		done, why := ok(obj)
		return done, why, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// presence is the presence record as a plain client reads it.
type presence struct {
	Offers []struct {
		Shape struct {
			Name      string `json:"name"`
			CPUMillis int64  `json:"cpuMillis"`
			MemoryMiB int64  `json:"memoryMiB"`
		} `json:"shape"`
		PricePerHour struct {
			Amount   int64  `json:"amount"`
			Currency string `json:"currency"`
		} `json:"pricePerHour"`
		Capacity int64 `json:"capacity"`
		Free     int64 `json:"free"`
	} `json:"offers"`
	Driver            string `json:"driver"`
	AcceptingRequests bool   `json:"acceptingRequests"`
	UpdatedAt         string `json:"updatedAt"`
}

// readPresence reads a presence record from pds with a plain XRPC call;
// nil when it does not exist.
func readPresence(ctx context.Context, t *testing.T, pds *framework.PDS, did, rkey string) (*presence, string) {
	t.Helper()
	out, err := getRecordFrom(ctx, pds, did, lexicon.Presence, rkey)
	if isNotFound(err) {
		return nil, ""
	}
	if err != nil {
		t.Fatal(err)
	}
	var p presence
	if err := json.Unmarshal(out.Value, &p); err != nil {
		t.Fatalf("presence %s: %v", out.Value, err)
	}
	return &p, out.CID
}

func waitPresence(ctx context.Context, t *testing.T, pds *framework.PDS, did, rkey, what string, ok func(*presence) bool) *presence {
	t.Helper()
	var p *presence
	waitPDS(ctx, t, what, func() (bool, string) {
		p, _ = readPresence(ctx, t, pds, did, rkey)
		return ok(p), fmt.Sprintf("%+v", p)
	})
	return p
}

// latestRev is the repo's latest commit revision, read from pds.
func latestRev(ctx context.Context, t *testing.T, pds *framework.PDS, did string) string {
	t.Helper()
	var out struct {
		Rev string `json:"rev"`
	}
	if err := pds.XRPC(ctx, "com.atproto.sync.getLatestCommit", "", url.Values{"did": {did}}, nil, &out); err != nil {
		t.Fatal(err)
	}
	return out.Rev
}

// onlyWriter fails unless manager is the only writer of status (R05)
// and writes nothing else.
func onlyWriter(t *testing.T, o client.Object, manager string) {
	t.Helper()
	for _, mf := range o.GetManagedFields() {
		if mf.Subresource == "status" && mf.Manager != manager {
			t.Errorf("%T %s: status written by %q too", o, o.GetName(), mf.Manager)
		}
		if mf.Subresource == "status" && mf.Manager == manager {
			continue
		}
		if mf.Manager == manager && mf.FieldsV1 != nil && strings.Contains(mf.FieldsV1.GetRawString(), `"f:spec"`) {
			t.Errorf("%T %s: %s wrote spec: %s", o, o.GetName(), manager, mf.FieldsV1.GetRawString())
		}
	}
}

// TestMarketBidderPresence: an unprivileged user creates a market-bidder
// workspace with kubectl ws and, with nobody else in the market, a
// network, an identity and a bidder; the bidder's presence record, read
// by a plain client, equals its spec; a new price is published again,
// suspend publishes "not accepting", each status has one writer, and
// deleting the bidder deletes the record and the MarketPresence. Bad
// input is refused at admission or reported as a condition with nothing
// written. Figures: MarketBidder create → presence readable (p50/p99 over
// 20) and provider CPU per published presence.
func TestMarketBidderPresence(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	c := marketWorkspace(ctx, t, env.prefix+"-bidder")
	create(ctx, t, c, &marketv1alpha1.MarketNetwork{
		ObjectMeta: metav1.ObjectMeta{Name: "net"},
		Spec:       marketv1alpha1.MarketNetworkSpec{Firehoses: []string{env.pds.URL}, PDSHosts: []string{env.pds.URL}},
	})
	waitMarket(ctx, t, c, &marketv1alpha1.MarketNetwork{}, "net", "MarketNetwork Ready", func(o client.Object) (bool, string) {
		n := o.(*marketv1alpha1.MarketNetwork)
		return ready(n.Status.Conditions, n.Generation) && n.Spec.Namespace == lexicon.Namespace, summary(n.Status.Phase, n.Status.Conditions)
	})
	acct := participant(ctx, t, c, env.pds, env.prefix+"seller.test", "seller", "net")

	create(ctx, t, c, bidder("b", "seller", "net", 25))
	p := waitPresence(ctx, t, env.pds, acct.DID, "b", "presence of b", func(p *presence) bool { return p != nil })
	if len(p.Offers) != 1 || p.Offers[0].Shape.Name != "small" || p.Offers[0].Shape.CPUMillis != 1000 || p.Offers[0].Shape.MemoryMiB != 1024 ||
		p.Offers[0].PricePerHour.Amount != 25 || p.Offers[0].PricePerHour.Currency != "USD-cents" || p.Offers[0].Capacity != 2 || p.Offers[0].Free != 2 ||
		p.Driver != "process" || !p.AcceptingRequests {
		t.Fatalf("presence does not equal the spec: %+v", p)
	}
	b := &marketv1alpha1.MarketBidder{}
	waitMarket(ctx, t, c, b, "b", "MarketBidder Ready", func(o client.Object) (bool, string) {
		b := o.(*marketv1alpha1.MarketBidder)
		return b.Status.Phase == marketv1alpha1.PhaseReady && ready(b.Status.Conditions, b.Generation) && b.Status.PresenceURI != "", summary(b.Status.Phase, b.Status.Conditions)
	})
	if want := "at://" + acct.DID + "/" + lexicon.Presence + "/b"; b.Status.PresenceURI != want {
		t.Errorf("status.presenceURI = %q, want %q", b.Status.PresenceURI, want)
	}

	// A new price is published; suspend says "not accepting".
	_, cid := readPresence(ctx, t, env.pds, acct.DID, "b")
	patch := func(spec map[string]any) {
		t.Helper()
		raw, _ := json.Marshal(map[string]any{"spec": spec})
		if err := c.Patch(ctx, b, client.RawPatch("application/merge-patch+json", raw), client.FieldOwner("e2e-user")); err != nil {
			t.Fatal(err)
		}
	}
	offers := []map[string]any{{"name": "small", "cpuMillis": 1000, "memoryMiB": 1024, "capacity": 2, "pricePerHour": map[string]any{"amount": 40, "currency": "USD-cents"}}}
	patch(map[string]any{"offers": offers})
	waitPresence(ctx, t, env.pds, acct.DID, "b", "new price", func(p *presence) bool { return p != nil && p.Offers[0].PricePerHour.Amount == 40 })
	if _, cid2 := readPresence(ctx, t, env.pds, acct.DID, "b"); cid2 == cid {
		t.Errorf("the record's CID did not change with the price")
	}
	patch(map[string]any{"suspend": true})
	waitPresence(ctx, t, env.pds, acct.DID, "b", "suspended presence", func(p *presence) bool { return p != nil && !p.AcceptingRequests })
	waitMarket(ctx, t, c, b, "b", "MarketBidder Suspended", func(o client.Object) (bool, string) {
		b := o.(*marketv1alpha1.MarketBidder)
		return b.Status.Phase == marketv1alpha1.PhaseSuspended && b.Status.ObservedGeneration == b.Generation, summary(b.Status.Phase, b.Status.Conditions)
	})

	// One writer per status (R05), owner reference (R07), no spec written
	// by a controller (R03).
	pres := &marketv1alpha1.MarketPresence{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "b"}, pres); err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(pres); ref == nil || ref.Kind != "MarketBidder" || ref.UID != b.UID {
		t.Errorf("MarketPresence controller owner = %+v, want MarketBidder b", ref)
	}
	onlyWriter(t, pres, "knotless-marketpresence")
	onlyWriter(t, b, "knotless-marketbidder")
	id := &marketv1alpha1.MarketIdentity{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "seller"}, id); err != nil {
		t.Fatal(err)
	}
	onlyWriter(t, id, "knotless-marketidentity")
	if cond := meta.FindStatusCondition(id.Status.Conditions, marketv1alpha1.ConditionVouched); cond == nil || cond.Reason != marketv1alpha1.ReasonNoOperator {
		t.Errorf("Vouched without an operator = %+v, want reason NoOperator", cond)
	}

	// Deleting the bidder deletes the record and the MarketPresence.
	if err := c.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	waitPresence(ctx, t, env.pds, acct.DID, "b", "presence deleted", func(p *presence) bool { return p == nil })
	waitPDS(ctx, t, "MarketPresence b gone", func() (bool, string) {
		err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "b"}, &marketv1alpha1.MarketPresence{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})

	marketBadInput(ctx, t, c, acct)

	// Figures: create → readable, and provider CPU per presence.
	const n = 20
	cpu0, _ := env.provider.CPU()
	var took []time.Duration
	for i := range n {
		name := fmt.Sprintf("fig-%02d", i)
		start := time.Now()
		create(ctx, t, c, bidder(name, "seller", "net", int64(10+i)))
		waitPresence(ctx, t, env.pds, acct.DID, name, "presence of "+name, func(p *presence) bool { return p != nil })
		took = append(took, time.Since(start))
	}
	cpu1, _ := env.provider.CPU()
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	t.Logf("FIGURE MarketBidder create -> presence readable on the PDS: p50 %s, p99 %s (min %s) over %d",
		took[n/2].Round(time.Millisecond), took[n-1].Round(time.Millisecond), took[0].Round(time.Millisecond), n)
	t.Logf("FIGURE provider CPU per published presence: %s (%s over %d, everything the provider did meanwhile included)",
		((cpu1 - cpu0) / n).Round(time.Millisecond), (cpu1 - cpu0).Round(time.Millisecond), n)

	// Deleting the repo deletes its identity first, whose finalizer
	// deletes the presence records of the bidders that publish as it:
	// nothing stays in the public market.
	if err := c.Delete(ctx, &atprotov1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "seller"}}); err != nil {
		t.Fatal(err)
	}
	waitPDS(ctx, t, "the repo and its identity gone", func() (bool, string) {
		errRepo := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "seller"}, &atprotov1alpha1.AtprotoRepo{})
		errID := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "seller"}, &marketv1alpha1.MarketIdentity{})
		return apierrors.IsNotFound(errRepo) && apierrors.IsNotFound(errID), fmt.Sprintf("repo: %v, identity: %v", errRepo, errID)
	})
	for i := range n {
		if p, _ := readPresence(ctx, t, env.pds, acct.DID, fmt.Sprintf("fig-%02d", i)); p != nil {
			t.Errorf("presence fig-%02d still published after its repo was deleted", i)
		}
	}
}

// marketBadInput: what the schema can refuse is refused at admission with
// a message naming the field; what only the controller can judge is a
// condition with a reason, and nothing is written to the PDS.
func marketBadInput(ctx context.Context, t *testing.T, c client.Client, acct *framework.Account) {
	t.Helper()
	refused := func(what string, obj client.Object, field string) {
		t.Helper()
		err := c.Create(ctx, obj, client.FieldOwner("e2e-user"))
		if err == nil {
			t.Errorf("%s was accepted", what)
			_ = c.Delete(ctx, obj)
			return
		}
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v, want Invalid naming %s", what, err, field)
		}
	}
	neg := bidder("neg", "seller", "net", -5)
	refused("a negative price", neg, "spec.offers[0].pricePerHour.amount")
	refused("an invalid DID", marketIdentity("bad-did", "seller", "net", marketv1alpha1.Association{DID: "did:Nope", Roles: []marketv1alpha1.Role{"bidder"}}), "spec.approvedAssociations[0].did")
	refused("a firehose that is not a URL", network("bad-url", []string{"ftp://relay.example"}, ""), "spec.firehoses[0]")
	badNS := network("bad-ns", []string{env.pds.URL}, "")
	badNS.Spec.Namespace = "not an nsid"
	refused("a namespace that is not an NSID", badNS, "spec.namespace")
	refused("a repo of another workspace", marketIdentity("other-ws", "root:other/seller", "net"), "spec.repoRef.name")

	// A float price cannot be written through a typed client: send JSON.
	float := map[string]any{"apiVersion": marketv1alpha1.GroupVersion.String(), "kind": "MarketBidder",
		"metadata": map[string]any{"name": "float", "namespace": "default"},
		"spec": map[string]any{"identityRef": map[string]any{"name": "seller"}, "networkRef": map[string]any{"name": "net"},
			"offers": []any{map[string]any{"name": "small", "cpuMillis": 1000, "memoryMiB": 1024, "capacity": 1, "pricePerHour": map[string]any{"amount": 1.5, "currency": "USD-cents"}}}}}
	refused("a float price", &unstructured.Unstructured{Object: float}, "spec.offers[0].pricePerHour.amount")

	// A namespace knotless has no lexicons for: the network says so, a
	// bidder on it waits, and nothing is published.
	other := network("other-ns", []string{env.pds.URL}, "")
	other.Spec.Namespace = "com.example.market"
	create(ctx, t, c, other)
	waitMarket(ctx, t, c, &marketv1alpha1.MarketNetwork{}, "other-ns", "MarketNetwork InvalidSpec", func(o client.Object) (bool, string) {
		n := o.(*marketv1alpha1.MarketNetwork)
		cond := meta.FindStatusCondition(n.Status.Conditions, marketv1alpha1.ConditionReady)
		return n.Status.Phase == marketv1alpha1.PhaseFailed && cond != nil && cond.Reason == marketv1alpha1.ReasonInvalidSpec, summary(n.Status.Phase, n.Status.Conditions)
	})
	create(ctx, t, c, bidder("on-other", "seller", "other-ns", 5))
	// An identity whose repo exists only in another namespace.
	theirs := secretRepo("theirs", acct.Handle, "theirs-password")
	theirs.Namespace = "other"
	create(ctx, t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}}, theirs, marketIdentity("elsewhere", "theirs", "net"))
	waitMarket(ctx, t, c, &marketv1alpha1.MarketBidder{}, "on-other", "MarketBidder waiting for its network", func(o client.Object) (bool, string) {
		b := o.(*marketv1alpha1.MarketBidder)
		cond := meta.FindStatusCondition(b.Status.Conditions, marketv1alpha1.ConditionReady)
		return cond != nil && cond.Reason == marketv1alpha1.ReasonNotReady && strings.Contains(cond.Message, "other-ns"), summary(b.Status.Phase, b.Status.Conditions)
	})
	waitMarket(ctx, t, c, &marketv1alpha1.MarketIdentity{}, "elsewhere", "MarketIdentity without its repo", func(o client.Object) (bool, string) {
		id := o.(*marketv1alpha1.MarketIdentity)
		cond := meta.FindStatusCondition(id.Status.Conditions, marketv1alpha1.ConditionReady)
		return cond != nil && cond.Reason == marketv1alpha1.ReasonNotFound, summary(id.Status.Phase, id.Status.Conditions)
	})
	if p, _ := readPresence(ctx, t, env.pds, acct.DID, "on-other"); p != nil {
		t.Errorf("a bidder on a network without lexicons published %+v", p)
	}
	for _, o := range []client.Object{&marketv1alpha1.MarketBidder{ObjectMeta: metav1.ObjectMeta{Name: "on-other", Namespace: "default"}},
		&marketv1alpha1.MarketIdentity{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere", Namespace: "default"}}} {
		if err := c.Delete(ctx, o); err != nil {
			t.Error(err)
		}
	}
}

// TestMarketVouchingAcrossPDSes: an operator on a second PDS vouches for
// a bidder on the first; the bidder's identity follows both PDSes'
// firehoses (knotless does not run a relay here) and reports the voucher.
// An association record that does not match its lexicon is counted and
// ignored. Withdrawing the association un-vouches. A kill -9 of the
// provider while bidders and identities are created and changed leaves
// every spec, the user's managedFields, the network's firehoses and the
// vouching as they were, and a restart publishes nothing again (D03, D21).
func TestMarketVouchingAcrossPDSes(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	start := time.Now()
	repoRoot, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	pds2, err := framework.StartPDS(ctx, env.group, repoRoot, filepath.Join(env.dir, "pds2"), env.plc.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE second PDS ready in %s", time.Since(start).Round(time.Millisecond))
	firehoses := []string{env.pds.URL, pds2.URL}

	// The operator, on the second PDS, in a workspace of its own.
	oc := marketWorkspace(ctx, t, env.prefix+"-operator")
	create(ctx, t, oc, network("net", firehoses, ""))
	op := participant(ctx, t, oc, pds2, env.prefix+"operator.test", "operator", "net")

	// The bidder, on the first PDS, in a network the operator runs.
	bc := marketWorkspace(ctx, t, env.prefix+"-vouched")
	create(ctx, t, bc, network("net", firehoses, op.DID))
	seller := participant(ctx, t, bc, env.pds, env.prefix+"vouched.test", "seller", "net")
	vouched := func(want bool, reason string) {
		t.Helper()
		waitMarket(ctx, t, bc, &marketv1alpha1.MarketIdentity{}, "seller", fmt.Sprintf("MarketIdentity Vouched=%v", want), func(o client.Object) (bool, string) {
			id := o.(*marketv1alpha1.MarketIdentity)
			cond := meta.FindStatusCondition(id.Status.Conditions, marketv1alpha1.ConditionVouched)
			if cond == nil {
				return false, "no Vouched condition"
			}
			ok := (cond.Status == metav1.ConditionTrue) == want && cond.Reason == reason && len(id.Status.VouchedBy) > 0 == want
			return ok, summary(id.Status.Phase, id.Status.Conditions)
		})
	}
	vouched(false, marketv1alpha1.ReasonNotVouched)

	// The operator approves the bidder: published on the second PDS, seen
	// by the bidder's identity through that PDS's firehose.
	opID := &marketv1alpha1.MarketIdentity{}
	if err := oc.Get(ctx, client.ObjectKey{Namespace: "default", Name: "operator"}, opID); err != nil {
		t.Fatal(err)
	}
	assoc := map[string]any{"spec": map[string]any{"approvedAssociations": []any{map[string]any{"did": seller.DID, "roles": []string{"bidder"}}}}}
	raw, _ := json.Marshal(assoc)
	if err := oc.Patch(ctx, opID, client.RawPatch("application/merge-patch+json", raw), client.FieldOwner("e2e-user")); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	vouched(true, marketv1alpha1.ReasonVouched)
	t.Logf("FIGURE association published on one PDS -> vouched on the other's side: %s", time.Since(start).Round(time.Millisecond))

	// An association record that does not match its lexicon, written by a
	// plain client: counted, ignored, and the bidder stays vouched.
	before := framework.MetricSum(mustMetrics(t), "knotless_market_invalid_records_total")
	bogus := map[string]any{"repo": op.DID, "collection": lexicon.Association, "rkey": "bogus",
		"record": map[string]any{"$type": lexicon.Association, "subject": "not-a-did", "roles": []string{"bidder"}, "createdAt": "yesterday"}}
	if err := pds2.XRPC(ctx, "com.atproto.repo.putRecord", op.AccessJWT, nil, bogus, nil); err != nil {
		t.Fatal(err)
	}
	waitPDS(ctx, t, "the invalid association counted", func() (bool, string) {
		n := framework.MetricSum(mustMetrics(t), "knotless_market_invalid_records_total")
		return n > before, fmt.Sprintf("knotless_market_invalid_records_total %v (was %v)", n, before)
	})
	vouched(true, marketv1alpha1.ReasonVouched)

	// kill -9 while bidders are created and changed.
	netBefore := &marketv1alpha1.MarketNetwork{}
	if err := bc.Get(ctx, client.ObjectKey{Name: "net"}, netBefore); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		create(ctx, t, bc, bidder(fmt.Sprintf("k-%d", i), "seller", "net", int64(20+i)))
	}
	env.provider.Kill9()
	for i := range 3 {
		b := &marketv1alpha1.MarketBidder{}
		if err := bc.Get(ctx, client.ObjectKey{Namespace: "default", Name: fmt.Sprintf("k-%d", i)}, b); err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(map[string]any{"spec": map[string]any{"offers": []map[string]any{{"name": "small", "cpuMillis": 1000, "memoryMiB": 1024, "capacity": 3, "pricePerHour": map[string]any{"amount": 30 + i, "currency": "USD-cents"}}}}})
		if err := bc.Patch(ctx, b, client.RawPatch("application/merge-patch+json", raw), client.FieldOwner("e2e-user")); err != nil {
			t.Fatal(err)
		}
	}
	create(ctx, t, bc, bidder("k-3", "seller", "net", 33))
	// The bidder's identity changes while the provider is down, and an
	// identity is created.
	sellerID := &marketv1alpha1.MarketIdentity{}
	if err := bc.Get(ctx, client.ObjectKey{Namespace: "default", Name: "seller"}, sellerID); err != nil {
		t.Fatal(err)
	}
	raw, _ = json.Marshal(map[string]any{"spec": map[string]any{"approvedAssociations": []any{map[string]any{"did": op.DID, "roles": []string{"operator"}}}}})
	if err := bc.Patch(ctx, sellerID, client.RawPatch("application/merge-patch+json", raw), client.FieldOwner("e2e-user")); err != nil {
		t.Fatal(err)
	}
	spare, err := pds2.CreateAccount(ctx, env.prefix+"spare.test")
	if err != nil {
		t.Fatal(err)
	}
	spareRepo := secretRepo("spare", spare.Handle, "spare-password")
	spareRepo.Spec.PDS.URL = pds2.URL
	create(ctx, t, bc, passwordSecret("spare-password", spare.AppPassword), spareRepo, marketIdentity("spare", "spare", "net"))
	userFields := map[string]string{}
	for i := range 4 {
		b := &marketv1alpha1.MarketBidder{}
		if err := bc.Get(ctx, client.ObjectKey{Namespace: "default", Name: fmt.Sprintf("k-%d", i)}, b); err != nil {
			t.Fatal(err)
		}
		userFields[b.Name] = userEntries(b)
	}
	if err := env.provider.Restart(ctx, env.group); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		name := fmt.Sprintf("k-%d", i)
		want := int64(30 + i)
		if i == 3 {
			want = 33
		}
		waitPresence(ctx, t, env.pds, seller.DID, name, "presence of "+name+" after the restart", func(p *presence) bool {
			return p != nil && p.Offers[0].PricePerHour.Amount == want
		})
		b := &marketv1alpha1.MarketBidder{}
		waitMarket(ctx, t, bc, b, name, "MarketBidder Ready after the restart", func(o client.Object) (bool, string) {
			b := o.(*marketv1alpha1.MarketBidder)
			return ready(b.Status.Conditions, b.Generation), summary(b.Status.Phase, b.Status.Conditions)
		})
		if got := userEntries(b); got != userFields[name] {
			t.Errorf("MarketBidder %s: the user's managedFields changed across the restart:\nbefore %s\nafter  %s", name, userFields[name], got)
		}
		onlyWriter(t, b, "knotless-marketbidder")
	}
	waitPDS(ctx, t, "the association made while the provider was down", func() (bool, string) {
		_, err := getRecordFrom(ctx, env.pds, seller.DID, lexicon.Association, op.DID)
		return err == nil, fmt.Sprint(err)
	})
	waitMarket(ctx, t, bc, &marketv1alpha1.MarketIdentity{}, "spare", "identity created while the provider was down", func(o client.Object) (bool, string) {
		id := o.(*marketv1alpha1.MarketIdentity)
		return ready(id.Status.Conditions, id.Generation) && id.Status.DID == spare.DID, summary(id.Status.Phase, id.Status.Conditions)
	})
	if err := bc.Get(ctx, client.ObjectKey{Namespace: "default", Name: "seller"}, sellerID); err != nil {
		t.Fatal(err)
	}
	onlyWriter(t, sellerID, "knotless-marketidentity")
	if len(sellerID.Spec.ApprovedAssociations) != 1 || sellerID.Spec.ApprovedAssociations[0].DID != op.DID {
		t.Errorf("the identity's spec changed across the restart: %+v", sellerID.Spec)
	}
	netAfter := &marketv1alpha1.MarketNetwork{}
	if err := bc.Get(ctx, client.ObjectKey{Name: "net"}, netAfter); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(netAfter.Spec.Firehoses, netBefore.Spec.Firehoses) || netAfter.Spec.OperatorDID != netBefore.Spec.OperatorDID || netAfter.Generation != netBefore.Generation {
		t.Errorf("MarketNetwork changed across the restart: %+v (generation %d), was %+v (generation %d)", netAfter.Spec, netAfter.Generation, netBefore.Spec, netBefore.Generation)
	}
	vouched(true, marketv1alpha1.ReasonVouched)

	// A restart with everything published writes nothing to either repo.
	sellerRev, opRev := latestRev(ctx, t, env.pds, seller.DID), latestRev(ctx, t, pds2, op.DID)
	env.provider.Kill9()
	if err := env.provider.Restart(ctx, env.group); err != nil {
		t.Fatal(err)
	}
	vouched(true, marketv1alpha1.ReasonVouched)
	waitMarket(ctx, t, oc, &marketv1alpha1.MarketIdentity{}, "operator", "operator identity reconciled after the restart", func(o client.Object) (bool, string) {
		id := o.(*marketv1alpha1.MarketIdentity)
		return ready(id.Status.Conditions, id.Generation), summary(id.Status.Phase, id.Status.Conditions)
	})
	time.Sleep(5 * time.Second) // past a resync (3s in the e2e suite)
	if got := latestRev(ctx, t, env.pds, seller.DID); got != sellerRev {
		t.Errorf("the bidder's repo was written after a restart with nothing to change (rev %s -> %s)", sellerRev, got)
	}
	if got := latestRev(ctx, t, pds2, op.DID); got != opRev {
		t.Errorf("the operator's repo was written after a restart with nothing to change (rev %s -> %s)", opRev, got)
	}

	// The operator withdraws the association: the bidder is no longer
	// vouched.
	raw, _ = json.Marshal(map[string]any{"spec": map[string]any{"approvedAssociations": nil}})
	if err := oc.Get(ctx, client.ObjectKey{Namespace: "default", Name: "operator"}, opID); err != nil {
		t.Fatal(err)
	}
	if err := oc.Patch(ctx, opID, client.RawPatch("application/merge-patch+json", raw), client.FieldOwner("e2e-user")); err != nil {
		t.Fatal(err)
	}
	vouched(false, marketv1alpha1.ReasonNotVouched)
}

// userEntries is the user's managedFields entries of the main resource.
func userEntries(o client.Object) string {
	var out []string
	for _, mf := range o.GetManagedFields() {
		if mf.Manager == "e2e-user" && mf.Subresource == "" && mf.FieldsV1 != nil {
			out = append(out, mf.FieldsV1.GetRawString())
		}
	}
	return strings.Join(out, "\n")
}

func mustMetrics(t *testing.T) string {
	t.Helper()
	text, err := env.provider.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	return text
}
