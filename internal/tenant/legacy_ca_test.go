package tenant

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/knotless-dev/knotless/apis"
	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
)

// A credential Secret written before ca.crt existed (no bound CA): a
// member who may update the TenantCluster and create (not read) Secrets
// makes her own labelled Secret bound to spec.url holding her CA and
// points spec.caBundle at it; the victim's token is then sent to the
// server her CA verifies.
func TestLegacyCredentialTakesOnlyItsOwnCA(t *testing.T) {
	mallory, err := framework.NewCA("mallory")
	if err != nil {
		t.Fatal(err)
	}
	const u = "https://tenant.example:6443"
	lbl := map[string]string{computev1alpha1.LabelMountCredential: "tenant"}
	cred := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cred", Labels: lbl},
		Data: map[string][]byte{"token": []byte("victim-token"), computev1alpha1.MountCredentialURLKey: []byte(u)}}
	evil := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "evil-ca", Labels: lbl},
		Data: map[string][]byte{"ca.crt": mallory.PEM, computev1alpha1.MountCredentialURLKey: []byte(u)}}
	tc := &computev1alpha1.TenantCluster{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}, Spec: computev1alpha1.TenantClusterSpec{
		URL:        u,
		CABundle:   computev1alpha1.KeyRef{Kind: "Secret", Namespace: "default", Name: "evil-ca", Key: "ca.crt"},
		Credential: computev1alpha1.TenantCredential{SecretRef: computev1alpha1.SecretRef{Namespace: "default", Name: "cred"}},
	}}
	c := fake.NewClientBuilder().WithScheme(apis.NewScheme()).WithObjects(cred, evil).Build()
	tn, err := Resolve(context.Background(), c, nil, "lc", tc)
	if err == nil {
		t.Fatalf("resolved with mallory's CA from another Secret (token %q): the legacy credential is not bound to its own Secret's CA", tn.Credential.Token)
	}
}
