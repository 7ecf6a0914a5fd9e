package marketidentity

import (
	"cmp"
	"encoding/json"
	"errors"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// feed is one operator's association records as one source carries them:
// one subscription shared by every identity that follows that operator on
// that source. Its vouchers are decoded again only when the subscription
// changed.
type feed struct {
	sub  *firehose.Subscription
	refs map[string]bool // identity keys

	version  uint64
	vouchers map[string][]marketv1alpha1.Voucher // by subject DID
}

// vouch sets st.VouchedBy, st.InvalidRecords and the Vouched condition
// from the network operator's association records, and reports whether
// the identity follows feeds (and should be looked at again soon).
func (r *Reconciler) vouch(k string, id *marketv1alpha1.MarketIdentity, net *marketv1alpha1.MarketNetwork, st *marketv1alpha1.MarketIdentityStatus) bool {
	op := net.Spec.OperatorDID
	if op == "" || op == st.DID || r.Hub == nil {
		r.unfollow(k, nil)
		st.VouchedBy, st.InvalidRecords = nil, 0
		if op != "" && op == st.DID {
			conditions.Set(&st.Conditions, marketv1alpha1.ConditionVouched, id.Generation, metav1.ConditionTrue, marketv1alpha1.ReasonVouched, "this identity is the network's operator")
		} else {
			conditions.Set(&st.Conditions, marketv1alpha1.ConditionVouched, id.Generation, metav1.ConditionFalse, marketv1alpha1.ReasonNoOperator, "MarketNetwork "+net.Name+" names no operator")
		}
		return false
	}
	// One feed per source, however the network spells it.
	var keys []string
	for _, src := range net.Spec.Firehoses {
		if n, err := firehose.NormalizeSource(src); err == nil && !slices.Contains(keys, n+"|"+op) {
			keys = append(keys, n+"|"+op)
		}
	}
	feeds := r.follow(k, op, keys)

	got := r.read(op, st.DID, feeds)
	st.VouchedBy, st.InvalidRecords = got.vouchedBy, got.invalid
	failure := got.failure
	switch {
	case len(st.VouchedBy) > 0:
		conditions.Set(&st.Conditions, marketv1alpha1.ConditionVouched, id.Generation, metav1.ConditionTrue, marketv1alpha1.ReasonVouched, "vouched for by the operator "+op)
	case failure != nil:
		conditions.Set(&st.Conditions, marketv1alpha1.ConditionVouched, id.Generation, metav1.ConditionFalse, failureReason(failure), "reading the operator's association records: "+failure.Error())
	case !got.connected || got.listing:
		conditions.Set(&st.Conditions, marketv1alpha1.ConditionVouched, id.Generation, metav1.ConditionFalse, marketv1alpha1.ReasonConnecting, "reading the operator's association records from the network's firehoses")
	default:
		conditions.Set(&st.Conditions, marketv1alpha1.ConditionVouched, id.Generation, metav1.ConditionFalse, marketv1alpha1.ReasonNotVouched, "no association record of the operator "+op+" names this identity")
	}
	return true
}

// failureReason is the Vouched reason of a feed's failed connection or
// listing.
func failureReason(err error) string {
	switch {
	case errors.Is(err, netpolicy.ErrDenied):
		return marketv1alpha1.ReasonAddressNotAllowed
	case errors.Is(err, firehose.ErrListingTooLarge):
		return marketv1alpha1.ReasonListingTooLarge
	default:
		return marketv1alpha1.ReasonSourceUnreachable
	}
}

// byVoucher indexes the operator's association records of a feed by
// subject. Every record there passed check.
func byVoucher(op string, state firehose.State) map[string][]marketv1alpha1.Voucher {
	out := map[string][]marketv1alpha1.Voucher{}
	for _, rec := range state.Records {
		var a market.Association
		if rec.DID() != op || json.Unmarshal(rec.Value, &a) != nil {
			continue
		}
		roles := make([]marketv1alpha1.Role, len(a.Roles))
		for i, role := range a.Roles {
			roles[i] = marketv1alpha1.Role(role)
		}
		out[a.Subject] = append(out[a.Subject], marketv1alpha1.Voucher{DID: op, Roles: roles, URI: rec.URI, CID: rec.CID})
	}
	return out
}

// reading is what the operator's feeds say of one identity.
type reading struct {
	// vouchedBy are the operator's association records that name it,
	// by URI.
	vouchedBy []marketv1alpha1.Voucher
	// invalid counts the records the feeds refused.
	invalid int64
	// connected: a feed is connected; listing: a feed is listing.
	connected, listing bool
	// failure is the first feed's failure, if any.
	failure error
}

// read returns what feeds of the operator op say of the identity did.
func (r *Reconciler) read(op, did string, feeds []*feed) reading {
	var got reading
	vouchers := map[string]marketv1alpha1.Voucher{}
	for _, f := range feeds {
		state, health, version := f.sub.Snapshot()
		r.mu.Lock()
		if f.vouchers == nil || version != f.version {
			f.vouchers, f.version = byVoucher(op, state), version
		}
		for _, v := range f.vouchers[did] {
			vouchers[v.URI] = v
		}
		r.mu.Unlock()
		got.invalid += state.Invalid
		got.connected = got.connected || health.Connected
		got.listing = got.listing || health.Resyncing
		if got.failure == nil {
			got.failure = cmp.Or(health.ResyncErr, health.Err)
		}
	}
	got.vouchedBy = make([]marketv1alpha1.Voucher, 0, len(vouchers))
	for _, v := range vouchers {
		got.vouchedBy = append(got.vouchedBy, v)
	}
	slices.SortFunc(got.vouchedBy, func(a, b marketv1alpha1.Voucher) int { return cmp.Compare(a.URI, b.URI) })
	return got
}

// follow makes the identity k use exactly the feeds of keys (source|DID),
// subscribing to the ones nobody used yet, and returns them.
func (r *Reconciler) follow(k, op string, keys []string) []*feed {
	r.unfollow(k, keys)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.feeds == nil {
		r.feeds, r.following = map[string]*feed{}, map[string][]string{}
	}
	var out []*feed
	for _, fk := range keys {
		f := r.feeds[fk]
		if f == nil {
			src := fk[:len(fk)-len(op)-1]
			sub, err := r.Hub.Subscribe(src, firehose.Filter{Collections: []string{lexicon.Association}, DIDs: []string{op}, Check: r.check}, maxAssociations, firehose.State{})
			if err != nil { // the network's Validate checked every source
				continue
			}
			f = &feed{sub: sub, refs: map[string]bool{}}
			r.feeds[fk] = f
		}
		f.refs[k] = true
		out = append(out, f)
	}
	r.following[k] = keys
	return out
}

// unfollow stops identity k from using the feeds it used except those in
// keep, and unsubscribes from feeds nobody uses any more.
func (r *Reconciler) unfollow(k string, keep []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, fk := range r.following[k] {
		if slices.Contains(keep, fk) {
			continue
		}
		if f := r.feeds[fk]; f != nil {
			delete(f.refs, k)
			if len(f.refs) == 0 {
				r.Hub.Unsubscribe(f.sub)
				delete(r.feeds, fk)
			}
		}
	}
	if keep == nil {
		delete(r.following, k)
	}
}

// drop forgets everything about identity k.
func (r *Reconciler) drop(k string) {
	r.unfollow(k, nil)
	r.mu.Lock()
	delete(r.published, k)
	r.mu.Unlock()
}

// check validates a record from a firehose against the association
// lexicon before a feed keeps it; an invalid one is counted and ignored.
func (r *Reconciler) check(_ string, value json.RawMessage) error {
	err := lexicon.ValidateRecord(lexicon.Association, value)
	if err != nil && r.Invalid != nil {
		r.Invalid.Inc()
	}
	return err
}
