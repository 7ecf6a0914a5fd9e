package pds_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/pds/pdstest"
)

// hugeBodyServer is a hostile PDS on loopback: it logs in honestly unless
// hostileLogin, and answers the hostile endpoint with a JSON document
// that never ends (a string of 256 MiB, far past every limit; a client
// without a limit would read all of it).
func hugeBodyServer(t *testing.T, hostile string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/xrpc/"+hostile {
			if r.URL.Path == "/xrpc/com.atproto.server.createSession" {
				_, _ = w.Write([]byte(`{"accessJwt":"a","refreshJwt":"r","did":"` + pdstest.DID + `","handle":"` + pdstest.Handle + `"}`))
				return
			}
			http.Error(w, `{"error":"NotFound"}`, http.StatusNotFound)
			return
		}
		_, _ = w.Write([]byte(`{"value":"`))
		chunk := []byte(strings.Repeat("x", 64<<10))
		for range 4096 {
			if _, err := w.Write(chunk); err != nil || r.Context().Err() != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// allocDuring returns the bytes allocated while f ran.
func allocDuring(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// R21: an endless answer to createSession, getRecord or listRecords ends
// the call promptly with ErrResponseTooLarge, and the client reads no more
// than the call's limit.
func TestHugeResponseBodiesAreRefused(t *testing.T) {
	for _, tc := range []struct {
		endpoint string
		limit    int64
		call     func(ctx context.Context, c *pds.Client) error
	}{
		{"com.atproto.server.createSession", pds.MaxSessionResponse, nil},
		{"com.atproto.repo.getRecord", pds.MaxRecordResponse, func(ctx context.Context, c *pds.Client) error {
			_, err := c.GetRecord(ctx, coll, "k")
			return err
		}},
		{"com.atproto.repo.listRecords", pds.MaxRecordResponse, func(ctx context.Context, c *pds.Client) error {
			_, err := c.ListRecords(ctx, coll, 100)
			return err
		}},
	} {
		t.Run(tc.endpoint, func(t *testing.T) {
			srv := hugeBodyServer(t, tc.endpoint)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var err error
			start := time.Now()
			alloc := allocDuring(func() {
				var c *pds.Client
				c, err = pds.Connect(ctx, srv.URL, pdstest.Handle, pdstest.Password, pds.Options{Policy: local, Store: &pds.MemoryStore{}})
				if err == nil {
					err = tc.call(ctx, c)
				}
			})
			if !errors.Is(err, pds.ErrResponseTooLarge) {
				t.Fatalf("err = %v, want ErrResponseTooLarge", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %s", d)
			}
			// The decoder's buffer doubles up to the limit: a few times
			// the limit, never the 256 MiB the server offers.
			if alloc > uint64(8*tc.limit)+(8<<20) {
				t.Errorf("allocated %d MiB reading an answer limited to %d KiB", alloc>>20, tc.limit>>10)
			}
			t.Logf("refused after %s, %d KiB allocated", time.Since(start).Round(time.Millisecond), alloc>>10)
		})
	}
}
