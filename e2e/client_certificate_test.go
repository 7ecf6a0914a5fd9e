package e2e

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	identityv1alpha1 "github.com/knotless-dev/knotless/apis/identity/v1alpha1"
	"github.com/knotless-dev/knotless/controllers/clientcertificate"
	"github.com/knotless-dev/knotless/e2e/framework"
)

// newCertificate makes the ClusterClientCertificate name for the
// requester's contract in the workspace c (namespace default), for the
// user carol (group devs) with the ClusterRole view, its Secret
// name+"-tls"; mut changes the spec.
func newCertificate(ctx context.Context, t *testing.T, c client.Client, name, contract string, mut func(*identityv1alpha1.ClusterClientCertificateSpec)) {
	t.Helper()
	cert := &identityv1alpha1.ClusterClientCertificate{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: identityv1alpha1.ClusterClientCertificateSpec{ContractRef: identityv1alpha1.ContractRef{Name: contract}, User: "carol", Groups: []string{"devs"},
			ClusterRole: "view", SecretName: name + "-tls"}}
	if mut != nil {
		mut(&cert.Spec)
	}
	if err := c.Create(ctx, cert); err != nil {
		t.Fatal(err)
	}
}

// certificateReady waits up to within for the certificate's Ready
// condition to have reason, and returns the certificate.
func certificateReady(ctx context.Context, t *testing.T, c client.Client, name, reason string, within time.Duration) *identityv1alpha1.ClusterClientCertificate {
	t.Helper()
	cert := &identityv1alpha1.ClusterClientCertificate{}
	if err := framework.Eventually(ctx, within, "ClusterClientCertificate "+name+" "+reason, func(ctx context.Context) (bool, string, error) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, cert); err != nil {
			return false, err.Error(), nil
		}
		cond := meta.FindStatusCondition(cert.Status.Conditions, identityv1alpha1.ConditionReady)
		if cond == nil {
			return false, "no Ready condition", nil
		}
		return cond.Reason == reason && cond.ObservedGeneration == cert.Generation, cond.Reason + ": " + cond.Message, nil
	}); err != nil {
		t.Fatal(err)
	}
	return cert
}

// certificateGone deletes the certificate and waits for it and its
// Secret to be gone.
func certificateGone(ctx context.Context, t *testing.T, c client.Client, name string) {
	t.Helper()
	cert := &identityv1alpha1.ClusterClientCertificate{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	if err := c.Delete(ctx, cert); err != nil {
		t.Fatal(err)
	}
	if err := framework.Eventually(ctx, time.Minute, "ClusterClientCertificate "+name+" and its Secret gone", func(ctx context.Context) (bool, string, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(cert), cert); !apierrors.IsNotFound(err) {
			return false, fmt.Sprintf("the certificate: %v (finalizers %v)", err, cert.Finalizers), nil
		}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name + "-tls"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			return false, fmt.Sprintf("the Secret: %v", err), nil
		}
		return true, "", nil
	}); err != nil {
		t.Fatal(err)
	}
}

// certificateClient is a client of the tenant with the kubeconfig of the
// certificate's Secret, and the certificate it holds.
func certificateClient(ctx context.Context, t *testing.T, c client.Client, name string) (kubernetes.Interface, *x509.Certificate) {
	t.Helper()
	sec := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name + "-tls"}, sec); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(sec.Data[clientcertificate.KeyKubeconfig])
	if err != nil {
		t.Fatalf("the Secret's kubeconfig: %v", err)
	}
	block, _ := pem.Decode(sec.Data[corev1.TLSCertKey])
	if block == nil {
		t.Fatal("the Secret's tls.crt holds no certificate")
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(cfg), leaf
}

// certificateOnKindTenant is the ClusterClientCertificate carol on the
// kind tenant of the requester's contract: she reads namespaces with the
// kubeconfig of its Secret, as carol of the group devs, with view and no
// more. It returns the certificate to check the renewal of later
// (certificateRenewed).
func certificateOnKindTenant(ctx context.Context, t *testing.T, app client.Client, contract string) *x509.Certificate {
	t.Helper()
	start := time.Now()
	// A 10 minute certificate renewed 9m30s before it expires: the
	// renewal is due 30 s after it is issued (the shortest use allowed).
	newCertificate(ctx, t, app, "carol", contract, func(s *identityv1alpha1.ClusterClientCertificateSpec) {
		s.Duration, s.RenewBefore = &metav1.Duration{Duration: 10 * time.Minute}, &metav1.Duration{Duration: 9*time.Minute + 30*time.Second}
	})
	certificateReady(ctx, t, app, "carol", identityv1alpha1.ReasonIssued, 2*time.Minute)
	t.Logf("FIGURE ClusterClientCertificate created -> Issued: %s", time.Since(start).Round(time.Millisecond))
	cs, leaf := certificateClient(ctx, t, app, "carol")
	if life := time.Until(leaf.NotAfter); life > 10*time.Minute || life < 9*time.Minute {
		t.Errorf("the certificate is valid until %s, %s from now: want the 10 minutes asked", leaf.NotAfter, life)
	}
	nss, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil || !slices.ContainsFunc(nss.Items, func(ns corev1.Namespace) bool { return ns.Name == "shop" }) {
		t.Fatalf("carol lists namespaces with the certificate's kubeconfig: %v", err)
	}
	who, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil || who.Status.UserInfo.Username != "carol" || !slices.Contains(who.Status.UserInfo.Groups, "devs") {
		t.Fatalf("the certificate's user on the tenant: %+v, %v", who, err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "carols"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("carol (view) made a namespace: %v", err)
	}
	if _, err := cs.CoreV1().Secrets("shop").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("carol (view) listed Secrets: %v", err)
	}
	return leaf
}

// certificateRenewed waits for the certificate carol to be renewed (a
// later certificate with another key than first), then deletes it: its
// Secret goes, and its binding on the tenant (read as alice through the
// mount, mount).
func certificateRenewed(ctx context.Context, t *testing.T, app client.Client, mount kubernetes.Interface, first *x509.Certificate) {
	t.Helper()
	if err := framework.Eventually(ctx, 3*time.Minute, "the certificate renewed with a new key", func(ctx context.Context) (bool, string, error) {
		sec := &corev1.Secret{}
		if err := app.Get(ctx, client.ObjectKey{Namespace: "default", Name: "carol-tls"}, sec); err != nil {
			return false, err.Error(), nil
		}
		block, _ := pem.Decode(sec.Data[corev1.TLSCertKey])
		if block == nil {
			return false, "no certificate", nil
		}
		leaf, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return false, err.Error(), nil
		}
		if leaf.SerialNumber.Cmp(first.SerialNumber) == 0 {
			return false, "the first certificate, until " + leaf.NotAfter.String(), nil
		}
		if pub, ok := leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || pub.Equal(first.PublicKey) {
			return false, "", errors.New("the renewal kept the key")
		}
		return leaf.NotAfter.After(first.NotAfter), "renewed until " + leaf.NotAfter.String(), nil
	}); err != nil {
		t.Fatal(err)
	}
	cs, _ := certificateClient(ctx, t, app, "carol")
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "shop", metav1.GetOptions{}); err != nil {
		t.Fatalf("the renewed certificate: %v", err)
	}
	cert := &identityv1alpha1.ClusterClientCertificate{}
	if err := app.Get(ctx, client.ObjectKey{Namespace: "default", Name: "carol"}, cert); err != nil {
		t.Fatal(err)
	}
	binding := "knotless:certificate:" + string(cert.UID)
	crb, err := mount.RbacV1().ClusterRoleBindings().Get(ctx, binding, metav1.GetOptions{})
	if err != nil || crb.Labels[clientcertificate.LabelCertificate] != string(cert.UID) || crb.RoleRef.Name != "view" {
		t.Fatalf("the certificate's binding on the tenant: %+v, %v", crb, err)
	}
	certificateGone(ctx, t, app, "carol")
	if _, err := mount.RbacV1().ClusterRoleBindings().Get(ctx, binding, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the certificate's binding is left on the tenant: %v", err)
	}
}

// certificateUnsupported: the ClusterClientCertificate "unsigned" (made
// by the caller) on a process tenant (a kcp, which signs no client
// certificates) is Unsupported, and one above the maximum lifetime is
// InvalidSpec. Both are deleted.
func certificateUnsupported(ctx context.Context, t *testing.T, app client.Client, contract string) {
	t.Helper()
	newCertificate(ctx, t, app, "too-long", contract, func(s *identityv1alpha1.ClusterClientCertificateSpec) {
		s.Duration = &metav1.Duration{Duration: 8 * 24 * time.Hour}
	})
	certificateReady(ctx, t, app, "too-long", identityv1alpha1.ReasonInvalidSpec, time.Minute)
	certificateReady(ctx, t, app, "unsigned", identityv1alpha1.ReasonUnsupported, time.Minute)
	certificateGone(ctx, t, app, "unsigned")
	certificateGone(ctx, t, app, "too-long")
}
