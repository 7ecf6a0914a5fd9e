package bootstrap

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	apisv1alpha1 "github.com/kcp-dev/sdk/apis/apis/v1alpha1"
	apisv1alpha2 "github.com/kcp-dev/sdk/apis/apis/v1alpha2"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/knotless-dev/knotless/internal/names"
)

// StaleBinding is a workspace that binds a knotless APIExport the
// provider no longer serves (knotless once served one export per API
// group).
type StaleBinding struct {
	Export, LogicalCluster string
}

// reportStaleBindings logs one line when workspaces bind knotless exports
// of the provider workspace other than the served ones: they are not
// reconciled and must be recreated (docs/operator.md). Failing to look
// is logged, never fatal.
func reportStaleBindings(ctx context.Context, o Options, cfg *rest.Config, c client.Client, served []string) {
	stale, err := StaleBindings(ctx, cfg, c, served)
	switch {
	case err != nil:
		o.Log.Info("could not look for workspaces bound to exports knotless no longer serves", "error", err.Error())
	case len(stale) > 0:
		var exports, clusters []string
		for _, s := range stale {
			if !slices.Contains(exports, s.Export) {
				exports = append(exports, s.Export)
			}
			clusters = append(clusters, s.LogicalCluster)
		}
		o.Log.Info("workspaces bind APIExports that knotless no longer serves; they are not reconciled: recreate them with the current WorkspaceType (docs/operator.md)",
			"exports", exports, "workspaces", len(clusters), "logicalClusters", clusters, "served", served)
	}
}

// StaleBindings lists the APIBindings, in every workspace, of the knotless
// APIExports in the provider workspace (cfg) that are not served: read
// through each stale export's virtual workspace.
func StaleBindings(ctx context.Context, cfg *rest.Config, c client.Client, served []string) ([]StaleBinding, error) {
	var list apisv1alpha2.APIExportList
	if err := c.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing APIExports: %w", err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	var out []StaleBinding
	for _, e := range list.Items {
		if !strings.HasSuffix(e.Name, names.GroupSuffix) || slices.Contains(served, e.Name) {
			continue
		}
		var slice apisv1alpha1.APIExportEndpointSlice
		if err := c.Get(ctx, client.ObjectKey{Name: e.Name}, &slice); err != nil {
			return nil, fmt.Errorf("endpoint slice of %s: %w", e.Name, err)
		}
		for _, ep := range slice.Status.APIExportEndpoints {
			bindings, err := listBindings(ctx, hc, ep.URL)
			if err != nil {
				return nil, fmt.Errorf("bindings of %s: %w", e.Name, err)
			}
			for _, b := range bindings {
				out = append(out, StaleBinding{Export: e.Name, LogicalCluster: b})
			}
		}
	}
	return out, nil
}

// listBindings returns the logical clusters of the APIBindings a virtual
// workspace serves.
func listBindings(ctx context.Context, hc *http.Client, url string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(url, "/")+"/clusters/*/apis/"+apisv1alpha1.SchemeGroupVersion.String()+"/apibindings", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("virtual workspace answered HTTP %d", resp.StatusCode)
	}
	var list struct {
		Items []struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, err
	}
	var out []string
	for _, b := range list.Items {
		out = append(out, b.Metadata.Annotations["kcp.io/cluster"])
	}
	return out, nil
}
