package mountproxy

import (
	"strings"
	"testing"
)

func TestParsePath(t *testing.T) {
	for path, want := range map[string]string{
		"/tenants/ws-a/shop":                       "ws-a shop /",
		"/tenants/ws-a/shop/":                      "ws-a shop /",
		"/tenants/ws-a/shop/api/v1/namespaces":     "ws-a shop /api/v1/namespaces",
		"/tenants/2brd12f600howkdv/t1/apis/x/v1/y": "2brd12f600howkdv t1 /apis/x/v1/y",
		"/tenants/ws-a":                            "",
		"/tenants//shop/api":                       "",
		"/tenants/ws-a/shop/../ws-b":               "",
		"/tenants/ws-a/shop//api":                  "",
		"/tenants/WS/shop/api":                     "",
		"/tenants/ws-a/sh%2Fop/api":                "",
		"/other/ws-a/shop/api":                     "",
	} {
		lc, name, rest, ok := ParsePath("/tenants/", path)
		got := ""
		if ok {
			got = lc + " " + name + " " + rest
		}
		if got != want {
			t.Errorf("%s: got %q, want %q", path, got, want)
		}
	}
}

// FuzzParsePath: whatever the path, an accepted one names valid segments
// and a rest without traversal, and is exactly what was parsed.
func FuzzParsePath(f *testing.F) {
	for _, seed := range []string{"/tenants/ws-a/shop/api/v1", "/tenants/a/b", "/tenants/a/b/../c", "/tenants/a//b", "/tenants/-a/b/", "/x"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, path string) {
		lc, name, rest, ok := ParsePath("/tenants/", path)
		if !ok {
			return
		}
		if !validSegment(lc) || !validSegment(name) || !strings.HasPrefix(rest, "/") {
			t.Fatalf("%q: accepted %q %q %q", path, lc, name, rest)
		}
		for _, seg := range strings.Split(rest, "/") {
			if seg == ".." || seg == "." {
				t.Fatalf("%q: traversal in rest %q", path, rest)
			}
		}
		rebuilt := "/tenants/" + lc + "/" + name + rest
		if rebuilt != path && rebuilt != path+"/" {
			t.Fatalf("%q parsed as %q", path, rebuilt)
		}
	})
}
