package stablegraph

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/blas"
	"github.com/stablegraph/stablegraph/internal/graph"
	"github.com/stablegraph/stablegraph/internal/trace"
	"github.com/stablegraph/stablegraph/replay"
)

// Compile validates p, assigns and allocates the executable's own memory
// (states and constants one allocation each, temps one shared arena), loads
// the kernels, and returns an Executable that runs p on opts.Device with
// opts.Strategy. A bad program fails with errors wrapping ErrInvalidProgram
// before anything is allocated (every launch of a built-in kernel is
// checked against its signature: see package kernels, "Extents"); a device
// failure releases everything created before it. A nil ctx is an error
// wrapping gpu.ErrInvalidValue.
func Compile(ctx context.Context, b gpu.Backend, p *Program, opts Options) (_ *Executable, err error) {
	if p == nil {
		return nil, errNilProgram
	}
	if ctx == nil {
		return nil, fmt.Errorf("stablegraph: compile %q: %w", p.name, errNilContext)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("stablegraph: compile %q: %w", p.name, err)
	}
	opts, err = opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if b == nil {
		return nil, fmt.Errorf("stablegraph: compile %q: nil backend", p.name)
	}
	if n := b.DeviceCount(); opts.Device >= n {
		return nil, fmt.Errorf("stablegraph: compile %q: device %d out of range (%d devices): %w", p.name, opts.Device, n, gpu.ErrInvalidValue)
	}
	if err := p.check(); err != nil {
		return nil, err
	}
	if err := p.checkComms(b, opts.Device); err != nil {
		return nil, err
	}
	e := &Executable{
		b:    b,
		dev:  opts.Device,
		opts: opts,
		log:  opts.Logger.With("program", p.name, "strategy", string(opts.Strategy)),
		prog: p,
		name: p.name,
		bufs: append([]bufDecl(nil), p.bufs...),
	}
	// Snapshot the commands too: later declarations must not reach into
	// this executable.
	cmds := append([]cmdDecl(nil), p.cmds...)
	e.closing, e.beginClose = context.WithCancel(context.Background())
	e.closeSem = make(chan struct{}, 1)
	e.mu.addrs = make([]gpu.DevicePtr, len(e.bufs))
	e.mu.owned = make([]gpu.DevicePtr, len(e.bufs))
	e.mu.boundGen = make([]uint64, len(e.bufs))
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("stablegraph: compile %q: %w", p.name, err), e.releaseLocked())
		}
	}()
	if err := e.loadModules(p); err != nil {
		return nil, err
	}
	if err := e.allocate(cmds); err != nil {
		return nil, err
	}
	if e.mu.capture, err = b.StreamCreate(e.dev, gpu.StreamNonBlocking, 0); err != nil {
		return nil, fmt.Errorf("capture stream: %w", err)
	}
	if e.mu.done, err = b.EventCreate(e.dev, gpu.EventDisableTiming); err != nil {
		return nil, fmt.Errorf("step event: %w", err)
	}
	e.mu.tr = trace.NewTracer(b, e.dev, e.mu.capture, trace.Options{
		CacheSize: opts.TraceCacheSize,
		Kernels:   e.kernel,
		Logger:    e.log,
	})
	if e.cb, err = e.buildCommands(cmds); err != nil {
		return nil, err
	}
	spec := e.spec(cmds)
	e.rbufs, e.classes = spec.Buffers, replay.ClassesOf(spec.Buffers)
	if e.strat, err = replay.New(opts.Strategy, spec); err != nil {
		var pe *replay.ProgramError
		if errors.As(err, &pe) {
			return nil, &CompileError{Program: p.name, Command: -1, Buffer: pe.Buffer, Msg: pe.Msg}
		}
		return nil, err
	}
	e.leased = replay.LeasesOutputs(e.strat)
	e.aliasSafe = replay.HandlesAliasing(e.strat)
	mem := e.Memory()
	e.log.Debug("compiled", "commands", len(cmds), "buffers", len(e.bufs), "runs", e.Strategy(),
		"temp_bytes", mem.Temps, "temp_bytes_unshared", mem.TempsUnshared,
		"persistent_bytes", mem.Persistent, "slot_bytes", mem.Slots)
	return e, nil
}

// spec is what the strategy is built from: the compiled commands, every
// buffer with its class, size and flow, the device and the options that
// concern strategies.
func (e *Executable) spec(cmds []cmdDecl) replay.Spec {
	flow := analyseFlow(e.bufs, cmds)
	bufs := make([]replay.Buffer, len(e.bufs))
	for i, d := range e.bufs {
		bufs[i] = replay.Buffer{Name: d.name, Class: d.class, Size: d.size, Flow: flow[i]}
	}
	coll := false
	for i := range cmds {
		coll = coll || cmds[i].coll != nil
	}
	var agree replay.Agreement
	if a := newAgreement(e.b, e.dev, cmds); a != nil && e.opts.Strategy == StrategyAuto {
		agree = a // auto decides with the other ranks (replay/collective.go)
	}
	return replay.Spec{
		Program:     e.name,
		Backend:     e.b,
		Ordinal:     e.dev,
		Commands:    e.cb,
		Buffers:     bufs,
		Alignment:   e.opts.Alignment,
		Costs:       e.opts.Costs,
		Poll:        e.opts.SlotPoll,
		Wait:        e.opts.SlotWait,
		Options:     e.opts.StrategyOptions,
		Collectives: coll,
		Agree:       agree,
		Kernels:     e.kernel,
		Logger:      e.log,
	}
}

// loadModules loads the built-in kernels and p's modules and resolves every
// kernel they define.
func (e *Executable) loadModules(p *Program) error {
	e.funcs = map[string]gpu.Function{}
	for _, img := range p.images() {
		m, err := e.b.ModuleLoad(e.dev, img)
		if err != nil {
			return fmt.Errorf("load module %s: %w", img.Name, err)
		}
		e.mu.modules = append(e.mu.modules, m)
		for _, k := range img.Kernels {
			f, err := e.b.ModuleFunction(m, k.Name)
			if err != nil {
				return fmt.Errorf("module %s: kernel %s: %w", img.Name, k.Name, err)
			}
			e.funcs[k.Name] = f
		}
	}
	return nil
}

// kernel resolves a kernel name for traced functions.
func (e *Executable) kernel(name string) (gpu.Function, error) {
	if f, ok := e.funcs[name]; ok {
		return f, nil
	}
	return 0, gpu.Errorf("stablegraph.kernel", gpu.ErrNotFound, "kernel %s is not loaded in executable %q", name, e.name)
}

// allocate gives every state and constant its own allocation (so a fault
// names the buffer's own range) and the temps one arena laid out by
// planTemps, then zeroes the states and writes the constants.
func (e *Executable) allocate(cmds []cmdDecl) error {
	align := e.opts.Alignment
	for i, d := range e.bufs {
		if d.class != State && d.class != Constant {
			continue
		}
		size := gpu.RoundUp(uint64(d.size), align)
		ptr, err := e.b.MemAlloc(e.dev, size)
		if err != nil {
			return fmt.Errorf("allocate %s %q (%d bytes): %w", d.class, d.name, size, err)
		}
		e.mu.owned[i] = ptr
		e.mu.addrs[i] = ptr
		if d.class == State {
			e.pub.mem.States += size
			err = e.b.Memset(gpu.Memset{Dst: ptr, ElemSize: 1, Count: uint64(d.size)})
		} else {
			e.pub.mem.Constants += size
			err = e.b.MemcpyHtoD(ptr, d.data)
		}
		if err != nil {
			return fmt.Errorf("initialise %s %q: %w", d.class, d.name, err)
		}
	}
	plan := planTemps(e.bufs, cmds, align, !e.opts.NoTempSharing)
	e.pub.mem.Temps, e.pub.mem.TempsUnshared = plan.size, plan.unshared
	if plan.size > 0 {
		arena, err := e.b.MemAlloc(e.dev, plan.size)
		if err != nil {
			return fmt.Errorf("allocate temps (%d bytes): %w", plan.size, err)
		}
		e.mu.arena = arena
		for id, off := range plan.off {
			e.mu.addrs[id] = arena.Add(off)
		}
	}
	return nil
}

// buildCommands lowers the declared commands to a graph.CommandBuffer:
// kernels resolved, slices turned into buffer references, GEMMs and traced
// commands registered with the tracer.
func (e *Executable) buildCommands(decls []cmdDecl) (*graph.CommandBuffer, error) {
	cmds := make([]graph.Command, len(decls))
	for i := range decls {
		d := &decls[i]
		c := &cmds[i]
		c.Name = fmt.Sprintf("command %d (%s)", i, d.label())
		ref := func(j int) graph.Ref {
			s := d.args[j].slice
			return graph.Ref{Buf: s.buf.id, Off: uint64(s.off)}
		}
		switch d.kind {
		case cmdLaunch:
			c.Kind = graph.KindKernel
			c.Func = e.funcs[d.kernel]
			c.Config = d.cfg
			c.Args = make([]graph.Arg, len(d.args))
			for j, a := range d.args {
				c.Args[j] = graph.Arg{Value: a.val}
				if a.IsSlice() {
					c.Args[j].Ref = ref(j)
				}
			}
		case cmdMemcpy:
			c.Kind = graph.KindMemcpy
			c.Dst, c.Src, c.Size = ref(0), ref(1), uint64(d.args[0].slice.n)
		case cmdMemset:
			c.Kind = graph.KindMemset
			c.Dst, c.Value, c.ElemSize = ref(0), d.value, d.elemSize
			c.Count = uint64(d.args[0].slice.n) / uint64(d.elemSize)
		case cmdGemm, cmdTrace:
			c.Kind = graph.KindTraced
			// Operands are the distinct buffers of the slices, so two
			// slices of one buffer move together.
			var uses []trace.Use
			var sizes []uint64
			for _, a := range d.args {
				id := a.slice.buf.id
				k := -1
				for o, b := range c.Operands {
					if b == id {
						k = o
					}
				}
				if k < 0 {
					k = len(c.Operands)
					c.Operands = append(c.Operands, id)
					sizes = append(sizes, uint64(e.bufs[id].size))
				}
				uses = append(uses, trace.Use{Operand: k, Off: uint64(a.slice.off)})
			}
			c.Library, c.HostPath = d.kind == cmdGemm, d.coll != nil
			if d.kind == cmdGemm {
				c.Trace = e.mu.tr.NewLibraryCommand(c.Name, blas.Command(d.gemm.blas()), uses, sizes)
			} else {
				c.Trace = e.mu.tr.NewCommand(c.Name, d.fn, uses, sizes)
			}
		}
	}
	cb, err := graph.New(e.dev, len(e.bufs), cmds, e.mu.tr)
	if err != nil {
		return nil, err
	}
	// The temps stay where the arena put them, and the constants where
	// they were written, for the executable's life.
	var fixed []int
	for id := range e.bufs {
		if c := e.bufs[id].class; c == Temp || c == Constant {
			fixed = append(fixed, id)
		}
	}
	cb.Fix(fixed)
	return cb, nil
}

// tempPlan places the temps in one arena. Each temp lives from the first
// to the last command that uses it; a temp goes at the lowest aligned
// offset that overlaps no placed temp whose lifetime overlaps its own,
// largest temps first (the greedy-by-size heuristic of TFLite's arena
// planner). Unused temps get no memory.
type tempPlan struct {
	off      map[int]uint64 // buffer id → offset in the arena
	size     uint64         // arena bytes
	unshared uint64         // arena bytes if no temp shared
}

func planTemps(bufs []bufDecl, cmds []cmdDecl, align uint64, share bool) tempPlan {
	type life struct {
		id          int
		size        uint64
		first, last int
		off         uint64
	}
	lives := map[int]*life{}
	for i := range cmds {
		for _, a := range cmds[i].args {
			if !a.IsSlice() || bufs[a.slice.buf.id].class != Temp {
				continue
			}
			id := a.slice.buf.id
			if l, ok := lives[id]; ok {
				l.last = i
			} else {
				lives[id] = &life{id: id, size: gpu.RoundUp(uint64(bufs[id].size), align), first: i, last: i}
			}
		}
	}
	order := make([]*life, 0, len(lives))
	for _, l := range lives {
		order = append(order, l)
	}
	slices.SortFunc(order, func(a, b *life) int {
		if c := cmp.Compare(b.size, a.size); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	plan := tempPlan{off: map[int]uint64{}}
	var placed []*life // sorted by offset
	for _, l := range order {
		plan.unshared += l.size
		var off uint64
		for _, q := range placed {
			if share && (q.last < l.first || l.last < q.first) {
				continue // lifetimes disjoint: may share
			}
			if off+l.size <= q.off {
				break // fits in the gap before q
			}
			off = max(off, q.off+q.size)
		}
		l.off = off
		plan.off[l.id] = off
		plan.size = max(plan.size, off+l.size)
		k, _ := slices.BinarySearchFunc(placed, off, func(q *life, off uint64) int { return cmp.Compare(q.off, off) })
		placed = slices.Insert(placed, k, l)
	}
	return plan
}

// span is a half-open byte range [lo, hi).
type span struct{ lo, hi int64 }

// analyseFlow says how the step uses each buffer (replay.Flow), for the
// strategies that copy params and outputs between the caller's buffers and
// their own. It walks the commands in order, keeping for each buffer the
// bytes written so far. Within a command reads come before writes: an
// InOut slice reads what was there before the command.
func analyseFlow(bufs []bufDecl, cmds []cmdDecl) []replay.Flow {
	nbufs := len(bufs)
	sizes := make([]int64, nbufs)
	for i := range bufs {
		sizes[i] = bufs[i].size
	}
	flow := make([]replay.Flow, nbufs)
	written := make([][]span, nbufs)
	for i := range cmds {
		c := &cmds[i]
		for _, a := range c.args {
			if a.IsSlice() && a.access&Read != 0 && a.slice.n > 0 {
				id := a.slice.buf.id
				if !covers(written[id], span{a.slice.off, a.slice.off + a.slice.n}) {
					flow[id].ReadFirst = true
				}
			}
		}
		for _, a := range c.args {
			if a.IsSlice() && a.access&Write != 0 && a.slice.n > 0 {
				id := a.slice.buf.id
				flow[id].Written = true
				written[id] = addSpan(written[id], span{a.slice.off, a.slice.off + a.slice.n})
			}
		}
	}
	for id, ss := range written {
		flow[id].Full = len(ss) == 1 && ss[0].lo == 0 && ss[0].hi >= sizes[id]
	}
	return flow
}

// covers reports whether the sorted, disjoint, non-adjacent spans ss cover
// all of s.
func covers(ss []span, s span) bool {
	for _, x := range ss {
		if x.lo <= s.lo && s.hi <= x.hi {
			return true
		}
	}
	return false
}

// addSpan adds s to the sorted, disjoint spans ss, merging what touches it.
func addSpan(ss []span, s span) []span {
	out := ss[:0:0]
	for _, x := range ss {
		if x.hi < s.lo || s.hi < x.lo {
			out = append(out, x)
			continue
		}
		s = span{min(s.lo, x.lo), max(s.hi, x.hi)}
	}
	out = append(out, s)
	slices.SortFunc(out, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	return out
}
