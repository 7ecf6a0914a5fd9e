package mountproxy

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"github.com/knotless-dev/knotless/internal/mount"
)

// A market contract's mount may impersonate spec.tenantAdmins alone: the
// shim refuses every other caller kcp lets into the workspace (a member
// of a named group too: the tenant lets the mount assert users by name
// only), asserts only the named groups of a caller, and no extra.
func TestMountForwardsOnlyItsPrincipals(t *testing.T) {
	f := newFixture(t, func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string][]string{"user": r.Header.Values("Impersonate-User"), "groups": r.Header.Values("Impersonate-Group"),
			"extra": r.Header.Values("Impersonate-Extra-Scopes")})
	})
	if err := f.registry.Set(mount.Tenant{LogicalCluster: "ws-a", Name: "shop", URL: f.tenant.url, CA: pool(f.tenantCA), Credential: mount.Credential{Token: "tenant-token"},
		Impersonate: &mount.Principals{Users: []string{"alice"}, Groups: []string{"ops"}}}); err != nil {
		t.Fatal(err)
	}
	c := f.client(&f.proxy, f.servingC)
	for _, tc := range []struct {
		name   string
		header http.Header
		code   int
		groups []string
	}{
		{"a named user: only the named groups", http.Header{testUser: {"alice"}, testGroup: {"devs", "system:authenticated", "ops"}, testExtra + "Scopes": {"x"}}, 200, []string{"ops"}},
		{"a member of a named group only", http.Header{testUser: {"bob"}, testGroup: {"ops", "kubeadm:cluster-admins"}}, 403, nil},
		{"in the workspace but not named", http.Header{testUser: {"carol"}, testGroup: {"devs", "kubeadm:cluster-admins", "system:authenticated"}}, 403, nil},
	} {
		resp, body := f.get(c, "/tenants/ws-a/shop/api", tc.header)
		if resp.StatusCode != tc.code {
			t.Fatalf("%s: %d %s", tc.name, resp.StatusCode, body)
		}
		if tc.code != 200 {
			if resp.Header.Get(ReasonHeader) != ReasonNotTenantAdmin {
				t.Fatalf("%s: reason %q", tc.name, resp.Header.Get(ReasonHeader))
			}
			noConfigIn(t, body, f.tenant.url)
			continue
		}
		var got map[string][]string
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got["user"], tc.header.Values(testUser)) || !slices.Equal(got["groups"], tc.groups) || len(got["extra"]) != 0 {
			t.Fatalf("%s: the tenant saw %v", tc.name, got)
		}
	}
}
