// Package repoconn turns an AtprotoRepo into a logged-in PDS client. It
// checks the PDS URL first (https, or plain http to a host the operator
// allowed: R19) so that no credential is read for a refused URL, resolves
// the repo's typed references (CA bundle, credential in a Secret of the
// same workspace and namespace or in Vault under the prefix of that
// workspace and namespace), connects through the address policy (R18),
// requires the account's DID document to name the repo's PDS (R20), keeps
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
	"sync/atomic"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/keyref"
	"github.com/knotless-dev/knotless/internal/names"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/vault"
)

// SessionKey is the key of the session in its Secret.
const SessionKey = "session.json"

// SessionSecretName is the name of the Secret that keeps a repo's session.
func SessionSecretName(repo string) string { return "atproto-session-" + repo }

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
	// Directory resolves the DID documents of the repos' accounts: a
	// connection counts only if the document names the repo's PDS and the
	// session's handle (R20; pds.NewDirectory). Required.
	Directory identity.Directory
	// WriteLatency is pds.Options.WriteLatency of every client.
	WriteLatency *prometheus.HistogramVec

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
// A failure the repo's condition reports (a reference that does not
// resolve, a refused URL or login) is a *conditions.Error carrying its
// reason; other errors (failed reads) are returned as they are.
func (p *Pool) Connect(ctx context.Context, c client.Client, cluster string, repo *atprotov1alpha1.AtprotoRepo) (*pds.Client, error) {
	if err := pds.CheckURL(repo.Spec.PDS.URL, p.Policy); err != nil {
		if errors.Is(err, pds.ErrInsecureURL) {
			return nil, Classify(err)
		}
		return nil, conditions.Errorf(atprotov1alpha1.ReasonInvalidSpec, err, "spec.pds.url: %v", err)
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
		return nil, conditions.Errorf(atprotov1alpha1.ReasonCABundleNotFound, err, "CA bundle of the PDS: %v", err)
	}
	if p.Directory == nil {
		return nil, errors.New("repoconn: the pool has no DID directory")
	}
	store := &secretStore{c: c, repo: repo}
	var private atomic.Bool
	pc, err := pds.Connect(netpolicy.TracePrivate(ctx, &private), repo.Spec.PDS.URL, repo.Spec.Credential.Identifier, password, pds.Options{
		HTTPClient: hc, Policy: p.Policy, Store: store, Directory: p.Directory, UserAgent: "knotless", MaxBatch: p.MaxBatch, WriteLatency: p.WriteLatency,
	})
	if err != nil && private.Load() && !pdsAnswer(err) {
		// A PDS at an address the operator allowed: a closed port, a
		// silent host, a bad certificate and any answer but a PDS's own
		// (any status, a redirect, a body that is no session) read alike
		// (R17), the cause is in the provider's log.
		log.FromContext(ctx).Info("PDS at a private address unreachable", "url", repo.Spec.PDS.URL, "error", err.Error())
		return nil, conditions.Errorf(atprotov1alpha1.ReasonPDSUnreachable, err, "%s", privateUnreachable)
	}
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

// pdsAnswer says whether a failed Connect to a PDS at a private address
// may say why: the address policy refused it, or only a PDS could have
// answered so (it refused the credential with an XRPC authentication
// error, or its session's account fails the DID document checks, which
// come after a session). Anything else an arbitrary server there might
// answer (a status, a redirect, a body that is no session) or do (refuse,
// stay silent, show another certificate) is one message, so AtprotoRepos
// cannot scan the operator's networks (R17).
func pdsAnswer(err error) bool {
	switch {
	case errors.Is(err, netpolicy.ErrDenied), errors.Is(err, pds.ErrInsecureURL):
		return true
	case errors.Is(err, pds.ErrNotAPDSRefusal):
		return false
	}
	return errors.Is(err, pds.ErrAuthentication) || errors.Is(err, pds.ErrDIDMismatch) || errors.Is(err, pds.ErrDIDUnresolvable)
}

// privateUnreachable is the message of every PDSUnreachable of a PDS at a
// loopback, private or shared address (see Connect).
const privateUnreachable = "the PDS could not be reached over a verified connection, or did not answer as a PDS (the provider's log says why)"

// Classify wraps an error of a PDS call in a *conditions.Error carrying
// its condition reason (AuthenticationFailed, InsecureURL, AddressNotAllowed,
// PDSRedirected, PDSUnreachable, RateLimited, DIDMismatch, DIDUnresolvable,
// ResponseTooLarge); other errors are returned as they are. Messages about
// DID documents never name the PLC directory (operator configuration).
func Classify(err error) error {
	var rl *pds.RateLimitedError
	switch {
	case errors.Is(err, pds.ErrDIDMismatch):
		return conditions.Errorf(atprotov1alpha1.ReasonDIDMismatch, err, "%v", err)
	case errors.Is(err, pds.ErrDIDUnresolvable) && errors.Is(err, pds.ErrResponseTooLarge):
		return conditions.Errorf(atprotov1alpha1.ReasonResponseTooLarge, err, "the account's DID document is larger than %d KiB", pds.MaxDIDDocument>>10)
	case errors.Is(err, pds.ErrDIDUnresolvable):
		return conditions.Errorf(atprotov1alpha1.ReasonDIDUnresolvable, err, "%s", pds.ErrDIDUnresolvable)
	case errors.Is(err, pds.ErrResponseTooLarge):
		return conditions.Errorf(atprotov1alpha1.ReasonResponseTooLarge, err, "%v", err)
	case errors.Is(err, pds.ErrAuthentication):
		return conditions.Errorf(atprotov1alpha1.ReasonAuthenticationFailed, err, "the PDS refused the credential: %v", err)
	case errors.Is(err, pds.ErrInsecureURL):
		return conditions.Errorf(atprotov1alpha1.ReasonInsecureURL, err, "spec.pds.url: %v", err)
	case errors.Is(err, netpolicy.ErrDenied):
		return conditions.Errorf(atprotov1alpha1.ReasonAddressNotAllowed, err, "the PDS's address may not be reached from knotless: %v", err)
	case errors.Is(err, pds.ErrRedirect):
		return conditions.Errorf(atprotov1alpha1.ReasonPDSRedirected, err, "%v", err)
	case errors.Is(err, pds.ErrUnreachable):
		return conditions.Errorf(atprotov1alpha1.ReasonPDSUnreachable, err, "the PDS is unreachable: %v", err)
	case errors.As(err, &rl):
		return conditions.Errorf(atprotov1alpha1.ReasonRateLimited, err, "the PDS rate-limits this account until %s", rl.Reset.Format(time.RFC3339))
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
		ref := cred.SecretKeyRef
		v, err := keyref.Value(ctx, c, keyref.Ref{Kind: "Secret", Namespace: repo.Namespace, Name: ref.Name, Key: ref.Key, SameNamespace: true},
			atprotov1alpha1.ReasonCredentialNotFound)
		return string(v), err
	case cred.Vault != nil:
		if p.Vault == nil {
			return "", conditions.Errorf(atprotov1alpha1.ReasonVaultUnavailable, vault.ErrDisabled, "the provider has no Vault connection (--vault-address)")
		}
		ref := cred.Vault
		v, err := p.Vault.ReadKV(ctx, cluster, repo.Namespace, vault.KVRef{Mount: ref.Mount, Path: ref.Path, Key: ref.Key})
		switch {
		case err == nil:
			return v, nil
		case errors.Is(err, vault.ErrForbiddenPath), errors.Is(err, vault.ErrNotFound), errors.Is(err, vault.ErrInvalidValue):
			return "", conditions.Errorf(atprotov1alpha1.ReasonCredentialNotFound, err, "%v", err)
		default:
			return "", conditions.Errorf(atprotov1alpha1.ReasonVaultUnavailable, err, "reading the credential from Vault: %v", err)
		}
	}
	return "", conditions.Errorf(atprotov1alpha1.ReasonInvalidSpec, nil, "spec.credential sets neither secretKeyRef nor vault")
}

// caBundle reads the repo's CA bundle; nil when it names none.
func caBundle(ctx context.Context, c client.Client, repo *atprotov1alpha1.AtprotoRepo) ([]byte, error) {
	ref := repo.Spec.PDS.CABundle
	if ref == nil {
		return nil, nil
	}
	return keyref.Value(ctx, c, keyref.Ref{Kind: ref.Kind, Namespace: repo.Namespace, Name: ref.Name, Key: ref.Key, SameNamespace: true},
		atprotov1alpha1.ReasonCABundleNotFound)
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
	sec := corev1ac.Secret(SessionSecretName(s.repo.Name), s.repo.Namespace).
		WithOwnerReferences(metav1ac.OwnerReference().
			WithAPIVersion(atprotov1alpha1.GroupVersion.String()).WithKind("AtprotoRepo").
			WithName(s.repo.Name).WithUID(s.repo.UID).
			WithController(true).WithBlockOwnerDeletion(true)).
		WithType(corev1.SecretTypeOpaque).
		WithData(map[string][]byte{SessionKey: raw})
	if err := s.c.Apply(ctx, sec, client.FieldOwner(names.AtprotoRepoManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("saving the ATProto session: %w", err)
	}
	return nil
}
