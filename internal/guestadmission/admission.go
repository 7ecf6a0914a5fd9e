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
// On each create and update that changes the spec, the webhook has kcp
// itself decide, as the author (impersonated), with a dry run: a Role of
// the grant's rules, or a RoleBinding of its ClusterRole, in the grant's
// namespace. kcp's RBAC escalation check applies as it would to the
// author's own request; its refusal is the webhook's answer. An admitted
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

	"github.com/kcp-dev/logicalcluster/v3"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
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

// Path is where the webhook is served.
const Path = "/admit/guestidentitygrants"

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
// one of rules and clusterRole, and rules a Role may hold.
func CheckSpec(spec *identityv1alpha1.GuestIdentityGrantSpec) error {
	switch {
	case len(spec.Rules) == 0 && spec.ClusterRole == "":
		return errors.New("spec: set rules or clusterRole")
	case len(spec.Rules) > 0 && spec.ClusterRole != "":
		return errors.New("spec: set rules or clusterRole, not both")
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

// Checker decides, as user in the workspace cluster, whether spec may be
// granted in namespace ns: nil, or an error whose text is shown to the
// author.
type Checker func(ctx context.Context, cluster, ns string, user authenticationv1.UserInfo, spec *identityv1alpha1.GuestIdentityGrantSpec) error

// DryRunChecker is the Checker that has kcp decide: through base (kcp's
// base URL and the provider's identity, which may impersonate in the
// workspaces that hold grants), as user, a dry-run create of a Role with
// the grant's rules, or of a RoleBinding of its ClusterRole, in ns.
func DryRunChecker(base *rest.Config) Checker {
	return func(ctx context.Context, cluster, ns string, user authenticationv1.UserInfo, spec *identityv1alpha1.GuestIdentityGrantSpec) error {
		cfg := rest.CopyConfig(base)
		cfg.Host += logicalcluster.NewPath(cluster).RequestPath()
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user.Username, UID: user.UID, Groups: user.Groups, Extra: map[string][]string{}}
		for k, v := range user.Extra {
			cfg.Impersonate.Extra[k] = v
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return err
		}
		dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
		meta := metav1.ObjectMeta{GenerateName: "knotless-guest-check-", Namespace: ns}
		if len(spec.Rules) > 0 {
			_, err = cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: meta, Rules: spec.Rules}, dry)
		} else {
			_, err = cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: meta,
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: spec.ClusterRole},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "knotless-guest-check", Namespace: ns}}}, dry)
		}
		switch {
		case apierrors.IsForbidden(err):
			// kcp's answer is about the author's own rights.
			return fmt.Errorf("it gives more than you may give in namespace %s: %s", ns, err.Error())
		case apierrors.IsNotFound(err):
			return fmt.Errorf("the ClusterRole %s does not exist in this workspace", spec.ClusterRole)
		case apierrors.IsInvalid(err):
			return errors.New(err.Error())
		}
		if err != nil {
			log.FromContext(ctx).Info("a GuestIdentityGrant could not be checked", "cluster", cluster, "error", err.Error())
			return errUnchecked
		}
		return nil
	}
}

var errUnchecked = errors.New("knotless could not have kcp check this grant against your rights (the provider's log says why); try again")

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
	cluster := g.Annotations[logicalcluster.AnnotationKey]
	if cluster == "" {
		return admission.Denied("the request names no workspace")
	}
	ns := g.Namespace
	if ns == "" {
		ns = req.Namespace
	}
	// A change that leaves an admitted spec as it was (a finalizer, a
	// label) is not checked again.
	if req.Operation == admissionv1.Update {
		old := &identityv1alpha1.GuestIdentityGrant{}
		if err := json.Unmarshal(req.OldObject.Raw, old); err == nil && sameSpec(&old.Spec, &g.Spec) && Admitted(h.Key, cluster, old) {
			return h.stamp(req, cluster, ns, g)
		}
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

// stamp answers with g's stamp written into its spec.
func (h *Handler) stamp(req admission.Request, cluster, ns string, g *identityv1alpha1.GuestIdentityGrant) admission.Response {
	g.Spec.AdmissionStamp = Stamp(h.Key, cluster, ns, g.Name, &g.Spec)
	raw, err := json.Marshal(g)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, raw)
}

// KeySecret is the Secret of the provider workspace that holds the key.
const KeySecret = "knotless-guest-admission"

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
