package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gatewayv1alpha1 "github.com/knotless-dev/knotless/apis/gateway/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/gateway"
	"github.com/knotless-dev/knotless/internal/lexicon"
)

// gatewayParts are an agent's gateway: where it listens and the CA of
// its certificate (for *.gw.test).
type gatewayParts struct {
	addr    string
	sshAddr string
	pool    *x509.CertPool
}

// gatewayAgent returns the agent flags of a gateway on a free loopback
// port with a certificate for *.gw.test from the suite's gateway CA,
// which the providers trust, and of an SSH gateway on another.
func gatewayAgent(t *testing.T) ([]string, gatewayParts) {
	t.Helper()
	cert, err := env.gatewayCA.Issue("gateway", "*.gw.test")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := framework.PEMs(cert)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	sshPort, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(env.gatewayCA.Cert)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	sshAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sshPort))
	return []string{"--gateway-address", addr, "--gateway-cert-file", certFile, "--gateway-key-file", keyFile,
		"--gateway-dir", filepath.Join(dir, "state"), "--ssh-address", sshAddr, "--ssh-dir", filepath.Join(dir, "ssh"),
		"--ssh-key-ttl", sshKeyTTL.String()}, gatewayParts{addr: addr, sshAddr: sshAddr, pool: pool}
}

// client reaches any hostname at the gateway's address (curl --resolve),
// verifying its certificate, following no redirect.
func (g gatewayParts) client() *http.Client {
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, g.addr)
	}
	return &http.Client{Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport: &http.Transport{DialContext: dial, ForceAttemptHTTP2: true,
			TLSClientConfig: &tls.Config{RootCAs: g.pool, MinVersion: tls.VersionTLS12}}}
}

// get is host's answer to GET path through the gateway: its status,
// its reason header and its body (4 KiB at most).
func (g gatewayParts) get(ctx context.Context, hc *http.Client, host, path string) (int, string, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+host+path, nil)
	if err != nil {
		return 0, "", "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, resp.Header.Get(gateway.ReasonHeader), string(b), nil
}

// putAssociation writes acct's association record of host for lease to
// Service ns/name:port as any ATProto client would (a third party's
// claim: the requester's own go through a Gateway).
func putAssociation(ctx context.Context, t *testing.T, acct *framework.Account, host, lease, cid, name string) {
	t.Helper()
	in := map[string]any{"repo": acct.DID, "collection": lexicon.GatewayAssociation, "rkey": host, "record": map[string]any{
		"$type": lexicon.GatewayAssociation, "hostname": host, "lease": map[string]any{"uri": lease, "cid": cid},
		"service": map[string]any{"namespace": "default", "name": name, "port": 80}, "createdAt": time.Now().UTC().Format(time.RFC3339),
	}}
	if err := env.pds.XRPC(ctx, "com.atproto.repo.putRecord", acct.AccessJWT, nil, in, nil); err != nil {
		t.Fatalf("%s's association of %s: %v", acct.Handle, host, err)
	}
}

// newGateway makes Gateway name of the contract for host to Service
// default/service:80 in the requester's workspace.
func newGateway(ctx context.Context, t *testing.T, c client.Client, name, contract, host, service string) {
	t.Helper()
	create(ctx, t, c, &gatewayv1alpha1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: gatewayv1alpha1.GatewaySpec{ContractRef: gatewayv1alpha1.ContractRef{Name: contract}, Hostname: host,
			Service: gatewayv1alpha1.ServiceRef{Namespace: "default", Name: service, Port: 80}}})
}

// gatewayIs waits until Gateway name's Ready condition has reason and
// returns the Gateway.
func gatewayIs(ctx context.Context, t *testing.T, c client.Client, name, reason string) *gatewayv1alpha1.Gateway {
	t.Helper()
	g := &gatewayv1alpha1.Gateway{}
	if err := framework.Eventually(ctx, time.Minute, "Gateway "+name+" "+reason, func(ctx context.Context) (bool, string, error) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, g); err != nil {
			return false, err.Error(), nil
		}
		cond := meta.FindStatusCondition(g.Status.Conditions, gatewayv1alpha1.ConditionReady)
		if cond == nil {
			return false, "no Ready condition", nil
		}
		return cond.Reason == reason, cond.Reason + ": " + cond.Message, nil
	}); err != nil {
		t.Fatal(err)
	}
	return g
}

// gatewayOnKindTenant: the Deployment "limits" of the kind tenant gets a
// Service, and the requester (buyer) makes a Gateway of shop.gw.test for
// it: knotless publishes the association record in the buyer's repo,
// the bidder's agent serves the hostname over TLS (HTTP/2) and answers
// /.well-known/atproto-did with the buyer's DID, and the Gateway is
// Ready with its URL and the gateway's address. Not Ready, with the
// reason: a Gateway whose Service does not exist (the gateway 503s), a
// hostname the gateway's certificate does not cover, a second Gateway of
// the same hostname (HostnameTaken). Not served: a record of another DID
// naming the lease. Deleting the Gateway deletes the record and the
// route (404). Figures: Gateway created -> first answer and -> Ready;
// p50/p99 and req/s through the gateway against the same pod through a
// NodePort on the node's address; Gateway deleted -> 404.
func gatewayOnKindTenant(ctx context.Context, t *testing.T, d *deal, rc *marketv1alpha1.ComputeContract, cs kubernetes.Interface, node string, gw gatewayParts) {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "limits", Namespace: "default"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "limits"},
		Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}}}
	svc, err := cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rc.Status.Records.Lease == nil {
		t.Fatal("the requester's contract names no lease")
	}
	lease, cid := rc.Status.Records.Lease.URI, rc.Status.Records.Lease.CID
	buyer := d.accounts["buyer"]
	hc := gw.client()
	start := time.Now()
	newGateway(ctx, t, d.app, "shop", rc.Name, "shop.gw.test", "limits")
	newGateway(ctx, t, d.app, "nothing", rc.Name, "nothing.gw.test", "nothing")
	newGateway(ctx, t, d.app, "elsewhere", rc.Name, "shop.elsewhere.test", "limits")
	// Another DID's record naming the buyer's lease.
	putAssociation(ctx, t, d.accounts["beta"], "stolen.gw.test", lease, cid, "limits")
	if err := framework.Eventually(ctx, time.Minute, "shop.gw.test answered by the pod through the gateway", func(ctx context.Context) (bool, string, error) {
		code, reason, body, err := gw.get(ctx, hc, "shop.gw.test", "/")
		if err != nil {
			return false, err.Error(), nil
		}
		return code == http.StatusOK && strings.Contains(body, `"memoryLimit":"67108864"`), fmt.Sprintf("%d %s %q", code, reason, body), nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE gateway: Gateway created -> first answer through the gateway: %s", time.Since(start).Round(time.Millisecond))
	g := gatewayIs(ctx, t, d.app, "shop", gatewayv1alpha1.ReasonServing)
	t.Logf("FIGURE gateway: Gateway created -> Ready (probed through the gateway): %s", time.Since(start).Round(time.Millisecond))
	_, port, _ := net.SplitHostPort(gw.addr)
	wantURI := "at://" + buyer.DID + "/" + lexicon.GatewayAssociation + "/shop.gw.test"
	if g.Status.URL != "https://shop.gw.test:"+port+"/" || g.Status.Address != gw.addr || g.Status.Association == nil || g.Status.Association.URI != wantURI {
		t.Errorf("Gateway shop's status %+v, want its URL, the gateway's address %s and the record %s", g.Status, gw.addr, wantURI)
	}
	if rec, err := getRecord(ctx, buyer.DID, lexicon.GatewayAssociation, "shop.gw.test"); err != nil || field(rec.Value, "hostname") != "shop.gw.test" ||
		!strings.Contains(string(rec.Value), lease) {
		t.Errorf("the association record on the buyer's PDS: %v %v", rec, err)
	}

	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://shop.gw.test/", nil)
	if resp, err := hc.Do(req); err != nil || resp.ProtoMajor != 2 {
		t.Errorf("the gateway over HTTP/2: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if code, _, body, err := gw.get(ctx, hc, "shop.gw.test", "/.well-known/atproto-did"); err != nil || code != http.StatusOK || body != buyer.DID {
		t.Errorf("atproto-did: %d %q %v, want the buyer's DID %s", code, body, err, buyer.DID)
	}
	gatewayIs(ctx, t, d.app, "nothing", gatewayv1alpha1.ReasonServiceNotFound)
	if code, reason, _, err := gw.get(ctx, hc, "nothing.gw.test", "/"); err != nil || code != http.StatusServiceUnavailable || reason != gateway.ReasonServiceNotFound {
		t.Errorf("a hostname whose Service does not exist: %d %s %v, want 503 %s", code, reason, err, gateway.ReasonServiceNotFound)
	}
	if code, reason, _, err := gw.get(ctx, hc, "stolen.gw.test", "/"); err != nil || code != http.StatusNotFound || reason != gateway.ReasonNoRoute {
		t.Errorf("another DID's record naming the lease: %d %s %v, want 404", code, reason, err)
	}
	// A hostname the certificate does not cover is not even offered TLS
	// for it: the handshake's name does not verify, and the Gateway says
	// so.
	if _, _, _, err := gw.get(ctx, hc, "shop.elsewhere.test", "/"); err == nil {
		t.Error("shop.elsewhere.test answered over TLS with a certificate for *.gw.test")
	}
	// (What failed is not told at a private address, R17.)
	gatewayIs(ctx, t, d.app, "elsewhere", gatewayv1alpha1.ReasonGatewayUnreachable)
	// A second Gateway of the hostname: the first keeps it.
	newGateway(ctx, t, d.app, "again", rc.Name, "shop.gw.test", "nothing")
	gatewayIs(ctx, t, d.app, "again", gatewayv1alpha1.ReasonHostnameTaken)
	if err := d.app.Delete(ctx, &gatewayv1alpha1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "again"}}); err != nil {
		t.Fatal(err)
	}
	if code, _, _, err := gw.get(ctx, hc, "shop.gw.test", "/"); err != nil || code != http.StatusOK {
		t.Errorf("shop.gw.test after a second Gateway of it came and went: %d %v", code, err)
	}

	gatewayFigures(ctx, t, hc, gw, node, svc)

	// The Gateway deleted: its record goes, the hostname is no longer
	// served.
	if err := d.app.Delete(ctx, &gatewayv1alpha1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "shop"}}); err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	if err := framework.Eventually(ctx, time.Minute, "shop.gw.test no longer served", func(ctx context.Context) (bool, string, error) {
		code, reason, _, err := gw.get(ctx, hc, "shop.gw.test", "/")
		if err != nil {
			return false, err.Error(), nil
		}
		return code == http.StatusNotFound && reason == gateway.ReasonNoRoute, fmt.Sprintf("%d %s", code, reason), nil
	}); err != nil {
		t.Error(err)
	}
	t.Logf("FIGURE gateway: Gateway deleted -> 404: %s", time.Since(gone).Round(time.Millisecond))
	if _, err := getRecord(ctx, buyer.DID, lexicon.GatewayAssociation, "shop.gw.test"); !isNotFound(err) {
		t.Errorf("the association record after the Gateway was deleted: %v, want RecordNotFound", err)
	}
}

// gatewayFigures times GETs of the pod through the gateway and straight
// to its NodePort on the node's address.
func gatewayFigures(ctx context.Context, t *testing.T, hc *http.Client, gw gatewayParts, node string, svc *corev1.Service) {
	t.Helper()
	nodeIP, err := docker(ctx, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", node)
	if err != nil || len(strings.Fields(nodeIP)) == 0 {
		t.Logf("no figure for the direct path: the node's address: %q %v", nodeIP, err)
		return
	}
	direct := fmt.Sprintf("http://%s/", net.JoinHostPort(strings.Fields(nodeIP)[0], strconv.Itoa(int(svc.Spec.Ports[0].NodePort))))
	dc := &http.Client{Timeout: 10 * time.Second}
	const n = 200
	run := func(name string, get func() error) {
		var took []time.Duration
		begin := time.Now()
		for range n {
			s := time.Now()
			if err := get(); err != nil {
				t.Logf("no figure for %s: %v", name, err)
				return
			}
			took = append(took, time.Since(s))
		}
		total := time.Since(begin)
		slices.Sort(took)
		t.Logf("FIGURE gateway %s: %d sequential GETs p50 %s p99 %s, %.0f req/s", name, n,
			took[n/2].Round(10*time.Microsecond), took[n*99/100].Round(10*time.Microsecond), float64(n)/total.Seconds())
	}
	run("through the gateway (TLS, port-forward to the pod)", func() error {
		code, _, _, err := gw.get(ctx, hc, "shop.gw.test", "/")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("status %d", code)
		}
		return err
	})
	run("direct (NodePort on the node, plain HTTP)", func() error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, direct, nil)
		resp, err := dc.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil
	})
}

// gatewayLeaseEnded: once the lease of the kind tenant ended (its VM
// Lost), nothing.gw.test, which the Gateway "nothing" claimed for it, is
// no longer served (404), the Gateway says its contract is not Active,
// and its association record is gone from the buyer's repo.
func gatewayLeaseEnded(ctx context.Context, t *testing.T, d *deal, gw gatewayParts) {
	t.Helper()
	hc := gw.client()
	if err := framework.Eventually(ctx, time.Minute, "nothing.gw.test no longer served (its lease ended)", func(ctx context.Context) (bool, string, error) {
		code, reason, _, err := gw.get(ctx, hc, "nothing.gw.test", "/")
		if err != nil {
			return false, err.Error(), nil
		}
		return code == http.StatusNotFound && reason == gateway.ReasonNoRoute, fmt.Sprintf("%d %s", code, reason), nil
	}); err != nil {
		t.Error(err)
	}
	gatewayIs(ctx, t, d.app, "nothing", gatewayv1alpha1.ReasonContractNotActive)
	if _, err := getRecord(ctx, d.accounts["buyer"].DID, lexicon.GatewayAssociation, "nothing.gw.test"); !isNotFound(err) {
		t.Errorf("the association record of a Gateway whose lease ended: %v, want RecordNotFound", err)
	}
}
