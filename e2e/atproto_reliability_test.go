package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/pds"
)

// repoWorkspace creates a workspace with a Ready AtprotoRepo "repo" for a
// new account and returns its client and the account's DID. A repo that
// reaches the PDS at pdsURL (a proxy in front of it) has the account's
// DID document name pdsURL.
func repoWorkspace(ctx context.Context, t *testing.T, name, handle, pdsURL string) (client.Client, string) {
	t.Helper()
	c, _ := appWorkspace(ctx, t, name)
	acct, err := env.pds.CreateAccount(ctx, handle)
	if err != nil {
		t.Fatal(err)
	}
	repo := secretRepo("repo", acct.Handle, "cred")
	if pdsURL != "" {
		movePDSEndpoint(ctx, t, acct.DID, pdsURL)
		repo.Spec.PDS.URL = pdsURL
	}
	create(ctx, t, c, passwordSecret("cred", acct.AppPassword), repo)
	waitRepo(ctx, t, c, "repo", atprotov1alpha1.ReasonReady)
	return c, acct.DID
}

// dropRecordsAfter deletes c's AtprotoRecords when t ends (their PDS
// records go through the repo's inventory): a test that leaves hundreds
// of records would have the provider read each of them back at every
// resync for the rest of the suite.
func dropRecordsAfter(t *testing.T, c client.Client) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.DeleteAllOf(ctx, &atprotov1alpha1.AtprotoRecord{}, client.InNamespace("default")); err != nil {
			t.Logf("deleting the test's AtprotoRecords: %v", err)
		}
	})
}

// listRecords returns rkey -> value of every record of the test
// collection in a repo, read straight from the PDS.
func listRecords(ctx context.Context, t *testing.T, did string) map[string]pdsRecord {
	t.Helper()
	return listCollection(ctx, t, env.pds, did, testCollection)
}

// listCollection lists a collection of did's repo on pds with plain
// com.atproto.repo.listRecords calls, by record key.
func listCollection(ctx context.Context, t *testing.T, pds *framework.PDS, did, collection string) map[string]pdsRecord {
	t.Helper()
	out := map[string]pdsRecord{}
	cursor := ""
	for {
		var page struct {
			Cursor  string      `json:"cursor"`
			Records []pdsRecord `json:"records"`
		}
		q := url.Values{"repo": {did}, "collection": {collection}, "limit": {"100"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		if err := pds.XRPC(ctx, "com.atproto.repo.listRecords", "", q, nil, &page); err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Records {
			rkey := rkeyOf(r.URI)
			if _, dup := out[rkey]; dup {
				t.Errorf("record %s listed twice", r.URI)
			}
			out[rkey] = r
		}
		if page.Cursor == "" || len(page.Records) == 0 {
			return out
		}
		cursor = page.Cursor
	}
}

func rkeyOf(uri string) string {
	for i := len(uri) - 1; i >= 0; i-- {
		if uri[i] == '/' {
			return uri[i+1:]
		}
	}
	return uri
}

// waitAllSynced waits until every AtprotoRecord in c is Synced for its
// generation and returns them. It lists once a second: listing many
// records costs kcp CPU that the provider competes for.
func waitAllSynced(ctx context.Context, t *testing.T, c client.Client, n int, timeout time.Duration) []atprotov1alpha1.AtprotoRecord {
	t.Helper()
	var list atprotov1alpha1.AtprotoRecordList
	if err := framework.EventuallyEvery(ctx, time.Second, timeout, fmt.Sprintf("%d records Synced", n), func(ctx context.Context) (bool, string, error) {
		if err := c.List(ctx, &list); err != nil {
			return false, err.Error(), nil
		}
		synced := 0
		for _, r := range list.Items {
			cond := meta.FindStatusCondition(r.Status.Conditions, atprotov1alpha1.ConditionSynced)
			if cond != nil && cond.Status == "True" && cond.ObservedGeneration == r.Generation {
				synced++
			}
		}
		return synced == n && len(list.Items) == n, fmt.Sprintf("%d/%d synced", synced, len(list.Items)), nil
	}); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// checkPDSEqualsSpec compares every record on the PDS with the objects:
// same set of keys, values equal to spec, CIDs equal to status.
func checkPDSEqualsSpec(ctx context.Context, t *testing.T, did string, recs []atprotov1alpha1.AtprotoRecord) {
	t.Helper()
	onPDS := listRecords(ctx, t, did)
	if len(onPDS) != len(recs) {
		t.Errorf("PDS has %d records, %d objects exist", len(onPDS), len(recs))
	}
	for _, r := range recs {
		got, ok := onPDS[r.Spec.RKey]
		if !ok {
			t.Errorf("record %s missing on the PDS", r.Spec.RKey)
			continue
		}
		if got.CID != r.Status.CID {
			t.Errorf("record %s: status CID %s, PDS CID %s", r.Spec.RKey, r.Status.CID, got.CID)
		}
		var want map[string]any
		_ = json.Unmarshal(r.Spec.Value.Raw, &want)
		if field(got.Value, "text") != fmt.Sprint(want["text"]) {
			t.Errorf("record %s: PDS value %s, spec %s", r.Spec.RKey, got.Value, r.Spec.Value.Raw)
		}
	}
}

// TestAtprotoManyRecords: 100 records in one repo and one record in each
// of 50 workspaces all become Synced.
func TestAtprotoManyRecords(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	c, did := repoWorkspace(ctx, t, env.prefix+"-many", env.prefix+"many.test", "")
	dropRecordsAfter(t, c)
	start := time.Now()
	for i := range 100 {
		create(ctx, t, c, record(fmt.Sprintf("r%03d", i), "repo", fmt.Sprintf("r%03d", i), fmt.Sprintf(`{"text":"r%03d"}`, i)))
	}
	recs := waitAllSynced(ctx, t, c, 100, 3*time.Minute)
	t.Logf("FIGURE 100 records in one repo Synced in %s", time.Since(start).Round(time.Millisecond))
	checkPDSEqualsSpec(ctx, t, did, recs)

	const workspaces = 50
	start = time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := range workspaces {
		g.Go(func() error {
			name := fmt.Sprintf("%s-fan-%02d", env.prefix, i)
			wc, err := appWorkspaceNoT(gctx, name)
			if err != nil {
				return err
			}
			dropRecordsAfter(t, wc)
			acct, err := env.pds.CreateAccount(gctx, fmt.Sprintf("%sfan%02d.test", env.prefix, i))
			if err != nil {
				return err
			}
			for _, o := range []client.Object{passwordSecret("cred", acct.AppPassword), secretRepo("repo", acct.Handle, "cred"), record("one", "repo", "one", `{"text":"one"}`)} {
				if err := wc.Create(gctx, o); err != nil {
					return err
				}
			}
			return framework.Eventually(gctx, 3*time.Minute, name+" record Synced", func(ctx context.Context) (bool, string, error) {
				r := &atprotov1alpha1.AtprotoRecord{}
				if err := wc.Get(ctx, client.ObjectKey{Namespace: "default", Name: "one"}, r); err != nil {
					return false, err.Error(), nil
				}
				return meta.IsStatusConditionTrue(r.Status.Conditions, atprotov1alpha1.ConditionSynced), "", nil
			})
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE %d workspaces each with a repo and a record: all Synced %s after the first workspace was requested", workspaces, time.Since(start).Round(time.Millisecond))
}

// appWorkspaceNoT is appWorkspace for goroutines.
func appWorkspaceNoT(ctx context.Context, name string) (client.Client, error) {
	if err := framework.CreateWorkspace(ctx, env.admin, root, name, env.appType); err != nil {
		return nil, err
	}
	if err := framework.WaitWorkspaceReady(ctx, env.admin, root, name, 3*time.Minute); err != nil {
		return nil, err
	}
	return framework.ClientFor(env.admin, root.Join(name))
}

// TestAtprotoProviderKilledDuringWrites: kill -9 the provider in the middle
// of 200 record writes; after a restart every record on the PDS equals its
// spec, none is duplicated, and every status equals a fresh read-back.
func TestAtprotoProviderKilledDuringWrites(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	c, did := repoWorkspace(ctx, t, env.prefix+"-kill", env.prefix+"kill.test", "")
	dropRecordsAfter(t, c)
	const n = 200
	for i := range n {
		create(ctx, t, c, record(fmt.Sprintf("k%03d", i), "repo", fmt.Sprintf("k%03d", i), fmt.Sprintf(`{"text":"k%03d"}`, i)))
	}
	// Kill once some, but not all, records were written.
	if err := framework.Eventually(ctx, 2*time.Minute, "some records to be written", func(ctx context.Context) (bool, string, error) {
		got := len(listRecords(ctx, t, did))
		return got >= 10, strconv.Itoa(got), nil
	}); err != nil {
		t.Fatal(err)
	}
	written := len(listRecords(ctx, t, did))
	env.provider.Kill9()
	t.Logf("killed the provider after %d of %d records reached the PDS", written, n)
	if err := env.provider.Restart(ctx, env.group); err != nil {
		t.Fatal(err)
	}
	recs := waitAllSynced(ctx, t, c, n, 4*time.Minute)
	checkPDSEqualsSpec(ctx, t, did, recs)
}

// countingProxy forwards TCP connections to target and counts them. With
// TLS it terminates TLS with the certificate cert holds.
type countingProxy struct {
	ln     net.Listener
	tls    bool
	cert   atomic.Pointer[tls.Certificate]
	target string
	conns  atomic.Int64
	wg     sync.WaitGroup
	mu     sync.Mutex
	open   map[net.Conn]bool
}

func startProxy(t *testing.T, target string, cert *tls.Certificate) *countingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{ln: ln, target: target, open: map[net.Conn]bool{}}
	if cert != nil {
		p.tls = true
		p.cert.Store(cert)
		ln = tls.NewListener(ln, &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return p.cert.Load(), nil }})
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			p.conns.Add(1)
			p.track(in, true)
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer p.track(in, false)
				defer in.Close()
				out, err := net.DialTimeout("tcp", target, 2*time.Second)
				if err != nil {
					return
				}
				p.track(out, true)
				defer p.track(out, false)
				defer out.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
				go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.closeAll()
		p.wg.Wait()
	})
	return p
}

func (p *countingProxy) track(c net.Conn, open bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if open {
		p.open[c] = true
	} else {
		delete(p.open, c)
	}
}

func (p *countingProxy) URL() string {
	if p.tls {
		return "https://" + p.ln.Addr().String()
	}
	return "http://" + p.ln.Addr().String()
}

// closeAll closes every open connection (clients must dial again).
func (p *countingProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.open {
		c.Close()
	}
}

// TestAtprotoPDSDown: with the PDS stopped, the repo and its record say
// PDSUnreachable and back off (connection attempts are counted); after the
// PDS is back they are Ready and Synced without manual steps.
func TestAtprotoPDSDown(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	proxy := startProxy(t, fmt.Sprintf("127.0.0.1:%d", env.pds.Port), nil)
	c, _ := repoWorkspace(ctx, t, env.prefix+"-down", env.prefix+"down.test", proxy.URL())
	create(ctx, t, c, record("note", "repo", "note", `{"text":"before"}`))
	waitRecord(ctx, t, c, "note", atprotov1alpha1.ReasonSynced, nil)

	env.pds.Stop(20 * time.Second)
	defer func() {
		if env.pds.Exited() {
			if err := env.pds.Restart(context.WithoutCancel(ctx), env.group); err != nil {
				t.Errorf("restarting the PDS: %v", err)
			}
		}
	}()
	waitRecord(ctx, t, c, "note", atprotov1alpha1.ReasonPDSUnreachable, nil)
	before := proxy.conns.Load()
	time.Sleep(30 * time.Second)
	during := proxy.conns.Load() - before
	t.Logf("FIGURE connection attempts to the stopped PDS in 30s (repo + record, with backoff): %d", during)
	if during > 40 {
		t.Errorf("%d connection attempts in 30s to a stopped PDS: no backoff", during)
	}
	if err := env.pds.Restart(ctx, env.group); err != nil {
		t.Fatal(err)
	}
	waitRepo(ctx, t, c, "repo", atprotov1alpha1.ReasonReady)
	waitRecordEventually(ctx, t, c, "note", 6*time.Minute)
}

func waitRecordEventually(ctx context.Context, t *testing.T, c client.Client, name string, timeout time.Duration) {
	t.Helper()
	if err := framework.Eventually(ctx, timeout, name+" Synced again", func(ctx context.Context) (bool, string, error) {
		r := &atprotov1alpha1.AtprotoRecord{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, r); err != nil {
			return false, err.Error(), nil
		}
		cond := meta.FindStatusCondition(r.Status.Conditions, atprotov1alpha1.ConditionSynced)
		if cond == nil {
			return false, "", nil
		}
		return cond.Status == "True", cond.Reason, nil
	}); err != nil {
		t.Fatal(err)
	}
}

var loginsRE = regexp.MustCompile(`(?m)^knotless_vault_logins_total (\d+)`)

func vaultLogins(t *testing.T) int {
	t.Helper()
	m, err := env.provider.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	match := loginsRE.FindStringSubmatch(m)
	if match == nil {
		t.Fatal("no knotless_vault_logins_total metric")
	}
	n, _ := strconv.Atoi(match[1])
	return n
}

// TestVaultTokenRevoked: after the provider's Vault token is revoked, the
// next credential read logs in exactly once more.
func TestVaultTokenRevoked(t *testing.T) {
	if env.vault == nil {
		t.Skip("KNOTLESS_E2E_SKIP_VAULT is set")
	}
	defer failWithLogs(t)
	ctx := t.Context()
	c, lc := appWorkspace(ctx, t, env.prefix+"-revoke")
	acct, err := env.pds.CreateAccount(ctx, env.prefix+"revoke.test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.vault.Write(ctx, "secret/data/knotless/"+lc+"/default/account", map[string]any{"data": map[string]any{"password": acct.AppPassword}}); err != nil {
		t.Fatal(err)
	}
	vaultRepo := func(name string) *atprotov1alpha1.AtprotoRepo {
		r := secretRepo(name, acct.Handle, "")
		r.Spec.Credential.SecretKeyRef = nil
		r.Spec.Credential.Vault = &atprotov1alpha1.VaultKeyRef{Mount: "secret", Path: "knotless/" + lc + "/default/account", Key: "password"}
		return r
	}
	create(ctx, t, c, vaultRepo("first"))
	waitRepo(ctx, t, c, "first", atprotov1alpha1.ReasonReady)
	before := vaultLogins(t)
	if _, err := env.vault.Write(ctx, "sys/leases/revoke-prefix/auth/approle/login", map[string]any{}); err != nil {
		t.Fatal(err)
	}
	names := []string{"second", "third", "fourth"}
	for _, n := range names {
		create(ctx, t, c, vaultRepo(n))
	}
	for _, n := range names {
		waitRepo(ctx, t, c, n, atprotov1alpha1.ReasonReady)
	}
	after := vaultLogins(t)
	t.Logf("Vault logins: %d before the revocation, %d after three reads", before, after)
	if after-before != 1 {
		t.Fatalf("want exactly one re-login after the revocation, got %d", after-before)
	}
}

// TestAtprotoCABundleRotation: a PDS behind TLS with a private CA (a
// proxy, which the account's DID document names) is reached through the
// repo's CA bundle ConfigMap. When the PDS's
// certificate is replaced by one of another CA, writes fail with
// PDSUnreachable naming the certificate; updating the ConfigMap (no
// restart) makes the repo connect again and the record sync (R08).
func TestAtprotoCABundleRotation(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	ca1, err := framework.NewCA("pds-ca-1")
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := framework.NewCA("pds-ca-2")
	if err != nil {
		t.Fatal(err)
	}
	cert1, err := ca1.Issue("pds", "127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	cert2, err := ca2.Issue("pds", "127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	proxy := startProxy(t, fmt.Sprintf("127.0.0.1:%d", env.pds.Port), &cert1)

	c, _ := appWorkspace(ctx, t, env.prefix+"-ca")
	acct, err := env.pds.CreateAccount(ctx, env.prefix+"ca.test")
	if err != nil {
		t.Fatal(err)
	}
	movePDSEndpoint(ctx, t, acct.DID, proxy.URL())
	bundle := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pds-ca", Namespace: "default"}, Data: map[string]string{"ca.crt": string(ca1.PEM)}}
	repo := secretRepo("repo", acct.Handle, "cred")
	repo.Spec.PDS.URL = proxy.URL()
	repo.Spec.PDS.CABundle = &atprotov1alpha1.ObjectKeyRef{Kind: "ConfigMap", Name: "pds-ca", Key: "ca.crt"}
	create(ctx, t, c, bundle, passwordSecret("cred", acct.AppPassword), repo, record("note", "repo", "note", `{"text":"ca1"}`))
	waitRepo(ctx, t, c, "repo", atprotov1alpha1.ReasonReady)
	waitRecord(ctx, t, c, "note", atprotov1alpha1.ReasonSynced, nil)

	// The PDS now presents a certificate of another CA.
	proxy.cert.Store(&cert2)
	proxy.closeAll()
	rec := &atprotov1alpha1.AtprotoRecord{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "note"}, rec); err != nil {
		t.Fatal(err)
	}
	rec.Spec.Value = apiextensionsv1.JSON{Raw: []byte(`{"text":"ca2"}`)}
	if err := c.Update(ctx, rec, client.FieldOwner("e2e-user")); err != nil {
		t.Fatal(err)
	}
	rec = waitRecord(ctx, t, c, "note", atprotov1alpha1.ReasonPDSUnreachable, nil)
	if cond := meta.FindStatusCondition(rec.Status.Conditions, atprotov1alpha1.ConditionSynced); !strings.Contains(cond.Message, "certificate") {
		t.Errorf("condition message %q does not say that the certificate is the problem", cond.Message)
	}

	// The operator updates the bundle; nothing is restarted.
	bundle.Data["ca.crt"] = string(ca2.PEM)
	if err := c.Update(ctx, bundle); err != nil {
		t.Fatal(err)
	}
	waitRecordEventually(ctx, t, c, "note", 2*time.Minute)
	if got, err := getRecord(ctx, acct.DID, testCollection, "note"); err != nil || field(got.Value, "text") != "ca2" {
		t.Fatalf("PDS has %+v (%v), want the edited value", got, err)
	}
}

// TestAtprotoRecordsDeletedWhileProviderDown: AtprotoRecords have no
// finalizer; each record is written with its marker in the repo's
// inventory (dev.knotless.inventory) in one commit. After a kill -9:
//   - objects deleted while the provider is down have their records
//     deleted from the PDS after the restart;
//   - a kill in the middle of 100 writes (records on the PDS whose
//     statuses were never written), then deleting every object while the
//     provider is down, leaves none of them behind;
//   - an object of an older version (the finalizer atproto.knotless.dev/record,
//     a record without a marker) is taken into the inventory, loses the
//     finalizer and is deleted from the PDS when it goes;
//   - deleting the repo deletes every record it wrote.
//
// A record of another writer in the same collection survives all of it.
func TestAtprotoRecordsDeletedWhileProviderDown(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	c, _ := appWorkspace(ctx, t, env.prefix+"-inv")
	acct, err := env.pds.CreateAccount(ctx, env.prefix+"inventory.test")
	if err != nil {
		t.Fatal(err)
	}
	create(ctx, t, c, passwordSecret("cred", acct.AppPassword), secretRepo("repo", acct.Handle, "cred"))
	repo := waitRepo(ctx, t, c, "repo", atprotov1alpha1.ReasonReady)
	sess, err := env.pds.CreateSession(ctx, acct.Handle, acct.Password)
	if err != nil {
		t.Fatal(err)
	}
	put := func(rkey, text string) {
		t.Helper()
		in := map[string]any{"repo": acct.DID, "collection": testCollection, "rkey": rkey, "record": map[string]any{"$type": testCollection, "text": text}}
		if err := env.pds.XRPC(ctx, "com.atproto.repo.putRecord", sess.AccessJWT, nil, in, nil); err != nil {
			t.Fatal(err)
		}
	}
	put("foreign", "another writer's")
	// inventory returns the rkeys the repo's inventory lists.
	inventory := func() []string {
		var out []string
		for _, r := range listCollection(ctx, t, env.pds, acct.DID, pds.InventoryCollection) {
			var m pds.Marker
			_ = json.Unmarshal(r.Value, &m)
			if m.Owner == string(repo.UID) && m.Collection == testCollection {
				out = append(out, m.RKey)
			}
		}
		slices.Sort(out)
		return out
	}
	// waitOnPDS waits until the collection holds exactly want (and the
	// other writer's record) and the inventory lists exactly want.
	waitOnPDS := func(what string, want ...string) {
		t.Helper()
		slices.Sort(want)
		all := append(slices.Clone(want), "foreign")
		slices.Sort(all)
		if err := framework.Eventually(ctx, 3*time.Minute, what, func(ctx context.Context) (bool, string, error) {
			var got []string
			for rkey := range listRecords(ctx, t, acct.DID) {
				got = append(got, rkey)
			}
			slices.Sort(got)
			inv := inventory()
			return slices.Equal(got, all) && slices.Equal(inv, want), fmt.Sprintf("records %v, inventory %v", got, inv), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	deleteRecords := func(names ...string) {
		t.Helper()
		for _, n := range names {
			if err := c.Delete(ctx, &atprotov1alpha1.AtprotoRecord{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: n}}); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Objects deleted while the provider is down.
	for i := range 5 {
		create(ctx, t, c, record(fmt.Sprintf("a%d", i), "repo", fmt.Sprintf("a%d", i), fmt.Sprintf(`{"text":"a%d"}`, i)))
	}
	waitAllSynced(ctx, t, c, 5, 2*time.Minute)
	waitOnPDS("five records and their markers", "a0", "a1", "a2", "a3", "a4")
	env.provider.Kill9()
	start := time.Now()
	deleteRecords("a0", "a1", "a2")
	if err := env.provider.Restart(ctx, env.group); err != nil {
		t.Fatal(err)
	}
	waitOnPDS("the records deleted while the provider was down to leave the PDS", "a3", "a4")
	t.Logf("FIGURE 3 records deleted while the provider was down: gone from the PDS %s after the kill", time.Since(start).Round(time.Millisecond))
	waitEvent(ctx, t, c, "repo", "Pruned")

	// kill -9 in the middle of 100 writes, then every object deleted while
	// the provider is down.
	const n = 100
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range n {
		g.Go(func() error {
			return c.Create(gctx, record(fmt.Sprintf("k%03d", i), "repo", fmt.Sprintf("k%03d", i), fmt.Sprintf(`{"text":"k%03d"}`, i)))
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	// Kill while the writes go on: records on the PDS whose statuses were
	// not written yet (counted below).
	if err := framework.EventuallyEvery(ctx, 20*time.Millisecond, 2*time.Minute, "some of the 100 records to be written", func(ctx context.Context) (bool, string, error) {
		got := len(listRecords(ctx, t, acct.DID))
		return got >= 3+10, strconv.Itoa(got), nil
	}); err != nil {
		t.Fatal(err)
	}
	env.provider.Kill9()
	onPDS := listRecords(ctx, t, acct.DID)
	var list atprotov1alpha1.AtprotoRecordList
	if err := c.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	unreported := 0
	for _, r := range list.Items {
		if _, ok := onPDS[r.Spec.RKey]; ok && r.Status.CID == "" {
			unreported++
		}
	}
	t.Logf("killed the provider with %d of %d records on the PDS, %d of them without a status", len(onPDS)-3, n, unreported)
	var names []string
	for i := range n {
		names = append(names, fmt.Sprintf("k%03d", i))
	}
	deleteRecords(names...)
	if err := env.provider.Restart(ctx, env.group); err != nil {
		t.Fatal(err)
	}
	waitOnPDS("none of the 100 records left after the restart", "a3", "a4")

	// An object of an older version: the finalizer, and a record written
	// without a marker.
	put("legacy", "legacy")
	legacy := record("legacy", "repo", "legacy", `{"text":"legacy"}`)
	legacy.Finalizers = []string{"atproto.knotless.dev/record"}
	create(ctx, t, c, legacy)
	waitRecord(ctx, t, c, "legacy", atprotov1alpha1.ReasonSynced, func(r *atprotov1alpha1.AtprotoRecord) bool { return len(r.Finalizers) == 0 })
	waitOnPDS("the legacy record in the inventory", "a3", "a4", "legacy")
	deleteRecords("legacy")
	waitOnPDS("the legacy record deleted", "a3", "a4")

	// Deleting the repo deletes what it wrote, and nothing else.
	if err := c.Delete(ctx, repo); err != nil {
		t.Fatal(err)
	}
	if err := framework.Eventually(ctx, 2*time.Minute, "the repo and its records to be gone", func(ctx context.Context) (bool, string, error) {
		var left atprotov1alpha1.AtprotoRecordList
		if err := c.List(ctx, &left); err != nil {
			return false, err.Error(), nil
		}
		err := c.Get(ctx, client.ObjectKeyFromObject(repo), &atprotov1alpha1.AtprotoRepo{})
		return apierrors.IsNotFound(err) && len(left.Items) == 0, fmt.Sprintf("repo: %v, %d records", err, len(left.Items)), nil
	}); err != nil {
		t.Fatal(err)
	}
	waitOnPDS("only the other writer's record after the repo went")
	if got, err := getRecord(ctx, acct.DID, testCollection, "foreign"); err != nil || field(got.Value, "text") != "another writer's" {
		t.Fatalf("the other writer's record: %+v, %v", got, err)
	}
}
