package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
)

// fence is one fenced block of a Markdown file: its language and text.
type fence struct{ lang, text string }

// fences returns the fenced blocks of a Markdown text, in order.
func fences(md string) []fence {
	var out []fence
	var cur *fence
	for line := range strings.SplitSeq(md, "\n") {
		trimmed := strings.TrimSpace(line) // a fence may be indented (in a list)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			cur = &fence{lang: strings.TrimPrefix(trimmed, "```")}
		case cur != nil && trimmed == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
	}
	return out
}

// TestBidderGuide walks docs/bidder.md as a new bidder does, from nothing
// to a bidder that earns. Its shell blocks run in bash, in order, as bob
// (an unprivileged kcp user) with the pinned kubectl and kubectl-ws; its
// @atproto/api snippet makes the app password with node. Nothing else
// sets the bidder up: the workspace, its Secret, repo, network, identity
// and bidder, the vouching and the agent's kubeconfig are the guide's.
// The guide's text changes only where it names this installation: the
// provider workspace, the PDS, the account and the requester's DID; the
// manifest of section 3 is docs/examples/market-bidder.yaml with the same
// changes. The release's install block (systemd) is left to
// TestContainerImages. A requester the suite sets up buys a VM; the agent
// runs it with the guide's kubeconfig, and section 6's kubectl shows the
// contract Active and the VM Running. A shell block the test does not
// know fails it (a fenced block of any other kind too), so the guide and
// the test change together. The bidder workspace is named after the
// suite (the guide's acme). Cost: one
// process VM (about 1.5 min in all).
func TestBidderGuide(t *testing.T) {
	runLast(t)
	defer failWithLogs(t)
	ctx := t.Context()
	bobCfg, err := env.kcp.UserConfig("bob")
	if err != nil {
		t.Skip("no token user bob on this kcp")
	}
	repoRoot, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	kubectl := script(t, repoRoot, "hack/node-image/build.sh", "--kubectl")
	bin := t.TempDir()
	if err := os.Symlink(kubectl, filepath.Join(bin, "kubectl")); err != nil {
		t.Fatal(err)
	}
	// The bidder's account, on the suite's PDS (made by the PDS's
	// operator; the guide starts from an account and its password).
	acme, err := env.pds.CreateAccount(ctx, env.prefix+"guideacme.test")
	if err != nil {
		t.Fatal(err)
	}
	// The requester's side, on the network of the guide's manifest (a
	// request names its network, "dev"), vouching without an operator:
	// its identity names acme's DID as a bidder it approves.
	d := &deal{accounts: map[string]*framework.Account{}, appWS: env.prefix + "-guide-buyer"}
	d.app = userWorkspace(ctx, t, d.appWS, "socialweb-application")
	create(ctx, t, d.app, network("dev", []string{env.pds.URL}, ""))
	d.accounts["buyer"] = participant(ctx, t, d.app, env.pds, env.prefix+"guidebuyer.test", "buyer", "dev",
		marketv1alpha1.Association{DID: acme.DID, Roles: []marketv1alpha1.Role{marketv1alpha1.RoleBidder}})

	// The guide, in a directory of the bidder's.
	dir := t.TempDir()
	wsName := env.prefix + "-acme"
	here := map[string]string{
		"ws create acme --type":       "ws create " + wsName + " --type",
		"root:knotless:market-bidder": env.home().providerWS.Join("market-bidder").String(),
		"http://127.0.0.1:2583":       env.pds.URL,
		"https://pds.example.com":     env.pds.URL,
		"acmecloud.example":           acme.Handle,
		"acmecloud.test":              acme.Handle,
		"did:plc:…":                   d.accounts["buyer"].DID,
	}
	localize := func(s string) string {
		for from, to := range here {
			s = strings.ReplaceAll(s, from, to)
		}
		return s
	}
	manifest := localize(readFile(t, filepath.Join(repoRoot, "docs/examples/market-bidder.yaml")))
	if err := os.WriteFile(filepath.Join(dir, "market-bidder.yaml"), []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(repoRoot, "hack/stack/node_modules"), filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	environ := append(os.Environ(),
		"KUBECONFIG="+writeKubeconfig(t, bobCfg, root),
		"PATH="+bin+string(os.PathListSeparator)+filepath.Dir(env.kcpBin)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"ACCOUNT_PASSWORD="+acme.Password)
	runQuiet := func(name, text string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Dir, cmd.Env = dir, environ
		start := time.Now()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("the guide's %s:\n%s\nfailed (%v):\n%s", name, text, err, out)
		}
		t.Logf("the guide's %s (%s)", name, time.Since(start).Round(time.Millisecond))
		return string(out)
	}
	run := func(name, text string, args ...string) string {
		t.Helper()
		out := runQuiet(name, text, args...)
		t.Logf("%s", strings.TrimSpace(out))
		return out
	}

	var earning string
	for i, f := range fences(readFile(t, filepath.Join(repoRoot, "docs/bidder.md"))) {
		text := localize(f.text)
		switch {
		case f.lang == "js" && strings.Contains(text, "createAppPassword"):
			script := filepath.Join(dir, "app-password.mjs")
			if err := os.WriteFile(script, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			pw := strings.TrimSpace(runQuiet("app password (@atproto/api)", text, framework.NodeBin(repoRoot), script))
			if pw == "" || strings.Contains(pw, "\n") {
				t.Fatalf("the guide's snippet printed %q, want one app password", pw)
			}
			environ = append(environ, "APP_PASSWORD="+pw)
		case f.lang != "sh":
			t.Fatalf("docs/bidder.md has a %q block TestBidderGuide does not know (sh and the js app-password snippet are walked):\n%s", f.lang, f.text)
		case strings.Contains(text, "tar xzf knotless-agent"):
			t.Logf("block %d installs the release's agent with systemd: TestContainerImages checks the release; the agent runs below from this tree", i)
		case strings.Contains(text, "kubectl get bids,computecontracts,computevms"):
			earning = text
		case strings.Contains(text, "kubectl ws create"),
			strings.Contains(text, "kubectl create secret generic acme-pds"),
			strings.Contains(text, "kubectl apply -f market-bidder.yaml"),
			strings.Contains(text, "kubectl patch marketidentity acme"),
			strings.Contains(text, "agent.kubeconfig"):
			run("block "+strings.Fields(text)[1], text, "bash", "-euo", "pipefail", "-c", text)
		default:
			t.Fatalf("docs/bidder.md has a shell block TestBidderGuide does not walk:\n%s", f.text)
		}
	}
	if earning == "" {
		t.Fatal("docs/bidder.md has no block that shows the bidder earning")
	}

	// The agent, with the kubeconfig the guide made and nothing else.
	startAgent(ctx, t, wsName, filepath.Join(dir, "agent.kubeconfig"))
	spec := requesterSpec("buyer", 1000, 1024, 50, 5)
	spec.NetworkRef.Name = "dev"
	d.requester(ctx, t, "vms", spec)
	bid, err := framework.ClientFor(bobCfg, root.Join(wsName))
	if err != nil {
		t.Fatal(err)
	}
	d.bid = bid
	t.Cleanup(func() { d.dumpOnFailure(t) })
	cc := contractOf(ctx, t, bid, "acme", "acme's contract Active (its VM runs)", func(cc *marketv1alpha1.ComputeContract) bool {
		return cc.Status.Phase == marketv1alpha1.ContractActive
	})
	waitVM(ctx, t, bid, cc.Name, "acme's VM Running", time.Minute, func(vm *computev1alpha1.ComputeVM) bool {
		return vm.Status.Phase == computev1alpha1.VMRunning
	})
	// As the guide leaves its reader: in the bidder workspace.
	out := run("section 6 (earning)", earning, "bash", "-euo", "pipefail", "-c", localize(earning))
	if !strings.Contains(out, "Active") || !strings.Contains(out, "Running") || !strings.Contains(out, cc.Name) {
		t.Errorf("section 6's kubectl shows no Active contract and Running VM:\n%s", out)
	}
	if err := d.app.Delete(ctx, getMR(ctx, t, d.app, "vms")); err != nil {
		t.Fatal(err)
	}
	if err := framework.Eventually(ctx, 2*time.Minute, "acme's VM gone", func(ctx context.Context) (bool, string, error) {
		var vms computev1alpha1.ComputeVMList
		if err := bid.List(ctx, &vms, client.InNamespace("default")); err != nil {
			return false, err.Error(), nil
		}
		return len(vms.Items) == 0, "", nil
	}); err != nil {
		t.Error(err)
	}
}
