// Package devbuf holds typed device buffers: n values of a Go number type
// (float32, int32, ...) in one device's memory, with a shape. It is the
// small layer between Go slices and the device pointers that
// stablegraph.Bindings take, so that a program speaks in shapes and
// []float32 rather than byte counts and gpu.F32ToBytes:
//
//	x, err := devbuf.Upload(backend, 0, input, batch, width) // a new allocation, filled
//	y, err := devbuf.New[float32](backend, 0, batch, width)  // zeroed
//	_, err = exe.Run(ctx, stream, stablegraph.Bindings{xIn: x.Ptr(), yOut: y.Ptr()})
//	out, err := y.Read(stream) // after the step: ordered on its stream
//	err = errors.Join(x.Free(), y.Free())
//
// Values are stored little-endian, as every CUDA device and the sim store
// them. Each buffer is one MemAlloc, so a new buffer has a new address: the
// case stablegraph's strategies are built for.
//
// # Ordering
//
// New and Upload return once the memory holds its first contents. Read and
// Write take the stream whose work uses the buffer: the copy is enqueued on
// it, after that work, and they return once it is done. Free releases the
// memory at once: free a buffer only after the work that uses it is done
// (a Read on its stream waits for that).
//
// # Concurrency
//
// A Buffer is like a slice: safe for concurrent reads of its fields, not
// for a Free racing with other uses.
package devbuf

import (
	"encoding/binary"
	"fmt"

	"github.com/stablegraph/stablegraph/gpu"
)

// Elem is the element types a Buffer holds: fixed-size numbers.
type Elem interface {
	~int8 | ~uint8 | ~int16 | ~uint16 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~float32 | ~float64
}

// Memory is what a Buffer needs of a backend; every gpu.Backend has it.
type Memory interface {
	MemAlloc(dev int, size uint64) (gpu.DevicePtr, error)
	MemFree(p gpu.DevicePtr) error
	Memset(m gpu.Memset) error
	MemcpyHtoD(dst gpu.DevicePtr, src []byte) error
	MemcpyHtoDAsync(dst gpu.DevicePtr, src []byte, s gpu.Stream) error
	MemcpyDtoHAsync(dst []byte, src gpu.DevicePtr, s gpu.Stream) error
	StreamSynchronize(s gpu.Stream) error
}

// Buffer is n values of T in device memory, with a shape whose product is
// n. The zero Buffer is not usable; make one with New or Upload.
type Buffer[T Elem] struct {
	mem   Memory
	dev   int
	ptr   gpu.DevicePtr
	shape []int
	n     int
}

// New allocates a zeroed buffer of shape on device dev.
func New[T Elem](m Memory, dev int, shape ...int) (*Buffer[T], error) {
	b, err := alloc[T](m, dev, shape)
	if err != nil {
		return nil, err
	}
	if err := m.Memset(gpu.Memset{Dst: b.ptr, ElemSize: 1, Count: b.Size()}); err != nil {
		return nil, b.fail("zero", err)
	}
	return b, nil
}

// Upload allocates a buffer on device dev and copies data into it. Its
// shape is shape, whose product must be len(data), or [len(data)] when no
// shape is given.
func Upload[T Elem](m Memory, dev int, data []T, shape ...int) (*Buffer[T], error) {
	if len(shape) == 0 {
		shape = []int{len(data)}
	}
	b, err := alloc[T](m, dev, shape)
	if err != nil {
		return nil, err
	}
	if b.n != len(data) {
		return nil, b.fail("upload", fmt.Errorf("%d values for shape %v (%d): %w", len(data), shape, b.n, gpu.ErrInvalidValue))
	}
	raw, err := encode(data)
	if err == nil {
		err = m.MemcpyHtoD(b.ptr, raw)
	}
	if err != nil {
		return nil, b.fail("upload", err)
	}
	return b, nil
}

func alloc[T Elem](m Memory, dev int, shape []int) (*Buffer[T], error) {
	if len(shape) == 0 {
		return nil, fmt.Errorf("devbuf: no shape: %w", gpu.ErrInvalidValue)
	}
	n := 1
	for _, d := range shape {
		if d <= 0 {
			return nil, fmt.Errorf("devbuf: shape %v: dimensions must be positive: %w", shape, gpu.ErrInvalidValue)
		}
		if n > (1<<62)/d {
			return nil, fmt.Errorf("devbuf: shape %v: too large: %w", shape, gpu.ErrInvalidValue)
		}
		n *= d
	}
	b := &Buffer[T]{mem: m, dev: dev, shape: append([]int(nil), shape...), n: n}
	if uint64(n) > (1<<62)/b.elemSize() {
		return nil, fmt.Errorf("devbuf: shape %v: too large: %w", shape, gpu.ErrInvalidValue)
	}
	p, err := m.MemAlloc(dev, b.Size())
	if err != nil {
		return nil, fmt.Errorf("devbuf: allocate %v (%d bytes) on device %d: %w", shape, b.Size(), dev, err)
	}
	b.ptr = p
	return b, nil
}

// fail frees b after a failed first fill and returns the error with what
// was being done.
func (b *Buffer[T]) fail(what string, err error) error {
	err = fmt.Errorf("devbuf: %s %v on device %d: %w", what, b.shape, b.dev, err)
	if ferr := b.mem.MemFree(b.ptr); ferr != nil {
		err = fmt.Errorf("%w (and freeing it: %v)", err, ferr)
	}
	b.ptr = 0
	return err
}

// Ptr is the buffer's device address, for stablegraph.Bindings.
func (b *Buffer[T]) Ptr() gpu.DevicePtr { return b.ptr }

// Shape returns a copy of the buffer's shape.
func (b *Buffer[T]) Shape() []int { return append([]int(nil), b.shape...) }

// Len is the number of values.
func (b *Buffer[T]) Len() int { return b.n }

// Size is the number of bytes.
func (b *Buffer[T]) Size() uint64 { return uint64(b.n) * b.elemSize() }

func (b *Buffer[T]) elemSize() uint64 {
	var zero T
	return uint64(binary.Size(zero))
}

// Device is the device ordinal the buffer lives on.
func (b *Buffer[T]) Device() int { return b.dev }

// Read copies the buffer into a new slice: enqueued on s after the work
// already there, and waited for.
func (b *Buffer[T]) Read(s gpu.Stream) ([]T, error) {
	if err := b.live("read"); err != nil {
		return nil, err
	}
	raw := make([]byte, b.Size())
	if err := b.mem.MemcpyDtoHAsync(raw, b.ptr, s); err != nil {
		return nil, fmt.Errorf("devbuf: read %v: %w", b.shape, err)
	}
	if err := b.mem.StreamSynchronize(s); err != nil {
		return nil, fmt.Errorf("devbuf: read %v: %w", b.shape, err)
	}
	out := make([]T, b.n)
	if _, err := binary.Decode(raw, binary.LittleEndian, out); err != nil {
		return nil, fmt.Errorf("devbuf: read %v: %w", b.shape, err)
	}
	return out, nil
}

// Write copies data, Len values, into the buffer: enqueued on s after the
// work already there, and waited for.
func (b *Buffer[T]) Write(s gpu.Stream, data []T) error {
	if err := b.live("write"); err != nil {
		return err
	}
	if len(data) != b.n {
		return fmt.Errorf("devbuf: write %d values into %v (%d): %w", len(data), b.shape, b.n, gpu.ErrInvalidValue)
	}
	raw, err := encode(data)
	if err == nil {
		err = b.mem.MemcpyHtoDAsync(b.ptr, raw, s)
	}
	if err != nil {
		return fmt.Errorf("devbuf: write %v: %w", b.shape, err)
	}
	if err := b.mem.StreamSynchronize(s); err != nil {
		return fmt.Errorf("devbuf: write %v: %w", b.shape, err)
	}
	return nil
}

// Free releases the device memory. A freed buffer (a second Free
// included) gives an error wrapping gpu.ErrInvalidHandle.
func (b *Buffer[T]) Free() error {
	if err := b.live("free"); err != nil {
		return err
	}
	p := b.ptr
	b.ptr = 0
	if err := b.mem.MemFree(p); err != nil {
		return fmt.Errorf("devbuf: free %v: %w", b.shape, err)
	}
	return nil
}

func (b *Buffer[T]) live(what string) error {
	if b == nil || b.ptr == 0 {
		return fmt.Errorf("devbuf: %s: buffer freed or never allocated: %w", what, gpu.ErrInvalidHandle)
	}
	return nil
}

// encode returns data's values as little-endian bytes.
func encode[T Elem](data []T) ([]byte, error) {
	return binary.Append(make([]byte, 0, binary.Size(data)), binary.LittleEndian, data)
}
