// Package tenant turns a TenantCluster and the Secret and ConfigMap it
// references into the mount proxy's view of the tenant. The provider's
// tenantcluster controller and the mount proxy's registry controller both
// resolve a TenantCluster through it, so they agree on what is usable.
package tenant

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/url"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mchandler "sigs.k8s.io/multicluster-runtime/pkg/handler"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/keyref"
	"github.com/knotless-dev/knotless/internal/mapping"
	"github.com/knotless-dev/knotless/internal/mount"
)

// index is the field index of TenantClusters by the objects they refer
// to; refKey gives an object's value in it.
const index = "compute.knotless.dev/refs"

func refKey(kind, namespace, name string) string { return kind + "/" + namespace + "/" + name }

// AddIndex registers the index of TenantClusters by the Secrets and
// ConfigMaps they reference.
func AddIndex(ctx context.Context, mgr mcmanager.Manager) error {
	return mgr.GetFieldIndexer().IndexField(ctx, &computev1alpha1.TenantCluster{}, index, refs)
}

// EnqueueReferrers maps a Secret or ConfigMap (kind) to the TenantClusters
// of its workspace that reference it, so a changed CA bundle or credential
// is picked up at once (R08). It needs AddIndex.
func EnqueueReferrers(kind string) mchandler.TypedEventHandlerFunc[client.Object, mcreconcile.Request] {
	return mapping.ByClusterIndex(func() client.ObjectList { return &computev1alpha1.TenantClusterList{} }, index,
		func(o client.Object) string { return refKey(kind, o.GetNamespace(), o.GetName()) })
}

// refs returns the index values of a TenantCluster's references.
func refs(o client.Object) []string {
	tc := o.(*computev1alpha1.TenantCluster)
	ca, cred := tc.Spec.CABundle, tc.Spec.Credential.SecretRef
	return []string{refKey(ca.Kind, ca.Namespace, ca.Name), refKey("Secret", cred.Namespace, cred.Name)}
}

// Resolve reads the TenantCluster's CA bundle and credential from its
// workspace (c) and returns the tenant registered under the logical
// cluster lc. It returns a *conditions.Error with a TenantCluster
// condition reason when a reference is missing or its content is
// unusable, and other errors for failed reads.
//
// Both references must name one namespace, and a Secret is read only if
// it is labelled for this TenantCluster (computev1alpha1.
// LabelMountCredential) and its key url (computev1alpha1.
// MountCredentialURLKey) is exactly spec.url: a TenantCluster cannot make
// the mount proxy send a Secret its author could not read to a URL its
// author chose, not even by updating or re-creating the TenantCluster the
// Secret is labelled for (R22). A Secret that exists without the label or
// for another URL is reported exactly like a missing one, so a
// TenantCluster cannot probe for Secret names or URLs either.
//
// A market contract's mount (spec.credential.market) is reached with the
// credential the provider keeps for it in its own workspace, read
// through market (nil: there is none): resolveMarket.
func Resolve(ctx context.Context, c, market client.Reader, lc string, tc *computev1alpha1.TenantCluster) (mount.Tenant, error) {
	t := mount.Tenant{LogicalCluster: lc, Name: tc.Name}
	u, err := url.Parse(tc.Spec.URL)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return t, conditions.Errorf(computev1alpha1.ReasonInvalidSpec, nil, "spec.url %q must be https://host[:port][/path]", tc.Spec.URL)
	}
	t.URL = u

	ref, cref := tc.Spec.CABundle, tc.Spec.Credential.SecretRef
	if ref.Namespace != cref.Namespace {
		return t, conditions.Errorf(computev1alpha1.ReasonInvalidSpec, nil, "spec.caBundle and spec.credential must name the same namespace")
	}
	pemCA, err := caBundle(ctx, c, tc)
	if err != nil {
		return t, err
	}
	t.CA = x509.NewCertPool()
	if !t.CA.AppendCertsFromPEM(pemCA) {
		return t, conditions.Errorf(computev1alpha1.ReasonInvalidSpec, nil, "%s %s/%s key %q holds no PEM certificate", ref.Kind, ref.Namespace, ref.Name, ref.Key)
	}

	if tc.Spec.Credential.Market {
		return resolveMarket(ctx, market, t, tc, pemCA)
	}
	data, err := mountSecret(ctx, c, tc, cref.Namespace, cref.Name, computev1alpha1.ReasonCredentialNotFound)
	if err != nil {
		return t, err
	}
	if !boundCA(tc, pemCA, data[computev1alpha1.MountCredentialCAKey]) {
		return t, conditions.Errorf(computev1alpha1.ReasonCABundleNotBound, nil, "spec.caBundle does not hold the CA bundle the credential is bound to: the tenant is not used")
	}
	if t.Credential, err = credential(data, cref); err != nil {
		return t, err
	}
	return t, nil
}

// credential is the credential the data of the Secret cref holds: a
// client certificate (tls.crt and tls.key) or a token, not both.
func credential(data map[string][]byte, cref computev1alpha1.SecretRef) (mount.Credential, error) {
	crt, key, token := data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey], data["token"]
	switch {
	case len(token) > 0 && len(crt) == 0 && len(key) == 0:
		return mount.Credential{Token: string(token)}, nil
	case len(token) == 0 && len(crt) > 0 && len(key) > 0:
		pair, err := tls.X509KeyPair(crt, key)
		if err != nil {
			return mount.Credential{}, conditions.Errorf(computev1alpha1.ReasonInvalidSpec, nil, "Secret %s/%s: tls.crt/tls.key: %v", cref.Namespace, cref.Name, err)
		}
		return mount.Credential{ClientCert: &pair}, nil
	}
	return mount.Credential{}, conditions.Errorf(computev1alpha1.ReasonInvalidSpec, nil, "Secret %s/%s must hold either tls.crt and tls.key or token", cref.Namespace, cref.Name)
}

// lines are the non-empty lines of b.
func lines(b []byte) []string {
	var out []string
	for l := range strings.SplitSeq(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// boundCA says whether the CA bundle pemCA that spec.caBundle names may
// verify the tenant: it holds the same certificates as the CA bundle
// bound in the credential Secret (bound), or, for a Secret written
// before MountCredentialCAKey existed (no bound CA), it was read from
// that same credential Secret (another Secret labelled for tc and bound
// to its URL is not enough: whoever may create Secrets could make one
// holding her CA). A CA of a
// ConfigMap is never trusted on its own: whoever may update the
// TenantCluster could name one of theirs and, holding the network path
// to spec.url, receive the token (R22). Both refusals are one, so a
// TenantCluster does not tell whether the Secret binds a CA.
func boundCA(tc *computev1alpha1.TenantCluster, pemCA, bound []byte) bool {
	if len(bound) == 0 {
		ref, cref := tc.Spec.CABundle, tc.Spec.Credential.SecretRef
		return ref.Kind == "Secret" && ref.Namespace == cref.Namespace && ref.Name == cref.Name
	}
	return sameCertificates(pemCA, bound)
}

// certificates returns the DER of every CERTIFICATE block of a PEM
// bundle, the way x509.CertPool.AppendCertsFromPEM reads it.
func certificates(pemCA []byte) [][]byte {
	var ders [][]byte
	for len(pemCA) > 0 {
		var b *pem.Block
		b, pemCA = pem.Decode(pemCA)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" || len(b.Headers) != 0 {
			continue
		}
		if _, err := x509.ParseCertificate(b.Bytes); err == nil {
			ders = append(ders, b.Bytes)
		}
	}
	return ders
}

// caBundle reads the PEM the CA bundle reference names: a key of a
// ConfigMap, or of a Secret labelled for tc.
func caBundle(ctx context.Context, c client.Reader, tc *computev1alpha1.TenantCluster) ([]byte, error) {
	ref := tc.Spec.CABundle
	if ref.Kind != "Secret" {
		return keyref.Value(ctx, c, keyref.Ref{Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name, Key: ref.Key}, computev1alpha1.ReasonCABundleNotFound)
	}
	data, err := mountSecret(ctx, c, tc, ref.Namespace, ref.Name, computev1alpha1.ReasonCABundleNotFound)
	if err != nil {
		return nil, err
	}
	if len(data[ref.Key]) == 0 {
		return nil, conditions.Errorf(computev1alpha1.ReasonCABundleNotFound, nil, "Secret %s/%s has no key %q", ref.Namespace, ref.Name, ref.Key)
	}
	return data[ref.Key], nil
}

// mountSecret returns the data of the Secret namespace/name if it is
// labelled for tc and bound to tc's URL; a missing Secret, one not
// labelled for tc and one for another URL are the same
// *conditions.Error with reason missing.
func mountSecret(ctx context.Context, c client.Reader, tc *computev1alpha1.TenantCluster, namespace, name, missing string) (map[string][]byte, error) {
	s := &corev1.Secret{}
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, s)
	switch {
	case apierrors.IsNotFound(err) || err == nil && !forTenant(s, tc):
		return nil, conditions.Errorf(missing, nil, "Secret %s/%s not found, or not labelled %s=%s with key %s equal to spec.url",
			namespace, name, computev1alpha1.LabelMountCredential, tc.Name, computev1alpha1.MountCredentialURLKey)
	case err != nil:
		return nil, err
	}
	return s.Data, nil
}

// forTenant says whether the Secret s is labelled for tc and bound to its
// URL, compared as the exact strings its writer and tc hold.
func forTenant(s *corev1.Secret, tc *computev1alpha1.TenantCluster) bool {
	return s.Labels[computev1alpha1.LabelMountCredential] == tc.Name &&
		string(s.Data[computev1alpha1.MountCredentialURLKey]) == tc.Spec.URL
}
