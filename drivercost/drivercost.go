// Package drivercost measures what the driver operations stablegraph is built
// on cost on a backend: stream and event creation, virtual memory, plain
// allocation, stream value writes seen by the host, device copies, and graphs
// of K tiny kernels (capture, instantiate, launch, replay against eager
// launches, whole-graph exec update, re-capture, per-node parameter updates),
// exec updates of kernel nodes by parameter block size, idle and in flight,
// steps of m updates and a launch, and whole-graph updates from a host
// template (hostupdate.go), and the remap strategy's per-step calls (unmap, map and set access of a
// granule; whole steps of N moved buffers; remap.go).
//
// It runs through the gpu interface only, so the same measurement runs on
// the simulator and on CUDA. On hardware it puts each figure beside the
// reference measured on the project's H100 (docs/GPU-MACHINE.md); on the
// simulator the times are its model's, not a GPU measurement, and are never
// set beside a hardware figure (Result.Simulated; no reference, no ratio).
// The command `stablegraph bench-driver` is a thin wrapper around Run.
//
// # Method
//
// Every row is a set of samples, one per iteration, after one unrecorded
// warm-up iteration; the result keeps the median (p50) and p90 in
// microseconds (report.Percentile). Host rows time the call with the host
// clock. GPU rows ("gpu" clock) are the time between two events recorded
// around the work on one stream. Rows named "per launch", "per node" or
// "per kernel" divide a sample by the number of kernels it covered.
//
// Host rows of calls that enqueue work time them on a stream with nothing
// pending: the stream is synchronized before, outside the timed region, so
// that a call never waits behind earlier work for room in the stream's
// queue. The first launch of a new graph exec uploads the graph to the
// device and is a row of its own; the GraphLaunch and replay rows measure a
// later launch of the same exec. The node update section's in-flight and
// step rows are the exception, on purpose: they update a graph while it
// runs, and time steps of updates and launches back to back, as a training
// loop makes them (hostupdate.go).
//
// Work that the device does not support (no VMM, no stream memory
// operations, an exec update the backend refuses with ErrNotSupported) gives
// a row marked skipped with the reason; any other error ends Run. Either
// way, every handle Run created is released before it returns, and Run
// fails if the backend's live-handle counters (gpu.LiveHandles) are not
// back where they started.
package drivercost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/report"
)

// Options configure Run. The zero value is valid; defaults are applied in
// withDefaults, the only place they are read.
type Options struct {
	// Device is the device ordinal to measure. Default 0.
	Device int
	// Iterations is the number of samples of each cheap row (single
	// streams, events, 2 MiB memory, value writes, 1 MiB copies,
	// FuncParamInfo). Default 1000.
	Iterations int
	// HeavyIterations is the number of samples of the expensive rows
	// (batches of 112 streams, 64 MiB memory and copies). Default 50.
	HeavyIterations int
	// GraphIterations is the number of samples of each graph row for
	// K >= 100; smaller K run proportionally more (GraphIterations*100/K),
	// so that their short samples are not noise. Default 50.
	GraphIterations int
	// Ks are the graph sizes, in kernels. Default 10, 100, 1000.
	Ks []int
	// RemapBuffers are the numbers of moved buffers of the remap step
	// rows (RemapStepRow). Default 1, 4, 16, 64.
	RemapBuffers []int
	// ParamBytes are the parameter block sizes of the node update rows
	// (hostupdate.go), each 24 plus a multiple of 8. Default 24, 152, 360,
	// 1024.
	ParamBytes []int
	// UpdateNodes are the chain lengths of the node update rows. Default
	// 16, 200.
	UpdateNodes []int
	// UpdateIterations is the number of samples of each node update row.
	// Default 20.
	UpdateIterations int
	// Sections names the sections to run (SectionNames); nil runs every
	// one.
	Sections []string
	// PollTimeout is how long the host waits to see a stream value write
	// before the run fails. Default 1 s.
	PollTimeout time.Duration
	// Progress receives one line per section as the run goes; nil for
	// none.
	Progress io.Writer
	// Logger receives debug logs. Default slog.Default().
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.Iterations <= 0 {
		o.Iterations = 1000
	}
	if o.HeavyIterations <= 0 {
		o.HeavyIterations = 50
	}
	if o.GraphIterations <= 0 {
		o.GraphIterations = 50
	}
	if len(o.Ks) == 0 {
		o.Ks = []int{10, 100, 1000}
	}
	if len(o.RemapBuffers) == 0 {
		o.RemapBuffers = []int{1, 4, 16, 64}
	}
	if len(o.ParamBytes) == 0 {
		o.ParamBytes = []int{24, 152, 360, 1024}
	}
	if len(o.UpdateNodes) == 0 {
		o.UpdateNodes = []int{16, 200}
	}
	if o.UpdateIterations <= 0 {
		o.UpdateIterations = 20
	}
	if o.PollTimeout <= 0 {
		o.PollTimeout = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Clocks of a row.
const (
	Host = "host"
	GPU  = "gpu"
)

// Row is one measured operation.
type Row struct {
	Name  string `json:"name"`
	Clock string `json:"clock"` // Host or GPU
	// P50 and P90 are in microseconds; zero when Skipped.
	P50     float64 `json:"p50_us"`
	P90     float64 `json:"p90_us"`
	Samples int     `json:"samples"`
	// ReferenceUS is the H100 figure from docs/GPU-MACHINE.md for the same
	// operation; nil where the document gives none, and on a simulator.
	ReferenceUS *float64 `json:"h100_reference_us,omitempty"`
	// Skipped says why the row was not measured; empty when it was.
	Skipped string `json:"skipped,omitempty"`

	samples []float64
}

// Result is the outcome of Run.
type Result struct {
	Backend string      `json:"backend"`
	Device  string      `json:"device"`
	Props   DeviceProps `json:"device_props"`
	// Simulated is true on a simulator (report.SimulatedBackend): the
	// times are its model's, not a GPU measurement.
	Simulated bool `json:"simulated"`
	// Iterations, HeavyIterations and GraphIterations are the options the
	// run used.
	Iterations      int     `json:"iterations"`
	HeavyIterations int     `json:"heavy_iterations"`
	GraphIterations int     `json:"graph_iterations"`
	Ks              []int   `json:"ks"`
	RemapBuffers    []int   `json:"remap_buffers"`
	ParamBytes      []int   `json:"param_bytes"`
	UpdateNodes     []int   `json:"update_nodes"`
	Rows            []Row   `json:"rows"`
	ElapsedS        float64 `json:"elapsed_s"`
}

// DeviceProps are the measured device's properties, with the JSON keys of
// "stablegraph info --json".
type DeviceProps struct {
	Ordinal           int    `json:"ordinal"`
	Name              string `json:"name"`
	TotalMemoryBytes  uint64 `json:"total_memory_bytes"`
	ComputeCapability string `json:"compute_capability"`
	DriverVersion     int    `json:"driver_version"`
	VMM               bool   `json:"vmm"`
	GranularityBytes  uint64 `json:"granularity_bytes"`
	StreamMemOps      bool   `json:"stream_mem_ops"`
}

func devicePropsOf(p gpu.DeviceProps) DeviceProps {
	return DeviceProps{
		Ordinal: p.Ordinal, Name: p.Name, TotalMemoryBytes: p.TotalMemory,
		ComputeCapability: fmt.Sprintf("%d.%d", p.ComputeMajor, p.ComputeMinor), DriverVersion: p.DriverVersion,
		VMM: p.VMM, GranularityBytes: p.Granularity, StreamMemOps: p.StreamMemOps,
	}
}

// Row returns the row named name, and false when there is none.
func (r *Result) Row(name string) (Row, bool) {
	for _, row := range r.Rows {
		if row.Name == name {
			return row, true
		}
	}
	return Row{}, false
}

// Run measures b's device opts.Device. It stops early with ctx's error when
// ctx is cancelled, after releasing what it created.
func Run(ctx context.Context, b gpu.Backend, opts Options) (res *Result, err error) {
	opts = opts.withDefaults()
	props, err := b.DeviceProps(opts.Device)
	if err != nil {
		return nil, fmt.Errorf("drivercost: device %d: %w", opts.Device, err)
	}
	for _, k := range opts.Ks {
		if k <= 0 {
			return nil, fmt.Errorf("drivercost: graph size K=%d: must be positive", k)
		}
	}
	for _, n := range opts.RemapBuffers {
		if n <= 0 {
			return nil, fmt.Errorf("drivercost: remap step of %d buffers: must be positive", n)
		}
	}
	for _, p := range opts.ParamBytes {
		if p < 24 || (p-24)%8 != 0 {
			return nil, fmt.Errorf("drivercost: parameter block of %d bytes: must be 24 plus a multiple of 8", p)
		}
	}
	for _, k := range opts.UpdateNodes {
		if k <= 0 {
			return nil, fmt.Errorf("drivercost: node update chain of K=%d: must be positive", k)
		}
	}
	for _, name := range opts.Sections {
		if !slices.Contains(SectionNames(), name) {
			return nil, fmt.Errorf("drivercost: no section %q (sections: %s)", name, strings.Join(SectionNames(), ", "))
		}
	}
	before, counted := gpu.LiveHandles(b)
	m := &bench{ctx: ctx, b: b, dev: opts.Device, opts: opts, props: props, rows: map[string]*Row{}}
	start := time.Now()
	defer func() {
		if !counted {
			return
		}
		if after, _ := gpu.LiveHandles(b); after != before {
			err = errors.Join(err, fmt.Errorf("drivercost: handles leaked: live before the run: %v; after: %v", before, after))
			res = nil
		}
	}()

	for _, s := range m.sections() {
		if opts.Sections != nil && !slices.Contains(opts.Sections, s.name) {
			continue
		}
		m.progress("%s", s.name)
		if err := s.fn(); err != nil {
			return nil, fmt.Errorf("drivercost: %s: %w", s.name, err)
		}
	}
	res = &Result{
		Backend: b.Name(), Device: props.Name, Props: devicePropsOf(props), Simulated: report.SimulatedBackend(b.Name()),
		Iterations: opts.Iterations, HeavyIterations: opts.HeavyIterations, GraphIterations: opts.GraphIterations,
		Ks: opts.Ks, RemapBuffers: opts.RemapBuffers, ParamBytes: opts.ParamBytes, UpdateNodes: opts.UpdateNodes,
		ElapsedS: time.Since(start).Seconds(),
	}
	for _, name := range m.order {
		row := *m.rows[name]
		if row.Skipped == "" {
			p := report.Summarize(row.samples)
			row.P50, row.P90, row.Samples = p.P50, p.P90, len(row.samples)
		}
		if ref, ok := Reference(name); ok && !res.Simulated {
			row.ReferenceUS = &ref
		}
		row.samples = nil
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}

// section is one section of a run: its name and what measures it.
type section struct {
	name string
	fn   func() error
}

// sections are the sections of a run, in order.
func (m *bench) sections() []section {
	return []section{
		{"streams", m.streams},
		{"events", m.events},
		{"virtual memory", m.vmm},
		{"remap", m.remap},
		{"device memory", m.memAlloc},
		{"stream value writes", m.writeValue},
		{"device copies", m.copies},
		{"graphs", m.graphs},
		{"node updates", m.hostUpdates},
		{"kernel parameter info", m.paramInfo},
	}
}

// SectionNames lists the sections of a run, in order (Options.Sections).
func SectionNames() []string {
	var out []string
	for _, s := range (&bench{}).sections() {
		out = append(out, s.name)
	}
	return out
}

// bench holds one run's state.
type bench struct {
	ctx   context.Context
	b     gpu.Backend
	dev   int
	opts  Options
	props gpu.DeviceProps
	rows  map[string]*Row
	order []string
}

func (m *bench) progress(format string, args ...any) {
	if m.opts.Progress != nil {
		fmt.Fprintf(m.opts.Progress, "bench-driver: "+format+"\n", args...)
	}
}

func (m *bench) row(name, clock string) *Row {
	r, ok := m.rows[name]
	if !ok {
		r = &Row{Name: name, Clock: clock}
		m.rows[name] = r
		m.order = append(m.order, name)
	}
	return r
}

// add records a sample of us microseconds under name, unless warm (the
// unrecorded warm-up iteration).
func (m *bench) add(name, clock string, warm bool, us float64) {
	r := m.row(name, clock)
	if !warm {
		r.samples = append(r.samples, us)
	}
}

func (m *bench) skip(name, clock string, why error) {
	m.row(name, clock).Skipped = why.Error()
	m.opts.Logger.Debug("drivercost: skipped", "row", name, "reason", why)
}

// iterate runs fn n+1 times, the first as the warm-up, checking ctx before
// each.
func (m *bench) iterate(n int, fn func(warm bool) error) error {
	for i := -1; i < n; i++ {
		if err := m.ctx.Err(); err != nil {
			return err
		}
		if err := fn(i < 0); err != nil {
			return err
		}
	}
	return nil
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// stack releases section-lifetime handles in reverse order of creation.
type stack []func() error

func (s *stack) push(f func() error) { *s = append(*s, f) }

// release runs every release function, newest first, and joins the
// errors with err.
func (s *stack) release(err *error) {
	for i := len(*s) - 1; i >= 0; i-- {
		*err = errors.Join(*err, (*s)[i]())
	}
	*s = nil
}

func (m *bench) stream(st *stack) (gpu.Stream, error) {
	s, err := m.b.StreamCreate(m.dev, gpu.StreamNonBlocking, 0)
	if err != nil {
		return 0, err
	}
	st.push(func() error { return m.b.StreamDestroy(s) })
	return s, nil
}

func (m *bench) event(st *stack) (gpu.Event, error) {
	e, err := m.b.EventCreate(m.dev, gpu.EventDefault)
	if err != nil {
		return 0, err
	}
	st.push(func() error { return m.b.EventDestroy(e) })
	return e, nil
}

// timedStream makes a stream and two events to time work on it between,
// all released by st; errors name the call that failed.
func (m *bench) timedStream(st *stack) (s gpu.Stream, start, end gpu.Event, err error) {
	if s, err = m.stream(st); err != nil {
		return 0, 0, 0, fmt.Errorf("StreamCreate: %w", err)
	}
	if start, err = m.event(st); err != nil {
		return 0, 0, 0, fmt.Errorf("EventCreate: %w", err)
	}
	if end, err = m.event(st); err != nil {
		return 0, 0, 0, fmt.Errorf("EventCreate: %w", err)
	}
	return s, start, end, nil
}

func (m *bench) alloc(st *stack, size uint64) (gpu.DevicePtr, error) {
	p, err := m.b.MemAlloc(m.dev, size)
	if err != nil {
		return 0, err
	}
	st.push(func() error { return m.b.MemFree(p) })
	return p, nil
}

// gpuTime records start and end around work on s and returns the time
// between them.
func (m *bench) gpuTime(s gpu.Stream, start, end gpu.Event, work func() error) (time.Duration, error) {
	if err := m.b.EventRecord(start, s); err != nil {
		return 0, err
	}
	if err := work(); err != nil {
		return 0, errors.Join(err, m.b.StreamSynchronize(s))
	}
	if err := m.b.EventRecord(end, s); err != nil {
		return 0, errors.Join(err, m.b.StreamSynchronize(s))
	}
	if err := m.b.EventSynchronize(end); err != nil {
		return 0, err
	}
	return m.b.EventElapsed(start, end)
}

const streamBatch = 112

func (m *bench) streams() error {
	err := m.iterate(m.opts.Iterations, func(warm bool) error {
		t0 := time.Now()
		s, err := m.b.StreamCreate(m.dev, gpu.StreamNonBlocking, 0)
		c := time.Since(t0)
		if err != nil {
			return fmt.Errorf("StreamCreate: %w", err)
		}
		t0 = time.Now()
		err = m.b.StreamDestroy(s)
		d := time.Since(t0)
		if err != nil {
			return fmt.Errorf("StreamDestroy: %w", err)
		}
		m.add(RowStreamCreate, Host, warm, us(c))
		m.add(RowStreamDestroy, Host, warm, us(d))
		return nil
	})
	if err != nil {
		return err
	}
	return m.iterate(m.opts.HeavyIterations, func(warm bool) (err error) {
		ss := make([]gpu.Stream, 0, streamBatch)
		defer func() {
			for _, s := range ss {
				err = errors.Join(err, m.b.StreamDestroy(s))
			}
		}()
		t0 := time.Now()
		for range streamBatch {
			s, err := m.b.StreamCreate(m.dev, gpu.StreamNonBlocking, 0)
			if err != nil {
				return fmt.Errorf("StreamCreate (batch of %d): %w", streamBatch, err)
			}
			ss = append(ss, s)
		}
		c := time.Since(t0)
		t0 = time.Now()
		for len(ss) > 0 {
			s := ss[len(ss)-1]
			ss = ss[:len(ss)-1]
			if err := m.b.StreamDestroy(s); err != nil {
				return fmt.Errorf("StreamDestroy (batch of %d): %w", streamBatch, err)
			}
		}
		d := time.Since(t0)
		m.add(RowStreamCreateBatch, Host, warm, us(c))
		m.add(RowStreamDestroyBatch, Host, warm, us(d))
		return nil
	})
}

func (m *bench) events() error {
	return m.iterate(m.opts.Iterations, func(warm bool) error {
		t0 := time.Now()
		e, err := m.b.EventCreate(m.dev, gpu.EventDefault)
		c := time.Since(t0)
		if err != nil {
			return fmt.Errorf("EventCreate: %w", err)
		}
		t0 = time.Now()
		err = m.b.EventDestroy(e)
		d := time.Since(t0)
		if err != nil {
			return fmt.Errorf("EventDestroy: %w", err)
		}
		m.add(RowEventCreate, Host, warm, us(c))
		m.add(RowEventDestroy, Host, warm, us(d))
		return nil
	})
}

// vmmSizes are the sizes of the virtual memory rows, with their iteration
// counts chosen in vmm.
var vmmSizes = []uint64{2 << 20, 64 << 20}

func (m *bench) vmm() error {
	vm, gran, err := gpu.VirtualMemoryOf(m.b, m.dev)
	for _, size := range vmmSizes {
		names := vmmRows(size)
		if err != nil {
			for _, n := range names {
				m.skip(n, Host, err)
			}
			continue
		}
		n := m.opts.Iterations
		if size > 2<<20 {
			n = m.opts.HeavyIterations
		}
		size := gpu.RoundUp(size, gran)
		if err := m.iterate(n, func(warm bool) error { return m.vmmOnce(vm, size, names, warm) }); err != nil {
			return fmt.Errorf("%s: %w", sizeName(size), err)
		}
	}
	return nil
}

// vmmOnce creates, reserves, maps, grants access to, unmaps, frees and
// releases one chunk of size bytes, timing each step. On error it undoes
// whatever is still held.
func (m *bench) vmmOnce(vm gpu.VirtualMemory, size uint64, names [7]string, warm bool) (err error) {
	var (
		h      gpu.PhysMem
		p      gpu.DevicePtr
		mapped bool
		t      [7]time.Duration
	)
	defer func() {
		if mapped {
			err = errors.Join(err, vm.MemUnmap(p, size))
		}
		if p != 0 {
			err = errors.Join(err, vm.MemAddressFree(p, size))
		}
		if h != 0 {
			err = errors.Join(err, vm.MemRelease(h))
		}
	}()
	step := func(i int, op string, f func() error) error {
		t0 := time.Now()
		err := f()
		t[i] = time.Since(t0)
		if err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		return nil
	}
	if err := step(0, "MemCreate", func() (err error) { h, err = vm.MemCreate(m.dev, size); return err }); err != nil {
		return err
	}
	if err := step(1, "MemAddressReserve", func() (err error) { p, err = vm.MemAddressReserve(size, 0); return err }); err != nil {
		return err
	}
	if err := step(2, "MemMap", func() error { return vm.MemMap(p, size, 0, h) }); err != nil {
		return err
	}
	mapped = true
	if err := step(3, "MemSetAccess", func() error { return vm.MemSetAccess(p, size, []int{m.dev}) }); err != nil {
		return err
	}
	if err := step(4, "MemUnmap", func() error { return vm.MemUnmap(p, size) }); err != nil {
		return err
	}
	mapped = false
	if err := step(5, "MemAddressFree", func() error { return vm.MemAddressFree(p, size) }); err != nil {
		return err
	}
	p = 0
	if err := step(6, "MemRelease", func() error { return vm.MemRelease(h) }); err != nil {
		return err
	}
	h = 0
	for i, name := range names {
		m.add(name, Host, warm, us(t[i]))
	}
	return nil
}

func (m *bench) memAlloc() error {
	const size = 2 << 20
	return m.iterate(m.opts.Iterations, func(warm bool) error {
		t0 := time.Now()
		p, err := m.b.MemAlloc(m.dev, size)
		a := time.Since(t0)
		if err != nil {
			return fmt.Errorf("MemAlloc: %w", err)
		}
		t0 = time.Now()
		err = m.b.MemFree(p)
		f := time.Since(t0)
		if err != nil {
			return fmt.Errorf("MemFree: %w", err)
		}
		m.add(RowMemAlloc, Host, warm, us(a))
		m.add(RowMemFree, Host, warm, us(f))
		return nil
	})
}

func (m *bench) writeValue() (err error) {
	ops, err := gpu.StreamMemOpsOf(m.b, m.dev)
	if err != nil {
		m.skip(RowWriteValueEnqueue, Host, err)
		m.skip(RowWriteValueSeen, Host, err)
		return nil
	}
	var st stack
	defer st.release(&err)
	s, err := m.stream(&st)
	if err != nil {
		return fmt.Errorf("StreamCreate: %w", err)
	}
	hm, err := ops.HostAlloc(64)
	if err != nil {
		return fmt.Errorf("HostAlloc: %w", err)
	}
	st.push(func() error { return ops.HostFree(hm.Handle) })
	st.push(func() error { return m.b.StreamSynchronize(s) }) // before the host memory goes
	v := uint64(0)
	return m.iterate(m.opts.Iterations, func(warm bool) error {
		v++
		t0 := time.Now()
		if err := ops.StreamWriteValue64(s, hm.Ptr, v); err != nil {
			return fmt.Errorf("StreamWriteValue64: %w", err)
		}
		e := time.Since(t0)
		if err := m.waitValue(hm, s, v); err != nil {
			return err
		}
		seen := time.Since(t0)
		m.add(RowWriteValueEnqueue, Host, warm, us(e))
		m.add(RowWriteValueSeen, Host, warm, us(seen))
		return nil
	})
}

// waitValue polls the host view of hm until it reads v: a short busy spin
// (the latency being measured is microseconds), then yielding, then sleeps
// that double up to 1 ms, until the deadline.
func (m *bench) waitValue(hm gpu.HostMem, s gpu.Stream, v uint64) error {
	deadline := time.Now().Add(m.opts.PollTimeout)
	sleep := time.Microsecond
	for i := 0; hm.Load64(0) != v; i++ {
		switch {
		case i < 2000:
		case i < 2100:
			runtime.Gosched()
		default:
			if time.Now().After(deadline) {
				_, qerr := m.b.StreamQuery(s)
				return errors.Join(fmt.Errorf("value %d written by the stream not seen by the host after %v (last read %d): %w",
					v, m.opts.PollTimeout, hm.Load64(0), gpu.ErrTimeout), qerr)
			}
			time.Sleep(sleep)
			sleep = min(2*sleep, time.Millisecond)
		}
	}
	return nil
}

func (m *bench) copies() (err error) {
	var st stack
	defer st.release(&err)
	s, start, end, err := m.timedStream(&st)
	if err != nil {
		return err
	}
	for _, c := range []struct {
		size uint64
		n    int
		row  string
	}{{1 << 20, m.opts.Iterations, RowCopy1M}, {64 << 20, m.opts.HeavyIterations, RowCopy64M}} {
		var bufs stack
		src, err := m.alloc(&bufs, c.size)
		if err == nil {
			var dst gpu.DevicePtr
			dst, err = m.alloc(&bufs, c.size)
			if err == nil {
				err = m.iterate(c.n, func(warm bool) error {
					d, err := m.gpuTime(s, start, end, func() error { return m.b.MemcpyDtoDAsync(dst, src, c.size, s) })
					if err != nil {
						return fmt.Errorf("MemcpyDtoDAsync of %s: %w", FormatSize(c.size), err)
					}
					m.add(c.row, GPU, warm, us(d))
					return nil
				})
			}
		}
		bufs.release(&err)
		if err != nil {
			return err
		}
	}
	return nil
}

func (m *bench) paramInfo() (err error) {
	var st stack
	defer st.release(&err)
	f, err := m.fill(&st)
	if err != nil {
		return err
	}
	return m.iterate(m.opts.Iterations, func(warm bool) error {
		t0 := time.Now()
		_, err := m.b.FuncParamInfo(f)
		d := time.Since(t0)
		if errors.Is(err, gpu.ErrNotSupported) {
			m.skip(RowParamInfo, Host, err)
			return nil
		}
		if err != nil {
			return fmt.Errorf("FuncParamInfo: %w", err)
		}
		m.add(RowParamInfo, Host, warm, us(d))
		return nil
	})
}

// fill loads the built-in module and returns its fill kernel.
func (m *bench) fill(st *stack) (gpu.Function, error) {
	mod, err := m.b.ModuleLoad(m.dev, kernels.Module())
	if err != nil {
		return 0, fmt.Errorf("ModuleLoad: %w", err)
	}
	st.push(func() error { return m.b.ModuleUnload(mod) })
	f, err := m.b.ModuleFunction(mod, kernels.Fill)
	if err != nil {
		return 0, fmt.Errorf("ModuleFunction %s: %w", kernels.Fill, err)
	}
	return f, nil
}
