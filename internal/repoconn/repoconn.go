// Package repoconn turns an AtprotoRepo into a logged-in PDS client. It
// checks the PDS URL first (https, or plain http to a host the operator
// allowed: R19) so that no credential is read for a refused URL, resolves
// the repo's typed references (CA bundle, credential in a Secret of the
// same workspace and namespace or in Vault under the prefix of that
// workspace and namespace), connects through the address policy (R18), keeps
// the session in a Secret owned by the repo so restarts do not log in
// again, and caches one client per repo until its inputs change. The repo
// and record controllers share one Pool.
package repoconn

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/vault"
)

// FieldManager writes the session Secrets.
const FieldManager = "knotless-atprotorepo"

// SessionKey is the key of the session in its Secret.
const SessionKey = "session.json"

// SessionSecretName is the name of the Secret that keeps a repo's session.
func SessionSecretName(repo string) string { return "atproto-session-" + repo }

// Error is a resolution failure with the condition reason it maps to.
type Error struct {
	Reason  string
	Message string
	Err     error
}

func (e *Error) Error() string { return e.Message }
func (e *Error) Unwrap() error { return e.Err }

func fail(reason string, err error, format string, args ...any) *Error {
	return &Error{Reason: reason, Message: fmt.Sprintf(format, args...), Err: err}
}

// Pool caches one PDS client per repo.
type Pool struct {
	// Vault reads credentials that reference Vault; nil when the provider
	// has no Vault connection.
	Vault *vault.Client
	// Timeout of every PDS request. Zero means 20s.
	Timeout time.Duration
	// MaxBatch is pds.Options.MaxBatch of every client.
	MaxBatch int
	// Policy is the address policy every PDS connection passes (R18); it
	// also decides which hosts may be reached over plain http (R19).
	Policy *netpolicy.Policy

	mu    sync.Mutex
	conns map[key]*entry
}

type key struct {
	cluster string
	uid     types.UID
}

type entry struct {
	fingerprint string
	client      *pds.Client
}

// Get returns the cached client of a repo, or nil when the repo has not
// been connected since its inputs last changed.
func (p *Pool) Get(cluster string, repo *atprotov1alpha1.AtprotoRepo) *pds.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.conns[key{cluster, repo.UID}]; ok {
		return e.client
	}
	return nil
}

// Forget drops the client of a repo.
func (p *Pool) Forget(cluster string, uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, key{cluster, uid})
}

// Connect resolves the repo's references and returns a logged-in client,
// reusing the cached one when nothing changed. cluster is the logical
// cluster name of the repo's workspace; c is a client of that workspace.
func (p *Pool) Connect(ctx context.Context, c client.Client, cluster string, repo *atprotov1alpha1.AtprotoRepo) (*pds.Client, error) {
	if err := pds.CheckURL(repo.Spec.PDS.URL, p.Policy); err != nil {
		if errors.Is(err, pds.ErrInsecureURL) {
			return nil, Classify(err)
		}
		return nil, fail(atprotov1alpha1.ReasonInvalidSpec, err, "spec.pds.url: %v", err)
	}
	password, err := p.password(ctx, c, cluster, repo)
	if err != nil {
		return nil, err
	}
	caPEM, err := caBundle(ctx, c, repo)
	if err != nil {
		return nil, err
	}
	sum := sha256.New()
	for _, part := range [][]byte{[]byte(repo.Spec.PDS.URL), []byte(repo.Spec.Credential.Identifier), []byte(password), caPEM} {
		sum.Write(part)
		sum.Write([]byte{0})
	}
	fp := hex.EncodeToString(sum.Sum(nil))
	k := key{cluster, repo.UID}
	p.mu.Lock()
	if e, ok := p.conns[k]; ok && e.fingerprint == fp {
		p.mu.Unlock()
		return e.client, nil
	}
	p.mu.Unlock()

	hc, err := p.httpClient(caPEM)
	if err != nil {
		return nil, fail(atprotov1alpha1.ReasonCABundleNotFound, err, "CA bundle of the PDS: %v", err)
	}
	store := &secretStore{c: c, repo: repo}
	pc, err := pds.Connect(ctx, repo.Spec.PDS.URL, repo.Spec.Credential.Identifier, password, pds.Options{HTTPClient: hc, Policy: p.Policy, Store: store, UserAgent: "knotless", MaxBatch: p.MaxBatch})
	if err != nil {
		return nil, Classify(err)
	}
	p.mu.Lock()
	if p.conns == nil {
		p.conns = map[key]*entry{}
	}
	p.conns[k] = &entry{fingerprint: fp, client: pc}
	p.mu.Unlock()
	return pc, nil
}

// Classify wraps an error of a PDS call in an *Error carrying its condition
// reason (AuthenticationFailed, InsecureURL, AddressNotAllowed,
// PDSRedirected, PDSUnreachable, RateLimited); other errors are returned
// as they are.
func Classify(err error) error {
	var rl *pds.RateLimitedError
	switch {
	case errors.Is(err, pds.ErrAuthentication):
		return fail(atprotov1alpha1.ReasonAuthenticationFailed, err, "the PDS refused the credential: %v", err)
	case errors.Is(err, pds.ErrInsecureURL):
		return fail(atprotov1alpha1.ReasonInsecureURL, err, "spec.pds.url: %v", err)
	case errors.Is(err, netpolicy.ErrDenied):
		return fail(atprotov1alpha1.ReasonAddressNotAllowed, err, "the PDS's address may not be reached from knotless: %v", err)
	case errors.Is(err, pds.ErrRedirect):
		return fail(atprotov1alpha1.ReasonPDSRedirected, err, "%v", err)
	case errors.Is(err, pds.ErrUnreachable):
		return fail(atprotov1alpha1.ReasonPDSUnreachable, err, "the PDS is unreachable: %v", err)
	case errors.As(err, &rl):
		return fail(atprotov1alpha1.ReasonRateLimited, err, "the PDS rate-limits this account until %s", rl.Reset.Format(time.RFC3339))
	}
	return err
}

// httpClient is a PDS client (pds.NewHTTPClient) through the pool's
// address policy that trusts caPEM, or the system roots when it is empty.
func (p *Pool) httpClient(caPEM []byte) (*http.Client, error) {
	var roots *x509.CertPool
	if len(caPEM) > 0 {
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(caPEM) {
			return nil, errors.New("no PEM certificate in the CA bundle")
		}
	}
	return pds.NewHTTPClient(p.Policy, roots, cmp.Or(p.Timeout, 20*time.Second)), nil
}

// password reads the app password from the repo's credential reference.
// Secrets are read from the repo's own workspace and namespace only; Vault
// paths only under <prefix>/<logical cluster>/<namespace>/ (the vault
// package refuses others before any request).
func (p *Pool) password(ctx context.Context, c client.Client, cluster string, repo *atprotov1alpha1.AtprotoRepo) (string, error) {
	cred := repo.Spec.Credential
	switch {
	case cred.SecretKeyRef != nil:
		s := &corev1.Secret{}
		ref := cred.SecretKeyRef
		if err := c.Get(ctx, client.ObjectKey{Namespace: repo.Namespace, Name: ref.Name}, s); err != nil {
			if apierrors.IsNotFound(err) {
				return "", fail(atprotov1alpha1.ReasonCredentialNotFound, err, "Secret %s not found in this workspace and namespace", ref.Name)
			}
			return "", err
		}
		v, ok := s.Data[ref.Key]
		if !ok || len(v) == 0 {
			return "", fail(atprotov1alpha1.ReasonCredentialNotFound, nil, "Secret %s has no key %q", ref.Name, ref.Key)
		}
		return string(v), nil
	case cred.Vault != nil:
		if p.Vault == nil {
			return "", fail(atprotov1alpha1.ReasonVaultUnavailable, vault.ErrDisabled, "the provider has no Vault connection (--vault-address)")
		}
		ref := cred.Vault
		v, err := p.Vault.ReadKV(ctx, cluster, repo.Namespace, vault.KVRef{Mount: ref.Mount, Path: ref.Path, Key: ref.Key})
		switch {
		case err == nil:
			return v, nil
		case errors.Is(err, vault.ErrForbiddenPath), errors.Is(err, vault.ErrNotFound), errors.Is(err, vault.ErrInvalidValue):
			return "", fail(atprotov1alpha1.ReasonCredentialNotFound, err, "%v", err)
		default:
			return "", fail(atprotov1alpha1.ReasonVaultUnavailable, err, "reading the credential from Vault: %v", err)
		}
	}
	return "", fail(atprotov1alpha1.ReasonInvalidSpec, nil, "spec.credential sets neither secretKeyRef nor vault")
}

func caBundle(ctx context.Context, c client.Client, repo *atprotov1alpha1.AtprotoRepo) ([]byte, error) {
	ref := repo.Spec.PDS.CABundle
	if ref == nil {
		return nil, nil
	}
	key := client.ObjectKey{Namespace: repo.Namespace, Name: ref.Name}
	var data []byte
	var found bool
	switch ref.Kind {
	case "ConfigMap":
		cm := &corev1.ConfigMap{}
		if err := c.Get(ctx, key, cm); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, fail(atprotov1alpha1.ReasonCABundleNotFound, err, "ConfigMap %s not found in this workspace and namespace", ref.Name)
			}
			return nil, err
		}
		var s string
		s, found = cm.Data[ref.Key]
		data = []byte(s)
	case "Secret":
		s := &corev1.Secret{}
		if err := c.Get(ctx, key, s); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, fail(atprotov1alpha1.ReasonCABundleNotFound, err, "Secret %s not found in this workspace and namespace", ref.Name)
			}
			return nil, err
		}
		data, found = s.Data[ref.Key]
	default:
		return nil, fail(atprotov1alpha1.ReasonInvalidSpec, nil, "spec.pds.caBundle.kind %q is neither ConfigMap nor Secret", ref.Kind)
	}
	if !found || len(data) == 0 {
		return nil, fail(atprotov1alpha1.ReasonCABundleNotFound, nil, "%s %s has no key %q", ref.Kind, ref.Name, ref.Key)
	}
	return data, nil
}

// secretStore keeps a repo's session in a Secret owned by the repo.
type secretStore struct {
	c    client.Client
	repo *atprotov1alpha1.AtprotoRepo
}

func (s *secretStore) Load(ctx context.Context) (*pds.Session, error) {
	sec := &corev1.Secret{}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.repo.Namespace, Name: SessionSecretName(s.repo.Name)}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	raw, ok := sec.Data[SessionKey]
	if !ok {
		return nil, nil
	}
	sess := &pds.Session{}
	if err := json.Unmarshal(raw, sess); err != nil {
		return nil, nil // a corrupt session is replaced by a new login
	}
	return sess, nil
}

func (s *secretStore) Save(ctx context.Context, sess *pds.Session) error {
	raw, err := json.Marshal(sess)
	if err != nil {
		return err
	}
	sec := &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      SessionSecretName(s.repo.Name),
			Namespace: s.repo.Namespace,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: atprotov1alpha1.GroupVersion.String(), Kind: "AtprotoRepo",
				Name: s.repo.Name, UID: s.repo.UID, Controller: ptrTrue(), BlockOwnerDeletion: ptrTrue(),
			}},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{SessionKey: raw},
	}
	//nolint:staticcheck // SSA of a typed object.
	if err := s.c.Patch(ctx, sec, client.Apply, client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("saving the ATProto session: %w", err)
	}
	return nil
}

func ptrTrue() *bool { t := true; return &t }
