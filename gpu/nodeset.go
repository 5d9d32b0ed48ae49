package gpu

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// Kernel node sets: the hot path of a step whose buffers moved.
//
// Moving a recorded step to new addresses rewrites the pointer arguments of
// some of its kernel nodes. Through GraphExecKernelNodeSetParams every such
// update carries the node's whole argument list, which the backend checks,
// packs into the driver's form and hands over with the context made
// current, one node at a time. A KernelNodeSet does that work once: the
// nodes' parameters are checked and packed when the set is prepared, a step
// rewrites in place only the 8-byte words that moved (SetWord), and Apply
// hands every node of the step to the driver in one pass, one driver call
// per node. What a node holds on the device changes only at Apply (or, for
// the graph the exec was made from, ApplyGraph).

// KernelNodeSet is a fixed set of kernel nodes of one executable graph
// whose parameters the set holds, packed. It is used under the graph rule
// (see Graphs): not from two goroutines at once, nor while another call
// uses its exec or graph.
type KernelNodeSet interface {
	// Len is the number of nodes, indexed from 0 in the order prepared.
	Len() int
	// SetWord writes v into the 8 bytes at byte off of argument arg of
	// node i, in the set only. A typed argument takes off 0 and must be
	// of an 8-byte kind (a pointer); an opaque one (ArgBytes) any off
	// with 8 bytes left. Anything else is ErrInvalidValue and changes
	// nothing.
	SetWord(i, arg, off int, v uint64) error
	// SetArgs replaces node i's arguments in the set, of the same kinds as
	// those prepared (opaque ones of any size).
	SetArgs(i int, args []Arg) error
	// Apply sets, on the exec graph, the parameters the set holds for the
	// nodes idx, in order, as GraphExecKernelNodeSetParams would (the
	// same refusals, as *UpdateError), and returns how many it set: on
	// error, idx[n] is the node that failed, those before it are set and
	// the rest are not. An index out of range is ErrInvalidValue before
	// anything is set.
	Apply(idx []int32) (n int, err error)
	// ApplyGraph sets them on the graph the exec was instantiated from,
	// so that a whole-graph update from it (GraphExecUpdate) carries
	// them: a host template of the exec. ErrNotSupported when the
	// backend cannot set a node of a graph in place (GraphNodeSetter).
	ApplyGraph(idx []int32) (n int, err error)
	// Close releases the set; it is idempotent. The exec and its graph
	// are not touched.
	Close() error
}

// KernelNodeSets is the optional capability of a backend that prepares
// kernel node sets itself (CUDA: parameters packed in the driver's form,
// one context switch per Apply, one driver call per node). Without it,
// PrepareKernelNodes gives a set that calls GraphExecKernelNodeSetParams
// per node: the same semantics.
type KernelNodeSets interface {
	// PrepareKernelNodes makes a set of nodes (kernel nodes of the graph
	// x was instantiated from) holding params (one per node; of the
	// node's own function, device and launch shape). Nothing is set on
	// the exec until Apply.
	PrepareKernelNodes(x GraphExec, nodes []GraphNode, params []KernelParams) (KernelNodeSet, error)
}

// KernelNodeWords is the optional capability of a KernelNodeSet that holds
// its nodes' arguments as 8-byte words in host memory of its own (CUDA's
// set, and PrepareKernelNodes' own for typed arguments). Word returns the
// word SetWord(i, arg, off, v) would write, for the caller to write in its
// place with no call and no check: a moving step writes its pointers
// through words found once, when the set was prepared, touching only the
// memory the driver reads next. The word stays the node's until the set is
// closed or SetArgs lays the node out anew. A word SetWord refuses, or one
// the set holds at no 8-byte boundary (an opaque argument's unaligned
// bytes), is ErrInvalidValue: write it with SetWord.
type KernelNodeWords interface {
	Word(i, arg, off int) (*uint64, error)
}

// GraphNodeSetter is the optional capability of a backend that can change
// the parameters of a node of a graph (not of an exec) in place, as CUDA's
// cuGraphKernelNodeSetParams does: a graph kept as the host template of an
// exec is brought to new addresses this way and applied with one
// GraphExecUpdate, without a new recording.
type GraphNodeSetter interface {
	GraphKernelNodeSetParams(n GraphNode, p KernelParams) error
	GraphMemcpyNodeSetParams(n GraphNode, p MemcpyParams) error
	GraphMemsetNodeSetParams(n GraphNode, p Memset) error
}

// GraphNodeSetterOf returns b's GraphNodeSetter, or an error wrapping
// ErrNotSupported: whole-graph updates then need a new recording.
func GraphNodeSetterOf(b Backend) (GraphNodeSetter, error) {
	if s, ok := b.(GraphNodeSetter); ok {
		return s, nil
	}
	return nil, &Error{Op: "GraphNodeSetterOf", Err: ErrNotSupported,
		Detail: fmt.Sprintf("backend %s cannot set the parameters of a graph's node in place", b.Name())}
}

// ExecKernelNodeSetter is the part of a backend a kernel node set without
// KernelNodeSets calls.
type ExecKernelNodeSetter interface {
	GraphExecKernelNodeSetParams(x GraphExec, n GraphNode, p KernelParams) error
}

// PrepareKernelNodes returns a set over nodes of x holding params: b's own
// (KernelNodeSets) when it has one, else one that keeps copies of params
// and calls b per node (and, for ApplyGraph, b's GraphNodeSetter).
func PrepareKernelNodes(b ExecKernelNodeSetter, x GraphExec, nodes []GraphNode, params []KernelParams) (KernelNodeSet, error) {
	if len(nodes) != len(params) {
		return nil, Errorf("PrepareKernelNodes", ErrInvalidValue, "%d nodes and %d parameter sets", len(nodes), len(params))
	}
	if s, ok := b.(KernelNodeSets); ok {
		return s.PrepareKernelNodes(x, nodes, params)
	}
	set := &nodeSet{b: b, x: x, nodes: slices.Clone(nodes), params: make([]KernelParams, len(params))}
	for i, p := range params {
		set.params[i] = KernelParams{Func: p.Func, Config: p.Config, Args: cloneArgs(p.Args)}
	}
	return set, nil
}

func cloneArgs(args []Arg) []Arg {
	out := slices.Clone(args)
	for i := range out {
		if out[i].Kind == ArgBytes {
			out[i].Raw = slices.Clone(out[i].Raw)
		}
	}
	return out
}

// nodeSet is PrepareKernelNodes' set for a backend without KernelNodeSets.
type nodeSet struct {
	b      ExecKernelNodeSetter
	x      GraphExec
	nodes  []GraphNode
	params []KernelParams
}

func (s *nodeSet) Len() int { return len(s.nodes) }

func (s *nodeSet) SetWord(i, arg, off int, v uint64) error {
	if i < 0 || i >= len(s.params) || arg < 0 || arg >= len(s.params[i].Args) {
		return Errorf("KernelNodeSet.SetWord", ErrInvalidValue, "node %d argument %d out of range", i, arg)
	}
	a := &s.params[i].Args[arg]
	return SetArgWord(a, off, v)
}

// SetArgWord writes v into the 8 bytes at byte off of a, as
// KernelNodeSet.SetWord does.
func SetArgWord(a *Arg, off int, v uint64) error {
	switch {
	case a.Kind == ArgBytes && off >= 0 && off+8 <= len(a.Raw):
		binary.LittleEndian.PutUint64(a.Raw[off:], v)
	case a.Kind != ArgBytes && off == 0 && a.Kind.Size() == 8:
		a.Bits = v
	default:
		return Errorf("KernelNodeSet.SetWord", ErrInvalidValue, "no 8-byte word at byte %d of a %s argument of %d bytes", off, a.Kind, a.Size())
	}
	return nil
}

// Word implements KernelNodeWords for a typed pointer-sized argument; an
// opaque one's bytes are no aligned word of the set's.
func (s *nodeSet) Word(i, arg, off int) (*uint64, error) {
	if i < 0 || i >= len(s.params) || arg < 0 || arg >= len(s.params[i].Args) {
		return nil, Errorf("KernelNodeSet.Word", ErrInvalidValue, "node %d argument %d out of range", i, arg)
	}
	a := &s.params[i].Args[arg]
	if a.Kind == ArgBytes || off != 0 || a.Kind.Size() != 8 {
		return nil, Errorf("KernelNodeSet.Word", ErrInvalidValue, "no word of the set's at byte %d of a %s argument", off, a.Kind)
	}
	return &a.Bits, nil
}

func (s *nodeSet) SetArgs(i int, args []Arg) error {
	if i < 0 || i >= len(s.params) {
		return Errorf("KernelNodeSet.SetArgs", ErrInvalidValue, "node %d out of range", i)
	}
	if err := sameKinds(s.params[i].Args, args); err != nil {
		return err
	}
	s.params[i].Args = cloneArgs(args)
	return nil
}

// sameKinds checks that args are of the kinds of prepared, as
// KernelNodeSet.SetArgs requires.
func sameKinds(prepared, args []Arg) error {
	if len(args) != len(prepared) {
		return Errorf("KernelNodeSet.SetArgs", ErrInvalidValue, "%d arguments, the node was prepared with %d", len(args), len(prepared))
	}
	for j := range args {
		if args[j].Kind != prepared[j].Kind {
			return Errorf("KernelNodeSet.SetArgs", ErrInvalidValue, "argument %d is %s, prepared as %s", j, args[j].Kind, prepared[j].Kind)
		}
	}
	return nil
}

// inRange refuses, before anything is set, a node out of range.
func (s *nodeSet) inRange(op string, idx []int32) error {
	for _, i := range idx {
		if i < 0 || int(i) >= len(s.nodes) {
			return Errorf(op, ErrInvalidValue, "node %d out of range", i)
		}
	}
	return nil
}

func (s *nodeSet) Apply(idx []int32) (int, error) {
	if err := s.inRange("KernelNodeSet.Apply", idx); err != nil {
		return 0, err
	}
	for k, i := range idx {
		if err := s.b.GraphExecKernelNodeSetParams(s.x, s.nodes[i], s.params[i]); err != nil {
			return k, err
		}
	}
	return len(idx), nil
}

func (s *nodeSet) ApplyGraph(idx []int32) (int, error) {
	gs, ok := s.b.(GraphNodeSetter)
	if !ok {
		return 0, Errorf("KernelNodeSet.ApplyGraph", ErrNotSupported, "the backend cannot set the parameters of a graph's node in place")
	}
	if err := s.inRange("KernelNodeSet.ApplyGraph", idx); err != nil {
		return 0, err
	}
	for k, i := range idx {
		if err := gs.GraphKernelNodeSetParams(s.nodes[i], s.params[i]); err != nil {
			return k, err
		}
	}
	return len(idx), nil
}

func (s *nodeSet) Close() error { return nil }
