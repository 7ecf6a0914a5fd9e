package e2e

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/knotless-dev/knotless/e2e/framework"
)

// leaderArgs are the leader election flags of the replicas in
// TestProviderLeaderElection (shorter than the defaults, 15s/10s/2s).
var leaderArgs = []string{"--leader-elect", "--leader-election-lease-duration", "10s", "--leader-election-renew-deadline", "8s", "--leader-election-retry-period", "2s"}

// isLeader reports whether the replica holds the Lease, from its metrics.
func isLeader(p *framework.Provider) bool {
	text, err := p.Metrics()
	return err == nil && framework.MetricSum(text, "leader_election_master_status") == 1
}

// reconciles is how many reconciles the replica ran, over every
// controller.
func reconciles(t *testing.T, p *framework.Provider) float64 {
	t.Helper()
	text, err := p.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	return framework.MetricSum(text, "controller_runtime_reconcile_total")
}

// TestProviderLeaderElection: two provider replicas with --leader-elect;
// exactly one reconciles. kill -9 of the leader while an Application's
// records are written: the other replica takes over, and the PDS ends
// equal to spec with nothing lost or written twice. Figure: the take-over
// time. The suite's provider (no leader election) is stopped meanwhile
// and started again at the end.
func TestProviderLeaderElection(t *testing.T) {
	defer failWithLogs(t)
	ctx := t.Context()
	main := env.provider
	main.Stop(30 * time.Second)
	t.Cleanup(func() {
		if err := main.Restart(context.WithoutCancel(ctx), env.group); err != nil {
			t.Errorf("restarting the suite's provider: %v", err)
		}
	})
	var replicas []*framework.Provider
	for _, name := range []string{"ha-a", "ha-b"} {
		dir := filepath.Join(env.dir, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		p, err := framework.StartProvider(ctx, env.group, main.Bin, dir, main.Kubeconfig, main.Workspace, ownWebhookPort(t, append(slices.Clone(main.Args), leaderArgs...))...)
		if err != nil {
			t.Fatal(err)
		}
		replicas = append(replicas, p)
		defer p.Stop(30 * time.Second)
	}
	var leader, standby *framework.Provider
	waitPDS(ctx, t, "one replica leads", func() (bool, string) {
		a, b := isLeader(replicas[0]), isLeader(replicas[1])
		switch {
		case a && !b:
			leader, standby = replicas[0], replicas[1]
		case b && !a:
			leader, standby = replicas[1], replicas[0]
		}
		return a != b, fmt.Sprintf("leader: a=%v b=%v", a, b)
	})

	// Only the leader reconciles.
	c, _ := appWorkspace(ctx, t, env.prefix+"-ha")
	acct, err := env.pds.CreateAccount(ctx, env.prefix+"ha.test")
	if err != nil {
		t.Fatal(err)
	}
	create(ctx, t, c, passwordSecret("cred", acct.AppPassword), shopApp(acct.Handle, "one", "v1"))
	waitApp(ctx, t, c, "Ready", 2*time.Minute)
	if n := reconciles(t, standby); n != 0 {
		t.Errorf("the standby replica ran %v reconciles", n)
	}
	if reconciles(t, leader) == 0 {
		t.Error("the leader ran no reconcile")
	}

	// kill -9 of the leader while ten records are being written.
	app := shopApp(acct.Handle)
	want := map[string]string{}
	for i := range 10 {
		rkey := fmt.Sprintf("r%02d", i)
		app.Spec.Components = append(app.Spec.Components, recordComponent(rkey, "text "+rkey))
		want[rkey] = "text " + rkey
	}
	app.Name = "more"
	app.Spec.Components = app.Spec.Components[1:] // the records use the repo of "shop"
	create(ctx, t, c, app)
	time.Sleep(time.Second)
	killed := time.Now()
	leader.Kill9()
	waitPDS(ctx, t, "the standby takes over", func() (bool, string) { return isLeader(standby), "standby not leading yet" })
	took := time.Since(killed)
	t.Logf("FIGURE leader killed -> the other replica leads: %s (lease 10s, retry 2s)", took.Round(100*time.Millisecond))

	if err := framework.Eventually(ctx, 2*time.Minute, "every record of the spec on the PDS", func(ctx context.Context) (bool, string, error) {
		var missing []string
		for rkey, text := range want {
			if got := pdsText(ctx, t, acct.DID, rkey); got != text {
				missing = append(missing, rkey)
			}
		}
		return len(missing) == 0, "missing or different: " + strings.Join(missing, ","), nil
	}); err != nil {
		t.Fatal(err)
	}
	var list struct {
		Records []struct {
			URI string `json:"uri"`
		} `json:"records"`
	}
	if err := env.pds.XRPC(ctx, "com.atproto.repo.listRecords", "", url.Values{"repo": {acct.DID}, "collection": {testCollection}, "limit": {"100"}}, nil, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Records) != len(want)+1 { // and "one" of the first Application
		t.Errorf("the PDS holds %d records of the collection, want %d", len(list.Records), len(want)+1)
	}
}

// ownWebhookPort gives a replica's admission webhook a port of its own:
// replicas of one machine cannot share the suite's provider's.
func ownWebhookPort(t *testing.T, args []string) []string {
	t.Helper()
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--admission-webhook-bind-address":
			args[i+1] = fmt.Sprintf("127.0.0.1:%d", port)
		case "--admission-webhook-url":
			args[i+1] = fmt.Sprintf("https://127.0.0.1:%d", port)
		}
	}
	return args
}
