package remappable_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/remappable"
	"github.com/stablegraph/stablegraph/vmm"
)

const gran = sim.Granularity

// TestAllocChunkFree: every buffer is its own granule-rounded allocation;
// Chunk finds the chunk behind its start and behind any byte inside it,
// with the offset; addresses of no live buffer (plain memory, freed, past
// the end) are gpu.ErrNotFound; Free takes only a buffer's start; Close
// frees what is left and refuses later Allocs; nothing is left live.
func TestAllocChunkFree(t *testing.T) {
	b := simtest.New(t, 1)
	a, err := remappable.New(b, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Granularity() != gran || a.Device() != 0 {
		t.Fatalf("granularity %d, device %d", a.Granularity(), a.Device())
	}
	var ptrs []gpu.DevicePtr
	for _, size := range []uint64{1, gran, gran + 1, 3 * gran} {
		p, err := a.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		if uint64(p)%gran != 0 {
			t.Errorf("Alloc(%d) = %#x, not on a granule", size, uint64(p))
		}
		ptrs = append(ptrs, p)
	}
	if st := a.Stats(); st.Buffers != 4 || st.Bytes != 1*gran+1*gran+2*gran+3*gran {
		t.Errorf("stats %+v", st)
	}
	simtest.WantLive(t, b, "four buffers", gpu.HandleCounts{Chunks: 4, Reservations: 4, Mappings: 4})
	chunks := map[*vmm.PhysicalAllocation]bool{}
	for i, p := range ptrs {
		c, off, err := a.Chunk(p)
		if err != nil || off != 0 || c.Handle() == 0 || c.Device() != 0 {
			t.Fatalf("Chunk(buffer %d) = %v, %d, %v", i, c, off, err)
		}
		chunks[c] = true
		c2, off, err := a.Chunk(p + 1000)
		if err != nil || c2 != c || off != 1000 {
			t.Errorf("Chunk(inside buffer %d) = %v, %d, %v", i, c2, off, err)
		}
	}
	if len(chunks) != 4 {
		t.Errorf("%d distinct chunks for 4 buffers", len(chunks))
	}
	plain, err := b.MemAlloc(0, 256)
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]gpu.DevicePtr{"plain memory": plain, "past the last granule": ptrs[2] + 2*gran, "null": 0} {
		if _, _, err := a.Chunk(p); !errors.Is(err, gpu.ErrNotFound) {
			t.Errorf("Chunk(%s) = %v, want gpu.ErrNotFound", name, err)
		}
	}
	if err := a.Free(ptrs[1] + 8); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("Free inside a buffer = %v, want gpu.ErrInvalidValue", err)
	}
	if err := a.Free(ptrs[1]); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Chunk(ptrs[1]); !errors.Is(err, gpu.ErrNotFound) {
		t.Errorf("Chunk of a freed buffer = %v", err)
	}
	if err := a.Free(ptrs[1]); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("second Free = %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Alloc(1); !errors.Is(err, gpu.ErrIllegalState) {
		t.Errorf("Alloc after Close = %v", err)
	}
	if err := b.MemFree(plain); err != nil {
		t.Fatal(err)
	}
	simtest.WantZero(t, b, "after Close")
}

// TestNeedsVMM: a device without virtual memory management is
// gpu.ErrNotSupported, a peer that is not a device gpu.ErrInvalidValue.
func TestNeedsVMM(t *testing.T) {
	b := simtest.New(t, 1)
	if _, err := remappable.New(noVMM{b}, 0, nil); !errors.Is(err, gpu.ErrNotSupported) {
		t.Errorf("New without VMM = %v", err)
	}
	if _, err := remappable.New(b, 0, []int{3}); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("New with peer 3 of 1 device = %v", err)
	}
}

// noVMM is the sim whose device lacks virtual memory management.
type noVMM struct{ *sim.Backend }

func (b noVMM) DeviceProps(dev int) (gpu.DeviceProps, error) {
	p, err := b.Backend.DeviceProps(dev)
	p.VMM, p.Granularity = false, 0
	return p, err
}

func (b noVMM) AllocationGranularity(dev int) (uint64, error) {
	return 0, gpu.Errorf("AllocationGranularity", gpu.ErrNotSupported, "device %d has no virtual memory management", dev)
}

// TestPeers: a buffer is accessible from the peers asked for.
func TestPeers(t *testing.T) {
	b := simtest.New(t, 2)
	a, err := remappable.New(b, 0, []int{1})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	p, err := a.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	d1 := simtest.OpenDev(t, b, 1)
	simtest.Upload(t, b, p, simtest.Ramp(4, 1))
	d1.CopyF32(t, p+16, p, 4) // device 1 reads and writes device 0's buffer
	if err := b.StreamSynchronize(d1.Stream); err != nil {
		t.Fatal(err)
	}
	simtest.WantF32(t, "copied by device 1", simtest.Download(t, b, p+16, 4), simtest.Ramp(4, 1))
}

// TestFaults fails every driver call of Alloc, Free and Close in turn:
// Alloc leaves nothing allocated, a failed Free keeps the buffer (Chunk
// still finds it) and may be retried, a failed Close keeps what it could
// not free and may be retried; nothing is left live in the end.
func TestFaults(t *testing.T) {
	b := simtest.New(t, 1)
	for _, op := range []string{"DeviceProps", "MemCreate", "MemAddressReserve", "MemMap", "MemSetAccess"} {
		a, err := remappable.New(b, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		b.InjectFault(op, 0, nil)
		_, err = a.Alloc(gran)
		b.ClearFaults()
		if !errors.Is(err, gpu.ErrInjected) {
			t.Errorf("Alloc with %s failing = %v", op, err)
		}
		if st := a.Stats(); st.Buffers != 0 {
			t.Errorf("%s: %d buffers after a failed Alloc", op, st.Buffers)
		}
		simtest.WantZero(t, b, fmt.Sprintf("Alloc with %s failing", op))
	}
	for _, op := range []string{"MemUnmap", "MemAddressFree", "MemRelease"} {
		a, err := remappable.New(b, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		p, err := a.Alloc(gran)
		if err != nil {
			t.Fatal(err)
		}
		q, err := a.Alloc(gran)
		if err != nil {
			t.Fatal(err)
		}
		b.InjectFault(op, 0, nil)
		err = a.Free(p)
		b.ClearFaults()
		if !errors.Is(err, gpu.ErrInjected) {
			t.Fatalf("Free with %s failing = %v", op, err)
		}
		if _, _, err := a.Chunk(p); err != nil && op == "MemUnmap" {
			t.Errorf("a buffer whose unmap failed is gone: %v", err)
		}
		if err := a.Free(p); err != nil {
			t.Fatalf("Free retried after %s failed: %v", op, err)
		}
		b.InjectFault(op, 0, nil)
		err = a.Close()
		b.ClearFaults()
		if !errors.Is(err, gpu.ErrInjected) {
			t.Fatalf("Close with %s failing = %v", op, err)
		}
		if err := a.Close(); err != nil {
			t.Fatalf("Close retried after %s failed: %v", op, err)
		}
		if _, _, err := a.Chunk(q); !errors.Is(err, gpu.ErrNotFound) {
			t.Errorf("a buffer is still found after Close: %v", err)
		}
		simtest.WantZero(t, b, fmt.Sprintf("after %s failed and was retried", op))
	}
}

// TestConcurrent allocates, looks up and frees from several goroutines:
// every lookup of a goroutine's own buffer finds it. Run under -race.
func TestConcurrent(t *testing.T) {
	b := simtest.New(t, 1)
	a, err := remappable.New(b, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 20 {
				p, err := a.Alloc(uint64(1 + g*i))
				if err != nil {
					errs <- err
					return
				}
				if _, off, err := a.Chunk(p + 7); err != nil || off != 7 {
					errs <- fmt.Errorf("Chunk of my buffer: %d, %v", off, err)
					return
				}
				if err := a.Free(p); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}
