package vault

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"
)

// Defaults of Config.
const (
	DefaultPrefix       = "knotless"
	DefaultAppRoleMount = "approle"
	DefaultTimeout      = 10 * time.Second
)

// AppRoleConfig selects AppRole authentication.
type AppRoleConfig struct {
	// RoleID of the provider's role.
	RoleID string
	// SecretID of the provider's role. When empty, SecretIDFile is read.
	SecretID string
	// SecretIDFile holds the secret ID. It is read by New and again before
	// every login, so an external agent may rotate it.
	SecretIDFile string
	// MountPath of the AppRole auth method (default "approle").
	MountPath string
}

// Config configures the connection. Exactly one of Token/TokenFile or
// AppRole.RoleID selects the authentication method.
type Config struct {
	// Address of Vault or OpenBao, e.g. https://vault.example:8200. Empty
	// disables Vault: New returns a nil *Client.
	Address string
	// CAFile is a PEM bundle of the CAs that sign Vault's serving
	// certificate. Empty means the system roots. The file is re-read when
	// a new connection is made, so a rotated CA takes effect without a
	// restart (R08).
	CAFile string
	// Token is a static token. When empty, TokenFile is read by New, and
	// when that is empty too and no AppRole is configured, the environment
	// variable VAULT_TOKEN.
	Token string
	// TokenFile holds a static token.
	TokenFile string
	// AppRole selects AppRole authentication when RoleID is set.
	AppRole AppRoleConfig
	// Prefix is the tenancy prefix (default "knotless"): a namespace of a
	// workspace may only read paths below
	// <Prefix>/<logical cluster name>/<namespace>/.
	Prefix string
	// Timeout of each request to Vault (default 10s).
	Timeout time.Duration
}

// BindFlags registers the --vault-* flags on fs, writing into cfg.
func BindFlags(fs *flag.FlagSet, cfg *Config) {
	fs.StringVar(&cfg.Address, "vault-address", cfg.Address, "address of Vault/OpenBao (https://host:8200); empty disables Vault references")
	fs.StringVar(&cfg.CAFile, "vault-ca-file", cfg.CAFile, "PEM file with the CAs of Vault's serving certificate (default: system roots; re-read on change)")
	fs.StringVar(&cfg.TokenFile, "vault-token-file", cfg.TokenFile, "file holding a static Vault token, read at start (fallback: env VAULT_TOKEN when no AppRole is configured)")
	fs.StringVar(&cfg.AppRole.RoleID, "vault-approle-role-id", cfg.AppRole.RoleID, "AppRole role ID; selects AppRole authentication")
	fs.StringVar(&cfg.AppRole.SecretIDFile, "vault-approle-secret-id-file", cfg.AppRole.SecretIDFile, "file holding the AppRole secret ID (re-read before every login)")
	fs.StringVar(&cfg.AppRole.MountPath, "vault-approle-mount", orDefault(cfg.AppRole.MountPath, DefaultAppRoleMount), "mount path of the AppRole auth method")
	fs.StringVar(&cfg.Prefix, "vault-prefix", orDefault(cfg.Prefix, DefaultPrefix), "tenancy prefix: a namespace of a workspace may read only <mount>/<prefix>/<logical cluster>/<namespace>/...")
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	fs.DurationVar(&cfg.Timeout, "vault-timeout", timeout, "timeout of each request to Vault")
}

// Enabled reports whether an address is configured.
func (c Config) Enabled() bool { return strings.TrimSpace(c.Address) != "" }

// complete applies defaults, reads the files and validates. It never
// returns a secret in an error.
func (c Config) complete() (Config, error) {
	c.Address = strings.TrimSpace(c.Address)
	u, err := url.Parse(c.Address)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "unix") {
		return c, fmt.Errorf("vault: address %q is not an http(s):// or unix:// URL", c.Address)
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Timeout < 0 {
		return c, fmt.Errorf("vault: timeout %s is negative", c.Timeout)
	}
	if c.AppRole.MountPath == "" {
		c.AppRole.MountPath = DefaultAppRoleMount
	}
	c.AppRole.MountPath = strings.Trim(c.AppRole.MountPath, "/")
	if err := checkMountPath(c.AppRole.MountPath); err != nil {
		return c, fmt.Errorf("vault: AppRole mount %q: %w", c.AppRole.MountPath, err)
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	c.Prefix = strings.Trim(c.Prefix, "/")
	for _, s := range strings.Split(c.Prefix, "/") {
		if err := checkSegment(s); err != nil {
			return c, fmt.Errorf("vault: prefix %q: %w", c.Prefix, err)
		}
	}
	return c.completeAuth()
}

// completeAuth reads the token file, or takes VAULT_TOKEN, and checks that
// exactly one way to authenticate is configured: a token or an AppRole
// with a secret ID.
func (c Config) completeAuth() (Config, error) {
	if c.Token == "" && c.TokenFile != "" {
		var err error
		if c.Token, err = readSecretFile(c.TokenFile); err != nil {
			return c, fmt.Errorf("vault: token file: %w", err)
		}
	}
	approle := c.AppRole.RoleID != ""
	if approle && c.Token != "" {
		return c, errors.New("vault: both a token and an AppRole role ID are configured; choose one")
	}
	if approle {
		if c.AppRole.SecretID == "" && c.AppRole.SecretIDFile == "" {
			return c, errors.New("vault: AppRole needs a secret ID (--vault-approle-secret-id-file)")
		}
		if c.AppRole.SecretIDFile != "" {
			// Fail fast on a missing file; the file is read again at every login.
			if _, err := readSecretFile(c.AppRole.SecretIDFile); err != nil {
				return c, fmt.Errorf("vault: AppRole secret ID file: %w", err)
			}
		}
		return c, nil
	}
	if c.Token == "" && c.TokenFile == "" {
		c.Token = strings.TrimSpace(os.Getenv("VAULT_TOKEN"))
	}
	if c.Token == "" {
		return c, errors.New("vault: no authentication configured: set --vault-token-file, VAULT_TOKEN, or --vault-approle-role-id with --vault-approle-secret-id-file")
	}
	return c, nil
}

// readSecretFile returns the trimmed content of path; errors name the file
// but never its content.
func readSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
