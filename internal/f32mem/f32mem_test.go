package f32mem

import (
	"errors"
	"math"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// flat is device memory as one byte slice at base, faulting outside it.
type flat struct {
	base gpu.DevicePtr
	b    []byte
}

var errOutside = errors.New("outside")

func (f *flat) span(p gpu.DevicePtr, n int) ([]byte, error) {
	if p < f.base || uint64(p-f.base)+uint64(n) > uint64(len(f.b)) {
		return nil, errOutside
	}
	return f.b[p-f.base : uint64(p-f.base)+uint64(n)], nil
}

func (f *flat) Read(p gpu.DevicePtr, dst []byte) error {
	s, err := f.span(p, len(dst))
	copy(dst, s)
	return err
}

func (f *flat) Write(p gpu.DevicePtr, src []byte) error {
	s, err := f.span(p, len(src))
	copy(s, src)
	return err
}

// TestReadWrite: values read and written through a buffer are those
// gpu.ReadF32 and gpu.WriteF32 read and write, bit for bit (NaN payloads,
// negative zero, subnormals included), and a failed read gives the
// memory's error.
func TestReadWrite(t *testing.T) {
	vals := []float32{1, -0, float32(math.Inf(-1)), math.Float32frombits(0x7fc00123), math.Float32frombits(1), 3.25e38, -7}
	mem := &flat{base: 0x1000, b: make([]byte, 4*len(vals)+8)}
	if err := Write(mem, 0x1004, vals); err != nil {
		t.Fatal(err)
	}
	want, err := gpu.ReadF32(mem, 0x1004, len(vals))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Read(mem, 0x1004, len(vals))
	if err != nil {
		t.Fatal(err)
	}
	defer got.Put()
	for i := range vals {
		if math.Float32bits(got.V[i]) != math.Float32bits(vals[i]) || math.Float32bits(want[i]) != math.Float32bits(vals[i]) {
			t.Fatalf("value %d: read back %#x through Read, %#x through gpu.ReadF32, wrote %#x",
				i, math.Float32bits(got.V[i]), math.Float32bits(want[i]), math.Float32bits(vals[i]))
		}
	}
	if _, err := Read(mem, 0x1010, len(vals)); !errors.Is(err, errOutside) {
		t.Fatalf("a read past the memory: %v, want the memory's error", err)
	}
	if _, err := Read(mem, 0x1000, -1); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Fatalf("a read of -1 values: %v, want ErrInvalidValue", err)
	}
}

// TestGetPoolsByCapacity: a buffer comes back with the length asked for,
// from a pool whose capacity is the next power of two, and a buffer put
// back serves the next request of its class.
func TestGetPoolsByCapacity(t *testing.T) {
	for _, n := range []int{0, 1, 3, 4, 5, 1000, 1 << 20} {
		b := Get(n)
		c := cap(b.V)
		if len(b.V) != n || c < max(n, 1) || c&(c-1) != 0 || (n > 1 && c >= 2*n) {
			t.Fatalf("Get(%d): length %d, capacity %d; want length %d in the next power of two", n, len(b.V), c, n)
		}
		b.Put()
	}
	var nilBuf *Buf
	nilBuf.Put() // does nothing
}
