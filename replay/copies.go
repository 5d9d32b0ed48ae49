package replay

import (
	"errors"
	"fmt"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/graph"
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
	pl := &copyPlan{nbufs: len(spec.Buffers), inGraph: inGraph}
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

// layout places the persistent copies one after another, each aligned, and
// returns their offsets (parallel to persistent) and the bytes they span.
func (pl *copyPlan) layout(bufs []Buffer, align uint64) (offs []uint64, size uint64) {
	for _, id := range pl.persistent {
		off := gpu.RoundUp(size, align)
		offs = append(offs, off)
		size = off + uint64(bufs[id].Size)
	}
	return offs, size
}

// slotGraph is one set of persistent copies and the graph recorded over
// them: stable has one, pool one per slot.
type slotGraph struct {
	persist  []gpu.DevicePtr // parallel to copyPlan.persistent
	ext      []gpu.DevicePtr // the extended addresses of the current step
	x        *graph.Exec     // nil before the first step and after a failed update
	recorded bool            // some graph was recorded for this slot
}

func (pl *copyPlan) newSlot(persist []gpu.DevicePtr) *slotGraph {
	return &slotGraph{persist: persist, ext: make([]gpu.DevicePtr, pl.nbufs+len(pl.callers))}
}

// step runs one step on sg: it brings sg's graph to this step's caller
// addresses (recording it the first time, updating only the copy nodes
// after), then launches it with the copies. launched reports whether any of
// the step's work was enqueued, failed or not: the caller of a pool must
// then still mark the slot busy.
func (pl *copyPlan) step(st *base, sg *slotGraph, s gpu.Stream, addrs []gpu.DevicePtr) (launched bool, err error) {
	ext := sg.ext
	copy(ext, addrs[:pl.nbufs])
	for i, id := range pl.persistent {
		ext[id] = sg.persist[i]
	}
	for j, id := range pl.callers {
		ext[pl.nbufs+j] = addrs[id]
	}
	if err := pl.update(st, sg); err != nil {
		return false, err
	}
	if !pl.inGraph {
		for _, c := range pl.in {
			if err := st.b.MemcpyDtoDAsync(ext[c.dst], ext[c.src], c.size, s); err != nil {
				return launched, fmt.Errorf("%s: %w", c.name, err)
			}
			launched = true
			st.c.Launches++
		}
	}
	if err := sg.x.Launch(st.b, s); err != nil {
		return launched, err
	}
	launched = true
	st.c.GraphLaunches++
	if !pl.inGraph {
		for _, c := range pl.out {
			if err := st.b.MemcpyDtoDAsync(ext[c.dst], ext[c.src], c.size, s); err != nil {
				return launched, fmt.Errorf("%s: %w", c.name, err)
			}
			st.c.Launches++
		}
	}
	st.c.BytesCopied += pl.bytes
	return launched, nil
}

// update brings sg's graph to sg.ext: records it the first time or when a
// buffer of the body moved (a state rebound with BindState), and otherwise
// updates the copy nodes of the caller's buffers that moved. A refused node
// update is replaced by a record, as in patch.
func (pl *copyPlan) update(st *base, sg *slotGraph) error {
	if sg.x == nil {
		return pl.record(st, sg)
	}
	prev := sg.x.Addrs()
	if !slices.Equal(prev[:pl.nbufs], sg.ext[:pl.nbufs]) {
		return pl.record(st, sg)
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
	st.c.UpdateFallbacks++
	st.log.Debug("copy node update refused; re-recording", "reason", err)
	return pl.record(st, sg)
}

// record records and instantiates sg's graph at sg.ext, replacing the old
// one only once the new one exists. Traced commands are captured, not
// traced for patching: the body's addresses do not move.
func (pl *copyPlan) record(st *base, sg *slotGraph) error {
	x, err := pl.cb.Instantiate(st.b, sg.ext, false)
	if err != nil {
		return err
	}
	if sg.recorded {
		st.c.Rerecords++
		st.log.Debug("re-recorded a persistent-address graph")
	}
	sg.recorded = true
	st.c.Records++
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
