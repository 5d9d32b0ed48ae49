package gpu_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// ranger is a backend whose only working method is AddressRange: one
// allocation [0x1000, 0x1100), and err for every other address.
type ranger struct {
	gpu.Backend
	err error
}

func (r ranger) AddressRange(p gpu.DevicePtr) (gpu.DevicePtr, uint64, error) {
	if p >= 0x1000 && p < 0x1100 {
		return 0x1000, 0x100, nil
	}
	return 0, 0, r.err
}

func TestCheckBinding(t *testing.T) {
	notFound := gpu.Errorf("AddressRange", gpu.ErrNotFound, "freed")
	unknown := gpu.Errorf("AddressRange", gpu.ErrNotSupported, "virtual memory of another library")
	broken := gpu.Errorf("AddressRange", gpu.ErrDeviceLost, "driver gone")
	for _, c := range []struct {
		what string
		b    gpu.Backend
		p    gpu.DevicePtr
		size uint64
		want error // nil, gpu.ErrOutOfBounds or another sentinel
	}{
		{"inside", ranger{err: notFound}, 0x1080, 0x80, nil},
		{"whole", ranger{err: notFound}, 0x1000, 0x100, nil},
		{"one byte past", ranger{err: notFound}, 0x1080, 0x81, gpu.ErrOutOfBounds},
		{"overflowing size", ranger{err: notFound}, 0x1080, ^uint64(0), gpu.ErrOutOfBounds},
		{"in no allocation", ranger{err: notFound}, 0x2000, 8, gpu.ErrOutOfBounds},
		{"zero bytes in no allocation", ranger{err: notFound}, 0x2000, 0, nil},
		{"unknown extent", ranger{err: unknown}, 0x2000, 8, nil},
		{"failing backend", ranger{err: broken}, 0x2000, 8, gpu.ErrDeviceLost},
		{"backend without extents", struct{ gpu.Backend }{}, 0x2000, 8, nil},
	} {
		err := gpu.CheckBinding(c.b, c.p, c.size)
		if c.want == nil {
			if err != nil {
				t.Errorf("%s: %v, want nil", c.what, err)
			}
			continue
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want an error wrapping %v", c.what, err, c.want)
			continue
		}
		var ee *gpu.ExtentError
		if c.want == gpu.ErrOutOfBounds && (!errors.As(err, &ee) || ee.Ptr != c.p || ee.Size != c.size) {
			t.Errorf("%s: %v, want an *ExtentError for [%#x, +%d)", c.what, err, uint64(c.p), c.size)
		}
	}
	err := gpu.CheckBinding(ranger{err: notFound}, 0x1080, 0x90)
	for _, s := range []string{"0x1080", "+144", "[0x1000, +256)", "128 bytes are left"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%q does not say %q", err, s)
		}
	}
	err = gpu.CheckBinding(ranger{err: notFound}, 0x2000, 8)
	if !strings.Contains(err.Error(), "in no live allocation") || !strings.Contains(err.Error(), "freed") {
		t.Errorf("%q does not say the range is in no allocation, and why", err)
	}
}
