package bodylimit

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestReader(t *testing.T) {
	for _, tc := range []struct {
		body    string
		limit   int64
		tooLong bool
	}{
		{"", 4, false},
		{"abcd", 4, false},
		{"abcde", 4, true},
		{strings.Repeat("x", 1<<20), 1000, true},
	} {
		got, err := io.ReadAll(Reader(strings.NewReader(tc.body), tc.limit))
		if tc.tooLong != errors.Is(err, ErrTooLarge) || (!tc.tooLong && err != nil) {
			t.Errorf("%d bytes, limit %d: err %v", len(tc.body), tc.limit, err)
		}
		if int64(len(got)) > tc.limit {
			t.Errorf("%d bytes, limit %d: read %d bytes", len(tc.body), tc.limit, len(got))
		}
	}
}

// An endless body ends with ErrTooLarge after the limit.
func TestTransportEndlessBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := []byte(strings.Repeat("{", 4096))
		for r.Context().Err() == nil {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	hc := &http.Client{Transport: Transport(nil, 64<<10)}
	resp, err := hc.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if !errors.Is(err, ErrTooLarge) || len(got) != 64<<10 {
		t.Fatalf("read %d bytes, err %v; want 64 KiB and ErrTooLarge", len(got), err)
	}
}

// A budget bounds many answers together: each of 10 KiB passes alone,
// the fourth goes past a budget of 32 KiB and fails, and so does every
// answer after it.
func TestBudgetBoundsAllAnswers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(strings.Repeat("x", 10<<10)))
	}))
	defer srv.Close()
	hc := &http.Client{Transport: Budget(nil, 32<<10)}
	total := 0
	for i := range 5 {
		resp, err := hc.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		total += len(got)
		if want := i >= 3; want != errors.Is(err, ErrTooLarge) {
			t.Errorf("answer %d: read %d bytes, err %v", i, len(got), err)
		}
	}
	if total != 32<<10 {
		t.Errorf("read %d bytes in all, want the budget's 32 KiB", total)
	}
}
