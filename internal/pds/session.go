package pds

import (
	"context"
	"fmt"
	"strings"
	"sync"
)

// Session is what a Client needs to resume without logging in again. It
// holds secrets (the JWTs): persist it in a Secret, never in status or logs.
// String and GoString redact the tokens.
type Session struct {
	Host       string `json:"host"`
	Identifier string `json:"identifier"` // what the session was created with
	DID        string `json:"did"`
	Handle     string `json:"handle"`
	AccessJWT  string `json:"accessJwt"`
	RefreshJWT string `json:"refreshJwt"`
}

func (s Session) String() string {
	return fmt.Sprintf("{Host:%s Identifier:%s DID:%s Handle:%s AccessJWT:[redacted] RefreshJWT:[redacted]}",
		s.Host, s.Identifier, s.DID, s.Handle)
}

func (s Session) GoString() string { return "pds.Session" + s.String() }

// usableFor reports whether s can be resumed for this host and identifier
// (the identifier it was created with, its DID or its handle).
func (s *Session) usableFor(host, identifier string) bool {
	if s == nil || s.Host != host || s.DID == "" || s.AccessJWT == "" || s.RefreshJWT == "" {
		return false
	}
	return strings.EqualFold(s.Identifier, identifier) || s.DID == identifier ||
		strings.EqualFold(s.Handle, identifier)
}

// SessionStore persists one account's session. Load returns (nil, nil) when
// nothing is stored. Save is called after every login and token refresh,
// while the Client holds its renewal lock, so calls never overlap.
type SessionStore interface {
	Load(ctx context.Context) (*Session, error)
	Save(ctx context.Context, s *Session) error
}

// MemoryStore is a SessionStore in memory (tests, one-shot tools). The zero
// value is ready to use.
type MemoryStore struct {
	mu sync.Mutex
	s  *Session
}

func (m *MemoryStore) Load(context.Context) (*Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.s == nil {
		return nil, nil
	}
	s := *m.s
	return &s, nil
}

func (m *MemoryStore) Save(_ context.Context, s *Session) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := *s
	m.s = &c
	return nil
}
