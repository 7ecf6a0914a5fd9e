package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/e2e/framework"
)

// agentKubeconfig gives knotless-agent the identity it ships with, as a
// bidder does (deploy/agent/rbac.yaml, docs/compute.md#its-credential):
// the workspace's owner (c) applies the manifest in the bidder workspace
// ws, asks for a token of its ServiceAccount (kubectl create token) and
// the kubeconfig names the workspace and that token only.
func agentKubeconfig(ctx context.Context, t *testing.T, c client.Client, ws string) string {
	t.Helper()
	return agentKubeconfigOn(ctx, t, env.home(), c, ws)
}

// agentKubeconfigOn is agentKubeconfig for a workspace of the installation
// in.
func agentKubeconfigOn(ctx context.Context, t *testing.T, in *installation, c client.Client, ws string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "deploy", "agent", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("deploy/agent/rbac.yaml: %v", err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner("e2e-bidder"), client.ForceOwnership); err != nil {
			t.Fatalf("applying %s %s of deploy/agent/rbac.yaml in %s: %v", obj.GetKind(), obj.GetName(), ws, err)
		}
	}
	sa := &corev1.ServiceAccount{}
	sa.Name, sa.Namespace = "knotless-agent", "default"
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(time.Hour / time.Second))}}
	if err := c.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatalf("a token of the agent's ServiceAccount in %s: %v", ws, err)
	}
	if tr.Status.Token == "" {
		t.Fatalf("no token in the TokenRequest's status")
	}
	cfg := &rest.Config{Host: in.admin.Host, BearerToken: tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: in.admin.CAFile, CAData: in.admin.CAData}}
	// Nothing beyond what the agent uses: not the bidder's market objects,
	// not its ConfigMaps.
	agent, err := framework.ClientFor(cfg, root.Join(ws))
	if err != nil {
		t.Fatal(err)
	}
	for _, list := range []client.ObjectList{&marketv1alpha1.MarketBidderList{}, &marketv1alpha1.BidList{}, &corev1.ConfigMapList{}} {
		if err := agent.List(ctx, list); !apierrors.IsForbidden(err) {
			t.Errorf("the agent's identity lists %T: %v (want Forbidden)", list, err)
		}
	}
	return writeKubeconfig(t, cfg, root.Join(ws))
}
