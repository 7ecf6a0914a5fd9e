package gatewayroute

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/lexicon"
)

// maxRecords bounds the association records kept of one requester (R21).
const maxRecords = 64

// HubRecords follows requesters' records on their own PDSes' firehoses
// through a firehose.Hub (commits verified, listings bounded, the address
// policy and no redirects: the Hub's). One subscription per DID, shared
// by its VMs, ended with the last of them. Start it as a manager
// runnable: when it stops, every subscription ends and its goroutine is
// joined.
type HubRecords struct {
	hub  *firehose.Hub
	dir  identity.Directory
	wake chan event.TypedGenericEvent[*computev1alpha1.ComputeVM]

	mu      sync.Mutex
	byDID   map[string]*followed
	byVM    map[types.NamespacedName]string
	stopped bool
	wg      sync.WaitGroup
}

// followed is one DID's subscription and the VMs that follow it.
type followed struct {
	sub  *firehose.Subscription
	vms  map[types.NamespacedName]bool
	stop chan struct{}
}

// NewHubRecords follows records through hub, finding each DID's PDS in
// dir.
func NewHubRecords(hub *firehose.Hub, dir identity.Directory) *HubRecords {
	return &HubRecords{hub: hub, dir: dir, wake: make(chan event.TypedGenericEvent[*computev1alpha1.ComputeVM], 64),
		byDID: map[string]*followed{}, byVM: map[types.NamespacedName]string{}}
}

// Wake receives the VMs whose requester's records changed.
func (h *HubRecords) Wake() <-chan event.TypedGenericEvent[*computev1alpha1.ComputeVM] { return h.wake }

// Follow implements Records.
func (h *HubRecords) Follow(ctx context.Context, vm types.NamespacedName, did string) error {
	h.mu.Lock()
	if h.byVM[vm] == did && h.byDID[did] != nil {
		h.mu.Unlock()
		return nil
	}
	h.unfollowLocked(vm)
	known := h.byDID[did] != nil
	h.mu.Unlock()
	var pds string
	if !known {
		d, err := syntax.ParseDID(did)
		if err != nil {
			return fmt.Errorf("the requester %q is not a DID", did)
		}
		ident, err := h.dir.LookupDID(ctx, d)
		if err != nil {
			return fmt.Errorf("resolving %s: %w", did, err)
		}
		if pds = ident.PDSEndpoint(); pds == "" {
			return fmt.Errorf("%s names no PDS", did)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return errors.New("the agent is stopping")
	}
	f := h.byDID[did]
	if f == nil {
		if pds == "" {
			// Unfollowed meanwhile: the next look resolves it again.
			return errors.New("the requester's subscription ended meanwhile")
		}
		sub, err := h.hub.Subscribe(pds, firehose.Filter{
			Collections: []string{lexicon.GatewayAssociation, lexicon.GatewaySSH}, DIDs: []string{did},
			Check: lexicon.ValidateRecord,
		}, maxRecords, firehose.State{})
		if err != nil {
			return err
		}
		f = &followed{sub: sub, vms: map[types.NamespacedName]bool{}, stop: make(chan struct{})}
		h.byDID[did] = f
		h.wg.Add(1)
		go h.relay(f)
	}
	f.vms[vm] = true
	h.byVM[vm] = did
	return nil
}

// relay wakes f's VMs up when its subscription changes, until f stops.
func (h *HubRecords) relay(f *followed) {
	defer h.wg.Done()
	for {
		select {
		case <-f.stop:
			return
		case <-f.sub.Changed():
		}
		h.mu.Lock()
		vms := make([]types.NamespacedName, 0, len(f.vms))
		for vm := range f.vms {
			vms = append(vms, vm)
		}
		h.mu.Unlock()
		for _, vm := range vms {
			obj := &computev1alpha1.ComputeVM{ObjectMeta: metav1.ObjectMeta{Namespace: vm.Namespace, Name: vm.Name}}
			select {
			case h.wake <- event.TypedGenericEvent[*computev1alpha1.ComputeVM]{Object: obj}:
			case <-f.stop:
				return
			}
		}
	}
}

// Unfollow implements Records.
func (h *HubRecords) Unfollow(vm types.NamespacedName) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unfollowLocked(vm)
}

func (h *HubRecords) unfollowLocked(vm types.NamespacedName) {
	did, ok := h.byVM[vm]
	if !ok {
		return
	}
	delete(h.byVM, vm)
	f := h.byDID[did]
	if f == nil {
		return
	}
	delete(f.vms, vm)
	if len(f.vms) == 0 {
		delete(h.byDID, did)
		close(f.stop)
		h.hub.Unsubscribe(f.sub)
	}
}

// Records implements Records.
func (h *HubRecords) Records(did string) (map[string]json.RawMessage, bool) {
	h.mu.Lock()
	f := h.byDID[did]
	h.mu.Unlock()
	if f == nil || f.sub.Listed(did).IsZero() {
		return nil, false
	}
	st, _, _ := f.sub.Snapshot()
	out := make(map[string]json.RawMessage, len(st.Records))
	for uri, rec := range st.Records {
		out[uri] = rec.Value
	}
	return out, true
}

// Start implements manager.Runnable: it waits for ctx, then ends every
// subscription and joins their goroutines.
func (h *HubRecords) Start(ctx context.Context) error {
	<-ctx.Done()
	h.mu.Lock()
	h.stopped = true
	for did, f := range h.byDID {
		close(f.stop)
		h.hub.Unsubscribe(f.sub)
		delete(h.byDID, did)
	}
	h.byVM = map[types.NamespacedName]string{}
	h.mu.Unlock()
	h.wg.Wait()
	return nil
}
