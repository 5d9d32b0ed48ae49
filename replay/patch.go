package replay

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/graph"
	"github.com/stablegraph/stablegraph/kernels"
)

// patch rewrites in place only the nodes whose buffers moved, with
// per-node exec parameter updates; traced nodes move through their child
// graph. Which nodes to update is the command buffer's patch table: for
// each buffer, the commands that reference it (graph.CommandBuffer.Patch,
// and package internal/trace for traced commands). When the driver refuses
// an update, patch records the graph afresh. It has no options of its own
// (Spec.Costs prices its updates).
//
// # The host side of a moving step
//
// A decode loop waits for each step before the next, so what a step costs
// the host is latency the user sees. Patch pays the driver's own price and
// next to nothing of its own: the nodes it moves are prepared once as a
// gpu.KernelNodeSet (the parameters checked and packed in the driver's
// form at the first move), a step rewrites in place only the pointer words
// into buffers that moved (a decode step's attention kernel keeps its
// pointers to weights and activations, and only those into the caches it
// swapped are written), and one Apply hands them to the driver, one call
// per node, the context made current once (internal/graph/hostset.go).
// Nothing is allocated per step, on sim or CUDA (TestStubStepAllocatesNothing
// in package gpu/cuda runs whole executables over a stubbed driver). When
// many nodes of a small graph move, one whole-graph update from the host
// template (the graph the exec was made from, its nodes set in place,
// internal/graph/whole.go) costs less than an update per node: each step
// patch prices both with Spec.Costs and takes the cheaper (move,
// wholeCheaper). stablegraph bench-driver measures the driver's prices,
// and bench sets every strategy's host time per moved node beside them.
//
// A memcpy or memset over a bound buffer is recorded as a copy or fill
// kernel of package kernels where its size and addresses are whole 4-byte
// elements (boundCopies, graph.InstantiateOptions), as device records one:
// the driver charges an exec update of a copy or memset node several times
// what it charges for a small kernel node, and the kernels copy and fill
// bit for bit. A move off 4-byte alignment is refused and recorded again,
// the command then a copy or memset node.
//
// # What it counts
//
// PatchedNodes (the nodes moved, traced nodes included), GraphUpdates (the
// steps moved by one whole-graph update from the template), a refused
// update as a re-record (UpdateFallbacks, and Stats.Fallbacks says why), a step
// after a failed one as a re-record for a retry (RetryRerecords);
// GraphLaunches.
type patch struct {
	callerGraph
	costs Costs
	// whole: the backend can set a graph's nodes in place, so whole-graph
	// updates from the template are tried when they are cheaper.
	whole bool
}

func newPatch(spec Spec) (Strategy, error) {
	_, err := gpu.GraphNodeSetterOf(spec.Backend)
	return &patch{callerGraph: callerGraph{base: newBase(spec), patchable: true, copies: boundCopies(spec)},
		costs: spec.Costs, whole: err == nil}, nil
}

// boundCopies are the copy and fill kernels patch records a memcpy or
// memset over a bound buffer as (graph.InstantiateOptions), or none when
// the executable has none loaded: a kernel node moves for one small exec
// update, where the driver charges a copy or memset node's several times
// as much (BENCHMARKS.md, section 0).
func boundCopies(spec Spec) graph.InstantiateOptions {
	if spec.Kernels == nil {
		return graph.InstantiateOptions{}
	}
	o := graph.InstantiateOptions{Movable: make([]bool, len(spec.Buffers))}
	for _, i := range spec.classes.Bound {
		o.Movable[i] = true
	}
	if f, err := spec.Kernels(kernels.Copy); err == nil {
		o.Copy = f
	}
	if f, err := spec.Kernels(kernels.Fill); err == nil {
		o.Fill = f
	}
	return o
}

func (st *patch) Run(_ context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (Result, error) {
	switch {
	case st.x == nil:
		// The first step, or a failed step dropped the graph.
		if err := st.record(addrs, causeRetry, nil); err != nil {
			return Result{}, err
		}
	case st.cb.Moved(st.x.Addrs(), addrs):
		err := st.move(addrs)
		if err == nil {
			break
		}
		// Some nodes may be patched and others not: the exec graph is
		// no longer consistent with any address set.
		derr := st.dropExec()
		if errors.Is(err, gpu.ErrNotSupported) && derr == nil {
			// The template could not take the move after all: per-node
			// updates from now on.
			st.whole = false
			err = &gpu.UpdateError{Op: "replay.patch", Result: gpu.UpdateNotSupported, Detail: err.Error()}
		}
		if !errors.Is(err, gpu.ErrGraphUpdate) || derr != nil {
			return Result{}, errors.Join(err, derr)
		}
		st.refused("node update", err)
		if rerr := st.record(addrs, causeRefused, err); rerr != nil {
			return Result{}, rerr
		}
	}
	return Result{}, st.launch(s)
}

// move brings the exec graph to addrs: per node, or with one whole-graph
// update from the template when that is priced cheaper.
func (st *patch) move(addrs []gpu.DevicePtr) error {
	// The per-node updates, unless they would cost more than the update
	// of the whole graph alone: only then is the template asked.
	most := math.MaxInt
	if st.whole {
		most = st.costs.perNodeAtMost(st.x.GraphNodes())
	}
	n, patched, err := st.cb.PatchAtMost(st.b, st.x, addrs, most)
	if err != nil {
		return err
	}
	if patched {
		st.c.PatchedNodes += int64(n)
		return nil
	}
	if w := st.cb.WholeCounts(st.x, addrs); w.Why == "" && st.costs.wholeCheaper(w) {
		if _, err := st.cb.PatchWhole(st.b, st.x, addrs); err != nil {
			return err
		}
		st.c.GraphUpdates++
		st.c.PatchedNodes += int64(w.Nodes)
		return nil
	}
	if n, err = st.cb.Patch(st.b, st.x, addrs); err != nil {
		return err
	}
	st.c.PatchedNodes += int64(n)
	return nil
}

// WarmUp: patch records at its first step and proves its trace templates
// at the first move, the second step.
func (st *patch) WarmUp() int { return 2 }

// modelPatch prices a step in which every param and output moves: one
// node update per node using them (a flattened GEMM's kernel nodes
// included: graph.Moves), a traced command that does not flatten costing
// more.
func modelPatch(spec Spec) Candidate {
	c := spec.Costs
	m := spec.Commands.Moves(spec.classes.Bound)
	cand := Candidate{
		Strategy: Patch, Usable: true,
		StepUS: float64(m.Nodes)*c.NodeUpdateUS + float64(m.Traced)*c.TracedUpdateUS,
		Note:   fmt.Sprintf("%d nodes to patch, %d traced commands", m.Nodes, m.Traced),
	}
	// The graph has about a node per command (a GEMM's one, graph.Moves).
	w := graph.Whole{Nodes: m.Nodes, Template: m.Nodes, Graph: spec.Commands.Len()}
	if _, err := gpu.GraphNodeSetterOf(spec.Backend); err == nil && m.Traced == 0 && c.wholeCheaper(w) {
		cand.StepUS = c.wholeUS(w)
		cand.Note = fmt.Sprintf("%d nodes set on the host template and one whole-graph update of about %d nodes", m.Nodes, w.Graph)
	}
	return cand
}
