package replay

import (
	"context"
	"errors"
	"fmt"

	"github.com/stablegraph/stablegraph/gpu"
)

// patch rewrites in place only the nodes whose buffers moved, with
// per-node exec parameter updates; traced nodes move through their child
// graph. Which nodes to update is the command buffer's patch table: for
// each buffer, the commands that reference it, each node's parameters
// rebuilt from its typed arguments at the new addresses (see
// graph.CommandBuffer.Patch, and package trace for traced commands). When
// the driver refuses an update, patch records the graph afresh.
type patch struct{ recorded }

func newPatch(spec Spec) (Strategy, error) {
	return &patch{recorded{base: newBase(spec), patchable: true}}, nil
}

func (st *patch) Run(_ context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (Result, error) {
	switch {
	case st.x == nil:
		// The first step, or a failed step dropped the graph.
		if err := st.record(addrs, causeRetry, nil); err != nil {
			return Result{}, err
		}
	case st.cb.Moved(st.x.Addrs(), addrs):
		n, err := st.cb.Patch(st.b, st.x, addrs)
		if err == nil {
			st.c.PatchedNodes += int64(n)
			break
		}
		// Some nodes may be patched and others not: the exec graph is
		// no longer consistent with any address set.
		derr := st.dropExec()
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
	return Candidate{
		Strategy: Patch, Usable: true,
		StepUS: float64(m.Nodes)*c.NodeUpdateUS + float64(m.Traced)*c.TracedUpdateUS,
		Note:   fmt.Sprintf("%d nodes to patch, %d traced commands", m.Nodes, m.Traced),
	}
}
