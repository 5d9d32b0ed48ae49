package graph

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/trace"
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
	// Library marks a traced command that calls a library (a GEMM): where
	// the backend reads its kernels back it is flattened, and moves as its
	// own kernel nodes (Moves prices it so).
	Library bool
	// HostPath marks a traced command whose nodes RecordDevice never opts
	// in to device-side updates, so that they always move from the host:
	// collectives, whose NCCL kernels CUDA cannot read back. The sim's
	// collectives can be read back; they take the host path all the same,
	// so that the sim runs what CUDA runs.
	HostPath bool

	// ptrs are a kernel command's pointer arguments (New fills it): a
	// moving step visits only them, in a slice of their own.
	ptrs []ptrWord
}

// ptrWord is pointer argument Arg of a kernel command, at Ref.
type ptrWord struct {
	Arg int
	Ref Ref
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
	// used lists the buffers some command references whose address may
	// change (Fix takes out those that cannot); addresses of the others
	// never matter to a move.
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
		c.ptrs = nil
		if c.Kind == KindKernel {
			for j := range c.Args {
				if c.Args[j].IsPtr() {
					c.ptrs = append(c.ptrs, ptrWord{j, c.Args[j].Ref})
				}
			}
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

// Fix tells cb that buffers fixed never change address while it lives (an
// executable's temps, placed once in its arena): the scans for what moved
// (Moved, Patch, PatchDevice, WholeCounts) skip them, so that a step reads
// the addresses that can move, not every buffer's. A buffer fixed that
// moves anyway is not seen to.
func (cb *CommandBuffer) Fix(fixed []int) {
	out := make([]bool, cb.nbufs)
	for _, b := range fixed {
		if b >= 0 && b < cb.nbufs {
			out[b] = true
		}
	}
	cb.used = slices.DeleteFunc(cb.used, func(b int) bool { return out[b] })
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
// per command, each depending on the one before. A traced command whose
// trace holds only kernel, memcpy, memset and empty nodes is flattened: its
// nodes become nodes of the graph, in their own dependency order, between
// the command before and the command after (see trace.Tracer.Flat); any
// other traced command becomes one child-graph node. With patch set,
// traced commands are traced for patching (see trace.Tracer.Trace). The
// caller owns the graph; nodes[i] is command i's node (for a flattened
// command, its last node; 0 when its trace is empty).
func (cb *CommandBuffer) Record(b gpu.Backend, addrs []gpu.DevicePtr, patch bool) (_ gpu.Graph, nodes []gpu.GraphNode, err error) {
	r, err := cb.record(b, addrs, patch, nil)
	if err != nil {
		return 0, nil, err
	}
	return r.g, r.nodes, nil
}

// flatCmd is a flattened traced command in a graph: its nodes and the
// parameters they hold.
type flatCmd struct {
	nodes  []gpu.GraphNode // parallel to params
	params []trace.Node    // owned: patched in place
	tmpl   *trace.Template // the template params were made from, or nil
}

// recording is what record makes: the graph, each command's node, the
// flattened commands (nil where not flattened) and, for RecordDevice, the
// copies and memsets recorded as kernels (nil otherwise).
type recording struct {
	g     gpu.Graph
	nodes []gpu.GraphNode
	flat  []*flatCmd
	made  []devMode
}

// record records the commands at addrs; with kern set (RecordDevice) the
// copies and memsets it accepts become kernel nodes.
func (cb *CommandBuffer) record(b gpu.Backend, addrs []gpu.DevicePtr, patch bool, kern *kernelizer) (_ recording, err error) {
	g, err := b.GraphCreate(cb.dev)
	if err != nil {
		return recording{}, fmt.Errorf("record: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.GraphDestroy(g))
		}
	}()
	r := recording{g: g, nodes: make([]gpu.GraphNode, len(cb.cmds)), flat: make([]*flatCmd, len(cb.cmds))}
	if kern != nil {
		r.made = make([]devMode, len(cb.cmds))
	}
	// frontier holds the nodes the next command depends on: the last
	// command's node, or a flattened command's exit nodes.
	var frontier []gpu.GraphNode
	var key []gpu.DevicePtr
	for i := range cb.cmds {
		c := &cb.cmds[i]
		var n gpu.GraphNode
		switch c.Kind {
		case KindKernel:
			n, err = b.GraphAddKernelNode(g, frontier, c.kernelParams(addrs))
		case KindMemcpy, KindMemset:
			if p, mode, ok := kern.kernel(i, c, addrs); ok {
				n, err = b.GraphAddKernelNode(g, frontier, p)
				r.made[i] = mode
			} else if c.Kind == KindMemcpy {
				n, err = b.GraphAddMemcpyNode(g, frontier, c.memcpyParams(addrs))
			} else {
				n, err = b.GraphAddMemsetNode(g, frontier, c.memsetParams(addrs))
			}
		case KindTraced:
			key = c.operandAddrs(addrs, key)
			var fl trace.Flat
			if fl, err = cb.tr.Flat(c.Trace, key, patch); err == nil && fl.Nodes != nil {
				var fc *flatCmd
				if fc, frontier, err = addFlat(b, g, frontier, fl); err == nil {
					r.flat[i] = fc
					if len(fc.nodes) > 0 {
						r.nodes[i] = fc.nodes[len(fc.nodes)-1]
					}
					continue
				}
			} else if err == nil {
				var child gpu.Graph
				if child, err = cb.tr.Trace(c.Trace, key, patch); err == nil {
					n, err = b.GraphAddChildGraphNode(g, frontier, child)
				}
			}
		}
		if err != nil {
			return recording{}, fmt.Errorf("record %s: %w", c.Name, err)
		}
		r.nodes[i] = n
		frontier = []gpu.GraphNode{n}
	}
	return r, nil
}

// addFlat adds a flattened trace's nodes to g after frontier and returns
// them with the new frontier: the trace's exit nodes (frontier itself when
// the trace is empty).
func addFlat(b gpu.Backend, g gpu.Graph, frontier []gpu.GraphNode, fl trace.Flat) (*flatCmd, []gpu.GraphNode, error) {
	fc := &flatCmd{nodes: make([]gpu.GraphNode, len(fl.Nodes)), params: fl.Nodes, tmpl: fl.Template}
	for j := range fl.Nodes {
		n := &fl.Nodes[j]
		deps := frontier
		if len(n.Deps) > 0 {
			deps = make([]gpu.GraphNode, len(n.Deps))
			for k, d := range n.Deps {
				deps[k] = fc.nodes[d]
			}
		}
		h, err := trace.AddNode(b, g, deps, n)
		if err != nil {
			return nil, nil, fmt.Errorf("node %d of its trace: %w", j, err)
		}
		fc.nodes[j] = h
	}
	exits := trace.Exits(fl.Nodes)
	if len(exits) == 0 {
		return fc, frontier, nil
	}
	next := make([]gpu.GraphNode, len(exits))
	for k, j := range exits {
		next[k] = fc.nodes[j]
	}
	return fc, next, nil
}

// Exec is an instantiated command buffer: the graph it was instantiated
// from (kept alive, because per-node updates name its nodes), the nodes of
// the commands, the executable graph and the addresses it now holds.
type Exec struct {
	Graph gpu.Graph
	Nodes []gpu.GraphNode
	X     gpu.GraphExec

	addrs []gpu.DevicePtr // the addresses X's nodes hold
	flat  []*flatCmd      // per command, its flattened nodes (nil: not flattened)
	dev   *devPlan        // RecordDevice's: what moves on the host; nil otherwise
	// hs is the kernel nodes moved from the host, prepared at the first
	// move (hostset.go); nil before and after a change around it.
	hs *hostSet
	// host is the kernel node of X that is no command's and moves from
	// the host in hs (SetHostNode), with its parameters as hs holds them;
	// hasHost says whether there is one.
	host struct {
		n gpu.GraphNode
		p gpu.KernelParams
	}
	hasHost bool
	// tmpl is what the graph x was instantiated from holds, as the host
	// template of whole-graph updates (PatchWhole).
	tmpl template
	// made, when not nil, says per command whether Instantiate recorded
	// a memcpy or memset as a copy or fill kernel (InstantiateOptions),
	// and kz makes its parameters at other addresses.
	made []devMode
	kz   *kernelizer
	// Scratch for Patch, kept to allocate nothing per step.
	mark    []uint32 // mark[c] == gen: command c is in dirty
	gen     uint32
	dirty   []int32
	moved   []int // the buffers markDirty found moved
	key     []gpu.DevicePtr
	changed []int
}

// Instantiate records the commands at addrs (see Record) and instantiates
// the graph.
func (cb *CommandBuffer) Instantiate(b gpu.Backend, addrs []gpu.DevicePtr, patch bool) (*Exec, error) {
	return cb.InstantiateWith(b, addrs, InstantiateOptions{Patch: patch})
}

// InstantiateOptions say how InstantiateWith records.
type InstantiateOptions struct {
	// Patch records traced commands for patching (see Record).
	Patch bool
	// Movable says, per buffer, whether its address may change between
	// steps; Copy and Fill are kernels.Copy and kernels.Fill. With all
	// three, a memcpy or memset command over a movable buffer is recorded
	// as a copy or fill kernel where its size and addresses allow, as
	// RecordDevice records one: Patch then moves it as a kernel node, one
	// exec update of a small parameter block, where a copy or memset
	// node's exec update costs the driver several times more. A move off
	// 4-byte alignment is refused (gpu.ErrGraphUpdate): recording again
	// there keeps the command a copy or memset node. The kernels copy and
	// fill bit for bit.
	Movable    []bool
	Copy, Fill gpu.Function
}

// InstantiateWith records the commands at addrs as o says and instantiates
// the graph.
func (cb *CommandBuffer) InstantiateWith(b gpu.Backend, addrs []gpu.DevicePtr, o InstantiateOptions) (*Exec, error) {
	var kz *kernelizer
	if o.Movable != nil && (o.Copy != 0 || o.Fill != 0) {
		if len(o.Movable) != cb.nbufs {
			return nil, gpu.Errorf("graph.InstantiateWith", gpu.ErrInvalidValue, "%d movable flags for %d buffers", len(o.Movable), cb.nbufs)
		}
		kz = &kernelizer{movable: slices.Clone(o.Movable), copy: o.Copy, fill: o.Fill}
	}
	r, err := cb.record(b, addrs, o.Patch, kz)
	if err != nil {
		return nil, err
	}
	x, err := b.GraphInstantiate(r.g)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("instantiate: %w", err), b.GraphDestroy(r.g))
	}
	return &Exec{Graph: r.g, Nodes: r.nodes, X: x, addrs: append([]gpu.DevicePtr(nil), addrs...),
		flat: r.flat, mark: make([]uint32, len(cb.cmds)), tmpl: newTemplate(r, addrs), made: r.made, kz: kz}, nil
}

// madeAt is how command i was recorded, when a copy or fill kernel.
func (x *Exec) madeAt(i int32) devMode {
	if x.made == nil {
		return devNone
	}
	return x.made[i]
}

// Flattened reports, per command, whether x holds it flattened and in how
// many nodes (0 for commands that are not traced or not flattened).
func (x *Exec) Flattened() []int {
	out := make([]int, len(x.flat))
	for i, fc := range x.flat {
		if fc != nil {
			out[i] = len(fc.nodes)
		}
	}
	return out
}

func (x *Exec) flatAt(i int32) *flatCmd {
	if int(i) < len(x.flat) {
		return x.flat[i]
	}
	return nil
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
	if err := x.dropSet(); err != nil {
		errs = append(errs, fmt.Errorf("release the prepared kernel nodes: %w", err))
	}
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
	// Recorded as x was: a copy kernel that cannot be one at addrs is a
	// copy node there, which the update refuses.
	r, err := cb.record(b, addrs, false, x.kz)
	if err != nil {
		return err
	}
	if err := b.GraphExecUpdate(x.X, r.g); err != nil {
		return errors.Join(fmt.Errorf("graph exec update: %w", err), b.GraphDestroy(r.g))
	}
	// x now holds r's parameters. Its node handles stay those of the graph
	// it was instantiated from (the ones per-node updates must name), so
	// that graph is kept and r's is dropped; the flattened parameters are
	// r's.
	copy(x.addrs, addrs)
	for i, fc := range x.flat {
		if fc != nil && r.flat[i] != nil {
			fc.params, fc.tmpl = r.flat[i].params, r.flat[i].tmpl
		}
	}
	// The prepared kernel nodes hold what the exec held before; the
	// graph x was instantiated from is untouched, and describes the exec
	// no more.
	x.tmpl.broken = "the exec was updated from another recording"
	err = x.dropSet()
	if err := errors.Join(err, b.GraphDestroy(r.g)); err != nil {
		return fmt.Errorf("destroy update graph: %w", err)
	}
	return nil
}

// ExecPatcher is the part of gpu.Backend that Patch updates nodes through.
// Kernel nodes go through a gpu.KernelNodeSet (gpu.PrepareKernelNodes): the
// backend's own when it implements gpu.KernelNodeSets, else one calling
// GraphExecKernelNodeSetParams per node.
type ExecPatcher interface {
	GraphExecKernelNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, p gpu.KernelParams) error
	GraphExecMemcpyNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, p gpu.MemcpyParams) error
	GraphExecMemsetNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, p gpu.Memset) error
	GraphExecChildGraphNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, child gpu.Graph) error
}

// markDirty returns, each once, the commands that watch[buf] lists for
// every buffer of used whose address in addrs is not x's (x.dirty, reused
// from call to call), and leaves those buffers in x.moved.
func (x *Exec) markDirty(used []int, watch [][]int32, addrs []gpu.DevicePtr) []int32 {
	x.moved = x.moved[:0]
	for _, buf := range used {
		if x.addrs[buf] != addrs[buf] {
			x.moved = append(x.moved, buf)
		}
	}
	x.dirty = x.markAgainst(x.dirty[:0], x.addrs, x.moved, watch, addrs)
	return x.dirty
}

// markAgainst appends to dirty, each once, the commands that watch[buf]
// lists for every buffer of used whose address in addrs is not held's.
func (x *Exec) markAgainst(dirty []int32, held []gpu.DevicePtr, used []int, watch [][]int32, addrs []gpu.DevicePtr) []int32 {
	x.gen++
	if x.gen == 0 {
		// The generation wrapped: stale marks could equal it again.
		clear(x.mark)
		x.gen = 1
	}
	for _, buf := range used {
		if held[buf] == addrs[buf] {
			continue
		}
		for _, c := range watch[buf] {
			if x.mark[c] != x.gen {
				x.mark[c] = x.gen
				dirty = append(dirty, c)
			}
		}
	}
	return dirty
}

// Patch brings x to addrs by updating, in place, only the nodes of
// commands that reference a buffer whose address changed, and returns how
// many nodes it updated. x must have been instantiated with patch set.
//
// A flattened traced command is moved node by node: when its nodes came
// from a template and the new operands are of the same alignment class,
// the template's pointer slots are rewritten in place and only the nodes
// they change are updated (no capture); otherwise the trace at the new
// operands is obtained as Record would and its nodes set one by one, which
// is refused (gpu.ErrGraphUpdate) when they no longer have the recorded
// shape.
//
// On error x is in an unknown state (some nodes updated, others not) and
// must be destroyed; an error wrapping gpu.ErrGraphUpdate means the driver
// refused a node update and re-recording will succeed where this did not.
func (cb *CommandBuffer) Patch(b ExecPatcher, x *Exec, addrs []gpu.DevicePtr) (int, error) {
	n, _, err := cb.PatchAtMost(b, x, addrs, math.MaxInt)
	return n, err
}

// PatchAtMost is Patch when it would update at most most nodes (counted as
// WholeCounts counts Whole.Nodes); when it would update more, it changes nothing
// and returns that count and false, so that a caller weighing per-node
// updates against a whole-graph one (PatchWhole) finds what moved once on
// a step that stays per node.
func (cb *CommandBuffer) PatchAtMost(b ExecPatcher, x *Exec, addrs []gpu.DevicePtr, most int) (int, bool, error) {
	hs, err := x.preparedSet(b, cb, nil)
	if err != nil {
		return 0, false, fmt.Errorf("patch: %w", err)
	}
	dirty := x.markDirty(cb.used, cb.byBuf, addrs)
	if most < math.MaxInt {
		n := 0
		for _, i := range dirty {
			n += cb.movedNodes(x, i)
		}
		if n > most {
			return n, false, nil
		}
	}
	updated, err := cb.patchDirty(b, x, hs, dirty, addrs)
	return updated, err == nil, err
}

// patchDirty is Patch's work once the dirty commands are marked.
func (cb *CommandBuffer) patchDirty(b ExecPatcher, x *Exec, hs *hostSet, dirty []int32, addrs []gpu.DevicePtr) (int, error) {
	hs.apply = hs.apply[:0]
	updated := 0
	stale := false
	for _, i := range dirty {
		c := &cb.cmds[i]
		n := x.Nodes[i]
		var err error
		switch c.Kind {
		case KindKernel:
			// Its node is staged with the words of the buffers that
			// moved (stageMoved, below).
			if hs.cmd[i] < 0 {
				err = gpu.Errorf("graph.Patch", gpu.ErrInvalidValue, "%s has no prepared node", c.Name)
			}
			updated++
		case KindMemcpy, KindMemset:
			switch m := x.madeAt(i); {
			case m != devNone:
				var k int32
				if k, err = hs.writeMade(c, i, m, n, addrs); err == nil {
					hs.apply = append(hs.apply, k)
				}
			case c.Kind == KindMemcpy:
				err = b.GraphExecMemcpyNodeSetParams(x.X, n, c.memcpyParams(addrs))
			default:
				err = b.GraphExecMemsetNodeSetParams(x.X, n, c.memsetParams(addrs))
			}
			updated++
		case KindTraced:
			x.key = c.operandAddrs(addrs, x.key)
			if fc := x.flatAt(i); fc != nil {
				var k int
				var moved bool
				k, moved, err = cb.patchFlat(b, x, hs, i, c, fc)
				updated += k
				stale = stale || moved
				break
			}
			var child gpu.Graph
			if child, err = cb.tr.Trace(c.Trace, x.key, true); err == nil {
				err = b.GraphExecChildGraphNodeSetParams(x.X, n, child)
			}
			updated++
		}
		if err != nil {
			return 0, fmt.Errorf("patch %s: %w", c.Name, err)
		}
	}
	if err := hs.stageMoved(x.moved, addrs); err != nil {
		return 0, fmt.Errorf("patch: %w", err)
	}
	if err := hs.applyExec(cb); err != nil {
		return 0, err
	}
	if stale {
		// A flattened command moved to another class: its nodes in the
		// set are another trace's, and the template's are the old one's.
		x.tmpl.broken = "a traced command moved to another alignment class since the template was recorded"
		if err := x.dropSet(); err != nil {
			return 0, fmt.Errorf("patch: %w", err)
		}
	}
	copy(x.addrs, addrs)
	return updated, nil
}

// patchFlat moves flattened command c (command i, fc in x) to the operands
// in x.key and returns how many of its nodes it updated, and whether it
// took them from another trace than the one x's prepared set was made
// from. The kernel nodes a template moves are staged in hs, the others set
// at once.
func (cb *CommandBuffer) patchFlat(b ExecPatcher, x *Exec, hs *hostSet, i int32, c *Command, fc *flatCmd) (int, bool, error) {
	if tmpl := cb.tr.TemplateFor(c.Trace, x.key); tmpl != nil && tmpl == fc.tmpl {
		x.changed = tmpl.Apply(fc.params, x.key, x.changed[:0])
		cb.tr.Moved(c.Trace)
		for _, j := range x.changed {
			staged, err := hs.stageFlat(i, j, fc, x.key)
			if err == nil && !staged {
				err = setNode(b, x.X, fc.nodes[j], &fc.params[j])
			}
			if err != nil {
				return 0, false, fmt.Errorf("node %d of its trace: %w", j, err)
			}
		}
		return len(x.changed), false, nil
	}
	// Another class, or nodes read from a capture: the trace at the new
	// operands, compared node by node.
	fl, err := cb.tr.Flat(c.Trace, x.key, true)
	if err != nil {
		return 0, false, err
	}
	if fl.Nodes == nil {
		return 0, false, &gpu.UpdateError{Op: "graph.Patch", Result: gpu.UpdateTopologyChanged,
			Detail: fmt.Sprintf("the trace at the new addresses cannot be flattened (%s); it was when recorded", fl.Why)}
	}
	if len(fl.Nodes) != len(fc.params) {
		return 0, false, &gpu.UpdateError{Op: "graph.Patch", Result: gpu.UpdateTopologyChanged,
			Detail: fmt.Sprintf("the trace at the new addresses has %d nodes, the recorded one %d", len(fl.Nodes), len(fc.params))}
	}
	for j := range fl.Nodes {
		if !fc.params[j].SameShape(&fl.Nodes[j]) {
			return 0, false, &gpu.UpdateError{Op: "graph.Patch", Result: gpu.UpdateFunctionChanged, Node: fc.nodes[j],
				Detail: fmt.Sprintf("node %d of the trace at the new addresses differs in kind, kernel, launch shape or dependencies", j)}
		}
	}
	updated := 0
	for j := range fl.Nodes {
		if fc.params[j].SameParams(&fl.Nodes[j]) {
			continue
		}
		if err := setNode(b, x.X, fc.nodes[j], &fl.Nodes[j]); err != nil {
			return 0, false, fmt.Errorf("node %d of its trace: %w", j, err)
		}
		updated++
	}
	fc.params, fc.tmpl = fl.Nodes, fl.Template
	return updated, true, nil
}

// setNode sets p on exec node n.
func setNode(b ExecPatcher, x gpu.GraphExec, n gpu.GraphNode, p *trace.Node) error {
	switch p.Type {
	case gpu.NodeKernel:
		return b.GraphExecKernelNodeSetParams(x, n, p.Kernel)
	case gpu.NodeMemcpy:
		return b.GraphExecMemcpyNodeSetParams(x, n, p.Memcpy)
	case gpu.NodeMemset:
		return b.GraphExecMemsetNodeSetParams(x, n, p.Memset)
	}
	return nil // empty nodes have no parameters
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
