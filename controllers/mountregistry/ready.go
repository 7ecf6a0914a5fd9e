/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package mountregistry

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/kcp-dev/logicalcluster/v3"
	apisv1alpha1 "github.com/kcp-dev/sdk/apis/apis/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mcpprovider "github.com/kcp-dev/multicluster-provider/pkg/provider"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/internal/backoff"
	"github.com/knotless-dev/knotless/internal/bodylimit"
)

// Readiness says when a shim's registry has read every TenantCluster that
// existed when the shim started, so that a replica is Ready (its /readyz)
// only once it would answer for every mounted workspace: a new replica
// behind a Service must not refuse tenants it simply has not read yet.
//
// The initial list (InitialList) names the TenantClusters of every
// workspace whose binding of the export is Ready, with their
// resourceVersions; the Reconciler reports each TenantCluster it handled.
// The replica is ready when every listed TenantCluster was reconciled at
// that resourceVersion or a later one, or was found deleted after the
// list began. Readiness is then kept: later changes are the registry's
// ordinary work.
type Readiness struct {
	mu sync.Mutex
	// seq counts observations; listSeq is seq when the list began.
	seq, listSeq uint64
	listed       bool
	// expected are the listed TenantClusters not observed yet; total
	// is how many were listed.
	expected map[key]string
	total    int
	seen     map[key]observation
	ready    bool
}

type key struct{ cluster, namespace, name string }

type observation struct {
	rv   string
	gone bool
	seq  uint64
}

// NewReadiness returns a Readiness that is not ready.
func NewReadiness() *Readiness {
	return &Readiness{seen: map[key]observation{}}
}

// Observed records that the registry handled the TenantCluster at
// resourceVersion rv (gone: it was not found, rv "", or is being
// deleted).
func (r *Readiness) Observed(cluster, namespace, name, rv string, gone bool) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ready {
		return
	}
	r.seq++
	k := key{cluster, namespace, name}
	r.seen[k] = observation{rv: rv, gone: gone, seq: r.seq}
	r.settle(k)
}

// beginList marks the start of the initial list: deletions observed
// before it do not answer for objects it returns.
func (r *Readiness) beginList() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.listSeq = r.seq
}

// expect records the initial list's TenantClusters and their
// resourceVersions.
func (r *Readiness) expect(items map[key]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.listed, r.expected, r.total = true, items, len(items)
	r.settle()
}

// settle drops the expected TenantClusters that were observed (only k
// when given, else all) and turns ready when none is left; the caller
// holds mu.
func (r *Readiness) settle(only ...key) {
	if !r.listed || r.ready {
		return
	}
	check := func(k key) {
		if rv, ok := r.expected[k]; ok && r.satisfied(r.seen[k], rv) {
			delete(r.expected, k)
		}
	}
	if len(only) > 0 {
		for _, k := range only {
			check(k)
		}
	} else {
		for k := range r.expected {
			check(k)
		}
	}
	if len(r.expected) == 0 {
		r.ready, r.expected, r.seen = true, nil, nil
	}
}

func (r *Readiness) satisfied(o observation, listedRV string) bool {
	switch {
	case o.seq == 0:
		return false
	case o.gone && o.rv == "":
		// Not found: an answer only if looked up after the list began
		// (before it, the object listed may have been created since).
		return o.seq > r.listSeq
	case o.rv == listedRV:
		return true
	}
	// kcp's resourceVersions are etcd revisions: a later one is larger.
	seen, err1 := strconv.ParseUint(o.rv, 10, 64)
	listed, err2 := strconv.ParseUint(listedRV, 10, 64)
	return err1 == nil && err2 == nil && seen >= listed
}

// Ready reports whether the registry has read every TenantCluster.
func (r *Readiness) Ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ready
}

// Check is the shim's readyz check.
func (r *Readiness) Check(*http.Request) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.ready:
		return nil
	case !r.listed:
		return errors.New("the TenantClusters have not been listed yet")
	}
	return fmt.Errorf("the registry has read %d of %d TenantClusters", r.total-len(r.expected), r.total)
}

// InitialList is a runnable of the shim's manager: it lists, once, the
// TenantClusters of every workspace bound to the export (through each
// virtual workspace URL of its APIExportEndpointSlice) for Readiness,
// retrying with backoff until a list succeeds.
type InitialList struct {
	// Config points at the provider workspace.
	Config *rest.Config
	// Client reads the APIExportEndpointSlice in the provider workspace.
	Client client.Reader
	// Export names the APIExport and its endpoint slice.
	Export    string
	Readiness *Readiness
	Log       logr.Logger
	Backoff   backoff.Backoff
	// PageSize bounds the items of one list request (default 500).
	PageSize int
	// PageBytes bounds one list response (default DefaultListPageBytes).
	// A page past it is asked again with half as many items; a page of
	// one item past it fails the list (bodylimit.ErrTooLarge).
	PageBytes int64
}

// DefaultListPageBytes bounds one page of the initial list: members write
// TenantClusters, and a page of large ones (annotations fill an object up
// to the apiserver's request limit of about 3 MiB) is asked again smaller
// rather than read without end; 64 MiB holds a page of one such object
// many times over.
const DefaultListPageBytes = 64 << 20

// Start lists until a list succeeds or ctx ends.
func (l *InitialList) Start(ctx context.Context) error {
	schedule := backoff.NewSchedule(l.Backoff)
	for {
		started := time.Now()
		l.Readiness.beginList()
		items, err := l.list(ctx)
		if err == nil {
			l.Readiness.expect(items)
			l.Log.Info("listed the TenantClusters the registry must read before the shim is ready", "tenantClusters", len(items))
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		delay := schedule.Next(time.Since(started))
		l.Log.Info("listing TenantClusters failed; not ready until it succeeds", "error", err.Error(), "retryIn", delay)
		if !backoff.Sleep(ctx, delay) {
			return nil
		}
	}
}

// list returns the TenantClusters of the workspaces with a Ready binding,
// with their resourceVersions.
func (l *InitialList) list(ctx context.Context) (map[key]string, error) {
	slice := &apisv1alpha1.APIExportEndpointSlice{}
	if err := l.Client.Get(ctx, client.ObjectKey{Name: l.Export}, slice); err != nil {
		return nil, fmt.Errorf("reading the APIExportEndpointSlice %s: %w", l.Export, err)
	}
	urls, err := mcpprovider.DefaultExtractURLsFromEndpointSlice(slice)
	if err != nil {
		return nil, err
	}
	hc, err := rest.HTTPClientFor(l.Config)
	if err != nil {
		return nil, err
	}
	noRedirects := *hc
	noRedirects.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	out := map[key]string{}
	for _, u := range urls {
		bound := map[string]bool{}
		bindings := "/apis/" + apisv1alpha1.SchemeGroupVersion.String() + "/apibindings"
		if err := l.pages(ctx, &noRedirects, u, bindings, func(it item) {
			if it.ready() {
				bound[logicalcluster.From(&it).String()] = true
			}
		}); err != nil {
			return nil, err
		}
		tenants := "/apis/" + computev1alpha1.GroupVersion.String() + "/tenantclusters"
		if err := l.pages(ctx, &noRedirects, u, tenants, func(it item) {
			if lc := logicalcluster.From(&it).String(); bound[lc] {
				out[key{lc, it.Namespace, it.Name}] = it.ResourceVersion
			}
		}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// item is what the list needs of an object: its metadata and, for an
// APIBinding, its conditions.
type item struct {
	metav1.ObjectMeta `json:"metadata"`
	Status            struct {
		Conditions []metav1.Condition `json:"conditions"`
	} `json:"status"`
}

func (it *item) ready() bool {
	for _, c := range it.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

// pages lists path across every cluster of the virtual workspace at vw,
// page by page.
func (l *InitialList) pages(ctx context.Context, hc *http.Client, vw, path string, each func(item)) error {
	size := l.PageSize
	if size <= 0 {
		size = 500
	}
	cont := ""
	for {
		list, err := l.page(ctx, hc, vw, path, size, cont)
		if errors.Is(err, bodylimit.ErrTooLarge) && size > 1 {
			size /= 2
			continue
		}
		if err != nil {
			return err
		}
		for _, it := range list.Items {
			each(it)
		}
		if cont = list.Metadata.Continue; cont == "" {
			return nil
		}
	}
}

// itemList is a page of a list.
type itemList struct {
	Metadata metav1.ListMeta `json:"metadata"`
	Items    []item          `json:"items"`
}

// page reads one page of at most size items of path, from cont, within
// l.PageBytes.
func (l *InitialList) page(ctx context.Context, hc *http.Client, vw, path string, size int, cont string) (*itemList, error) {
	q := url.Values{"limit": {strconv.Itoa(size)}}
	if cont != "" {
		q.Set("continue", cont)
	}
	target := strings.TrimSuffix(vw, "/") + "/clusters/*" + path + "?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", path, err)
	}
	defer func() {
		// What is left of a short body, so the connection is reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("listing %s: HTTP %d", path, resp.StatusCode)
	}
	limit := cmp.Or(l.PageBytes, DefaultListPageBytes)
	list := &itemList{}
	if err := json.NewDecoder(bodylimit.Reader(resp.Body, limit)).Decode(list); err != nil {
		return nil, fmt.Errorf("listing %s, %d items a page: %w", path, size, err)
	}
	return list, nil
}
