package trace

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
)

// ErrNotPatchable is wrapped by Diff's error when two traces of a command
// do not differ only in pointer slots (see the package doc). The command is
// still correct to run; it is captured again whenever its addresses change.
var ErrNotPatchable = errors.New("trace: not patchable")

// GraphReader is the part of gpu.Backend that Diff reads graphs through.
type GraphReader interface {
	GraphNodes(g gpu.Graph) ([]gpu.GraphNode, error)
	GraphNodeType(n gpu.GraphNode) (gpu.NodeType, error)
	GraphNodeDeps(n gpu.GraphNode) ([]gpu.GraphNode, error)
	GraphKernelNodeParams(n gpu.GraphNode) (gpu.KernelParams, error)
	FuncParamInfo(f gpu.Function) ([]gpu.ParamInfo, error)
}

// GraphBuilder is the part of gpu.Backend that Template.Build needs.
type GraphBuilder interface {
	GraphCreate(dev int) (gpu.Graph, error)
	GraphDestroy(g gpu.Graph) error
	GraphAddKernelNode(g gpu.Graph, deps []gpu.GraphNode, p gpu.KernelParams) (gpu.GraphNode, error)
	GraphAddEmptyNode(g gpu.Graph, deps []gpu.GraphNode) (gpu.GraphNode, error)
}

// Slot is one pointer slot found by Diff: the 8 bytes at byte Byte of
// parameter Arg of node Node (in the trace's creation order) hold the
// address of operand Operand plus Off.
type Slot struct {
	Node, Arg, Byte int
	Operand         int
	Off             uint64
}

// Template is a trace that can be rebuilt at any operand addresses: the
// first trace's nodes and the pointer slots Diff proved. It is immutable.
type Template struct {
	nodes []tnode
	slots []Slot
}

type tnode struct {
	typ    gpu.NodeType
	deps   []int            // indices of earlier nodes
	params gpu.KernelParams // kernel nodes: the first trace's parameters
	slots  []Slot           // kernel nodes: this node's pointer slots, by Arg
}

// Slots returns the pointer slots, in node and parameter order.
func (t *Template) Slots() []Slot { return slices.Clone(t.slots) }

// Nodes is the number of nodes a built trace has.
func (t *Template) Nodes() int { return len(t.nodes) }

// rnode is a node as read back from a captured graph.
type rnode struct {
	typ    gpu.NodeType
	deps   []int
	params gpu.KernelParams
}

func readGraph(r GraphReader, g gpu.Graph) ([]rnode, error) {
	nodes, err := r.GraphNodes(g)
	if err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	index := make(map[gpu.GraphNode]int, len(nodes))
	for i, n := range nodes {
		index[n] = i
	}
	out := make([]rnode, len(nodes))
	for i, n := range nodes {
		typ, err := r.GraphNodeType(n)
		if err != nil {
			return nil, fmt.Errorf("read trace node %d: %w", i, err)
		}
		deps, err := r.GraphNodeDeps(n)
		if err != nil {
			return nil, fmt.Errorf("read trace node %d: %w", i, err)
		}
		out[i].typ = typ
		for _, d := range deps {
			j, ok := index[d]
			if !ok {
				return nil, gpu.Errorf("trace.Diff", gpu.ErrIllegalState, "node %d depends on a node outside its graph", i)
			}
			out[i].deps = append(out[i].deps, j)
		}
		slices.Sort(out[i].deps)
		if typ == gpu.NodeKernel {
			out[i].params, err = r.GraphKernelNodeParams(n)
			if errors.Is(err, gpu.ErrNotSupported) {
				// The backend cannot read this kernel's parameters back
				// (NCCL's kernels pass a buffer shorter than their declared
				// layout): nothing can be proved about them.
				return nil, notPatchable("node %d: the backend cannot read its kernel parameters: %v", i, err)
			}
			if err != nil {
				return nil, fmt.Errorf("read trace node %d: %w", i, err)
			}
		}
	}
	return out, nil
}

// argBytes is a's parameter bytes: Raw for ArgBytes, the little-endian
// encoding otherwise. Diff compares every kernel parameter this way, typed
// or not, so that sim exercises the path CUDA's untyped library kernels take.
func argBytes(a gpu.Arg) []byte {
	if a.Kind == gpu.ArgBytes {
		return a.Raw
	}
	b := make([]byte, a.Size())
	a.Encode(b)
	return b
}

// argFromBytes is the inverse of argBytes for an argument of kind.
func argFromBytes(kind gpu.ArgKind, b []byte) gpu.Arg {
	switch {
	case kind == gpu.ArgBytes:
		return gpu.Arg{Kind: kind, Raw: b}
	case len(b) == 4:
		return gpu.Arg{Kind: kind, Bits: uint64(binary.LittleEndian.Uint32(b))}
	default:
		return gpu.Arg{Kind: kind, Bits: binary.LittleEndian.Uint64(b)}
	}
}

func notPatchable(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrNotPatchable, fmt.Sprintf(format, args...))
}

// Diff compares two traces of one command, g1 captured with the operands at
// ops1 and g2 with them at ops2 (every operand at a different address), and
// returns the Template that rebuilds g1 at any addresses. sizes are the
// operands' sizes in bytes. The error wraps ErrNotPatchable, with the first
// reason found, when the traces differ in anything but pointer slots; other
// errors come from reading the graphs.
func Diff(r GraphReader, g1, g2 gpu.Graph, ops1, ops2 []gpu.DevicePtr, sizes []uint64) (*Template, error) {
	if len(ops1) != len(ops2) || len(ops1) != len(sizes) {
		return nil, gpu.Errorf("trace.Diff", gpu.ErrInvalidValue, "%d, %d and %d operands", len(ops1), len(ops2), len(sizes))
	}
	for i := range ops1 {
		if ops1[i] == ops2[i] {
			return nil, gpu.Errorf("trace.Diff", gpu.ErrInvalidValue, "operand %d is at %#x in both traces", i, uint64(ops1[i]))
		}
	}
	n1, err := readGraph(r, g1)
	if err != nil {
		return nil, err
	}
	n2, err := readGraph(r, g2)
	if err != nil {
		return nil, err
	}
	if len(n1) != len(n2) {
		return nil, notPatchable("the traces have %d and %d nodes", len(n1), len(n2))
	}
	t := &Template{nodes: make([]tnode, len(n1))}
	layouts := map[gpu.Function][]gpu.ParamInfo{}
	for i := range n1 {
		a, b := &n1[i], &n2[i]
		if a.typ != b.typ {
			return nil, notPatchable("node %d is %s in one trace and %s in the other", i, a.typ, b.typ)
		}
		if !slices.Equal(a.deps, b.deps) {
			return nil, notPatchable("node %d has different dependencies in the two traces", i)
		}
		t.nodes[i] = tnode{typ: a.typ, deps: a.deps}
		switch a.typ {
		case gpu.NodeEmpty:
		case gpu.NodeKernel:
			slots, err := diffKernel(r, layouts, i, a.params, b.params, ops1, ops2, sizes)
			if err != nil {
				return nil, err
			}
			t.nodes[i].params = a.params
			t.nodes[i].slots = slots
			t.slots = append(t.slots, slots...)
		default:
			// The interface cannot read these nodes' parameters back, so
			// nothing proves where their addresses are.
			return nil, notPatchable("node %d is a %s node, whose parameters cannot be compared", i, a.typ)
		}
	}
	return t, nil
}

func diffKernel(r GraphReader, layouts map[gpu.Function][]gpu.ParamInfo, node int, p1, p2 gpu.KernelParams,
	ops1, ops2 []gpu.DevicePtr, sizes []uint64) ([]Slot, error) {
	if p1.Func != p2.Func {
		return nil, notPatchable("node %d launches different kernels in the two traces", node)
	}
	if p1.Config != p2.Config {
		return nil, notPatchable("node %d has launch shapes %v and %v", node, p1.Config, p2.Config)
	}
	if len(p1.Args) != len(p2.Args) {
		return nil, notPatchable("node %d has %d and %d parameters", node, len(p1.Args), len(p2.Args))
	}
	// The driver's layout, where the backend reports one, must agree with
	// the parameters read back; otherwise the byte view could be misaligned
	// with the real slots and nothing would be exact.
	layout, ok := layouts[p1.Func]
	if !ok {
		var err error
		if layout, err = r.FuncParamInfo(p1.Func); err != nil {
			if errors.Is(err, gpu.ErrNotSupported) {
				return nil, notPatchable("node %d: the driver gives no parameter layout: %v", node, err)
			}
			return nil, fmt.Errorf("node %d: parameter layout: %w", node, err)
		}
		layouts[p1.Func] = layout
	}
	if len(layout) != len(p1.Args) {
		return nil, notPatchable("node %d: the driver reports %d parameters, the node has %d", node, len(layout), len(p1.Args))
	}
	var slots []Slot
	for j := range p1.Args {
		a, b := p1.Args[j], p2.Args[j]
		if a.Kind != b.Kind {
			return nil, notPatchable("node %d parameter %d is %s and %s", node, j, a.Kind, b.Kind)
		}
		b1, b2 := argBytes(a), argBytes(b)
		if len(b1) != len(b2) || uint64(len(b1)) != layout[j].Size || len(b1) == 0 {
			return nil, notPatchable("node %d parameter %d has sizes %d and %d (driver: %d)", node, j, len(b1), len(b2), layout[j].Size)
		}
		w := 0
		for ; w+8 <= len(b1); w += 8 {
			v1 := binary.LittleEndian.Uint64(b1[w:])
			v2 := binary.LittleEndian.Uint64(b2[w:])
			if v1 == v2 {
				continue
			}
			op, off, ok := pointerInto(v1, v2, ops1, ops2, sizes)
			if !ok {
				return nil, notPatchable("node %d parameter %d bytes %d..%d change between the traces (%#x, %#x) but do not point into an operand",
					node, j, w, w+8, v1, v2)
			}
			slots = append(slots, Slot{Node: node, Arg: j, Byte: w, Operand: op, Off: off})
		}
		if !slices.Equal(b1[w:], b2[w:]) {
			return nil, notPatchable("node %d parameter %d trailing bytes change between the traces", node, j)
		}
	}
	return slots, nil
}

// pointerInto reports whether v1 and v2 are the same offset into the same
// operand in the two traces.
func pointerInto(v1, v2 uint64, ops1, ops2 []gpu.DevicePtr, sizes []uint64) (int, uint64, bool) {
	for i := range ops1 {
		o := v1 - uint64(ops1[i]) // wraps to a huge value below the operand
		if o <= sizes[i] && v2-uint64(ops2[i]) == o {
			return i, o, true
		}
	}
	return 0, 0, false
}

// Build makes a new graph on dev equal to the first trace with every
// pointer slot moved to the operands at ops. The caller owns the graph.
func (t *Template) Build(b GraphBuilder, dev int, ops []gpu.DevicePtr) (_ gpu.Graph, err error) {
	g, err := b.GraphCreate(dev)
	if err != nil {
		return 0, fmt.Errorf("build trace: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.GraphDestroy(g))
		}
	}()
	nodes := make([]gpu.GraphNode, len(t.nodes))
	for i, n := range t.nodes {
		deps := make([]gpu.GraphNode, len(n.deps))
		for k, d := range n.deps {
			deps[k] = nodes[d]
		}
		switch n.typ {
		case gpu.NodeKernel:
			p := n.params
			p.Args = patchArgs(n.params.Args, n.slots, ops)
			nodes[i], err = b.GraphAddKernelNode(g, deps, p)
		default:
			nodes[i], err = b.GraphAddEmptyNode(g, deps)
		}
		if err != nil {
			return 0, fmt.Errorf("build trace node %d: %w", i, err)
		}
	}
	return g, nil
}

// patchArgs returns a copy of args with the slots rewritten for ops. Args
// without slots are shared with the template; nothing ever mutates them.
func patchArgs(args []gpu.Arg, slots []Slot, ops []gpu.DevicePtr) []gpu.Arg {
	out := slices.Clone(args)
	for k := 0; k < len(slots); {
		j := slots[k].Arg
		raw := slices.Clone(argBytes(args[j]))
		for ; k < len(slots) && slots[k].Arg == j; k++ {
			s := slots[k]
			binary.LittleEndian.PutUint64(raw[s.Byte:], uint64(ops[s.Operand])+s.Off)
		}
		out[j] = argFromBytes(args[j].Kind, raw)
	}
	return out
}
