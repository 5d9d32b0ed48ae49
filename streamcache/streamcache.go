// Package streamcache keeps idle driver streams for reuse, so that opening
// and closing a client does not create and destroy driver streams each time.
//
// # Keys
//
// Streams are kept per (backend, device, flags, priority). The backend is
// part of the key because a process may open several backends (tests open a
// sim backend each): a stream is only ever handed back to the backend that
// created it. Priorities are used as given; two out-of-range priorities that
// the driver clamps to the same value still make two keys.
//
// # Health
//
// A stream is cached only when it is known healthy and idle (docs/ARCHITECTURE.md
// rule 9):
//
//   - Put destroys a stream whose user reports an error on it, and a stream
//     whose query fails: a stream that failed is never handed out again.
//   - Put destroys a stream that a query finds busy: its work belongs to the
//     previous owner and must not delay or interleave with the next one's.
//     (A destroyed stream's pending work still completes; the driver frees
//     it afterwards.)
//   - Get queries a cached stream again before handing it out, because a
//     device may have faulted while the stream sat in the cache; a stream
//     that fails that check is destroyed and Get moves on.
//   - Put destroys a stream when its key already holds
//     Options.MaxIdlePerKey idle streams, which bounds the cache.
//
// Every destruction is counted as a discard (Stats). Purge destroys the idle
// streams of one backend and must be called before that backend is closed;
// PurgeAll destroys every idle stream.
//
// # Contexts
//
// The cache calls StreamQuery, StreamCreate and StreamDestroy from whichever
// goroutine calls Get, Put or Purge. The backend makes the stream's device
// context current on the calling thread for each of those calls (see the
// gpu package doc), so the cache never manages contexts itself.
//
// # Errors
//
// Put and Purge return the errors of the driver calls they made. A stream
// that Get discards is destroyed on the way to handing out another; an error
// from that destruction cannot be returned with the stream, so it is kept
// and returned by the next Purge of that backend (or PurgeAll), and counted
// in Stats.DestroyErrors.
package streamcache

import (
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/stablegraph/stablegraph/gpu"
)

// Options configure a Cache. The zero value is valid.
type Options struct {
	// MaxIdlePerKey is the most idle streams kept per key; a stream put back
	// when its key already holds that many is destroyed. Default 16. A
	// negative value keeps none: every Put destroys, and the cache only
	// counts (useful to measure the cost of running without it).
	MaxIdlePerKey int
}

// DefaultMaxIdlePerKey is the default of Options.MaxIdlePerKey.
const DefaultMaxIdlePerKey = 16

func (o Options) withDefaults() Options {
	if o.MaxIdlePerKey == 0 {
		o.MaxIdlePerKey = DefaultMaxIdlePerKey
	}
	return o
}

// Key selects the streams of one backend that are interchangeable.
type Key struct {
	Device   int
	Flags    gpu.StreamFlags
	Priority int
}

// Stats are a cache's counters, cumulative since New.
type Stats struct {
	Hits   uint64 // Get handed out a cached stream
	Misses uint64 // Get created a stream
	// Discards counts streams destroyed instead of being cached or handed
	// out: the sum of the four reasons below.
	Discards        uint64
	DiscardedFailed uint64 // the user reported an error, or a query failed
	DiscardedBusy   uint64 // a query found work still pending at Put
	DiscardedFull   uint64 // the key already held MaxIdlePerKey streams
	DiscardedPurged uint64 // destroyed by Purge or PurgeAll
	// DestroyErrors counts StreamDestroy calls that failed.
	DestroyErrors uint64
	// Idle is the number of streams in the cache now.
	Idle int
}

// Streams is what the cache needs of a backend. gpu.Backend satisfies it.
// Its dynamic type must be comparable (a pointer, typically): the backend
// is part of the key.
type Streams interface {
	StreamCreate(dev int, flags gpu.StreamFlags, priority int) (gpu.Stream, error)
	StreamQuery(s gpu.Stream) (idle bool, err error)
	StreamDestroy(s gpu.Stream) error
}

type fullKey struct {
	b Streams
	Key
}

// Cache is a bounded cache of idle streams.
//
// A Cache is safe for concurrent use. Its lock guards only its maps and
// counters; driver calls are made without it.
type Cache struct {
	opts Options

	mu struct {
		sync.Mutex
		idle     map[fullKey][]gpu.Stream // LIFO: the most recently used is reused first
		deferred map[Streams][]error      // destroy errors from Get, returned by Purge
		stats    Stats
	}
}

// Default is the process-wide cache, with default options. Clients take
// their streams from it unless given another.
var Default = New(Options{})

// New returns an empty cache. Tests use their own; programs share Default.
func New(opts Options) *Cache {
	c := &Cache{opts: opts.withDefaults()}
	c.mu.idle = map[fullKey][]gpu.Stream{}
	c.mu.deferred = map[Streams][]error{}
	return c
}

// Options returns the cache's options with defaults applied.
func (c *Cache) Options() Options { return c.opts }

func checkBackend(op string, b Streams) error {
	if b == nil {
		return fmt.Errorf("streamcache: %s with a nil backend: %w", op, gpu.ErrInvalidValue)
	}
	if !reflect.TypeOf(b).Comparable() {
		// A map key of this type would panic; the backend's identity must
		// be comparable to key streams by it.
		return fmt.Errorf("streamcache: %s: backend type %T is not comparable: %w", op, b, gpu.ErrInvalidValue)
	}
	return nil
}

// Get returns an idle, healthy stream for k: a cached one when there is one
// (a hit), else a new one (a miss). The caller owns it until Put.
func (c *Cache) Get(b Streams, k Key) (gpu.Stream, error) {
	if err := checkBackend("Get", b); err != nil {
		return 0, err
	}
	fk := fullKey{b, k}
	for {
		c.mu.Lock()
		list := c.mu.idle[fk]
		if len(list) == 0 {
			c.mu.stats.Misses++
			c.mu.Unlock()
			break
		}
		s := list[len(list)-1]
		list[len(list)-1] = 0
		c.setIdleLocked(fk, list[:len(list)-1])
		c.mu.Unlock()

		idle, qerr := query(b, s)
		if qerr == nil && idle {
			c.mu.Lock()
			c.mu.stats.Hits++
			c.mu.Unlock()
			return s, nil
		}
		// Failed (or, against the cache's own rule, busy) while cached.
		derr := b.StreamDestroy(s)
		c.mu.Lock()
		c.countDiscardLocked(&c.mu.stats.DiscardedFailed, derr)
		if derr != nil {
			c.mu.deferred[b] = append(c.mu.deferred[b], fmt.Errorf(
				"streamcache: destroy stream %#x (device %d) that failed its check on Get (%v): %w",
				uint64(s), k.Device, qerr, derr))
		}
		c.mu.Unlock()
	}
	s, err := b.StreamCreate(k.Device, k.Flags, k.Priority)
	if err != nil {
		return 0, fmt.Errorf("streamcache: create stream on device %d (flags %d, priority %d): %w",
			k.Device, k.Flags, k.Priority, err)
	}
	return s, nil
}

// Put gives s, obtained from Get with the same b and k, back to the cache.
// reported is the first error the caller saw on s (nil if none); a stream
// with an error is destroyed, never cached. Put also destroys s when a query
// fails or finds it busy, or when the key is full. The error returned is the
// failed query's (the caller had not seen it) and any destroy error;
// reported itself is not repeated.
func (c *Cache) Put(b Streams, k Key, s gpu.Stream, reported error) error {
	if err := checkBackend("Put", b); err != nil {
		return err
	}
	if s == 0 {
		return fmt.Errorf("streamcache: Put of stream 0: %w", gpu.ErrInvalidHandle)
	}
	if reported != nil {
		return c.discard(b, k, s, "reported failed", &c.mu.stats.DiscardedFailed)
	}
	idle, qerr := query(b, s)
	if qerr != nil {
		return errors.Join(
			fmt.Errorf("streamcache: stream %#x (device %d) failed its check on Put, destroyed: %w", uint64(s), k.Device, qerr),
			c.discard(b, k, s, "failed", &c.mu.stats.DiscardedFailed))
	}
	if !idle {
		return c.discard(b, k, s, "busy", &c.mu.stats.DiscardedBusy)
	}
	fk := fullKey{b, k}
	c.mu.Lock()
	if list := c.mu.idle[fk]; c.opts.MaxIdlePerKey > 0 && len(list) < c.opts.MaxIdlePerKey {
		c.setIdleLocked(fk, append(list, s))
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	return c.discard(b, k, s, "over the per-key limit", &c.mu.stats.DiscardedFull)
}

// query asks whether s is idle. A backend may report a busy stream as
// gpu.ErrNotReady rather than idle == false; that is no failure.
func query(b Streams, s gpu.Stream) (idle bool, err error) {
	idle, err = b.StreamQuery(s)
	if errors.Is(err, gpu.ErrNotReady) {
		return false, nil
	}
	return idle, err
}

// discard destroys s and counts it under reason. counter points into
// c.mu.stats and is only touched under the lock.
func (c *Cache) discard(b Streams, k Key, s gpu.Stream, why string, counter *uint64) error {
	derr := b.StreamDestroy(s)
	c.mu.Lock()
	c.countDiscardLocked(counter, derr)
	c.mu.Unlock()
	if derr != nil {
		return fmt.Errorf("streamcache: destroy %s stream %#x (device %d): %w", why, uint64(s), k.Device, derr)
	}
	return nil
}

func (c *Cache) countDiscardLocked(counter *uint64, destroyErr error) {
	*counter++
	c.mu.stats.Discards++
	if destroyErr != nil {
		c.mu.stats.DestroyErrors++
	}
}

func (c *Cache) setIdleLocked(fk fullKey, list []gpu.Stream) {
	c.mu.stats.Idle += len(list) - len(c.mu.idle[fk])
	if len(list) == 0 {
		// Forget empty keys so that closed backends do not pin memory.
		delete(c.mu.idle, fk)
		return
	}
	c.mu.idle[fk] = list
}

// Purge destroys every idle stream of b and returns the errors of those
// destructions together with the destroy errors deferred by Get for b. Call
// it before closing b: a backend closed with cached streams reports them as
// leaked. Streams on loan are unaffected.
func (c *Cache) Purge(b Streams) error {
	if err := checkBackend("Purge", b); err != nil {
		return err
	}
	return c.purge(func(x Streams) bool { return x == b })
}

// PurgeAll destroys every idle stream of every backend.
func (c *Cache) PurgeAll() error {
	return c.purge(func(Streams) bool { return true })
}

func (c *Cache) purge(match func(Streams) bool) error {
	type victim struct {
		fk fullKey
		s  gpu.Stream
	}
	var victims []victim
	var errs []error
	c.mu.Lock()
	for fk, list := range c.mu.idle {
		if !match(fk.b) {
			continue
		}
		for _, s := range list {
			victims = append(victims, victim{fk, s})
		}
		c.setIdleLocked(fk, nil)
	}
	for b, deferred := range c.mu.deferred {
		if match(b) {
			errs = append(errs, deferred...)
			delete(c.mu.deferred, b)
		}
	}
	c.mu.Unlock()
	for _, v := range victims {
		errs = append(errs, c.discard(v.fk.b, v.fk.Key, v.s, "purged", &c.mu.stats.DiscardedPurged))
	}
	return errors.Join(errs...)
}

// Stats returns a snapshot of the cache's counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.stats
}
