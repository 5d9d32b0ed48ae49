package replay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/graph"
)

// This file holds what stable and pool share: a step run over persistent
// copies of the params and outputs, with the copies between them and the
// caller's buffers.
//
// # Extended addresses
//
// The step's graph is recorded over an extended address vector: indices
// 0..nbufs-1 are the program's buffers, the params and outputs among them
// at their persistent copies; indices nbufs+j are the caller's buffers
// (callers[j] names the program buffer each one is bound to). Copy-in
// commands copy caller index → persistent buffer before the body, copy-out
// commands persistent buffer → caller index after it. The body references
// only indices below nbufs, whose addresses never move (unless the caller
// rebinds a state), so when the caller's buffers move the only nodes out of
// date are the copies, and patching them is the whole update.

// CopyOptions configure the copies of stable and pool between the caller's
// params and outputs and their own (Options.Copies).
type CopyOptions struct {
	// OnStream makes stable and pool copy with stream copies around the
	// graph launch instead of copy nodes inside the graph: no node is
	// updated when the caller's buffers move, at the price of one more
	// launch per copy. Default false (copies in the graph, one launch per
	// step).
	OnStream bool
}

// copySpec is one copy of a step, between extended indices.
type copySpec struct {
	name     string
	dst, src int
	size     uint64
}

// copyPlan is how a persistent-address strategy moves one step between the
// caller's buffers and its own copies. It is immutable.
type copyPlan struct {
	nbufs int
	bufs  []Buffer // the step's buffers, for the overlaps of the callers
	align uint64   // of every copy's start (Options.Alignment)
	// persistent lists the program buffers that get a persistent copy:
	// every param and output, in declaration order.
	persistent []int
	// callers[j] is the program buffer bound to extended index nbufs+j.
	callers []int
	// in and out are the copies before and after the body: params (and
	// outputs) whose caller contents the step reads, outputs (and params)
	// the step writes. Outputs leased to the caller are not copied.
	in, out []copySpec
	bytes   int64 // copied per step
	// cb is the command buffer launched each step: copies and body in one
	// graph (inGraph), or the body alone, the copies enqueued around it.
	cb      *graph.CommandBuffer
	inGraph bool
}

// newCopyPlan plans the copies of spec's step. leaseOutputs leaves the
// outputs in the persistent copies (zero-copy pool), which needs every
// output written in full before the step reads it: there are no caller
// contents to copy in.
func newCopyPlan(spec *Spec, leaseOutputs, inGraph bool) (*copyPlan, error) {
	pl := &copyPlan{nbufs: len(spec.Buffers), bufs: spec.Buffers, align: max(spec.Alignment, 1), inGraph: inGraph}
	for id := range spec.Buffers {
		d := &spec.Buffers[id]
		if !d.Class.Bound() {
			continue
		}
		pl.persistent = append(pl.persistent, id)
		f := d.Flow
		if d.Class == Output && leaseOutputs {
			if f.NeedsCopyIn(true) {
				return nil, &ProgramError{Buffer: d.Name,
					Msg: "zero-copy outputs must be written in full by the step before it reads them; this one is read first or written in part"}
			}
			continue
		}
		ext := pl.nbufs + len(pl.callers)
		pl.callers = append(pl.callers, id)
		size := uint64(d.Size)
		copyOut := d.Class == Output || f.Written
		if f.NeedsCopyIn(copyOut) {
			pl.in = append(pl.in, copySpec{name: fmt.Sprintf("copy in %q", d.Name), dst: id, src: ext, size: size})
			pl.bytes += d.Size
		}
		if copyOut {
			pl.out = append(pl.out, copySpec{name: fmt.Sprintf("copy out %q", d.Name), dst: ext, src: id, size: size})
			pl.bytes += d.Size
		}
	}
	pl.cb = spec.Commands
	if inGraph {
		cmds := func(cs []copySpec) []graph.Command {
			out := make([]graph.Command, len(cs))
			for i, c := range cs {
				out[i] = graph.Command{Name: c.name, Kind: graph.KindMemcpy,
					Dst: graph.Ref{Buf: c.dst}, Src: graph.Ref{Buf: c.src}, Size: c.size}
			}
			return out
		}
		var err error
		if pl.cb, err = spec.Commands.Extend(pl.nbufs+len(pl.callers), cmds(pl.in), cmds(pl.out)); err != nil {
			return nil, fmt.Errorf("copy graph: %w", err)
		}
	}
	return pl, nil
}

// copies is the number of copies per step.
func (pl *copyPlan) copies() int { return len(pl.in) + len(pl.out) }

// layout places the persistent copies one after another, each aligned and
// taking a whole number of alignment units, and returns their offsets
// (parallel to persistent) and the bytes they span.
func (pl *copyPlan) layout() (offs []uint64, size uint64) {
	for _, id := range pl.persistent {
		offs = append(offs, size)
		size += gpu.RoundUp(uint64(pl.bufs[id].Size), pl.align)
	}
	return offs, size
}

// aliasSlack is what an aliased layout (aliasLayout) may take beyond the
// copies' own layout: each group of overlapping buffers is placed at the
// caller's offset within an alignment unit, at most one unit more, and
// there are at most half as many groups as buffers bound.
func (pl *copyPlan) aliasSlack() uint64 { return uint64(len(pl.callers)/2) * pl.align }

// callerBytes is the memory stable's aliased layouts may take: the callers'
// copies, each rounded up, and the slack.
func (pl *copyPlan) callerBytes() uint64 {
	var size uint64
	for _, id := range pl.callers {
		size += gpu.RoundUp(uint64(pl.bufs[id].Size), pl.align)
	}
	return size + pl.aliasSlack()
}

// Aliased layouts
//
// When buffers bound for a step overlap and one of them is written
// (Overlaps.Hazard), copies kept apart would compute another result than
// eager, which works in the caller's memory: an output written over a
// param would not be seen by a later read of the param. So for such a step
// each group of overlapping buffers gets one region of the copies' memory
// in which its members sit at their offsets in the caller's memory (and at
// the same offset within an alignment unit, so that kernels and libraries
// see the alignment they would see there): the body reads and writes the
// same bytes through the same aliases as eager does, the copies in bring
// the caller's bytes of every member read first, the copies out take back
// every member written (members overlapping one another carry the same
// bytes, and the copies of a step run one after another), and every byte
// outside the groups is copied as in the copies' own layout. Every bound
// buffer is in the Spec's Flow terms still read first, written, or both,
// so the flows need no change.
//
// The addresses the body holds differ from one pattern of overlaps to
// another, so each pattern has a graph of its own: the copies' own
// layout's (base), and up to maxAliasLayouts aliased ones kept per set of
// copies, least recently used evicted. In-place updates step after step
// (the same pattern) replay one graph whose copy nodes follow the caller,
// as in the steady state; a new pattern every step (partial overlaps at
// random offsets) records a graph every step, as record does.

// maxAliasLayouts bounds the aliased layouts' graphs kept per set of
// copies.
const maxAliasLayouts = 4

// copySet is one set of persistent copies and the graphs recorded over its
// layouts: stable has one, pool one per slot.
type copySet struct {
	base *slotGraph // the copies' own layout
	// area holds the aliased layouts: pool's slot memory itself, where
	// rest lays every copy out again; stable's, allocated by grow at the
	// first aliased step, holds only the overlapping groups (the other
	// copies stay in their own allocations).
	area gpu.DevicePtr
	rest bool
	grow func() (gpu.DevicePtr, error)
	// aliased are the aliased layouts' graphs, least recently used first.
	aliased []*slotGraph
	ov      Overlaps
	want    []gpu.DevicePtr // scratch: this step's aliased layout
	goff    []uint64        // scratch: each group's offset in area
}

// newSet makes a set of copies at base (parallel to persistent), whose
// aliased layouts go to area, or to the memory grow allocates at the first
// aliased step when area is 0.
func (pl *copyPlan) newSet(base []gpu.DevicePtr, area gpu.DevicePtr, rest bool, grow func() (gpu.DevicePtr, error)) *copySet {
	return &copySet{base: pl.newSlot(base), area: area, rest: rest, grow: grow, want: make([]gpu.DevicePtr, len(base))}
}

// pick returns the graph of this step's layout: base, unless the callers
// overlap with one of them written; fresh when an aliased layout was not
// seen recently and its graph is to be recorded.
func (pl *copyPlan) pick(st *base, cs *copySet, addrs []gpu.DevicePtr) (sg *slotGraph, fresh bool, err error) {
	if len(pl.callers) < 2 {
		return cs.base, false, nil
	}
	cs.ov.Find(pl.bufs, pl.callers, addrs)
	if !cs.ov.Hazard() {
		return cs.base, false, nil
	}
	if cs.area == 0 {
		a, b, _ := cs.ov.Conflict()
		if cs.area, err = cs.grow(); err != nil {
			return nil, false, fmt.Errorf("%q and %q are bound to overlapping memory: copies laid out as the caller's need memory of their own: %w",
				pl.bufs[a].Name, pl.bufs[b].Name, err)
		}
	}
	pl.aliasLayout(cs)
	for i, g := range cs.aliased {
		if slices.Equal(g.persist, cs.want) {
			copy(cs.aliased[i:], cs.aliased[i+1:])
			cs.aliased[len(cs.aliased)-1] = g
			return g, false, nil
		}
	}
	if st.log.Enabled(context.Background(), slog.LevelDebug) {
		a, b, _ := cs.ov.Conflict()
		st.log.Debug("bound buffers overlap; recording over copies laid out as the caller's",
			"buffers", []string{pl.bufs[a].Name, pl.bufs[b].Name})
	}
	return pl.newSlot(slices.Clone(cs.want)), true, nil
}

// aliasLayout lays this step's copies out in cs.area (cs.want, parallel to
// persistent) from cs.ov: each hazardous group in one region at the
// callers' relative offsets, the other copies after them (rest) or where
// they are (stable). It stays within callerBytes (stable) or the copies'
// own layout and the slack (pool): see aliasSlack.
func (pl *copyPlan) aliasLayout(cs *copySet) {
	o := &cs.ov
	const unset = ^uint64(0)
	cs.goff = slices.Grow(cs.goff[:0], len(o.groups))[:len(o.groups)]
	for i := range cs.goff {
		cs.goff[i] = unset
	}
	var cursor uint64
	for i, id := range pl.persistent {
		if sp := o.spanOf(id); sp != nil && sp.group >= 0 && o.groups[sp.group].hazardous() {
			g := &o.groups[sp.group]
			if cs.goff[sp.group] == unset {
				off := gpu.RoundUp(cursor, pl.align) + g.lo%pl.align
				cs.goff[sp.group] = off
				cursor = off + (g.hi - g.lo)
			}
			cs.want[i] = cs.area.Add(cs.goff[sp.group] + (sp.lo - g.lo))
			continue
		}
		if !cs.rest {
			cs.want[i] = cs.base.persist[i]
			continue
		}
		off := gpu.RoundUp(cursor, pl.align)
		cs.want[i] = cs.area.Add(off)
		cursor = off + uint64(pl.bufs[id].Size)
	}
}

// close destroys every graph of the set, reporting every failure.
func (pl *copyPlan) closeSet(st *base, cs *copySet) error {
	errs := []error{pl.dropExec(st, cs.base)}
	for _, g := range cs.aliased {
		errs = append(errs, pl.dropExec(st, g))
	}
	cs.aliased = nil
	return errors.Join(errs...)
}

// slotGraph is one layout of a set of persistent copies and the graph
// recorded over it.
type slotGraph struct {
	persist  []gpu.DevicePtr // parallel to copyPlan.persistent
	ext      []gpu.DevicePtr // the extended addresses of the current step
	x        *graph.Exec     // nil before the first step and after a failed update
	recorded bool            // some graph was recorded for this layout
}

func (pl *copyPlan) newSlot(persist []gpu.DevicePtr) *slotGraph {
	return &slotGraph{persist: persist, ext: make([]gpu.DevicePtr, pl.nbufs+len(pl.callers))}
}

// step runs one step on cs: it picks the layout of this step's bindings
// (the copies' own, or one laid out as the caller's overlapping buffers
// are), brings its graph to this step's caller addresses (recording it the
// first time, updating only the copy nodes after), then launches it with
// the copies, and returns the layout it ran. launched reports whether any
// of the step's work was enqueued, failed or not: the caller of a pool must
// then still mark the slot busy.
func (pl *copyPlan) step(st *base, cs *copySet, s gpu.Stream, addrs []gpu.DevicePtr) (sg *slotGraph, launched bool, err error) {
	sg, fresh, err := pl.pick(st, cs, addrs)
	if err != nil {
		return nil, false, err
	}
	if sg != cs.base {
		st.c.AliasedSteps++
	}
	ext := sg.ext
	copy(ext, addrs[:pl.nbufs])
	for i, id := range pl.persistent {
		ext[id] = sg.persist[i]
	}
	for j, id := range pl.callers {
		ext[pl.nbufs+j] = addrs[id]
	}
	if fresh && len(cs.aliased) == maxAliasLayouts {
		old := cs.aliased[0]
		cs.aliased = slices.Delete(cs.aliased, 0, 1)
		if err := pl.dropExec(st, old); err != nil {
			return nil, false, fmt.Errorf("evict an aliased layout's graph: %w", err)
		}
	}
	if err := pl.update(st, sg); err != nil {
		return nil, false, err
	}
	if fresh {
		cs.aliased = append(cs.aliased, sg)
	}
	if !pl.inGraph {
		for _, c := range pl.in {
			if err := st.b.MemcpyDtoDAsync(ext[c.dst], ext[c.src], c.size, s); err != nil {
				return sg, launched, fmt.Errorf("%s: %w", c.name, err)
			}
			launched = true
			st.c.Launches++
		}
	}
	if err := sg.x.Launch(st.b, s); err != nil {
		return sg, launched, err
	}
	launched = true
	st.c.GraphLaunches++
	if !pl.inGraph {
		for _, c := range pl.out {
			if err := st.b.MemcpyDtoDAsync(ext[c.dst], ext[c.src], c.size, s); err != nil {
				return sg, launched, fmt.Errorf("%s: %w", c.name, err)
			}
			st.c.Launches++
		}
	}
	st.c.BytesCopied += pl.bytes
	return sg, launched, nil
}

// update brings sg's graph to sg.ext: records it the first time, after a
// failed step dropped it, or when a buffer of the body moved (a state
// rebound with BindState), and otherwise updates the copy nodes of the
// caller's buffers that moved. A refused node update is replaced by a
// record, as in patch.
func (pl *copyPlan) update(st *base, sg *slotGraph) error {
	if sg.x == nil {
		return pl.record(st, sg, causeRetry, nil)
	}
	prev := sg.x.Addrs()
	if !slices.Equal(prev[:pl.nbufs], sg.ext[:pl.nbufs]) {
		return pl.record(st, sg, causeMoved, nil)
	}
	if !pl.inGraph || slices.Equal(prev[pl.nbufs:], sg.ext[pl.nbufs:]) {
		return nil
	}
	// Only caller addresses moved, and only copy nodes reference them:
	// every node Patch updates is a copy node.
	n, err := pl.cb.Patch(st.b, sg.x, sg.ext)
	if err == nil {
		st.c.CopyNodeUpdates += int64(n)
		return nil
	}
	derr := pl.dropExec(st, sg)
	if !errors.Is(err, gpu.ErrGraphUpdate) || derr != nil {
		return errors.Join(err, derr)
	}
	st.refused("copy node update", err)
	return pl.record(st, sg, causeRefused, err)
}

// record records and instantiates sg's graph at sg.ext, replacing the old
// one only once the new one exists; a record of a layout recorded before
// is a re-record for cause (refusal: the refused update). Traced commands
// are captured, not traced for patching: the body's addresses do not move.
func (pl *copyPlan) record(st *base, sg *slotGraph, cause recordCause, refusal error) error {
	x, err := pl.cb.Instantiate(st.b, sg.ext, false)
	if err != nil {
		return err
	}
	st.countRecord(sg.recorded, cause, refusal)
	sg.recorded = true
	err = pl.dropExec(st, sg)
	sg.x = x
	return err
}

func (pl *copyPlan) dropExec(st *base, sg *slotGraph) error {
	if sg.x == nil {
		return nil
	}
	err := sg.x.Destroy(st.b)
	sg.x = nil
	return err
}

// model prices the plan's copies under c: each copy's GPU time, and in a
// graph one copy node update per copy when the caller's buffers move.
func (pl *copyPlan) model(c Costs) (us float64, note string) {
	for _, cs := range pl.in {
		us += c.copyUS(cs.size)
	}
	for _, cs := range pl.out {
		us += c.copyUS(cs.size)
	}
	if pl.inGraph {
		us += float64(pl.copies()) * c.NodeUpdateUS
	}
	return us, fmt.Sprintf("%d copies of %d bytes in all", pl.copies(), pl.bytes)
}
