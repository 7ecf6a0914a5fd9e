package gatewayroute

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/driver/drivertest"
	"github.com/knotless-dev/knotless/internal/gateway"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/sshgateway"
)

// sshRecord is did's dev.knotless.gateway.ssh record rkey for lease l.
func sshRecord(did, rkey, l string, namespaces ...string) (string, json.RawMessage) {
	b, _ := json.Marshal(map[string]any{"$type": lexicon.GatewaySSH, "namespaces": namespaces,
		"lease": map[string]any{"uri": l, "cid": "bafyreignzp2ktfskvmxvm6m5jvkbj3kjhiw75czms7xcvfw5dlfmmzc7yy"}, "createdAt": "2026-12-05T10:00:00Z"})
	return "at://" + did + "/" + lexicon.GatewaySSH + "/" + rkey, b
}

// TestReconcileSSHTargets: a VM's tenant lets SSH sessions into the
// namespaces its requester's ssh records list for its lease; records of
// another DID, of another lease, and namespaces that are not names do
// not count; the contract ending removes the target.
func TestReconcileSSHTargets(t *testing.T) {
	vm, cc := contractFor("web-0", alice, lease, time.Now())
	ws := clustertest.New(vm, cc)
	recs := map[string]json.RawMessage{}
	for _, r := range []struct {
		did, rkey, lease string
		ns               []string
	}{
		{alice, "a", lease, []string{"web", "Bad_NS"}},
		{alice, "b", lease, []string{"jobs", "web"}},
		{alice, "c", "at://did:plc:bidder/dev.knotless.market.lease/other", []string{"other"}},
		{"did:plc:mallory", "d", lease, []string{"stolen"}},
	} {
		uri, v := sshRecord(r.did, r.rkey, r.lease, r.ns...)
		recs[uri] = v
	}
	targets := &sshgateway.Targets{}
	r := &Reconciler{Client: ws.Client, Drivers: map[string]driver.Driver{"kind": podDriver{drivertest.New(t)}},
		Records: &fakeRecords{byDID: map[string]map[string]json.RawMessage{alice: recs}, follows: map[types.NamespacedName]string{}},
		Routes:  &gateway.Routes{}, SSH: targets}
	ctx := context.Background()
	key := types.NamespacedName{Namespace: "bids", Name: "web-0"}
	if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: key}); err != nil {
		t.Fatal(err)
	}
	for ns, want := range map[string]bool{"web": true, "jobs": true, "other": false, "stolen": false, "Bad_NS": false} {
		if got, ok := targets.Find("l1", ns); ok != want || (ok && got != string(vm.UID)) {
			t.Errorf("the tenant of lease l1 with %s: %q %v, want %v", ns, got, ok, want)
		}
	}
	cc.Status.Phase = marketv1alpha1.ContractCompleted
	if err := ws.Client.Status().Update(ctx, cc); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: key}); err != nil {
		t.Fatal(err)
	}
	if got, ok := targets.Find("l1", "web"); ok {
		t.Errorf("after the contract ended: %v", got)
	}
}
