package gputest

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

var devicesTests = []test{
	{name: "Count", run: testDeviceCount},
	{name: "Props", run: testDeviceProps},
	{name: "BadOrdinal", run: testBadOrdinal},
}

func testDeviceCount(h *h) {
	n := h.b.DeviceCount()
	if n < 1 {
		h.Fatalf("DeviceCount = %d, want >= 1", n)
	}
	if h.b.Name() == "" {
		h.Errorf("Name() is empty")
	}
	h.Logf("backend %q: %d devices", h.b.Name(), n)
}

func testDeviceProps(h *h) {
	for dev := range h.b.DeviceCount() {
		p := h.props(dev)
		h.Logf("%v", p)
		if p.Ordinal != dev {
			h.Errorf("device %d: Ordinal = %d", dev, p.Ordinal)
		}
		if p.Name == "" {
			h.Errorf("device %d: empty Name", dev)
		}
		if p.TotalMemory == 0 {
			h.Errorf("device %d: TotalMemory = 0", dev)
		}
		if p.ComputeMajor < 1 || p.ComputeMinor < 0 {
			h.Errorf("device %d: compute capability %d.%d", dev, p.ComputeMajor, p.ComputeMinor)
		}
		switch {
		case p.VMM && (p.Granularity == 0 || bits.OnesCount64(p.Granularity) != 1):
			h.Errorf("device %d: VMM with granularity %d, want a power of two > 0", dev, p.Granularity)
		case !p.VMM && p.Granularity != 0:
			h.Errorf("device %d: no VMM but granularity %d, want 0", dev, p.Granularity)
		}
		free, total, err := h.b.MemGetInfo(dev)
		h.ok("MemGetInfo", err)
		if total != p.TotalMemory || free > total {
			h.Errorf("device %d: MemGetInfo free %d total %d; DeviceProps.TotalMemory %d", dev, free, total, p.TotalMemory)
		}
		vm, gran, err := h.vmOf(dev)
		switch {
		case p.VMM && (err != nil || gran != p.Granularity):
			h.Errorf("device %d: VirtualMemoryOf = %d, %v; props say VMM with granularity %d", dev, gran, err, p.Granularity)
		case !p.VMM && !errors.Is(err, gpu.ErrNotSupported):
			h.Errorf("device %d: VirtualMemoryOf without VMM: %v, want ErrNotSupported", dev, err)
		}
		if p.VMM && vm != nil {
			g, err := vm.AllocationGranularity(dev)
			if err != nil || g != p.Granularity {
				h.Errorf("device %d: AllocationGranularity = %d, %v; want %d", dev, g, err, p.Granularity)
			}
		}
		_, err = h.memOpsOf(dev)
		switch {
		case p.StreamMemOps && err != nil:
			h.Errorf("device %d: StreamMemOpsOf = %v; props say stream memory operations", dev, err)
		case !p.StreamMemOps && !errors.Is(err, gpu.ErrNotSupported):
			h.Errorf("device %d: StreamMemOpsOf without stream memory operations: %v, want ErrNotSupported", dev, err)
		}
	}
}

// testBadOrdinal calls every method that takes a device ordinal with -1 and
// DeviceCount: each fails with ErrInvalidValue and creates nothing.
func testBadOrdinal(h *h) {
	before, _ := h.counters()
	for _, dev := range []int{-1, h.b.DeviceCount(), 1 << 20} {
		at := func(op string) string { return fmt.Sprintf("%s(device %d)", op, dev) }
		_, err := h.b.DeviceProps(dev)
		h.wantErr(at("DeviceProps"), err, gpu.ErrInvalidValue)
		s, err := h.b.StreamCreate(dev, gpu.StreamDefault, 0)
		if h.wantErr(at("StreamCreate"), err, gpu.ErrInvalidValue) && s != 0 {
			h.Errorf("%s returned handle %#x with its error", at("StreamCreate"), uint64(s))
		}
		_, _, err = h.b.StreamPriorityRange(dev)
		h.wantErr(at("StreamPriorityRange"), err, gpu.ErrInvalidValue)
		_, err = h.b.EventCreate(dev, gpu.EventDefault)
		h.wantErr(at("EventCreate"), err, gpu.ErrInvalidValue)
		_, err = h.b.MemAlloc(dev, 256)
		h.wantErr(at("MemAlloc"), err, gpu.ErrInvalidValue)
		_, _, err = h.b.MemGetInfo(dev)
		h.wantErr(at("MemGetInfo"), err, gpu.ErrInvalidValue)
		if vm, _, err := h.vmOf(0); err == nil {
			_, err = vm.AllocationGranularity(dev)
			h.wantErr(at("AllocationGranularity"), err, gpu.ErrInvalidValue, gpu.ErrNotSupported)
			_, err = vm.MemCreate(dev, 2<<20)
			h.wantErr(at("MemCreate"), err, gpu.ErrInvalidValue, gpu.ErrNotSupported)
		}
		if mo, err := h.memOpsOf(0); err == nil {
			h.wantErr(at("StreamMemOpsSupported"), mo.StreamMemOpsSupported(dev), gpu.ErrInvalidValue)
		}
		_, err = h.b.ModuleLoad(dev, kernels.Module())
		h.wantErr(at("ModuleLoad"), err, gpu.ErrInvalidValue, gpu.ErrNotSupported)
		_, err = h.b.GraphCreate(dev)
		h.wantErr(at("GraphCreate"), err, gpu.ErrInvalidValue)
		_, _, err = gpu.VirtualMemoryOf(h.raw, dev)
		h.wantErr(at("VirtualMemoryOf"), err, gpu.ErrInvalidValue)
		_, err = gpu.StreamMemOpsOf(h.raw, dev)
		h.wantErr(at("StreamMemOpsOf"), err, gpu.ErrInvalidValue)
	}
	h.wantCounters("after calls with bad ordinals", before, nil)
}
