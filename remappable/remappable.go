// Package remappable allocates device buffers whose physical memory is
// known, so that another address range can map that memory too: every
// buffer is its own VMM allocation (vmm.Allocate: a physical chunk of the
// size asked for rounded up to the granularity, an address range of its
// own, the chunk mapped there, access for the device and the peers
// given), and Chunk tells the chunk behind any address inside a live
// buffer, and where in it the address lies.
//
// It is the caller memory of the remap strategy (package replay,
// remap.go), which keeps the addresses of a recorded graph fixed and maps
// the physical memory behind the caller's buffers into them every step:
// the caller allocates its params and outputs here and hands the
// Allocator to the executable as stablegraph.Options.Remap.Memory, which is
// how the strategy finds the chunk behind a bound address (Chunk
// implements replay.ChunkFinder). Memory from anywhere else (MemAlloc, a
// bfc region) has no chunk the strategy can map, and remap refuses it.
//
// # Cost
//
// Every Alloc and Free is a round of driver calls (create, reserve, map,
// set access; unmap, free, release: docs/GPU-MACHINE.md prices each), and
// every buffer takes at least one granule (2 MiB on CUDA and on the sim)
// however small. That is the price of a buffer
// that can be remapped; a caching allocator (package bfc) hands out
// buffers far cheaper, but from one allocation whose chunk backs every
// buffer in it.
//
// # Lifetime
//
// Free unmaps a buffer and releases its chunk; a chunk that a remap range
// still maps stays alive (and charged) until that range is unmapped, as in
// CUDA, so the memory of a freed buffer outlives it until the executable
// remaps the range or closes. Close frees every buffer still allocated.
// Every method is safe for concurrent use.
package remappable

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/vmm"
)

// Allocator hands out buffers, each its own VMM allocation on one device.
type Allocator struct {
	drv   vmm.Driver
	dev   int
	peers []int
	gran  uint64

	mu struct {
		sync.Mutex
		bufs   []*vmm.Allocation // live buffers, sorted by address
		bytes  uint64            // their sizes, rounded
		closed bool
	}
}

// New returns an allocator of buffers on dev, each accessible from dev and
// from every device in peers. A device without virtual memory management
// gives an error wrapping gpu.ErrNotSupported; nothing is allocated until
// Alloc.
func New(drv vmm.Driver, dev int, peers []int) (*Allocator, error) {
	_, gran, err := gpu.VirtualMemoryOf(drv, dev)
	if err != nil {
		return nil, fmt.Errorf("remappable: device %d: %w", dev, err)
	}
	n := drv.DeviceCount()
	for _, p := range peers {
		if p < 0 || p >= n {
			return nil, fmt.Errorf("remappable: peer %d is not a device (have %d): %w", p, n, gpu.ErrInvalidValue)
		}
	}
	return &Allocator{drv: drv, dev: dev, peers: slices.Clone(peers), gran: gran}, nil
}

// Device is the device the buffers live on.
func (a *Allocator) Device() int { return a.dev }

// Granularity is the device's allocation granularity: every buffer starts
// on a multiple of it and spans a whole number of them.
func (a *Allocator) Granularity() uint64 { return a.gran }

// Alloc allocates a buffer of at least size bytes (rounded up to the
// granularity) and returns its address. On error nothing is left
// allocated (vmm.Allocate undoes its steps).
func (a *Allocator) Alloc(size uint64) (gpu.DevicePtr, error) {
	a.mu.Lock()
	closed := a.mu.closed
	a.mu.Unlock()
	if closed {
		return 0, fmt.Errorf("remappable: alloc %d bytes: allocator closed: %w", size, gpu.ErrIllegalState)
	}
	// The driver calls run without the lock: they are slow, and the
	// buffers of other goroutines need it for Chunk meanwhile.
	m, err := vmm.Allocate(a.drv, a.dev, size, a.peers)
	if err != nil {
		return 0, fmt.Errorf("remappable: alloc %d bytes: %w", size, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mu.closed {
		// Closed while the driver worked: give the buffer back.
		return 0, errors.Join(fmt.Errorf("remappable: alloc %d bytes: allocator closed: %w", size, gpu.ErrIllegalState), m.Close())
	}
	i, _ := slices.BinarySearchFunc(a.mu.bufs, m.Ptr(), func(b *vmm.Allocation, p gpu.DevicePtr) int {
		return cmpPtr(b.Ptr(), p)
	})
	a.mu.bufs = slices.Insert(a.mu.bufs, i, m)
	a.mu.bytes += m.Size()
	return m.Ptr(), nil
}

func cmpPtr(a, b gpu.DevicePtr) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// find returns the index of the live buffer holding p, or -1.
func (a *Allocator) findLocked(p gpu.DevicePtr) int {
	// The first buffer starting after p; the one before it may hold p.
	i, _ := slices.BinarySearchFunc(a.mu.bufs, p, func(b *vmm.Allocation, p gpu.DevicePtr) int {
		if b.Ptr() <= p {
			return -1
		}
		return 1
	})
	if i == 0 {
		return -1
	}
	b := a.mu.bufs[i-1]
	if uint64(p-b.Ptr()) >= b.Size() {
		return -1
	}
	return i - 1
}

// Free frees the buffer that starts at p: it unmaps it and releases its
// chunk (which lives on while a remap range maps it). An address that is
// not the start of a live buffer is gpu.ErrInvalidValue. If the driver
// fails, the buffer stays allocated and Free may be called again.
func (a *Allocator) Free(p gpu.DevicePtr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	i := a.findLocked(p)
	if i < 0 || a.mu.bufs[i].Ptr() != p {
		return fmt.Errorf("remappable: free %#x: not the start of a live buffer: %w", uint64(p), gpu.ErrInvalidValue)
	}
	m := a.mu.bufs[i]
	if err := m.Close(); err != nil {
		return fmt.Errorf("remappable: free %#x: %w", uint64(p), err)
	}
	a.mu.bufs = slices.Delete(a.mu.bufs, i, i+1)
	a.mu.bytes -= m.Size()
	return nil
}

// Chunk returns the physical chunk behind p, which may lie anywhere in a
// live buffer, and p's offset in it; the chunk backs the whole buffer, so
// its bytes from the offset on are the buffer's from p on. An address in
// no live buffer of this allocator is an error wrapping gpu.ErrNotFound.
// It implements replay.ChunkFinder.
func (a *Allocator) Chunk(p gpu.DevicePtr) (*vmm.PhysicalAllocation, uint64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	i := a.findLocked(p)
	if i < 0 {
		return nil, 0, fmt.Errorf("remappable: %#x is in no live buffer of the allocator on device %d: %w", uint64(p), a.dev, gpu.ErrNotFound)
	}
	b := a.mu.bufs[i]
	return b.Chunk(), uint64(p - b.Ptr()), nil
}

// Stats are an allocator's live buffers.
type Stats struct {
	Buffers int
	// Bytes is their size, each rounded up to the granularity: the device
	// memory they hold.
	Bytes uint64
}

// Stats returns the live buffers.
func (a *Allocator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Stats{Buffers: len(a.mu.bufs), Bytes: a.mu.bytes}
}

// Close frees every buffer still allocated and refuses later Allocs. It
// tries every buffer and returns every failure joined; the buffers it
// could not free stay, and Close may be called again to retry them.
func (a *Allocator) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.mu.closed = true
	var errs []error
	kept := a.mu.bufs[:0]
	for _, m := range a.mu.bufs {
		if err := m.Close(); err != nil {
			errs = append(errs, err)
			kept = append(kept, m)
			continue
		}
		a.mu.bytes -= m.Size()
	}
	clear(a.mu.bufs[len(kept):])
	a.mu.bufs = kept
	if len(errs) > 0 {
		return fmt.Errorf("remappable: close: %w", errors.Join(errs...))
	}
	return nil
}
