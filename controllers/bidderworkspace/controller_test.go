package bidderworkspace

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/knotless-dev/knotless/internal/bootstrap"

	kcpcorev1alpha1 "github.com/kcp-dev/sdk/apis/core/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/knotless-dev/knotless/deploy/agent"
	"github.com/knotless-dev/knotless/workspacetypes"
)

const mine = kcpcorev1alpha1.LogicalClusterInitializer("root:knotless:market-bidder")

// t0 is when the test's workspace was created.
var t0 = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

// fakeCluster is a cluster.Cluster whose client is c.
type fakeCluster struct {
	cluster.Cluster
	c client.Client
}

func (f fakeCluster) GetClient() client.Client { return f.c }

func setup(t *testing.T, initializers ...kcpcorev1alpha1.LogicalClusterInitializer) (*Reconciler, client.Client) {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, kcpcorev1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	lc := &kcpcorev1alpha1.LogicalCluster{ObjectMeta: metav1.ObjectMeta{Name: kcpcorev1alpha1.LogicalClusterName, CreationTimestamp: metav1.NewTime(t0)},
		Status: kcpcorev1alpha1.LogicalClusterStatus{Phase: kcpcorev1alpha1.LogicalClusterPhaseInitializing, Initializers: initializers}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(lc).WithStatusSubresource(lc).Build()
	objs, err := bootstrap.Decode(bytes.NewReader(agent.RBAC))
	if err != nil {
		t.Fatal(err)
	}
	return &Reconciler{
		GetCluster: func(context.Context, multicluster.ClusterName) (cluster.Cluster, error) {
			return fakeCluster{c: c}, nil
		},
		Initializer: mine,
		Objects:     objs,
		Now:         func() time.Time { return t0.Add(10 * time.Second) },
	}, c
}

func reconcileOnce(t *testing.T, r *Reconciler) {
	t.Helper()
	if _, err := r.Reconcile(t.Context(), mcreconcile.Request{ClusterName: "abc", Request: reconcile.Request{NamespacedName: types.NamespacedName{Name: kcpcorev1alpha1.LogicalClusterName}}}); err != nil {
		t.Fatal(err)
	}
}

// The shipped manifest is what the agent needs: its ServiceAccount, its
// ClusterRole and their binding, nothing else.
func TestManifestIsTheAgentsIdentity(t *testing.T) {
	objs, err := bootstrap.Decode(bytes.NewReader(agent.RBAC))
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName())
	}
	want := []string{"ServiceAccount default/knotless-agent", "ClusterRole /knotless:agent", "ClusterRoleBinding /knotless:agent"}
	if !slices.Equal(kinds, want) {
		t.Errorf("deploy/agent/rbac.yaml holds %v, want %v", kinds, want)
	}
}

// A workspace with the initializer gets the agent's identity, then the
// initializer is taken off and only it: the others stay.
func TestInitializingWorkspaceGetsTheAgentsIdentity(t *testing.T) {
	r, c := setup(t, "root:universal", mine, "system:apibindings")
	reconcileOnce(t, r)
	ctx := t.Context()
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "knotless-agent"}, &corev1.ServiceAccount{}); err != nil {
		t.Errorf("the agent's ServiceAccount: %v", err)
	}
	role := &rbacv1.ClusterRole{}
	if err := c.Get(ctx, client.ObjectKey{Name: "knotless:agent"}, role); err != nil || len(role.Rules) == 0 {
		t.Errorf("the agent's ClusterRole: %v, %d rules", err, len(role.Rules))
	}
	binding := &rbacv1.ClusterRoleBinding{}
	if err := c.Get(ctx, client.ObjectKey{Name: "knotless:agent"}, binding); err != nil || binding.RoleRef.Name != "knotless:agent" ||
		len(binding.Subjects) != 1 || binding.Subjects[0].Name != "knotless-agent" {
		t.Errorf("the agent's ClusterRoleBinding: %v, %+v", err, binding)
	}
	lc := &kcpcorev1alpha1.LogicalCluster{}
	if err := c.Get(ctx, client.ObjectKey{Name: kcpcorev1alpha1.LogicalClusterName}, lc); err != nil {
		t.Fatal(err)
	}
	if want := []kcpcorev1alpha1.LogicalClusterInitializer{"root:universal", "system:apibindings"}; !slices.Equal(lc.Status.Initializers, want) {
		t.Errorf("initializers %v, want %v", lc.Status.Initializers, want)
	}
}

// A workspace this initializer is done with (or never had) is not
// touched: a role its owner changed or deleted since stays so.
func TestInitializedWorkspaceIsLeftAlone(t *testing.T) {
	r, c := setup(t, "system:apibindings")
	reconcileOnce(t, r)
	var roles rbacv1.ClusterRoleList
	if err := c.List(t.Context(), &roles); err != nil || len(roles.Items) != 0 {
		t.Errorf("ClusterRoles %v (%v), want none", roles.Items, err)
	}
}

// Another initializer that leaves while this one works is not put back:
// the patch carries the resourceVersion it read, kcp refuses it, and the
// next pass reads the list again.
func TestInitializerLeftMeanwhileIsNotPutBack(t *testing.T) {
	r, c := setup(t, mine, "system:apibindings")
	raced := false
	r.GetCluster = func(context.Context, multicluster.ClusterName) (cluster.Cluster, error) {
		return fakeCluster{c: interceptor.NewClient(c.(client.WithWatch), interceptor.Funcs{
			SubResourcePatch: func(ctx context.Context, cl client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
				if !raced {
					raced = true
					lc := &kcpcorev1alpha1.LogicalCluster{}
					if err := cl.Get(ctx, client.ObjectKeyFromObject(obj), lc); err != nil {
						return err
					}
					lc.Status.Initializers = []kcpcorev1alpha1.LogicalClusterInitializer{mine}
					if err := cl.Status().Update(ctx, lc); err != nil {
						return err
					}
				}
				return cl.SubResource(sub).Patch(ctx, obj, patch, opts...)
			},
		})}, nil
	}
	req := mcreconcile.Request{ClusterName: "abc", Request: reconcile.Request{NamespacedName: types.NamespacedName{Name: kcpcorev1alpha1.LogicalClusterName}}}
	if res, err := r.Reconcile(t.Context(), req); err != nil || res.RequeueAfter == 0 || !raced {
		t.Fatalf("the first pass: %+v, %v, want a conflict and a pass again soon", res, err)
	}
	reconcileOnce(t, r)
	lc := &kcpcorev1alpha1.LogicalCluster{}
	if err := c.Get(t.Context(), client.ObjectKey{Name: kcpcorev1alpha1.LogicalClusterName}, lc); err != nil {
		t.Fatal(err)
	}
	if len(lc.Status.Initializers) != 0 {
		t.Errorf("initializers %v, want none (system:apibindings left meanwhile)", lc.Status.Initializers)
	}
}

// A refusal while the workspace is new is tried again (kcp admits the
// owner through a binding it makes beside the workspace); an owner who
// still may not make the agent's identity after GiveUpAfter does not
// hold the workspace Initializing: the initializer leaves without it.
func TestForbiddenIdentityIsTriedAgainThenLeft(t *testing.T) {
	r, c := setup(t, mine)
	refuse := true
	r.GetCluster = func(context.Context, multicluster.ClusterName) (cluster.Cluster, error) {
		return fakeCluster{c: interceptor.NewClient(c.(client.WithWatch), interceptor.Funcs{
			Apply: func(ctx context.Context, cl client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
				if refuse {
					return apierrors.NewForbidden(rbacv1.Resource("clusterroles"), "knotless:agent", errors.New("the owner's binding is not there yet"))
				}
				return cl.Apply(ctx, obj, opts...)
			},
		})}, nil
	}
	initializers := func() []kcpcorev1alpha1.LogicalClusterInitializer {
		lc := &kcpcorev1alpha1.LogicalCluster{}
		if err := c.Get(t.Context(), client.ObjectKey{Name: kcpcorev1alpha1.LogicalClusterName}, lc); err != nil {
			t.Fatal(err)
		}
		return lc.Status.Initializers
	}
	req := mcreconcile.Request{ClusterName: "abc", Request: reconcile.Request{NamespacedName: types.NamespacedName{Name: kcpcorev1alpha1.LogicalClusterName}}}
	if res, err := r.Reconcile(t.Context(), req); err != nil || res.RequeueAfter == 0 || len(initializers()) != 1 {
		t.Fatalf("refused on a new workspace: %+v, %v, initializers %v; want a pass again soon, the initializer kept", res, err, initializers())
	}
	refuse = false
	reconcileOnce(t, r)
	if err := c.Get(t.Context(), client.ObjectKey{Name: "knotless:agent"}, &rbacv1.ClusterRole{}); err != nil || len(initializers()) != 0 {
		t.Fatalf("after the refusal passed: the role %v, initializers %v", err, initializers())
	}

	r, c = setup(t, mine)
	refuse = true
	r.Now = func() time.Time { return t0.Add(3 * time.Minute) }
	r.GetCluster = func(context.Context, multicluster.ClusterName) (cluster.Cluster, error) {
		return fakeCluster{c: interceptor.NewClient(c.(client.WithWatch), interceptor.Funcs{
			Apply: func(context.Context, client.WithWatch, runtime.ApplyConfiguration, ...client.ApplyOption) error {
				return apierrors.NewForbidden(rbacv1.Resource("clusterroles"), "knotless:agent", errors.New("attempting to grant RBAC permissions not currently held"))
			},
		})}, nil
	}
	reconcileOnce(t, r)
	if got := initializers(); len(got) != 0 {
		t.Errorf("refused past GiveUpAfter: initializers %v, want none", got)
	}
}

// The type names this package as its initializer, and gives it no
// initializerPermissions: on a kcp that honours them the virtual
// workspace would act with those rules instead of as the workspace's
// owner, and "grants nothing the owner does not hold" would no longer be
// kcp's to check.
func TestWorkspaceTypeInitializesAsTheOwner(t *testing.T) {
	raw, err := workspacetypes.FS.ReadFile(WorkspaceType + ".yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := bootstrap.Decode(bytes.NewReader(raw))
	if err != nil || len(objs) != 1 {
		t.Fatalf("%s.yaml: %d objects, %v", WorkspaceType, len(objs), err)
	}
	spec, _ := objs[0].Object["spec"].(map[string]any)
	if spec["initializer"] != true {
		t.Errorf("spec.initializer %v, want true", spec["initializer"])
	}
	if _, ok := spec["initializerPermissions"]; ok {
		t.Error("spec.initializerPermissions is set")
	}
}
