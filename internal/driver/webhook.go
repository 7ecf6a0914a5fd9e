package driver

import (
	"io"
	"net/url"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/knotless-dev/knotless/internal/serviceauth"
)

// WebhookCacheTTL is how long a tenant apiserver keeps a token's review:
// a token is refused at most this long after it expired (it is valid for
// at most serviceauth.MaxLifetime).
const WebhookCacheTTL = 10 * time.Second

// Webhook is the agent's service-auth webhook (serviceauth.Webhook), as
// a tenant apiserver reaches it.
type Webhook struct {
	// URL is its base (https://host:port).
	URL string
	// CA is the PEM of the CA of its serving certificate.
	CA []byte
	// ListenFor serves the webhook, for the VM id alone, on one more
	// address (a kind VM's docker network gateway: its node cannot reach
	// the agent's loopback address) until the Closer is closed; nil when
	// the agent serves nowhere else.
	ListenFor func(id, addr string) (io.Closer, error)
}

// Kubeconfig is the webhook token authentication configuration of the
// VM id: the webhook's path names the VM, so that the agent checks a
// token against that VM's service identity.
func (w *Webhook) Kubeconfig(id string) ([]byte, error) {
	return w.KubeconfigAt(id, "")
}

// KubeconfigAt is Kubeconfig for a tenant that reaches the webhook at
// hostPort (one ListenFor serves) rather than at URL: it still verifies
// the serving certificate for URL's host.
func (w *Webhook) KubeconfigAt(id, hostPort string) ([]byte, error) {
	u, err := url.Parse(w.URL)
	if err != nil {
		return nil, err
	}
	cluster := &clientcmdapi.Cluster{Server: w.URL + serviceauth.WebhookPath + id, CertificateAuthorityData: w.CA}
	if hostPort != "" {
		cluster.Server, cluster.TLSServerName = "https://"+hostPort+serviceauth.WebhookPath+id, u.Hostname()
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["agent"] = cluster
	cfg.AuthInfos["tenant"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["webhook"] = &clientcmdapi.Context{Cluster: "agent", AuthInfo: "tenant"}
	cfg.CurrentContext = "webhook"
	return clientcmd.Write(*cfg)
}
