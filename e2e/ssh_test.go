package e2e

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gatewayv1alpha1 "github.com/knotless-dev/knotless/apis/gateway/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/lexicon"
)

// sshKeyTTL is how long the agent keeps a DID's published keys in the
// suite (--ssh-key-ttl).
const sshKeyTTL = 3 * time.Second

// publishSSHKey makes a key and publishes it as acct's
// dev.knotless.gateway.sshKeys record (as any ATProto client would).
func publishSSHKey(ctx context.Context, t *testing.T, acct *framework.Account) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key.PublicKey()))) + " " + acct.Handle
	in := map[string]any{"repo": acct.DID, "collection": lexicon.SSHKeys, "rkey": "self", "record": map[string]any{
		"$type": lexicon.SSHKeys, "keys": []string{line}, "createdAt": time.Now().UTC().Format(time.RFC3339)}}
	if err := env.pds.XRPC(ctx, "com.atproto.repo.putRecord", acct.AccessJWT, nil, in, nil); err != nil {
		t.Fatalf("%s's SSH keys: %v", acct.Handle, err)
	}
	return key
}

// sshRun opens a session to the gateway at addr as user with key,
// checking the host key against fingerprint, runs line (with a
// terminal if pty) and returns stdout, stderr and the exit status.
func sshRun(addr, fingerprint, user string, key ssh.Signer, line string, pty bool) (string, string, int, error) {
	c, err := ssh.Dial("tcp", addr, &ssh.ClientConfig{User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(key)}, Timeout: 10 * time.Second,
		HostKeyCallback: func(_ string, _ net.Addr, k ssh.PublicKey) error {
			if got := ssh.FingerprintSHA256(k); got != fingerprint {
				return fmt.Errorf("host key %s, the lease says %s", got, fingerprint)
			}
			return nil
		}})
	if err != nil {
		return "", "", 0, err
	}
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		return "", "", 0, err
	}
	defer s.Close()
	var out, errOut bytes.Buffer
	s.Stdout, s.Stderr = &out, &errOut
	if pty {
		if err := s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}); err != nil {
			return "", "", 0, err
		}
		// A terminal's input stays open while the command runs (an
		// input that ends at once hangs the pod's terminal up).
		in, w := io.Pipe()
		defer w.Close()
		s.Stdin = in
	}
	err = s.Run(line)
	var exit *ssh.ExitError
	if errors.As(err, &exit) {
		return out.String(), errOut.String(), exit.ExitStatus(), nil
	}
	return out.String(), errOut.String(), 0, err
}

// sshOnKindTenant: the buyer publishes an SSH key in its repo and makes
// an SshGateway of the kind tenant's namespace default; knotless
// publishes the ssh record, the SshGateway shows the bidder's SSH
// address, host key and the tenant's name there (from the lease); `ssh
// <buyer's DID>@gw -- <tenant>/default/<pod> /testimage id` prints the
// container's uid, with a terminal too. Refused: a key not in the repo, a DID the tenant's RBAC
// does not let exec (beta), a namespace the SshGateway does not list,
// every session once the SshGateway is deleted (its record gone), and
// the buyer's key once its record is deleted (after the keys' TTL).
// Figure: session set-up (connect, key check against the repo, RBAC
// check, exec) p50.
func sshOnKindTenant(ctx context.Context, t *testing.T, d *deal, rc *marketv1alpha1.ComputeContract, cs kubernetes.Interface, gw gatewayParts) {
	t.Helper()
	buyer, beta := d.accounts["buyer"], d.accounts["beta"]
	key := publishSSHKey(ctx, t, buyer)
	betaKey := publishSSHKey(ctx, t, beta)
	create(ctx, t, d.app, &gatewayv1alpha1.SshGateway{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "shell"},
		Spec: gatewayv1alpha1.SshGatewaySpec{ContractRef: gatewayv1alpha1.ContractRef{Name: rc.Name}, Namespaces: []string{"default"}}})
	g := &gatewayv1alpha1.SshGateway{}
	if err := framework.Eventually(ctx, time.Minute, "SshGateway shell Ready", func(ctx context.Context) (bool, string, error) {
		if err := d.app.Get(ctx, client.ObjectKey{Namespace: "default", Name: "shell"}, g); err != nil {
			return false, err.Error(), nil
		}
		c := meta.FindStatusCondition(g.Status.Conditions, gatewayv1alpha1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionTrue, fmt.Sprintf("%+v", c), nil
	}); err != nil {
		t.Fatal(err)
	}
	if g.Status.Address != gw.sshAddr || !strings.HasPrefix(g.Status.HostKey, "SHA256:") || g.Status.Record == nil || g.Status.Tenant == "" ||
		!strings.Contains(g.Status.Command, "-- "+g.Status.Tenant+"/<namespace>/<pod>") {
		t.Fatalf("SshGateway status %+v, want the agent's SSH address %s and host key", g.Status, gw.sshAddr)
	}
	if _, err := getRecord(ctx, buyer.DID, lexicon.GatewaySSH, "default.shell"); err != nil {
		t.Errorf("the ssh record on the buyer's PDS: %v", err)
	}
	pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=limits"})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("the limits pod: %v", err)
	}
	target := g.Status.Tenant + "/default/" + pods.Items[0].Name
	run := func(user string, k ssh.Signer, line string, pty bool) (string, string, int, error) {
		return sshRun(gw.sshAddr, g.Status.HostKey, user, k, line, pty)
	}
	// The gateway reads the record from the firehose: the first session
	// may come before it did.
	var took []time.Duration
	if err := framework.Eventually(ctx, time.Minute, "a session as the buyer prints the container's uid", func(context.Context) (bool, string, error) {
		start := time.Now()
		out, errOut, code, err := run(buyer.DID, key, target+" /testimage id", false)
		if err != nil {
			return false, err.Error(), nil
		}
		took = append(took, time.Since(start))
		return code == 0 && strings.HasPrefix(out, "uid="), fmt.Sprintf("exit %d %q %q", code, out, errOut), nil
	}); err != nil {
		t.Fatal(err)
	}
	took = took[len(took)-1:]
	for range 4 {
		start := time.Now()
		if _, _, code, err := run(buyer.DID, key, target+" /testimage id", false); err != nil || code != 0 {
			t.Errorf("a session: exit %d %v", code, err)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	t.Logf("FIGURE ssh gateway: session set-up and an exec, p50 of %d: %s", len(took), took[len(took)/2].Round(time.Millisecond))
	if out, _, code, err := run(buyer.DID, key, target+" /testimage limits", true); err != nil || code != 0 || !strings.Contains(out, "memory limit") {
		t.Errorf("a session with a terminal: exit %d %q %v", code, out, err)
	}
	// Refused.
	if _, _, _, err := run(buyer.DID, betaKey, target+" /testimage id", false); err == nil {
		t.Error("a key the buyer does not publish was let in")
	}
	if _, errOut, code, err := run(beta.DID, betaKey, target+" /testimage id", false); err != nil || code != 1 || !strings.Contains(errOut, "refused") {
		t.Errorf("a DID the tenant's RBAC does not let exec: exit %d %q %v", code, errOut, err)
	}
	if _, errOut, code, err := run(buyer.DID, key, g.Status.Tenant+"/kube-system/"+pods.Items[0].Name+" /testimage id", false); err != nil || code != 1 || !strings.Contains(errOut, "refused") {
		t.Errorf("a namespace the SshGateway does not list: exit %d %q %v", code, errOut, err)
	}
	// The SshGateway deleted: its record goes, sessions are refused.
	if err := d.app.Delete(ctx, g); err != nil {
		t.Fatal(err)
	}
	if err := framework.Eventually(ctx, time.Minute, "sessions refused once the SshGateway is gone", func(context.Context) (bool, string, error) {
		_, errOut, code, err := run(buyer.DID, key, target+" /testimage id", false)
		if err != nil {
			return false, err.Error(), nil
		}
		return code == 1 && strings.Contains(errOut, "refused"), fmt.Sprintf("exit %d", code), nil
	}); err != nil {
		t.Error(err)
	}
	if _, err := getRecord(ctx, buyer.DID, lexicon.GatewaySSH, "default.shell"); !isNotFound(err) {
		t.Errorf("the ssh record after the SshGateway was deleted: %v", err)
	}
	// The buyer's key record deleted: its key is refused after the TTL.
	in := map[string]any{"repo": buyer.DID, "collection": lexicon.SSHKeys, "rkey": "self"}
	if err := env.pds.XRPC(ctx, "com.atproto.repo.deleteRecord", buyer.AccessJWT, nil, in, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(sshKeyTTL)
	if _, _, _, err := run(buyer.DID, key, target+" /testimage id", false); err == nil {
		t.Error("the buyer's key was let in after its record was deleted and the TTL passed")
	}
}
