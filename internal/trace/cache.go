package trace

import (
	"fmt"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
)

// DefaultCacheSize is the number of traces a Command keeps when no capacity
// is given: enough for ping-pong buffers and a few more address sets, small
// enough that the captured graphs stay cheap to hold.
const DefaultCacheSize = 16

// GraphDestroyer destroys graphs; the cache calls it for the traces it
// evicts. gpu.Backend implements it.
type GraphDestroyer interface {
	GraphDestroy(g gpu.Graph) error
}

// Cache is an LRU cache of traces keyed by the device addresses of a
// command's operands, in operand order. It owns the graphs put into it and
// destroys them on eviction and Clear; a graph returned by Get is borrowed
// and stays valid until the next Put or Clear.
//
// Lookups hash the key and compare it in full, so they allocate nothing;
// Put copies the key. A Cache is not safe for concurrent use.
type Cache struct {
	gd       GraphDestroyer
	capacity int
	byHash   map[uint64]*entry
	// head is the most recently used entry, tail the least; the list holds
	// every entry.
	head, tail *entry
	n          int
}

type entry struct {
	key        []gpu.DevicePtr
	hash       uint64
	g          gpu.Graph
	prev, next *entry // LRU order
	chain      *entry // next entry with the same hash
}

// NewCache returns an empty cache holding at most capacity traces
// (DefaultCacheSize when capacity <= 0) whose graphs gd destroys.
func NewCache(gd GraphDestroyer, capacity int) *Cache {
	if capacity <= 0 {
		capacity = DefaultCacheSize
	}
	return &Cache{gd: gd, capacity: capacity, byHash: make(map[uint64]*entry, capacity)}
}

// hashKey mixes the addresses with the 64-bit finaliser of splitmix64:
// device addresses differ mostly in middle bits, which a plain FNV over
// words would spread poorly.
func hashKey(key []gpu.DevicePtr) uint64 {
	h := uint64(len(key)) * 0x9e3779b97f4a7c15
	for _, p := range key {
		x := h ^ uint64(p)
		x ^= x >> 30
		x *= 0xbf58476d1ce4e5b9
		x ^= x >> 27
		x *= 0x94d049bb133111eb
		x ^= x >> 31
		h = x + 0x9e3779b97f4a7c15
	}
	return h
}

func (c *Cache) find(key []gpu.DevicePtr, h uint64) *entry {
	for e := c.byHash[h]; e != nil; e = e.chain {
		if slices.Equal(e.key, key) {
			return e
		}
	}
	return nil
}

// Get returns the trace stored for key and marks it most recently used.
func (c *Cache) Get(key []gpu.DevicePtr) (gpu.Graph, bool) {
	e := c.find(key, hashKey(key))
	if e == nil {
		return 0, false
	}
	c.moveToFront(e)
	return e.g, true
}

// Put stores g as the trace for key, taking ownership of it. A trace already
// stored for key is replaced and destroyed; when the cache is full the least
// recently used trace is evicted and destroyed. The error is that of the
// destruction; g is stored either way.
func (c *Cache) Put(key []gpu.DevicePtr, g gpu.Graph) error {
	h := hashKey(key)
	if e := c.find(key, h); e != nil {
		old := e.g
		e.g = g
		c.moveToFront(e)
		if old == g {
			return nil
		}
		return c.destroy(old)
	}
	var err error
	if c.n >= c.capacity {
		err = c.evict(c.tail)
	}
	e := &entry{key: slices.Clone(key), hash: h, g: g, chain: c.byHash[h]}
	c.byHash[h] = e
	c.pushFront(e)
	c.n++
	return err
}

// Len is the number of traces held.
func (c *Cache) Len() int { return c.n }

// Capacity is the most traces the cache holds.
func (c *Cache) Capacity() int { return c.capacity }

// Clear destroys every trace and empties the cache. Every graph is
// destroyed even when some destructions fail; the first error is returned.
func (c *Cache) Clear() error {
	var first error
	for c.tail != nil {
		if err := c.evict(c.tail); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (c *Cache) evict(e *entry) error {
	// Unlink from the hash chain.
	if c.byHash[e.hash] == e {
		if e.chain == nil {
			delete(c.byHash, e.hash)
		} else {
			c.byHash[e.hash] = e.chain
		}
	} else {
		for p := c.byHash[e.hash]; p != nil; p = p.chain {
			if p.chain == e {
				p.chain = e.chain
				break
			}
		}
	}
	c.unlink(e)
	c.n--
	return c.destroy(e.g)
}

func (c *Cache) destroy(g gpu.Graph) error {
	if err := c.gd.GraphDestroy(g); err != nil {
		return fmt.Errorf("trace cache: destroy evicted trace: %w", err)
	}
	return nil
}

func (c *Cache) pushFront(e *entry) {
	e.prev, e.next = nil, c.head
	if c.head != nil {
		c.head.prev = e
	}
	c.head = e
	if c.tail == nil {
		c.tail = e
	}
}

func (c *Cache) unlink(e *entry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		c.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		c.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (c *Cache) moveToFront(e *entry) {
	if c.head == e {
		return
	}
	c.unlink(e)
	c.pushFront(e)
}
