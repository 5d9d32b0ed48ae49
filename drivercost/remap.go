package drivercost

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
)

// This file holds the rows of the remap strategy's per-step driver calls
// (package replay, remap.go): what one moved buffer costs (unmap its
// range, map the caller's chunk there, grant access) and what a whole
// step of N moved buffers costs, so that a run on hardware breaks remap's
// step time down beside the pool's (a timeline write, in the rows above).
//
// The setting is remap's: a range of one granule per buffer, reserved
// once, and for each buffer two chunks of one granule that a caller
// allocated (each mapped at an address of the caller's too, as package
// remappable maps them), which the range maps in turn, as with ping-pong
// buffers. Every call is timed on the host, alone.

// Rows of the remap section; RemapStepRow names the per-step rows.
const (
	RowRemapUnmap        = "remap: MemUnmap of a granule"
	RowRemapMap          = "remap: MemMap of a granule"
	RowRemapSetAccess    = "remap: MemSetAccess of a granule, 1 device"
	RowRemapSetAccessAll = "remap: MemSetAccess of a granule, every device"
	rowRemapStep         = "remap: step moving N=%d buffers"
)

// RemapStepRow names the row of a remap step that moves n buffers: the
// query of the event after the step before (done), then the unmap, map and
// set access of each buffer's range, timed together.
func RemapStepRow(n int) string { return fmt.Sprintf(rowRemapStep, n) }

// remapRows are the rows of the remap section for opts, in order.
func remapRows(opts Options) []string {
	rows := []string{RowRemapUnmap, RowRemapMap, RowRemapSetAccess, RowRemapSetAccessAll}
	for _, n := range opts.RemapBuffers {
		rows = append(rows, RemapStepRow(n))
	}
	return rows
}

// remapState is the memory of the remap section: per buffer a range and
// two chunks (with the caller's own addresses for them), and which chunk
// each range maps now.
type remapState struct {
	m      *bench
	vm     gpu.VirtualMemory // m.b's
	gran   uint64
	ranges []gpu.DevicePtr
	chunks [][2]gpu.PhysMem
	mapped []int // per range: the chunk it maps (0 or 1), -1: none
}

func (m *bench) remap() (err error) {
	vm, gran, verr := gpu.VirtualMemoryOf(m.b, m.dev)
	if verr != nil {
		for _, row := range remapRows(m.opts) {
			m.skip(row, Host, verr)
		}
		return nil
	}
	n := max(1, slices.Max(m.opts.RemapBuffers))
	rs := &remapState{m: m, vm: vm, gran: gran}
	var st stack
	defer st.release(&err)
	for k := range n {
		var pair [2]gpu.PhysMem
		for j := range pair {
			h, err := m.callerChunk(vm, &st, gran)
			if err != nil {
				return fmt.Errorf("buffer %d: %w", k, err)
			}
			pair[j] = h
		}
		p, err := vm.MemAddressReserve(gran, 0)
		if err != nil {
			return fmt.Errorf("MemAddressReserve: %w", err)
		}
		st.push(func() error { return vm.MemAddressFree(p, gran) })
		rs.ranges, rs.chunks, rs.mapped = append(rs.ranges, p), append(rs.chunks, pair), append(rs.mapped, -1)
	}
	// Pushed last, so released first: the ranges are unmapped before
	// they are freed.
	st.push(rs.unmapAll)
	devs := []int{m.dev}
	for k := range rs.ranges {
		if err := rs.mapNext(k, devs); err != nil {
			return err
		}
	}

	err = m.iterate(m.opts.Iterations, func(warm bool) error {
		var t [3]time.Duration
		if err := rs.timedRemap(0, devs, &t); err != nil {
			return err
		}
		m.add(RowRemapUnmap, Host, warm, us(t[0]))
		m.add(RowRemapMap, Host, warm, us(t[1]))
		m.add(RowRemapSetAccess, Host, warm, us(t[2]))
		return nil
	})
	if err != nil {
		return err
	}
	if err := m.remapAllDevices(rs); err != nil {
		return err
	}
	return m.remapSteps(rs, &st, devs)
}

// callerChunk makes a chunk of one granule mapped at an address of its own
// with access for the device, as a remappable caller's buffer is, and
// returns it; st releases it.
func (m *bench) callerChunk(vm gpu.VirtualMemory, st *stack, gran uint64) (gpu.PhysMem, error) {
	h, err := vm.MemCreate(m.dev, gran)
	if err != nil {
		return 0, fmt.Errorf("MemCreate: %w", err)
	}
	st.push(func() error { return vm.MemRelease(h) })
	p, err := vm.MemAddressReserve(gran, 0)
	if err != nil {
		return 0, fmt.Errorf("MemAddressReserve: %w", err)
	}
	st.push(func() error { return vm.MemAddressFree(p, gran) })
	if err := vm.MemMap(p, gran, 0, h); err != nil {
		return 0, fmt.Errorf("MemMap: %w", err)
	}
	st.push(func() error { return vm.MemUnmap(p, gran) })
	if err := vm.MemSetAccess(p, gran, []int{m.dev}); err != nil {
		return 0, fmt.Errorf("MemSetAccess: %w", err)
	}
	return h, nil
}

// remapAllDevices measures the set access of a granule for every device:
// the seeds' remap granted access to every peer. It is skipped on one
// device, and with the driver's reason when the devices cannot all reach
// the device's memory.
func (m *bench) remapAllDevices(rs *remapState) error {
	n := m.b.DeviceCount()
	if n < 2 {
		m.skip(RowRemapSetAccessAll, Host, errors.New("one device: nothing beyond the 1-device row"))
		return nil
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	skipped := false
	return m.iterate(m.opts.Iterations, func(warm bool) error {
		if skipped {
			return nil
		}
		var t [3]time.Duration
		err := rs.timedRemap(0, all, &t)
		switch {
		case err != nil && rs.mapped[0] < 0:
			return err // the unmap or the map failed
		case err != nil:
			// Mapped, but not every device may reach the memory: the
			// row says why. The next map grants access anew.
			skipped = true
			m.skip(RowRemapSetAccessAll, Host, err)
			return nil
		}
		m.add(RowRemapSetAccessAll, Host, warm, us(t[2]))
		return nil
	})
}

// remapSteps measures whole steps of N moved buffers: the query of the
// event recorded after the step before (done: the device is idle), then
// for each buffer its unmap, map and set access.
func (m *bench) remapSteps(rs *remapState, st *stack, devs []int) error {
	s, err := m.stream(st)
	if err != nil {
		return fmt.Errorf("StreamCreate: %w", err)
	}
	ev, err := m.event(st)
	if err != nil {
		return fmt.Errorf("EventCreate: %w", err)
	}
	if err := m.b.EventRecord(ev, s); err != nil {
		return fmt.Errorf("EventRecord: %w", err)
	}
	if err := m.b.EventSynchronize(ev); err != nil {
		return fmt.Errorf("EventSynchronize: %w", err)
	}
	for _, n := range m.opts.RemapBuffers {
		row := RemapStepRow(n)
		iters := max(m.opts.HeavyIterations, m.opts.Iterations/n)
		err := m.iterate(iters, func(warm bool) error {
			t0 := time.Now()
			done, err := m.b.EventQuery(ev)
			if err != nil || !done {
				return fmt.Errorf("EventQuery of the step before: done %v: %w", done, err)
			}
			for k := range n {
				if err := rs.remapOne(k, devs); err != nil {
					return err
				}
			}
			m.add(row, Host, warm, us(time.Since(t0)))
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s: %w", row, err)
		}
	}
	return nil
}

// timedRemap unmaps range k, maps its other chunk and grants devs access,
// timing each call into t.
func (rs *remapState) timedRemap(k int, devs []int, t *[3]time.Duration) error {
	vm, p, g := rs.vm, rs.ranges[k], rs.gran
	t0 := time.Now()
	if err := vm.MemUnmap(p, g); err != nil {
		return fmt.Errorf("MemUnmap: %w", err)
	}
	t[0] = time.Since(t0)
	next := 1 - rs.mapped[k]
	rs.mapped[k] = -1
	t0 = time.Now()
	if err := vm.MemMap(p, g, 0, rs.chunks[k][next]); err != nil {
		return fmt.Errorf("MemMap: %w", err)
	}
	t[1] = time.Since(t0)
	rs.mapped[k] = next
	t0 = time.Now()
	if err := vm.MemSetAccess(p, g, devs); err != nil {
		return fmt.Errorf("MemSetAccess for devices %v: %w", devs, err)
	}
	t[2] = time.Since(t0)
	return nil
}

// remapOne is timedRemap without the timing.
func (rs *remapState) remapOne(k int, devs []int) error {
	var t [3]time.Duration
	return rs.timedRemap(k, devs, &t)
}

// mapNext maps range k, empty, to its first chunk and grants devs access.
func (rs *remapState) mapNext(k int, devs []int) error {
	vm, p, g := rs.vm, rs.ranges[k], rs.gran
	if err := vm.MemMap(p, g, 0, rs.chunks[k][0]); err != nil {
		return fmt.Errorf("MemMap: %w", err)
	}
	rs.mapped[k] = 0
	if err := vm.MemSetAccess(p, g, devs); err != nil {
		return fmt.Errorf("MemSetAccess: %w", err)
	}
	return nil
}

// unmapAll unmaps every range that maps a chunk.
func (rs *remapState) unmapAll() error {
	var errs []error
	for k, c := range rs.mapped {
		if c < 0 {
			continue
		}
		if err := rs.vm.MemUnmap(rs.ranges[k], rs.gran); err != nil {
			errs = append(errs, fmt.Errorf("MemUnmap: %w", err))
			continue
		}
		rs.mapped[k] = -1
	}
	return errors.Join(errs...)
}
