// Package market holds what the market controllers share: resolving a
// MarketIdentity to its repo's PDS client, and publishing a market record
// only after it matches its lexicon.
package market

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/repoconn"
)

// Repo returns the Ready AtprotoRepo an identity names (in the identity's
// namespace). A repo that is missing or not Ready is a *conditions.Error
// with reason NotFound or NotReady.
func Repo(ctx context.Context, c client.Client, id *marketv1alpha1.MarketIdentity) (*atprotov1alpha1.AtprotoRepo, error) {
	repo := &atprotov1alpha1.AtprotoRepo{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: id.Namespace, Name: id.Spec.RepoRef.Name}, repo); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, conditions.Errorf(marketv1alpha1.ReasonNotFound, err, "AtprotoRepo %s not found in namespace %s", id.Spec.RepoRef.Name, id.Namespace)
		}
		return nil, err
	}
	if !meta.IsStatusConditionTrue(repo.Status.Conditions, atprotov1alpha1.ConditionReady) || repo.Status.DID == "" {
		msg := fmt.Sprintf("AtprotoRepo %s is not Ready", repo.Name)
		if cond := meta.FindStatusCondition(repo.Status.Conditions, atprotov1alpha1.ConditionReady); cond != nil {
			msg += ": " + cond.Reason
		}
		return nil, conditions.Errorf(marketv1alpha1.ReasonNotReady, nil, "%s", msg)
	}
	return repo, nil
}

// Identity returns the Ready MarketIdentity named in namespace, or a
// *conditions.Error (NotFound, NotReady).
func Identity(ctx context.Context, c client.Client, namespace, name string) (*marketv1alpha1.MarketIdentity, error) {
	id := &marketv1alpha1.MarketIdentity{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, id); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, conditions.Errorf(marketv1alpha1.ReasonNotFound, err, "MarketIdentity %s not found in namespace %s", name, namespace)
		}
		return nil, err
	}
	if !id.DeletionTimestamp.IsZero() {
		// Its finalizer deletes what was published in its repo.
		return nil, conditions.Errorf(marketv1alpha1.ReasonNotFound, nil, "MarketIdentity %s is being deleted", name)
	}
	ready := meta.FindStatusCondition(id.Status.Conditions, marketv1alpha1.ConditionReady)
	if ready == nil || ready.Status != metav1.ConditionTrue || ready.ObservedGeneration != id.Generation || id.Status.DID == "" {
		msg := fmt.Sprintf("MarketIdentity %s is not Ready", name)
		if cond := meta.FindStatusCondition(id.Status.Conditions, marketv1alpha1.ConditionReady); cond != nil {
			msg += ": " + cond.Reason
		}
		return nil, conditions.Errorf(marketv1alpha1.ReasonNotReady, nil, "%s", msg)
	}
	return id, nil
}

// IdentityRepo returns the Ready identity named in namespace and its Ready
// repo, once the identity has taken up that repo (their DIDs agree), or a
// *conditions.Error (NotFound, NotReady).
func IdentityRepo(ctx context.Context, c client.Client, namespace, name string) (*marketv1alpha1.MarketIdentity, *atprotov1alpha1.AtprotoRepo, error) {
	id, err := Identity(ctx, c, namespace, name)
	if err != nil {
		return nil, nil, err
	}
	repo, err := Repo(ctx, c, id)
	if err != nil {
		return nil, nil, err
	}
	if repo.Status.DID != id.Status.DID {
		return nil, nil, conditions.Errorf(marketv1alpha1.ReasonNotReady, nil, "MarketIdentity %s has not taken up AtprotoRepo %s yet", id.Name, repo.Name)
	}
	return id, repo, nil
}

// Publisher is a repo's PDS as the market controllers use it.
type Publisher interface {
	// Get reads a record; nil when it does not exist.
	Get(ctx context.Context, collection, rkey string) (*pds.Record, error)
	// ListRecords lists the repo's records of a collection.
	ListRecords(ctx context.Context, collection string, limit int) ([]pds.Record, error)
	// Publish makes the record collection/rkey equal value (nil: absent),
	// reading it back (pds.Client.Ensure). A value that does not match its
	// lexicon is a *conditions.Error with reason InvalidRecord and nothing
	// is written.
	Publish(ctx context.Context, collection, rkey string, value any) (*pds.EnsureResult, error)
	// ServiceAuth asks the repo's PDS for a service-auth token of its
	// account for the service aud and the method lxm, expiring at exp
	// (pds.Client.ServiceAuth).
	ServiceAuth(ctx context.Context, aud, lxm string, exp time.Time) (string, error)
}

// Client returns the Publisher of a repo, logged in through the pool.
func Client(ctx context.Context, pool *repoconn.Pool, c client.Client, cluster string, repo *atprotov1alpha1.AtprotoRepo) (Publisher, error) {
	if pc := pool.Get(cluster, repo); pc != nil {
		return publisher{pc}, nil
	}
	pc, err := pool.Connect(ctx, c, cluster, repo)
	if err != nil {
		return nil, repoconn.Classify(err)
	}
	return publisher{pc}, nil
}

type publisher struct{ c *pds.Client }

func (p publisher) Get(ctx context.Context, collection, rkey string) (*pds.Record, error) {
	rec, err := p.c.GetRecord(ctx, collection, rkey)
	if errors.Is(err, pds.ErrRecordNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, repoconn.Classify(err)
	}
	return rec, nil
}

func (p publisher) ListRecords(ctx context.Context, collection string, limit int) ([]pds.Record, error) {
	recs, err := p.c.ListRecords(ctx, collection, limit)
	if err != nil {
		return nil, repoconn.Classify(err)
	}
	return recs, nil
}

func (p publisher) Publish(ctx context.Context, collection, rkey string, value any) (*pds.EnsureResult, error) {
	raw, err := Encode(collection, value)
	if err != nil {
		return nil, err
	}
	res, err := p.c.Ensure(ctx, collection, rkey, raw)
	if err != nil {
		return nil, repoconn.Classify(err)
	}
	return res, nil
}

func (p publisher) ServiceAuth(ctx context.Context, aud, lxm string, exp time.Time) (string, error) {
	tok, err := p.c.ServiceAuth(ctx, aud, lxm, exp)
	if err != nil {
		return "", repoconn.Classify(err)
	}
	return tok, nil
}

// Encode marshals a record value and checks it against the collection's
// lexicon: a value that does not match is a *conditions.Error with reason
// InvalidRecord. A nil value (a deletion) is nil.
func Encode(collection string, value any) (json.RawMessage, error) {
	if value == nil {
		return nil, nil
	}
	b, err := json.Marshal(value)
	if err != nil {
		return nil, err
	}
	if err := lexicon.ValidateRecord(collection, b); err != nil {
		return nil, conditions.Errorf(marketv1alpha1.ReasonInvalidRecord, err, "%v; nothing was written", err)
	}
	return b, nil
}

// Association is the content of a dev.knotless.market.association record.
type Association struct {
	Type      string   `json:"$type"`
	Subject   string   `json:"subject"`
	Roles     []string `json:"roles"`
	CreatedAt string   `json:"createdAt"`
}

// DecodeAssociation validates a record read from a firehose against the
// association lexicon and decodes it. An invalid record is a *lexicon.Error.
func DecodeAssociation(value json.RawMessage) (*Association, error) {
	if err := lexicon.ValidateRecord(lexicon.Association, value); err != nil {
		return nil, err
	}
	var a Association
	if err := json.Unmarshal(value, &a); err != nil {
		return nil, &lexicon.Error{Collection: lexicon.Association, Reason: err.Error()}
	}
	return &a, nil
}

// ErrInvalid reports whether err is a record that did not match its
// lexicon.
func ErrInvalid(err error) bool {
	var le *lexicon.Error
	return errors.As(err, &le)
}

// Presence is the content of a dev.knotless.market.presence record.
type Presence struct {
	Type              string          `json:"$type"`
	Offers            []PresenceOffer `json:"offers"`
	Driver            string          `json:"driver"`
	AcceptingRequests bool            `json:"acceptingRequests"`
	Network           string          `json:"network,omitempty"`
	UpdatedAt         string          `json:"updatedAt"`
	CreatedAt         string          `json:"createdAt"`
}

// PresenceOffer is one offer of a presence record (defs#offer).
type PresenceOffer struct {
	Shape        Shape `json:"shape"`
	PricePerHour Price `json:"pricePerHour"`
	Capacity     int64 `json:"capacity"`
	Free         int64 `json:"free"`
}

// Shape is defs#shape.
type Shape struct {
	Name      string `json:"name,omitempty"`
	CPUMillis int64  `json:"cpuMillis"`
	MemoryMiB int64  `json:"memoryMiB"`
}

// Price is defs#price: an integer amount per hour.
type Price struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// PresenceOf is the presence record of a MarketPresence spec, with the
// given timestamps.
func PresenceOf(spec *marketv1alpha1.MarketPresenceSpec, createdAt, updatedAt time.Time) *Presence {
	p := &Presence{
		Type:              lexicon.Presence,
		Offers:            make([]PresenceOffer, 0, len(spec.Offers)),
		Driver:            string(spec.Driver),
		AcceptingRequests: spec.AcceptingRequests,
		Network:           spec.Network,
		CreatedAt:         createdAt.UTC().Format(time.RFC3339),
		UpdatedAt:         updatedAt.UTC().Format(time.RFC3339),
	}
	for _, o := range spec.Offers {
		p.Offers = append(p.Offers, PresenceOffer{
			Shape:        Shape{Name: o.Name, CPUMillis: o.CPUMillis, MemoryMiB: o.MemoryMiB},
			PricePerHour: Price{Amount: o.PricePerHour.Amount, Currency: o.PricePerHour.Currency},
			Capacity:     int64(o.Capacity),
			Free:         int64(o.Free),
		})
	}
	return p
}
