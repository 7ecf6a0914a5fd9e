package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/kcp-dev/logicalcluster/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
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

// LoadConfig reads a kubeconfig and names the file in its error.
func LoadConfig(path, context string) (*rest.Config, error) {
	if path == "" {
		return nil, errors.New("no kubeconfig: pass --kubeconfig or set KUBECONFIG")
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	raw, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s is malformed: %w", path, err)
	}
	cc := clientcmd.NewDefaultClientConfig(*raw, &clientcmd.ConfigOverrides{CurrentContext: context})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return cfg, nil
}

// WaitForKCP asks kcp for its version until it answers or timeout passes.
func WaitForKCP(ctx context.Context, cfg *rest.Config, timeout time.Duration) error {
	c := rest.CopyConfig(cfg)
	c.Timeout = 5 * time.Second
	dc, err := discovery.NewDiscoveryClientForConfig(c)
	if err != nil {
		return fmt.Errorf("kcp client for %s: %w", cfg.Host, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		_, err := dc.ServerVersion()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kcp at %s is unreachable after %s: %w", cfg.Host, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// SplitList splits a comma-separated flag value, dropping empty items.
func SplitList(s string) []string {
	var out []string
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// EnsureNamespace creates the namespace in the workspace of cfg unless it
// exists (a new kcp workspace may have none).
func EnsureNamespace(ctx context.Context, cfg *rest.Config, name string) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{}); err == nil {
		return nil
	}
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
