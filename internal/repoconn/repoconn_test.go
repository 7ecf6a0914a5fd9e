package repoconn

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/pds/pdstest"
	"github.com/knotless-dev/knotless/internal/vault"
)

const (
	password = "app-password-must-stay-home"
	ns       = "shop"
	cluster  = "2x7uf0bml0q9ms3b"
)

// local allows the loopback address the test servers listen on.
var local = netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, nil)

// recorder is an HTTP server that records every request and answers it
// with answer (401 AuthenticationRequired by default).
type recorder struct {
	*httptest.Server
	answer func(w http.ResponseWriter, r *http.Request)

	mu     sync.Mutex
	bodies []string
}

func newRecorder(t *testing.T, tlsServer bool, answer func(w http.ResponseWriter, r *http.Request)) *recorder {
	t.Helper()
	rec := &recorder{answer: answer}
	if rec.answer == nil {
		rec.answer = func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"error":"AuthenticationRequired","message":"Invalid identifier or password"}`)
		}
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.bodies = append(rec.bodies, r.Method+" "+r.URL.Path+" "+string(b))
		rec.mu.Unlock()
		rec.answer(w, r)
	})
	if tlsServer {
		rec.Server = httptest.NewTLSServer(h)
	} else {
		rec.Server = httptest.NewServer(h)
	}
	t.Cleanup(rec.Close)
	return rec
}

// requests returns what the server received so far.
func (r *recorder) requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bodies...)
}

// sawPassword reports whether any request carried the password.
func (r *recorder) sawPassword() bool {
	for _, b := range r.requests() {
		if strings.Contains(b, password) {
			return true
		}
	}
	return false
}

// caPEM is the PEM of the test server's certificate.
func (r *recorder) caPEM() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate().Raw}))
}

// workspace is a fake client of one workspace holding the repo's Secret
// and, for https servers, the CA bundle ConfigMap.
func workspace(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pds", Namespace: ns}, Data: map[string][]byte{"password": []byte(password)}})
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
}

func newRepo(url string) *atprotov1alpha1.AtprotoRepo {
	return &atprotov1alpha1.AtprotoRepo{
		ObjectMeta: metav1.ObjectMeta{Name: "alice", Namespace: ns, UID: "uid-alice"},
		Spec: atprotov1alpha1.AtprotoRepoSpec{
			PDS: atprotov1alpha1.PDS{URL: url},
			Credential: atprotov1alpha1.Credential{
				Identifier:   "alice.test",
				SecretKeyRef: &atprotov1alpha1.SecretKeyRef{Name: "pds", Key: "password"},
			},
		},
	}
}

// reason connects repo and returns the condition reason and message of the
// failure.
func reason(t *testing.T, p *Pool, c client.Client, repo *atprotov1alpha1.AtprotoRepo) (string, string) {
	t.Helper()
	_, err := p.Connect(context.Background(), c, cluster, repo)
	var re *conditions.Error
	if !errors.As(err, &re) {
		t.Fatalf("Connect(%s) = %v, want a *conditions.Error", repo.Spec.PDS.URL, err)
	}
	if strings.Contains(re.Message, password) {
		t.Fatalf("condition message carries the password: %s", re.Message)
	}
	return re.Reason, re.Message
}

// TestConnectRefusesPlainHTTPBeforeReadingTheCredential: plain http to a
// host the operator did not allow is refused with InsecureURL before the
// credential is read (a Vault reference without Vault would otherwise be
// VaultUnavailable) and before any request; plain http to an allowed
// host works.
func TestConnectRefusesPlainHTTPBeforeReadingTheCredential(t *testing.T) {
	rec := newRecorder(t, false, nil)
	c := workspace(t)
	vaultRepo := newRepo(rec.URL)
	vaultRepo.Spec.Credential.SecretKeyRef = nil
	vaultRepo.Spec.Credential.Vault = &atprotov1alpha1.VaultKeyRef{Mount: "secret", Path: "knotless/" + cluster + "/" + ns + "/pds", Key: "password"}
	for _, tc := range []struct {
		name   string
		policy *netpolicy.Policy
		repo   *atprotov1alpha1.AtprotoRepo
	}{
		{"no policy", nil, newRepo(rec.URL)},
		{"no policy, Vault credential", nil, vaultRepo},
		{"another range allowed", netpolicy.New([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, nil), newRepo(rec.URL)},
		{"public name", local, newRepo("http://pds.example.com")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, msg := reason(t, &Pool{Directory: pdstest.Directory("http://localhost"), Policy: tc.policy}, c, tc.repo)
			if got != atprotov1alpha1.ReasonInsecureURL {
				t.Fatalf("reason %s (%s), want %s", got, msg, atprotov1alpha1.ReasonInsecureURL)
			}
			if strings.Contains(msg, "10.0.0.0") || strings.Contains(msg, "127.0.0.1/32") {
				t.Fatalf("message reveals the operator's ranges: %s", msg)
			}
		})
	}
	if got := rec.requests(); len(got) != 0 {
		t.Fatalf("refused URLs reached the server: %q", got)
	}

	// Control: the operator allowed 127.0.0.1, so plain http is used.
	if got, msg := reason(t, &Pool{Directory: pdstest.Directory("http://localhost"), Policy: local}, c, newRepo(rec.URL)); got != atprotov1alpha1.ReasonAuthenticationFailed {
		t.Fatalf("allowed host: reason %s (%s), want AuthenticationFailed", got, msg)
	}
	if !rec.sawPassword() {
		t.Fatal("control: the allowed server did not get the login")
	}
}

// TestConnectNeverFollowsRedirects: a PDS that answers createSession with
// a redirect to another (allowed) server is not followed: the other
// server receives nothing, in particular not the password. At a private
// address (all the test has) the redirect reads like any failure there
// (PDSUnreachable, R17); a public PDS's is PDSRedirected (Classify).
func TestConnectNeverFollowsRedirects(t *testing.T) {
	target := newRecorder(t, false, nil)
	for _, code := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			for _, tlsServer := range []bool{false, true} {
				pdsSrv := newRecorder(t, tlsServer, func(w http.ResponseWriter, r *http.Request) {
					http.Redirect(w, r, target.URL+r.URL.Path, code)
				})
				repo := newRepo(pdsSrv.URL)
				var objs []client.Object
				if tlsServer {
					objs = append(objs, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "ca", Namespace: ns}, Data: map[string]string{"ca.crt": pdsSrv.caPEM()}})
					repo.Spec.PDS.CABundle = &atprotov1alpha1.ObjectKeyRef{Kind: "ConfigMap", Name: "ca", Key: "ca.crt"}
				}
				got, msg := reason(t, &Pool{Directory: pdstest.Directory("http://localhost"), Policy: local}, workspace(t, objs...), repo)
				if got != atprotov1alpha1.ReasonPDSUnreachable || msg != privateUnreachable {
					t.Fatalf("tls=%v: reason %s (%s), want %s: %s", tlsServer, got, msg, atprotov1alpha1.ReasonPDSUnreachable, privateUnreachable)
				}
				if len(pdsSrv.requests()) != 1 {
					t.Fatalf("tls=%v: the PDS got %d requests, want the one login", tlsServer, len(pdsSrv.requests()))
				}
			}
			if got := target.requests(); len(got) != 0 {
				t.Fatalf("the redirect was followed: the target got %q", got)
			}
		})
	}
}

// TestConnectAddressNotAllowed: a PDS whose address the policy refuses (not
// in an allowed range, or reserved) gets AddressNotAllowed, not
// PDSUnreachable, and no request.
func TestConnectAddressNotAllowed(t *testing.T) {
	srv := newRecorder(t, true, nil)
	addr := netip.MustParseAddrPort(srv.Listener.Addr().String())
	c := workspace(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "ca", Namespace: ns}, Data: map[string]string{"ca.crt": srv.caPEM()}})
	repo := newRepo(srv.URL)
	repo.Spec.PDS.CABundle = &atprotov1alpha1.ObjectKeyRef{Kind: "ConfigMap", Name: "ca", Key: "ca.crt"}
	for _, tc := range []struct {
		name   string
		policy *netpolicy.Policy
	}{
		{"public addresses only", nil},
		{"another range allowed", netpolicy.New([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, nil)},
		{"reserved address", netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, []netip.AddrPort{addr})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, msg := reason(t, &Pool{Directory: pdstest.Directory("http://localhost"), Policy: tc.policy}, c, repo)
			if got != atprotov1alpha1.ReasonAddressNotAllowed {
				t.Fatalf("reason %s (%s), want %s", got, msg, atprotov1alpha1.ReasonAddressNotAllowed)
			}
			if strings.Contains(msg, "10.0.0.0") || strings.Contains(msg, "127.0.0.1/32") {
				t.Fatalf("message reveals the operator's ranges: %s", msg)
			}
		})
	}
	if got := srv.requests(); len(got) != 0 {
		t.Fatalf("a refused address got requests: %q", got)
	}
	// Control: allowed, the server is reached over https.
	if got, msg := reason(t, &Pool{Directory: pdstest.Directory("http://localhost"), Policy: local}, c, repo); got != atprotov1alpha1.ReasonAuthenticationFailed {
		t.Fatalf("allowed address: reason %s (%s), want AuthenticationFailed", got, msg)
	}
}

// TestVaultReferenceIsScopedToTheNamespace: a repo reads Vault only below
// <prefix>/<logical cluster>/<its namespace>/; a path of another namespace
// of the same workspace is refused before any request to Vault.
func TestVaultReferenceIsScopedToTheNamespace(t *testing.T) {
	var mu sync.Mutex
	var reads []string
	vs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/auth/token/lookup-self" {
			_, _ = io.WriteString(w, `{"data":{"ttl":0,"renewable":false}}`)
			return
		}
		mu.Lock()
		reads = append(reads, r.URL.Path)
		mu.Unlock()
		_, _ = fmt.Fprintf(w, `{"data":{"data":{"password":%q},"metadata":{"version":1}}}`, password)
	}))
	t.Cleanup(vs.Close)
	vc, err := vault.New(vault.Config{Address: vs.URL, Token: "static-token"})
	if err != nil {
		t.Fatal(err)
	}
	pdsSrv := newRecorder(t, false, nil)
	p := &Pool{Vault: vc, Policy: local, Directory: pdstest.Directory("http://localhost")}
	c := workspace(t)
	for _, tc := range []struct {
		path, want string
	}{
		{"knotless/" + cluster + "/other/pds", atprotov1alpha1.ReasonCredentialNotFound},
		{"knotless/" + cluster + "/pds", atprotov1alpha1.ReasonCredentialNotFound},
		{"knotless/" + cluster + "/" + ns + "/pds", atprotov1alpha1.ReasonAuthenticationFailed},
	} {
		repo := newRepo(pdsSrv.URL)
		repo.Spec.Credential.SecretKeyRef = nil
		repo.Spec.Credential.Vault = &atprotov1alpha1.VaultKeyRef{Mount: "secret", Path: tc.path, Key: "password"}
		if got, msg := reason(t, p, c, repo); got != tc.want {
			t.Fatalf("%s: reason %s (%s), want %s", tc.path, got, msg, tc.want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"/v1/secret/data/knotless/" + cluster + "/" + ns + "/pds"}; fmt.Sprint(reads) != fmt.Sprint(want) {
		t.Fatalf("Vault reads %q, want only %q", reads, want)
	}
}

// A repo's account counts only when its DID document, resolved through the
// PLC directory, names the repo's PDS (R20): otherwise DIDMismatch, or
// DIDUnresolvable/ResponseTooLarge when the document cannot be read
// (R21); no message names the PLC directory, which is the operator's.
func TestConnectChecksTheAccountsDIDDocument(t *testing.T) {
	f := pdstest.New(t)
	c := workspace(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cred"}, Data: map[string][]byte{"password": []byte(pdstest.Password)}})
	var doc atomic.Value // the PLC's answer
	plc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, doc.Load().(string))
	}))
	t.Cleanup(plc.Close)
	document := func(pdsURL string) string {
		return `{"id":"` + pdstest.DID + `","alsoKnownAs":["at://` + pdstest.Handle + `"],"service":[{"id":"#atproto_pds","type":"AtprotoPersonalDataServer","serviceEndpoint":"` + pdsURL + `"}]}`
	}
	for _, tc := range []struct {
		doc, want string
	}{
		{document("https://pds.elsewhere.example"), atprotov1alpha1.ReasonDIDMismatch},
		{document("http://localhost:2583"), atprotov1alpha1.ReasonDIDMismatch}, // another port of the loopback host (issue 29)
		{`{"id":"` + pdstest.DID + `","alsoKnownAs":["` + strings.Repeat("a", pds.MaxDIDDocument) + `"]}`, atprotov1alpha1.ReasonResponseTooLarge},
		{`not a document`, atprotov1alpha1.ReasonDIDUnresolvable},
		{document(pdstest.Localhost(f.URL())), ""},
	} {
		doc.Store(tc.doc)
		p := &Pool{Policy: local, Directory: pds.NewDirectory(plc.URL, local, 5*time.Second, time.Hour)}
		repo := newRepo(f.URL())
		repo.Spec.Credential.SecretKeyRef.Name = "cred"
		_, err := p.Connect(context.Background(), c, cluster, repo)
		var ce *conditions.Error
		switch {
		case tc.want == "" && err != nil:
			t.Fatalf("honest document: %v", err)
		case tc.want == "":
		case !errors.As(err, &ce) || ce.Reason != tc.want:
			t.Fatalf("error %v, want reason %s", err, tc.want)
		case strings.Contains(ce.Message, plc.URL) || strings.Contains(ce.Message, strings.TrimPrefix(plc.URL, "http://")):
			t.Fatalf("message names the PLC directory: %s", ce.Message)
		}
	}
}

// TestSecretReferenceIsScopedToTheNamespace (R22): a repo's secretKeyRef
// names a Secret of the repo's own namespace only. A Secret of that name
// in another namespace of the workspace is never read: the repo is
// CredentialNotFound, the message does not name the other namespace, and
// the PDS gets no request; the same Secret in the repo's namespace is
// used (the control).
func TestSecretReferenceIsScopedToTheNamespace(t *testing.T) {
	const foreign = "password-of-another-namespace"
	srv := newRecorder(t, false, nil)
	secret := func(namespace string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "foreign", Namespace: namespace}, Data: map[string][]byte{"password": []byte(foreign)}}
	}
	repo := newRepo(srv.URL)
	repo.Spec.Credential.SecretKeyRef.Name = "foreign"
	p := &Pool{Directory: pdstest.Directory("http://localhost"), Policy: local}
	got, msg := reason(t, p, workspace(t, secret("other")), repo)
	if got != atprotov1alpha1.ReasonCredentialNotFound || strings.Contains(msg, "other") {
		t.Fatalf("reason %s (%s), want CredentialNotFound naming no other namespace", got, msg)
	}
	if reqs := srv.requests(); len(reqs) != 0 {
		t.Fatalf("the PDS got requests: %q", reqs)
	}
	if got, msg := reason(t, p, workspace(t, secret(ns)), repo); got != atprotov1alpha1.ReasonAuthenticationFailed {
		t.Fatalf("the repo's own namespace: reason %s (%s), want AuthenticationFailed", got, msg)
	}
	if reqs := srv.requests(); len(reqs) == 0 || !strings.Contains(strings.Join(reqs, "\n"), foreign) {
		t.Fatalf("the control's password did not reach the PDS: %q", reqs)
	}
}
