package e2e

import (
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
)

// egressServer counts connections and requests, and requests that carried
// the password.
type egressServer struct {
	*httptest.Server
	conns, requests, passwords atomic.Int64
}

// startEgressServer listens on addr (over TLS when tlsServer) and answers
// every request with answer after counting it.
func startEgressServer(t *testing.T, addr string, tlsServer bool, password string, answer http.HandlerFunc) *egressServer {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &egressServer{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.requests.Add(1)
		if strings.Contains(string(b), password) || strings.Contains(r.URL.RawQuery, password) {
			s.passwords.Add(1)
		}
		answer(w, r)
	}))
	s.Listener.Close()
	s.Listener = ln
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	if tlsServer {
		s.StartTLS()
	} else {
		s.Start()
	}
	t.Cleanup(s.Close)
	return s
}

// TestAtprotoRepoEgress: the provider (--allow-private-networks
// 127.0.0.1/32) sends no credential where a workspace member points
// spec.pds.url (R18, R19). Two recorders must never be reached: one on
// 127.0.0.2, outside the allowed range, and one on 127.0.0.1, inside it.
//   - Plain http to the 127.0.0.2 recorder is refused before anything is
//     sent (InsecureURL).
//   - https PDSes on 127.0.0.1 (verified through a caBundle ConfigMap) that
//     answer every request with 307 to the 127.0.0.2 recorder, or with 308
//     to the 127.0.0.1 one, are not followed: the login they received goes
//     no further. At an allowed private address a redirect reads like any
//     other failure there (PDSUnreachable, R17); a public PDS's redirect is
//     PDSRedirected.
//   - https to the 127.0.0.2 recorder's address is refused at dial time
//     (AddressNotAllowed), and so is https to kcp's own address, which the
//     provider reserves although it lies in the allowed range.
//
// No condition message reveals the allowed range.
func TestAtprotoRepoEgress(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	password := "egress-" + env.prefix + "-app-password"
	unauthorized := func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":"AuthenticationRequired"}`, http.StatusUnauthorized)
	}
	outside := startEgressServer(t, "127.0.0.2:0", false, password, unauthorized)
	inside := startEgressServer(t, "127.0.0.1:0", false, password, unauthorized)
	redirector := func(target *egressServer, code int) *egressServer {
		return startEgressServer(t, "127.0.0.1:0", true, password, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target.URL+"/xrpc/com.atproto.server.createSession", code)
		})
	}
	toOutside := redirector(outside, http.StatusTemporaryRedirect)
	toInside := redirector(inside, http.StatusPermanentRedirect)

	c, _ := appWorkspace(ctx, t, env.prefix+"-egress")
	// Every httptest TLS server presents the same certificate.
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: toOutside.Certificate().Raw})
	repos := map[string]struct {
		url    string
		reason string
	}{
		"plain-http":          {outside.URL, atprotov1alpha1.ReasonInsecureURL},
		"redirect-to-outside": {toOutside.URL, atprotov1alpha1.ReasonPDSUnreachable},
		"redirect-to-inside":  {toInside.URL, atprotov1alpha1.ReasonPDSUnreachable},
		"not-allowed":         {"https://" + outside.Listener.Addr().String(), atprotov1alpha1.ReasonAddressNotAllowed},
		"kcp-reserved":        {env.kcp.BaseURL, atprotov1alpha1.ReasonAddressNotAllowed},
	}
	objs := []client.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pds-ca", Namespace: "default"}, Data: map[string]string{"ca.crt": string(caPEM)}},
		passwordSecret("cred", password),
	}
	for name, r := range repos {
		repo := secretRepo(name, "alice.test", "cred")
		repo.Spec.PDS.URL = r.url
		repo.Spec.PDS.CABundle = &atprotov1alpha1.ObjectKeyRef{Kind: "ConfigMap", Name: "pds-ca", Key: "ca.crt"}
		objs = append(objs, repo)
	}
	create(ctx, t, c, objs...)
	// Checked also when a wait below fails.
	defer func() {
		for name, s := range map[string]*egressServer{"127.0.0.2": outside, "127.0.0.1": inside} {
			if conns, reqs, pw := s.conns.Load(), s.requests.Load(), s.passwords.Load(); conns+reqs+pw != 0 {
				t.Errorf("the recorder on %s was reached: %d connections, %d requests, %d with the password", name, conns, reqs, pw)
			}
		}
	}()

	for name, r := range repos {
		repo := waitRepo(ctx, t, c, name, r.reason)
		msg := meta.FindStatusCondition(repo.Status.Conditions, atprotov1alpha1.ConditionReady).Message
		t.Logf("%s: %s: %s", name, r.reason, msg)
		if strings.Contains(msg, framework.AllowedNetworks) || strings.Contains(msg, password) {
			t.Errorf("%s: the condition message reveals the allowed range or the password: %s", name, msg)
		}
	}
	for name, s := range map[string]*egressServer{"307 to 127.0.0.2": toOutside, "308 to 127.0.0.1": toInside} {
		if s.passwords.Load() == 0 {
			t.Errorf("control: the PDS that answers with %s never got the login", name)
		}
	}
}
