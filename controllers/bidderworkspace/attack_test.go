package bidderworkspace

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	kcpcorev1alpha1 "github.com/kcp-dev/sdk/apis/core/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/knotless-dev/knotless/deploy/agent"
	"github.com/knotless-dev/knotless/internal/bootstrap"
)

// spy counts (and records) what the reconciler writes through the
// cluster's client. applyErr, when set, answers each Apply instead of the
// fake apiserver; onStatusPatch, when set, runs before a status patch
// reaches the fake apiserver and may answer it instead.
type spy struct {
	applied       []*unstructured.Unstructured
	statusPatches int
	statusBodies  [][]byte
	otherWrites   int
	applyErr      func(o *unstructured.Unstructured) error
	onStatusPatch func(ctx context.Context, cl client.Client, obj client.Object) error
}

func (s *spy) install(t *testing.T, r *Reconciler, c client.Client) {
	t.Helper()
	r.GetCluster = func(context.Context, multicluster.ClusterName) (cluster.Cluster, error) {
		return fakeCluster{c: interceptor.NewClient(c.(client.WithWatch), interceptor.Funcs{
			Apply: func(ctx context.Context, cl client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
				u, ok := obj.(interface{ UnstructuredContent() map[string]any })
				if !ok {
					t.Errorf("Apply of a %T, want an unstructured apply configuration", obj)
					return errors.New("unexpected apply configuration")
				}
				o := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(u.UnstructuredContent())}
				s.applied = append(s.applied, o)
				if s.applyErr != nil {
					if err := s.applyErr(o); err != nil {
						return err
					}
				}
				return cl.Apply(ctx, obj, opts...)
			},
			SubResourcePatch: func(ctx context.Context, cl client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
				s.statusPatches++
				if body, err := patch.Data(obj); err == nil {
					s.statusBodies = append(s.statusBodies, body)
				}
				if s.onStatusPatch != nil {
					if err := s.onStatusPatch(ctx, cl, obj); err != nil {
						return err
					}
				}
				return cl.SubResource(sub).Patch(ctx, obj, patch, opts...)
			},
			SubResourceUpdate: func(ctx context.Context, cl client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
				s.statusPatches++
				return cl.SubResource(sub).Update(ctx, obj, opts...)
			},
			SubResourceCreate: func(ctx context.Context, cl client.Client, sub string, obj, subResource client.Object, opts ...client.SubResourceCreateOption) error {
				s.otherWrites++
				return cl.SubResource(sub).Create(ctx, obj, subResource, opts...)
			},
			Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				s.otherWrites++
				return cl.Create(ctx, obj, opts...)
			},
			Update: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
				s.otherWrites++
				return cl.Update(ctx, obj, opts...)
			},
			Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
				s.otherWrites++
				return cl.Patch(ctx, obj, patch, opts...)
			},
			Delete: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
				s.otherWrites++
				return cl.Delete(ctx, obj, opts...)
			},
			DeleteAllOf: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.DeleteAllOfOption) error {
				s.otherWrites++
				return cl.DeleteAllOf(ctx, obj, opts...)
			},
		})}, nil
	}
}

func clusterRequest(name string) mcreconcile.Request {
	return mcreconcile.Request{ClusterName: "abc", Request: reconcile.Request{NamespacedName: types.NamespacedName{Name: name}}}
}

func initializersOf(t *testing.T, c client.Client) []kcpcorev1alpha1.LogicalClusterInitializer {
	t.Helper()
	lc := &kcpcorev1alpha1.LogicalCluster{}
	if err := c.Get(context.Background(), client.ObjectKey{Name: kcpcorev1alpha1.LogicalClusterName}, lc); err != nil {
		t.Fatal(err)
	}
	return lc.Status.Initializers
}

// assertNothingMade checks that none of the agent's objects exist.
func assertNothingMade(t *testing.T, c client.Client) {
	t.Helper()
	ctx := context.Background()
	var sas corev1.ServiceAccountList
	if err := c.List(ctx, &sas); err != nil || len(sas.Items) != 0 {
		t.Errorf("ServiceAccounts %d (%v), want none", len(sas.Items), err)
	}
	var roles rbacv1.ClusterRoleList
	if err := c.List(ctx, &roles); err != nil || len(roles.Items) != 0 {
		t.Errorf("ClusterRoles %d (%v), want none", len(roles.Items), err)
	}
	var bindings rbacv1.ClusterRoleBindingList
	if err := c.List(ctx, &bindings); err != nil || len(bindings.Items) != 0 {
		t.Errorf("ClusterRoleBindings %d (%v), want none", len(bindings.Items), err)
	}
}

// Attack 1: a LogicalCluster naming initializers that look like this one
// but are not it is no business of this initializer: nothing is applied
// and its initializers are not touched.
func TestAttackLookAlikeInitializerIsIgnored(t *testing.T) {
	lookAlikes := []kcpcorev1alpha1.LogicalClusterInitializer{
		"root:knotless:market-bidder-evil",
		"root:other:market-bidder",
		"root:knotless:market-bidder ",
		" root:knotless:market-bidder",
		"ROOT:knotless:market-bidder",
		"root:knotless:Market-Bidder",
		"market-bidder",
		"root:knotless:market-bidder\x00",
		"root:knotless:market-bidder:x",
		"root:knotless:market-bidder\u200b",
		"root:knotless",
		"",
	}
	for _, li := range lookAlikes {
		t.Run(string(li), func(t *testing.T) {
			r, c := setup(t, li, "system:apibindings")
			s := &spy{}
			s.install(t, r, c)
			reconcileOnce(t, r)
			if len(s.applied) != 0 || s.statusPatches != 0 || s.otherWrites != 0 {
				t.Errorf("look-alike %q: %d applies, %d status patches, %d other writes; want none", li, len(s.applied), s.statusPatches, s.otherWrites)
			}
			assertNothingMade(t, c)
			if got := initializersOf(t, c); len(got) != 2 || got[0] != li || got[1] != "system:apibindings" {
				t.Errorf("initializers %q, want [%q system:apibindings] untouched", got, li)
			}
		})
	}
	// All look-alikes at once, still without the real one.
	r, c := setup(t, lookAlikes...)
	s := &spy{}
	s.install(t, r, c)
	reconcileOnce(t, r)
	if len(s.applied) != 0 || s.statusPatches != 0 {
		t.Errorf("all look-alikes: %d applies, %d status patches; want none", len(s.applied), s.statusPatches)
	}
	assertNothingMade(t, c)
}

// Attack 2: a LogicalCluster whose creationTimestamp lies in the future.
// A Forbidden apply is retried only while the clock is before
// creationTimestamp+GiveUpAfter: the bound is relative to the stored
// timestamp, so a timestamp D ahead of the clock stretches the retries to
// D+GiveUpAfter (unbounded for a far-future timestamp). kcp, not the
// workspace's owner, sets creationTimestamp; this test records the
// behaviour: a steady 2s requeue with no error (so no exponential
// backoff), the initializer kept, then the give-up once the clock passes.
func TestAttackFutureCreationTimestampDelaysGiveUp(t *testing.T) {
	r, c := setup(t, mine)
	future := t0.Add(100 * 365 * 24 * time.Hour)
	lc := &kcpcorev1alpha1.LogicalCluster{}
	if err := c.Get(t.Context(), client.ObjectKey{Name: kcpcorev1alpha1.LogicalClusterName}, lc); err != nil {
		t.Fatal(err)
	}
	lc.CreationTimestamp = metav1.NewTime(future)
	if err := c.Update(t.Context(), lc); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(t.Context(), client.ObjectKey{Name: kcpcorev1alpha1.LogicalClusterName}, lc); err != nil {
		t.Fatal(err)
	}
	if !lc.CreationTimestamp.Time.Equal(future) {
		// The fake apiserver kept its own timestamp: move the clock back
		// instead, which is the same to the reconciler.
		t.Logf("creationTimestamp %v stuck; moving the clock back instead", lc.CreationTimestamp)
		future = lc.CreationTimestamp.Time
		now := future.Add(-100 * 365 * 24 * time.Hour)
		r.Now = func() time.Time { return now }
	}
	s := &spy{applyErr: func(*unstructured.Unstructured) error {
		return apierrors.NewForbidden(rbacv1.Resource("clusterroles"), "knotless:agent", errors.New("attempting to grant RBAC permissions not currently held"))
	}}
	s.install(t, r, c)

	// Well past the usual GiveUpAfter (an hour of 2s retries), it still
	// retries: the bound comes from the future timestamp.
	start := r.now()
	for i := range 1800 {
		now := start.Add(time.Duration(i) * 2 * time.Second)
		r.Now = func() time.Time { return now }
		res, err := r.Reconcile(t.Context(), clusterRequest(kcpcorev1alpha1.LogicalClusterName))
		if err != nil || res.RequeueAfter != 2*time.Second {
			t.Fatalf("pass %d at %v: %+v, %v; want a steady 2s requeue", i, now, res, err)
		}
	}
	if got := initializersOf(t, c); len(got) != 1 || s.statusPatches != 0 {
		t.Fatalf("after an hour of refusals: initializers %v, %d status patches; want the initializer kept (retries bounded only by the future timestamp)", got, s.statusPatches)
	}
	t.Logf("FINDING (low): with creationTimestamp %v ahead of the clock, a Forbidden apply is retried every 2s until then+GiveUpAfter", future.Sub(start))

	// Just before creationTimestamp+GiveUpAfter: still retried.
	edge := future.Add(r.giveUpAfter() - time.Nanosecond)
	r.Now = func() time.Time { return edge }
	if res, err := r.Reconcile(t.Context(), clusterRequest(kcpcorev1alpha1.LogicalClusterName)); err != nil || res.RequeueAfter == 0 {
		t.Fatalf("just before the give-up: %+v, %v", res, err)
	}
	// Once the clock reaches it, the initializer gives up and leaves.
	after := future.Add(r.giveUpAfter())
	r.Now = func() time.Time { return after }
	if res, err := r.Reconcile(t.Context(), clusterRequest(kcpcorev1alpha1.LogicalClusterName)); err != nil || res.RequeueAfter != 0 {
		t.Fatalf("at the give-up: %+v, %v", res, err)
	}
	if got := initializersOf(t, c); len(got) != 0 {
		t.Errorf("past creationTimestamp+GiveUpAfter: initializers %v, want none", got)
	}
}

// Attack 2b: the same with Invalid, and with a timestamp only slightly in
// the future: the retries stop at creationTimestamp+GiveUpAfter exactly.
func TestAttackFutureCreationTimestampInvalidIsBoundedByIt(t *testing.T) {
	r, c := setup(t, mine)
	// The clock is an hour before the creation: the same as a
	// creationTimestamp an hour ahead.
	r.Now = func() time.Time { return t0.Add(-time.Hour) }
	s := &spy{applyErr: func(o *unstructured.Unstructured) error {
		return apierrors.NewInvalid(o.GroupVersionKind().GroupKind(), o.GetName(), nil)
	}}
	s.install(t, r, c)
	passes := 0
	for now := t0.Add(-time.Hour); ; now = now.Add(2 * time.Second) {
		r.Now = func() time.Time { return now }
		res, err := r.Reconcile(t.Context(), clusterRequest(kcpcorev1alpha1.LogicalClusterName))
		if err != nil {
			t.Fatal(err)
		}
		passes++
		if res.RequeueAfter == 0 {
			if now.Before(t0.Add(r.giveUpAfter())) {
				t.Fatalf("gave up at %v, before creationTimestamp+GiveUpAfter", now)
			}
			break
		}
		if passes > 10000 {
			t.Fatal("Invalid retried without end")
		}
	}
	if want := int((time.Hour+r.giveUpAfter())/(2*time.Second)) + 1; passes != want {
		t.Errorf("%d passes, want %d (one every 2s until creationTimestamp+GiveUpAfter)", passes, want)
	}
	if got := initializersOf(t, c); len(got) != 0 {
		t.Errorf("initializers %v, want none after the give-up", got)
	}
}

// Attack 3: a hostile apiserver answers the Apply with a huge error
// message, or an error that is no API status at all. The reconcile
// returns an error (a requeue with backoff), keeps the initializer and
// writes no status, so the message lands nowhere in the workspace.
func TestAttackHostileApplyErrorIsReturnedNotStored(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	cases := map[string]error{
		"huge plain error":         errors.New(huge),
		"plain error":              errors.New("connection reset by peer"),
		"huge internal error":      apierrors.NewInternalError(errors.New(huge)),
		"huge bad request":         apierrors.NewBadRequest(huge),
		"huge conflict on apply":   apierrors.NewConflict(rbacv1.Resource("clusterroles"), "knotless:agent", errors.New(huge)),
		"huge timeout":             apierrors.NewTimeoutError(huge, 1),
		"huge too many requests":   apierrors.NewTooManyRequests(huge, 1),
		"huge unauthorized":        apierrors.NewUnauthorized(huge),
		"huge service unavailable": apierrors.NewServiceUnavailable(huge),
		"context canceled":         context.Canceled,
		"cluster-scoped not found": apierrors.NewNotFound(rbacv1.Resource("clusterroles"), huge),
	}
	for name, applyErr := range cases {
		t.Run(name, func(t *testing.T) {
			r, c := setup(t, mine)
			s := &spy{applyErr: func(o *unstructured.Unstructured) error {
				if name == "cluster-scoped not found" && o.GetNamespace() != "" {
					return nil
				}
				return applyErr
			}}
			s.install(t, r, c)
			res, err := r.Reconcile(t.Context(), clusterRequest(kcpcorev1alpha1.LogicalClusterName))
			if err == nil {
				t.Fatalf("result %+v, no error; want an error (a requeue with backoff)", res)
			}
			if !errors.Is(err, applyErr) {
				t.Errorf("the error %.80q does not wrap the apiserver's", err.Error())
			}
			if s.statusPatches != 0 || s.otherWrites != 0 {
				t.Errorf("%d status patches, %d other writes; want none", s.statusPatches, s.otherWrites)
			}
			if got := initializersOf(t, c); len(got) != 1 || got[0] != mine {
				t.Errorf("initializers %v, want [%s] kept", got, mine)
			}
			lc := &kcpcorev1alpha1.LogicalCluster{}
			if err := c.Get(t.Context(), client.ObjectKey{Name: kcpcorev1alpha1.LogicalClusterName}, lc); err != nil {
				t.Fatal(err)
			}
			if len(lc.Status.Conditions) != 0 || len(lc.Annotations) != 0 || lc.Status.Phase != kcpcorev1alpha1.LogicalClusterPhaseInitializing {
				t.Errorf("the LogicalCluster changed: phase %s, conditions %v, annotations %v", lc.Status.Phase, lc.Status.Conditions, lc.Annotations)
			}
		})
	}
}

// Attack 3b: a refusal (Forbidden) with a huge message past GiveUpAfter
// makes the initializer leave: the one status patch it writes carries
// the initializers and the resourceVersion only, none of the message.
func TestAttackHugeForbiddenMessageStaysOutOfThePatch(t *testing.T) {
	huge := strings.Repeat("y", 1<<20)
	r, c := setup(t, mine, "system:apibindings")
	r.Now = func() time.Time { return t0.Add(time.Hour) }
	s := &spy{applyErr: func(*unstructured.Unstructured) error {
		return apierrors.NewForbidden(rbacv1.Resource("clusterroles"), huge, errors.New(huge))
	}}
	s.install(t, r, c)
	reconcileOnce(t, r)
	if s.statusPatches != 1 || len(s.statusBodies) != 1 {
		t.Fatalf("%d status patches, want 1", s.statusPatches)
	}
	body := string(s.statusBodies[0])
	if strings.Contains(body, "yyyy") || len(body) > 1024 {
		t.Errorf("the status patch (%d bytes) carries the apiserver's message: %.200s", len(body), body)
	}
	if !strings.Contains(body, "resourceVersion") {
		t.Errorf("the status patch %s has no resourceVersion (no optimistic lock)", body)
	}
	if got := initializersOf(t, c); len(got) != 1 || got[0] != "system:apibindings" {
		t.Errorf("initializers %v, want [system:apibindings]", got)
	}
}

// Attack 4: the LogicalCluster vanishes between the read and the status
// patch. The reconcile does not panic; it returns an error (a requeue
// with backoff) and the next pass finds nothing and does nothing.
func TestAttackLogicalClusterVanishesBeforeThePatch(t *testing.T) {
	r, c := setup(t, mine)
	s := &spy{}
	s.onStatusPatch = func(ctx context.Context, cl client.Client, obj client.Object) error {
		lc := &kcpcorev1alpha1.LogicalCluster{ObjectMeta: metav1.ObjectMeta{Name: obj.GetName()}}
		return cl.Delete(ctx, lc)
	}
	s.install(t, r, c)
	res, err := r.Reconcile(t.Context(), clusterRequest(kcpcorev1alpha1.LogicalClusterName))
	if err == nil {
		t.Logf("the vanished LogicalCluster: result %+v and no error", res)
	} else if !apierrors.IsNotFound(err) {
		t.Errorf("the vanished LogicalCluster: %v, want a NotFound (or nothing)", err)
	}
	if res.RequeueAfter != 0 {
		t.Errorf("result %+v: a vanished LogicalCluster is not polled", res)
	}
	if len(s.applied) != 3 || s.statusPatches != 1 {
		t.Errorf("first pass: %d applies, %d status patches; want 3 and 1", len(s.applied), s.statusPatches)
	}
	// The next pass (the error's requeue) ends at the read.
	s.onStatusPatch = nil
	for range 3 {
		res, err = r.Reconcile(t.Context(), clusterRequest(kcpcorev1alpha1.LogicalClusterName))
		if err != nil || res != (reconcile.Result{}) {
			t.Errorf("after the LogicalCluster vanished: %+v, %v; want nothing", res, err)
		}
	}
	if len(s.applied) != 3 || s.statusPatches != 1 {
		t.Errorf("after the LogicalCluster vanished: %d applies, %d status patches in all; want no more", len(s.applied), s.statusPatches)
	}
}

// Attack 4b: the status patch answers NotFound while the object stays (a
// lagging or lying apiserver): the reconcile returns the error, each pass
// re-applies the same objects (idempotent) and patches once; there is no
// tight loop (no RequeueAfter, the error's backoff paces it).
func TestAttackStatusPatchNotFoundIsAnErrorNotALoop(t *testing.T) {
	r, c := setup(t, mine)
	s := &spy{onStatusPatch: func(context.Context, client.Client, client.Object) error {
		return apierrors.NewNotFound(kcpcorev1alpha1.Resource("logicalclusters"), kcpcorev1alpha1.LogicalClusterName)
	}}
	s.install(t, r, c)
	for i := 1; i <= 3; i++ {
		res, err := r.Reconcile(t.Context(), clusterRequest(kcpcorev1alpha1.LogicalClusterName))
		if err == nil || res.RequeueAfter != 0 {
			t.Fatalf("pass %d: %+v, %v; want an error and no RequeueAfter", i, res, err)
		}
		if len(s.applied) != 3*i || s.statusPatches != i {
			t.Fatalf("pass %d: %d applies, %d status patches in all; want %d and %d", i, len(s.applied), s.statusPatches, 3*i, i)
		}
	}
	if got := initializersOf(t, c); len(got) != 1 {
		t.Errorf("initializers %v, want the initializer kept", got)
	}
}

// Attack 5: the objects applied are exactly the three embedded ones,
// whatever the LogicalCluster says: annotations, labels, an owner,
// a finalizer naming other namespaces and names change nothing.
func TestAttackAppliedObjectsAreExactlyTheEmbeddedOnes(t *testing.T) {
	r, c := setup(t, mine)
	lc := &kcpcorev1alpha1.LogicalCluster{}
	if err := c.Get(t.Context(), client.ObjectKey{Name: kcpcorev1alpha1.LogicalClusterName}, lc); err != nil {
		t.Fatal(err)
	}
	lc.Annotations = map[string]string{
		"kcp.io/cluster":                     "root:victim",
		"knotless.dev/namespace":             "kube-system",
		"knotless.dev/name":                  "cluster-admin",
		"kcp.io/owner":                       `{"username":"system:admin","groups":["system:masters"]}`,
		"experimental.tenancy.kcp.io/owner":  `{"username":"system:admin","groups":["system:masters"]}`,
		"internal.tenancy.kcp.io/path":       "root:victim",
		"kubectl.kubernetes.io/last-applied": `{"kind":"ClusterRoleBinding","metadata":{"name":"cluster-admin"}}`,
		"tenancy.kcp.io/workspace-type":      "root:other:evil",
		"knotless.dev/service-account":       "kube-system/default",
		"knotless.dev/role":                  "cluster-admin",
		"rbac.authorization.kubernetes.io/x": "*",
	}
	lc.Labels = map[string]string{"namespace": "kube-system", "name": "cluster-admin", "tenancy.kcp.io/workspace-type": "evil"}
	lc.Finalizers = []string{"knotless.dev/evil"}
	lc.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Namespace", Name: "kube-system", UID: "u"}}
	lc.Spec.Owner = &kcpcorev1alpha1.LogicalClusterOwner{APIVersion: "v1", Resource: "namespaces", Name: "kube-system", Cluster: "root:victim", UID: "u"}
	if err := c.Update(t.Context(), lc); err != nil {
		t.Fatal(err)
	}
	s := &spy{}
	s.install(t, r, c)
	reconcileOnce(t, r)

	want, err := bootstrap.Decode(bytes.NewReader(agent.RBAC))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.applied) != len(want) {
		t.Fatalf("%d objects applied, want %d", len(s.applied), len(want))
	}
	for i, got := range s.applied {
		id := func(o *unstructured.Unstructured) string {
			return o.GetAPIVersion() + " " + o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
		}
		if id(got) != id(want[i]) {
			t.Errorf("apply %d: %s, want %s", i, id(got), id(want[i]))
		}
		if !apiequality.Semantic.DeepEqual(got.Object, want[i].Object) {
			t.Errorf("apply %d (%s) differs from the embedded manifest:\n got %v\nwant %v", i, id(got), got.Object, want[i].Object)
		}
	}
	// The reconciler's own copies are not changed by the apply either.
	for i, o := range r.Objects {
		if !apiequality.Semantic.DeepEqual(o.Object, want[i].Object) {
			t.Errorf("r.Objects[%d] changed by the reconcile", i)
		}
	}
	// Nothing landed in the namespaces or names the LogicalCluster named.
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: "kube-system", Name: "knotless-agent"}, &corev1.ServiceAccount{}); !apierrors.IsNotFound(err) {
		t.Errorf("a ServiceAccount in kube-system: %v", err)
	}
	for _, name := range []string{"cluster-admin"} {
		if err := c.Get(t.Context(), client.ObjectKey{Name: name}, &rbacv1.ClusterRoleBinding{}); !apierrors.IsNotFound(err) {
			t.Errorf("a ClusterRoleBinding %s: %v", name, err)
		}
	}
	binding := &rbacv1.ClusterRoleBinding{}
	if err := c.Get(t.Context(), client.ObjectKey{Name: "knotless:agent"}, binding); err != nil {
		t.Fatal(err)
	}
	if binding.RoleRef.Name != "knotless:agent" || len(binding.Subjects) != 1 || binding.Subjects[0].Namespace != "default" || binding.Subjects[0].Name != "knotless-agent" {
		t.Errorf("the binding %+v, want knotless:agent to default/knotless-agent only", binding)
	}
	if s.otherWrites != 0 || s.statusPatches != 1 {
		t.Errorf("%d other writes, %d status patches; want 0 and 1", s.otherWrites, s.statusPatches)
	}
}

// Attack 5b: the apiserver (or another writer) mutating the apply
// configuration it is handed does not leak into the next workspace's
// objects: the reconciler applies copies.
func TestAttackMutatedApplyDoesNotLeakIntoTheNextWorkspace(t *testing.T) {
	r, c := setup(t, mine)
	want, err := bootstrap.Decode(bytes.NewReader(agent.RBAC))
	if err != nil {
		t.Fatal(err)
	}
	r.GetCluster = func(context.Context, multicluster.ClusterName) (cluster.Cluster, error) {
		return fakeCluster{c: interceptor.NewClient(c.(client.WithWatch), interceptor.Funcs{
			Apply: func(ctx context.Context, cl client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
				u := obj.(interface{ UnstructuredContent() map[string]any }).UnstructuredContent()
				u["metadata"].(map[string]any)["name"] = "evil"
				u["metadata"].(map[string]any)["namespace"] = "kube-system"
				return nil
			},
		})}, nil
	}
	reconcileOnce(t, r)
	for i, o := range r.Objects {
		if !apiequality.Semantic.DeepEqual(o.Object, want[i].Object) {
			t.Errorf("r.Objects[%d] is now %s/%s after the apply mutated its configuration", i, o.GetNamespace(), o.GetName())
		}
	}
}

// Attack 6: a request for another object name than "cluster" applies
// nothing.
func TestAttackOtherObjectNameAppliesNothing(t *testing.T) {
	for _, req := range []mcreconcile.Request{
		clusterRequest("other"),
		clusterRequest("cluster "),
		clusterRequest("Cluster"),
		clusterRequest(""),
		clusterRequest("../cluster"),
		{ClusterName: "abc", Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "other"}}},
	} {
		t.Run(req.Namespace+"/"+req.Name, func(t *testing.T) {
			r, c := setup(t, mine)
			s := &spy{}
			s.install(t, r, c)
			res, err := r.Reconcile(t.Context(), req)
			if len(s.applied) != 0 || s.statusPatches != 0 || s.otherWrites != 0 {
				t.Errorf("request %v: %d applies, %d status patches, %d other writes (result %+v, %v); want none", req, len(s.applied), s.statusPatches, s.otherWrites, res, err)
			}
			assertNothingMade(t, c)
			if got := initializersOf(t, c); len(got) != 1 {
				t.Errorf("the workspace's own LogicalCluster: initializers %v, want it untouched", got)
			}
		})
	}
}

// Attack 6b: a LogicalCluster under another name than "cluster" that
// carries the initializer. kcp admits only the singleton "cluster", and
// the virtual workspace shows only it; should one under another name
// appear, the reconciler would still act on it (it does not check the
// name). This test encodes "nothing applied" and fails if it does.
func TestAttackOtherLogicalClusterNameWithTheInitializerAppliesNothing(t *testing.T) {
	r, c := setup(t)
	other := &kcpcorev1alpha1.LogicalCluster{ObjectMeta: metav1.ObjectMeta{Name: "other", CreationTimestamp: metav1.NewTime(t0)},
		Status: kcpcorev1alpha1.LogicalClusterStatus{Phase: kcpcorev1alpha1.LogicalClusterPhaseInitializing, Initializers: []kcpcorev1alpha1.LogicalClusterInitializer{mine}}}
	if err := c.Create(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	if err := c.Status().Update(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	s := &spy{}
	s.install(t, r, c)
	res, err := r.Reconcile(t.Context(), clusterRequest("other"))
	if len(s.applied) != 0 || s.statusPatches != 0 {
		t.Errorf("FINDING: a LogicalCluster named %q with the initializer: %d applies, %d status patches (result %+v, %v); want none (the reconciler does not check the name is %q)",
			other.Name, len(s.applied), s.statusPatches, res, err, kcpcorev1alpha1.LogicalClusterName)
	}
}

// A namespace that never appears does not hold the workspace
// Initializing: it is waited for while the workspace is new, like a
// refusal, and the initializer leaves after GiveUpAfter.
func TestAttackNamespaceNeverMadeIsBounded(t *testing.T) {
	r, c := setup(t, mine)
	s := &spy{applyErr: func(o *unstructured.Unstructured) error {
		if o.GetNamespace() != "" {
			return apierrors.NewNotFound(corev1.Resource("namespaces"), o.GetNamespace())
		}
		return nil
	}}
	s.install(t, r, c)
	res, err := r.Reconcile(t.Context(), clusterRequest(kcpcorev1alpha1.LogicalClusterName))
	if err != nil || res.RequeueAfter == 0 || len(initializersOf(t, c)) != 1 {
		t.Fatalf("namespace missing in a new workspace: %+v, %v, initializers %v; want a pass again soon", res, err, initializersOf(t, c))
	}
	r.Now = func() time.Time { return t0.Add(24 * time.Hour) }
	if _, err := r.Reconcile(t.Context(), clusterRequest(kcpcorev1alpha1.LogicalClusterName)); err != nil {
		t.Fatal(err)
	}
	if got := initializersOf(t, c); len(got) != 0 {
		t.Errorf("a day after creation, namespace missing: initializers %v, want none", got)
	}
}
