package clientcertificate

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	kfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	identityv1alpha1 "github.com/knotless-dev/knotless/apis/identity/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
	"github.com/knotless-dev/knotless/internal/finalize"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/tenantreach"
)

const ws = "ws-alice"

var t0 = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)

// tenant is a fake tenant apiserver whose signer signs approved
// kube-apiserver-client requests with its CA, as a controller manager
// does.
type tenant struct {
	cs      *kfake.Clientset
	caPEM   []byte
	creates atomic.Int32
	// sign is false for a tenant that signs nothing; otherKey signs for a
	// key of its own.
	sign, otherKey bool
	// served is false for a tenant without the certificates API.
	served bool
	// ttl, when set, is the lifetime the signer gives instead of the one
	// asked.
	ttl time.Duration
	now func() time.Time
}

func newTenant(t *testing.T, now func() time.Time) *tenant {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tenant-ca"}, NotBefore: t0.Add(-time.Hour), NotAfter: t0.Add(365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	tn := &tenant{cs: kfake.NewClientset(), caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), sign: true, served: true, now: now}
	var serial atomic.Int64
	tn.cs.PrependReactor("create", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		tn.creates.Add(1)
		if !tn.served {
			return true, nil, apierrors.NewNotFound(certificatesv1.Resource("certificatesigningrequests"), "")
		}
		return false, nil, nil
	})
	tn.cs.PrependReactor("update", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		u := a.(k8stesting.UpdateAction)
		if u.GetSubresource() != "approval" || !tn.sign {
			return false, nil, nil
		}
		csr := u.GetObject().(*certificatesv1.CertificateSigningRequest).DeepCopy()
		block, _ := pem.Decode(csr.Spec.Request)
		req, err := x509.ParseCertificateRequest(block.Bytes)
		if err != nil {
			return true, nil, err
		}
		pub := req.PublicKey
		if tn.otherKey {
			k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			pub = &k.PublicKey
		}
		n, ttl := tn.now(), time.Duration(*csr.Spec.ExpirationSeconds)*time.Second
		if tn.ttl > 0 {
			ttl = tn.ttl
		}
		cert := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1) + 1), Subject: req.Subject, NotBefore: n.Add(-5 * time.Minute),
			NotAfter: n.Add(ttl), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
		der, err := x509.CreateCertificate(rand.Reader, cert, ca, pub, caKey)
		if err != nil {
			return true, nil, err
		}
		csr.Status.Certificate = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		if err := tn.cs.Tracker().Update(certificatesv1.SchemeGroupVersion.WithResource("certificatesigningrequests"), csr, ""); err != nil {
			return true, nil, err
		}
		return true, csr, nil
	})
	return tn
}

type fixture struct {
	r      *Reconciler
	cl     *clustertest.Cluster
	tn     *tenant
	now    time.Time
	tokens atomic.Int32
	cc     *marketv1alpha1.ComputeContract
	// unreachable makes the tenant's client fail.
	unreachable bool
}

func newFixture(t *testing.T, objs ...client.Object) *fixture {
	t.Helper()
	f := &fixture{now: t0}
	f.tn = newTenant(t, func() time.Time { return f.now })
	f.cc = &marketv1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-0", UID: "cc-uid"},
		Spec:   marketv1alpha1.ComputeContractSpec{Side: marketv1alpha1.SideRequester, RequesterDID: "did:plc:alice", BidderDID: "did:plc:acme"},
		Status: marketv1alpha1.ComputeContractStatus{Phase: marketv1alpha1.ContractActive}}
	f.cl = clustertest.NewWithClient(clustertest.NewClientBuilder().WithObjects(append(objs, f.cc)...).Build())
	reaches := &tenantreach.Registry{}
	reaches.Put(ws, f.cc.UID, tenantreach.Reach{Tenant: deal.Tenant{Endpoint: "https://tenant.example:6443", CA: f.tn.caPEM, ServiceID: "did:plc:acme#knotless_tenant_x"},
		Client: func(context.Context, time.Time) (kubernetes.Interface, error) {
			f.tokens.Add(1)
			if f.unreachable {
				return nil, errors.New("connection refused")
			}
			return f.tn.cs, nil
		}})
	f.r = &Reconciler{
		GetCluster: clustertest.Getter(map[string]*clustertest.Cluster{ws: f.cl}), Scheme: f.cl.GetScheme(), Reaches: reaches,
		SignWait: 300 * time.Millisecond, Now: func() time.Time { return f.now },
	}
	return f
}

func certificate(name string, mut func(*identityv1alpha1.ClusterClientCertificateSpec)) *identityv1alpha1.ClusterClientCertificate {
	c := &identityv1alpha1.ClusterClientCertificate{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(name + "-uid"), Generation: 1},
		Spec: identityv1alpha1.ClusterClientCertificateSpec{ContractRef: identityv1alpha1.ContractRef{Name: "web-0"}, User: "carol", Groups: []string{"devs"},
			ClusterRole: "view", Duration: &metav1.Duration{Duration: time.Hour}, SecretName: name + "-tls"}}
	if mut != nil {
		mut(&c.Spec)
	}
	return c
}

// reqIn is the request of the certificate ns/name in the workspace.
func reqIn(ns, name string) mcreconcile.Request {
	return mcreconcile.Request{ClusterName: ws, Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}}
}

func (f *fixture) reconcile(t *testing.T, name string) reconcile.Result {
	t.Helper()
	res, err := f.r.Reconcile(t.Context(), reqIn("default", name))
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func (f *fixture) get(t *testing.T, name string) *identityv1alpha1.ClusterClientCertificate {
	t.Helper()
	c := &identityv1alpha1.ClusterClientCertificate{}
	if err := f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: name}, c); err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *fixture) secret(t *testing.T, name string) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{}
	if err := f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: name}, s); err != nil {
		t.Fatal(err)
	}
	return s
}

func ready(t *testing.T, c *identityv1alpha1.ClusterClientCertificate) *metav1.Condition {
	t.Helper()
	return clustertest.Condition(t, c.Status.Conditions, identityv1alpha1.ConditionReady)
}

func leafOf(t *testing.T, s *corev1.Secret) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(s.Data[corev1.TLSCertKey])
	if block == nil {
		t.Fatal("tls.crt holds no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func TestIssuesIntoAnOwnedSecretAndBinds(t *testing.T) {
	f := newFixture(t, certificate("carol", nil))
	res := f.reconcile(t, "carol")
	c := f.get(t, "carol")
	if cond := ready(t, c); cond.Status != metav1.ConditionTrue || cond.Reason != identityv1alpha1.ReasonIssued {
		t.Fatalf("Ready = %+v", cond)
	}
	s := f.secret(t, "carol-tls")
	if !metav1.IsControlledBy(s, c) || s.Type != corev1.SecretTypeTLS {
		t.Fatalf("the Secret is not the certificate's: owners %v, type %s", s.OwnerReferences, s.Type)
	}
	leaf := leafOf(t, s)
	if leaf.Subject.CommonName != "carol" || strings.Join(leaf.Subject.Organization, ",") != "devs" {
		t.Fatalf("subject %v", leaf.Subject)
	}
	if _, err := tlsPair(s); err != nil {
		t.Fatalf("tls.crt and tls.key are not a pair: %v", err)
	}
	if string(s.Data[KeyCA]) != string(f.tn.caPEM) {
		t.Fatal("ca.crt is not the tenant's CA bundle")
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(s.Data[KeyKubeconfig])
	if err != nil || cfg.Host != "https://tenant.example:6443" || string(cfg.CAData) != string(f.tn.caPEM) || string(cfg.CertData) != string(s.Data[corev1.TLSCertKey]) || string(cfg.KeyData) != string(s.Data[corev1.TLSPrivateKeyKey]) {
		t.Fatalf("kubeconfig: %+v, %v", cfg, err)
	}
	if c.Status.NotAfter == nil || !c.Status.NotAfter.Time.Equal(leaf.NotAfter) || !c.Status.RenewalTime.Time.Equal(leaf.NotAfter.Add(-20*time.Minute)) {
		t.Fatalf("status times %v %v, certificate until %v", c.Status.NotAfter, c.Status.RenewalTime, leaf.NotAfter)
	}
	if want := c.Status.RenewalTime.Sub(f.now); res.RequeueAfter != want {
		t.Fatalf("requeued after %s, want %s (at the renewal)", res.RequeueAfter, want)
	}
	crb, err := f.tn.cs.RbacV1().ClusterRoleBindings().Get(t.Context(), c.Status.Binding, metav1.GetOptions{})
	if err != nil || crb.RoleRef.Name != "view" || len(crb.Subjects) != 1 || crb.Subjects[0].Kind != rbacv1.UserKind || crb.Subjects[0].Name != "carol" {
		t.Fatalf("binding %+v, %v", crb, err)
	}
	if csrs, _ := f.tn.cs.CertificatesV1().CertificateSigningRequests().List(t.Context(), metav1.ListOptions{}); len(csrs.Items) != 0 {
		t.Fatalf("%d CertificateSigningRequests are left on the tenant", len(csrs.Items))
	}
	// Nothing to do until the renewal.
	f.now = f.now.Add(30 * time.Minute)
	f.reconcile(t, "carol")
	if n := f.tn.creates.Load(); n != 1 {
		t.Fatalf("%d requests before the renewal time, want 1", n)
	}
}

func TestRenewsWithANewKey(t *testing.T) {
	f := newFixture(t, certificate("carol", nil))
	f.reconcile(t, "carol")
	before := f.secret(t, "carol-tls")
	f.now = f.get(t, "carol").Status.RenewalTime.Time
	f.reconcile(t, "carol")
	after := f.secret(t, "carol-tls")
	if string(after.Data[corev1.TLSPrivateKeyKey]) == string(before.Data[corev1.TLSPrivateKeyKey]) {
		t.Fatal("the renewal kept the key")
	}
	if !leafOf(t, after).NotAfter.After(leafOf(t, before).NotAfter) {
		t.Fatal("the renewal did not issue a later certificate")
	}
	if c := f.get(t, "carol"); !c.Status.NotAfter.Time.Equal(leafOf(t, after).NotAfter) || ready(t, c).Status != metav1.ConditionTrue {
		t.Fatalf("status after the renewal: %+v", c.Status)
	}
}

// A Secret a member of the workspace changed, or a changed spec, gets a
// new certificate.
func TestReissuesForAChangedSecretOrSpec(t *testing.T) {
	f := newFixture(t, certificate("carol", nil))
	f.reconcile(t, "carol")
	s := f.secret(t, "carol-tls")
	s.Data[corev1.TLSCertKey] = []byte("forged")
	if err := f.cl.Client.Update(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	// Not at once: minValid after the last issue, whatever changed.
	if res := f.reconcile(t, "carol"); res.RequeueAfter != minValid || f.tn.creates.Load() != 1 {
		t.Fatalf("a changed Secret was issued again at once (requeue %s, %d requests)", res.RequeueAfter, f.tn.creates.Load())
	}
	f.now = f.now.Add(minValid)
	f.reconcile(t, "carol")
	if n := f.tn.creates.Load(); n != 2 || leafOf(t, f.secret(t, "carol-tls")).Subject.CommonName != "carol" {
		t.Fatalf("%d requests after the Secret changed, want 2", n)
	}
	f.now = f.now.Add(minValid)
	c := f.get(t, "carol")
	c.Spec.User, c.Spec.ClusterRole = "dave", "edit"
	if err := f.cl.Client.Update(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "carol")
	if leafOf(t, f.secret(t, "carol-tls")).Subject.CommonName != "dave" {
		t.Fatal("a changed user got no new certificate")
	}
	crb, err := f.tn.cs.RbacV1().ClusterRoleBindings().Get(t.Context(), bindingName(c), metav1.GetOptions{})
	if err != nil || crb.RoleRef.Name != "edit" || crb.Subjects[0].Name != "dave" {
		t.Fatalf("binding after the change: %+v, %v", crb, err)
	}
}

func TestUnsupportedTenant(t *testing.T) {
	for name, set := range map[string]func(*tenant){
		"no certificates API": func(tn *tenant) { tn.served = false },
		"no signer":           func(tn *tenant) { tn.sign = false },
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, certificate("carol", nil))
			set(f.tn)
			res := f.reconcile(t, "carol")
			if cond := ready(t, f.get(t, "carol")); cond.Status != metav1.ConditionFalse || cond.Reason != identityv1alpha1.ReasonUnsupported {
				t.Fatalf("Ready = %+v", cond)
			}
			if res.RequeueAfter != maxWait {
				t.Fatalf("asked again after %s, want %s", res.RequeueAfter, maxWait)
			}
			// Not asked again before the wait.
			f.reconcile(t, "carol")
			if n := f.tn.creates.Load(); n != 1 {
				t.Fatalf("%d requests, want 1", n)
			}
			if csrs, _ := f.tn.cs.CertificatesV1().CertificateSigningRequests().List(t.Context(), metav1.ListOptions{}); len(csrs.Items) != 0 {
				t.Fatal("an unsigned request is left on the tenant")
			}
			if crbs, _ := f.tn.cs.RbacV1().ClusterRoleBindings().List(t.Context(), metav1.ListOptions{}); len(crbs.Items) != 0 {
				t.Fatal("a tenant that signs nothing got a binding")
			}
			if err := f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "carol-tls"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
				t.Fatalf("a Secret was written: %v", err)
			}
		})
	}
}

// A signer that answers with a certificate for another key is refused,
// and the refusal backs off.
func TestRefusesACertificateForAnotherKey(t *testing.T) {
	f := newFixture(t, certificate("carol", nil))
	f.tn.otherKey = true
	res := f.reconcile(t, "carol")
	c := f.get(t, "carol")
	if cond := ready(t, c); cond.Reason != identityv1alpha1.ReasonTenantRefused || strings.Contains(cond.Message, "another key") {
		t.Fatalf("Ready = %+v (the tenant's answer stays in the log)", cond)
	}
	if res.RequeueAfter != refusedWait {
		t.Fatalf("tried again after %s, want %s", res.RequeueAfter, refusedWait)
	}
	f.now = f.now.Add(refusedWait)
	if res := f.reconcile(t, "carol"); res.RequeueAfter != 2*refusedWait {
		t.Fatalf("the second wait is %s, want %s", res.RequeueAfter, 2*refusedWait)
	}
}

func TestInvalidSpecs(t *testing.T) {
	for name, mut := range map[string]func(*identityv1alpha1.ClusterClientCertificateSpec){
		"system:masters":   func(s *identityv1alpha1.ClusterClientCertificateSpec) { s.Groups = []string{"system:masters"} },
		"a system user":    func(s *identityv1alpha1.ClusterClientCertificateSpec) { s.User = "system:kube-controller-manager" },
		"the mount's user": func(s *identityv1alpha1.ClusterClientCertificateSpec) { s.User = "did:plc:alice#mount" },
		"a system role":    func(s *identityv1alpha1.ClusterClientCertificateSpec) { s.ClusterRole = "system:node" },
		"a role path":      func(s *identityv1alpha1.ClusterClientCertificateSpec) { s.ClusterRole = "../x" },
		"a week and a day": func(s *identityv1alpha1.ClusterClientCertificateSpec) {
			s.Duration = &metav1.Duration{Duration: 8 * 24 * time.Hour}
		},
		"five minutes": func(s *identityv1alpha1.ClusterClientCertificateSpec) {
			s.Duration = &metav1.Duration{Duration: 5 * time.Minute}
		},
		"renew at once": func(s *identityv1alpha1.ClusterClientCertificateSpec) {
			s.RenewBefore = &metav1.Duration{Duration: 59*time.Minute + 45*time.Second}
		},
		"renew never": func(s *identityv1alpha1.ClusterClientCertificateSpec) {
			s.RenewBefore = &metav1.Duration{Duration: -time.Minute}
		},
		"a control character": func(s *identityv1alpha1.ClusterClientCertificateSpec) { s.User = "carol\n" },
		"a group twice":       func(s *identityv1alpha1.ClusterClientCertificateSpec) { s.Groups = []string{"a", "a"} },
		"not a Secret name":   func(s *identityv1alpha1.ClusterClientCertificateSpec) { s.SecretName = "Carol_TLS" },
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, certificate("carol", mut))
			if res := f.reconcile(t, "carol"); res.RequeueAfter != 0 {
				t.Fatalf("an invalid spec is looked at again after %s", res.RequeueAfter)
			}
			if cond := ready(t, f.get(t, "carol")); cond.Reason != identityv1alpha1.ReasonInvalidSpec {
				t.Fatalf("Ready = %+v", cond)
			}
			if f.tokens.Load() != 0 || f.tn.creates.Load() != 0 {
				t.Fatal("the tenant was reached for an invalid spec")
			}
		})
	}
}

func TestDoesNotOverwriteAnotherSecret(t *testing.T) {
	mine := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "carol-tls"}, Data: map[string][]byte{"k": []byte("v")}}
	f := newFixture(t, certificate("carol", nil), mine)
	f.reconcile(t, "carol")
	if cond := ready(t, f.get(t, "carol")); cond.Reason != identityv1alpha1.ReasonSecretNameTaken {
		t.Fatalf("Ready = %+v", cond)
	}
	if s := f.secret(t, "carol-tls"); string(s.Data["k"]) != "v" || len(s.Data) != 1 || f.tokens.Load() != 0 {
		t.Fatal("another Secret was written, or the tenant reached")
	}
}

// Only the requester's own Active contract of this workspace, mounted, is
// a tenant to issue from.
func TestWaitsForItsOwnActiveMountedContract(t *testing.T) {
	for name, set := range map[string]func(*fixture, *identityv1alpha1.ClusterClientCertificate){
		"no such contract": func(_ *fixture, c *identityv1alpha1.ClusterClientCertificate) { c.Spec.ContractRef.Name = "web-9" },
		"the bidder's side": func(f *fixture, _ *identityv1alpha1.ClusterClientCertificate) {
			f.cc.Spec.Side = marketv1alpha1.SideBidder
		},
		"provisioning": func(f *fixture, _ *identityv1alpha1.ClusterClientCertificate) {
			f.cc.Status.Phase = marketv1alpha1.ContractProvisioning
		},
		"not mounted": func(f *fixture, _ *identityv1alpha1.ClusterClientCertificate) { f.r.Reaches.Delete(ws, f.cc.UID) },
		"another workspace's reach": func(f *fixture, _ *identityv1alpha1.ClusterClientCertificate) {
			reach, _ := f.r.Reaches.Get(ws, f.cc.UID)
			f.r.Reaches.Delete(ws, f.cc.UID)
			f.r.Reaches.Put("ws-mallory", f.cc.UID, reach)
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := certificate("carol", nil)
			f := newFixture(t)
			set(f, c)
			st := f.cc.Status
			if err := f.cl.Client.Update(t.Context(), f.cc); err != nil {
				t.Fatal(err)
			}
			f.cc.Status = st // the update read back the stored status
			if err := f.cl.Client.Status().Update(t.Context(), f.cc); err != nil {
				t.Fatal(err)
			}
			if err := f.cl.Client.Create(t.Context(), c); err != nil {
				t.Fatal(err)
			}
			if res := f.reconcile(t, "carol"); res.RequeueAfter != tenantWait {
				t.Fatalf("looked at again after %s", res.RequeueAfter)
			}
			if cond := ready(t, f.get(t, "carol")); cond.Reason != identityv1alpha1.ReasonTenantNotReady {
				t.Fatalf("Ready = %+v", cond)
			}
			if f.tokens.Load() != 0 {
				t.Fatal("a token was minted")
			}
		})
	}
}

func TestDeleteRemovesTheBindingAndTheSecret(t *testing.T) {
	f := newFixture(t, certificate("carol", nil))
	f.reconcile(t, "carol")
	c := f.get(t, "carol")
	if err := f.cl.Client.Delete(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "carol")
	if _, err := f.tn.cs.RbacV1().ClusterRoleBindings().Get(t.Context(), bindingName(c), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the binding is left: %v", err)
	}
	if err := f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "carol-tls"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the Secret is left: %v", err)
	}
	if err := f.cl.Client.Get(t.Context(), client.ObjectKeyFromObject(c), c); !apierrors.IsNotFound(err) {
		t.Fatalf("the certificate is still there (finalizer): %v", err)
	}
}

// A deleted certificate whose tenant does not answer is held for
// finalize.GiveUpAfter, then let go with an Event.
func TestDeleteGivesUpOnAnUnreachableTenant(t *testing.T) {
	f := newFixture(t, certificate("carol", nil))
	f.reconcile(t, "carol")
	f.unreachable = true
	c := f.get(t, "carol")
	f.now = time.Now() // the fake client stamps the deletion with the wall clock
	if err := f.cl.Client.Delete(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	if res := f.reconcile(t, "carol"); res.RequeueAfter == 0 {
		t.Fatal("an unreachable tenant's binding was given up at once")
	}
	if cond := ready(t, f.get(t, "carol")); cond.Reason != identityv1alpha1.ReasonDeleting || strings.Contains(cond.Message, "refused") {
		t.Fatalf("Ready = %+v", cond)
	}
	f.now = f.now.Add(finalize.GiveUpAfter + time.Minute)
	f.reconcile(t, "carol")
	if err := f.cl.Client.Get(t.Context(), client.ObjectKeyFromObject(c), c); !apierrors.IsNotFound(err) {
		t.Fatalf("the certificate is held: %v", err)
	}
	if got := f.cl.Events.Reasons(); !strings.Contains(strings.Join(got, ","), "BindingLeft") {
		t.Fatalf("events %v", got)
	}
}

func tlsPair(s *corev1.Secret) (any, error) {
	return tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
}

// The binding removed at deletion is the certificate's own, whatever a
// member wrote into its status.
func TestDeleteRemovesOnlyItsOwnBinding(t *testing.T) {
	f := newFixture(t, certificate("carol", nil))
	admin := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "cluster-admin"}, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"}}
	if _, err := f.tn.cs.RbacV1().ClusterRoleBindings().Create(t.Context(), admin, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "carol")
	c := f.get(t, "carol")
	c.Status.Binding = "cluster-admin"
	if err := f.cl.Client.Status().Update(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	if err := f.cl.Client.Delete(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t, "carol")
	if _, err := f.tn.cs.RbacV1().ClusterRoleBindings().Get(t.Context(), "cluster-admin", metav1.GetOptions{}); err != nil {
		t.Fatalf("another binding was deleted: %v", err)
	}
	if _, err := f.tn.cs.RbacV1().ClusterRoleBindings().Get(t.Context(), bindingName(c), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the certificate's own binding is left: %v", err)
	}
}

// A signer that shortens the lifetime is renewed two thirds into what it
// gave; one that dates the certificate outside what was asked is refused.
func TestSignerLifetimes(t *testing.T) {
	f := newFixture(t, certificate("carol", nil))
	f.tn.ttl = 30 * time.Minute // asked: an hour, renewBefore 20m
	f.reconcile(t, "carol")
	c := f.get(t, "carol")
	if want := f.now.Add(20 * time.Minute); !c.Status.RenewalTime.Time.Equal(want) {
		t.Fatalf("renewal at %s, want %s (two thirds of 30m)", c.Status.RenewalTime.Time, want)
	}
	for name, ttl := range map[string]time.Duration{"longer than asked": 2 * time.Hour, "ending at once": 10 * time.Second} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, certificate("carol", nil))
			f.tn.ttl = ttl
			f.reconcile(t, "carol")
			if cond := ready(t, f.get(t, "carol")); cond.Reason != identityv1alpha1.ReasonTenantRefused {
				t.Fatalf("Ready = %+v", cond)
			}
			if err := f.cl.Client.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "carol-tls"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
				t.Fatalf("a Secret was written: %v", err)
			}
		})
	}
}

// A certificate still valid stays Ready while its tenant's reach is not
// published (a provider that started again), and is not issued anew.
func TestValidCertificateStaysReadyWhileTheReachIsMissing(t *testing.T) {
	f := newFixture(t, certificate("carol", nil))
	f.reconcile(t, "carol")
	reach, _ := f.r.Reaches.Get(ws, f.cc.UID)
	f.r.Reaches.Delete(ws, f.cc.UID)
	f.r.issued = sync.Map{} // a new provider: only the status is known
	f.now = f.now.Add(time.Minute)
	f.reconcile(t, "carol")
	if cond := ready(t, f.get(t, "carol")); cond.Status != metav1.ConditionTrue || f.tn.creates.Load() != 1 {
		t.Fatalf("Ready = %+v after %d requests", cond, f.tn.creates.Load())
	}
	// At the renewal it waits for the reach.
	f.now = f.get(t, "carol").Status.RenewalTime.Time
	if res := f.reconcile(t, "carol"); res.RequeueAfter != tenantWait || ready(t, f.get(t, "carol")).Reason != identityv1alpha1.ReasonTenantNotReady {
		t.Fatalf("at the renewal without a reach: requeue %s, %+v", res.RequeueAfter, ready(t, f.get(t, "carol")))
	}
	f.r.Reaches.Put(ws, f.cc.UID, reach)
	f.reconcile(t, "carol")
	if f.tn.creates.Load() != 2 || ready(t, f.get(t, "carol")).Status != metav1.ConditionTrue {
		t.Fatal("not renewed once the reach is back")
	}
}
