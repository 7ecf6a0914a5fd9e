package clientcertificate

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	certificatesclient "k8s.io/client-go/kubernetes/typed/certificates/v1"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clientcmdlatest "k8s.io/client-go/tools/clientcmd/api/latest"
	"k8s.io/utils/ptr"

	identityv1alpha1 "github.com/knotless-dev/knotless/apis/identity/v1alpha1"
)

// Keys of the Secret a ClusterClientCertificate writes, besides tls.crt
// and tls.key.
const (
	KeyCA         = "ca.crt"
	KeyKubeconfig = "kubeconfig"
)

// LabelCertificate labels the CertificateSigningRequests and the
// ClusterRoleBinding knotless makes on a tenant for a
// ClusterClientCertificate: its UID.
const LabelCertificate = "identity.knotless.dev/certificate-uid"

// maxCertificate bounds the certificate a tenant's signer may issue (a
// client certificate is about 1 KiB; the Secret it goes into must stay
// far below kcp's 1 MiB).
const maxCertificate = 64 << 10

// leaf is the first certificate of a PEM bundle, nil when there is none.
func leaf(bundle []byte) *x509.Certificate {
	block, _ := pem.Decode(bundle)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil
	}
	return cert
}

// skew is how far a tenant's clock may be from the provider's.
const skew = 5 * time.Minute

// errUnsupported: the tenant signs no client certificates (it serves no
// certificates API, or left the request unsigned for signWait).
var errUnsupported = errors.New("the tenant signs no client certificates")

// issued is a certificate the tenant issued, with its key.
type issued struct {
	cert     *x509.Certificate
	certPEM  []byte
	keyPEM   []byte
	notAfter time.Time
}

// issue has the tenant (cs) issue a certificate for w with a new key: a
// CertificateSigningRequest for kubernetes.io/kube-apiserver-client that
// the requester's side approves as the tenant's admin and the tenant's
// controller manager signs, within signWait. The request is deleted once
// answered. errUnsupported when the tenant serves no such API or does
// not sign.
func issue(ctx context.Context, cs kubernetes.Interface, ccert *identityv1alpha1.ClusterClientCertificate, w wanted, now time.Time, signWait time.Duration) (*issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: w.User, Organization: w.Groups}}, key)
	if err != nil {
		return nil, err
	}
	csrs := cs.CertificatesV1().CertificateSigningRequests()
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "knotless-" + string(ccert.UID) + "-" + strconv.FormatInt(now.UnixNano(), 36), Labels: map[string]string{LabelCertificate: string(ccert.UID)}},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:           pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName:        certificatesv1.KubeAPIServerClientSignerName,
			Usages:            []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
			ExpirationSeconds: ptr.To(int32(w.duration / time.Second)),
		},
	}
	created, err := csrs.Create(ctx, csr, metav1.CreateOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w: it does not serve CertificateSigningRequests", errUnsupported)
	}
	if err != nil {
		return nil, fmt.Errorf("creating the CertificateSigningRequest: %w", err)
	}
	defer func() {
		// Answered or not, the request goes: the certificate is in the
		// Secret, and an unsigned request must not be signed later.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = csrs.Delete(dctx, created.Name, metav1.DeleteOptions{})
	}()
	created.Status.Conditions = append(created.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "KnotlessClusterClientCertificate",
		Message: "approved by the requester's side for ClusterClientCertificate " + ccert.Namespace + "/" + ccert.Name,
	})
	if _, err := csrs.UpdateApproval(ctx, created.Name, created, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("approving the CertificateSigningRequest: %w", err)
	}
	cert, block, err := awaitSigned(ctx, csrs, created.Name, signWait)
	if err != nil {
		return nil, err
	}
	if pub, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, errors.New("the tenant's signer issued a certificate for another key")
	}
	if cert.Subject.CommonName != w.User || !slices.Equal(cert.Subject.Organization, w.Groups) {
		return nil, errors.New("the tenant's signer issued a certificate for another subject")
	}
	// A signer may shorten the lifetime, not stretch it or date it
	// elsewhere.
	if cert.NotAfter.Before(now.Add(2*minValid)) || cert.NotAfter.After(now.Add(w.duration+skew)) || cert.NotBefore.After(now.Add(skew)) {
		return nil, fmt.Errorf("the tenant's signer issued a certificate valid from %s to %s, not within what was asked", cert.NotBefore, cert.NotAfter)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &issued{cert: cert, certPEM: pem.EncodeToMemory(block), keyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), notAfter: cert.NotAfter}, nil
}

// secretData is what the Secret of a certificate holds: the certificate,
// its key, the tenant's CA bundle and a kubeconfig for the tenant's
// endpoint with all three inline.
func secretData(endpoint string, ca []byte, is *issued, user string) (map[string][]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["tenant"] = &clientcmdapi.Cluster{Server: endpoint, CertificateAuthorityData: ca}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: is.certPEM, ClientKeyData: is.keyPEM}
	cfg.Contexts["tenant"] = &clientcmdapi.Context{Cluster: "tenant", AuthInfo: user}
	cfg.CurrentContext = "tenant"
	kubeconfig, err := encode(cfg)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{corev1.TLSCertKey: is.certPEM, corev1.TLSPrivateKeyKey: is.keyPEM, KeyCA: ca, KeyKubeconfig: kubeconfig}, nil
}

// encode writes a kubeconfig as YAML.
func encode(cfg *clientcmdapi.Config) ([]byte, error) {
	var buf bytes.Buffer
	if err := clientcmdlatest.Codec.Encode(cfg, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// dataKey names what a certificate's Secret must hold for spec w and the
// contract's UID: the SHA-256 of both and of every value of data ("sha256:<hex>", status.
// issued). A Secret that a member of the workspace changed, or a spec
// that changed, no longer matches: a new certificate is issued.
func dataKey(w wanted, contract types.UID, data map[string][]byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%q\n%s\n%s\n%s\n%s\n%s\n", w.User, w.Groups, w.ClusterRole, w.duration, w.renewBefore, w.ContractRef.Name, contract)
	for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey, KeyCA, KeyKubeconfig} {
		fmt.Fprintf(h, "%s=%d:%s\n", k, len(data[k]), data[k])
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// bindingName is the ClusterRoleBinding on the tenant of a certificate.
func bindingName(ccert *identityv1alpha1.ClusterClientCertificate) string {
	return "knotless:certificate:" + string(ccert.UID)
}

// bind binds spec.clusterRole to spec.user on the tenant (when set), or
// removes the binding (when not), and returns the binding's name ("" for
// none).
func bind(ctx context.Context, cs kubernetes.Interface, ccert *identityv1alpha1.ClusterClientCertificate, w wanted) (string, error) {
	name := bindingName(ccert)
	crbs := cs.RbacV1().ClusterRoleBindings()
	if w.ClusterRole == "" {
		return "", unbind(ctx, cs, name)
	}
	want := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelCertificate: string(ccert.UID)}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: w.ClusterRole},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: w.User}},
	}
	got, err := crbs.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = crbs.Create(ctx, want, metav1.CreateOptions{})
		return name, err
	case err != nil:
		return "", err
	case got.RoleRef != want.RoleRef || got.Labels[LabelCertificate] != string(ccert.UID):
		// A binding's role cannot change, and one of the name that is not
		// labelled for this certificate (the tenant's own) is not taken
		// over as it is: it is made again.
		if err := unbind(ctx, cs, name); err != nil {
			return "", err
		}
		_, err = crbs.Create(ctx, want, metav1.CreateOptions{})
		return name, err
	case !slices.Equal(got.Subjects, want.Subjects):
		got.Subjects = want.Subjects
		_, err = crbs.Update(ctx, got, metav1.UpdateOptions{})
		return name, err
	}
	return name, nil
}

// unbind deletes the binding name from the tenant, if it is there.
func unbind(ctx context.Context, cs kubernetes.Interface, name string) error {
	if err := cs.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// cleanTenant deletes the certificate's binding, when it is the one made
// for it (labelled with its UID, deleted with that object's UID as a
// precondition), and its requests left on the tenant.
func cleanTenant(ctx context.Context, cs kubernetes.Interface, ccert *identityv1alpha1.ClusterClientCertificate) error {
	crbs := cs.RbacV1().ClusterRoleBindings()
	crb, err := crbs.Get(ctx, bindingName(ccert), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return err
	case crb.Labels[LabelCertificate] == string(ccert.UID):
		if err := crbs.Delete(ctx, crb.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &crb.UID}}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	err = cs.CertificatesV1().CertificateSigningRequests().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: LabelCertificate + "=" + string(ccert.UID)})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// awaitSigned waits up to signWait for the tenant to sign the request
// name, and returns the certificate it issued; errUnsupported when it did
// not sign in time. The requests use ctx, whose deadline is the whole
// issue's: a request is never cut short by the wait for the signature.
func awaitSigned(ctx context.Context, csrs certificatesclient.CertificateSigningRequestInterface, name string, signWait time.Duration) (*x509.Certificate, *pem.Block, error) {
	var signed []byte
	errNotSigned := fmt.Errorf("%w: the request was not signed within %s", errUnsupported, signWait)
	until := time.Now().Add(signWait)
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if time.Now().After(until) {
			return false, errNotSigned
		}
		got, err := csrs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range got.Status.Conditions {
			if (c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed) && c.Status == corev1.ConditionTrue {
				return false, fmt.Errorf("the tenant's signer answered %s: %s", c.Type, c.Message)
			}
		}
		signed = got.Status.Certificate
		return len(signed) > 0, nil
	})
	if err != nil {
		return nil, nil, err
	}
	if len(signed) > maxCertificate {
		return nil, nil, fmt.Errorf("the tenant's signer issued %d bytes, more than %d", len(signed), maxCertificate)
	}
	block, _ := pem.Decode(signed)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, nil, errors.New("the tenant's signer issued no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("the tenant's signer issued an unreadable certificate: %w", err)
	}
	return cert, block, nil
}
