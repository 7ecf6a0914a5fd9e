package dealexec

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/market/deal"
)

// TestBidIsOneWritePerState: a Bid is made with its state in one write,
// written again only when its state changes, and a write that raised its
// generation (a Bid has no status subresource) does not call for another.
func TestBidIsOneWritePerState(t *testing.T) {
	ctx := context.Background()
	owner := &marketv1alpha1.MarketBidder{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b", UID: "u"}}
	writes := 0
	count := interceptor.Funcs{}
	inner := clustertest.NewClientBuilder().WithObjects(owner).Build()
	count.Apply = func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
		writes++
		return inner.Apply(ctx, obj, opts...)
	}
	c := interceptor.NewClient(inner, count)
	w := &Written{}
	spec := &marketv1alpha1.BidSpec{Side: marketv1alpha1.SideBidder, Request: marketv1alpha1.RecordRef{URI: "at://r"}, Bid: marketv1alpha1.RecordRef{URI: "at://b"}}
	open := &deal.BidOp{Name: "bid", Create: spec, Status: marketv1alpha1.BidStatus{State: marketv1alpha1.BidOpen, Message: "open until then"}}

	b, err := Bid(ctx, c, owner, nil, open, w, "m")
	if err != nil || writes != 1 {
		t.Fatalf("made: %d writes, %v; want 1", writes, err)
	}
	got := &marketv1alpha1.Bid{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(b), got); err != nil || got.Status.State != marketv1alpha1.BidOpen {
		t.Fatalf("made with its state: %+v %v", got.Status, err)
	}
	// kcp raises a Bid's generation with every write of its state.
	got.Generation = 2
	if _, err := Bid(ctx, c, owner, got, &deal.BidOp{Name: "bid", Status: open.Status}, w, "m"); err != nil || writes != 1 {
		t.Fatalf("the same state again: %d writes, %v; want none more", writes, err)
	}
	lost := &deal.BidOp{Name: "bid", Status: marketv1alpha1.BidStatus{State: marketv1alpha1.BidLost, Message: "another bid was leased"}}
	if _, err := Bid(ctx, c, owner, got, lost, w, "m"); err != nil || writes != 2 {
		t.Fatalf("a new state: %d writes, %v; want 2", writes, err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(b), got); err != nil || got.Status.State != marketv1alpha1.BidLost || got.Spec.Bid.URI != "at://b" {
		t.Fatalf("after the new state: %+v %+v %v", got.Spec, got.Status, err)
	}

	// A Bid made before Bids lost their status subresource keeps the
	// observedGeneration its Ready condition had (the status
	// subresource's manager owns it): the same state is no write.
	got.Status.Conditions[0].ObservedGeneration = 1
	if _, err := Bid(ctx, c, owner, got, lost, w, "m"); err != nil || writes != 2 {
		t.Fatalf("an older Bid in the same state: %d writes, %v; want none more", writes, err)
	}

	// A Bid deleted since it was read is not made again by a new state.
	if err := inner.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	if _, err := Bid(ctx, c, owner, got, open, w, "m"); err != nil {
		t.Fatalf("a deleted Bid: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(b), &marketv1alpha1.Bid{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a deleted Bid was made again: %v", err)
	}
}
