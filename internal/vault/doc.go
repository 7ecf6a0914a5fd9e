// Package vault is the provider's connection to Vault or OpenBao. Controllers
// use it to read credentials that users reference as typed
// {mount, path, key} objects pointing at KV version 2 secrets (R02).
//
// # Tenancy
//
// One provider serves every workspace, so it authenticates to Vault with a
// single identity (an AppRole, or a static token) and must never let one
// workspace read another workspace's secrets. The responsibility is split
// between the operator's Vault policy and this package.
//
// The operator grants the provider's role read access to everything below
// the tenancy prefix (flag --vault-prefix, default "knotless") of each KV
// v2 mount that workspaces may use, and nothing else:
//
//	path "secret/data/knotless/*" {
//	  capabilities = ["read"]
//	}
//
// The provider needs no list, metadata or write capability. Keep the
// "default" policy attached to the role's tokens: the provider renews its
// token with auth/token/renew-self and checks it with
// auth/token/lookup-self, which "default" allows.
//
// The provider enforces the per-namespace sub-prefix itself (R19): a
// reference coming from namespace "shop" of the workspace whose logical
// cluster name is "2x7uf0bml0q9ms3b" may only name paths below
// "knotless/2x7uf0bml0q9ms3b/shop/", so that whoever may create objects in
// one namespace cannot read the secrets of another. ReadKV checks the
// reference (no "..", ".", empty segments, absolute paths, mounts
// containing "/", characters outside [A-Za-z0-9._@+=,~-]) before anything
// is sent to Vault and returns a *ForbiddenPathError otherwise. The policy
// alone cannot do this: Vault does not know which workspace and namespace
// a reference comes from.
//
// Workspace owners (or whoever provisions secrets for them) therefore write
// to <mount>/data/<prefix>/<logical cluster>/<namespace>/..., for example
// with a policy of their own that grants create/update on that sub-tree.
//
// # Tokens
//
// A Client logs in lazily. Logins are de-duplicated (R09): any number of
// concurrent callers that find no token, or an expired one, wait for a
// single login. Start, run as a controller-runtime Runnable, renews the
// token at about two thirds of its TTL and forgets it when it cannot be
// renewed, so that the next read logs in again. When a read is refused
// with 403, the client asks auth/token/lookup-self whether its token is
// still good: if it is not, it logs in again (single-flight) and retries
// the read once; if it is, the refusal is the policy's and is returned as
// ErrUnauthorized without a new login, so a workspace cannot make the
// provider log in on every reconcile.
//
// Only endpoints that OpenBao implements identically are used: KV v2 read,
// auth/<approle mount>/login, auth/token/renew-self and
// auth/token/lookup-self. Tokens travel per request (vault.WithToken); the
// shared vault-client-go client never holds one.
//
// Errors and logs never contain secret values or tokens. See docs/vault.md
// for the operator's setup.
package vault
