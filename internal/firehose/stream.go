package firehose

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bluesky-social/indigo/events"
	"github.com/go-logr/logr"
	"github.com/gorilla/websocket"
	"golang.org/x/sync/errgroup"

	"github.com/knotless-dev/knotless/internal/backoff"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// StreamError is an error frame sent by the source, for example
// FutureCursor.
type StreamError struct {
	Name    string
	Message string
}

func (e *StreamError) Error() string {
	return fmt.Sprintf("the source sent error %s: %s", e.Name, e.Message)
}

var errRewind = errors.New("a subscription needs events the connection has passed")

// ErrPrivateUnreachable marks a failed connection to a source, or a
// listing's request to a PDS, at a loopback, private or shared address
// (netpolicy.Private): what it found there (a closed port, a silent host,
// a certificate that does not verify, a failed handshake) is for the
// provider's log only, so a caller reports all of them alike (R17).
var ErrPrivateUnreachable = errors.New("unreachable at a private address")

// ErrFaultyFrame marks a connection that ended because decoding one of
// the source's frames panicked (a hostile or broken source): the source
// is reconnected after backoff like any failed one, and the provider goes
// on (R21). An event whose handling panics is rejected instead.
var ErrFaultyFrame = errors.New("the source sent a frame that could not be read")

// ErrFaultyListing marks a listing that failed because handling one of
// its records panicked: the listing is tried again after backoff, and
// the provider goes on (R21).
var ErrFaultyListing = errors.New("a listed record could not be handled")

// stream is one source's connection and its subscriptions.
type stream struct {
	hub    *Hub
	source string
	// label is the source label of the stream's metrics.
	label string
	log   logr.Logger
	// stop ends the stream's goroutine; set (under hub.mu) while it runs.
	stop context.CancelFunc

	mu   sync.Mutex
	subs map[*Subscription]struct{}
	// gen counts connections; connected is true while one is open.
	gen        uint64
	connected  bool
	connCursor int64
	lastSeq    int64
	lastErr    error
	tracker    *cursorTracker
	rewind     context.CancelFunc

	resync resyncQueue
}

func newStream(h *Hub, source string) *stream {
	return &stream{
		hub: h, source: source, label: h.metricLabel(source), subs: map[*Subscription]struct{}{},
		log:     h.opts.Log.WithValues("source", source),
		tracker: newCursorTracker(0),
		resync:  resyncQueue{wake: make(chan struct{}, 1)},
	}
}

// add registers sub. If a connection is open and the subscription needs
// events it has already passed, the connection starts again from the
// subscription's cursor.
func (s *stream) add(sub *Subscription) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subs[sub] = struct{}{}
	s.hub.opts.Metrics.subscriptions(s.label, 1)
	if !s.connected {
		return
	}
	c, _ := sub.cursor()
	switch reason := sub.owedFull(); {
	case reason != "":
		sub.join(s.gen)
		s.requestResync(sub, "", reason, 0)
	case s.connCursor > 0 && c >= s.lastSeq:
		sub.join(s.gen)
	default:
		if s.rewind != nil {
			s.rewind()
		}
	}
}

// remove unregisters sub. It returns how many subscriptions are left and
// whether sub was registered.
func (s *stream) remove(sub *Subscription) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.subs[sub]; !ok {
		return len(s.subs), false
	}
	delete(s.subs, sub)
	s.resync.drop(sub)
	s.hub.opts.Metrics.subscriptions(s.label, -1)
	return len(s.subs), true
}

// position returns the safe cursor and generation of the current
// connection and the stream's health.
func (s *stream) position() (int64, uint64, Health) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tracker.Safe(), s.gen, Health{Connected: s.connected, Err: s.lastErr}
}

func (s *stream) run(ctx context.Context) {
	if !backoff.Sleep(ctx, s.hub.opts.Gather) {
		return
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { s.resyncLoop(ctx); return nil })
	g.Go(func() error { s.connectLoop(ctx); return nil })
	_ = g.Wait()
}

func (s *stream) connectLoop(ctx context.Context) {
	schedule := backoff.NewSchedule(s.hub.opts.Backoff)
	for ctx.Err() == nil {
		started := time.Now()
		err := s.connect(ctx)
		if ctx.Err() != nil {
			return
		}
		cause := "error"
		var se *StreamError
		switch {
		case errors.Is(err, errRewind):
			s.hub.opts.Metrics.reconnect(s.label, "rewind")
			continue
		case errors.As(err, &se) && se.Name == "FutureCursor":
			// The source does not have our cursor yet (it lost data or is
			// another instance): list everything and follow live.
			cause = se.Name
			s.eachSub(func(sub *Subscription) {
				sub.reset()
				s.requestResync(sub, "", ResyncFutureCursor, 0)
			})
		}
		delay := schedule.Next(time.Since(started))
		s.hub.opts.Metrics.reconnect(s.label, cause)
		s.log.Info("firehose connection ended; reconnecting", "in", delay, "attempt", schedule.Attempt(), "err", err)
		if !backoff.Sleep(ctx, delay) {
			return
		}
	}
}

func (s *stream) eachSub(f func(*Subscription)) {
	s.mu.Lock()
	subs := s.subscribers()
	s.mu.Unlock()
	for _, sub := range subs {
		f(sub)
	}
}

// subscribers returns the subscriptions; s.mu is held.
func (s *stream) subscribers() []*Subscription {
	out := make([]*Subscription, 0, len(s.subs))
	for sub := range s.subs {
		out = append(out, sub)
	}
	return out
}

// connectCursor is the lowest cursor of the subscriptions that have one
// (0: none has; connect live).
func (s *stream) connectCursor() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var lowest int64
	for sub := range s.subs {
		c, full := sub.cursor()
		if full || c == 0 {
			continue
		}
		if lowest == 0 || c < lowest {
			lowest = c
		}
	}
	return lowest
}

func (s *stream) wsURL(cursor int64) string {
	u := "ws" + strings.TrimPrefix(s.source, "http") + "/xrpc/com.atproto.sync.subscribeRepos"
	if cursor > 0 {
		u += "?cursor=" + strconv.FormatInt(cursor, 10)
	}
	return u
}

// connect runs one connection until it fails or ctx ends.
func (s *stream) connect(ctx context.Context) error {
	cursor := s.connectCursor()
	var private atomic.Bool
	con, resp, err := s.hub.opts.Dialer.DialContext(netpolicy.TracePrivate(ctx, &private), s.wsURL(cursor), nil)
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	if err != nil {
		if resp != nil {
			// A failed handshake (a redirect, too, is not followed).
			err = fmt.Errorf("%w (HTTP %s)", err, resp.Status)
		}
		err = fmt.Errorf("connecting to %s: %w", s.source, err)
		if private.Load() && !errors.Is(err, netpolicy.ErrDenied) {
			err = fmt.Errorf("%w: %w", ErrPrivateUnreachable, err)
		}
		s.mu.Lock()
		s.lastErr = err
		s.mu.Unlock()
		return err
	}
	connCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	s.mu.Lock()
	s.gen++
	gen := s.gen
	s.connected, s.lastErr = true, nil
	s.connCursor, s.lastSeq = cursor, cursor
	s.tracker = newCursorTracker(cursor)
	s.rewind = func() { cancel(errRewind) }
	for sub := range s.subs {
		sub.join(gen)
		if reason := sub.owedFull(); reason != "" {
			// Without a cursor the connection starts live: what happened
			// before it is only known by listing.
			s.requestResync(sub, "", reason, 0)
		}
	}
	tracker := s.tracker
	s.mu.Unlock()
	s.hub.opts.Metrics.connected(s.label, true)
	defer s.hub.opts.Metrics.connected(s.label, false)
	s.log.V(1).Info("firehose connected", "cursor", cursor, "generation", gen)

	con.SetReadLimit(MaxFrameBytes)
	idle := s.hub.opts.IdleTimeout
	_ = con.SetReadDeadline(time.Now().Add(idle))
	sched := newScheduler(connCtx, s, gen, tracker, idle, con)
	err = s.readLoop(connCtx, con, sched)
	if errors.Is(context.Cause(connCtx), errRewind) {
		err = errRewind
	}
	err = frameTooLarge(err)
	// Whatever a private source sent or how it closed reads alike (R17):
	// a websocket server there must not be told from a closed port by
	// its text. knotless's own verdicts on the connection stay.
	if private.Load() && err != nil && ctx.Err() == nil && !errors.Is(err, errRewind) && !errors.Is(err, ErrFaultyFrame) && !errors.Is(err, ErrFrameTooLarge) {
		s.log.V(1).Info("firehose connection at a private address failed", "error", err.Error())
		err = fmt.Errorf("%w: %w", ErrPrivateUnreachable, err)
	}

	s.mu.Lock()
	s.connected = false
	s.rewind = nil
	if !errors.Is(err, errRewind) {
		s.lastErr = err
	}
	safe := tracker.Safe()
	subs := s.subscribers()
	s.mu.Unlock()
	for _, sub := range subs {
		sub.settle(safe, gen)
	}
	return err
}

// readLoop runs indigo's read loop on con until it ends. indigo decodes
// each frame's header and body itself (cbor-gen, go-car, the MST) and
// dereferences what a hostile source can leave out: a panic while it
// reads a frame, or while the scheduler takes it, ends this connection
// with ErrFaultyFrame (the source is faulty: reconnected after backoff,
// its watches say so), never the provider every workspace shares (R21).
func (s *stream) readLoop(ctx context.Context, con *websocket.Conn, sched *scheduler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Info("a frame of the source panicked its decoding; closing the connection", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			err = fmt.Errorf("%w: closed while decoding one", ErrFaultyFrame)
		}
	}()
	return events.HandleRepoStream(ctx, con, sched, slog.New(logr.ToSlogHandler(s.log.V(1))))
}

// dispatch is called by the read loop for every event, in stream order.
// It returns the subscriptions joined to connection gen.
func (s *stream) dispatch(gen uint64, seq int64) []*Subscription {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq > s.lastSeq {
		s.lastSeq = seq
	}
	out := make([]*Subscription, 0, len(s.subs))
	for sub := range s.subs {
		if sub.joined(gen) {
			out = append(out, sub)
		}
	}
	return out
}

// scheduler hands events to workers: one worker per DID hash, so a DID's
// events are handled in order while different DIDs run in parallel.
type scheduler struct {
	s       *stream
	gen     uint64
	tracker *cursorTracker
	idle    time.Duration
	con     interface{ SetReadDeadline(time.Time) error }
	queues  []chan job
	wg      sync.WaitGroup
}

type job struct {
	ev   *events.XRPCStreamEvent
	seq  int64
	subs []*Subscription
}

func newScheduler(ctx context.Context, s *stream, gen uint64, tracker *cursorTracker, idle time.Duration, con interface{ SetReadDeadline(time.Time) error }) *scheduler {
	sc := &scheduler{s: s, gen: gen, tracker: tracker, idle: idle, con: con}
	for range s.hub.opts.Workers {
		q := make(chan job, 64)
		sc.queues = append(sc.queues, q)
		sc.wg.Add(1)
		go func() {
			defer sc.wg.Done()
			for j := range q {
				if ctx.Err() != nil {
					// Stopping: not handled, so the cursor stays before it
					// and the next connection replays it.
					continue
				}
				if !sc.handle(ctx, j) {
					continue
				}
				if ctx.Err() == nil {
					tracker.Done(j.seq)
				}
			}
		}()
	}
	return sc
}

// handle handles one event on a worker. A panic while handling it (indigo
// verifying a #sync's CAR, resolving a DID, a check of a record, ...) is
// an event that failed verification: counted as rejected by the
// subscriptions that wanted its repo, nothing of it applied, and marked
// done, so that the source goes on with its next event. Closing the
// connection instead would stall the source for good: the cursor would
// stay before the event and every reconnection would send it again (one
// hostile repo on a shared relay would halt every watch of that relay).
// The provider goes on either way (R21). It reports whether the event is
// done (false: stopping, it is replayed).
func (sc *scheduler) handle(ctx context.Context, j job) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			did := eventDID(j.ev)
			sc.s.log.Info("an event of the source panicked its handling; rejected", "seq", j.seq, "did", did, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			sc.s.reject(interested(j.subs, did), did, j.seq, fmt.Errorf("invalid event: its handling panicked (%v)", p))
			ok = ctx.Err() == nil
		}
	}()
	sc.s.handle(ctx, j)
	return true
}

// eventDID is the DID of the repo an event is about ("" when none).
func eventDID(ev *events.XRPCStreamEvent) string {
	switch {
	case ev.RepoCommit != nil:
		return ev.RepoCommit.Repo
	case ev.RepoSync != nil:
		return ev.RepoSync.Did
	case ev.RepoIdentity != nil:
		return ev.RepoIdentity.Did
	case ev.RepoAccount != nil:
		return ev.RepoAccount.Did
	}
	return ""
}

// AddWork implements events.Scheduler.
func (sc *scheduler) AddWork(ctx context.Context, repo string, ev *events.XRPCStreamEvent) error {
	// Every frame proves the connection alive: push the idle deadline.
	_ = sc.con.SetReadDeadline(time.Now().Add(sc.idle))
	switch {
	case ev.Error != nil:
		return &StreamError{Name: ev.Error.Error, Message: ev.Error.Message}
	case ev.RepoInfo != nil:
		if ev.RepoInfo.Name == "OutdatedCursor" {
			// The source starts from its oldest event: what came before
			// our cursor and after that is lost, so list again.
			for _, sub := range sc.s.dispatch(sc.gen, 0) {
				sc.s.requestResync(sub, "", ResyncOutdatedCursor, 0)
			}
		}
		return nil
	}
	seq, ok := ev.GetSequence()
	if !ok || !sc.tracker.Start(seq) {
		return nil
	}
	sc.s.hub.opts.Metrics.event(sc.s.label, eventTime(ev))
	j := job{ev: ev, seq: seq, subs: sc.s.dispatch(sc.gen, seq)}
	h := fnv.New32a()
	_, _ = h.Write([]byte(repo))
	select {
	case sc.queues[int(h.Sum32())%len(sc.queues)] <- j:
		return nil
	case <-ctx.Done():
		// Never handled: the cursor stays before it.
		return ctx.Err()
	}
}

// Shutdown implements events.Scheduler: it waits for the workers.
func (sc *scheduler) Shutdown() {
	for _, q := range sc.queues {
		close(q)
	}
	sc.wg.Wait()
}

func eventTime(ev *events.XRPCStreamEvent) time.Time {
	var ts string
	switch {
	case ev.RepoCommit != nil:
		ts = ev.RepoCommit.Time
	case ev.RepoSync != nil:
		ts = ev.RepoSync.Time
	case ev.RepoIdentity != nil:
		ts = ev.RepoIdentity.Time
	case ev.RepoAccount != nil:
		ts = ev.RepoAccount.Time
	}
	t, _ := time.Parse(time.RFC3339Nano, ts)
	return t
}
