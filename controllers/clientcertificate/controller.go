// Package clientcertificate reconciles ClusterClientCertificates: client
// certificates for the apiserver of a requester's own tenant, issued by
// the tenant's CA through its certificates API and kept, with their key,
// in a Secret of the requester's workspace.
//
// The requester's side reaches the tenant as the requester's DID (the
// tenant's admin), with what the market requester controller published
// for the contract (tenantreach.Registry): the endpoint and CA bundle the
// bidder's signed lease gives and service-auth tokens of the requester's
// repo. Nothing comes from the bidder's workspace.
//
// It is the only writer of ClusterClientCertificate status and of the
// Secrets it owns.
package clientcertificate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	identityv1alpha1 "github.com/knotless-dev/knotless/apis/identity/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clock"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/engage"
	"github.com/knotless-dev/knotless/internal/finalize"
	"github.com/knotless-dev/knotless/internal/mapping"
	"github.com/knotless-dev/knotless/internal/predicates"
	"github.com/knotless-dev/knotless/internal/ssa"
	"github.com/knotless-dev/knotless/internal/tenantreach"
)

const (
	// Name is the controller's name.
	Name = "clientcertificate"
	// FieldManager owns ClusterClientCertificate status and finalizer.
	FieldManager = "knotless-clientcertificate"
	// Finalizer removes the certificate's binding on the tenant.
	Finalizer = "identity.knotless.dev/client-certificate"

	byContract = "identity.knotless.dev/contract"
)

// Waits of the controller.
const (
	// tenantWait is how often a certificate whose tenant is not reachable
	// yet is looked at again (the contract's changes also wake it).
	tenantWait = 15 * time.Second
	// refusedWait is the first wait after the tenant refused, doubling up
	// to maxWait; an Unsupported tenant is asked again after maxWait.
	refusedWait = 30 * time.Second
	maxWait     = 10 * time.Minute
	// tokenLife is the life of the token one issue uses.
	tokenLife = 5 * time.Minute
	// deadline bounds one issue (a token, the request, its signature).
	deadline = 25 * time.Second
)

// Reconciler reconciles ClusterClientCertificates in every engaged
// workspace.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
	Scheme     *runtime.Scheme
	// Reaches is where the market requester controller publishes how each
	// mounted contract's tenant is reached.
	Reaches *tenantreach.Registry
	// SignWait bounds the wait for the tenant's signature (default 15s).
	SignWait time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time

	// fails counts each certificate's failed issues in a row, issued is
	// its last issue (failure and lastIssue by UID).
	fails, issued sync.Map
}

// SetupWithManager registers the controller and the index of certificates
// by contract.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr mcmanager.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &identityv1alpha1.ClusterClientCertificate{}, byContract, func(o client.Object) []string {
		return []string{o.(*identityv1alpha1.ClusterClientCertificate).Spec.ContractRef.Name}
	}); err != nil {
		return err
	}
	return engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&identityv1alpha1.ClusterClientCertificate{}, predicates.SpecOrLifecycleChanged()).
		Owns(&corev1.Secret{}).
		Watches(&marketv1alpha1.ComputeContract{}, mapping.ByIndex(func() client.ObjectList { return &identityv1alpha1.ClusterClientCertificateList{} }, byContract,
			func(o client.Object) string { return o.GetName() }), predicates.PhaseChanged()).
		WithOptions(controller.TypedOptions[mcreconcile.Request]{
			MaxConcurrentReconciles: 4,
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[mcreconcile.Request](time.Second, 5*time.Minute),
			ReconciliationTimeout:   time.Minute,
		}).
		Complete(r)
}

// Reconcile implements mcreconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	cl, err := r.GetCluster(ctx, req.ClusterName)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("getting workspace %s: %w", req.ClusterName, err)
	}
	s := &syncer{r: r, ctx: ctx, c: cl.GetClient(), lc: string(req.ClusterName), events: cl.GetEventRecorder(Name), now: clock.Now(r.Now)}
	s.ccert = &identityv1alpha1.ClusterClientCertificate{}
	if err := s.c.Get(ctx, req.NamespacedName, s.ccert); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	s.st = s.ccert.Status.DeepCopy()
	s.st.ObservedGeneration = s.ccert.Generation
	if !s.ccert.DeletionTimestamp.IsZero() {
		return s.finalize()
	}
	res, err := s.sync()
	if werr := s.writeStatus(); werr != nil {
		return reconcile.Result{}, werr
	}
	return res, err
}

// syncer is one reconcile of one ClusterClientCertificate.
type syncer struct {
	r      *Reconciler
	ctx    context.Context
	c      client.Client
	lc     string
	events events.EventRecorder
	now    time.Time
	ccert  *identityv1alpha1.ClusterClientCertificate
	st     *identityv1alpha1.ClusterClientCertificateStatus
}

// ready sets the Ready condition.
func (s *syncer) ready(status metav1.ConditionStatus, reason, msg string) {
	conditions.SetReady(&s.st.Conditions, s.ccert.Generation, status, reason, msg)
}

func (s *syncer) writeStatus() error {
	return ssa.WriteStatus(s.ctx, s.c, s.ccert, &s.ccert.Status, s.st, ssa.StatusOptions{
		Manager: FieldManager, Event: ssa.ConditionChanged(s.ccert.Status.Conditions, s.st.Conditions, identityv1alpha1.ConditionReady),
		Recorder: s.events, Action: "Issue",
	})
}

// sync issues the certificate when the Secret does not hold a current
// one for the spec, and says when to look again.
func (s *syncer) sync() (reconcile.Result, error) {
	w, err := check(s.ccert.Spec)
	if err != nil {
		s.ready(metav1.ConditionFalse, identityv1alpha1.ReasonInvalidSpec, err.Error())
		return reconcile.Result{}, nil
	}
	if !controllerutil.ContainsFinalizer(s.ccert, Finalizer) {
		if err := ssa.Metadata(s.ctx, s.c, s.ccert, []string{Finalizer}, nil, FieldManager); err != nil {
			return reconcile.Result{}, err
		}
	}
	sec, err := s.secret()
	if err != nil {
		return reconcile.Result{}, err
	}
	if sec != nil && !metav1.IsControlledBy(sec, s.ccert) {
		s.ready(metav1.ConditionFalse, identityv1alpha1.ReasonSecretNameTaken,
			fmt.Sprintf("Secret %s exists and was not made for this ClusterClientCertificate; it is not overwritten: name another spec.secretName or delete it", w.SecretName))
		return reconcile.Result{}, nil
	}
	t, err := s.tenant(w)
	if err != nil {
		return reconcile.Result{}, err
	}
	if t.CC != nil && w.User == t.CC.Spec.RequesterDID {
		s.ready(metav1.ConditionFalse, identityv1alpha1.ReasonInvalidSpec, fmt.Sprintf("spec.user %q is the requester's DID, the tenant's admin for the contract's whole life: a certificate for it could not be taken back", w.User))
		return reconcile.Result{}, nil
	}
	if last, ok := s.current(w, t, sec); ok {
		s.ready(metav1.ConditionTrue, identityv1alpha1.ReasonIssued, issuedMessage(w, last.notAfter))
		return reconcile.Result{RequeueAfter: last.renewal.Sub(s.now)}, nil
	}
	if t.Why != "" {
		s.ready(metav1.ConditionFalse, identityv1alpha1.ReasonTenantNotReady, t.Why)
		return reconcile.Result{RequeueAfter: tenantWait}, nil
	}
	if wait := s.wait(); wait > 0 {
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	return s.issue(w, t, sec)
}

func issuedMessage(w wanted, notAfter time.Time) string {
	return fmt.Sprintf("Secret %s holds a certificate for %s valid until %s", w.SecretName, w.User, notAfter.UTC().Format(time.RFC3339))
}

// lastIssue is what this provider last issued for a certificate (by UID):
// it is read ahead of the status, which the cache may not show yet when
// the Secret's own change brings the certificate back.
type lastIssue struct {
	key                   string
	at, renewal, notAfter time.Time
}

// current returns the issue the Secret holds when it is current: it holds
// what was issued for this spec and contract (status.issued, or the last
// issue in memory), for the tenant's CA when the tenant is reached, and
// its renewal time has not come. A contract that is gone has no current
// certificate.
func (s *syncer) current(w wanted, t tenantreach.Contract, sec *corev1.Secret) (lastIssue, bool) {
	if sec == nil || t.CC == nil || t.Gone || t.Mounted && !bytes.Equal(sec.Data[KeyCA], t.Reach.Tenant.CA) {
		return lastIssue{}, false
	}
	key := dataKey(w, t.CC.UID, sec.Data)
	last := lastIssue{key: s.st.Issued}
	if v, ok := s.r.issued.Load(s.ccert.UID); ok && v.(lastIssue).key == key {
		last = v.(lastIssue)
	} else if cert := leaf(sec.Data[corev1.TLSCertKey]); cert != nil && s.st.RenewalTime != nil {
		// The status is the members' to write: the certificate in the
		// Secret bounds when it is renewed.
		last.notAfter = cert.NotAfter
		last.renewal = minTime(s.st.RenewalTime.Time, cert.NotAfter.Add(-w.renewBefore))
	}
	return last, last.key == key && s.now.Before(last.renewal)
}

// secret returns the Secret of spec.secretName, nil if there is none.
func (s *syncer) secret() (*corev1.Secret, error) {
	sec := &corev1.Secret{}
	err := s.c.Get(s.ctx, client.ObjectKey{Namespace: s.ccert.Namespace, Name: s.ccert.Spec.SecretName}, sec)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return sec, err
}

// tenant returns the tenant of the certificate's contract.
func (s *syncer) tenant(w wanted) (tenantreach.Contract, error) {
	return s.r.Reaches.Lookup(s.ctx, s.c, s.lc, s.ccert.Namespace, w.ContractRef.Name)
}

// wait returns how long is left before the certificate may be issued
// again (0: none): minValid after the last issue, whatever brought it
// back (its own Secret's change, an edit), and the backoff after a
// failure.
func (s *syncer) wait() time.Duration {
	var wait time.Duration
	if v, ok := s.r.issued.Load(s.ccert.UID); ok {
		wait = v.(lastIssue).at.Add(minValid).Sub(s.now)
	}
	if v, ok := s.r.fails.Load(s.ccert.UID); ok {
		wait = max(wait, v.(failure).next.Sub(s.now))
	}
	return max(wait, 0)
}

// failure is a certificate's failed issues in a row and when to try next.
type failure struct {
	n    int
	next time.Time
}

// failed records a failed issue and says when to try again: after maxWait
// for an Unsupported tenant, else refusedWait doubling up to maxWait.
func (s *syncer) failed(unsupported bool) reconcile.Result {
	n := 0
	if v, ok := s.r.fails.Load(s.ccert.UID); ok {
		n = v.(failure).n
	}
	wait := min(refusedWait<<min(n, 5), maxWait)
	if unsupported {
		wait = maxWait
	}
	s.r.fails.Store(s.ccert.UID, failure{n: n + 1, next: s.now.Add(wait)})
	return reconcile.Result{RequeueAfter: wait}
}

// issue has the tenant issue a new certificate, binds spec.clusterRole
// to spec.user there, and writes the certificate into the Secret and the
// status.
func (s *syncer) issue(w wanted, t tenantreach.Contract, sec *corev1.Secret) (reconcile.Result, error) {
	ctx, cancel := context.WithTimeout(s.ctx, deadline)
	defer cancel()
	cs, err := s.tenantClient(ctx, t.Reach)
	var is *issued
	if err == nil {
		// The binding follows the certificate: a tenant that signs none
		// gets none.
		if is, err = issue(ctx, cs, s.ccert, w, s.now, s.signWait()); err == nil {
			var name string
			if name, err = bind(ctx, cs, s.ccert, w); err == nil {
				s.st.Binding = name
			}
		}
	}
	switch {
	case errors.Is(err, errUnsupported):
		s.ready(metav1.ConditionFalse, identityv1alpha1.ReasonUnsupported, err.Error()+"; asked again in "+maxWait.String())
		return s.failed(true), nil
	case err != nil:
		// What the tenant answered stays in the provider's log (R17).
		log.FromContext(ctx).Info("the tenant did not issue the certificate", "error", err.Error())
		res := s.failed(false)
		s.ready(metav1.ConditionFalse, identityv1alpha1.ReasonTenantRefused, "the tenant did not take the request (the provider's log says why); tried again in "+res.RequeueAfter.String())
		return res, nil
	}
	data, err := secretData(t.Reach.Tenant.Endpoint, t.Reach.Tenant.CA, is, w.User)
	if err == nil {
		err = s.writeSecret(sec, data)
	}
	if err != nil {
		// The next try waits its turn: a write kcp refused is not a new
		// certificate at every retry.
		s.failed(false)
		return reconcile.Result{}, err
	}
	s.r.fails.Delete(s.ccert.UID)
	last := lastIssue{key: dataKey(w, t.CC.UID, data), at: s.now, renewal: renewalOf(is, w, s.now), notAfter: is.notAfter}
	s.r.issued.Store(s.ccert.UID, last)
	s.st.Issued = last.key
	s.st.NotBefore, s.st.NotAfter, s.st.RenewalTime = &metav1.Time{Time: is.cert.NotBefore}, &metav1.Time{Time: is.notAfter}, &metav1.Time{Time: last.renewal}
	s.ready(metav1.ConditionTrue, identityv1alpha1.ReasonIssued, issuedMessage(w, is.notAfter))
	return reconcile.Result{RequeueAfter: last.renewal.Sub(s.now)}, nil
}

// renewalOf is when a certificate issued at now is renewed: renewBefore
// its end; for one the signer made shorter than asked, two thirds into
// what it has; never sooner than minValid.
func renewalOf(is *issued, w wanted, now time.Time) time.Time {
	renewal := is.notAfter.Add(-w.renewBefore)
	if life := is.notAfter.Sub(now); life < w.duration-time.Minute {
		renewal = now.Add(life * 2 / 3)
	}
	return maxTime(renewal, now.Add(minValid))
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (s *syncer) signWait() time.Duration {
	if s.r.SignWait > 0 {
		return s.r.SignWait
	}
	return 15 * time.Second
}

// tenantClient is a client of the tenant as the requester's DID, with a
// token that lives tokenLife.
func (s *syncer) tenantClient(ctx context.Context, reach tenantreach.Reach) (kubernetes.Interface, error) {
	return reach.Client(ctx, s.now.Add(tokenLife))
}

// writeSecret writes data into the certificate's Secret (sec: as it is,
// nil when there is none), owned by the certificate.
func (s *syncer) writeSecret(sec *corev1.Secret, data map[string][]byte) error {
	if sec == nil {
		sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: s.ccert.Namespace, Name: s.ccert.Spec.SecretName}, Type: corev1.SecretTypeTLS}
		if err := controllerutil.SetControllerReference(s.ccert, sec, s.r.Scheme); err != nil {
			return err
		}
		sec.Data = data
		return s.c.Create(s.ctx, sec)
	}
	sec.Data = data
	return s.c.Update(s.ctx, sec)
}

// finalize removes the certificate's binding and requests from the
// tenant, then its Secret, then the finalizer. A tenant that cannot be
// reached for finalize.GiveUpAfter is let go with what it holds left
// there (logged and an Event); a contract that is gone or not Active has
// no tenant left to clean.
func (s *syncer) finalize() (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(s.ccert, Finalizer) {
		return reconcile.Result{}, nil
	}
	if err := s.unbind(); err != nil {
		if res, wait := finalize.Retry(s.ctx, s.ccert, s.now, err, "the certificate's binding "+bindingName(s.ccert)+" on the tenant"); wait {
			s.ready(metav1.ConditionFalse, identityv1alpha1.ReasonDeleting, "the certificate's binding on the tenant is not removed yet (the provider's log says why); tried again in "+finalize.RetryAfter.String())
			if werr := s.writeStatus(); werr != nil {
				return reconcile.Result{}, werr
			}
			return res, nil
		}
		s.events.Eventf(s.ccert, nil, corev1.EventTypeWarning, "BindingLeft", "Delete", "the binding %s could not be removed from the tenant within %s", bindingName(s.ccert), finalize.GiveUpAfter)
	}
	sec, err := s.secret()
	if err != nil {
		return reconcile.Result{}, err
	}
	if sec != nil && metav1.IsControlledBy(sec, s.ccert) {
		if err := s.c.Delete(s.ctx, sec); err != nil && !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
	}
	s.r.fails.Delete(s.ccert.UID)
	s.r.issued.Delete(s.ccert.UID)
	return reconcile.Result{}, ssa.RemoveFinalizer(s.ctx, s.c, s.ccert, Finalizer)
}

// unbind removes the certificate's binding and any request of it from the
// tenant. The binding's name is the certificate's own (bindingName), never
// read from the status a member may write.
func (s *syncer) unbind() error {
	t, err := s.tenant(wanted{ClusterClientCertificateSpec: s.ccert.Spec})
	switch {
	case err != nil:
		return err
	case t.Gone:
		return nil
	case t.Why != "":
		return errors.New(t.Why)
	}
	ctx, cancel := context.WithTimeout(s.ctx, deadline)
	defer cancel()
	cs, err := s.tenantClient(ctx, t.Reach)
	if err != nil {
		return err
	}
	return cleanTenant(ctx, cs, s.ccert)
}
