// Package gateway is the bidder's side of a Gateway (issue 32, being
// built): how knotless-agent reaches a tenant's pods to forward traffic to
// them.
//
// A tenant's pods are reached through the tenant's own API server, with
// the port-forward subresource a `kubectl port-forward` uses: the agent
// holds each tenant's admin configuration, the kubelet dials the port
// inside the named pod's network namespace, and the tenant cannot choose
// the address dialled (kind tenants share pod and service ranges, and a
// tenant-written address could name the host). One upgraded connection
// is kept per pod; each dialled connection is one pair of streams on it.
package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	streamhttp "k8s.io/streaming/pkg/httpstream"

	"github.com/knotless-dev/knotless/internal/bodylimit"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// maxRemoteError bounds what is read of a stream's error message: it is
// the tenant's kubelet's words (R21).
const maxRemoteError = 4096

// linkIdle is how long a pod's connection is kept with no stream open.
const linkIdle = 2 * time.Minute

// PodDialer dials ports of a tenant's pods through the tenant's API server.
// Its zero value is not usable: make it with NewPodDialer.
type PodDialer struct {
	cfg  *rest.Config
	core rest.Interface
	// upgrade makes an upgraded connection to the port-forward URL; a
	// field so that tests of the stream handling can count the upgrades.
	upgrade func(u string) (streamhttp.Connection, error)

	mu     sync.Mutex
	links  map[types.NamespacedName]*podLink
	closed bool
	// tasks are the dialer's goroutines (upgrades, and each connection's
	// two stream readers): Wait joins them after Close (R10).
	tasks sync.WaitGroup
}

// maxLinks bounds the pods of one tenant with a connection kept: past
// it, the one used longest ago is closed (pod names are the tenant's).
const maxLinks = 64

// maxAnswer bounds what is read of one answer of the tenant's API server
// (a refused upgrade, a Service, a list of EndpointSlices: R21).
const maxAnswer = 4 << 20

// podLink is the upgraded connection of one pod, the next request id of
// its stream pairs, and when it was last dialled.
type podLink struct {
	d      *PodDialer
	conn   streamhttp.Connection
	nextID atomic.Int64
	used   atomic.Int64 // unix nanoseconds
}

// NewPodDialer dials through the API server cfg names, with cfg's
// credentials. cfg is copied; redirects are refused (R18), and its
// Timeout, when set, bounds each upgrade.
func NewPodDialer(cfg *rest.Config) (*PodDialer, error) {
	cfg = rest.CopyConfig(cfg)
	wrap := cfg.WrapTransport
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if wrap != nil {
			rt = wrap(rt)
		}
		return bodylimit.Transport(rt, maxAnswer)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("the tenant's API client: %w", err)
	}
	d := &PodDialer{cfg: cfg, core: cs.CoreV1().RESTClient(), links: map[types.NamespacedName]*podLink{}}
	d.upgrade = d.spdyUpgrade
	return d, nil
}

// spdyUpgrade upgrades a POST of u to the port-forward protocol over SPDY,
// following no redirect.
func (d *PodDialer) spdyUpgrade(u string) (streamhttp.Connection, error) {
	rt, upgrader, err := spdy.RoundTripperFor(d.cfg)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest(http.MethodPost, u, nil)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Transport: rt, Timeout: d.cfg.Timeout, CheckRedirect: netpolicy.NoRedirects}
	conn, _, err := spdy.NegotiateStreaming(upgrader, hc, req, portforward.PortForwardProtocolV1Name)
	return conn, err
}

// DialPod opens a connection to port of pod ns/name. The kubelet dials
// the port when the streams open: a closed port shows as an error from
// the first Read.
func (d *PodDialer) DialPod(ctx context.Context, ns, pod string, port int32) (net.Conn, error) {
	if len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(pod)) > 0 || port < 1 || port > 65535 {
		return nil, errors.New("not a pod's port")
	}
	k := types.NamespacedName{Namespace: ns, Name: pod}
	link, err := d.link(ctx, k)
	if err != nil {
		return nil, err
	}
	c, err := link.open(k, port)
	if err == nil {
		return c, nil
	}
	if !link.broken() {
		// The streams were refused (a port the pod does not listen on
		// may be reset at once): the pod's connection stays.
		return nil, fmt.Errorf("port-forward to pod %s/%s: %w", ns, pod, err)
	}
	// The pod's connection broke (the pod went, the API server
	// restarted): forget it, and try once on a new one.
	d.drop(k, link)
	if link, err = d.link(ctx, k); err != nil {
		return nil, err
	}
	if c, err = link.open(k, port); err != nil {
		if link.broken() {
			d.drop(k, link)
		}
		return nil, fmt.Errorf("port-forward to pod %s/%s: %w", ns, pod, err)
	}
	return c, nil
}

// broken reports whether the pod's connection has closed.
func (l *podLink) broken() bool {
	select {
	case <-l.conn.CloseChan():
		return true
	default:
		return false
	}
}

// link is the pod's upgraded connection, made when there is none.
func (d *PodDialer) link(ctx context.Context, k types.NamespacedName) (*podLink, error) {
	d.mu.Lock()
	l, closed := d.links[k], d.closed
	d.mu.Unlock()
	if closed {
		return nil, errors.New("the tenant's dialer is closed")
	}
	if l != nil {
		select {
		case <-l.conn.CloseChan():
			d.drop(k, l)
		default:
			l.used.Store(time.Now().UnixNano())
			return l, nil
		}
	}
	u := d.core.Post().Namespace(k.Namespace).Resource("pods").Name(k.Name).SubResource("portforward").URL().String()
	// The upgrade takes no context: it runs aside, and a connection that
	// comes after ctx ended is closed.
	type result struct {
		conn streamhttp.Connection
		err  error
	}
	got, gaveUp := make(chan result, 1), make(chan struct{})
	if !d.spawn(func() {
		conn, err := d.upgrade(u)
		select {
		case got <- result{conn, err}:
		case <-gaveUp:
			if conn != nil {
				_ = conn.Close()
			}
		}
	}) {
		return nil, errors.New("the tenant's dialer is closed")
	}
	var r result
	select {
	case r = <-got:
	case <-ctx.Done():
		close(gaveUp)
		// The upgrade may have come meanwhile.
		select {
		case r = <-got:
			if r.conn != nil {
				_ = r.conn.Close()
			}
		default:
		}
		return nil, ctx.Err()
	}
	if r.err != nil {
		return nil, fmt.Errorf("port-forward to pod %s: %w", k, r.err)
	}
	// A pod no longer dialled (gone, or no longer an endpoint) lets its
	// connection go.
	r.conn.SetIdleTimeout(linkIdle)
	l = &podLink{d: d, conn: r.conn}
	l.used.Store(time.Now().UnixNano())
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		_ = r.conn.Close()
		return nil, errors.New("the tenant's dialer is closed")
	}
	if old := d.links[k]; old != nil {
		// Another dial made one meanwhile: keep one.
		_ = r.conn.Close()
		return old, nil
	}
	if len(d.links) >= maxLinks {
		d.evictLocked()
	}
	d.links[k] = l
	return l, nil
}

// evictLocked closes the connection used longest ago.
func (d *PodDialer) evictLocked() {
	var oldest types.NamespacedName
	var at int64
	for k, l := range d.links {
		if u := l.used.Load(); at == 0 || u < at {
			oldest, at = k, u
		}
	}
	if l := d.links[oldest]; l != nil {
		delete(d.links, oldest)
		_ = l.conn.Close()
	}
}

// drop closes l and forgets it if it is still k's.
func (d *PodDialer) drop(k types.NamespacedName, l *podLink) {
	d.mu.Lock()
	if d.links[k] == l {
		delete(d.links, k)
	}
	d.mu.Unlock()
	_ = l.conn.Close()
}

// spawn runs f in a goroutine Wait joins, unless the dialer is closed.
func (d *PodDialer) spawn(f func()) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	d.tasks.Go(f)
	return true
}

// Wait returns once every goroutine of the dialer has ended: after Close,
// within the upgrade's timeout.
func (d *PodDialer) Wait() { d.tasks.Wait() }

// Close closes every pod's connection (and so ends their streams).
func (d *PodDialer) Close() error {
	d.mu.Lock()
	links := d.links
	d.links, d.closed = map[types.NamespacedName]*podLink{}, true
	d.mu.Unlock()
	for _, l := range links {
		_ = l.conn.Close()
	}
	return nil
}

// open makes the error and data streams of one connection to port, as
// kubectl port-forward does.
func (l *podLink) open(k types.NamespacedName, port int32) (*podConn, error) {
	h := http.Header{}
	h.Set(corev1.StreamType, corev1.StreamTypeError)
	h.Set(corev1.PortHeader, strconv.Itoa(int(port)))
	h.Set(corev1.PortForwardRequestIDHeader, strconv.FormatInt(l.nextID.Add(1), 10))
	errs, err := l.conn.CreateStream(h)
	if err != nil {
		return nil, err
	}
	// Nothing is written on the error stream.
	_ = errs.Close()
	h.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := l.conn.CreateStream(h)
	if err != nil {
		l.conn.RemoveStreams(errs)
		return nil, err
	}
	c := &podConn{link: l, data: data, errs: errs, remote: make(chan error, 1),
		addr: podAddr(fmt.Sprintf("%s:%d", k, port))}
	c.cond = sync.NewCond(&c.bmu)
	if !l.d.spawn(func() {
		msg, err := io.ReadAll(io.LimitReader(errs, maxRemoteError))
		switch {
		case len(msg) > 0:
			c.remote <- fmt.Errorf("the pod's port: %s", msg)
		case err != nil:
			c.remote <- err
		}
		close(c.remote)
	}) || !l.d.spawn(c.pump) {
		_ = c.Close()
		return nil, errors.New("the tenant's dialer is closed")
	}
	return c, nil
}

// podConn is one connection to a pod's port: a net.Conn over a data
// stream, whose error stream says why it ended, if it failed.
//
// A stream has no flow control: what the pod sends is queued in the agent
// whether it is read or not. So the data stream is always read, into a
// buffer of at most maxBuffered bytes; a connection whose reader falls
// that far behind is reset (R21).
type podConn struct {
	link       *podLink
	data, errs streamhttp.Stream
	remote     chan error
	once       sync.Once // remoteErr
	failed     error
	closed     sync.Once
	addr       podAddr

	bmu    sync.Mutex
	cond   *sync.Cond
	buf    bytes.Buffer
	end    error // the data stream's end (io.EOF or its error)
	isShut bool  // Close was called

	mu       sync.Mutex
	deadline *time.Timer
}

// maxBuffered bounds what is held of a connection's unread data.
const maxBuffered = 4 << 20

// errBehind ends a connection whose reader fell maxBuffered behind.
var errBehind = errors.New("the pod sent more than the client read")

// pump reads the data stream into the buffer until it ends.
func (c *podConn) pump() {
	chunk := make([]byte, 32<<10)
	for {
		n, err := c.data.Read(chunk)
		c.bmu.Lock()
		if n > 0 && c.buf.Len()+n > maxBuffered {
			err = errBehind
		} else if n > 0 {
			c.buf.Write(chunk[:n])
		}
		if err != nil && c.end == nil {
			c.end = err
		}
		c.cond.Broadcast()
		c.bmu.Unlock()
		if errors.Is(err, errBehind) {
			// A reset is a frame to the tenant, which may not read it:
			// never under the lock Read and Close take.
			_ = c.data.Reset()
		}
		if err != nil {
			return
		}
	}
}

// errWait is how long a Read that met the data stream's end waits for the
// error stream's message: the kubelet writes it before it closes both.
const errWait = 2 * time.Second

func (c *podConn) Read(p []byte) (int, error) {
	c.bmu.Lock()
	for c.buf.Len() == 0 && c.end == nil && !c.isShut {
		c.cond.Wait()
	}
	if c.buf.Len() > 0 {
		n, _ := c.buf.Read(p)
		c.bmu.Unlock()
		return n, nil
	}
	end, shut := c.end, c.isShut
	c.bmu.Unlock()
	if shut {
		return 0, net.ErrClosed
	}
	if remote := c.remoteErr(); remote != nil {
		return 0, remote
	}
	if errors.Is(end, io.EOF) {
		return 0, io.EOF
	}
	return 0, end
}

// remoteErr is the error stream's message, if it has one, waiting for it
// at most errWait the first time.
func (c *podConn) remoteErr() error {
	c.once.Do(func() {
		t := time.NewTimer(errWait)
		defer t.Stop()
		select {
		case c.failed = <-c.remote:
		case <-t.C:
		}
	})
	return c.failed
}

func (c *podConn) Write(p []byte) (int, error) { return c.data.Write(p) }

// CloseWrite ends what is sent, keeping what is received (a half close).
func (c *podConn) CloseWrite() error { return c.data.Close() }

// Close resets the streams and lets the connection forget them.
func (c *podConn) Close() error {
	c.closed.Do(func() {
		c.bmu.Lock()
		c.isShut = true
		c.buf.Reset()
		c.cond.Broadcast()
		c.bmu.Unlock()
		// Resets are frames to the tenant, which may not read them: they
		// do not hold up the closer (a tracked goroutine; inline once the
		// dialer is closed, when its connection is gone).
		reset := func() {
			_ = c.data.Reset()
			_ = c.errs.Reset()
			c.link.conn.RemoveStreams(c.data, c.errs)
		}
		if !c.link.d.spawn(reset) {
			reset()
		}
		c.mu.Lock()
		if c.deadline != nil {
			c.deadline.Stop()
		}
		c.mu.Unlock()
	})
	return nil
}

func (c *podConn) LocalAddr() net.Addr  { return c.addr }
func (c *podConn) RemoteAddr() net.Addr { return c.addr }

// SetDeadline closes the connection when t passes: streams have no
// deadlines of their own, and what waits on them (http.Transport) ends
// them by closing.
func (c *podConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.deadline != nil {
		c.deadline.Stop()
		c.deadline = nil
	}
	if !t.IsZero() {
		c.deadline = time.AfterFunc(time.Until(t), func() { _ = c.Close() })
	}
	return nil
}

func (c *podConn) SetReadDeadline(t time.Time) error  { return c.SetDeadline(t) }
func (c *podConn) SetWriteDeadline(t time.Time) error { return c.SetDeadline(t) }

// podAddr names a pod's port as an address.
type podAddr string

func (a podAddr) Network() string { return "portforward" }
func (a podAddr) String() string  { return string(a) }
