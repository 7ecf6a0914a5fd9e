package bootstrap

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/kcp-dev/logicalcluster/v3"
	"k8s.io/client-go/rest"
)

// ForWorkspace returns a copy of cfg that talks to the workspace at path.
// cfg may point at any workspace (its /clusters/... suffix is replaced) or
// at the server's base URL.
func ForWorkspace(cfg *rest.Config, path logicalcluster.Path) (*rest.Config, error) {
	base, err := BaseURL(cfg.Host)
	if err != nil {
		return nil, err
	}
	c := rest.CopyConfig(cfg)
	c.Host = base + path.RequestPath()
	return c, nil
}

// BaseURL strips a /clusters/<name> suffix from a kcp URL.
func BaseURL(host string) (string, error) {
	u, err := url.Parse(host)
	if err != nil {
		return "", fmt.Errorf("kubeconfig server %q is not a URL: %w", host, err)
	}
	if u.Scheme == "" || u.Host == "" {
		return "", fmt.Errorf("kubeconfig server %q is not an absolute URL", host)
	}
	if i := strings.Index(u.Path, "/clusters/"); i >= 0 {
		u.Path = u.Path[:i]
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	return u.String(), nil
}
