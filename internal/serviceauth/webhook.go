package serviceauth

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
)

// WebhookPath is where a tenant's TokenReviews are posted: the path ends
// with the VM's ID, which the agent wrote into the tenant's webhook
// configuration, so that the agent knows the tenant's audience.
const WebhookPath = "/tokenreview/"

// maxReview bounds a TokenReview's body: a token and a few fields.
const maxReview = 16 << 10

// Webhook serves Kubernetes webhook token authentication (TokenReview
// v1) for tenants: a token is authenticated when the Validator validates
// it for the audience of the VM the path names and one of the DIDs that
// VM lets in (Tenant returns no audience for a VM the agent does not
// know, and every token is refused). The user is the issuer's DID (name
// and UID), or MountUser of it for a MountMethod token, with no group
// and no extra. A DID the VM does not name is
// not authenticated at all: a tenant apiserver gives every authenticated
// user something (kcp: system:authenticated may list workspaces and make
// a home workspace). A refusal says only "invalid token": why is logged.
type Webhook struct {
	Validator *Validator
	Tenant    func(ctx context.Context, vmID string) (audience string, dids []string, err error)
	Log       logr.Logger
}

func (h *Webhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	vmID, ok := strings.CutPrefix(r.URL.Path, WebhookPath)
	if r.Method != http.MethodPost || !ok || vmID == "" || strings.Contains(vmID, "/") {
		http.NotFound(w, r)
		return
	}
	var review authenticationv1.TokenReview
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxReview))
	if err == nil {
		err = json.Unmarshal(body, &review)
	}
	if err != nil {
		http.Error(w, "not a TokenReview", http.StatusBadRequest)
		return
	}
	out := authenticationv1.TokenReview{TypeMeta: review.TypeMeta}
	if out.APIVersion == "" {
		out.APIVersion, out.Kind = authenticationv1.SchemeGroupVersion.String(), "TokenReview"
	}
	user, err := h.review(r.Context(), vmID, review.Spec.Token)
	if err != nil {
		h.Log.V(1).Info("token refused", "vm", vmID, "reason", err.Error())
		out.Status.Error = "invalid token"
	} else {
		out.Status.Authenticated = true
		out.Status.User = authenticationv1.UserInfo{Username: user, UID: user}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func (h *Webhook) review(ctx context.Context, vmID, token string) (string, error) {
	aud, dids, err := h.Tenant(ctx, vmID)
	if err != nil {
		return "", err
	}
	if aud == "" {
		return "", errors.New("no tenant with a service identity has this ID")
	}
	did, lxm, err := h.Validator.Validate(ctx, token, aud, dids)
	if err != nil {
		return "", err
	}
	return User(string(did), lxm), nil
}

// Grants are the DIDs each tenant's RBAC names, by VM ID (the agent
// refreshes them while the VM runs): a tenant lets them in beside its
// admin DIDs. It is safe for concurrent use.
type Grants struct {
	mu sync.RWMutex
	m  map[string][]string
}

// Set records the DIDs the tenant of the VM id names.
func (g *Grants) Set(id string, dids []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = map[string][]string{}
	}
	g.m[id] = slices.Clone(dids)
}

// Get returns the DIDs the tenant of the VM id names.
func (g *Grants) Get(id string) []string {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.m[id]
}

// Delete forgets the VM id.
func (g *Grants) Delete(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.m, id)
}
