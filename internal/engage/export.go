package engage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/kcp-dev/logicalcluster/v3"
	apisv1alpha1 "github.com/kcp-dev/sdk/apis/apis/v1alpha1"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"

	mcpcache "github.com/kcp-dev/multicluster-provider/pkg/cache"
	mcrecorder "github.com/kcp-dev/multicluster-provider/pkg/events/recorder"
	mcpprovider "github.com/kcp-dev/multicluster-provider/pkg/provider"

	"github.com/knotless-dev/knotless/internal/backoff"
)

// ProbeFunc reports whether the virtual workspace at url serves the
// wildcard APIBinding list the provider's endpoint watcher starts with.
type ProbeFunc func(ctx context.Context, cfg *rest.Config, url string) error

// ProbeVirtualWorkspace lists one APIBinding across all clusters of the
// virtual workspace at url, as the endpoint watcher will.
func ProbeVirtualWorkspace(ctx context.Context, cfg *rest.Config, url string) error {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	target := strings.TrimSuffix(url, "/") + "/clusters/*/apis/" + apisv1alpha1.SchemeGroupVersion.String() + "/apibindings?limit=1"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("virtual workspace %s: %w", url, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("virtual workspace %s answered HTTP %d", url, resp.StatusCode)
	}
	return nil
}

type index struct {
	obj     client.Object
	field   string
	extract client.IndexerFunc
}

// exportProvider supervises the kcp apiexport provider of one export.
type exportProvider struct {
	cfg  *rest.Config
	name string
	opts Options
	log  logr.Logger

	mu       sync.RWMutex
	inner    *mcpprovider.Provider
	indexes  []index
	restarts int
}

func newExportProvider(cfg *rest.Config, name string, opts Options) (*exportProvider, error) {
	if cfg == nil {
		return nil, errors.New("engage: a rest config is required")
	}
	return &exportProvider{
		cfg:  cfg,
		name: name,
		opts: opts,
		log:  log.Log.WithName("engage").WithValues("export", name),
	}, nil
}

func (e *exportProvider) Get(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error) {
	e.mu.RLock()
	inner := e.inner
	e.mu.RUnlock()
	if inner == nil {
		return nil, multicluster.ErrClusterNotFound
	}
	return inner.Get(ctx, name)
}

func (e *exportProvider) IndexField(ctx context.Context, obj client.Object, field string, extract client.IndexerFunc) error {
	e.mu.Lock()
	e.indexes = append(e.indexes, index{obj: obj, field: field, extract: extract})
	inner := e.inner
	e.mu.Unlock()
	if inner == nil {
		return nil
	}
	return inner.IndexField(ctx, obj, field, extract)
}

// Engaged returns the number of logical clusters engaged for this export.
func (e *exportProvider) Engaged() int {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.inner == nil {
		return 0
	}
	return len(e.inner.Clusters.ClusterNames())
}

// Restarts returns how often the inner provider was restarted.
func (e *exportProvider) Restarts() int {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.restarts
}

var errRestart = errors.New("an endpoint did not serve")

// Start runs the inner provider and replaces it, after a backoff, whenever
// it was handed an endpoint URL that did not serve.
func (e *exportProvider) Start(ctx context.Context, aware multicluster.Aware) error {
	schedule := backoff.NewSchedule(e.opts.Backoff)
	for {
		started := time.Now()
		err := e.runOnce(ctx, aware)
		if ctx.Err() != nil {
			return nil
		}
		if !errors.Is(err, errRestart) {
			return fmt.Errorf("export %s: %w", e.name, err)
		}
		delay := schedule.Next(time.Since(started))
		e.mu.Lock()
		e.restarts++
		e.mu.Unlock()
		e.log.Info("restarting the export's provider after an endpoint that did not serve", "in", delay, "attempt", schedule.Attempt())
		if !backoff.Sleep(ctx, delay) {
			return nil
		}
	}
}

func (e *exportProvider) runOnce(ctx context.Context, aware multicluster.Aware) error {
	g, ctx := errgroup.WithContext(ctx)
	unserved := make(chan string, 1)

	extract := func(obj client.Object) ([]string, error) {
		urls, err := mcpprovider.DefaultExtractURLsFromEndpointSlice(obj)
		if err != nil {
			return nil, err
		}
		served := make([]string, 0, len(urls))
		for _, u := range urls {
			if err := e.opts.Probe(ctx, e.cfg, u); err != nil {
				e.log.Info("endpoint does not serve yet; it will be retried", "url", u, "reason", err.Error())
				select {
				case unserved <- u:
				default:
				}
				continue
			}
			served = append(served, u)
		}
		return served, nil
	}

	// The library logs whole objects at info level; keep them at V(1).
	logger := e.log.WithName("kcp-provider").V(1)
	// One fanout per wildcard cache (one per virtual workspace URL), so
	// a workspace costs no event handler of its own on shared informers.
	var fanoutsMu sync.Mutex
	fanouts := map[mcpcache.WildcardCache]*fanout{}
	newCluster := func(cfg *rest.Config, lc logicalcluster.Name, wildcard mcpcache.WildcardCache, scheme *runtime.Scheme, recorders mcrecorder.EventRecorderGetter) (*mcpcache.ScopedCluster, error) {
		fanoutsMu.Lock()
		f, ok := fanouts[wildcard]
		if !ok {
			f = newFanout(wildcard, scheme)
			fanouts[wildcard] = f
		}
		fanoutsMu.Unlock()
		return mcpcache.NewScopedCluster(cfg, lc, f.forCluster(lc), scheme, recorders)
	}
	inner, err := mcpprovider.NewProvider(e.cfg, e.name, mcpprovider.Options{
		Scheme:                       e.opts.Scheme,
		EndpointSliceObject:          &apisv1alpha1.APIExportEndpointSlice{},
		ExtractURLsFromEndpointSlice: extract,
		ObjectToWatch:                &apisv1alpha1.APIBinding{},
		NewCluster:                   newCluster,
		AddFilter:                    mcpprovider.ConditionReadyFunc("Ready"),
		UpdateFilter:                 mcpprovider.ConditionReadyFunc("Ready"),
		Log:                          &logger,
	})
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.inner = inner
	indexes := append([]index(nil), e.indexes...)
	e.mu.Unlock()
	for _, ix := range indexes {
		if err := inner.IndexField(ctx, ix.obj, ix.field, ix.extract); err != nil {
			return err
		}
	}

	g.Go(func() error { return inner.Start(ctx, aware) })
	g.Go(func() error {
		select {
		case <-ctx.Done():
			return nil
		case <-unserved:
			return errRestart
		}
	})
	err = g.Wait()
	e.mu.Lock()
	if e.inner == inner {
		e.inner = nil
	}
	e.mu.Unlock()
	return err
}
