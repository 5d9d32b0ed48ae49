package graph

import (
	"fmt"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/trace"
)

// Whole-graph updates from a host template (PatchWhole).
//
// An exec keeps the graph it was instantiated from (per-node updates name
// its nodes). That graph is also a host template of the exec: setting the
// parameters of its nodes (gpu.GraphNodeSetter; for kernel nodes, the
// prepared set's ApplyGraph) changes nothing on the device, and one
// GraphExecUpdate from it then gives the exec every node's parameters at
// once, with no capture and no new recording. Against per-node updates
// (Patch), that trades one driver call per moved node for one host-side set
// per node of the template that moved and one whole-graph update, whose
// cost grows with the graph: it wins when many of a small graph's nodes
// move (WholeCounts gives the counts a caller prices the two by).
//
// The template holds the addresses the exec was recorded at until the first
// whole-graph update, and those of the last one after: per-node updates
// change the exec, never the template. A whole-graph update therefore sets
// on the template every node whose buffers are not where the template holds
// them (which may be more than the nodes that moved since the last step),
// so that the update takes every node to the new addresses; it brings the
// prepared set and the flattened commands' parameters to them too, for the
// per-node updates that may follow.

// template is the host template's state.
type template struct {
	addrs []gpu.DevicePtr // the addresses its nodes hold; nil: none (device execs)
	nodes int             // the graph's nodes
	// broken says why the template no longer describes the exec at its
	// addresses: a flattened command moved to another alignment class
	// (its nodes are another trace's), a whole-graph Update from another
	// recording. "" while it does.
	broken string
	dirty  []int32 // scratch
}

func newTemplate(r recording, addrs []gpu.DevicePtr) template {
	n := 0
	for i := range r.nodes {
		if fc := r.flat[i]; fc != nil {
			n += len(fc.nodes)
		} else {
			n++
		}
	}
	return template{addrs: slices.Clone(addrs), nodes: n}
}

// Whole is what WholeCounts finds: the ways Patch and PatchWhole would
// bring an exec to new addresses, in nodes.
type Whole struct {
	// Nodes is the nodes Patch would update (a flattened command counts
	// every node its template moves, an upper bound).
	Nodes int
	// Template is the template's nodes PatchWhole would set, and Graph
	// the nodes of the graph its update applies.
	Template, Graph int
	// Why says why PatchWhole cannot be used; "" when it can.
	Why string
}

// GraphNodes is the number of nodes of x's graph: what a whole-graph update
// of it applies.
func (x *Exec) GraphNodes() int { return x.tmpl.nodes }

// WholeCounts counts, without changing anything, what Patch and PatchWhole
// would update to bring x to addrs.
func (cb *CommandBuffer) WholeCounts(x *Exec, addrs []gpu.DevicePtr) Whole {
	w := Whole{Graph: x.tmpl.nodes}
	x.dirty = x.markAgainst(x.dirty[:0], x.addrs, cb.used, cb.byBuf, addrs)
	for _, i := range x.dirty {
		w.Nodes += cb.movedNodes(x, i)
	}
	switch {
	case x.tmpl.addrs == nil || x.dev != nil:
		w.Why = "the exec has no host template"
		return w
	case x.tmpl.broken != "":
		w.Why = x.tmpl.broken
		return w
	}
	x.tmpl.dirty = x.markAgainst(x.tmpl.dirty[:0], x.tmpl.addrs, cb.used, cb.byBuf, addrs)
	for _, i := range x.tmpl.dirty {
		c := &cb.cmds[i]
		if c.Kind == KindTraced {
			fc := x.flatAt(i)
			if fc == nil || fc.tmpl == nil {
				w.Why = c.Name + " is a child graph, or flattened without a template"
				return w
			}
			x.key = c.operandAddrs(addrs, x.key)
			if cb.tr.TemplateFor(c.Trace, x.key) != fc.tmpl {
				w.Why = c.Name + " moves to another alignment class"
				return w
			}
		}
		w.Template += cb.movedNodes(x, i)
	}
	// The exec's moved commands must stay in their class too, for their
	// parameters to follow (those the template moves were checked above).
	for _, i := range x.dirty {
		c := &cb.cmds[i]
		if fc := x.flatAt(i); c.Kind == KindTraced && fc != nil && fc.tmpl != nil && x.mark[i] != x.gen {
			x.key = c.operandAddrs(addrs, x.key)
			if cb.tr.TemplateFor(c.Trace, x.key) != fc.tmpl {
				w.Why = c.Name + " moves to another alignment class"
				return w
			}
		}
	}
	return w
}

// movedNodes is how many nodes of command i move with its buffers: one, or
// for a flattened command the nodes with a template slot (all of them
// without a template).
func (cb *CommandBuffer) movedNodes(x *Exec, i int32) int {
	fc := x.flatAt(i)
	if cb.cmds[i].Kind != KindTraced || fc == nil {
		return 1
	}
	if fc.tmpl == nil {
		return len(fc.params)
	}
	n := 0
	for j := range fc.params {
		if len(fc.tmpl.SlotsOf(j)) > 0 {
			n++
		}
	}
	return n
}

// PatchWhole brings x to addrs with one whole-graph update from its host
// template (see above) and returns how many of the template's nodes it set.
// x must come from Instantiate with patch set; b must set graph nodes in
// place (gpu.GraphNodeSetter), else the error wraps gpu.ErrNotSupported and
// nothing changed. A traced command the template cannot move (a child graph,
// a new alignment class) is refused the same way: use Patch. On any other
// error x is in an unknown state and must be destroyed; one wrapping
// gpu.ErrGraphUpdate means the driver refused the update and recording again
// will succeed.
func (cb *CommandBuffer) PatchWhole(b gpu.Backend, x *Exec, addrs []gpu.DevicePtr) (int, error) {
	if w := cb.WholeCounts(x, addrs); w.Why != "" {
		return 0, gpu.Errorf("graph.PatchWhole", gpu.ErrNotSupported, "%s", w.Why)
	}
	gs, err := gpu.GraphNodeSetterOf(b)
	if err != nil {
		return 0, err
	}
	hs, err := x.preparedSet(b, cb, nil)
	if err != nil {
		return 0, fmt.Errorf("patch whole: %w", err)
	}
	// The template's moved commands (the last WholeCounts left them in
	// x.tmpl.dirty, marked with the generation after the exec's).
	tdirty := x.tmpl.dirty
	tgen := x.gen
	onTemplate := hs.apply[:0]
	set := 0
	for _, i := range tdirty {
		c := &cb.cmds[i]
		var err error
		switch c.Kind {
		case KindKernel:
			var k int32
			if k, err = hs.writeKernel(c, i, x.addrs, addrs); err == nil {
				onTemplate = append(onTemplate, k)
			}
			set++
		case KindMemcpy, KindMemset:
			switch m := x.madeAt(i); {
			case m != devNone:
				var k int32
				if k, err = hs.writeMade(c, i, m, x.Nodes[i], addrs); err == nil {
					onTemplate = append(onTemplate, k)
				}
			case c.Kind == KindMemcpy:
				err = gs.GraphMemcpyNodeSetParams(x.Nodes[i], c.memcpyParams(addrs))
			default:
				err = gs.GraphMemsetNodeSetParams(x.Nodes[i], c.memsetParams(addrs))
			}
			set++
		case KindTraced:
			fc := x.flatAt(i)
			x.key = c.operandAddrs(addrs, x.key)
			x.changed = fc.tmpl.Apply(fc.params, x.key, x.changed[:0])
			cb.tr.Moved(c.Trace)
			for j := range fc.params {
				if len(fc.tmpl.SlotsOf(j)) == 0 {
					continue
				}
				var k int32
				var ok bool
				if k, ok, err = hs.writeFlat(i, j, fc, x.key); err != nil {
					break
				}
				if ok {
					onTemplate = append(onTemplate, k)
				} else if err = setGraphNode(gs, fc.nodes[j], &fc.params[j]); err != nil {
					break
				}
				set++
			}
		}
		if err != nil {
			hs.apply = onTemplate[:0]
			return 0, fmt.Errorf("patch whole: %s: %w", c.Name, err)
		}
	}
	// The exec's moved commands that the template already holds at addrs:
	// the update gives the exec their parameters; the set and the
	// flattened parameters follow.
	for _, i := range x.dirty {
		if x.mark[i] == tgen {
			continue // done above
		}
		c := &cb.cmds[i]
		var err error
		switch c.Kind {
		case KindKernel:
			_, err = hs.writeKernel(c, i, x.addrs, addrs)
		case KindMemcpy, KindMemset:
			if m := x.madeAt(i); m != devNone {
				_, err = hs.writeMade(c, i, m, x.Nodes[i], addrs)
			}
		case KindTraced:
			if fc := x.flatAt(i); fc != nil && fc.tmpl != nil {
				x.key = c.operandAddrs(addrs, x.key)
				x.changed = fc.tmpl.Apply(fc.params, x.key, x.changed[:0])
				for _, j := range x.changed {
					if _, _, err = hs.writeFlat(i, j, fc, x.key); err != nil {
						break
					}
				}
			}
		}
		if err != nil {
			hs.apply = onTemplate[:0]
			return 0, fmt.Errorf("patch whole: %s: %w", c.Name, err)
		}
	}
	k, err := hs.set.ApplyGraph(onTemplate)
	hs.apply = onTemplate[:0]
	if err != nil {
		return 0, fmt.Errorf("patch whole: set %s on the template: %w", hs.name(cb, onTemplate, k), err)
	}
	if err := b.GraphExecUpdate(x.X, x.Graph); err != nil {
		return 0, fmt.Errorf("patch whole: graph exec update from the template: %w", err)
	}
	copy(x.tmpl.addrs, addrs)
	copy(x.addrs, addrs)
	return set, nil
}

// setGraphNode sets p on node n of a graph (not an exec).
func setGraphNode(gs gpu.GraphNodeSetter, n gpu.GraphNode, p *trace.Node) error {
	switch p.Type {
	case gpu.NodeKernel:
		return gs.GraphKernelNodeSetParams(n, p.Kernel)
	case gpu.NodeMemcpy:
		return gs.GraphMemcpyNodeSetParams(n, p.Memcpy)
	case gpu.NodeMemset:
		return gs.GraphMemsetNodeSetParams(n, p.Memset)
	}
	return nil
}
