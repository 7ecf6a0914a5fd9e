package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/knotless-dev/knotless/apis"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/bodylimit"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/market"
	"github.com/knotless-dev/knotless/internal/market/deal"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/internal/pds"
)

// maxLease bounds the getRecord answer of a lease (a lease with a CA
// bundle is a few KiB; the lexicon allows at most about 20).
const maxLease = 64 << 10

// kubeconfig writes a kubeconfig for the tenant of a contract (the
// requester's ComputeContract in the current workspace) or of a lease
// record (--lease): the endpoint and CA come from the bidder's lease,
// read from the bidder's PDS and checked (deal.TenantOf: running, https,
// the CA bundle its pin names, a service identity of the bidder's); the
// user is this plugin's token command with the caller's identity.
func kubeconfig(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("kubeconfig", flag.ContinueOnError)
	leaseURI := fs.String("lease", "", "at-URI of the bidder's lease record (instead of a contract)")
	kcfg := fs.String("kubeconfig", "", "kubeconfig of the requester's workspace, to read the contract (default: $KUBECONFIG)")
	kctx := fs.String("context", "", "its context (default: the current one)")
	namespace := fs.String("namespace", "default", "the contract's namespace")
	plcURL := fs.String("plc-url", "https://plc.directory", "PLC directory that resolves the bidder's DID to its PDS")
	pdsURL := fs.String("pds", "", "URL of your PDS (for the token command)")
	identifier := fs.String("identifier", "", "your handle or DID (for the token command)")
	passwordFile := fs.String("password-file", "", "file holding an app password of your account (for the token command)")
	output := fs.String("o", "", "file to write the kubeconfig to (default: standard output)")
	// The contract may come before the flags (kubectl's order) or after.
	contract := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		contract, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if contract == "" {
		contract = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case fs.NArg() > 1:
		return fmt.Errorf("unexpected argument %q", fs.Arg(1))
	case (contract == "") == (*leaseURI == ""):
		return errors.New("name either a contract or --lease")
	case *pdsURL == "" || *identifier == "" || *passwordFile == "":
		return errors.New("--pds, --identifier and --password-file are required")
	}
	pw, err := filepath.Abs(*passwordFile)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	bidder := ""
	if contract != "" {
		if *leaseURI, bidder, err = contractLease(ctx, *kcfg, *kctx, *namespace, contract); err != nil {
			return err
		}
	}
	tn, rkey, err := leaseTenant(ctx, *plcURL, *leaseURI, bidder)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	name := "knotless-" + rkey
	if contract != "" {
		name = contract
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: tn.Endpoint, CertificateAuthorityData: tn.CA}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{
		APIVersion: "client.authentication.k8s.io/v1", Command: self, InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
		Args: []string{"token", "--pds", *pdsURL, "--identifier", *identifier, "--password-file", pw, "--audience", tn.ServiceID},
	}}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	cfg.CurrentContext = name
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	if *output == "" {
		_, err = out.Write(b)
		return err
	}
	return os.WriteFile(*output, b, 0o600)
}

// leaseTenant reads the lease at-URI raw (in the repo of bidder, when
// set) and checks what it says of its tenant; it returns the tenant and
// the lease's record key.
func leaseTenant(ctx context.Context, plcURL, raw, bidder string) (deal.Tenant, string, error) {
	uri, err := syntax.ParseATURI(raw)
	if err != nil || uri.Collection().String() != lexicon.Lease || uri.RecordKey() == "" {
		return deal.Tenant{}, "", fmt.Errorf("%q is not the at-URI of a %s record", raw, lexicon.Lease)
	}
	did, err := uri.Authority().AsDID()
	if err != nil || (bidder != "" && did.String() != bidder) {
		return deal.Tenant{}, "", fmt.Errorf("the lease %s is not in the bidder's repo (by DID)", raw)
	}
	lease, err := readLease(ctx, plcURL, did, uri.RecordKey().String())
	if err != nil {
		return deal.Tenant{}, "", err
	}
	tn, err := deal.TenantOf(did.String(), lease)
	if err != nil {
		return deal.Tenant{}, "", fmt.Errorf("the lease %s: %w", raw, err)
	}
	return tn, uri.RecordKey().String(), nil
}

// contractLease reads the requester's ComputeContract name: the at-URI of
// its lease and the bidder's DID.
func contractLease(ctx context.Context, kubeconfig, kctx, namespace, name string) (string, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kctx}).ClientConfig()
	if err != nil {
		return "", "", err
	}
	c, err := client.New(cfg, client.Options{Scheme: apis.NewScheme()})
	if err != nil {
		return "", "", err
	}
	cc := &marketv1alpha1.ComputeContract{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, cc); err != nil {
		return "", "", fmt.Errorf("the contract: %w", err)
	}
	if cc.Spec.Side != marketv1alpha1.SideRequester || cc.Status.Records.Lease == nil {
		return "", "", fmt.Errorf("the contract %s is not a requester's contract with a lease", name)
	}
	return cc.Status.Records.Lease.URI, cc.Spec.BidderDID, nil
}

// readLease reads the lease rkey from the repo of did at the PDS its DID
// document names (resolved through plcURL for did:plc, over https for
// did:web; no redirect; bounded reads).
func readLease(ctx context.Context, plcURL string, did syntax.DID, rkey string) (*market.Lease, error) {
	hc := http.Client{Timeout: 20 * time.Second, CheckRedirect: netpolicy.NoRedirects,
		Transport: bodylimit.Transport(http.DefaultTransport, pds.MaxDIDDocument)}
	dir := &identity.BaseDirectory{PLCURL: plcURL, SkipHandleVerification: true, HTTPClient: hc, UserAgent: "kubectl-knotless"}
	ident, err := dir.LookupDID(ctx, did)
	if err != nil {
		return nil, fmt.Errorf("resolving %s: %w", did, err)
	}
	endpoint := ident.PDSEndpoint()
	if endpoint == "" {
		return nil, fmt.Errorf("%s names no PDS", did)
	}
	// Over https (plain http to this machine only): the lease says where
	// your token goes.
	if err := pds.CheckURL(endpoint, loopbackOnly()); err != nil {
		return nil, fmt.Errorf("the PDS of %s: %w", did, err)
	}
	q := url.Values{"repo": {did.String()}, "collection": {lexicon.Lease}, "rkey": {rkey}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/xrpc/com.atproto.repo.getRecord?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	hc.Transport = bodylimit.Transport(http.DefaultTransport, maxLease)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading the lease: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading the lease: %s answered %s", endpoint, resp.Status)
	}
	var rec struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&rec); err != nil {
		return nil, fmt.Errorf("reading the lease: %w", err)
	}
	lease := &market.Lease{}
	if err := market.Decode(lexicon.Lease, rec.Value, lease); err != nil {
		return nil, fmt.Errorf("the lease: %w", err)
	}
	return lease, nil
}
