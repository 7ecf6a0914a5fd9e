package tenant

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/knotless-dev/knotless/apis"
	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/mountproxy"
)

func TestResolve(t *testing.T) {
	ca, err := framework.NewCA("tenant")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue("knotless-shim")
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := framework.PEMs(pair)
	if err != nil {
		t.Fatal(err)
	}
	cm := func(data string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ca"}, Data: map[string]string{"ca.crt": data}}
	}
	secret := func(data map[string][]byte) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cred"}, Data: data}
	}
	tc := &computev1alpha1.TenantCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant"},
		Spec: computev1alpha1.TenantClusterSpec{
			URL:        "https://127.0.0.1:6443/clusters/root",
			CABundle:   computev1alpha1.KeyRef{Kind: "ConfigMap", Namespace: "default", Name: "ca", Key: "ca.crt"},
			Credential: computev1alpha1.TenantCredential{SecretRef: computev1alpha1.SecretRef{Namespace: "default", Name: "cred"}},
		},
	}
	badURL := tc.DeepCopy()
	badURL.Spec.URL = "http://127.0.0.1:6443"
	for _, tt := range []struct {
		name   string
		tc     *computev1alpha1.TenantCluster
		objs   []client.Object
		reason string // "" = resolves
		check  func(*testing.T, mountproxy.Tenant)
	}{
		{"token", tc, []client.Object{cm(string(ca.PEM)), secret(map[string][]byte{"token": []byte("t")})}, "", func(t *testing.T, got mountproxy.Tenant) {
			if got.Credential.Token != "t" || got.URL.Path != "/clusters/root" || got.LogicalCluster != "lc" || got.Name != "tenant" {
				t.Errorf("resolved %+v", got)
			}
		}},
		{"client certificate", tc, []client.Object{cm(string(ca.PEM)), secret(map[string][]byte{"tls.crt": crt, "tls.key": key})}, "", func(t *testing.T, got mountproxy.Tenant) {
			if got.Credential.ClientCert == nil {
				t.Error("no client certificate")
			}
		}},
		{"no CA object", tc, []client.Object{secret(map[string][]byte{"token": []byte("t")})}, computev1alpha1.ReasonCABundleNotFound, nil},
		{"CA is not PEM", tc, []client.Object{cm("nope"), secret(map[string][]byte{"token": []byte("t")})}, computev1alpha1.ReasonInvalidSpec, nil},
		{"no credential", tc, []client.Object{cm(string(ca.PEM))}, computev1alpha1.ReasonCredentialNotFound, nil},
		{"token and certificate", tc, []client.Object{cm(string(ca.PEM)), secret(map[string][]byte{"token": []byte("t"), "tls.crt": crt, "tls.key": key})}, computev1alpha1.ReasonInvalidSpec, nil},
		{"key does not match", tc, []client.Object{cm(string(ca.PEM)), secret(map[string][]byte{"tls.crt": crt, "tls.key": []byte("x")})}, computev1alpha1.ReasonInvalidSpec, nil},
		{"plain http", badURL, nil, computev1alpha1.ReasonInvalidSpec, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(apis.NewScheme()).WithObjects(tt.objs...).Build()
			got, err := Resolve(context.Background(), c, "lc", tt.tc)
			var te *conditions.Error
			switch {
			case tt.reason == "" && err != nil:
				t.Fatalf("error %v", err)
			case tt.reason != "" && (!errors.As(err, &te) || te.Reason != tt.reason):
				t.Fatalf("error %v, want reason %s", err, tt.reason)
			}
			if tt.check != nil {
				tt.check(t, got)
			}
		})
	}
}
