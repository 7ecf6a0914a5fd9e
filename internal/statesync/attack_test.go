package statesync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"github.com/knotless-dev/knotless/internal/bodylimit"
)

// attackRes is one APIResource of a discovery document.
func attackRes(name, kind string, namespaced bool) map[string]any {
	return map[string]any{"name": name, "singularName": "", "kind": kind, "namespaced": namespaced, "verbs": []string{"get", "list", "patch", "create"}}
}

// coreV1 is a core group's discovery serving namespaces and configmaps.
var coreV1 = map[string]any{"kind": "APIResourceList", "groupVersion": "v1", "resources": []any{
	attackRes("namespaces", "Namespace", false), attackRes("configmaps", "ConfigMap", true)}}

func groupDoc(name string, versions ...string) map[string]any {
	var vs []any
	for _, v := range versions {
		vs = append(vs, map[string]any{"groupVersion": name + "/" + v, "version": v})
	}
	doc := map[string]any{"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": vs}
	if len(versions) > 0 {
		doc["preferredVersion"] = vs[0]
	}
	return doc
}

func writeJSON(w http.ResponseWriter, doc any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(doc)
}

// hostile starts a tenant answering with h, and records every path asked.
func hostile(t *testing.T, h func(w http.ResponseWriter, r *http.Request)) (*httptest.Server, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), paths...)
	}
}

// exportWithin runs Export and fails the test when it does not return
// within limit.
func exportWithin(ctx context.Context, t *testing.T, limit time.Duration, cfg *rest.Config, res []schema.GroupResource) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, _, err := Export(ctx, cfg, res)
		done <- err
	}()
	select {
	case err := <-done:
		return time.Since(start), err
	case <-time.After(limit):
		t.Fatalf("Export did not return within %s", limit)
		return 0, nil
	}
}

// Attacks of a hostile tenant on statesync's clients (written by an
// attack review of the discovery the export and import read).

// 1. A redirect (307) from the tenant is not followed: the other host
// gets no request and never sees the bearer token.
func TestAttackRedirectNotFollowed(t *testing.T) {
	for _, at := range []string{"/api/v1", "/apis/evil.example.com"} {
		t.Run(at, func(t *testing.T) {
			var hits, auths atomic.Int32
			other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				if r.Header.Get("Authorization") != "" {
					auths.Add(1)
				}
				writeJSON(w, groupDoc("evil.example.com", "v1"))
			}))
			t.Cleanup(other.Close)
			srv, _ := hostile(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == at {
					http.Redirect(w, r, other.URL+r.URL.Path, http.StatusTemporaryRedirect)
					return
				}
				switch r.URL.Path {
				case "/api/v1":
					writeJSON(w, coreV1)
				default:
					http.NotFound(w, r)
				}
			})
			cfg := &rest.Config{Host: srv.URL, BearerToken: "secret"}
			res := []schema.GroupResource{{Resource: "configmaps"}, {Group: "evil.example.com", Resource: "things"}}
			_, err := exportWithin(context.Background(), t, 10*time.Second, cfg, res)
			if err == nil {
				t.Error("Export of a redirecting tenant succeeded")
			}
			if hits.Load() != 0 || auths.Load() != 0 {
				t.Errorf("the other host got %d requests, %d with Authorization", hits.Load(), auths.Load())
			}
		})
	}
}

// 2. A group document naming another group is refused.
func TestAttackGroupDocumentForAnotherGroup(t *testing.T) {
	srv, _ := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/v1":
			writeJSON(w, coreV1)
		case "/apis/evil.example.com":
			writeJSON(w, groupDoc("apps", "v1"))
		case "/apis/evil.example.com/v1", "/apis/apps/v1":
			writeJSON(w, map[string]any{"kind": "APIResourceList", "groupVersion": "apps/v1", "resources": []any{attackRes("things", "Thing", true)}})
		default:
			http.NotFound(w, r)
		}
	})
	cfg := &rest.Config{Host: srv.URL, BearerToken: "secret"}
	_, err := exportWithin(context.Background(), t, 10*time.Second, cfg, []schema.GroupResource{{Group: "evil.example.com", Resource: "things"}})
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("Export: %v, want ErrInvalid", err)
	}
}

// 3. A group listing 50 versions costs at most MaxVersions version
// documents.
func TestAttackManyVersions(t *testing.T) {
	const group = "evil.example.com"
	var versions []string
	for i := 1; i <= 50; i++ {
		versions = append(versions, fmt.Sprintf("v%d", i))
	}
	srv, paths := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/api/v1":
			writeJSON(w, coreV1)
		case r.URL.Path == "/apis/"+group:
			writeJSON(w, groupDoc(group, versions...))
		case strings.HasPrefix(r.URL.Path, "/apis/"+group+"/") && strings.Count(r.URL.Path, "/") == 3:
			v := strings.TrimPrefix(r.URL.Path, "/apis/"+group+"/")
			writeJSON(w, map[string]any{"kind": "APIResourceList", "groupVersion": group + "/" + v, "resources": []any{attackRes("things", "Thing", true)}})
		default:
			writeJSON(w, map[string]any{"kind": "List", "apiVersion": "v1", "metadata": map[string]any{}, "items": []any{}})
		}
	})
	cfg := &rest.Config{Host: srv.URL, BearerToken: "secret"}
	_, _ = exportWithin(context.Background(), t, 10*time.Second, cfg, []schema.GroupResource{{Group: group, Resource: "things"}})
	n := 0
	for _, p := range paths() {
		if strings.HasPrefix(p, "/apis/"+group+"/") && strings.Count(p, "/") == 3 {
			n++
		}
	}
	if n > MaxVersions {
		t.Errorf("%d version documents read, want at most %d", n, MaxVersions)
	}
}

// 4. An export asked for 40 groups is refused after at most MaxGroups+1
// group documents.
func TestAttackTooManyGroups(t *testing.T) {
	srv, paths := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		switch {
		case p == "/api/v1":
			writeJSON(w, coreV1)
		case strings.HasPrefix(p, "/apis/") && strings.Count(p, "/") == 2:
			writeJSON(w, groupDoc(strings.TrimPrefix(p, "/apis/"), "v1"))
		case strings.HasPrefix(p, "/apis/") && strings.Count(p, "/") == 3:
			g := strings.Split(p, "/")[2]
			writeJSON(w, map[string]any{"kind": "APIResourceList", "groupVersion": g + "/v1", "resources": []any{attackRes("things", "Thing", true)}})
		default:
			http.NotFound(w, r)
		}
	})
	var res []schema.GroupResource
	for i := 0; i < 40; i++ {
		res = append(res, schema.GroupResource{Group: fmt.Sprintf("g%d.example.com", i), Resource: "things"})
	}
	cfg := &rest.Config{Host: srv.URL, BearerToken: "secret"}
	_, err := exportWithin(context.Background(), t, 10*time.Second, cfg, res)
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("Export of 40 groups: %v, want ErrInvalid", err)
	}
	n := 0
	for _, p := range paths() {
		if strings.HasPrefix(p, "/apis/") && strings.Count(p, "/") == 2 {
			n++
		}
	}
	if n > MaxGroups+1 {
		t.Errorf("%d group documents read, want at most %d", n, MaxGroups+1)
	}
}

// 5. A list that never answers ends with the context.
func TestAttackHangingList(t *testing.T) {
	stop := make(chan struct{})
	srv, _ := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/v1" {
			writeJSON(w, coreV1)
			return
		}
		select { // hang: the list never answers
		case <-r.Context().Done():
		case <-stop:
		}
	})
	t.Cleanup(func() { close(stop) }) // runs before srv.Close
	cfg := &rest.Config{Host: srv.URL, BearerToken: "secret"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	took, err := exportWithin(ctx, t, 10*time.Second, cfg, []schema.GroupResource{{Resource: "configmaps"}})
	if err == nil {
		t.Error("Export of a hanging tenant succeeded")
	}
	if took > 3*time.Second {
		t.Errorf("Export took %s, want about 1s", took)
	}
}

// 6. An endless discovery answer is cut by bodylimit.Transport.
func TestAttackEndlessDiscovery(t *testing.T) {
	for _, at := range []string{"/api/v1", "/apis/evil.example.com"} {
		t.Run(at, func(t *testing.T) {
			stop := make(chan struct{})
			srv, _ := hostile(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != at {
					switch r.URL.Path {
					case "/api/v1":
						writeJSON(w, coreV1)
					default:
						http.NotFound(w, r)
					}
					return
				}
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"kind":"APIResourceList","groupVersion":"v1","resources":[`))
				chunk := []byte(strings.Repeat(" ", 32<<10))
				for {
					select {
					case <-stop:
						return
					case <-r.Context().Done():
						return
					default:
					}
					if _, err := w.Write(chunk); err != nil {
						return
					}
				}
			})
			t.Cleanup(func() { close(stop) })
			cfg := &rest.Config{Host: srv.URL, BearerToken: "secret",
				WrapTransport: func(rt http.RoundTripper) http.RoundTripper { return bodylimit.Transport(rt, 1<<20) }}
			res := []schema.GroupResource{{Resource: "configmaps"}, {Group: "evil.example.com", Resource: "things"}}
			// No deadline on ctx: only the byte bound may end it.
			took, err := exportWithin(context.Background(), t, 15*time.Second, cfg, res)
			if err == nil {
				t.Error("Export of an endless discovery succeeded")
			}
			if took > 5*time.Second {
				t.Errorf("Export took %s", took)
			}
			t.Logf("error after %s: %v", took, err)
		})
	}
}
