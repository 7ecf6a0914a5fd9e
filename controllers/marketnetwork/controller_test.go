package marketnetwork

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
)

const lc = "2x7uf0bml0q9ms3b"

func TestReconcile(t *testing.T) {
	good := &marketv1alpha1.MarketNetwork{ObjectMeta: metav1.ObjectMeta{Name: "good", Generation: 1}, Spec: marketv1alpha1.MarketNetworkSpec{Firehoses: []string{"https://relay.example"}}}
	bad := &marketv1alpha1.MarketNetwork{ObjectMeta: metav1.ObjectMeta{Name: "bad", Generation: 2}, Spec: marketv1alpha1.MarketNetworkSpec{Firehoses: []string{"https://relay.example"}, Namespace: "com.example.market"}}
	ws := clustertest.New(good, bad)
	r := &Reconciler{GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{lc: ws})}
	for _, tc := range []struct {
		name   string
		phase  marketv1alpha1.Phase
		status metav1.ConditionStatus
		reason string
	}{
		{"good", marketv1alpha1.PhaseReady, metav1.ConditionTrue, marketv1alpha1.ReasonReady},
		{"bad", marketv1alpha1.PhaseFailed, metav1.ConditionFalse, marketv1alpha1.ReasonInvalidSpec},
	} {
		for range 2 { // the second reconcile writes nothing new
			if _, err := r.Reconcile(context.Background(), mcreconcile.Request{ClusterName: lc, Request: reconcile.Request{NamespacedName: types.NamespacedName{Name: tc.name}}}); err != nil {
				t.Fatal(err)
			}
		}
		n := &marketv1alpha1.MarketNetwork{}
		if err := ws.Client.Get(context.Background(), client.ObjectKey{Name: tc.name}, n); err != nil {
			t.Fatal(err)
		}
		cond := clustertest.Condition(t, n.Status.Conditions, marketv1alpha1.ConditionReady)
		if n.Status.Phase != tc.phase || cond.Status != tc.status || cond.Reason != tc.reason || n.Status.ObservedGeneration != n.Generation {
			t.Errorf("%s: phase %s, Ready %s/%s (%s), observedGeneration %d", tc.name, n.Status.Phase, cond.Status, cond.Reason, cond.Message, n.Status.ObservedGeneration)
		}
	}
	if got := ws.Events.Reasons(); len(got) != 2 {
		t.Errorf("events %v, want one per network", got)
	}
}
