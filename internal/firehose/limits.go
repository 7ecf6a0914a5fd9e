package firehose

import (
	"errors"
	"fmt"
	"time"

	"github.com/gorilla/websocket"

	"github.com/knotless-dev/knotless/internal/backoff"
	"github.com/knotless-dev/knotless/internal/bodylimit"
)

// ListingLimits bound what a listing may take from a source or a repo's
// PDS, both chosen by tenants: a listing that passes one fails with an
// error that wraps ErrListingTooLarge, and is tried again only after
// Retry's backoff, so a source with an endless cursor or endless pages
// neither grows the provider's memory nor keeps it busy. Zero fields take
// the defaults (see withDefaults and docs/atproto-watch.md).
type ListingLimits struct {
	// PageBytes bounds one response body of a listing (default 8 MiB).
	PageBytes int64
	// Pages bounds the pages of one listing: the source's listRepos, or
	// one repo's listRecords over all its collections (default 5000).
	Pages int
	// Repos bounds the repos the source's listRepos may name (default
	// 200 000).
	Repos int
	// Records and Bytes bound one repo's listing: its records and their
	// bytes (values, URIs and CIDs; default 250 000 and 64 MiB).
	Records int
	Bytes   int64
	// SourceRecords and SourceBytes bound a full listing of the source,
	// over all its repos (the DIDs of listRepos count as bytes; default
	// 1 000 000 and 256 MiB).
	SourceRecords int
	SourceBytes   int64
	// Retry is the backoff before a refused listing is tried again
	// (default 1 min doubling to 1 h): the source's repos may have
	// shrunk meanwhile.
	Retry backoff.Backoff
}

// Default listing limits.
const (
	DefaultListingPageBytes     = 8 << 20
	DefaultListingPages         = 5000
	DefaultListingRepos         = 200_000
	DefaultListingRecords       = 250_000
	DefaultListingBytes         = 64 << 20
	DefaultListingSourceRecords = 1_000_000
	DefaultListingSourceBytes   = 256 << 20
)

func (l ListingLimits) withDefaults() ListingLimits {
	def := func(v *int64, d int64) {
		if *v <= 0 {
			*v = d
		}
	}
	defInt := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.PageBytes, DefaultListingPageBytes)
	defInt(&l.Pages, DefaultListingPages)
	defInt(&l.Repos, DefaultListingRepos)
	defInt(&l.Records, DefaultListingRecords)
	def(&l.Bytes, DefaultListingBytes)
	defInt(&l.SourceRecords, DefaultListingSourceRecords)
	def(&l.SourceBytes, DefaultListingSourceBytes)
	if l.Retry.Initial <= 0 {
		l.Retry.Initial = time.Minute
	}
	if l.Retry.Max <= 0 {
		l.Retry.Max = time.Hour
	}
	l.Retry = l.Retry.WithDefaults()
	return l
}

// MaxFrameBytes bounds one message of a source's firehose
// (subscribeRepos). The lexicon bounds an honest one: a #commit's blocks
// are at most 2 000 000 bytes and its ops at most 200, a #sync's blocks
// 10 000 bytes, so a frame stays under about 2.1 MB; 5 MiB leaves room. A
// source that sends a larger message loses the connection (ErrFrameTooLarge),
// which is opened again after the stream's backoff.
const MaxFrameBytes = 5 << 20

// ErrFrameTooLarge is wrapped by the error of a connection whose source
// sent a message of more than MaxFrameBytes.
var ErrFrameTooLarge = errors.New("firehose message too large")

// frameTooLarge is err, or one naming the bound if err is a message past
// MaxFrameBytes.
func frameTooLarge(err error) error {
	if errors.Is(err, websocket.ErrReadLimit) {
		return fmt.Errorf("%w: the source sent a message of more than %d bytes; connection closed", ErrFrameTooLarge, MaxFrameBytes)
	}
	return err
}

// ErrListingTooLarge is wrapped by the error of a listing that passed one
// of the hub's ListingLimits.
var ErrListingTooLarge = errors.New("listing too large")

// limitError names the bound a listing passed.
type limitError struct {
	what  string
	limit int64
	// whole is set for a bound of the whole source (its listRepos, or a
	// full listing's budget): one repo past its own bounds is skipped in
	// a full listing, a source past these is refused.
	whole bool
}

func (e *limitError) Error() string {
	return fmt.Sprintf("listing too large: more than %d %s; refused, tried again later", e.limit, e.what)
}

func (e *limitError) Is(target error) bool { return target == ErrListingTooLarge }

// budget counts what a listing took against its bounds. A repo's listing
// within a full listing of the source also charges the source's budget.
type budget struct {
	pages, records int
	bytes          int64
	maxPages       int
	maxRecords     int
	maxBytes       int64
	// unit names what the bounds are of, for the error.
	unit string
	// whole is set on the budget of a full listing of the source.
	whole  bool
	source *budget
	// wasted is what was given back by restore.
	wasted spent
}

// repoBudget is the budget of one repo's listing, within source (nil for
// a listing of one repo).
func (l ListingLimits) repoBudget(source *budget) *budget {
	return &budget{maxPages: l.Pages, maxRecords: l.Records, maxBytes: l.Bytes, unit: "one repo's listing", source: source}
}

// sourceBudget is the budget of a full listing of the source.
func (l ListingLimits) sourceBudget() *budget {
	return &budget{maxPages: l.Pages, maxRecords: l.SourceRecords, maxBytes: l.SourceBytes, unit: "a listing of the source", whole: true}
}

// spent is what a budget has charged: records and bytes.
type spent struct {
	records int
	bytes   int64
}

// mark is what b (nil: none) has charged so far.
func (b *budget) mark() spent {
	if b == nil {
		return spent{}
	}
	return spent{b.records, b.bytes}
}

// restore gives back to b what was charged after m: a try whose listing
// is thrown away (the repo changed while it was read) does not count
// against the source, or a repo that changes at every try would spend
// the source's whole budget with tries each within its own bounds (R21).
// What is given back is counted as wasted, bounded by b's own bounds
// once more: past them, nothing is given back and restore fails, so the
// tries a full listing throws away read at most as much as the source's
// budget (before, many repos that change at every try read without
// bound).
func (b *budget) restore(m spent) error {
	if b == nil {
		return nil
	}
	w := spent{b.wasted.records + b.records - m.records, b.wasted.bytes + b.bytes - m.bytes}
	if w.records > b.maxRecords || w.bytes > b.maxBytes {
		return errWasted
	}
	b.wasted = w
	b.records, b.bytes = m.records, m.bytes
	return nil
}

// errWasted is restore's error: the tries thrown away have read as much
// as the budget's bounds.
var errWasted = errors.New("the listing has thrown away as much as its bounds of tries of repos that changed while they were read")

// page charges one page.
func (b *budget) page() error {
	if b.pages++; b.pages > b.maxPages {
		return &limitError{what: "pages in " + b.unit, limit: int64(b.maxPages), whole: b.whole}
	}
	return nil
}

// take charges n records of size bytes, here and in the source's budget.
func (b *budget) take(n int, size int64) error {
	for c := b; c != nil; c = c.source {
		c.records += n
		c.bytes += size
		if c.records > c.maxRecords {
			return &limitError{what: "records in " + c.unit, limit: int64(c.maxRecords), whole: c.whole}
		}
		if c.bytes > c.maxBytes {
			return &limitError{what: "bytes in " + c.unit, limit: c.maxBytes, whole: c.whole}
		}
	}
	return nil
}

// tooLarge is err, or a limitError if err is a response body past
// limit.
func tooLarge(err error, limit int64) error {
	if errors.Is(err, bodylimit.ErrTooLarge) {
		return &limitError{what: "bytes in one response", limit: limit}
	}
	return err
}

// repoTooLarge reports whether err is a listing refused for one repo's
// bounds (its records, bytes, pages or one response), not the source's.
func repoTooLarge(err error) bool {
	var le *limitError
	return errors.As(err, &le) && !le.whole
}
