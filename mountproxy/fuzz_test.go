package mountproxy

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/knotless-dev/knotless/internal/mount"
)

// token reports whether s is an HTTP header field name (RFC 9110 token):
// what net/http sends and reads.
func token(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// FuzzHeaderNames: an identity header name that passes the check is a
// header name, not standard, long enough, and passes again in the
// canonical form the shim keeps; names that pass together pass again
// canonical. Whatever header a caller sends under whatever name, after
// rewriteHeaders no header a tenant reads (canonically) carries an
// identity or credential but the shim's own.
func FuzzHeaderNames(f *testing.F) {
	f.Add(testUser, testGroup, testExtra, "X-Remote-User")
	f.Add(testUser, testGroup, testExtra, strings.ToLower(testExtra)+"scopes")
	f.Add("x-knotless-0123456789abcdef-user", testGroup, testExtra, "impersonate-user")
	f.Add("X-Remote-User", "x-remote-group", "X-Remote-Extra-", "authorization")
	f.Add("X-Knotless-0123456789abcdef:User", testGroup, testExtra+"User", "Impersonate-Extra-scopes")
	f.Add("X-Knotless-Mount-User-Name", testUser, testExtra, "X-Knotless-Mount-Hop")
	f.Fuzz(func(t *testing.T, user, group, extra, sent string) {
		for _, n := range []string{user, group, extra} {
			checkHeaderName(t, n)
		}
		h := Headers{User: user, Group: group, ExtraPrefix: extra}
		if h.Validate() != nil {
			return
		}
		names := h.canonical()
		if err := names.Validate(); err != nil {
			t.Fatalf("%+v passes, its canonical form %+v does not: %v", h, names, err)
		}
		checkRewrite(t, names, sent)
	})
}

func checkHeaderName(t *testing.T, n string) {
	t.Helper()
	if ValidateHeaderName("user header", n) != nil {
		return
	}
	c := http.CanonicalHeaderKey(n)
	if !token(n) || len(n) < minHeaderName || standardHeader(c) {
		t.Fatalf("accepted %q", n)
	}
	if err := ValidateHeaderName("user header", c); err != nil {
		t.Fatalf("accepted %q, not its canonical form %q: %v", n, c, err)
	}
}

// checkRewrite sends sent (and the configured and standard names, in
// other cases) through rewriteHeaders.
func checkRewrite(t *testing.T, names Headers, sent string) {
	t.Helper()
	hdr := http.Header{}
	for _, k := range []string{sent, strings.ToLower(names.User), strings.ToUpper(names.Group), strings.ToLower(names.ExtraPrefix) + sent,
		"impersonate-user", "Impersonate-Group", "impersonate-extra-" + sent, "authorization", "proxy-authorization", "x-remote-user"} {
		hdr.Add(k, "mallory") // canonical, as net/http reads it
	}
	c := &Caller{User: "alice", Groups: []string{"team"}, Extra: map[string][]string{"scopes": {"read"}}}
	rewriteHeaders(hdr, names, c, mount.Credential{Token: "tok"})
	want := map[string][]string{"Authorization": {"Bearer tok"}, "Impersonate-User": {"alice"}, "Impersonate-Group": {"team"}, "Impersonate-Extra-Scopes": {"read"}, HopHeader: {"1"}}
	for k, vs := range hdr {
		if !token(k) {
			continue // net/http refuses to send it
		}
		ck := http.CanonicalHeaderKey(k)
		if w, shim := want[ck]; shim || strings.HasPrefix(ck, "Impersonate-") || ck == "Proxy-Authorization" {
			if !shim || k != ck || !slices.Equal(vs, w) {
				t.Fatalf("after the rewrite %q (%q) is %q", k, ck, vs)
			}
			continue
		}
		if names.identityHeader(ck) {
			t.Fatalf("after the rewrite %q (%q) is %q: an identity header", k, ck, vs)
		}
	}
}
