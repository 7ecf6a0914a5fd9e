// Package firehose follows ATProto firehoses (com.atproto.sync.subscribeRepos
// of a PDS or relay) for many subscribers at once: one connection per
// source, shared by every subscription on it, whatever workspace it
// belongs to. Each commit is verified (structure, prevData, signature
// against the DID's key from an identity directory) before any
// subscription sees it. A subscription keeps the records of its
// collections (and DIDs) and a cursor that only passes events whose
// handling finished, so a consumer that persists Snapshot() and starts
// again from it misses nothing and applies nothing twice (commits at or
// below a repo's applied rev are skipped).
//
// When the stream cannot be trusted to be complete (a new subscription, a
// cursor the source no longer has or one in its future, a commit whose
// prevData does not follow the last applied one, a #sync event, a commit
// that could not be verified for want of the DID's identity), the records
// are listed again from the repo's PDS (com.atproto.repo.listRecords
// between two equal com.atproto.sync.getLatestCommit revs).
//
// Sources and the PDSes of their repos are chosen by tenants: every
// connection passes the operator's address policy and no redirect is
// followed (R18), and metrics are labelled from a set the operator bounds
// (R19).
package firehose

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/go-logr/logr"
	"github.com/gorilla/websocket"

	"github.com/knotless-dev/knotless/internal/backoff"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// Options configure a Hub. Zero fields take defaults.
type Options struct {
	// Directory resolves DIDs to signing keys and PDS endpoints (use a
	// cached directory pointed at the right PLC). Required.
	Directory identity.Directory
	// HTTPClient is used for resync listings (default: 30 s timeout,
	// dialling through Policy, no proxy). It never follows a redirect: its
	// CheckRedirect is replaced, and a 3xx answer is an error.
	HTTPClient *http.Client
	// Dialer opens the websocket (default: 10 s handshake timeout,
	// dialling through Policy, no proxy). A websocket dialer never follows
	// a redirect: a 3xx answer to the handshake fails it.
	Dialer *websocket.Dialer
	// Backoff between reconnects (default 1s..30s, reset after 1 min).
	Backoff backoff.Backoff
	// Workers verify commits of different DIDs in parallel (default 4);
	// commits of one DID are handled in order.
	Workers int
	// IdleTimeout closes a connection that delivered nothing, not even a
	// pong, for this long (default 90 s; pings go out every 30 s).
	IdleTimeout time.Duration
	// Gather is how long a new stream waits for more subscriptions before
	// it connects, so that they share the first connection (default 500 ms).
	Gather  time.Duration
	Metrics *Metrics
	Log     logr.Logger
	// Policy is the address policy every connection to a source or a
	// repo's PDS passes (R18) unless HTTPClient and Dialer are given; nil
	// allows public addresses only.
	Policy *netpolicy.Policy
	// Listing bounds every listing of a source or a repo's PDS (zero
	// fields take the defaults of ListingLimits).
	Listing ListingLimits
	// MetricSources are the source hosts (host or host:port, as in the
	// source URL) whose metrics carry their host as the source label;
	// every other source's are labelled "other", so tenants cannot grow
	// the metrics' label set (R19).
	MetricSources []string
}

// otherSource is the source label of every source not in
// Options.MetricSources.
const otherSource = "other"

func (o Options) withDefaults() Options {
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: 30 * time.Second, Transport: o.Policy.Transport()}
	}
	c := *o.HTTPClient
	c.CheckRedirect = netpolicy.NoRedirects
	o.HTTPClient = &c
	if o.Dialer == nil {
		o.Dialer = &websocket.Dialer{NetDialContext: o.Policy.Dialer(10 * time.Second).DialContext, HandshakeTimeout: 10 * time.Second}
	}
	o.Backoff = o.Backoff.WithDefaults()
	o.Listing = o.Listing.withDefaults()
	if o.Workers <= 0 {
		o.Workers = 4
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 90 * time.Second
	}
	if o.Gather <= 0 {
		o.Gather = 500 * time.Millisecond
	}
	return o
}

// Hub owns the streams. Start it (as a manager runnable) for streams to
// connect; subscriptions made before Start wait for it.
type Hub struct {
	opts Options

	// named are the hosts of Options.MetricSources.
	named map[string]bool

	mu      sync.Mutex
	ctx     context.Context
	streams map[string]*stream
	// labels counts the streams of each metric label that may still write
	// metrics: from their creation until they left streams and their
	// goroutine (if any) ended.
	labels map[string]int
	wg     sync.WaitGroup
}

// NewHub returns a hub; opts.Directory is required.
func NewHub(opts Options) (*Hub, error) {
	if opts.Directory == nil {
		return nil, errors.New("firehose: a directory is required")
	}
	h := &Hub{opts: opts.withDefaults(), named: map[string]bool{}, streams: map[string]*stream{}, labels: map[string]int{}}
	for _, host := range opts.MetricSources {
		host = strings.ToLower(strings.TrimSpace(host))
		if host == "" || strings.ContainsAny(host, "/?#@") {
			return nil, fmt.Errorf("firehose: metric source %q: want host or host:port", host)
		}
		h.named[host] = true
	}
	return h, nil
}

// metricLabel is the source label of a normalized source's metrics: the
// entry of Options.MetricSources that names its host:port or host, or
// "other".
func (h *Hub) metricLabel(source string) string {
	u, err := url.Parse(source)
	switch {
	case err != nil:
	case h.named[u.Host]:
		return u.Host
	case h.named[u.Hostname()]:
		return u.Hostname()
	}
	return otherSource
}

// release ends a stream's hold on its metric label (h.mu is held): the
// series of a named source go with the last stream that held them.
func (h *Hub) release(s *stream) {
	if h.labels[s.label]--; h.labels[s.label] > 0 {
		return
	}
	delete(h.labels, s.label)
	if s.label != otherSource {
		h.opts.Metrics.forget(s.label)
	}
}

// Start runs the streams until ctx ends and waits for all of them.
func (h *Hub) Start(ctx context.Context) error {
	h.mu.Lock()
	h.ctx = ctx
	for _, s := range h.streams {
		h.run(s)
	}
	h.mu.Unlock()
	<-ctx.Done()
	h.wg.Wait()
	return nil
}

// run starts s's goroutine; h.mu is held and h.ctx is set. s.stop is set
// while the goroutine runs.
func (h *Hub) run(s *stream) {
	ctx, cancel := context.WithCancel(h.ctx)
	s.stop = cancel
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		s.run(ctx)
		h.mu.Lock()
		defer h.mu.Unlock()
		s.stop = nil
		cancel()
		if h.streams[s.source] != s {
			h.release(s)
		}
	}()
}

// NormalizeSource checks a source URL (http or https, host, no path,
// query or credentials) and returns its canonical form.
func NormalizeSource(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("source %q: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("source %q: scheme must be http or https", raw)
	}
	if u.Host == "" || u.User != nil || strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("source %q: want scheme://host[:port] with no path, query or credentials", raw)
	}
	return u.Scheme + "://" + strings.ToLower(u.Host), nil
}

// Subscribe adds a subscription on source. initial is the state to resume
// from (zero: start with a full listing); max bounds the records kept
// (the ones changed longest ago are evicted first).
func (h *Hub) Subscribe(source string, filter Filter, maxRecords int, initial State) (*Subscription, error) {
	src, err := NormalizeSource(source)
	if err != nil {
		return nil, err
	}
	if len(filter.Collections) == 0 {
		return nil, errors.New("firehose: at least one collection is required")
	}
	if maxRecords <= 0 {
		maxRecords = 100
	}
	sub := newSubscription(filter, maxRecords, initial)
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.streams[src]
	if s == nil {
		s = newStream(h, src)
		h.streams[src] = s
		h.labels[s.label]++
		if h.ctx != nil {
			h.run(s)
		}
	}
	sub.stream = s
	s.add(sub)
	return sub, nil
}

// Unsubscribe removes sub; a stream without subscriptions disconnects.
func (h *Hub) Unsubscribe(sub *Subscription) {
	if sub == nil || sub.stream == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	s := sub.stream
	if left, ok := s.remove(sub); ok && left == 0 {
		delete(h.streams, s.source)
		if s.stop != nil {
			s.stop() // its goroutine releases the label when it ends
		} else {
			h.release(s)
		}
	}
}
