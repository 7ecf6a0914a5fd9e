package vault

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	vault "github.com/hashicorp/vault-client-go"
)

// Error kinds. Test with errors.Is; every error ReadKV returns matches at
// most one of them (or a context error when the caller's context ended).
var (
	// ErrDisabled: the provider runs without a Vault address. Methods of a
	// nil *Client return it.
	ErrDisabled = errors.New("vault is not configured (no --vault-address)")
	// ErrForbiddenPath: the reference lies outside the prefix of its
	// workspace and namespace, or is malformed. Nothing was sent to Vault.
	ErrForbiddenPath = errors.New("reference is outside the namespace's Vault prefix")
	// ErrNotFound: the secret, or the key in it, does not exist.
	ErrNotFound = errors.New("not found")
	// ErrUnreachable: Vault did not answer, answered with a server error
	// (sealed, standby, overloaded) or the TLS handshake failed.
	ErrUnreachable = errors.New("vault is unreachable")
	// ErrUnauthorized: login failed, the token was rejected, or the policy
	// does not allow the read.
	ErrUnauthorized = errors.New("vault denied access")
	// ErrInvalidValue: the key holds a JSON object, array or null rather
	// than a string, number or boolean.
	ErrInvalidValue = errors.New("value is not a string")
)

// Condition reasons for controllers (CamelCase, see SPEC section 8).
const (
	ReasonDisabled      = "VaultDisabled"
	ReasonForbiddenPath = "VaultPathForbidden"
	ReasonNotFound      = "VaultSecretNotFound"
	ReasonUnreachable   = "VaultUnreachable"
	ReasonUnauthorized  = "VaultUnauthorized"
	ReasonInvalidValue  = "VaultInvalidValue"
	ReasonError         = "VaultError"
)

// Reason maps an error of this package to a condition reason.
func Reason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrDisabled):
		return ReasonDisabled
	case errors.Is(err, ErrForbiddenPath):
		return ReasonForbiddenPath
	case errors.Is(err, ErrNotFound):
		return ReasonNotFound
	case errors.Is(err, ErrUnreachable):
		return ReasonUnreachable
	case errors.Is(err, ErrUnauthorized):
		return ReasonUnauthorized
	case errors.Is(err, ErrInvalidValue):
		return ReasonInvalidValue
	default:
		return ReasonError
	}
}

// ForbiddenPathError rejects a reference before any request is sent.
// errors.Is(err, ErrForbiddenPath) holds for it.
type ForbiddenPathError struct {
	Workspace string
	Namespace string
	Ref       KVRef
	// Reason says what is wrong, e.g. `path must start with "knotless/ws/ns/"`.
	Reason string
}

func (e *ForbiddenPathError) Error() string {
	return fmt.Sprintf("vault reference %s of workspace %q, namespace %q rejected: %s", e.Ref, e.Workspace, e.Namespace, e.Reason)
}

// Is makes errors.Is(err, ErrForbiddenPath) true.
func (e *ForbiddenPathError) Is(target error) bool { return target == ErrForbiddenPath }

// Error is a failed request. It carries Vault's status and error messages
// (with any token or secret ID redacted) but never a response body, a
// request, a token or a secret value.
type Error struct {
	// Op is "read", "login", "lookup" or "renew".
	Op string
	// Target names what was accessed: a reference (mount, path, key) or an
	// API path.
	Target string
	// Kind is one of the Err* values of this package, or a context error.
	Kind error
	// Status is the HTTP status when Vault answered, else 0.
	Status int
	// Detail holds Vault's error messages, redacted.
	Detail string

	cause error // a transport error; never a *vault.ResponseError
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "vault %s %s: %v", e.Op, e.Target, e.Kind)
	if e.Status != 0 {
		fmt.Fprintf(&b, " (HTTP %d", e.Status)
		if e.Detail != "" {
			fmt.Fprintf(&b, ": %s", e.Detail)
		}
		b.WriteString(")")
	}
	if e.cause != nil {
		fmt.Fprintf(&b, ": %v", e.cause)
	}
	return b.String()
}

// Unwrap returns the kind and the transport cause.
func (e *Error) Unwrap() []error {
	if e.cause == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.cause}
}

// classify turns an error from vault-client-go into an *Error. callerCtx is
// the caller's context: when it ended, the kind is its error rather than
// ErrUnreachable. redact lists strings that must not appear in messages.
func classify(callerCtx context.Context, op, target string, err error, redact ...string) *Error {
	e := &Error{Op: op, Target: target}
	var re *vault.ResponseError
	var rd *vault.RedirectError
	switch {
	case errors.As(err, &re):
		// Keep only the status and Vault's messages: the ResponseError also
		// holds the original request (with its X-Vault-Token header) and,
		// when Vault's answer was not an error list, the raw body.
		e.Status = re.StatusCode
		e.Detail = redactAll(tidy(re.Errors), redact)
		switch {
		case re.StatusCode == http.StatusNotFound:
			e.Kind = ErrNotFound
		case re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden:
			e.Kind = ErrUnauthorized
		case re.StatusCode == http.StatusBadRequest && op == "login":
			// AppRole answers 400 "invalid role or secret ID".
			e.Kind = ErrUnauthorized
		case re.StatusCode >= 500 || re.StatusCode == http.StatusTooManyRequests || re.StatusCode == http.StatusPreconditionFailed:
			e.Kind = ErrUnreachable
		default:
			e.Kind = fmt.Errorf("unexpected answer")
		}
	case errors.As(err, &rd):
		e.Status = rd.StatusCode
		e.Kind = ErrUnreachable
		e.Detail = "redirect"
	case callerCtx.Err() != nil:
		e.Kind = callerCtx.Err()
	default:
		// Network errors, TLS failures, the client-level timeout.
		e.Kind = ErrUnreachable
		e.cause = errors.New(redactAll(err.Error(), redact))
	}
	return e
}

// tidy flattens Vault's messages, which may be multierror lists such as
// "1 error occurred:\n\t* permission denied\n\n", into one line.
func tidy(msgs []string) string {
	var out []string
	for _, m := range msgs {
		for _, line := range strings.Split(m, "\n") {
			line = strings.TrimSpace(line)
			line = strings.TrimSpace(strings.TrimPrefix(line, "* "))
			if line == "" || (strings.HasSuffix(line, " occurred:") && strings.Contains(line, "error")) {
				continue
			}
			out = append(out, line)
		}
	}
	return strings.Join(out, "; ")
}

func redactAll(s string, secrets []string) string {
	for _, v := range secrets {
		if v != "" {
			s = strings.ReplaceAll(s, v, "[redacted]")
		}
	}
	return s
}

// isDenied reports whether err is Vault refusing a token or a path.
func isDenied(err error) bool {
	var e *Error
	return errors.As(err, &e) && errors.Is(e.Kind, ErrUnauthorized) && (e.Status == http.StatusForbidden || e.Status == http.StatusUnauthorized)
}
