package engage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
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

// watchKey is one source's registration on one wildcard cache.
type watchKey struct {
	cache mcpcache.WildcardCache
	src   *kindSource
}

// exportProvider supervises the kcp apiexport provider of one export.
type exportProvider struct {
	cfg    *rest.Config
	name   string
	opts   Options
	log    logr.Logger
	events *eventWriter

	mu         sync.RWMutex
	inner      *mcpprovider.Provider
	indexes    []index
	restarts   int
	sources    []*kindSource
	shared     map[string]*shared       // of the current inner provider, by virtual workspace URL
	caches     []mcpcache.WildcardCache // the shared caches
	watching   map[watchKey]bool
	workspaces map[multicluster.ClusterName]*workspace
}

func newExportProvider(cfg *rest.Config, name string, opts Options) (*exportProvider, error) {
	if cfg == nil {
		return nil, errors.New("engage: a rest config is required")
	}
	logger := log.Log.WithName("engage").WithValues("export", name)
	return &exportProvider{
		cfg:        cfg,
		name:       name,
		opts:       opts,
		log:        logger,
		events:     newEventWriter(opts.Scheme, logger.WithName("events")),
		watching:   map[watchKey]bool{},
		workspaces: map[multicluster.ClusterName]*workspace{},
	}, nil
}

// Get returns an engaged workspace.
func (e *exportProvider) Get(_ context.Context, name multicluster.ClusterName) (cluster.Cluster, error) {
	if ws := e.workspace(name); ws != nil {
		return ws, nil
	}
	return nil, fmt.Errorf("workspace %s: %w", name, multicluster.ErrClusterNotFound)
}

// workspace returns an engaged workspace, or nil.
func (e *exportProvider) workspace(name multicluster.ClusterName) *workspace {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.workspaces[name]
}

// addSource registers a started source on every wildcard cache, now and
// when the inner provider creates more.
func (e *exportProvider) addSource(ctx context.Context, s *kindSource) error {
	e.mu.Lock()
	e.sources = append(e.sources, s)
	caches := append([]mcpcache.WildcardCache(nil), e.caches...)
	e.mu.Unlock()
	return e.watch(ctx, caches, []*kindSource{s})
}

// watch registers each source on each cache it is not registered on yet.
func (e *exportProvider) watch(ctx context.Context, caches []mcpcache.WildcardCache, sources []*kindSource) error {
	var errs []error
	for _, c := range caches {
		for _, s := range sources {
			k := watchKey{cache: c, src: s}
			e.mu.Lock()
			done := e.watching[k]
			e.watching[k] = true
			e.mu.Unlock()
			if done {
				continue
			}
			if err := s.watch(ctx, c); err != nil {
				e.mu.Lock()
				delete(e.watching, k)
				e.mu.Unlock()
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// engager engages a workspace the inner provider added: it becomes
// visible to Get and to the sources (which deliver its objects), then to
// the manager's other multicluster-aware runnables.
type engager struct {
	e    *exportProvider
	next multicluster.Aware
}

func (a engager) Engage(ctx context.Context, name multicluster.ClusterName, cl cluster.Cluster) error {
	e := a.e
	lc := logicalcluster.Name(name)
	e.mu.Lock()
	sh := e.shared[strings.TrimSuffix(cl.GetConfig().Host, lc.Path().RequestPath())]
	if sh == nil {
		e.mu.Unlock()
		return fmt.Errorf("workspace %s: no virtual workspace URL serves it", name)
	}
	ws := newWorkspace(lc, cl, sh, e.events)
	e.workspaces[name] = ws
	sources := append([]*kindSource(nil), e.sources...)
	e.mu.Unlock()
	// Runs when the workspace is removed; no goroutine waits for it.
	context.AfterFunc(ctx, func() { e.disengage(name, ws) })
	for _, s := range sources {
		if err := s.replay(ctx, name, ws); err != nil {
			e.disengage(name, ws)
			return err
		}
	}
	if a.next != nil {
		return a.next.Engage(ctx, name, ws)
	}
	return nil
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

// disengage forgets ws unless name was engaged again since (the inner
// provider restarted).
func (e *exportProvider) disengage(name multicluster.ClusterName, ws *workspace) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.workspaces[name] == ws {
		delete(e.workspaces, name)
	}
}

// Engaged returns the number of workspaces engaged.
func (e *exportProvider) Engaged() int {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return len(e.workspaces)
}

// Restarts returns how often the inner provider was restarted.
func (e *exportProvider) Restarts() int {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.restarts
}

var errRestart = errors.New("an endpoint did not serve")

// Start runs the event writer and the inner provider, and replaces the
// inner provider, after a backoff, whenever it was handed an endpoint URL
// that did not serve.
func (e *exportProvider) Start(ctx context.Context, aware multicluster.Aware) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return e.events.run(ctx) })
	g.Go(func() error { return e.supervise(ctx, aware) })
	return g.Wait()
}

func (e *exportProvider) supervise(ctx context.Context, aware multicluster.Aware) error {
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
	e.mu.Lock()
	e.caches = nil
	e.shared = map[string]*shared{}
	e.mu.Unlock()
	// Each virtual workspace URL gets the shared cache, client and mapper
	// of its workspaces, and the sources' handlers on that cache, before
	// its first workspace is created. The library's own wildcard cache
	// then holds only the APIBindings it watches.
	newCluster := func(cfg *rest.Config, lc logicalcluster.Name, _ mcpcache.WildcardCache, scheme *runtime.Scheme, recorders mcrecorder.EventRecorderGetter) (*mcpcache.ScopedCluster, error) {
		e.mu.Lock()
		sh := e.shared[cfg.Host]
		if sh == nil {
			var err error
			if sh, err = newShared(cfg, scheme); err != nil {
				e.mu.Unlock()
				return nil, err
			}
			e.shared[cfg.Host] = sh
			e.caches = append(e.caches, sh.cache)
			g.Go(func() error { return sh.cache.Start(ctx) })
		}
		sources := append([]*kindSource(nil), e.sources...)
		e.mu.Unlock()
		if err := e.watch(ctx, []mcpcache.WildcardCache{sh.cache}, sources); err != nil {
			return nil, err
		}
		return mcpcache.NewScopedCluster(cfg, lc, sh.cache, scheme, recorders)
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

	g.Go(func() error { return inner.Start(ctx, engager{e: e, next: aware}) })
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
	for k := range e.watching {
		if slices.Contains(e.caches, k.cache) {
			delete(e.watching, k)
		}
	}
	e.caches = nil
	e.mu.Unlock()
	return err
}
