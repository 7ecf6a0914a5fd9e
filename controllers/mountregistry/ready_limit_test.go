/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package mountregistry

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/knotless-dev/knotless/internal/backoff"
	"github.com/knotless-dev/knotless/internal/bodylimit"
)

// listServer is a virtual workspace whose lists answer with page, called
// with the request's limit and continue; limits returns the limits asked.
func listServer(t *testing.T, page func(w http.ResponseWriter, limit, from int)) (srv *httptest.Server, limits func() []int) {
	t.Helper()
	var mu sync.Mutex
	var asked []int
	srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
		from, _ := strconv.Atoi(r.URL.Query().Get("continue"))
		if strings.HasSuffix(r.URL.Path, "/apibindings") {
			_ = json.NewEncoder(w).Encode(map[string]any{"metadata": map[string]any{}, "items": []any{obj("lc1", "knotless.dev", "1", "True")}})
			return
		}
		mu.Lock()
		asked = append(asked, limit)
		mu.Unlock()
		page(w, limit, from)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(asked)
	}
}

func listOf(srv *httptest.Server, pageSize int, pageBytes int64) *InitialList {
	return &InitialList{
		Config:    &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{CAData: certPEM(srv.Certificate().Raw)}},
		Export:    "knotless.dev",
		Readiness: NewReadiness(),
		Log:       log.Log,
		Backoff:   backoff.Backoff{Initial: 10 * time.Millisecond},
		PageSize:  pageSize,
		PageBytes: pageBytes,
	}
}

// TestInitialListEndlessPageIsRefused: a list answer that never ends
// (one item with an endless annotation) fails the list with
// bodylimit.ErrTooLarge once even a page of one item passes the bound,
// after asking for half as many items each time, and is never decoded cut
// short (before, 256 MiB were read and the cut body decoded).
func TestInitialListEndlessPageIsRefused(t *testing.T) {
	srv, limits := listServer(t, func(w http.ResponseWriter, _, _ int) {
		_, _ = fmt.Fprint(w, `{"metadata":{},"items":[{"metadata":{"name":"a","annotations":{"kcp.io/cluster":"lc1","x":"`)
		chunk := []byte(strings.Repeat("x", 64<<10))
		for range 512 { // 32 MiB, past the bound of this test
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		_, _ = fmt.Fprint(w, `"}}}]}`)
	})
	l := listOf(srv, 8, 1<<20)
	l.Client = sliceClient(t, srv.URL+"/vw")
	_, err := l.list(t.Context())
	if !errors.Is(err, bodylimit.ErrTooLarge) {
		t.Fatalf("list: %v, want %v", err, bodylimit.ErrTooLarge)
	}
	if !strings.Contains(err.Error(), "more than 1048576 bytes") || !strings.Contains(err.Error(), "1 items a page") {
		t.Errorf("error %q does not name the bound", err)
	}
	if want := []int{8, 4, 2, 1}; !slices.Equal(limits(), want) {
		t.Errorf("limits asked %v, want %v", limits(), want)
	}
}

// TestInitialListLargeItemsAskSmallerPages: TenantClusters of 400 KiB
// each, in pages past the bound of 1 MiB, are listed in pages of two, all
// of them.
func TestInitialListLargeItemsAskSmallerPages(t *testing.T) {
	const n = 5
	big := strings.Repeat("x", 400<<10)
	srv, limits := listServer(t, func(w http.ResponseWriter, limit, from int) {
		var items []any
		for i := from; i < min(from+limit, n); i++ {
			o := obj("lc1", fmt.Sprint("t", i), fmt.Sprint(10+i), "")
			o["spec"] = map[string]any{"pad": big}
			items = append(items, o)
		}
		meta := map[string]any{}
		if from+limit < n {
			meta["continue"] = fmt.Sprint(from + limit)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"metadata": meta, "items": items})
	})
	l := listOf(srv, 8, 1<<20)
	l.Client = sliceClient(t, srv.URL+"/vw")
	got, err := l.list(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Errorf("listed %d TenantClusters, want %d", len(got), n)
	}
	if want := []int{8, 4, 2, 2, 2}; !slices.Equal(limits(), want) {
		t.Errorf("limits asked %v, want %v", limits(), want)
	}
}
