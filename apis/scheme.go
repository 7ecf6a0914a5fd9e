// Package apis gathers every knotless API group.
package apis

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	gatewayv1alpha1 "github.com/knotless-dev/knotless/apis/gateway/v1alpha1"
	identityv1alpha1 "github.com/knotless-dev/knotless/apis/identity/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
)

// Export is the name of the one APIExport that serves every knotless group
// (and of its APIExportEndpointSlice): a workspace that binds it is one
// engaged cluster.
const Export = "knotless.dev"

// AddToScheme registers every knotless group. A group added under apis/
// must be added here; the schema completeness test (R14) fails otherwise.
func AddToScheme(s *runtime.Scheme) error {
	for _, add := range []func(*runtime.Scheme) error{
		appsv1alpha1.AddToScheme,
		atprotov1alpha1.AddToScheme,
		computev1alpha1.AddToScheme,
		gatewayv1alpha1.AddToScheme,
		identityv1alpha1.AddToScheme,
		marketv1alpha1.AddToScheme,
	} {
		if err := add(s); err != nil {
			return err
		}
	}
	return nil
}

// NewScheme returns a new scheme with the Kubernetes core kinds and every
// knotless kind registered.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(AddToScheme(s))
	return s
}
