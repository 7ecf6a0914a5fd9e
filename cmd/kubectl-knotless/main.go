// Command kubectl-knotless is the kubectl plugin of knotless (`kubectl
// knotless ...`). Its token command is a kubectl exec credential plugin:
// it gets an ATProto service-auth token for a tenant from the user's own
// PDS (com.atproto.server.getServiceAuth, with the user's app password),
// so that the user reaches a tenant apiserver directly as their DID. No
// credential of the tenant's is ever handed to anyone: the tenant checks
// the token against the user's DID document (docs/compute.md).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/xrpc"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientauthv1 "k8s.io/client-go/pkg/apis/clientauthentication/v1"

	"github.com/knotless-dev/knotless/cmd/internal/buildinfo"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/serviceauth"
)

const usage = `kubectl knotless: reach knotless tenants with your ATProto identity.

Commands:
  kubeconfig  write a kubeconfig for the tenant of a contract (or of a
              lease record): endpoint and CA from the bidder's lease, you
              as the user through the token command
  token       print an ExecCredential with a service-auth token for a
              tenant (kubectl runs it as the exec credential plugin of a
              kubeconfig)
  version     print the plugin's version and commit

Run 'kubectl knotless <command> -h' for its flags.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "token":
		err = token(context.Background(), os.Args[2:], os.Stdout)
	case "kubeconfig":
		err = kubeconfig(context.Background(), os.Args[2:], os.Stdout)
	case "version":
		version, commit := buildinfo.Get()
		fmt.Printf("kubectl-knotless %s (%s)\n", version, commit)
		return
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		err = fmt.Errorf("unknown command %q\n\n%s", os.Args[1], usage)
	}
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubectl-knotless: %v\n", err)
		os.Exit(1)
	}
}

// loopbackOnly allows plain http to this machine only.
func loopbackOnly() *netpolicy.Policy {
	return netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}, nil)
}

// tokenTTL is how long a token is asked for: kubectl asks again once it
// expired (ExecCredential's expirationTimestamp).
const tokenTTL = 5 * time.Minute

// token logs in to the user's PDS and prints an ExecCredential holding a
// service-auth token for the tenant --audience names (the lease's
// serviceId).
func token(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	pdsURL := fs.String("pds", "", "URL of your PDS")
	identifier := fs.String("identifier", "", "your handle or DID")
	passwordFile := fs.String("password-file", "", "file holding an app password of your account")
	audience := fs.String("audience", "", "the tenant's service identity (its lease's serviceId)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var errs []error
	if *pdsURL == "" || *identifier == "" || *passwordFile == "" || *audience == "" {
		errs = append(errs, errors.New("--pds, --identifier, --password-file and --audience are required"))
	}
	// The password goes over https only (plain http to this machine,
	// for a local PDS).
	if err := pds.CheckURL(*pdsURL, loopbackOnly()); err != nil {
		errs = append(errs, fmt.Errorf("--pds: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	password, err := os.ReadFile(*passwordFile)
	if err != nil {
		return fmt.Errorf("--password-file: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// No redirect is followed: the password goes to the PDS named, only.
	hc := &http.Client{Timeout: 20 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	xc := &xrpc.Client{Host: strings.TrimRight(*pdsURL, "/"), Client: hc}
	sess, err := comatproto.ServerCreateSession(ctx, xc, &comatproto.ServerCreateSession_Input{
		Identifier: *identifier, Password: strings.TrimSpace(string(password)),
	})
	if err != nil {
		return fmt.Errorf("logging in to %s: %w", *pdsURL, err)
	}
	xc.Auth = &xrpc.AuthInfo{AccessJwt: sess.AccessJwt, Did: sess.Did, Handle: sess.Handle}
	exp := time.Now().Add(tokenTTL)
	tok, err := comatproto.ServerGetServiceAuth(ctx, xc, *audience, exp.Unix(), serviceauth.Method)
	if err != nil {
		return fmt.Errorf("asking %s for a service-auth token: %w", *pdsURL, err)
	}
	cred := clientauthv1.ExecCredential{Status: &clientauthv1.ExecCredentialStatus{Token: tok.Token}}
	cred.APIVersion, cred.Kind = clientauthv1.SchemeGroupVersion.String(), "ExecCredential"
	// A minute early: kubectl asks again before the tenant would refuse.
	cred.Status.ExpirationTimestamp = &metav1.Time{Time: exp.Add(-time.Minute)}
	return json.NewEncoder(out).Encode(cred)
}
