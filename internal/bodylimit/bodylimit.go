// Package bodylimit bounds how much of an HTTP response knotless reads from
// a server a user chose (a PDS, a DID document's host, a tenant), R21.
// Unlike a bare io.LimitReader it does not end a long body silently where
// the limit cuts it: reading past the limit fails with ErrTooLarge, so a
// truncated document is never decoded as if it were whole.
package bodylimit

import (
	"fmt"
	"io"
	"net/http"
	"sync"
)

// Error is the type of this package's sentinel error.
type Error string

func (e Error) Error() string { return string(e) }

// ErrTooLarge is returned (wrapped, with the limit) by a Reader once the
// body goes on past its limit.
const ErrTooLarge Error = "response too large"

// Reader returns a reader of at most limit bytes of r: it reads limit+1
// bytes to see whether r goes on, and returns an error matching
// ErrTooLarge instead of the bytes past the limit.
func Reader(r io.Reader, limit int64) io.Reader {
	return &reader{r: io.LimitReader(r, limit+1), left: limit, limit: limit}
}

type reader struct {
	r           io.Reader
	left, limit int64
}

func (l *reader) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	if int64(n) > l.left {
		n = int(l.left)
		l.left = 0
		return n, fmt.Errorf("%w (more than %d bytes)", ErrTooLarge, l.limit)
	}
	l.left -= int64(n)
	return n, err
}

// Transport returns rt (nil: http.DefaultTransport) with every response
// body bounded by Reader(body, limit). It is for clients whose reading code
// is a library's (indigo's DID resolution reads with io.ReadAll).
func Transport(rt http.RoundTripper, limit int64) http.RoundTripper {
	if rt == nil {
		rt = http.DefaultTransport
	}
	return transport{rt: rt, limit: limit}
}

type transport struct {
	rt    http.RoundTripper
	limit int64
}

func (t transport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	resp.Body = body{Reader: Reader(resp.Body, t.limit), Closer: resp.Body}
	return resp, nil
}

type body struct {
	io.Reader
	io.Closer
}

// Budget returns rt (nil: http.DefaultTransport) with one limit for the
// bodies of all its responses together: once limit bytes have been read
// from them, reading any fails with ErrTooLarge. It is for a job of many
// requests to one server (a tenant's export), whose whole answer is
// bounded, not only each part of it.
func Budget(rt http.RoundTripper, limit int64) http.RoundTripper {
	if rt == nil {
		rt = http.DefaultTransport
	}
	return &budget{rt: rt, left: limit, limit: limit}
}

type budget struct {
	rt          http.RoundTripper
	mu          sync.Mutex
	left, limit int64
}

func (b *budget) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.rt.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	resp.Body = body{Reader: budgetReader{b: b, r: resp.Body}, Closer: resp.Body}
	return resp, nil
}

type budgetReader struct {
	b *budget
	r io.Reader
}

func (r budgetReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	if int64(n) > r.b.left {
		n = int(r.b.left)
		r.b.left = 0
		return n, fmt.Errorf("%w (more than %d bytes in all)", ErrTooLarge, r.b.limit)
	}
	r.b.left -= int64(n)
	return n, err
}
