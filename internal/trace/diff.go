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
	GraphAddMemcpyNode(g gpu.Graph, deps []gpu.GraphNode, p gpu.MemcpyParams) (gpu.GraphNode, error)
	GraphAddMemsetNode(g gpu.Graph, deps []gpu.GraphNode, p gpu.Memset) (gpu.GraphNode, error)
	GraphAddEmptyNode(g gpu.Graph, deps []gpu.GraphNode) (gpu.GraphNode, error)
}

// Slot is one pointer slot found by Diff: the 8 bytes at byte Byte of
// parameter Arg of node Node (in the trace's creation order) hold the
// address of operand Operand plus Off. In memcpy nodes Arg 0 is the
// destination and Arg 1 the source, in memset nodes Arg 0 is the
// destination; Byte is 0 for both.
type Slot struct {
	Node, Arg, Byte int
	Operand         int
	Off             uint64
}

// Template is a trace that can be rebuilt at any operand addresses of the
// alignment class it was recorded at: the first trace's nodes and the
// pointer slots Diff proved. It is immutable.
type Template struct {
	nodes []Node
	slots []Slot // in node and parameter order
	// span[i] is the range of slots of node i.
	span [][2]int
}

// Slots returns the pointer slots, in node and parameter order.
func (t *Template) Slots() []Slot { return slices.Clone(t.slots) }

// SlotsOf returns the pointer slots of node i, in parameter order: a view
// of the template's own, not to be modified (the per-step patch path
// reads it without a copy). Nil for a node out of range.
func (t *Template) SlotsOf(i int) []Slot {
	if i < 0 || i >= len(t.span) {
		return nil
	}
	return t.slots[t.span[i][0]:t.span[i][1]:t.span[i][1]]
}

// Nodes is the number of nodes a built trace has.
func (t *Template) Nodes() int { return len(t.nodes) }

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
// ops1 and g2 with them at ops2 (every operand at a different address, of
// the same alignment class), and returns the Template that rebuilds g1 at
// any addresses of that class. sizes are the operands' sizes in bytes. The
// error wraps ErrNotPatchable, with the first reason found, when the traces
// differ in anything but pointer slots; other errors come from reading the
// graphs.
func Diff(r GraphReader, g1, g2 gpu.Graph, ops1, ops2 []gpu.DevicePtr, sizes []uint64) (*Template, error) {
	if len(ops1) != len(ops2) || len(ops1) != len(sizes) {
		return nil, gpu.Errorf("trace.Diff", gpu.ErrInvalidValue, "%d, %d and %d operands", len(ops1), len(ops2), len(sizes))
	}
	for i := range ops1 {
		if ops1[i] == ops2[i] {
			return nil, gpu.Errorf("trace.Diff", gpu.ErrInvalidValue, "operand %d is at %#x in both traces", i, uint64(ops1[i]))
		}
	}
	n1, why, err := readNodes(r, g1)
	if err != nil {
		return nil, err
	}
	if why != "" {
		return nil, notPatchable("%s", why)
	}
	n2, why, err := readNodes(r, g2)
	if err != nil {
		return nil, err
	}
	if why != "" {
		return nil, notPatchable("%s", why)
	}
	if len(n1) != len(n2) {
		return nil, notPatchable("the traces have %d and %d nodes", len(n1), len(n2))
	}
	d := &differ{r: r, layouts: map[gpu.Function][]gpu.ParamInfo{}, ops1: ops1, ops2: ops2, sizes: sizes}
	t := &Template{nodes: n1, span: make([][2]int, len(n1))}
	for i := range n1 {
		a, b := &n1[i], &n2[i]
		if a.Type != b.Type {
			return nil, notPatchable("node %d is %s in one trace and %s in the other", i, a.Type, b.Type)
		}
		if !slices.Equal(a.Deps, b.Deps) {
			return nil, notPatchable("node %d has different dependencies in the two traces", i)
		}
		start := len(d.slots)
		var err error
		switch a.Type {
		case gpu.NodeEmpty:
		case gpu.NodeKernel:
			err = d.kernel(i, a.Kernel, b.Kernel)
		case gpu.NodeMemcpy:
			if a.Memcpy.Size != b.Memcpy.Size {
				return nil, notPatchable("node %d copies %d and %d bytes", i, a.Memcpy.Size, b.Memcpy.Size)
			}
			if err = d.pointer(i, 0, "destination", uint64(a.Memcpy.Dst), uint64(b.Memcpy.Dst)); err == nil {
				err = d.pointer(i, 1, "source", uint64(a.Memcpy.Src), uint64(b.Memcpy.Src))
			}
		case gpu.NodeMemset:
			if a.Memset.Value != b.Memset.Value || a.Memset.ElemSize != b.Memset.ElemSize || a.Memset.Count != b.Memset.Count {
				return nil, notPatchable("node %d sets %d×%d bytes to %#x in one trace and %d×%d bytes to %#x in the other",
					i, a.Memset.Count, a.Memset.ElemSize, a.Memset.Value, b.Memset.Count, b.Memset.ElemSize, b.Memset.Value)
			}
			err = d.pointer(i, 0, "destination", uint64(a.Memset.Dst), uint64(b.Memset.Dst))
		default:
			// readNodes reads no other type.
			return nil, notPatchable("node %d is a %s node, whose parameters cannot be compared", i, a.Type)
		}
		if err != nil {
			return nil, err
		}
		t.span[i] = [2]int{start, len(d.slots)}
	}
	t.slots = d.slots
	return t, nil
}

// differ collects the slots of one Diff.
type differ struct {
	r          GraphReader
	layouts    map[gpu.Function][]gpu.ParamInfo
	ops1, ops2 []gpu.DevicePtr
	sizes      []uint64
	slots      []Slot
}

// pointer compares the pointer field arg (what) of a memcpy or memset node:
// the same in both traces (an address the command owns, such as its
// workspace) or a slot.
func (d *differ) pointer(node, arg int, what string, v1, v2 uint64) error {
	if v1 == v2 {
		return nil
	}
	op, off, ok := pointerInto(v1, v2, d.ops1, d.ops2, d.sizes)
	if !ok {
		return notPatchable("node %d: the %s changes between the traces (%#x, %#x) but does not point into an operand%s",
			node, what, v1, v2, d.near(v1, v2))
	}
	d.slots = append(d.slots, Slot{Node: node, Arg: arg, Operand: op, Off: off})
	return nil
}

// near explains a word that changed without pointing into an operand, when
// it moved by some operand's displacement (a pointer outside the operand's
// bytes, or one the library derived from it): what a reader needs to tell a
// library's pointer arithmetic from a new allocation.
func (d *differ) near(v1, v2 uint64) string {
	for i := range d.ops1 {
		if v2-v1 == uint64(d.ops2[i])-uint64(d.ops1[i]) {
			return fmt.Sprintf("; it moves with operand %d, at offset %d of its %d bytes", i, int64(v1-uint64(d.ops1[i])), d.sizes[i])
		}
	}
	return "; it moves with no operand (an address the library allocates per trace?)"
}

// kernel compares a kernel node's parameters, byte for byte in 8-byte
// words, and collects its pointer slots.
func (d *differ) kernel(node int, p1, p2 gpu.KernelParams) error {
	if p1.Func != p2.Func {
		return notPatchable("node %d launches different kernels in the two traces", node)
	}
	if p1.Config != p2.Config {
		return notPatchable("node %d has launch shapes %v and %v", node, p1.Config, p2.Config)
	}
	if len(p1.Args) != len(p2.Args) {
		return notPatchable("node %d has %d and %d parameters", node, len(p1.Args), len(p2.Args))
	}
	// The driver's layout, where the backend reports one, must agree with
	// the parameters read back; otherwise the byte view could be misaligned
	// with the real slots and nothing would be exact.
	layout, ok := d.layouts[p1.Func]
	if !ok {
		var err error
		if layout, err = d.r.FuncParamInfo(p1.Func); err != nil {
			if errors.Is(err, gpu.ErrNotSupported) {
				return notPatchable("node %d: the driver gives no parameter layout: %v", node, err)
			}
			return fmt.Errorf("node %d: parameter layout: %w", node, err)
		}
		d.layouts[p1.Func] = layout
	}
	if len(layout) != len(p1.Args) {
		return notPatchable("node %d: the driver reports %d parameters, the node has %d", node, len(layout), len(p1.Args))
	}
	for j := range p1.Args {
		a, b := p1.Args[j], p2.Args[j]
		if a.Kind != b.Kind {
			return notPatchable("node %d parameter %d is %s and %s", node, j, a.Kind, b.Kind)
		}
		b1, b2 := argBytes(a), argBytes(b)
		if len(b1) != len(b2) || uint64(len(b1)) != layout[j].Size || len(b1) == 0 {
			return notPatchable("node %d parameter %d has sizes %d and %d (driver: %d)", node, j, len(b1), len(b2), layout[j].Size)
		}
		w := 0
		for ; w+8 <= len(b1); w += 8 {
			v1 := binary.LittleEndian.Uint64(b1[w:])
			v2 := binary.LittleEndian.Uint64(b2[w:])
			if v1 == v2 {
				continue
			}
			op, off, ok := pointerInto(v1, v2, d.ops1, d.ops2, d.sizes)
			if !ok {
				return notPatchable("node %d parameter %d bytes %d..%d change between the traces (%#x, %#x) but do not point into an operand%s",
					node, j, w, w+8, v1, v2, d.near(v1, v2))
			}
			d.slots = append(d.slots, Slot{Node: node, Arg: j, Byte: w, Operand: op, Off: off})
		}
		if !slices.Equal(b1[w:], b2[w:]) {
			return notPatchable("node %d parameter %d trailing bytes change between the traces", node, j)
		}
	}
	return nil
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

// NodesAt returns the template's nodes with every pointer slot moved to the
// operands at ops: the trace at ops, node by node, without capturing. The
// nodes are the caller's (a deep copy).
func (t *Template) NodesAt(ops []gpu.DevicePtr) []Node {
	ns := CloneNodes(t.nodes)
	t.Apply(ns, ops, nil)
	return ns
}

// Apply moves, in place, the pointer slots of ns (nodes of this template,
// as NodesAt returns them) to the operands at ops, and appends to changed
// the index of every node whose parameters it changed. It allocates nothing
// beyond changed's growth: the per-step patch path.
func (t *Template) Apply(ns []Node, ops []gpu.DevicePtr, changed []int) []int {
	for i := range t.nodes {
		first, end := t.span[i][0], t.span[i][1]
		if first == end {
			continue
		}
		n := &ns[i]
		moved := false
		for _, s := range t.slots[first:end] {
			v := uint64(ops[s.Operand]) + s.Off
			switch n.Type {
			case gpu.NodeKernel:
				a := &n.Kernel.Args[s.Arg]
				if a.Kind == gpu.ArgBytes {
					if binary.LittleEndian.Uint64(a.Raw[s.Byte:]) != v {
						binary.LittleEndian.PutUint64(a.Raw[s.Byte:], v)
						moved = true
					}
				} else if a.Bits != v { // typed: one 8-byte slot at byte 0
					a.Bits = v
					moved = true
				}
			case gpu.NodeMemcpy:
				p := &n.Memcpy.Dst
				if s.Arg == 1 {
					p = &n.Memcpy.Src
				}
				if *p != gpu.DevicePtr(v) {
					*p, moved = gpu.DevicePtr(v), true
				}
			case gpu.NodeMemset:
				if n.Memset.Dst != gpu.DevicePtr(v) {
					n.Memset.Dst, moved = gpu.DevicePtr(v), true
				}
			}
		}
		if moved {
			changed = append(changed, i)
		}
	}
	return changed
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
	ns := t.NodesAt(ops)
	handles := make([]gpu.GraphNode, len(ns))
	for i := range ns {
		n := &ns[i]
		deps := make([]gpu.GraphNode, len(n.Deps))
		for k, d := range n.Deps {
			deps[k] = handles[d]
		}
		if handles[i], err = AddNode(b, g, deps, n); err != nil {
			return 0, fmt.Errorf("build trace node %d: %w", i, err)
		}
	}
	return g, nil
}

// NodeAdder is the part of gpu.Backend that AddNode needs.
type NodeAdder interface {
	GraphAddKernelNode(g gpu.Graph, deps []gpu.GraphNode, p gpu.KernelParams) (gpu.GraphNode, error)
	GraphAddMemcpyNode(g gpu.Graph, deps []gpu.GraphNode, p gpu.MemcpyParams) (gpu.GraphNode, error)
	GraphAddMemsetNode(g gpu.Graph, deps []gpu.GraphNode, p gpu.Memset) (gpu.GraphNode, error)
	GraphAddEmptyNode(g gpu.Graph, deps []gpu.GraphNode) (gpu.GraphNode, error)
}

// AddNode adds n to g with deps.
func AddNode(b NodeAdder, g gpu.Graph, deps []gpu.GraphNode, n *Node) (gpu.GraphNode, error) {
	switch n.Type {
	case gpu.NodeKernel:
		return b.GraphAddKernelNode(g, deps, n.Kernel)
	case gpu.NodeMemcpy:
		return b.GraphAddMemcpyNode(g, deps, n.Memcpy)
	case gpu.NodeMemset:
		return b.GraphAddMemsetNode(g, deps, n.Memset)
	case gpu.NodeEmpty:
		return b.GraphAddEmptyNode(g, deps)
	}
	return 0, gpu.Errorf("trace.AddNode", gpu.ErrInvalidValue, "a %s node cannot be added from its parameters", n.Type)
}
