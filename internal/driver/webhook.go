package driver

import (
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
}

// Kubeconfig is the webhook token authentication configuration of the
// VM id: the webhook's path names the VM, so that the agent checks a
// token against that VM's service identity.
func (w *Webhook) Kubeconfig(id string) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["agent"] = &clientcmdapi.Cluster{Server: w.URL + serviceauth.WebhookPath + id, CertificateAuthorityData: w.CA}
	cfg.AuthInfos["tenant"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["webhook"] = &clientcmdapi.Context{Cluster: "agent", AuthInfo: "tenant"}
	cfg.CurrentContext = "webhook"
	return clientcmd.Write(*cfg)
}
