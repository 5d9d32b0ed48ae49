package graph

import (
	"errors"
	"fmt"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/trace"
)

// Ref is a reference to device memory: Off bytes into buffer Buf.
type Ref struct {
	Buf int
	Off uint64
}

// At resolves r against a step's buffer base addresses.
func (r Ref) At(addrs []gpu.DevicePtr) gpu.DevicePtr { return addrs[r.Buf].Add(r.Off) }

// Arg is one kernel argument: a scalar, or (Value.Kind == gpu.ArgPtr) a
// pointer to Ref. The kind is the program's declaration, so it alone says
// which slots are pointers.
type Arg struct {
	Value gpu.Arg
	Ref   Ref
}

// IsPtr reports whether a is a pointer argument.
func (a Arg) IsPtr() bool { return a.Value.Kind == gpu.ArgPtr }

// Kind is the kind of a command.
type Kind uint8

const (
	KindKernel Kind = iota + 1 // a kernel launch with typed arguments
	KindMemcpy                 // a device-to-device copy
	KindMemset                 // a memset
	KindTraced                 // work a Go function enqueues, captured into a child graph
)

// Command is one step of a command buffer. Only the fields of its Kind are
// used.
type Command struct {
	// Name names the command in errors and logs ("command 3 (launch
	// sg_gemm)").
	Name string
	Kind Kind

	// KindKernel.
	Func   gpu.Function
	Config gpu.LaunchConfig
	Args   []Arg

	// KindMemcpy copies Size bytes from Src to Dst; KindMemset sets Count
	// elements of ElemSize bytes at Dst to Value.
	Dst, Src Ref
	Size     uint64
	Value    uint32
	ElemSize int
	Count    uint64

	// KindTraced: the traced command and the buffer of each of its
	// operands, in operand order.
	Trace    *trace.Command
	Operands []int
}

// buffers returns the buffers c references (with repeats).
func (c *Command) buffers() []int {
	switch c.Kind {
	case KindKernel:
		var bufs []int
		for _, a := range c.Args {
			if a.IsPtr() {
				bufs = append(bufs, a.Ref.Buf)
			}
		}
		return bufs
	case KindMemcpy:
		return []int{c.Dst.Buf, c.Src.Buf}
	case KindMemset:
		return []int{c.Dst.Buf}
	case KindTraced:
		return c.Operands
	}
	return nil
}

// kernelParams resolves a kernel command at addrs into a new argument
// slice (graph nodes and launches made from it may outlive the call).
func (c *Command) kernelParams(addrs []gpu.DevicePtr) gpu.KernelParams {
	return c.kernelParamsInto(addrs, nil)
}

// kernelParamsInto resolves a kernel command at addrs, reusing buf for the
// arguments.
func (c *Command) kernelParamsInto(addrs []gpu.DevicePtr, buf []gpu.Arg) gpu.KernelParams {
	args := slices.Grow(buf[:0], len(c.Args))[:len(c.Args)]
	for i, a := range c.Args {
		if a.IsPtr() {
			args[i] = gpu.Ptr(a.Ref.At(addrs))
		} else {
			args[i] = a.Value
		}
	}
	return gpu.KernelParams{Func: c.Func, Config: c.Config, Args: args}
}

func (c *Command) memcpyParams(addrs []gpu.DevicePtr) gpu.MemcpyParams {
	return gpu.MemcpyParams{Dst: c.Dst.At(addrs), Src: c.Src.At(addrs), Size: c.Size}
}

func (c *Command) memsetParams(addrs []gpu.DevicePtr) gpu.Memset {
	return gpu.Memset{Dst: c.Dst.At(addrs), Value: c.Value, ElemSize: c.ElemSize, Count: c.Count}
}

// operandAddrs fills key with the addresses of a traced command's operands.
func (c *Command) operandAddrs(addrs, key []gpu.DevicePtr) []gpu.DevicePtr {
	key = key[:0]
	for _, b := range c.Operands {
		key = append(key, addrs[b])
	}
	return key
}

// CommandBuffer is a compiled step: commands over nbufs buffers, the
// patch table, and the Tracer of its traced commands. It is immutable.
type CommandBuffer struct {
	dev   int
	nbufs int
	cmds  []Command
	tr    *trace.Tracer
	// byBuf is the patch table: for each buffer, the commands that
	// reference it, each once, in order.
	byBuf [][]int32
	// used lists the buffers some command references; addresses of the
	// others never matter.
	used []int
}

// New makes a command buffer for device dev over nbufs buffers. tr runs
// the traced commands (it may be nil when there are none).
func New(dev, nbufs int, cmds []Command, tr *trace.Tracer) (*CommandBuffer, error) {
	cb := &CommandBuffer{dev: dev, nbufs: nbufs, cmds: cmds, tr: tr, byBuf: make([][]int32, nbufs)}
	for i := range cmds {
		c := &cmds[i]
		if c.Kind == KindTraced && (tr == nil || c.Trace == nil) {
			return nil, gpu.Errorf("graph.New", gpu.ErrInvalidValue, "%s: traced command without a tracer", c.Name)
		}
		if c.Kind < KindKernel || c.Kind > KindTraced {
			return nil, gpu.Errorf("graph.New", gpu.ErrInvalidValue, "%s: unknown kind %d", c.Name, c.Kind)
		}
		for _, b := range c.buffers() {
			if b < 0 || b >= nbufs {
				return nil, gpu.Errorf("graph.New", gpu.ErrInvalidValue, "%s: buffer %d out of range [0,%d)", c.Name, b, nbufs)
			}
			uses := cb.byBuf[b]
			if len(uses) == 0 || uses[len(uses)-1] != int32(i) {
				cb.byBuf[b] = append(uses, int32(i))
			}
		}
	}
	for b, uses := range cb.byBuf {
		if len(uses) > 0 {
			cb.used = append(cb.used, b)
		}
	}
	return cb, nil
}

// Len is the number of commands.
func (cb *CommandBuffer) Len() int { return len(cb.cmds) }

// Extend returns a new command buffer over nbufs buffers (at least cb's)
// that runs pre, then cb's commands, then post, each depending on the one
// before. The persistent-address strategies wrap a step this way in the
// copies that move params in and outputs out, so that the copies are nodes
// of the step's graph and a step stays one launch. cb is unchanged; the new
// buffer shares cb's tracer and traced commands (and so their caches).
func (cb *CommandBuffer) Extend(nbufs int, pre, post []Command) (*CommandBuffer, error) {
	if nbufs < cb.nbufs {
		return nil, gpu.Errorf("graph.Extend", gpu.ErrInvalidValue, "%d buffers, fewer than the %d of the command buffer extended", nbufs, cb.nbufs)
	}
	return New(cb.dev, nbufs, slices.Concat(pre, cb.cmds, post), cb.tr)
}

// Users returns how many commands reference at least one of bufs, and how
// many of those are traced: the nodes a patch updates when every buffer of
// bufs moves. Buffers out of range are ignored.
func (cb *CommandBuffer) Users(bufs []int) (nodes, traced int) {
	seen := make([]bool, len(cb.cmds))
	for _, b := range bufs {
		if b < 0 || b >= cb.nbufs {
			continue
		}
		for _, c := range cb.byBuf[b] {
			if seen[c] {
				continue
			}
			seen[c] = true
			nodes++
			if cb.cmds[c].Kind == KindTraced {
				traced++
			}
		}
	}
	return nodes, traced
}

// Moved reports whether any buffer a command references is at a different
// address in next than in prev.
func (cb *CommandBuffer) Moved(prev, next []gpu.DevicePtr) bool {
	for _, b := range cb.used {
		if prev[b] != next[b] {
			return true
		}
	}
	return false
}

// Launch enqueues every command on s with the buffers at addrs and returns
// how many commands it enqueued. On error, the commands before the failing
// one are enqueued and the rest are not.
func (cb *CommandBuffer) Launch(b gpu.Backend, s gpu.Stream, addrs []gpu.DevicePtr) (int, error) {
	for i := range cb.cmds {
		c := &cb.cmds[i]
		var err error
		switch c.Kind {
		case KindKernel:
			p := c.kernelParams(addrs)
			err = b.LaunchKernel(p.Func, p.Config, p.Args, s)
		case KindMemcpy:
			err = b.MemcpyDtoDAsync(c.Dst.At(addrs), c.Src.At(addrs), c.Size, s)
		case KindMemset:
			err = b.MemsetAsync(c.memsetParams(addrs), s)
		case KindTraced:
			err = cb.tr.Run(c.Trace, c.operandAddrs(addrs, nil), s)
		}
		if err != nil {
			return i, fmt.Errorf("%s: %w", c.Name, err)
		}
	}
	return len(cb.cmds), nil
}

// Record builds a graph of the commands with the buffers at addrs: one node
// per command, each depending on the one before. With patch set, traced
// commands are traced for patching (see trace.Tracer.Trace). The caller
// owns the graph; nodes[i] is command i's node.
func (cb *CommandBuffer) Record(b gpu.Backend, addrs []gpu.DevicePtr, patch bool) (_ gpu.Graph, nodes []gpu.GraphNode, err error) {
	g, err := b.GraphCreate(cb.dev)
	if err != nil {
		return 0, nil, fmt.Errorf("record: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.GraphDestroy(g))
		}
	}()
	nodes = make([]gpu.GraphNode, len(cb.cmds))
	var key []gpu.DevicePtr
	for i := range cb.cmds {
		c := &cb.cmds[i]
		var deps []gpu.GraphNode
		if i > 0 {
			deps = []gpu.GraphNode{nodes[i-1]}
		}
		var n gpu.GraphNode
		switch c.Kind {
		case KindKernel:
			n, err = b.GraphAddKernelNode(g, deps, c.kernelParams(addrs))
		case KindMemcpy:
			n, err = b.GraphAddMemcpyNode(g, deps, c.memcpyParams(addrs))
		case KindMemset:
			n, err = b.GraphAddMemsetNode(g, deps, c.memsetParams(addrs))
		case KindTraced:
			key = c.operandAddrs(addrs, key)
			var child gpu.Graph
			if child, err = cb.tr.Trace(c.Trace, key, patch); err == nil {
				n, err = b.GraphAddChildGraphNode(g, deps, child)
			}
		}
		if err != nil {
			return 0, nil, fmt.Errorf("record %s: %w", c.Name, err)
		}
		nodes[i] = n
	}
	return g, nodes, nil
}

// Exec is an instantiated command buffer: the graph it was instantiated
// from (kept alive, because per-node updates name its nodes), the nodes of
// the commands, the executable graph and the addresses it now holds.
type Exec struct {
	Graph gpu.Graph
	Nodes []gpu.GraphNode
	X     gpu.GraphExec

	addrs []gpu.DevicePtr // the addresses X's nodes hold
	// Scratch for Patch, kept to allocate nothing per step.
	mark  []uint32 // mark[c] == gen: command c is in dirty
	gen   uint32
	dirty []int32
	key   []gpu.DevicePtr
	args  []gpu.Arg
}

// Instantiate records the commands at addrs (see Record) and instantiates
// the graph.
func (cb *CommandBuffer) Instantiate(b gpu.Backend, addrs []gpu.DevicePtr, patch bool) (*Exec, error) {
	g, nodes, err := cb.Record(b, addrs, patch)
	if err != nil {
		return nil, err
	}
	x, err := b.GraphInstantiate(g)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("instantiate: %w", err), b.GraphDestroy(g))
	}
	return &Exec{Graph: g, Nodes: nodes, X: x, addrs: append([]gpu.DevicePtr(nil), addrs...),
		mark: make([]uint32, len(cb.cmds))}, nil
}

// Addrs returns the buffer addresses x's nodes hold (not a copy).
func (x *Exec) Addrs() []gpu.DevicePtr { return x.addrs }

// Launch enqueues x on s.
func (x *Exec) Launch(b gpu.Backend, s gpu.Stream) error {
	if err := b.GraphLaunch(x.X, s); err != nil {
		return fmt.Errorf("graph launch: %w", err)
	}
	return nil
}

// Destroy destroys the executable graph and its source graph. Launches
// already enqueued complete (the driver frees an in-flight exec when it
// finishes).
func (x *Exec) Destroy(b gpu.Backend) error {
	var errs []error
	if x.X != 0 {
		if err := b.GraphExecDestroy(x.X); err != nil {
			errs = append(errs, fmt.Errorf("destroy exec graph: %w", err))
		}
		x.X = 0
	}
	if x.Graph != 0 {
		if err := b.GraphDestroy(x.Graph); err != nil {
			errs = append(errs, fmt.Errorf("destroy graph: %w", err))
		}
		x.Graph = 0
	}
	return errors.Join(errs...)
}

// Update re-records the commands at addrs into a new graph and applies it
// to x with a whole-graph exec update. When the driver refuses the update
// the error wraps gpu.ErrGraphUpdate and x is unchanged and usable.
func (cb *CommandBuffer) Update(b gpu.Backend, x *Exec, addrs []gpu.DevicePtr) error {
	g, _, err := cb.Record(b, addrs, false)
	if err != nil {
		return err
	}
	if err := b.GraphExecUpdate(x.X, g); err != nil {
		return errors.Join(fmt.Errorf("graph exec update: %w", err), b.GraphDestroy(g))
	}
	// x now holds g's parameters. Its node handles stay those of the graph
	// it was instantiated from (the ones per-node updates must name), so
	// that graph is kept and g is dropped.
	copy(x.addrs, addrs)
	if err := b.GraphDestroy(g); err != nil {
		return fmt.Errorf("destroy update graph: %w", err)
	}
	return nil
}

// ExecPatcher is the part of gpu.Backend that Patch updates nodes through.
type ExecPatcher interface {
	GraphExecKernelNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, p gpu.KernelParams) error
	GraphExecMemcpyNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, p gpu.MemcpyParams) error
	GraphExecMemsetNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, p gpu.Memset) error
	GraphExecChildGraphNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, child gpu.Graph) error
}

// Patch brings x to addrs by updating, in place, only the nodes of
// commands that reference a buffer whose address changed, and returns how
// many nodes it updated. x must have been instantiated with patch set.
//
// On error x is in an unknown state (some nodes updated, others not) and
// must be destroyed; an error wrapping gpu.ErrGraphUpdate means the driver
// refused a node update and re-recording will succeed where this did not.
func (cb *CommandBuffer) Patch(b ExecPatcher, x *Exec, addrs []gpu.DevicePtr) (int, error) {
	x.gen++
	if x.gen == 0 {
		// The generation wrapped: stale marks could equal it again.
		clear(x.mark)
		x.gen = 1
	}
	dirty := x.dirty[:0]
	for _, buf := range cb.used {
		if x.addrs[buf] == addrs[buf] {
			continue
		}
		for _, c := range cb.byBuf[buf] {
			if x.mark[c] != x.gen {
				x.mark[c] = x.gen
				dirty = append(dirty, c)
			}
		}
	}
	x.dirty = dirty
	for _, i := range dirty {
		c := &cb.cmds[i]
		n := x.Nodes[i]
		var err error
		switch c.Kind {
		case KindKernel:
			// The argument slice is reused from node to node: exec
			// parameter updates copy the parameters at the call (CUDA
			// does; so does sim), which is what makes them cheap.
			p := c.kernelParamsInto(addrs, x.args)
			x.args = p.Args
			err = b.GraphExecKernelNodeSetParams(x.X, n, p)
		case KindMemcpy:
			err = b.GraphExecMemcpyNodeSetParams(x.X, n, c.memcpyParams(addrs))
		case KindMemset:
			err = b.GraphExecMemsetNodeSetParams(x.X, n, c.memsetParams(addrs))
		case KindTraced:
			x.key = c.operandAddrs(addrs, x.key)
			var child gpu.Graph
			if child, err = cb.tr.Trace(c.Trace, x.key, true); err == nil {
				err = b.GraphExecChildGraphNodeSetParams(x.X, n, child)
			}
		}
		if err != nil {
			return 0, fmt.Errorf("patch %s: %w", c.Name, err)
		}
	}
	copy(x.addrs, addrs)
	return len(dirty), nil
}

// Traced returns the traced commands, in command order.
func (cb *CommandBuffer) Traced() []*trace.Command {
	var out []*trace.Command
	for i := range cb.cmds {
		if cb.cmds[i].Kind == KindTraced {
			out = append(out, cb.cmds[i].Trace)
		}
	}
	return out
}
