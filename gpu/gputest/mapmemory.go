package gputest

import (
	"fmt"
	"sort"

	"github.com/stablegraph/stablegraph/gpu"
)

// MapMemory is a gpu.Memory kept in host buffers at made-up device
// addresses, for running a kernel's Go reference (gpu.KernelSpec.Ref) outside
// any backend. An access that does not lie wholly inside one buffer fails
// with a *gpu.FaultError, as a backend's would. It is not safe for concurrent
// use.
type MapMemory struct {
	bufs map[gpu.DevicePtr][]byte
	next gpu.DevicePtr
}

// mapMemoryBase is the first made-up address: far from zero, so that a null
// or small pointer faults.
const mapMemoryBase = gpu.DevicePtr(1 << 40)

// NewMapMemory returns an empty MapMemory.
func NewMapMemory() *MapMemory {
	return &MapMemory{bufs: map[gpu.DevicePtr][]byte{}, next: mapMemoryBase}
}

// Alloc stores a copy of b and returns its address. Buffers are 256-byte
// aligned, with an unmapped gap after each so an overrun faults.
func (m *MapMemory) Alloc(b []byte) gpu.DevicePtr {
	p := m.next
	m.bufs[p] = append(make([]byte, 0, len(b)), b...)
	m.next = p.Add(gpu.RoundUp(uint64(len(b)), 256) + 4096)
	return p
}

// Bytes returns the buffer that Alloc placed at p (not a copy), or nil.
func (m *MapMemory) Bytes(p gpu.DevicePtr) []byte { return m.bufs[p] }

func (m *MapMemory) find(p gpu.DevicePtr, n int, write bool) ([]byte, error) {
	bases := make([]gpu.DevicePtr, 0, len(m.bufs))
	for base := range m.bufs {
		bases = append(bases, base)
	}
	sort.Slice(bases, func(i, j int) bool { return bases[i] < bases[j] })
	i := sort.Search(len(bases), func(i int) bool { return bases[i] > p }) - 1
	if i >= 0 {
		buf := m.bufs[bases[i]]
		off := uint64(p - bases[i])
		if off+uint64(n) <= uint64(len(buf)) {
			return buf[off : off+uint64(n)], nil
		}
	}
	return nil, &gpu.FaultError{Kernel: "MapMemory", Addr: p, Size: uint64(n), Write: write,
		Reason: fmt.Sprintf("not inside one of %d buffers", len(m.bufs))}
}

// Read implements gpu.Memory.
func (m *MapMemory) Read(p gpu.DevicePtr, dst []byte) error {
	b, err := m.find(p, len(dst), false)
	if err != nil {
		return err
	}
	copy(dst, b)
	return nil
}

// Write implements gpu.Memory.
func (m *MapMemory) Write(p gpu.DevicePtr, src []byte) error {
	b, err := m.find(p, len(src), true)
	if err != nil {
		return err
	}
	copy(b, src)
	return nil
}
