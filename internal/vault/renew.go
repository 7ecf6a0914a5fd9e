package vault

import (
	"context"
	"errors"
	"time"

	vault "github.com/hashicorp/vault-client-go"
)

// NeedLeaderElection is false: every replica renews its own token.
func (c *Client) NeedLeaderElection() bool { return false }

// Start renews the token at about two thirds of its TTL until ctx ends
// (add the Client to a controller-runtime manager as a Runnable). When a
// renewal fails, the token is not renewable, or Vault caps the renewed TTL
// far below the login TTL, the token is forgotten and the next read logs
// in again. A static token is kept in any case (it cannot be replaced);
// the failure is logged and counted. Start starts no goroutines and
// returns nil when ctx ends. A nil Client returns at once.
func (c *Client) Start(ctx context.Context) error {
	if c == nil {
		return nil
	}
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("vault: Start is already running")
	}
	defer c.running.Store(false)
	defer c.transport.CloseIdleConnections()

	method := "approle"
	if c.static != "" {
		method = "token"
	}
	c.log.Info("Vault connection", "address", c.address, "auth", method, "prefix", c.prefix)

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		c.mu.Lock()
		t := c.tok
		c.mu.Unlock()

		var due <-chan time.Time
		if t != nil && t.ttl > 0 && !t.noRenew {
			timer.Reset(max(t.renewAt().Sub(c.now()), 0))
			due = timer.C
		} else {
			timer.Stop()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.kick:
			continue
		case <-due:
		}
		c.renew(ctx, t)
	}
}

// renew renews t (or gives it up) and updates the cache.
func (c *Client) renew(ctx context.Context, t *token) {
	if !t.renewable {
		if t.static {
			c.log.Info("the static Vault token is not renewable; it will stop working when its TTL ends", "expiresIn", t.issued.Add(t.ttl).Sub(c.now()).Round(time.Second))
			c.giveUpStatic(t)
			return
		}
		c.log.V(1).Info("Vault token is not renewable; the next read logs in again")
		c.forget(t.value)
		return
	}
	issued := c.now()
	resp, err := c.vc.Write(ctx, "auth/token/renew-self", map[string]any{}, vault.WithToken(t.value))
	if ctx.Err() != nil {
		return // shutting down
	}
	if err == nil && (resp == nil || resp.Auth == nil) {
		err = &Error{Op: "renew", Target: "auth/token/renew-self", Kind: ErrUnauthorized, Detail: "the answer carries no auth"}
	}
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			e = classify(ctx, "renew", "auth/token/renew-self", err, t.value)
		}
		c.metrics.renewal(e)
		if t.static {
			c.log.Error(e, "renewing the static Vault token failed; keeping it until Vault rejects it")
			c.giveUpStatic(t)
			return
		}
		c.log.Info("renewing the Vault token failed; the next read logs in again", "error", e.Error())
		c.forget(t.value)
		return
	}
	c.metrics.renewal(nil)
	n := *t
	n.issued = issued
	n.ttl = time.Duration(resp.Auth.LeaseDuration) * time.Second
	n.renewable = resp.Auth.Renewable
	if !t.static && n.ttl > 0 && n.ttl < t.loginTTL/3 {
		// Capped by the role's token_max_ttl: renewing further would only
		// shorten the intervals. Use it until the next planned renewal,
		// then log in afresh.
		n.renewable = false
	}
	c.log.V(1).Info("renewed the Vault token", "ttl", n.ttl, "renewable", n.renewable)
	c.replace(&n)
}

// giveUpStatic stops renewal attempts for the static token t.
func (c *Client) giveUpStatic(t *token) {
	n := *t
	n.noRenew = true
	c.replace(&n)
}
