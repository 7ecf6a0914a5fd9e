package clientcertificate

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	identityv1alpha1 "github.com/knotless-dev/knotless/apis/identity/v1alpha1"
)

// Names equal to privileged ones are refused; a control char too.
func TestAtkPrivilegedNamesRefused(t *testing.T) {
	for _, n := range []string{"system:masters", "system:", "kubeadm:cluster-admins", "knotless:x", "", " ", "\tsystem:masters", "x\x00", strings.Repeat("a", 254)} {
		if _, err := check(certificate("c", func(s *identityv1alpha1.ClusterClientCertificateSpec) { s.User = n }).Spec); err == nil {
			t.Errorf("user %q accepted", n)
		}
		if _, err := check(certificate("c", func(s *identityv1alpha1.ClusterClientCertificateSpec) { s.Groups = []string{n} }).Spec); err == nil {
			t.Errorf("group %q accepted", n)
		}
	}
}

// Names padded with whitespace are not names anyone is: refuse them
// (they render like system:masters or the requester's DID).
func TestAtkPaddedNamesRefused(t *testing.T) {
	for _, n := range []string{" system:masters", "system:masters ", "did:plc:alice ", " did:plc:alice"} {
		if _, err := check(certificate("c", func(s *identityv1alpha1.ClusterClientCertificateSpec) { s.User = n }).Spec); err == nil {
			t.Errorf("user %q accepted", n)
		}
		if _, err := check(certificate("c", func(s *identityv1alpha1.ClusterClientCertificateSpec) { s.Groups = []string{n} }).Spec); err == nil {
			t.Errorf("group %q accepted", n)
		}
	}
}

// The requester's exact DID is refused at reconcile; no request is made.
func TestAtkRequesterDIDRefused(t *testing.T) {
	f := newFixture(t, certificate("carol", func(s *identityv1alpha1.ClusterClientCertificateSpec) { s.User = "did:plc:alice" }))
	f.reconcile(t, "carol")
	if c := ready(t, f.get(t, "carol")); c.Reason != identityv1alpha1.ReasonInvalidSpec || f.tn.creates.Load() != 0 {
		t.Fatalf("Ready %+v, creates %d", c, f.tn.creates.Load())
	}
}

func TestAtkOversizedSubject(t *testing.T) {
	f := newFixture(t, certificate("carol", func(s *identityv1alpha1.ClusterClientCertificateSpec) {
		s.User = strings.Repeat("u", 253)
		s.Groups = nil
		for i := 0; i < 16; i++ {
			s.Groups = append(s.Groups, strings.Repeat(string(rune('a'+i)), 253))
		}
	}))
	f.reconcile(t, "carol")
	if c := ready(t, f.get(t, "carol")); c.Status != metav1.ConditionTrue {
		t.Fatalf("Ready %+v", c)
	}
	n := 0
	for _, v := range f.secret(t, "carol-tls").Data {
		n += len(v)
	}
	if n > 64<<10 {
		t.Fatalf("secret %d bytes", n)
	}
}

func TestAtkSameSecretName(t *testing.T) {
	a := certificate("a", func(s *identityv1alpha1.ClusterClientCertificateSpec) { s.SecretName = "shared" })
	b := certificate("b", func(s *identityv1alpha1.ClusterClientCertificateSpec) { s.SecretName = "shared"; s.User = "mallory" })
	f := newFixture(t, a, b)
	f.reconcile(t, "a")
	before := f.secret(t, "shared")
	f.reconcile(t, "b")
	if c := ready(t, f.get(t, "b")); c.Reason != identityv1alpha1.ReasonSecretNameTaken {
		t.Fatalf("b Ready %+v", c)
	}
	if after := f.secret(t, "shared"); !bytes.Equal(after.Data[corev1.TLSCertKey], before.Data[corev1.TLSCertKey]) {
		t.Fatal("b overwrote a's Secret")
	}
	// deleting b leaves a's Secret
	bb := f.get(t, "b")
	if err := f.cl.Client.Delete(t.Context(), bb); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "b")
	f.secret(t, "shared")
}

// A contract of the same name in another namespace is not used.
func TestAtkContractInOtherNamespace(t *testing.T) {
	c := certificate("carol", func(s *identityv1alpha1.ClusterClientCertificateSpec) { s.ContractRef.Name = "web-0" })
	c.Namespace = "other"
	f := newFixture(t, c)
	if _, err := f.r.Reconcile(t.Context(), reqIn("other", "carol")); err != nil {
		t.Fatal(err)
	}
	got := &identityv1alpha1.ClusterClientCertificate{}
	if err := f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "other", Name: "carol"}, got); err != nil {
		t.Fatal(err)
	}
	if r := ready(t, got); r.Reason != identityv1alpha1.ReasonTenantNotReady || f.tokens.Load() != 0 {
		t.Fatalf("Ready %+v tokens %d", r, f.tokens.Load())
	}
}

// After a restart, a member's forged status.renewalTime must not stop
// the renewal of the real certificate.
func TestAtkForgedRenewalTimeSuppressesRenewal(t *testing.T) {
	f := newFixture(t, certificate("carol", nil))
	f.reconcile(t, "carol")
	c := f.get(t, "carol")
	realNotAfter := c.Status.NotAfter.Time
	far := metav1.NewTime(t0.Add(100 * 365 * 24 * time.Hour))
	c.Status.RenewalTime, c.Status.NotAfter = &far, &far
	if err := f.cl.Client.Status().Update(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	f.r.issued.Range(func(k, _ any) bool { f.r.issued.Delete(k); return true }) // provider restart
	f.now = realNotAfter.Add(-time.Minute)                                      // past the real renewal time
	f.reconcile(t, "carol")
	if n := f.tn.creates.Load(); n != 2 {
		t.Fatalf("%d requests: the forged renewalTime suppressed the renewal (cert expires %s)", n, realNotAfter)
	}
}

// hostile makes the tenant answer CSR Gets with what forge returns.
func hostile(f *fixture, forge func(req *x509.CertificateRequest, csr *certificatesv1.CertificateSigningRequest) []byte) {
	f.tn.cs.PrependReactor("get", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		o, err := f.tn.cs.Tracker().Get(certificatesv1.SchemeGroupVersion.WithResource("certificatesigningrequests"), "", a.(k8stesting.GetAction).GetName())
		if err != nil {
			return true, nil, err
		}
		csr := o.(*certificatesv1.CertificateSigningRequest).DeepCopy()
		block, _ := pem.Decode(csr.Spec.Request)
		req, _ := x509.ParseCertificateRequest(block.Bytes)
		csr.Status.Certificate = forge(req, csr)
		return true, csr, nil
	})
}

func forgeCert(t *testing.T, req *x509.CertificateRequest, subj pkix.Name, ext []pkix.Extension) []byte {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: subj, NotBefore: t0.Add(-time.Minute), NotAfter: t0.Add(30 * time.Minute), ExtraExtensions: ext}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, req.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestAtkTenantExtraGroups(t *testing.T) {
	f := newFixture(t, certificate("carol", nil))
	hostile(f, func(req *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) []byte {
		s := req.Subject
		s.Organization = append(s.Organization, "system:masters")
		return forgeCert(t, req, s, nil)
	})
	f.reconcile(t, "carol")
	if c := ready(t, f.get(t, "carol")); c.Reason != identityv1alpha1.ReasonTenantRefused {
		t.Fatalf("Ready %+v", c)
	}
	if _, err := f.tn.cs.RbacV1().ClusterRoleBindings().Get(t.Context(), bindingName(f.get(t, "carol")), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatal("bound for a refused certificate")
	}
}

func TestAtkTenantChainSeveralBlocks(t *testing.T) {
	f := newFixture(t, certificate("carol", nil))
	hostile(f, func(req *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) []byte {
		c := forgeCert(t, req, req.Subject, nil)
		return append(append(c, f.tn.caPEM...), []byte("-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n")...)
	})
	f.reconcile(t, "carol")
	// The first block is the certificate; the rest is not kept.
	if c := ready(t, f.get(t, "carol")); c.Status != metav1.ConditionTrue {
		t.Fatalf("Ready %+v", c)
	}
	if s := f.secret(t, "carol-tls"); bytes.Count(s.Data[corev1.TLSCertKey], []byte("BEGIN")) != 1 {
		t.Fatalf("tls.crt holds extra blocks: %s", s.Data[corev1.TLSCertKey])
	}
}

func TestAtkTenantHugeCertificate(t *testing.T) {
	f := newFixture(t, certificate("carol", nil))
	hostile(f, func(req *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) []byte {
		return forgeCert(t, req, req.Subject, []pkix.Extension{{Id: asn1.ObjectIdentifier{1, 2, 3, 4}, Value: bytes.Repeat([]byte{0}, 600<<10)}})
	})
	f.reconcile(t, "carol")
	// Over maxCertificate: refused, no Secret written.
	if c := ready(t, f.get(t, "carol")); c.Reason != identityv1alpha1.ReasonTenantRefused {
		t.Fatalf("Ready %+v", c)
	}
	if err := f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "carol-tls"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a Secret was written for an oversized certificate (%v)", err)
	}
}

func TestAtkTenantDenies(t *testing.T) {
	f := newFixture(t, certificate("carol", nil))
	hostile(f, func(_ *x509.CertificateRequest, csr *certificatesv1.CertificateSigningRequest) []byte {
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Message: "<script>"})
		return nil
	})
	f.reconcile(t, "carol")
	c := ready(t, f.get(t, "carol"))
	if c.Reason != identityv1alpha1.ReasonTenantRefused || strings.Contains(c.Message, "<script>") {
		t.Fatalf("Ready %+v", c)
	}
	if err := f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "carol-tls"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatal("secret written")
	}
}

// A binding the tenant made under the certificate's binding name, not
// labelled as ours, must not be left granting the role after deletion
// (nor adopted without our label).
func TestAtkPreexistingBindingDifferentLabel(t *testing.T) {
	c0 := certificate("carol", nil)
	f := newFixture(t, c0)
	pre := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: bindingName(c0), Labels: map[string]string{LabelCertificate: "someone-else"}},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"}}
	if _, err := f.tn.cs.RbacV1().ClusterRoleBindings().Create(t.Context(), pre, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "carol")
	c := f.get(t, "carol")
	if err := f.cl.Client.Delete(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "carol")
	crb, err := f.tn.cs.RbacV1().ClusterRoleBindings().Get(t.Context(), bindingName(c), metav1.GetOptions{})
	if err == nil && len(crb.Subjects) > 0 && crb.Subjects[0].Name == "carol" {
		t.Fatalf("binding left granting %s to carol after deletion: labels %v", crb.RoleRef.Name, crb.Labels)
	}
}
