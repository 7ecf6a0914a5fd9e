package pds

import (
	"errors"
	"fmt"
	"time"

	"github.com/knotless-dev/knotless/internal/bodylimit"
)

// Error is the type of this package's sentinel errors. They are constants so
// that no caller can reassign them; test with errors.Is.
type Error string

func (e Error) Error() string { return string(e) }

const (
	// ErrAuthentication: the PDS refused the credentials or the session
	// (wrong identifier or password, unknown account, AuthenticationRequired,
	// an invalid token, a refresh token that was revoked).
	ErrAuthentication Error = "authentication failed"
	// ErrUnreachable: the PDS could not be reached or did not answer in time
	// (dial error, timeout, TLS failure, or a 502/503/504 from a gateway).
	ErrUnreachable Error = "PDS unreachable"
	// ErrInvalidSwap: the record's current CID is not the swap CID (400
	// InvalidSwap). Re-read the record and decide again.
	ErrInvalidSwap Error = "record changed since it was read (InvalidSwap)"
	// ErrRecordNotFound: 400 RecordNotFound.
	ErrRecordNotFound Error = "record not found"
	// ErrInsecureURL: the PDS URL is plain http to a host the address
	// policy does not allow for it (R19). Nothing was sent.
	ErrInsecureURL Error = "credentials are sent only over https"
	// ErrRedirect: the PDS answered with a 3xx (R18). The redirect was not
	// followed.
	ErrRedirect Error = "the PDS answered with a redirect, which knotless never follows"
	// ErrResponseTooLarge: an answer went on past the size knotless reads
	// of it (MaxSessionResponse, MaxRecordResponse, MaxWriteResponse,
	// MaxDIDDocument). Nothing of it was used.
	ErrResponseTooLarge = bodylimit.ErrTooLarge
	// ErrDIDMismatch: the account's DID document does not exist, does
	// not name this PDS as its #atproto_pds service, or does not declare
	// the handle of the PDS's session (R20). The PDS answered for an
	// account that is not its own.
	ErrDIDMismatch Error = "the PDS's account is not the one its DID document names"
	// ErrDIDUnresolvable: the account's DID document could not be read
	// (the PLC directory or did:web host did not answer with one).
	ErrDIDUnresolvable Error = "the account's DID document could not be resolved"
	// ErrNotAPDSRefusal marks an ErrAuthentication of a 401 or 403 whose
	// body names no XRPC authentication error (AuthenticationRequired,
	// InvalidToken, ...): whatever answered, it did not refuse the
	// credential the way a PDS does. A caller that hides what a server at
	// a private address answered (R17) tells only a PDS's refusal apart.
	ErrNotAPDSRefusal Error = "the answer is no PDS's refusal of the credential"
)

// authError says whether name is an XRPC error name with which a PDS
// refuses a credential or a session.
func authError(name string) bool {
	switch name {
	case "AuthenticationRequired", "AuthMissing", "InvalidToken", "ExpiredToken",
		"AccountTakedown", "AccountDeactivated", "AuthFactorTokenRequired":
		return true
	}
	return false
}

// notAPDSRefusal is an ErrAuthentication marked ErrNotAPDSRefusal; its
// text is the error's own.
type notAPDSRefusal struct{ error }

func (e notAPDSRefusal) Unwrap() []error { return []error{e.error, ErrNotAPDSRefusal} }

// RateLimitedError is returned for HTTP 429. Reset is when the PDS will accept
// requests again, from the RateLimit-Reset header (unix seconds) or else from
// Retry-After; it is the zero time if the PDS sent neither.
type RateLimitedError struct {
	Reset time.Time
}

func (e *RateLimitedError) Error() string {
	if e.Reset.IsZero() {
		return "rate limited by the PDS"
	}
	return "rate limited by the PDS until " + e.Reset.UTC().Format(time.RFC3339)
}

// MaxRateLimitWait bounds how long a PDS's rate limit is waited for at
// once: a reset further away is looked at again after this.
const MaxRateLimitWait = time.Hour

// RateLimitWait is how long to wait before calling the PDS again after
// err, when err is a rate limit whose reset the PDS named and that is
// still ahead (a second past it, at most MaxRateLimitWait). It is false
// for any other error, and for a rate limit without a reset (or one
// already past): the caller backs off as for any failure (through the
// workqueue's growing delay), never retrying at a fixed short interval.
func RateLimitWait(err error, now time.Time) (time.Duration, bool) {
	var rl *RateLimitedError
	if !errors.As(err, &rl) || !rl.Reset.After(now) {
		return 0, false
	}
	// Compared before the second is added: a reset far ahead (a PDS's
	// RateLimit-Reset of any size) saturates Sub, which would wrap.
	if d := rl.Reset.Sub(now); d < MaxRateLimitWait-time.Second {
		return d + time.Second, true
	}
	return MaxRateLimitWait, true
}

// InvalidRequestError is a 400 answer other than the ones with their own
// error (InvalidSwap, RecordNotFound, ExpiredToken/InvalidToken).
type InvalidRequestError struct {
	Name    string // XRPC error name, e.g. "InvalidRequest" or "InvalidRecord"
	Message string
}

func (e *InvalidRequestError) Error() string {
	return fmt.Sprintf("invalid request: %s: %s", e.Name, e.Message)
}

// StatusError is any other non-2xx answer (404, 500, ...). Note that the PDS
// answers 500 when applyWrites creates a key that already exists (and when
// it updates or deletes one that does not): re-read the record before
// deciding whether the write happened.
type StatusError struct {
	StatusCode int
	Name       string
	Message    string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("HTTP %d: %s: %s", e.StatusCode, e.Name, e.Message)
}

// SpecError says which input is invalid and why; nothing was sent to the PDS.
type SpecError struct {
	Field  string // "collection", "rkey", "value", "value.a.b[2]", "did", ...
	Reason string
}

func (e *SpecError) Error() string { return fmt.Sprintf("invalid %s: %s", e.Field, e.Reason) }
