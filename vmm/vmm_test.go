package vmm_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/vmm"
)

const gran = sim.Granularity

func TestAllocateRoundsAndCloses(t *testing.T) {
	b := simtest.New(t, 1)
	a, err := vmm.Allocate(b, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Size() != gran || a.Ptr() == 0 || uint64(a.Ptr())%gran != 0 || a.Device() != 0 {
		t.Errorf("Allocate(1): ptr %#x size %d device %d", uint64(a.Ptr()), a.Size(), a.Device())
	}
	simtest.WantLive(t, b, "after Allocate", gpu.HandleCounts{Chunks: 1, Reservations: 1, Mappings: 1})
	data := []byte("through vmm")
	if err := b.MemcpyHtoD(a.Ptr().Add(100), data); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if err := b.MemcpyDtoH(got, a.Ptr().Add(100)); err != nil || string(got) != string(data) {
		t.Fatalf("roundtrip: %q, %v", got, err)
	}
	a2, err := vmm.Allocate(b, 0, 3*gran-1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a2.Size() != 3*gran {
		t.Errorf("Allocate(3 granules - 1).Size() = %d", a2.Size())
	}
	for _, x := range []*vmm.Allocation{a, a2} {
		if err := x.Close(); err != nil {
			t.Fatal(err)
		}
	}
	simtest.WantZero(t, b, "after Close")
	if err := a.Close(); !errors.Is(err, gpu.ErrInvalidHandle) {
		t.Errorf("second Close: %v, want ErrInvalidHandle", err)
	}
}

func TestAllocateBadArguments(t *testing.T) {
	b := simtest.New(t, 2)
	for _, tc := range []struct {
		name  string
		dev   int
		size  uint64
		peers []int
		want  error
	}{
		{"zero size", 0, 0, nil, gpu.ErrInvalidValue},
		{"huge size", 0, 1<<64 - 1, nil, gpu.ErrInvalidValue},
		{"bad device", 2, gran, nil, gpu.ErrInvalidValue},
		{"bad peer", 0, gran, []int{1, 2}, gpu.ErrInvalidValue},
		{"negative peer", 0, gran, []int{-1}, gpu.ErrInvalidValue},
		{"too large for the device", 0, 2 << 30, nil, gpu.ErrOutOfMemory},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := vmm.Allocate(b, tc.dev, tc.size, tc.peers)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Allocate: %v, want %v", err, tc.want)
			}
			simtest.WantZero(t, b, "after a refused Allocate")
		})
	}
}

// hidden is the sim behind its gpu.Backend core alone: a backend without
// the optional virtual memory and stream memory operations.
type hidden struct{ gpu.Backend }

// devNoVMM is the sim with the optional interfaces, whose devices lack
// them: the per-device checks refuse.
type devNoVMM struct{ *sim.Backend }

func (d devNoVMM) AllocationGranularity(dev int) (uint64, error) {
	return 0, gpu.Errorf("AllocationGranularity", gpu.ErrNotSupported, "device %d has no VMM", dev)
}

func (d devNoVMM) StreamMemOpsSupported(dev int) error {
	return gpu.Errorf("StreamMemOpsSupported", gpu.ErrNotSupported, "device %d has no stream memory operations", dev)
}

// narrow is a Driver that is not a whole gpu.Backend: the capability
// look-ups must work from the narrow interfaces alone.
type narrow struct {
	gpu.Devices
	gpu.VirtualMemory
}

// narrowNoVMM is a narrow driver without virtual memory.
type narrowNoVMM struct{ vmm.Driver }

// narrowTimeline is a narrow timeline driver without stream memory
// operations.
type narrowTimeline struct{ vmm.TimelineDriver }

func TestCapabilities(t *testing.T) {
	b := simtest.New(t, 1)
	for name, drv := range map[string]vmm.Driver{"backend": hidden{b}, "device": devNoVMM{b}, "narrow": narrowNoVMM{b}} {
		if _, err := vmm.Allocate(drv, 0, gran, nil); !errors.Is(err, gpu.ErrNotSupported) {
			t.Errorf("%s: Allocate without VMM: %v, want ErrNotSupported", name, err)
		}
		if _, err := vmm.Reserve(drv, 0, gran, 0); !errors.Is(err, gpu.ErrNotSupported) {
			t.Errorf("%s: Reserve without VMM: %v, want ErrNotSupported", name, err)
		}
	}
	for name, drv := range map[string]vmm.TimelineDriver{"backend": hidden{b}, "device": devNoVMM{b}, "narrow": narrowTimeline{b}} {
		if _, err := vmm.NewTimeline(drv, 0); !errors.Is(err, gpu.ErrNotSupported) {
			t.Errorf("%s: NewTimeline without stream memory operations: %v, want ErrNotSupported", name, err)
		}
	}
	simtest.WantZero(t, b, "after refusals")
	a, err := vmm.Allocate(narrow{b, b}, 0, gran+1, nil)
	if err != nil {
		t.Fatalf("Allocate through a narrow driver: %v", err)
	}
	if a.Size() != 2*gran {
		t.Errorf("size %d, want %d", a.Size(), 2*gran)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestPrimitives walks the state table of doc.go one step at a time.
func TestPrimitives(t *testing.T) {
	b := simtest.New(t, 1)
	phys, err := vmm.Create(b, 0, gran+1) // None → Created
	if err != nil {
		t.Fatal(err)
	}
	if phys.Size() != 2*gran || phys.Handle() == 0 || phys.Device() != 0 {
		t.Fatalf("chunk: size %d handle %#x", phys.Size(), uint64(phys.Handle()))
	}
	res, err := vmm.Reserve(b, 0, 4*gran, 0) // None → Reserved
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vmm.Map(res, 3*gran, phys); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("Map past the end of the reservation: %v, want ErrInvalidValue", err)
	}
	m, err := vmm.Map(res, gran, phys) // Created+Reserved → Mapped
	if err != nil {
		t.Fatal(err)
	}
	if m.Ptr() != res.Ptr().Add(gran) || m.Size() != 2*gran {
		t.Errorf("mapping %#x+%d", uint64(m.Ptr()), m.Size())
	}
	simtest.WantLive(t, b, "mapped", gpu.HandleCounts{Chunks: 1, Reservations: 1, Mappings: 1})
	if err := res.Free(); err == nil {
		t.Fatal("Free of a reservation with a live mapping succeeded")
	}
	if err := m.SetAccess([]int{0}); err != nil { // Mapped → Accessible
		t.Fatal(err)
	}
	if got := m.Access(); len(got) != 1 || got[0] != 0 {
		t.Errorf("Access() = %v", got)
	}
	if err := m.Close(); err != nil { // → Created+Reserved
		t.Fatal(err)
	}
	if err := m.Close(); !errors.Is(err, gpu.ErrInvalidHandle) {
		t.Errorf("second unmap: %v, want ErrInvalidHandle", err)
	}
	if err := m.SetAccess([]int{0}); !errors.Is(err, gpu.ErrInvalidHandle) {
		t.Errorf("SetAccess after Close: %v, want ErrInvalidHandle", err)
	}
	if err := res.Free(); err != nil { // Reserved → None
		t.Fatal(err)
	}
	if _, err := vmm.Map(res, 0, phys); !errors.Is(err, gpu.ErrInvalidHandle) {
		t.Errorf("Map into a freed reservation: %v, want ErrInvalidHandle", err)
	}
	if err := phys.Release(); err != nil { // Created → None
		t.Fatal(err)
	}
	for name, err := range map[string]error{"Free": res.Free(), "Release": phys.Release()} {
		if !errors.Is(err, gpu.ErrInvalidHandle) {
			t.Errorf("second %s: %v, want ErrInvalidHandle", name, err)
		}
	}
	simtest.WantZero(t, b, "after walking back to None")
}

// scenario builds what a runtime builds at start-up: a timeline, an
// allocation with a peer, one without, and one made step by step, then
// releases it all. On any error it must release everything it made.
func scenario(b *sim.Backend) (err error) {
	tl, err := vmm.NewTimeline(b, 0)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, tl.Close()) }()
	for _, spec := range []struct {
		dev   int
		size  uint64
		peers []int
	}{{0, 3 * gran, []int{1}}, {1, gran, nil}} {
		a, err := vmm.Allocate(b, spec.dev, spec.size, spec.peers)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, a.Close()) }()
	}
	phys, err := vmm.Create(b, 1, gran)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, phys.Release()) }()
	res, err := vmm.Reserve(b, 1, 2*gran, 0)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, res.Free()) }()
	m, err := vmm.Map(res, gran, phys)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, m.Close()) }()
	return m.SetAccess([]int{1, 0})
}

// TestFaultSweep fails call N of each driver entry point the set-up path
// uses, for N = 0, 1, 2, ... until the scenario succeeds, and checks after
// each failure that the error is the injected one, names the step, and that
// no handle is left.
func TestFaultSweep(t *testing.T) {
	b := simtest.New(t, 2)
	boom := errors.New("boom")
	for _, op := range []string{"DeviceProps", "HostAlloc", "MemCreate", "MemAddressReserve", "MemMap", "MemSetAccess"} {
		t.Run(op, func(t *testing.T) {
			failures := 0
			for n := 0; ; n++ {
				if n > 100 {
					t.Fatalf("scenario still failing after %d injected faults", n)
				}
				b.InjectFault(op, n, boom)
				err := scenario(b)
				simtest.WantZero(t, b, fmt.Sprintf("%s call %d failed", op, n))
				if err == nil {
					b.ClearFaults()
					break
				}
				failures++
				if !errors.Is(err, gpu.ErrInjected) || !errors.Is(err, boom) {
					t.Fatalf("%s call %d: error %v does not wrap the injected fault", op, n, err)
				}
				if !strings.Contains(err.Error(), op) {
					t.Errorf("%s call %d: error %q does not name the step", op, n, err)
				}
				var ae *vmm.AllocateError
				if errors.As(err, &ae) {
					if ae.Step != op || ae.Cleanup != nil {
						t.Errorf("%s call %d: AllocateError step %q cleanup %v", op, n, ae.Step, ae.Cleanup)
					}
				}
			}
			if failures == 0 {
				t.Fatalf("no call of %s failed: the scenario does not use it", op)
			}
			t.Logf("%s: %d failing calls, each left nothing live", op, failures)
		})
	}
}

// TestCloseFaults fails each release step of Allocation.Close and Timeline
// Close: the error must name the step, the handles must stay owned, and a
// second Close must finish the job.
func TestCloseFaults(t *testing.T) {
	b := simtest.New(t, 1)
	boom := errors.New("boom")
	for _, op := range []string{"MemUnmap", "MemAddressFree", "MemRelease"} {
		t.Run(op, func(t *testing.T) {
			a, err := vmm.Allocate(b, 0, gran, nil)
			if err != nil {
				t.Fatal(err)
			}
			b.InjectFault(op, 0, boom)
			err = a.Close()
			if !errors.Is(err, boom) || !strings.Contains(err.Error(), op) {
				t.Fatalf("Close with %s failing: %v", op, err)
			}
			if b.LiveHandles().IsZero() {
				t.Fatalf("Close with %s failing left nothing: the failure was swallowed", op)
			}
			if err := a.Close(); err != nil {
				t.Fatalf("retried Close: %v", err)
			}
			simtest.WantZero(t, b, "after the retried Close")
		})
	}
	t.Run("HostFree", func(t *testing.T) {
		tl, err := vmm.NewTimeline(b, 0)
		if err != nil {
			t.Fatal(err)
		}
		b.InjectFault("HostFree", 0, boom)
		if err := tl.Close(); !errors.Is(err, boom) {
			t.Fatalf("timeline Close with HostFree failing: %v", err)
		}
		if err := tl.Close(); err != nil {
			t.Fatalf("retried timeline Close: %v", err)
		}
		if err := tl.Close(); !errors.Is(err, gpu.ErrInvalidHandle) {
			t.Fatalf("third timeline Close: %v, want ErrInvalidHandle", err)
		}
		simtest.WantZero(t, b, "after the retried Close")
	})
	t.Run("undo fails too", func(t *testing.T) {
		// MemMap fails, then the undo of the reservation fails: both
		// errors are reported, and the leak is visible. A backend of its
		// own, since the leaked reservation cannot be freed.
		b, err := sim.New(sim.Config{})
		if err != nil {
			t.Fatal(err)
		}
		b.InjectFault("MemMap", 0, boom)
		undo := errors.New("undo")
		b.InjectFault("MemAddressFree", 0, undo)
		_, err = vmm.Allocate(b, 0, gran, nil)
		var ae *vmm.AllocateError
		if !errors.As(err, &ae) || ae.Step != vmm.StepMap || !errors.Is(err, undo) || !errors.Is(err, boom) {
			t.Errorf("Allocate with MemMap and its undo failing: %v", err)
		}
		if c := b.LiveHandles(); c != (gpu.HandleCounts{Reservations: 1}) {
			t.Errorf("after a failed undo: %s, want the one reservation left", c)
		}
		if err := b.Close(); !errors.Is(err, gpu.ErrIllegalState) {
			t.Errorf("sim Close with a leaked reservation: %v", err)
		}
	})
}

// TestPeerAccess checks that Allocate grants access to the peers it is
// given, and only to them: a kernel on device 1 reads device 0's memory
// after Allocate with peers [1], and faults without.
func TestPeerAccess(t *testing.T) {
	b := simtest.New(t, 2)
	d1 := simtest.OpenDev(t, b, 1)
	const n = 1024
	y, err := vmm.Allocate(b, 1, 4*n, nil) // device 1's own output
	if err != nil {
		t.Fatal(err)
	}
	defer y.Close()

	shared, err := vmm.Allocate(b, 0, 4*n, []int{1})
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	if got := shared.Access(); len(got) != 2 || got[0] != 0 || got[1] != 1 {
		t.Errorf("Access() = %v, want [0 1]", got)
	}
	simtest.Upload(t, b, shared.Ptr(), simtest.Ramp(n, 1))
	d1.CopyF32(t, y.Ptr(), shared.Ptr(), n)
	if err := b.StreamSynchronize(d1.Stream); err != nil {
		t.Fatalf("device 1 reading memory shared with it: %v", err)
	}
	simtest.WantF32(t, "copied from the peer's memory", simtest.Download(t, b, y.Ptr(), n), simtest.Ramp(n, 1))

	private, err := vmm.Allocate(b, 0, 4*n, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer private.Close()
	d1.CopyF32(t, y.Ptr(), private.Ptr(), n)
	err = b.StreamSynchronize(d1.Stream)
	var fe *gpu.FaultError
	if !errors.Is(err, gpu.ErrIllegalAddress) || !errors.As(err, &fe) || fe.Device != 1 {
		t.Fatalf("device 1 reading device 0's private memory: %v, want a fault on device 1", err)
	}
	if err := b.ResetDevice(1); err != nil {
		t.Fatal(err)
	}

	d0 := simtest.OpenDev(t, b, 0)
	simtest.Upload(t, b, private.Ptr(), simtest.Ramp(n, 7))
	d0.CopyF32(t, shared.Ptr(), private.Ptr(), n)
	if err := b.StreamSynchronize(d0.Stream); err != nil {
		t.Fatalf("the owner reading its own memory: %v", err)
	}
	simtest.WantF32(t, "the owner's copy", simtest.Download(t, b, shared.Ptr(), n), simtest.Ramp(n, 7))
}

// TestConcurrentAllocate runs Allocate and Close from several goroutines
// (for the race detector) and checks nothing is left.
func TestConcurrentAllocate(t *testing.T) {
	b := simtest.New(t, 2)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 20 {
				a, err := vmm.Allocate(b, g%2, uint64(1+i%3)*gran, []int{1 - g%2})
				if err != nil {
					t.Error(err)
					return
				}
				if err := a.Close(); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	simtest.WantZero(t, b, "after concurrent Allocate/Close")
}

// TestMapRange maps part of a chunk, which is mapped elsewhere too, into
// a reservation: both ranges see the same bytes; ranges outside the chunk
// or the reservation are refused with gpu.ErrInvalidValue before the
// driver is asked, and a second mapping of the chunk keeps it alive after
// the first allocation is closed.
func TestMapRange(t *testing.T) {
	b := simtest.New(t, 1)
	a, err := vmm.Allocate(b, 0, 3*gran, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := vmm.Reserve(b, 0, 2*gran, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		name            string
		off, from, size uint64
	}{
		{"past the chunk", 0, 2 * gran, 2 * gran},
		{"past the range", gran, 0, 2 * gran},
		{"from beyond the chunk", 0, 4 * gran, gran},
	} {
		if _, err := vmm.MapRange(r, bad.off, a.Chunk(), bad.from, bad.size); !errors.Is(err, gpu.ErrInvalidValue) {
			t.Errorf("%s: %v, want gpu.ErrInvalidValue", bad.name, err)
		}
	}
	simtest.WantLive(t, b, "after the refused maps", gpu.HandleCounts{Chunks: 1, Reservations: 2, Mappings: 1})
	m, err := vmm.MapRange(r, 0, a.Chunk(), gran, 2*gran)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetAccess([]int{0}); err != nil {
		t.Fatal(err)
	}
	if m.Ptr() != r.Ptr() || m.Size() != 2*gran {
		t.Errorf("mapping at %#x+%d, reservation at %#x", uint64(m.Ptr()), m.Size(), uint64(r.Ptr()))
	}
	data := []byte("one chunk, two ranges")
	if err := b.MemcpyHtoD(a.Ptr().Add(gran+8), data); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if err := b.MemcpyDtoH(got, r.Ptr().Add(8)); err != nil || string(got) != string(data) {
		t.Fatalf("through the second range: %q, %v", got, err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	simtest.WantLive(t, b, "the allocation closed", gpu.HandleCounts{Reservations: 1, Mappings: 1})
	if err := b.MemcpyDtoH(got, r.Ptr().Add(8)); err != nil || string(got) != string(data) {
		t.Fatalf("after the allocation closed: %q, %v", got, err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Free(); err != nil {
		t.Fatal(err)
	}
	simtest.WantZero(t, b, "after the second range went")
}
