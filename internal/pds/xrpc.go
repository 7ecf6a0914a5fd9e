package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/knotless-dev/knotless/internal/bodylimit"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// Bounds of what is read of a PDS's answers (R21): a hostile or broken
// PDS that sends more gets ErrResponseTooLarge, never a truncated decode,
// and costs the provider at most this much memory per call.
const (
	// maxErrorBody bounds how much of an error response is read.
	maxErrorBody = 64 << 10
	// MaxSessionResponse bounds createSession, refreshSession and
	// getSession answers: two JWTs, a DID, a handle and perhaps the DID
	// document (a few KiB).
	MaxSessionResponse = 64 << 10
	// MaxRecordResponse bounds getRecord and a listRecords page (at most
	// 100 records): a record is at most about 1 MiB on the reference
	// PDS, knotless's records are a few KiB.
	MaxRecordResponse = 4 << 20
	// MaxWriteResponse bounds the answers to writes (putRecord,
	// deleteRecord, applyWrites of up to 200 writes) and
	// getLatestCommit: URIs, CIDs and a revision each.
	MaxWriteResponse = 1 << 20
)

// responseLimit is the most of a successful answer to endpoint that is read.
func responseLimit(endpoint string) int64 {
	switch endpoint {
	case "com.atproto.server.createSession", "com.atproto.server.refreshSession", "com.atproto.server.getSession":
		return MaxSessionResponse
	case "com.atproto.repo.getRecord", "com.atproto.repo.listRecords":
		return MaxRecordResponse
	}
	return MaxWriteResponse
}

// lexClient implements indigo's lexutil.LexClient on top of an
// atclient.APIClient. Unlike atclient's own LexDo it keeps the response
// headers (RateLimit-Reset) and turns every failure into this package's
// typed errors.
type lexClient struct {
	c      *Client
	api    *atclient.APIClient
	bearer string // explicit Authorization for unauthenticated clients (refreshSession)
}

func (l lexClient) LexDo(ctx context.Context, method, inputEncoding, endpoint string, params map[string]any, bodyData, out any) error {
	nsid, err := syntax.ParseNSID(endpoint)
	if err != nil {
		return err
	}
	req := atclient.NewAPIRequest(method, nsid, nil)
	req.Headers.Set("Accept", "application/json")
	if bodyData != nil {
		b, err := json.Marshal(bodyData)
		if err != nil {
			return fmt.Errorf("encoding %s request: %w", endpoint, err)
		}
		// GetBody lets the auth layer replay the body after a refresh.
		req.Body = bytes.NewReader(b)
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
		if inputEncoding == "" {
			inputEncoding = "application/json"
		}
		req.Headers.Set("Content-Type", inputEncoding)
	}
	if len(params) > 0 {
		if req.QueryParams, err = atclient.ParseParams(params); err != nil {
			return err
		}
	}
	if l.bearer != "" {
		req.Headers.Set("Authorization", "Bearer "+l.bearer)
	}

	resp, err := l.api.Do(ctx, req)
	if err != nil {
		return transportError(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return l.c.responseError(resp)
	}
	limit := responseLimit(endpoint)
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, limit))
		return nil
	}
	if err := json.NewDecoder(bodylimit.Reader(resp.Body, limit)).Decode(out); err != nil {
		return fmt.Errorf("decoding %s response: %w", endpoint, err)
	}
	return nil
}

// transportError classifies an error of http.Client.Do (always a *url.Error):
// the caller's context ending is reported as such, a dial the address
// policy refused is returned as it is (it matches netpolicy.ErrDenied),
// everything else (dial, DNS, TLS, timeouts, connection resets) as
// ErrUnreachable. Errors that are not a *url.Error themselves (already
// typed by the auth layer, e.g. a failed refresh) pass through unchanged.
func transportError(ctx context.Context, err error) error {
	if _, ok := err.(*url.Error); !ok { //nolint:errorlint // only an error of http.Client.Do itself; errors wrapped by the auth layer are already typed

		return err
	}
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("request aborted: %w", ctx.Err())
	case errors.Is(err, netpolicy.ErrDenied):
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnreachable, err)
}

// responseError turns a non-2xx response into a typed error; a 3xx (which
// the client did not follow) is ErrRedirect. Messages from the PDS are
// redacted of this client's secrets before they go anywhere.
func (c *Client) responseError(resp *http.Response) error {
	if resp.StatusCode >= 300 && resp.StatusCode <= 399 {
		return fmt.Errorf("%w (HTTP %d)", ErrRedirect, resp.StatusCode)
	}
	var eb atclient.ErrorBody
	_ = json.NewDecoder(io.LimitReader(resp.Body, maxErrorBody)).Decode(&eb)
	name, msg := c.redact(eb.Name), c.redact(eb.Message)
	detail := fmt.Sprintf("HTTP %d %s: %s", resp.StatusCode, name, msg)

	switch resp.StatusCode {
	case http.StatusTooManyRequests:
		return &RateLimitedError{Reset: rateLimitReset(resp.Header, time.Now())}
	case http.StatusUnauthorized, http.StatusForbidden:
		if !authError(eb.Name) {
			return notAPDSRefusal{fmt.Errorf("%w: %s", ErrAuthentication, detail)}
		}
		return fmt.Errorf("%w: %s", ErrAuthentication, detail)
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return fmt.Errorf("%w: %s", ErrUnreachable, detail)
	case http.StatusBadRequest:
		switch name {
		case "InvalidSwap":
			return fmt.Errorf("%w: %s", ErrInvalidSwap, msg)
		case "RecordNotFound":
			return fmt.Errorf("%w: %s", ErrRecordNotFound, msg)
		case "ExpiredToken", "InvalidToken", "AuthMissing", "AuthenticationRequired":
			return fmt.Errorf("%w: %s", ErrAuthentication, detail)
		}
		return &InvalidRequestError{Name: name, Message: msg}
	}
	return &StatusError{StatusCode: resp.StatusCode, Name: name, Message: msg}
}

// rateLimitReset reads RateLimit-Reset (unix seconds, as the reference PDS
// sends it; small values are taken as seconds from now) or else Retry-After
// (seconds or an HTTP date).
func rateLimitReset(h http.Header, now time.Time) time.Time {
	if v := h.Get("RateLimit-Reset"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			if n < 1_000_000_000 {
				return now.Add(seconds(n))
			}
			return time.Unix(min(n, now.Unix()+int64(MaxRateLimitWait/time.Second)+1), 0)
		}
	}
	if v := h.Get("Retry-After"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			return now.Add(seconds(n))
		}
		if t, err := http.ParseTime(v); err == nil {
			return t
		}
	}
	return time.Time{}
}

// seconds is n seconds, at most a second past MaxRateLimitWait: a PDS's
// Retry-After of any size would otherwise wrap the multiplication, to a
// wait of a few milliseconds or one in the past.
func seconds(n int64) time.Duration {
	return time.Duration(min(n, int64(MaxRateLimitWait/time.Second)+1)) * time.Second
}

// bearerAuth is the atclient.AuthMethod of a Client. It differs from
// atclient.PasswordAuth in that a refresh (and, if the refresh token is dead,
// a login) is persisted through the SessionStore before the request is
// retried, refreshes are single-flight, and errors are typed.
type bearerAuth struct{ c *Client }

func (a bearerAuth) DoWithAuth(hc *http.Client, req *http.Request, _ syntax.NSID) (*http.Response, error) {
	used := a.c.session().AccessJWT
	req.Header.Set("Authorization", "Bearer "+used)
	resp, err := hc.Do(req)
	if err != nil || !expiredToken(resp) {
		return resp, err
	}
	resp.Body.Close()

	if err := a.c.renew(req.Context(), used); err != nil {
		return nil, err
	}
	retry := req.Clone(req.Context())
	if req.GetBody != nil {
		if retry.Body, err = req.GetBody(); err != nil {
			return nil, err
		}
	}
	retry.Header.Set("Authorization", "Bearer "+a.c.session().AccessJWT)
	return hc.Do(retry) // once: a second ExpiredToken becomes ErrAuthentication
}

// expiredToken reports whether resp is an ExpiredToken error (400 from the
// reference PDS; 401 accepted too). The body stays readable.
func expiredToken(resp *http.Response) bool {
	if resp.StatusCode != http.StatusBadRequest && resp.StatusCode != http.StatusUnauthorized {
		return false
	}
	buf, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(buf), resp.Body), resp.Body}
	var eb atclient.ErrorBody
	return json.Unmarshal(buf, &eb) == nil && eb.Name == "ExpiredToken"
}
