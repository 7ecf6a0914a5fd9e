package framework

import (
	"context"
	"fmt"
	"time"

	"github.com/kcp-dev/logicalcluster/v3"
	apisv1alpha1 "github.com/kcp-dev/sdk/apis/apis/v1alpha1"
	apisv1alpha2 "github.com/kcp-dev/sdk/apis/apis/v1alpha2"
	tenancyv1alpha1 "github.com/kcp-dev/sdk/apis/tenancy/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/knotless-dev/knotless/apis"
	"github.com/knotless-dev/knotless/internal/bootstrap"
)

// Scheme knows the kcp kinds the fixtures use and every knotless kind.
func Scheme() *runtime.Scheme {
	s := apis.NewScheme()
	utilruntime.Must(tenancyv1alpha1.AddToScheme(s))
	utilruntime.Must(apisv1alpha1.AddToScheme(s))
	utilruntime.Must(apisv1alpha2.AddToScheme(s))
	return s
}

// ClientFor returns a client for the workspace at path.
func ClientFor(cfg *rest.Config, path logicalcluster.Path) (client.Client, error) {
	c, err := bootstrap.ForWorkspace(cfg, path)
	if err != nil {
		return nil, err
	}
	return client.New(c, client.Options{Scheme: Scheme()})
}

// CreateWorkspace creates a workspace of the given type (a path such as
// root:knotless:socialweb-application) in parent, as the user of cfg.
func CreateWorkspace(ctx context.Context, cfg *rest.Config, parent logicalcluster.Path, name string, typ logicalcluster.Path) error {
	c, err := ClientFor(cfg, parent)
	if err != nil {
		return err
	}
	typeParent, _ := typ.Parent()
	ws := &tenancyv1alpha1.Workspace{}
	ws.Name = name
	ws.Spec.Type = &tenancyv1alpha1.WorkspaceTypeReference{
		Name: tenancyv1alpha1.WorkspaceTypeName(typ.Base()),
		Path: typeParent.String(),
	}
	if err := c.Create(ctx, ws); err != nil {
		return fmt.Errorf("creating workspace %s in %s: %w", name, parent, err)
	}
	return nil
}

// WaitWorkspaceReady waits until the workspace is Ready and every
// APIBinding in it is Ready.
func WaitWorkspaceReady(ctx context.Context, cfg *rest.Config, parent logicalcluster.Path, name string, timeout time.Duration) error {
	pc, err := ClientFor(cfg, parent)
	if err != nil {
		return err
	}
	wc, err := ClientFor(cfg, parent.Join(name))
	if err != nil {
		return err
	}
	return Eventually(ctx, timeout, fmt.Sprintf("workspace %s and its bindings to be Ready", parent.Join(name)), func(ctx context.Context) (bool, string, error) {
		ws := &tenancyv1alpha1.Workspace{}
		if err := pc.Get(ctx, client.ObjectKey{Name: name}, ws); err != nil {
			if apierrors.IsNotFound(err) {
				return false, "workspace not found", nil
			}
			return false, err.Error(), nil
		}
		if ws.Status.Phase != "Ready" {
			return false, fmt.Sprintf("phase %q, conditions %v", ws.Status.Phase, ws.Status.Conditions), nil
		}
		var bindings apisv1alpha2.APIBindingList
		if err := wc.List(ctx, &bindings); err != nil {
			return false, err.Error(), nil
		}
		if len(bindings.Items) == 0 {
			return false, "no APIBindings", nil
		}
		for _, b := range bindings.Items {
			if b.Status.Phase != apisv1alpha2.APIBindingPhaseBound {
				return false, fmt.Sprintf("binding %s phase %q", b.Name, b.Status.Phase), nil
			}
			ready := false
			for _, c := range b.Status.Conditions {
				if c.Type == "Ready" && c.Status == "True" {
					ready = true
				}
			}
			if !ready {
				return false, fmt.Sprintf("binding %s not Ready", b.Name), nil
			}
		}
		return true, "", nil
	})
}
