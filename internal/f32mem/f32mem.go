// Package f32mem moves float32 arrays between device memory (gpu.Memory)
// and host buffers for the Go kernel references: the sim's GEMM library
// and the built-in kernels' references in package kernels.
//
// gpu.ReadF32 copies the bytes and then decodes them into a new slice:
// two copies and two fresh allocations per read. For a decode step that
// reads hundreds of megabytes of weights and caches, that was most of the
// step: memory new from the OS costs a page fault per page, more than the
// arithmetic done on it. Here a read lands in the float32 values' own
// memory (on a little-endian host, where a float32 is laid out as device
// memory lays it out; elsewhere it decodes), into buffers kept in pools by
// power-of-two capacity, so that a step's reads reuse the last step's
// memory. The GC frees pooled buffers when nothing uses them.
package f32mem

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync"
	"unsafe"

	"github.com/stablegraph/stablegraph/gpu"
)

// native is whether this host lays out a float32 as device memory does
// (little-endian).
var native = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// pools[c] holds buffers of capacity 1<<c.
var pools [bits.UintSize]sync.Pool

// Buf is a pooled buffer of float32s.
type Buf struct {
	// V holds the values.
	V []float32
}

// Get returns a buffer of n float32s (n ≥ 0) with unspecified contents.
func Get(n int) *Buf {
	c := bits.Len(uint(max(n, 1) - 1))
	if b, ok := pools[c].Get().(*Buf); ok {
		b.V = b.V[:n]
		return b
	}
	return &Buf{V: make([]float32, n, 1<<c)}
}

// Put returns b to its pool; neither b nor b.V may be used after. Put of
// nil does nothing.
func (b *Buf) Put() {
	if b == nil {
		return
	}
	pools[bits.Len(uint(cap(b.V)-1))].Put(b)
}

// Read reads n float32 values at p into a buffer from the pool, as
// gpu.ReadF32 reads them; the caller puts it back.
func Read(mem gpu.Memory, p gpu.DevicePtr, n int) (*Buf, error) {
	if n < 0 {
		return nil, fmt.Errorf("read of %d float32 values: %w", n, gpu.ErrInvalidValue)
	}
	b := Get(n)
	if err := ReadInto(mem, p, b.V); err != nil {
		b.Put()
		return nil, err
	}
	return b, nil
}

// ReadInto reads len(dst) float32 values at p into dst.
func ReadInto(mem gpu.Memory, p gpu.DevicePtr, dst []float32) error {
	if native {
		return mem.Read(p, bytesOf(dst))
	}
	v, err := gpu.ReadF32(mem, p, len(dst))
	if err != nil {
		return err
	}
	copy(dst, v)
	return nil
}

// Write writes v at p, as gpu.WriteF32 does.
func Write(mem gpu.Memory, p gpu.DevicePtr, v []float32) error {
	if native {
		return mem.Write(p, bytesOf(v))
	}
	return gpu.WriteF32(mem, p, v)
}

// bytesOf is v's memory as bytes.
func bytesOf(v []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
}
