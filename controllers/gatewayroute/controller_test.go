package gatewayroute

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/driver/drivertest"
	"github.com/knotless-dev/knotless/internal/gateway"
	"github.com/knotless-dev/knotless/internal/lexicon"
)

const (
	alice = "did:plc:alice"
	lease = "at://did:plc:bidder/dev.knotless.market.lease/l1"
)

// podDriver is a driver whose tenants run pods.
type podDriver struct{ *drivertest.Fake }

func (podDriver) TenantAdmin(context.Context, driver.VM) (*rest.Config, error) {
	return &rest.Config{Host: "https://127.0.0.1:1"}, nil
}

// fakeRecords are requesters' records held in memory.
type fakeRecords struct {
	byDID    map[string]map[string]json.RawMessage
	follows  map[types.NamespacedName]string
	fail     error
	unlisted bool
}

func (f *fakeRecords) Follow(_ context.Context, vm types.NamespacedName, did string) error {
	if f.fail != nil {
		return f.fail
	}
	f.follows[vm] = did
	return nil
}

func (f *fakeRecords) Unfollow(vm types.NamespacedName) { delete(f.follows, vm) }

func (f *fakeRecords) Records(did string) (map[string]json.RawMessage, bool) {
	return f.byDID[did], !f.unlisted
}

// claim is did's association record of host for lease l.
func claim(did, rkey, host, l string) (string, json.RawMessage) {
	b, _ := json.Marshal(map[string]any{"$type": lexicon.GatewayAssociation, "hostname": host,
		"lease":   map[string]any{"uri": l, "cid": "bafyreignzp2ktfskvmxvm6m5jvkbj3kjhiw75czms7xcvfw5dlfmmzc7yy"},
		"service": map[string]any{"namespace": "web", "name": "shop", "port": 80}, "createdAt": "2026-12-05T10:00:00Z"})
	return "at://" + did + "/" + lexicon.GatewayAssociation + "/" + rkey, b
}

// contractFor is a running kind VM of the bidder's Active contract name,
// whose requester is did, created at created, with lease l.
func contractFor(name, did, l string, created time.Time) (*computev1alpha1.ComputeVM, *marketv1alpha1.ComputeContract) {
	cc := &marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Namespace: "bids", Name: name, UID: types.UID("cc-" + name),
		CreationTimestamp: metav1.NewTime(created)},
		Spec: marketv1alpha1.ComputeContractSpec{Side: marketv1alpha1.SideBidder, RequesterDID: did},
		Status: marketv1alpha1.ComputeContractStatus{Phase: marketv1alpha1.ContractActive,
			Records: marketv1alpha1.ContractRecords{Lease: &marketv1alpha1.RecordRef{URI: l}}}}
	vm := &computev1alpha1.ComputeVM{ObjectMeta: metav1.ObjectMeta{Namespace: "bids", Name: name, UID: types.UID("vm-" + name),
		OwnerReferences: []metav1.OwnerReference{{APIVersion: marketv1alpha1.GroupVersion.String(), Kind: "ComputeContract",
			Name: cc.Name, UID: cc.UID, Controller: ptr.To(true)}}},
		Spec:   computev1alpha1.ComputeVMSpec{ContractName: cc.Name, Driver: "kind", CPUMillis: 1, MemoryMiB: 1},
		Status: computev1alpha1.ComputeVMStatus{Phase: computev1alpha1.VMRunning}}
	return vm, cc
}

func TestReconcileRoutes(t *testing.T) {
	vm, cc := contractFor("web-0", alice, lease, time.Now())
	ws := clustertest.New(vm, cc)
	records := &fakeRecords{byDID: map[string]map[string]json.RawMessage{alice: {}}, follows: map[types.NamespacedName]string{}}
	add := func(did, rkey, host, l string) {
		uri, v := claim(did, rkey, host, l)
		if records.byDID[did] == nil {
			records.byDID[did] = map[string]json.RawMessage{}
		}
		records.byDID[did][uri] = v
	}
	add(alice, "shop.gw.test", "shop.gw.test", lease)
	add(alice, "other.gw.test", "other.gw.test", "at://did:plc:bidder/dev.knotless.market.lease/ended") // another lease
	add(alice, "wrong-key.gw.test", "key.gw.test", lease)                                               // key is not the hostname
	add(alice, "shop.elsewhere.test", "shop.elsewhere.test", lease)                                     // not covered
	add(alice, "Upper.gw.test", "Upper.gw.test", lease)                                                 // not lowercase
	routes := &gateway.Routes{}
	r := &Reconciler{Client: ws.Client, Drivers: map[string]driver.Driver{"kind": podDriver{drivertest.New(t)}, "process": drivertest.New(t)},
		Records: records, Routes: routes, Covers: func(h string) bool { return strings.HasSuffix(h, ".gw.test") }}
	ctx := context.Background()
	key := types.NamespacedName{Namespace: "bids", Name: "web-0"}
	reconcileOK := func() reconcile.Result {
		t.Helper()
		res, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: key})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	served := func() []string {
		var out []string
		for _, h := range []string{"shop.gw.test", "other.gw.test", "key.gw.test", "wrong-key.gw.test", "shop.elsewhere.test", "upper.gw.test"} {
			if rt, ok := routes.Get(h); ok {
				out = append(out, fmt.Sprintf("%s→%s %s/%s:%d", h, rt.DID, rt.Namespace, rt.Service, rt.Port))
			}
		}
		return out
	}

	reconcileOK()
	if got := served(); len(got) != 1 || got[0] != "shop.gw.test→did:plc:alice web/shop:80" {
		t.Fatalf("served %v, want shop.gw.test only", got)
	}
	if records.follows[key] != alice {
		t.Fatalf("following %q, want the requester", records.follows[key])
	}

	// The contract ends: no route, nothing followed.
	cc.Status.Phase = marketv1alpha1.ContractReleasing
	if err := ws.Client.Status().Update(ctx, cc); err != nil {
		t.Fatal(err)
	}
	reconcileOK()
	if got := served(); len(got) != 0 || len(records.follows) != 0 {
		t.Fatalf("a contract that ended: served %v, following %v", got, records.follows)
	}

	// Active again, but the VM's driver runs no pods.
	cc.Status.Phase = marketv1alpha1.ContractActive
	if err := ws.Client.Status().Update(ctx, cc); err != nil {
		t.Fatal(err)
	}
	vm.Spec.Driver = "process"
	if err := ws.Client.Update(ctx, vm); err != nil {
		t.Fatal(err)
	}
	reconcileOK()
	if got := served(); len(got) != 0 {
		t.Fatalf("a process tenant: served %v", got)
	}
	vm.Spec.Driver = "kind"
	if err := ws.Client.Update(ctx, vm); err != nil {
		t.Fatal(err)
	}

	// The requester's records cannot be followed (its DID does not
	// resolve): no route, looked at again later, no error storm.
	records.fail = errors.New("no such DID")
	if res := reconcileOK(); res.RequeueAfter != retry || len(served()) != 0 {
		t.Fatalf("unfollowable: %+v, served %v", res, served())
	}
	records.fail = nil

	// Not listed yet: nothing served until the listing wakes it up.
	records.unlisted = true
	reconcileOK()
	if got := served(); len(got) != 0 {
		t.Fatalf("before the listing: served %v", got)
	}
	records.unlisted = false
	reconcileOK()
	if got := served(); len(got) != 1 {
		t.Fatalf("after the listing: served %v", got)
	}

	// The VM goes: its routes go.
	if err := ws.Client.Delete(ctx, vm); err != nil {
		t.Fatal(err)
	}
	reconcileOK()
	if got := served(); len(got) != 0 || len(records.follows) != 0 {
		t.Fatalf("a VM deleted: served %v, following %v", got, records.follows)
	}
}

// TestRoutesFromOthers: records of another repo naming this lease are
// not this requester's, whatever they claim.
func TestRoutesFromOthers(t *testing.T) {
	uri, v := claim("did:plc:mallory", "shop.gw.test", "shop.gw.test", lease)
	got := Routes(map[string]json.RawMessage{uri: v}, alice, lease, func(string) bool { return true })
	if len(got) != 0 {
		t.Fatalf("a third party's record is served: %v", got)
	}
	// A malformed record, a bad service name or port: not served.
	for _, raw := range []string{`{`, `{"hostname":"shop.gw.test","lease":{"uri":"` + lease + `"},"service":{"namespace":"web","name":"Shop!","port":80}}`,
		`{"hostname":"shop.gw.test","lease":{"uri":"` + lease + `"},"service":{"namespace":"web","name":"shop","port":0}}`} {
		uri := "at://" + alice + "/" + lexicon.GatewayAssociation + "/shop.gw.test"
		if got := Routes(map[string]json.RawMessage{uri: json.RawMessage(raw)}, alice, lease, func(string) bool { return true }); len(got) != 0 {
			t.Errorf("%s is served: %v", raw, got)
		}
	}
}
