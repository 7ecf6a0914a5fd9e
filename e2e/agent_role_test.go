package e2e

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/knotless-dev/knotless/internal/bootstrap"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	agentdeploy "github.com/knotless-dev/knotless/deploy/agent"
	"github.com/knotless-dev/knotless/e2e/framework"
)

// agentKubeconfig gives knotless-agent the identity it ships with, as a
// bidder does (docs/compute.md#its-credential): the market-bidder
// WorkspaceType's initializer (the provider) made deploy/agent/rbac.yaml's
// objects in the bidder workspace ws before it was Ready, the
// workspace's owner (c) asks for a token of its ServiceAccount (kubectl
// create token) and the kubeconfig names the workspace and that token
// only.
func agentKubeconfig(ctx context.Context, t *testing.T, c client.Client, ws string) string {
	t.Helper()
	return agentKubeconfigOn(ctx, t, env.home(), c, ws)
}

// agentKubeconfigOn is agentKubeconfig for a workspace of the installation
// in.
func agentKubeconfigOn(ctx context.Context, t *testing.T, in *installation, c client.Client, ws string) string {
	t.Helper()
	objs, err := bootstrap.Decode(bytes.NewReader(agentdeploy.RBAC))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range objs {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(want.GroupVersionKind())
		if err := c.Get(ctx, client.ObjectKeyFromObject(want), got); err != nil {
			t.Fatalf("%s %s of deploy/agent/rbac.yaml in the new bidder workspace %s: %v (the WorkspaceType's initializer makes it)", want.GetKind(), want.GetName(), ws, err)
		}
		for _, field := range []string{"rules", "roleRef", "subjects"} {
			if w, g := want.Object[field], got.Object[field]; !apiequality.Semantic.DeepEqual(w, g) {
				t.Errorf("%s %s in %s: %s %v, want %v", want.GetKind(), want.GetName(), ws, field, g, w)
			}
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
