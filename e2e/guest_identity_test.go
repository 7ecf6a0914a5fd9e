package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	identityv1alpha1 "github.com/knotless-dev/knotless/apis/identity/v1alpha1"
	"github.com/knotless-dev/knotless/controllers/guestidentity"
	"github.com/knotless-dev/knotless/e2e/framework"
	"github.com/knotless-dev/knotless/internal/guestadmission"
)

// The guest of the tests: ServiceAccount reader of namespace guests in
// the tenant; it may get and list Applications of the requester's
// workspace's namespace default.
const (
	guestNS     = "guests"
	guestSA     = "reader"
	guestSecret = "kcp-access"
)

var readApplications = []rbacv1.PolicyRule{{APIGroups: []string{appsv1alpha1.GroupVersion.Group}, Resources: []string{"applications"}, Verbs: []string{"get", "list"}}}

// newGrant makes the GuestIdentityGrant name for the contract with the
// client c (as its user), for the guest reader; mut changes the spec.
func newGrant(ctx context.Context, c client.Client, name, contract string, mut func(*identityv1alpha1.GuestIdentityGrantSpec)) error {
	g := &identityv1alpha1.GuestIdentityGrant{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: identityv1alpha1.GuestIdentityGrantSpec{ContractRef: identityv1alpha1.ContractRef{Name: contract},
			Guest: identityv1alpha1.Guest{Namespace: guestNS, ServiceAccount: guestSA}, Rules: readApplications, SecretName: guestSecret}}
	if mut != nil {
		mut(&g.Spec)
	}
	return c.Create(ctx, g)
}

// grantReady waits for the grant's Ready condition to have reason.
func grantReady(ctx context.Context, t *testing.T, c client.Client, name, reason string, within time.Duration) *identityv1alpha1.GuestIdentityGrant {
	t.Helper()
	g := &identityv1alpha1.GuestIdentityGrant{}
	if err := framework.Eventually(ctx, within, "GuestIdentityGrant "+name+" "+reason, func(ctx context.Context) (bool, string, error) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, g); err != nil {
			return false, err.Error(), nil
		}
		cond := meta.FindStatusCondition(g.Status.Conditions, identityv1alpha1.ConditionReady)
		if cond == nil {
			return false, "no Ready condition", nil
		}
		return cond.Reason == reason && cond.ObservedGeneration == g.Generation, cond.Reason + ": " + cond.Message, nil
	}); err != nil {
		t.Fatal(err)
	}
	return g
}

// grantAuthor is bob in the requester's workspace: he may enter it, make
// GuestIdentityGrants, read Applications, and escalate and bind any Role
// or ClusterRole, which lets him make RBAC he does not hold, but no grant
// of it.
func grantAuthor(ctx context.Context, t *testing.T, d *deal) client.Client {
	t.Helper()
	create(ctx, t, d.app,
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "grant-author"}, Rules: []rbacv1.PolicyRule{
			{NonResourceURLs: []string{"/"}, Verbs: []string{"access"}},
			{APIGroups: []string{identityv1alpha1.GroupVersion.Group}, Resources: []string{"guestidentitygrants"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
			{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"roles", "clusterroles"}, Verbs: []string{"create", "escalate", "bind"}},
			readApplications[0],
		}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "grant-author-bob"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "grant-author"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "bob"}}},
	)
	cfg, err := env.kcp.UserConfig("bob")
	if err != nil {
		t.Fatal(err)
	}
	c, err := framework.ClientFor(cfg, root.Join(d.appWS))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// guestAccess is what a guest holds: the Secret in its namespace of the
// tenant, and the configuration of its kubeconfig.
type guestAccess struct {
	secret *corev1.Secret
	cfg    *rest.Config
}

func guestSecretOf(ctx context.Context, t *testing.T, tenant kubernetes.Interface) guestAccess {
	t.Helper()
	sec, err := tenant.CoreV1().Secrets(guestNS).Get(ctx, guestSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the guest's Secret in the tenant: %v", err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(sec.Data[guestidentity.KeyKubeconfig])
	if err != nil {
		t.Fatalf("the guest's kubeconfig: %v", err)
	}
	return guestAccess{secret: sec, cfg: cfg}
}

// status returns the HTTP status of a GET of path with the guest's token
// (path under /clusters/... as it is, else under the kubeconfig's
// workspace).
func (g guestAccess) status(ctx context.Context, path string) int {
	i := strings.Index(g.cfg.Host, "/clusters/")
	if !strings.HasPrefix(path, "/clusters/") {
		path = g.cfg.Host[i:] + path
	}
	cfg := rest.CopyConfig(g.cfg)
	cfg.Host = g.cfg.Host[:i]
	var code int
	kubernetes.NewForConfigOrDie(cfg).CoreV1().RESTClient().Get().AbsPath(path).Do(ctx).StatusCode(&code)
	return code
}

// guestPaths are what the tests ask as the guest: its Application (200),
// the Secrets of its namespace (a kind not granted: 403), and the same
// Application kind in the bidder's workspace (another workspace: 403).
func guestPaths(d *deal) (own, kind, other string) {
	return "/apis/apps.knotless.dev/v1alpha1/namespaces/default/applications/guestapp",
		"/api/v1/namespaces/default/secrets",
		"/clusters/" + root.Join(d.bidWS).String() + "/apis/apps.knotless.dev/v1alpha1/namespaces/default/applications"
}

// guestIdentity proves GuestIdentityGrants on the requester's tenant of
// the contract (tenant: a client of it as its admin): refusals of bad
// input, then a grant whose Secret's kubeconfig reads the requester's
// Application and nothing else, and whose deletion stops its token. It
// leaves the grant reader in place, for the tenant's pods, and returns
// the guest's access; guestGone deletes it.
func guestIdentity(ctx context.Context, t *testing.T, d *deal, contract string, tenant kubernetes.Interface) guestAccess {
	t.Helper()
	webhookRefusesStrangers(ctx, t)
	bob := grantAuthor(ctx, t, d)
	create(ctx, t, d.app, &appsv1alpha1.Application{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "guestapp"}})

	// A grant of what its author does not hold: refused (kcp answers a
	// SubjectAccessReview as bob for each permission), with a message
	// naming the first permission missing, although bob may escalate and
	// bind.
	err := newGrant(ctx, bob, "escalates", contract, func(s *identityv1alpha1.GuestIdentityGrantSpec) {
		s.Rules = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}}}
	})
	if err == nil || !strings.Contains(err.Error(), "you may not get secrets") {
		t.Fatalf("bob's grant of Secrets he cannot read: %v, want refused as an escalation", err)
	}
	t.Logf("bob's escalating grant: %v", err)
	create(ctx, t, d.app, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "secret-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list"}}}})
	if err := newGrant(ctx, bob, "secrets", contract, func(s *identityv1alpha1.GuestIdentityGrantSpec) { s.Rules, s.ClusterRole = nil, "secret-reader" }); err == nil || !strings.Contains(err.Error(), "you may not get secrets") {
		t.Fatalf("bob's grant of the ClusterRole secret-reader: %v, want refused as an escalation", err)
	}
	if err := newGrant(ctx, bob, "missing", contract, func(s *identityv1alpha1.GuestIdentityGrantSpec) { s.Rules, s.ClusterRole = nil, "no-such-role" }); err == nil || !strings.Contains(err.Error(), "ClusterRole no-such-role does not exist") {
		t.Fatalf("bob's grant of a ClusterRole that does not exist: %v, want refused saying so", err)
	}
	// Bad input gets a condition that says what is wrong.
	if err := newGrant(ctx, d.app, "too-long", contract, func(s *identityv1alpha1.GuestIdentityGrantSpec) {
		s.Duration = &metav1.Duration{Duration: 2 * time.Hour}
	}); err != nil {
		t.Fatal(err)
	}
	if err := newGrant(ctx, d.app, "nowhere", contract, func(s *identityv1alpha1.GuestIdentityGrantSpec) {
		s.Guest.Namespace, s.SecretName = "nowhere", "kcp-nowhere"
	}); err != nil {
		t.Fatal(err)
	}
	g := grantReady(ctx, t, d.app, "too-long", identityv1alpha1.ReasonInvalidSpec, time.Minute)
	if msg := meta.FindStatusCondition(g.Status.Conditions, identityv1alpha1.ConditionReady).Message; !strings.Contains(msg, "at most 1h0m0s") {
		t.Errorf("too-long's message %q does not name the maximum", msg)
	}

	// The guest, in the tenant; bob grants it his read of Applications.
	if _, err := tenant.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: guestNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := tenant.CoreV1().ServiceAccounts(guestNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: guestSA}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	start := time.Now()
	if err := newGrant(ctx, bob, "reader", contract, nil); err != nil {
		t.Fatalf("bob's grant of what he holds: %v", err)
	}
	g = grantReady(ctx, t, d.app, "reader", identityv1alpha1.ReasonGranted, 2*time.Minute)
	t.Logf("FIGURE GuestIdentityGrant created -> Granted: %s", time.Since(start).Round(time.Millisecond))
	grantReady(ctx, t, d.app, "nowhere", identityv1alpha1.ReasonGuestNotFound, time.Minute)
	if g.Status.ExpirationTime == nil || time.Until(g.Status.ExpirationTime.Time) > time.Hour || time.Until(g.Status.ExpirationTime.Time) < 50*time.Minute {
		t.Errorf("the token expires at %v, want in about an hour", g.Status.ExpirationTime)
	}

	ga := guestSecretOf(ctx, t, tenant)
	own, kind, other := guestPaths(d)
	for path, want := range map[string]int{own: 200, kind: 403, other: 403} {
		if got := ga.status(ctx, path); got != want {
			t.Errorf("the guest's GET %s: %d, want %d", path, got, want)
		}
	}
	return ga
}

// guestGone deletes the grant reader: its ServiceAccount goes, so kcp
// refuses its token at once (401), and its Secret leaves the tenant.
func guestGone(ctx context.Context, t *testing.T, d *deal, tenant kubernetes.Interface, ga guestAccess) {
	t.Helper()
	g := &identityv1alpha1.GuestIdentityGrant{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "reader"}}
	start := time.Now()
	if err := d.app.Delete(ctx, g); err != nil {
		t.Fatal(err)
	}
	own, _, _ := guestPaths(d)
	// kcp, as kube-apiserver, keeps a token's successful authentication
	// for 10 s: the token is refused within that of the ServiceAccount's
	// deletion.
	var refused, gone time.Duration
	if err := framework.Eventually(ctx, time.Minute, "the grant's token refused and its Secret gone from the tenant", func(ctx context.Context) (bool, string, error) {
		code := ga.status(ctx, own)
		if code == 401 && refused == 0 {
			refused = time.Since(start)
		}
		_, err := tenant.CoreV1().Secrets(guestNS).Get(ctx, guestSecret, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && gone == 0 {
			gone = time.Since(start)
		}
		return refused > 0 && gone > 0, fmt.Sprintf("GET %d, the Secret: %v", code, err), nil
	}); err != nil {
		t.Error(err)
	}
	t.Logf("FIGURE GuestIdentityGrant deleted -> its Secret gone from the tenant: %s; -> its token refused (401): %s", gone.Round(time.Millisecond), refused.Round(time.Millisecond))
	for _, name := range []string{"too-long", "nowhere"} {
		if err := d.app.Delete(ctx, &identityv1alpha1.GuestIdentityGrant{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}); err != nil {
			t.Error(err)
		}
	}
}

// guestPod runs the test image in the tenant as the guest, with the
// grant's Secret mounted, and checks what it gets from kcp: its
// Application, and refusals for a kind it was not granted and for
// another workspace.
func guestPod(ctx context.Context, t *testing.T, d *deal, tenant kubernetes.Interface, image string) {
	t.Helper()
	own, kind, other := guestPaths(d)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "guest", Namespace: guestNS}, Spec: corev1.PodSpec{
		ServiceAccountName: guestSA,
		Containers: []corev1.Container{{Name: "guest", Image: image, ImagePullPolicy: corev1.PullNever,
			Command:      []string{"/testimage", "kcp", "/var/run/kcp", own, kind, other},
			VolumeMounts: []corev1.VolumeMount{{Name: "kcp", MountPath: "/var/run/kcp", ReadOnly: true}}}},
		Volumes: []corev1.Volume{{Name: "kcp", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: guestSecret}}}},
	}}
	start := time.Now()
	if _, err := tenant.CoreV1().Pods(guestNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []string{"kcp GET " + own + ": 200", "kcp GET " + kind + ": 403", "kcp GET " + other + ": 403"}
	if err := framework.Eventually(ctx, 2*time.Minute, "the guest pod's answers from kcp", func(ctx context.Context) (bool, string, error) {
		logs, err := tenant.CoreV1().Pods(guestNS).GetLogs("guest", &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		for _, w := range want {
			if !strings.Contains(string(logs), w) {
				return false, fmt.Sprintf("log %q", logs), nil
			}
		}
		return true, "", nil
	}); err != nil {
		t.Error(err)
	}
	t.Logf("FIGURE guest pod created -> its three answers from kcp: %s", time.Since(start).Round(time.Millisecond))
}

// webhookRefusesStrangers: the provider's admission webhook answers on
// a secret path only (the one its configuration in the provider
// workspace gives kcp): a caller who does not know it gets 404, so it
// cannot ask what a user holds in a workspace.
func webhookRefusesStrangers(ctx context.Context, t *testing.T) {
	t.Helper()
	var base string
	for i, a := range env.provider.Args {
		if a == "--admission-webhook-url" && i+1 < len(env.provider.Args) {
			base = env.provider.Args[i+1]
		}
	}
	if base == "" {
		t.Fatal("the suite's provider has no --admission-webhook-url")
	}
	review := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","operation":"CREATE","userInfo":{"username":"alice"},"object":{}}}`
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the server's certificate is not what is tested
	for _, path := range []string{"/admit/guestidentitygrants", guestadmission.PathPrefix, guestadmission.PathPrefix + "guess", "/"} {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, strings.NewReader(review))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("the webhook answered POST %s without its secret path: %s", path, resp.Status)
		}
	}
}
