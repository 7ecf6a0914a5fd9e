/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package guestidentity reconciles GuestIdentityGrants: an identity in
// the requester's kcp workspace for a workload running in its tenant.
//
// For each grant admitted by knotless's webhook (guestadmission: the
// author could have made the Role and RoleBinding it stands for), it
// makes in the grant's namespace a kcp ServiceAccount, the Role of its
// rules (or none, for a ClusterRole) and the RoleBinding; it requests
// short-lived tokens for the ServiceAccount (TokenRequest, kcp's own
// audience) and writes each, with a kubeconfig for the workspace through
// kcp-front-proxy, into a Secret of the guest's namespace in the tenant,
// reached as the requester's DID like the ClusterClientCertificate
// controller. Deleting the grant deletes the ServiceAccount (kcp refuses
// its tokens at once) and the Secret in the tenant.
//
// The workspace objects are made with the provider's own kcp identity
// (the APIExport's virtual workspace serves no TokenRequest); the grant
// is read and its status written through the virtual workspace.
package guestidentity

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/kcp-dev/logicalcluster/v3"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
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
	"github.com/knotless-dev/knotless/internal/guestadmission"
	"github.com/knotless-dev/knotless/internal/mapping"
	"github.com/knotless-dev/knotless/internal/predicates"
	"github.com/knotless-dev/knotless/internal/ssa"
	"github.com/knotless-dev/knotless/internal/tenantreach"
)

const (
	// Name is the controller's name.
	Name = "guestidentity"
	// FieldManager owns GuestIdentityGrant status and finalizer.
	FieldManager = "knotless-guestidentity"
	// Finalizer removes the grant's ServiceAccount and its Secret in the
	// tenant.
	Finalizer = "identity.knotless.dev/guest-identity"
	// LabelGrant marks what a grant made (in the workspace and in the
	// tenant) with the grant's UID.
	LabelGrant = "identity.knotless.dev/grant-uid"

	// Keys of the Secret in the tenant.
	KeyKubeconfig = "kubeconfig"
	KeyToken      = "token"
	KeyCA         = "ca.crt"
	KeyServer     = "server"
	KeyNamespace  = "namespace"
	// KeyTLSServerName is set when kcp-front-proxy's certificate is
	// checked for another name than the server's host.
	KeyTLSServerName = "tls-server-name"

	byContract = "identity.knotless.dev/guest-contract"
)

// Waits of the controller.
const (
	tenantWait  = 15 * time.Second
	guestWait   = time.Minute
	refusedWait = 30 * time.Second
	tokenLife   = 5 * time.Minute
	deadline    = 25 * time.Second
)

// KCP is kcp-front-proxy as the tenants reach it.
type KCP struct {
	// Server is its base URL (https://host:port, without /clusters/...).
	// Empty: no grant is served (NotEnabled).
	Server string
	// CA verifies its serving certificate.
	CA []byte
	// TLSServerName, when set, is the name its certificate is checked for
	// (its address from the tenants is not in the certificate).
	TLSServerName string
}

// Reconciler reconciles GuestIdentityGrants in every engaged workspace.
type Reconciler struct {
	GetCluster func(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error)
	// Reaches is how the requester's side reaches each mounted tenant.
	Reaches *tenantreach.Registry
	// Key checks the admission stamps (guestadmission).
	Key []byte
	// Base is kcp's base URL (no /clusters/...) as the provider's own
	// identity, which makes the ServiceAccounts, Roles and RoleBindings
	// and requests the tokens.
	Base *rest.Config
	// Guest is kcp-front-proxy as the guests reach it.
	Guest KCP
	// Workspace, when set, returns the client of a workspace (by logical
	// cluster) instead of Base (tests).
	Workspace func(cluster string) (kubernetes.Interface, error)
	// Now is the clock (default time.Now).
	Now func() time.Time

	hc     *http.Client
	issued sync.Map // by UID: lastIssue
}

// lastIssue is the token last written for a grant.
type lastIssue struct {
	key              string
	renewal, expires time.Time
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr mcmanager.Manager) error {
	if r.Guest.Server != "" && r.Workspace == nil {
		hc, err := rest.HTTPClientFor(r.Base)
		if err != nil {
			return err
		}
		r.hc = hc
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &identityv1alpha1.GuestIdentityGrant{}, byContract, func(o client.Object) []string {
		return []string{o.(*identityv1alpha1.GuestIdentityGrant).Spec.ContractRef.Name}
	}); err != nil {
		return err
	}
	return engage.ControllerManagedBy(mgr).
		Named(Name).
		For(&identityv1alpha1.GuestIdentityGrant{}, predicates.SpecOrLifecycleChanged()).
		Watches(&marketv1alpha1.ComputeContract{}, mapping.ByIndex(func() client.ObjectList { return &identityv1alpha1.GuestIdentityGrantList{} }, byContract,
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
	s := &syncer{r: r, ctx: ctx, c: cl.GetClient(), lc: string(req.ClusterName), now: clock.Now(r.Now)}
	s.g = &identityv1alpha1.GuestIdentityGrant{}
	if err := s.c.Get(ctx, req.NamespacedName, s.g); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	s.st = s.g.Status.DeepCopy()
	s.st.ObservedGeneration = s.g.Generation
	if !s.g.DeletionTimestamp.IsZero() {
		return s.finalize()
	}
	res, err := s.sync()
	if werr := ssa.WriteStatus(ctx, s.c, s.g, &s.g.Status, s.st, ssa.StatusOptions{
		Manager: FieldManager, Event: ssa.ConditionChanged(s.g.Status.Conditions, s.st.Conditions, identityv1alpha1.ConditionReady),
		Recorder: cl.GetEventRecorder(Name), Action: "Grant",
	}); werr != nil {
		return reconcile.Result{}, werr
	}
	return res, err
}

// syncer is one reconcile of one GuestIdentityGrant.
type syncer struct {
	r   *Reconciler
	ctx context.Context
	c   client.Client
	lc  string
	now time.Time
	g   *identityv1alpha1.GuestIdentityGrant
	st  *identityv1alpha1.GuestIdentityGrantStatus
}

func (s *syncer) ready(status metav1.ConditionStatus, reason, msg string) {
	conditions.SetReady(&s.st.Conditions, s.g.Generation, status, reason, msg)
}

// Duration returns the life of a grant's tokens, or why it is refused.
func Duration(spec *identityv1alpha1.GuestIdentityGrantSpec) (time.Duration, error) {
	d := identityv1alpha1.DefaultTokenDuration * time.Second
	if spec.Duration != nil {
		d = spec.Duration.Duration
	}
	if lo, hi := identityv1alpha1.MinTokenDuration*time.Second, identityv1alpha1.MaxTokenDuration*time.Second; d < lo || d > hi {
		return 0, fmt.Errorf("spec.duration %s is out of range: at least %s (the shortest token kcp issues), at most %s", d, lo, hi)
	}
	return d, nil
}

// sync makes the workspace's objects and, when the token is due, a new
// token in the tenant's Secret.
func (s *syncer) sync() (reconcile.Result, error) {
	if s.r.Guest.Server == "" {
		s.ready(metav1.ConditionFalse, identityv1alpha1.ReasonNotEnabled, "this knotless installation serves no GuestIdentityGrants (its provider has no --guest-kcp-server)")
		return reconcile.Result{}, nil
	}
	life, err := Duration(&s.g.Spec)
	if err == nil {
		err = guestadmission.CheckSpec(&s.g.Spec)
	}
	if err != nil {
		s.ready(metav1.ConditionFalse, identityv1alpha1.ReasonInvalidSpec, err.Error())
		return reconcile.Result{}, nil
	}
	if !guestadmission.Admitted(s.r.Key, s.lc, s.g) {
		s.ready(metav1.ConditionFalse, identityv1alpha1.ReasonNotAdmitted, "the spec was not checked against its author's rights by knotless's admission webhook: apply it again to have it checked")
		// What an earlier spec was granted goes: its tokens stop.
		return reconcile.Result{}, s.revoke()
	}
	t, err := s.r.Reaches.Lookup(s.ctx, s.c, s.lc, s.g.Namespace, s.g.Spec.ContractRef.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	if t.Gone {
		// No tenant (the contract is not Active, or not the requester's):
		// what was granted goes, the contract's changes wake the grant.
		reason := identityv1alpha1.ReasonTenantNotReady
		if t.CC == nil {
			reason = identityv1alpha1.ReasonContractNotFound
		}
		s.ready(metav1.ConditionFalse, reason, t.Why)
		return reconcile.Result{}, s.revoke()
	}
	if !t.Mounted {
		s.ready(metav1.ConditionFalse, identityv1alpha1.ReasonTenantNotReady, t.Why)
		return reconcile.Result{RequeueAfter: tenantWait}, nil
	}
	key := issueKey(s.g, t.CC.UID)
	if v, ok := s.r.issued.Load(s.g.UID); ok && v.(lastIssue).key == key && s.now.Before(v.(lastIssue).renewal) {
		last := v.(lastIssue)
		s.ready(metav1.ConditionTrue, identityv1alpha1.ReasonGranted, grantedMessage(s.g, last.expires))
		return reconcile.Result{RequeueAfter: last.renewal.Sub(s.now)}, nil
	}
	if !controllerutil.ContainsFinalizer(s.g, Finalizer) {
		if err := ssa.Metadata(s.ctx, s.c, s.g, []string{Finalizer}, nil, FieldManager); err != nil {
			return reconcile.Result{}, err
		}
	}
	return s.grant(t, key, life)
}

func grantedMessage(g *identityv1alpha1.GuestIdentityGrant, exp time.Time) string {
	return fmt.Sprintf("Secret %s/%s in the tenant holds a token for ServiceAccount %s, valid until %s", g.Spec.Guest.Namespace, g.Spec.SecretName, ServiceAccountName(g), exp.UTC().Format(time.RFC3339))
}

// issueKey identifies what a token is written for: the grant's spec and
// generation and its contract.
func issueKey(g *identityv1alpha1.GuestIdentityGrant, contract types.UID) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%d\x00%v\x00%s", g.Generation, contract, g.Spec.AdmissionStamp))
	return hex.EncodeToString(h[:8])
}

// ServiceAccountName is the name of a grant's ServiceAccount, Role and
// RoleBinding in its namespace: the grant's UID, not a name a member
// chose.
func ServiceAccountName(g *identityv1alpha1.GuestIdentityGrant) string {
	return "knotless-guest-" + string(g.UID)
}

// workspace is a client of the grant's workspace as the provider.
func (s *syncer) workspace() (kubernetes.Interface, error) {
	if s.r.Workspace != nil {
		return s.r.Workspace(s.lc)
	}
	cfg := rest.CopyConfig(s.r.Base)
	cfg.Host += logicalcluster.Name(s.lc).Path().RequestPath()
	return kubernetes.NewForConfigAndClient(cfg, s.r.hc)
}

// grant makes the workspace's objects, a token, and the Secret in the
// tenant.
func (s *syncer) grant(t tenantreach.Contract, key string, life time.Duration) (reconcile.Result, error) {
	ctx, cancel := context.WithTimeout(s.ctx, deadline)
	defer cancel()
	ws, err := s.workspace()
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := s.ensureRBAC(ctx, ws); errors.Is(err, errNameTaken) {
		s.ready(metav1.ConditionFalse, identityv1alpha1.ReasonNameTaken, fmt.Sprintf("a ServiceAccount, Role or RoleBinding %s exists in this namespace that knotless did not make for this grant; nothing is granted until it is gone", ServiceAccountName(s.g)))
		return reconcile.Result{RequeueAfter: guestWait}, nil
	} else if err != nil {
		return reconcile.Result{}, fmt.Errorf("the grant's ServiceAccount and RBAC in the workspace: %w", err)
	}
	s.st.ServiceAccount = ServiceAccountName(s.g)
	tc, err := t.Reach.Client(ctx, s.now.Add(tokenLife))
	if err == nil {
		err = s.guestThere(ctx, tc)
	}
	var missing *guestMissing
	switch {
	case errors.As(err, &missing):
		s.ready(metav1.ConditionFalse, identityv1alpha1.ReasonGuestNotFound, missing.Error()+"; looked at again in "+guestWait.String())
		return reconcile.Result{RequeueAfter: guestWait}, nil
	case errors.Is(err, errSecretTaken):
		s.ready(metav1.ConditionFalse, identityv1alpha1.ReasonSecretNameTaken,
			fmt.Sprintf("Secret %s exists in the guest's namespace and was not made for this grant; it is not overwritten: name another spec.secretName or delete it", s.g.Spec.SecretName))
		return reconcile.Result{RequeueAfter: guestWait}, nil
	case err != nil:
		log.FromContext(ctx).Info("the tenant could not be reached for a GuestIdentityGrant", "error", err.Error())
		s.ready(metav1.ConditionFalse, identityv1alpha1.ReasonTenantRefused, "the tenant did not take the request (the provider's log says why); tried again in "+refusedWait.String())
		return reconcile.Result{RequeueAfter: refusedWait}, nil
	}
	exp := int64(life / time.Second)
	tr, err := ws.CoreV1().ServiceAccounts(s.g.Namespace).CreateToken(ctx, ServiceAccountName(s.g),
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("requesting a token of the grant's ServiceAccount: %w", err)
	}
	data, err := s.secretData(tr.Status.Token)
	if err == nil {
		err = s.writeSecret(ctx, tc, data)
	}
	if err != nil {
		log.FromContext(ctx).Info("the guest's Secret was not written", "error", err.Error())
		s.ready(metav1.ConditionFalse, identityv1alpha1.ReasonTenantRefused, "the tenant did not take the guest's Secret (the provider's log says why); tried again in "+refusedWait.String())
		return reconcile.Result{RequeueAfter: refusedWait}, nil
	}
	expires := tr.Status.ExpirationTimestamp.Time
	renewal := s.now.Add(expires.Sub(s.now) * 2 / 3)
	s.r.issued.Store(s.g.UID, lastIssue{key: key, renewal: renewal, expires: expires})
	s.st.ExpirationTime, s.st.RenewalTime = &metav1.Time{Time: expires}, &metav1.Time{Time: renewal}
	s.ready(metav1.ConditionTrue, identityv1alpha1.ReasonGranted, grantedMessage(s.g, expires))
	return reconcile.Result{RequeueAfter: renewal.Sub(s.now)}, nil
}

// ensureRBAC makes the grant's ServiceAccount, its Role (for rules) and
// its RoleBinding in the grant's namespace, labelled with and owned by
// the grant, and brings them to the spec. An object of their name that
// the grant did not make is errNameTaken.
func (s *syncer) ensureRBAC(ctx context.Context, ws kubernetes.Interface) error {
	name, ns := ServiceAccountName(s.g), s.g.Namespace
	meta := metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{LabelGrant: string(s.g.UID)},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: identityv1alpha1.GroupVersion.String(), Kind: "GuestIdentityGrant", Name: s.g.Name, UID: s.g.UID}}}
	if _, err := ws.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: meta}, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		sa, err := ws.CoreV1().ServiceAccounts(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := s.mine(sa); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	ref := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: s.g.Spec.ClusterRole}
	if len(s.g.Spec.Rules) > 0 {
		ref = rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}
		if err := s.ensureRole(ctx, ws, meta); err != nil {
			return err
		}
	} else if err := ws.RbacV1().Roles(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return s.ensureBinding(ctx, ws, &rbacv1.RoleBinding{ObjectMeta: meta, RoleRef: ref, Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}})
}

// mine is nil when o carries the grant's label, else errNameTaken.
func (s *syncer) mine(o metav1.Object) error {
	if o.GetLabels()[LabelGrant] != string(s.g.UID) {
		return errNameTaken
	}
	return nil
}

// ensureRole makes or updates the Role of the grant's rules.
func (s *syncer) ensureRole(ctx context.Context, ws kubernetes.Interface, meta metav1.ObjectMeta) error {
	role, err := ws.RbacV1().Roles(meta.Namespace).Get(ctx, meta.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = ws.RbacV1().Roles(meta.Namespace).Create(ctx, &rbacv1.Role{ObjectMeta: meta, Rules: s.g.Spec.Rules}, metav1.CreateOptions{})
	case err == nil && s.mine(role) != nil:
		err = errNameTaken
	case err == nil && !apiequality.Semantic.DeepEqual(role.Rules, s.g.Spec.Rules):
		role.Rules = s.g.Spec.Rules
		_, err = ws.RbacV1().Roles(meta.Namespace).Update(ctx, role, metav1.UpdateOptions{})
	}
	return err
}

// ensureBinding makes want, replacing a RoleBinding of the grant's that
// differs (a roleRef cannot change; its subjects are the grant's
// ServiceAccount only).
func (s *syncer) ensureBinding(ctx context.Context, ws kubernetes.Interface, want *rbacv1.RoleBinding) error {
	api := ws.RbacV1().RoleBindings(want.Namespace)
	rb, err := api.Get(ctx, want.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return err
	case s.mine(rb) != nil:
		return errNameTaken
	case rb.RoleRef == want.RoleRef && apiequality.Semantic.DeepEqual(rb.Subjects, want.Subjects):
		return nil
	default:
		if err := api.Delete(ctx, want.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	_, err = api.Create(ctx, want, metav1.CreateOptions{})
	return err
}

// guestMissing says what of the guest the tenant does not have.
type guestMissing struct{ what string }

func (e *guestMissing) Error() string { return e.what }

var (
	errSecretTaken = errors.New("the Secret's name is taken")
	errNameTaken   = errors.New("the ServiceAccount's name is taken")
)

// guestThere checks that the guest's namespace and ServiceAccount exist
// in the tenant and that a Secret of spec.secretName there, if any, is
// the grant's.
func (s *syncer) guestThere(ctx context.Context, tc kubernetes.Interface) error {
	gs := s.g.Spec.Guest
	if _, err := tc.CoreV1().Namespaces().Get(ctx, gs.Namespace, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return &guestMissing{fmt.Sprintf("the tenant has no namespace %s", gs.Namespace)}
	} else if err != nil {
		return err
	}
	if _, err := tc.CoreV1().ServiceAccounts(gs.Namespace).Get(ctx, gs.ServiceAccount, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return &guestMissing{fmt.Sprintf("the tenant has no ServiceAccount %s in namespace %s", gs.ServiceAccount, gs.Namespace)}
	} else if err != nil {
		return err
	}
	sec, err := tc.CoreV1().Secrets(gs.Namespace).Get(ctx, s.g.Spec.SecretName, metav1.GetOptions{})
	if err == nil && sec.Labels[LabelGrant] != string(s.g.UID) {
		return errSecretTaken
	}
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// secretData is the guest's Secret: the token and a kubeconfig for the
// grant's workspace and namespace through kcp-front-proxy.
func (s *syncer) secretData(token string) (map[string][]byte, error) {
	server := s.r.Guest.Server + logicalcluster.Name(s.lc).Path().RequestPath()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kcp"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: s.r.Guest.CA, TLSServerName: s.r.Guest.TLSServerName}
	kc.AuthInfos["guest"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["kcp"] = &clientcmdapi.Context{Cluster: "kcp", AuthInfo: "guest", Namespace: s.g.Namespace}
	kc.CurrentContext = "kcp"
	raw, err := clientcmd.Write(*kc)
	if err != nil {
		return nil, err
	}
	data := map[string][]byte{KeyKubeconfig: raw, KeyToken: []byte(token), KeyCA: s.r.Guest.CA, KeyServer: []byte(server), KeyNamespace: []byte(s.g.Namespace)}
	if s.r.Guest.TLSServerName != "" {
		data[KeyTLSServerName] = []byte(s.r.Guest.TLSServerName)
	}
	return data, nil
}

// writeSecret writes data into the guest's Secret in the tenant.
func (s *syncer) writeSecret(ctx context.Context, tc kubernetes.Interface, data map[string][]byte) error {
	gs := s.g.Spec.Guest
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: s.g.Spec.SecretName, Namespace: gs.Namespace,
		Labels: map[string]string{LabelGrant: string(s.g.UID)}}, Type: corev1.SecretTypeOpaque, Data: data}
	cur, err := tc.CoreV1().Secrets(gs.Namespace).Get(ctx, sec.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = tc.CoreV1().Secrets(gs.Namespace).Create(ctx, sec, metav1.CreateOptions{})
		return err
	case err != nil:
		return err
	case cur.Labels[LabelGrant] != string(s.g.UID):
		return errSecretTaken
	}
	cur.Data = data
	_, err = tc.CoreV1().Secrets(gs.Namespace).Update(ctx, cur, metav1.UpdateOptions{})
	return err
}

// finalize deletes the grant's ServiceAccount, Role and RoleBinding in
// the workspace (kcp refuses the tokens within its 10 s cache), then its Secret in
// the tenant, then the finalizer. A tenant that cannot be reached for
// finalize.GiveUpAfter is let go with the Secret left there (its token is
// already refused; logged).
func (s *syncer) finalize() (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(s.g, Finalizer) {
		return reconcile.Result{}, nil
	}
	log.FromContext(s.ctx).Info("GuestIdentityGrant deleted: removing its ServiceAccount and its Secret in the tenant", "since", s.now.Sub(s.g.DeletionTimestamp.Time).String())
	if err := s.revoke(); err != nil {
		return reconcile.Result{}, err
	}
	ctx, cancel := context.WithTimeout(s.ctx, deadline)
	defer cancel()
	if err := s.removeSecret(ctx); err != nil {
		if res, wait := finalize.Retry(s.ctx, s.g, s.now, err, "the guest's Secret in the tenant (its token is refused already)"); wait {
			return res, nil
		}
	}
	return reconcile.Result{}, ssa.RemoveFinalizer(s.ctx, s.c, s.g, Finalizer)
}

// revoke deletes the grant's ServiceAccount (kcp refuses its tokens from
// then on), RoleBinding and Role, and forgets the last token. A grant
// that never had the finalizer made none.
func (s *syncer) revoke() error {
	s.r.issued.Delete(s.g.UID)
	if !controllerutil.ContainsFinalizer(s.g, Finalizer) {
		return nil
	}
	ctx, cancel := context.WithTimeout(s.ctx, deadline)
	defer cancel()
	ws, err := s.workspace()
	if err != nil {
		return err
	}
	// The names hold the grant's UID: they are the grant's.
	name, ns := ServiceAccountName(s.g), s.g.Namespace
	for _, del := range []func() error{
		func() error { return ws.CoreV1().ServiceAccounts(ns).Delete(ctx, name, metav1.DeleteOptions{}) },
		func() error { return ws.RbacV1().RoleBindings(ns).Delete(ctx, name, metav1.DeleteOptions{}) },
		func() error { return ws.RbacV1().Roles(ns).Delete(ctx, name, metav1.DeleteOptions{}) },
	} {
		if err := del(); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// removeSecret deletes the guest's Secret in the tenant, if it is the
// grant's. A contract that is gone has no tenant left to clean.
func (s *syncer) removeSecret(ctx context.Context) error {
	t, err := s.r.Reaches.Lookup(ctx, s.c, s.lc, s.g.Namespace, s.g.Spec.ContractRef.Name)
	switch {
	case err != nil:
		return err
	case t.Gone:
		return nil
	case !t.Mounted:
		return errors.New(t.Why)
	}
	tc, err := t.Reach.Client(ctx, s.now.Add(tokenLife))
	if err != nil {
		return err
	}
	gs := s.g.Spec.Guest
	sec, err := tc.CoreV1().Secrets(gs.Namespace).Get(ctx, s.g.Spec.SecretName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || err == nil && sec.Labels[LabelGrant] != string(s.g.UID) {
		return nil
	}
	if err != nil {
		return err
	}
	err = tc.CoreV1().Secrets(gs.Namespace).Delete(ctx, sec.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &sec.UID}})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
