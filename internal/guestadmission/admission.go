/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package guestadmission is knotless's admission webhook for
// GuestIdentityGrants: a grant stands for a Role and a RoleBinding that
// knotless makes in the author's workspace, so it may give no more than
// its author could give by making them. kcp serves the webhook for every
// workspace that binds the export (it is configured in the provider
// workspace, next to the APIExport).
//
// On each create and update that changes the spec, the webhook asks kcp,
// with a SubjectAccessReview as the author for each permission the grant
// gives (its rules, or its ClusterRole's), whether the author holds it:
// a grant gives nothing its author does not hold, whatever right to
// escalate or bind the author has. An admitted
// spec is stamped (spec.admissionStamp: a MAC, keyed by a secret of the
// provider, of the workspace, namespace, name and the rest of the
// spec); the controller
// serves only grants whose stamp matches, so a grant made while no
// webhook was installed, or whose stamp was edited, is not served.
package guestadmission

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/kcp-dev/logicalcluster/v3"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	identityv1alpha1 "github.com/knotless-dev/knotless/apis/identity/v1alpha1"
)

// PathPrefix is where the webhook is served, under a secret (PathFor).
const PathPrefix = "/admit/guestidentitygrants/"

// PathFor is the webhook's path for the stamps' key: PathPrefix and a
// secret derived from the key, which every replica derives alike and
// only kcp (the webhook's configuration) is told. Whoever does not know
// it gets 404, so the webhook cannot be asked by others what a user
// holds (kcp v0.28.1 presents no client certificate to webhooks).
func PathFor(key []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("knotless guestidentitygrants webhook path"))
	return PathPrefix + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Stamp is the admission stamp of spec for the grant name of namespace
// ns in the workspace cluster: base64 of HMAC-SHA256 under key of all of
// spec but its stamp.
func Stamp(key []byte, cluster, ns, name string, spec *identityv1alpha1.GuestIdentityGrantSpec) string {
	unstamped := *spec
	unstamped.AdmissionStamp = ""
	b, err := json.Marshal(&unstamped)
	if err != nil {
		// A spec of plain fields always marshals.
		panic(err)
	}
	m := hmac.New(sha256.New, key)
	for _, s := range []string{"GuestIdentityGrant", cluster, ns, name} {
		m.Write([]byte(s))
		m.Write([]byte{0})
	}
	m.Write(b)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Admitted reports whether g, in the workspace cluster, carries the stamp
// of its current spec.
func Admitted(key []byte, cluster string, g *identityv1alpha1.GuestIdentityGrant) bool {
	want := Stamp(key, cluster, g.Namespace, g.Name, &g.Spec)
	return hmac.Equal([]byte(g.Spec.AdmissionStamp), []byte(want))
}

// CheckSpec returns what makes spec unservable, nil if nothing: exactly
// one of rules and clusterRole, rules a Role may hold, and a guest
// outside the tenant's kube-* namespaces.
func CheckSpec(spec *identityv1alpha1.GuestIdentityGrantSpec) error {
	switch {
	case len(spec.Rules) == 0 && spec.ClusterRole == "":
		return errors.New("spec: set rules or clusterRole")
	case len(spec.Rules) > 0 && spec.ClusterRole != "":
		return errors.New("spec: set rules or clusterRole, not both")
	}
	if strings.HasPrefix(spec.Guest.Namespace, "kube-") {
		return fmt.Errorf("spec.guest.namespace %s is one of the tenant's own (kube-*): a guest runs in a namespace of yours", spec.Guest.Namespace)
	}
	for i, r := range spec.Rules {
		if len(r.NonResourceURLs) > 0 {
			return fmt.Errorf("spec.rules[%d]: nonResourceURLs cannot be granted in a namespace", i)
		}
		if len(r.Verbs) == 0 || len(r.Resources) == 0 {
			return fmt.Errorf("spec.rules[%d]: verbs and resources are required", i)
		}
	}
	return nil
}

// Checker decides whether user holds in namespace ns of the workspace
// cluster everything spec gives: nil, or an error whose text is shown to
// the author.
type Checker func(ctx context.Context, cluster, ns string, user authenticationv1.UserInfo, spec *identityv1alpha1.GuestIdentityGrantSpec) error

// MaxChecks bounds the permissions one grant may give (each apiGroup,
// resource, verb and resource name of its rules, or of its ClusterRole's,
// is one SubjectAccessReview).
const MaxChecks = 256

// Permissions expands rules into the permissions they give in namespace
// ns, one per apiGroup, resource (and subresource), verb and resource
// name; wildcards stay wildcards, so only an author who holds the
// wildcard holds them. Rules of non-resource URLs give nothing in a
// namespace. It returns an error past MaxChecks.
func Permissions(ns string, rules []rbacv1.PolicyRule) ([]authorizationv1.ResourceAttributes, error) {
	var out []authorizationv1.ResourceAttributes
	for _, r := range rules {
		names := r.ResourceNames
		if len(names) == 0 {
			names = []string{""}
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				resource, sub, _ := strings.Cut(res, "/")
				for _, v := range r.Verbs {
					for _, n := range names {
						out = append(out, authorizationv1.ResourceAttributes{Namespace: ns, Group: g, Resource: resource, Subresource: sub, Verb: v, Name: n})
						if len(out) > MaxChecks {
							return nil, fmt.Errorf("it gives more than %d permissions (each apiGroup, resource, verb and resource name counts); split it or use wildcards", MaxChecks)
						}
					}
				}
			}
		}
	}
	return out, nil
}

// SARChecker is the Checker that asks kcp: through base (kcp's base URL
// and the provider's identity, which may read ClusterRoles and create
// SubjectAccessReviews in the workspaces that hold grants), a
// SubjectAccessReview as the author for each permission the grant gives
// (its rules, or the rules its ClusterRole has now). Holding a
// permission is what counts: the right to escalate or bind is not enough,
// so a grant never gives what its author does not have.
func SARChecker(base *rest.Config) Checker {
	return func(ctx context.Context, cluster, ns string, user authenticationv1.UserInfo, spec *identityv1alpha1.GuestIdentityGrantSpec) error {
		cfg := rest.CopyConfig(base)
		cfg.Host += logicalcluster.Name(cluster).Path().RequestPath()
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return err
		}
		rules := spec.Rules
		if spec.ClusterRole != "" {
			cr, err := cs.RbacV1().ClusterRoles().Get(ctx, spec.ClusterRole, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("the ClusterRole %s does not exist in this workspace", spec.ClusterRole)
			}
			if err != nil {
				return unchecked(ctx, cluster, err)
			}
			rules = cr.Rules
		}
		perms, err := Permissions(ns, rules)
		if err != nil {
			return err
		}
		extra := map[string]authorizationv1.ExtraValue{}
		for k, v := range user.Extra {
			extra[k] = authorizationv1.ExtraValue(v)
		}
		for i := range perms {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra, ResourceAttributes: &perms[i]}}
			out, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err != nil {
				return unchecked(ctx, cluster, err)
			}
			if !out.Status.Allowed || out.Status.Denied {
				return fmt.Errorf("it gives more than you hold in namespace %s: you may not %s", ns, describe(perms[i]))
			}
		}
		return nil
	}
}

// describe names a permission as kubectl auth can-i would ask it.
func describe(p authorizationv1.ResourceAttributes) string {
	res := p.Resource
	if p.Group != "" {
		res += "." + p.Group
	}
	if p.Subresource != "" {
		res += "/" + p.Subresource
	}
	if p.Name != "" {
		res += " named " + p.Name
	}
	return p.Verb + " " + res
}

// unchecked logs why a grant could not be checked and tells the author
// no more than that (kcp's answer may name the provider's identity).
func unchecked(ctx context.Context, cluster string, err error) error {
	log.FromContext(ctx).Info("a GuestIdentityGrant could not be checked", "cluster", cluster, "error", err.Error())
	return errUnchecked
}

var errUnchecked = errors.New("knotless could not check this grant against your rights (the provider's log says why); try again")

// Handler is the webhook: it refuses a grant whose spec its author could
// not grant, and stamps the ones it admits.
type Handler struct {
	// Key signs the stamps (LoadKey).
	Key []byte
	// Check decides whether the author may grant the spec.
	Check Checker
}

var _ admission.Handler = (*Handler)(nil)

// Handle implements admission.Handler.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	g := &identityv1alpha1.GuestIdentityGrant{}
	if err := json.Unmarshal(req.Object.Raw, g); err != nil {
		return admission.Errored(http.StatusBadRequest, errors.New("the object is not a GuestIdentityGrant"))
	}
	if g.Name == "" {
		// A generated name is made after mutating admission: the stamp
		// could not name it.
		return admission.Denied("a GuestIdentityGrant needs metadata.name (generateName is not supported)")
	}
	// The workspace is kcp's annotation, which kcp sets on create; an
	// update is checked in the workspace the stored object names, and
	// may not change it.
	cluster := g.Annotations[logicalcluster.AnnotationKey]
	var old *identityv1alpha1.GuestIdentityGrant
	if req.Operation == admissionv1.Update {
		old = &identityv1alpha1.GuestIdentityGrant{}
		if err := json.Unmarshal(req.OldObject.Raw, old); err != nil {
			return admission.Errored(http.StatusBadRequest, errors.New("the old object is not a GuestIdentityGrant"))
		}
		if prev := old.Annotations[logicalcluster.AnnotationKey]; prev != cluster {
			return admission.Denied("the annotation " + logicalcluster.AnnotationKey + " cannot change")
		}
	}
	if cluster == "" || !validCluster(cluster) {
		return admission.Denied("the request names no workspace")
	}
	ns := g.Namespace
	if ns == "" {
		ns = req.Namespace
	}
	if old != nil && sameSpec(&old.Spec, &g.Spec) {
		// A change that leaves the spec as it was (a finalizer, a label)
		// is not checked again: it keeps the stamp it had, valid or not.
		// A grant being deleted can always lose its finalizer.
		g.Spec.AdmissionStamp = old.Spec.AdmissionStamp
		return h.patch(req, g)
	}
	if !g.DeletionTimestamp.IsZero() {
		return admission.Denied("the spec of a GuestIdentityGrant being deleted cannot change")
	}
	if err := CheckSpec(&g.Spec); err != nil {
		return admission.Denied(err.Error())
	}
	if err := h.Check(ctx, cluster, ns, req.UserInfo, &g.Spec); err != nil {
		return admission.Denied("GuestIdentityGrant refused: " + err.Error())
	}
	return h.stamp(req, cluster, ns, g)
}

// sameSpec reports whether a and b are equal but for their stamps.
func sameSpec(a, b *identityv1alpha1.GuestIdentityGrantSpec) bool {
	x, y := *a, *b
	x.AdmissionStamp, y.AdmissionStamp = "", ""
	return apiequality.Semantic.DeepEqual(x, y)
}

// validCluster reports whether name is a logical cluster's name.
func validCluster(name string) bool {
	p, ok := logicalcluster.NewValidatedPath(name)
	if !ok {
		return false
	}
	_, ok = p.Name()
	return ok
}

// stamp answers with g's stamp written into its spec.
func (h *Handler) stamp(req admission.Request, cluster, ns string, g *identityv1alpha1.GuestIdentityGrant) admission.Response {
	g.Spec.AdmissionStamp = Stamp(h.Key, cluster, ns, g.Name, &g.Spec)
	return h.patch(req, g)
}

// patch answers with g as it is now.
func (h *Handler) patch(req admission.Request, g *identityv1alpha1.GuestIdentityGrant) admission.Response {
	raw, err := json.Marshal(g)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, raw)
}

// KeySecret is the Secret of the provider workspace that holds the key,
// in a namespace of its own (KeyNamespace): no other component of
// knotless reads it.
const (
	KeySecret    = "knotless-guest-admission"
	KeyNamespace = "knotless-admission"
)

// LoadKey returns the key kept in the Secret KeySecret of namespace ns
// (c: the provider workspace), making it when there is none: every
// replica of the provider shares it.
func LoadKey(ctx context.Context, c client.Client, ns string) ([]byte, error) {
	sec := &corev1.Secret{}
	err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: KeySecret}, sec)
	if apierrors.IsNotFound(err) {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: KeySecret}, Data: map[string][]byte{"key": key}}
		if err := c.Create(ctx, sec); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, err
		} else if err == nil {
			return key, nil
		}
		err = c.Get(ctx, client.ObjectKey{Namespace: ns, Name: KeySecret}, sec)
	}
	if err != nil {
		return nil, err
	}
	if len(sec.Data["key"]) < 32 {
		return nil, fmt.Errorf("the Secret %s/%s holds no key of 32 bytes or more", ns, KeySecret)
	}
	return sec.Data["key"], nil
}
