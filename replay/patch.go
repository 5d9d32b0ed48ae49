package replay

import (
	"context"
	"errors"
	"fmt"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/graph"
)

// patch rewrites in place only the nodes whose buffers moved, with
// per-node exec parameter updates; traced nodes move through their child
// graph. Which nodes to update is the command buffer's patch table: for
// each buffer, the commands that reference it, each node's pointer words
// rewritten in parameters prepared once (see graph.CommandBuffer.Patch,
// and package internal/trace for traced commands). When many nodes of a small graph
// move, one whole-graph update from the host template costs less than an
// update per node, and patch takes it (graph.CommandBuffer.PatchWhole):
// each step it prices both with Options.Costs (wholeCheaper). When the
// driver refuses an update, patch records the graph afresh.
type patch struct {
	recorded
	costs Costs
	// whole: the backend can set a graph's nodes in place, so whole-graph
	// updates from the template are tried when they are cheaper.
	whole bool
}

func newPatch(spec Spec) (Strategy, error) {
	_, err := gpu.GraphNodeSetterOf(spec.Backend)
	return &patch{recorded: recorded{base: newBase(spec), patchable: true}, costs: spec.Options.Costs, whole: err == nil}, nil
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
	// The per-node updates first: when they cost less than the update of
	// the whole graph alone, the template is not asked.
	if st.whole && float64(st.cb.MovedNodes(st.x, addrs))*st.costs.NodeUpdateUS > st.costs.wholeUS(graph.Whole{Graph: st.x.GraphNodes()}) {
		if w := st.cb.WholeCounts(st.x, addrs); w.Why == "" && st.costs.wholeCheaper(w) {
			if _, err := st.cb.PatchWhole(st.b, st.x, addrs); err != nil {
				return err
			}
			st.c.GraphUpdates++
			st.c.PatchedNodes += int64(w.Nodes)
			return nil
		}
	}
	n, err := st.cb.Patch(st.b, st.x, addrs)
	if err != nil {
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
	c := spec.Options.Costs
	m := spec.Commands.Moves(spec.bound())
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
