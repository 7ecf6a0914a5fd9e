package e2e

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/syntax"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/serviceauth"
)

// serviceToken asks acct's PDS for a service-auth token for aud with the
// method lxm ("" for none) that expires at exp.
func serviceToken(ctx context.Context, t *testing.T, acct *framework.Account, aud, lxm string, exp time.Time) string {
	t.Helper()
	params := url.Values{"aud": {aud}, "exp": {strconv.FormatInt(exp.Unix(), 10)}}
	if lxm != "" {
		params.Set("lxm", lxm)
	}
	var out struct {
		Token string `json:"token"`
	}
	if err := env.pds.XRPC(ctx, "com.atproto.server.getServiceAuth", acct.AccessJWT, params, nil, &out); err != nil {
		t.Fatalf("getServiceAuth for %s: %v", acct.Handle, err)
	}
	return out.Token
}

// TestTenantAuthenticatesATProtoIdentities: a tenant the agent runs
// accepts, as its only new credential, ATProto service-auth tokens that
// the caller's own PDS issued (com.atproto.server.getServiceAuth, a real
// PDS and PLC) for the tenant's service identity (status.serviceID, the
// bidder's DID and a fragment naming the VM) and the method
// dev.knotless.tenant.access; the agent checks them for the tenant
// through webhook token authentication, resolving the issuer's DID
// document. The VM's admin DID (spec.adminDIDs, the requester's) lists
// and creates namespaces, with kubectl-knotless as client-go's exec
// credential plugin, as kubectl runs it; a DID the tenant does not name
// is not authenticated (401: an authenticated kcp user could list the
// root's workspaces and make a home workspace); a token for another
// audience, for another method, expired, valid too long, or with a
// forged signature is 401. A DID that rotates its signing key (a PLC
// operation) is let in with a token signed by its new key, and from then
// on refused with one signed by the old key (a rotated-out key is refused
// at the latest serviceauth.DocumentTTL after the rotation). Cost: one
// tenant kcp process (~25 s) and a 12 s wait for a token to expire
// (serviceauth.Leeway and 3 s).
func TestTenantAuthenticatesATProtoIdentities(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	name := env.prefix + "-tenantauth"
	c := marketWorkspace(ctx, t, name)
	startAgent(ctx, t, name, agentKubeconfig(ctx, t, c, name))

	requester, err := env.pds.CreateAccount(ctx, env.prefix+"sabuyer.test")
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := env.pds.CreateAccount(ctx, env.prefix+"sastranger.test")
	if err != nil {
		t.Fatal(err)
	}
	rotating, err := env.pds.CreateAccount(ctx, env.prefix+"sarotating.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAccount(t, rotating.DID) })
	bidder := "did:plc:" + strings.Repeat("b", 24)

	vm := &computev1alpha1.ComputeVM{ObjectMeta: metav1.ObjectMeta{Name: "vm-auth", Namespace: "default"},
		Spec: computev1alpha1.ComputeVMSpec{ContractName: "manual", Driver: "process", CPUMillis: 1000, MemoryMiB: 1024,
			AdminDIDs: []string{requester.DID, rotating.DID}, ServiceDID: bidder}}
	create(ctx, t, c, vm)
	vm = waitVM(ctx, t, c, vm.Name, "ComputeVM Running with a service identity", 3*time.Minute, func(vm *computev1alpha1.ComputeVM) bool {
		return vm.Status.Phase == computev1alpha1.VMRunning && vm.Status.ServiceID != ""
	})
	aud := vm.Status.ServiceID
	if want := serviceauth.Audience(bidder, string(vm.UID)); aud != want {
		t.Fatalf("status.serviceID %q, want %q", aud, want)
	}

	// The requester, through kubectl-knotless token as the exec
	// credential plugin, with an app password in a file.
	plugin, pw := knotlessPlugin(ctx, t, requester)
	cfg := &rest.Config{Host: vm.Status.Endpoint, TLSClientConfig: rest.TLSClientConfig{CAData: []byte(vm.Status.CABundle)},
		ExecProvider: &clientcmdapi.ExecConfig{APIVersion: "client.authentication.k8s.io/v1", Command: plugin, InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
			Args: []string{"token", "--pds", env.pds.URL, "--identifier", requester.Handle, "--password-file", pw, "--audience", aud}},
		QPS: 1000, Burst: 1000}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("the requester's DID lists namespaces with kubectl-knotless: %v", err)
	}
	t.Logf("FIGURE first request as a DID (login, token, webhook review, DID resolution): %s", time.Since(start).Round(time.Millisecond))
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "made-by-did"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the requester's DID creates a namespace: %v", err)
	}
	start = time.Now()
	const n = 20
	for range n {
		if _, err := cs.CoreV1().Namespaces().Get(ctx, "made-by-did", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("FIGURE GET as a DID, token cached by client-go: %s per request (%d)", (time.Since(start) / n).Round(time.Microsecond), n)

	// Tokens straight from the PDS.
	get := func(token string) int { return tenantDo(ctx, t, vm, token, "/api/v1/namespaces", http.Header{}) }
	soon := time.Now().Add(2 * time.Minute)
	if code := get(serviceToken(ctx, t, requester, aud, serviceauth.Method, soon)); code != http.StatusOK {
		t.Errorf("the requester's token: %d, want 200", code)
	}
	// A DID the tenant does not name is not authenticated at all: kcp
	// gives every authenticated user the root's workspace list and a home
	// workspace of its own (from the attack review).
	strangerToken := serviceToken(ctx, t, stranger, aud, serviceauth.Method, soon)
	for _, path := range []string{"/api/v1/namespaces", "/apis/tenancy.kcp.io/v1alpha1/workspaces", "/apis/tenancy.kcp.io/v1alpha1/workspaces/~"} {
		if code := tenantDo(ctx, t, vm, strangerToken, path, http.Header{}); code != http.StatusUnauthorized {
			t.Errorf("a DID the tenant does not name, GET %s: %d, want 401", path, code)
		}
	}
	good := serviceToken(ctx, t, requester, aud, serviceauth.Method, soon)
	dot := strings.LastIndexByte(good, '.')
	sig, err := base64.RawURLEncoding.DecodeString(good[dot+1:])
	if err != nil {
		t.Fatal(err)
	}
	sig[0] ^= 0xff
	expiry := time.Now().Add(time.Second)
	expiring := serviceToken(ctx, t, requester, aud, serviceauth.Method, expiry)
	for what, token := range map[string]string{
		"another tenant's audience": serviceToken(ctx, t, requester, serviceauth.Audience(bidder, "another-vm"), serviceauth.Method, soon),
		"the bidder's bare DID":     serviceToken(ctx, t, requester, bidder, serviceauth.Method, soon),
		"another method":            serviceToken(ctx, t, requester, aud, "com.atproto.repo.listRecords", soon),
		"no method":                 serviceToken(ctx, t, requester, aud, "", time.Now().Add(50*time.Second)),
		"valid for 30 minutes":      serviceToken(ctx, t, requester, aud, serviceauth.Method, time.Now().Add(30*time.Minute)),
		"a forged signature":        good[:dot+1] + base64.RawURLEncoding.EncodeToString(sig),
		"the PDS's access token":    requester.AccessJWT,
	} {
		if code := get(token); code != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", what, code)
		}
	}

	// A DID rotates its signing key (a PLC operation): a token signed with
	// the new key is taken (the agent resolves the document again), and
	// from then on one signed with the old key, as its PDS still signs, is
	// refused.
	if code := get(serviceToken(ctx, t, rotating, aud, serviceauth.Method, soon)); code != http.StatusOK {
		t.Fatalf("a token of the DID before it rotates its key: %d, want 200", code)
	}
	newKey, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := newKey.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	updatePLC(ctx, t, rotating.DID, func(op map[string]any) {
		op["verificationMethods"] = map[string]any{"atproto": pub.DIDKey()}
	})
	method := syntax.NSID(serviceauth.Method)
	signed, err := auth.SignServiceAuth(syntax.DID(rotating.DID), aud, time.Minute, &method, newKey)
	if err != nil {
		t.Fatal(err)
	}
	if code := get(signed); code != http.StatusOK {
		t.Errorf("a token signed with the rotated-in key: %d, want 200", code)
	}
	if code := get(serviceToken(ctx, t, rotating, aud, serviceauth.Method, soon)); code != http.StatusUnauthorized {
		t.Errorf("a token signed with the rotated-out key: %d, want 401", code)
	}

	time.Sleep(time.Until(expiry.Add(serviceauth.Leeway + 2*time.Second)))
	if code := get(expiring); code != http.StatusUnauthorized {
		t.Errorf("an expired token: %d, want 401", code)
	}

}

// knotlessPlugin builds kubectl-knotless and writes acct's app password
// to a file; it returns both paths.
func knotlessPlugin(ctx context.Context, t *testing.T, acct *framework.Account) (string, string) {
	t.Helper()
	repoRoot, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	plugin, err := framework.Build(ctx, repoRoot, env.dir, "kubectl-knotless")
	if err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(t.TempDir(), "app-password")
	if err := os.WriteFile(pw, []byte(acct.AppPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return plugin, pw
}

// didClient is a client of the tenant of alice's contract in ws as the
// DID of acct, from the kubeconfig `kubectl knotless kubeconfig
// <contract>` writes (the contract read as alice; the lease from the
// bidder's PDS; the token from acct's PDS).
func didClient(ctx context.Context, t *testing.T, acct *framework.Account, ws, contract string) kubernetes.Interface {
	t.Helper()
	return didClientOn(ctx, t, env.home(), env.pds, acct, ws, contract)
}

// didClientOn is didClient for alice's workspace ws on the installation
// in, and acct's account on pds.
func didClientOn(ctx context.Context, t *testing.T, in *installation, pds *framework.PDS, acct *framework.Account, ws, contract string) kubernetes.Interface {
	t.Helper()
	plugin, pw := knotlessPlugin(ctx, t, acct)
	aliceCfg, err := in.kcp.UserConfig("alice")
	if err != nil {
		aliceCfg = in.admin
	}
	out := filepath.Join(t.TempDir(), "tenant.kubeconfig")
	cmd := exec.CommandContext(ctx, plugin, "kubeconfig", contract, "--kubeconfig", writeKubeconfig(t, aliceCfg, root.Join(ws)),
		"--plc-url", env.plc.URL, "--pds", pds.URL, "--identifier", acct.Handle, "--password-file", pw, "-o", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl knotless kubeconfig %s: %v\n%s", contract, err, b)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", out)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}
