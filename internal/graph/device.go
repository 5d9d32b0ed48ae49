package graph

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
)

// Device-side patching (RecordDevice, PatchDevice): the graph's kernel
// nodes are opted in to device-side updates (gpu.DeviceUpdates), and a node
// of the caller's, the patcher, rewrites their pointers on the device at
// every launch. What the device cannot move stays on the host.
//
// Where the patcher runs: before the first command it moves
// (DeviceRecording.Before), beside the commands ahead of that one. A node
// that must wait for the patcher waits for all of it, so the patcher's
// work is on the step's critical path when the step's first command is
// one it moves. The step's first DeviceOptions.HostLead commands, when
// they point into movable buffers, can move from the host instead (one
// exec update per moved node, no upload: they are not opted in), and the
// patcher then runs beside them.
//
// What moves where, for a buffer that moves:
//
//   - A kernel command: on the device, every pointer argument into the
//     buffer (its typed arguments say which are pointers, as for Patch).
//   - A memcpy or memset command: copy and memset nodes cannot be updated
//     from the device. RecordDevice records one as a kernel of the
//     caller's (DeviceOptions: a 4-byte copy or fill kernel) when its
//     size and addresses allow, so that it moves on the device too; else
//     it stays a copy or memset node, moved from the host. A kernel made
//     so is correct only at 4-byte aligned addresses: PatchDevice refuses
//     a move off them (gpu.ErrGraphUpdate), and recording again keeps the
//     command a copy.
//   - A traced command flattened from a template (a library call whose
//     trace was proved patchable, package trace): its kernel nodes on the
//     device, at the template's pointer slots; its copy and memset nodes,
//     if any, from the host. The template holds only at addresses of its
//     alignment class: PatchDevice refuses a move to another class. When
//     the driver will not opt one of its kernels in, the whole command
//     moves from the host (DeviceRecording.HostPath says why).
//   - Any other traced command (not flattened, flattened without a
//     template, or HostPath: collectives) moves from the host, as Patch
//     moves it.
//   - A lead command (HostLead) moves from the host, whatever it is: a
//     kernel's node is updated as Patch updates it, and a copy or memset
//     stays a copy or memset node.
//
// What moves from the host is never an opted-in node, so it needs no
// upload and leaves the device-side parameters of the opted-in nodes as
// the patcher left them (CUDA documents the upload only after host-side
// changes to device-updatable nodes; conformance group DeviceUpdates,
// HostChangeKeepsDeviceState, checks the rest on every backend). The
// host-side parameters of the nodes with slots are never changed, so that
// an upload always restores the addresses the graph was recorded at.

// DeviceOptions say how RecordDevice records.
type DeviceOptions struct {
	// Movable says, per buffer, whether its address may change between
	// steps (params, outputs, states). A pointer into a buffer that never
	// moves is recorded as is and never updated.
	Movable []bool
	// Copy and Fill, when set, are the kernels (kernels.Copy and
	// kernels.Fill: (y, x, n) and (y, value f32, n) over 4-byte elements)
	// that replace memcpy and memset commands over movable buffers. Zero
	// keeps those commands copy and memset nodes, moved from the host.
	Copy, Fill gpu.Function
	// HostLead is how many of the step's first commands move from the
	// host when they point into a movable buffer, so that the patcher need
	// not run before them (see "Where the patcher runs"). 0 moves
	// everything it can on the device.
	HostLead int
}

// DeviceSlot is one pointer parameter of an opted-in kernel node: the 8
// bytes at Offset of the node's parameters hold the address of buffer Buf
// plus Off.
type DeviceSlot struct {
	Node   gpu.GraphNode
	Dev    gpu.DevNode
	Offset uint32
	Buf    int
	Off    uint64
	cmd    int // the command whose node it is
}

// SlotRange is the slots of one buffer: Slots[First : First+N].
type SlotRange struct {
	Buf, First, N int
}

// DeviceRecording is a step recorded for device-side patching and not yet
// instantiated: its graph, with every kernel node that has a pointer into a
// movable buffer opted in (but the lead commands'), where those pointers
// are, and the nodes the patcher must run before. The caller adds the
// patcher (gpu.DeviceUpdates.GraphAddKernelNodeBefore with Before), then
// calls Instantiate or Destroy.
type DeviceRecording struct {
	cb    *CommandBuffer
	r     recording
	addrs []gpu.DevicePtr
	plan  *devPlan
	// Slots are the pointers to move, grouped by buffer in buffer order
	// (each buffer's in command order); Ranges lists each buffer's, for
	// the buffers that have any, in buffer order.
	Slots  []DeviceSlot
	Ranges []SlotRange
	// Before are the nodes the patcher must run before: the entry nodes
	// of the first command with a slot. Every other slot's node comes
	// after them. Empty when there are no slots.
	Before []gpu.GraphNode
	// Lead is how many commands moved from the host as lead commands
	// (DeviceOptions.HostLead) because they point into a movable buffer.
	Lead int
	// HostPath says, for each flattened command whose kernel nodes the
	// driver would not opt in to device-side updates, why: such a command
	// is moved from the host instead.
	HostPath []string
}

// Graph is the recorded graph.
func (d *DeviceRecording) Graph() gpu.Graph { return d.r.g }

// Destroy destroys the recorded graph, when it is not instantiated.
func (d *DeviceRecording) Destroy(b gpu.Backend) error {
	if d.r.g == 0 {
		return nil
	}
	err := b.GraphDestroy(d.r.g)
	d.r.g = 0
	if err != nil {
		return fmt.Errorf("destroy device graph: %w", err)
	}
	return nil
}

// Instantiate instantiates the recorded graph. The Exec it returns is moved
// with PatchDevice, never with Patch or Update. On error the graph is
// destroyed.
func (d *DeviceRecording) Instantiate(b gpu.Backend) (*Exec, error) {
	x, err := b.GraphInstantiate(d.r.g)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("instantiate: %w", err), d.Destroy(b))
	}
	g := d.r.g
	d.r.g = 0
	return &Exec{Graph: g, Nodes: d.r.nodes, X: x, addrs: slices.Clone(d.addrs), flat: d.r.flat,
		dev: d.plan, mark: make([]uint32, len(d.cb.cmds))}, nil
}

// devMode is how a command of a device exec moves, when it does not move
// entirely on the device (devNone).
type devMode uint8

const (
	devNone devMode = iota
	devHost         // moved from the host
	devCopy         // a memcpy recorded as a copy kernel: 4-byte aligned addresses only
	devFill         // a memset recorded as a fill kernel: a 4-byte aligned destination only
	devFlat         // flattened from a template, moved on the device: its class must hold
)

// devPlan is what PatchDevice needs of a device exec.
type devPlan struct {
	mode []devMode // per command
	// flatHost[i]: flattened command i has copy or memset nodes to move
	// from the host.
	flatHost []bool
	// watch[b] lists the commands PatchDevice looks at when buffer b
	// moves: those of mode other than devNone.
	watch [][]int32
}

// kernelizer makes copy and fill kernels of memcpy and memset commands over
// movable buffers (RecordDevice), but of the lead commands.
type kernelizer struct {
	movable    []bool
	copy, fill gpu.Function
	lead       []bool // per command: a lead command, moved from the host
}

// kernel returns the kernel that does c's copy or memset at addrs, when c
// is one that moves and the kernel can do it there: sizes and addresses in
// whole 4-byte elements, no more than an int32 of them, and, for a memset,
// a pattern that is no NaN as a float32 (a fill kernel passes its value as
// one; the bits would survive, but nothing needs the risk).
func (k *kernelizer) kernel(i int, c *Command, addrs []gpu.DevicePtr) (gpu.KernelParams, devMode, bool) {
	if k == nil || (i < len(k.lead) && k.lead[i]) {
		return gpu.KernelParams{}, devNone, false
	}
	switch c.Kind {
	case KindMemcpy:
		dst, src := c.Dst.At(addrs), c.Src.At(addrs)
		n := c.Size / 4
		if k.copy == 0 || !(k.movable[c.Dst.Buf] || k.movable[c.Src.Buf]) || c.Size%4 != 0 ||
			n == 0 || n > math.MaxInt32 || (dst|src)%4 != 0 {
			return gpu.KernelParams{}, devNone, false
		}
		return gpu.KernelParams{Func: k.copy, Config: gpu.Linear(int(n), 256),
			Args: []gpu.Arg{gpu.Ptr(dst), gpu.Ptr(src), gpu.I32(int32(n))}}, devCopy, true
	case KindMemset:
		dst := c.Dst.At(addrs)
		size := c.Count * uint64(c.ElemSize)
		pat, ok := fillPattern(c.Value, c.ElemSize)
		n := size / 4
		if k.fill == 0 || !k.movable[c.Dst.Buf] || !ok || size%4 != 0 || n == 0 || n > math.MaxInt32 || dst%4 != 0 ||
			math.IsNaN(float64(math.Float32frombits(pat))) {
			return gpu.KernelParams{}, devNone, false
		}
		return gpu.KernelParams{Func: k.fill, Config: gpu.Linear(int(n), 256),
			Args: []gpu.Arg{gpu.Ptr(dst), {Kind: gpu.ArgF32, Bits: uint64(pat)}, gpu.I32(int32(n))}}, devFill, true
	}
	return gpu.KernelParams{}, devNone, false
}

// fillPattern is a memset's value repeated over 4 bytes.
func fillPattern(v uint32, elem int) (uint32, bool) {
	switch elem {
	case 1:
		return (v & 0xff) * 0x01010101, true
	case 2:
		return (v & 0xffff) * 0x00010001, true
	case 4:
		return v, true
	}
	return 0, false
}

// RecordDevice records the commands at addrs for device-side patching (see
// "Device-side patching" above): as Instantiate with patch set records them,
// but with memcpy and memset commands over movable buffers made kernels
// where opts and their addresses allow, and with every kernel node that has
// a pointer into a movable buffer opted in to device-side updates through
// du (except the nodes of HostPath and lead commands). Its Slots say where
// those pointers are. The caller adds the node that moves them, before
// Before (gpu.DeviceUpdates.GraphAddKernelNodeBefore), then instantiates
// the recording or destroys it. On error nothing is left behind.
func (cb *CommandBuffer) RecordDevice(b gpu.Backend, du gpu.DeviceUpdates, addrs []gpu.DevicePtr, opts DeviceOptions) (_ *DeviceRecording, err error) {
	if len(opts.Movable) != cb.nbufs || len(addrs) != cb.nbufs {
		return nil, gpu.Errorf("graph.RecordDevice", gpu.ErrInvalidValue, "%d movable flags and %d addresses for %d buffers",
			len(opts.Movable), len(addrs), cb.nbufs)
	}
	if opts.HostLead < 0 {
		return nil, gpu.Errorf("graph.RecordDevice", gpu.ErrInvalidValue, "HostLead %d is negative", opts.HostLead)
	}
	kz := &kernelizer{movable: opts.Movable, copy: opts.Copy, fill: opts.Fill, lead: make([]bool, len(cb.cmds))}
	lead := 0
	for i := range min(opts.HostLead, len(cb.cmds)) {
		if slices.ContainsFunc(cb.cmds[i].buffers(), func(b int) bool { return opts.Movable[b] }) {
			kz.lead[i] = true
			lead++
		}
	}
	r, err := cb.record(b, addrs, true, kz)
	if err != nil {
		return nil, err
	}
	d := &DeviceRecording{cb: cb, r: r, addrs: slices.Clone(addrs), Lead: lead}
	defer func() {
		if err != nil {
			err = errors.Join(err, d.Destroy(b))
			d = nil
		}
	}()
	plan := &devPlan{mode: make([]devMode, len(cb.cmds)), flatHost: make([]bool, len(cb.cmds)), watch: make([][]int32, cb.nbufs)}
	layouts := map[gpu.Function][]gpu.ParamInfo{}
	layout := func(f gpu.Function, args []gpu.Arg) ([]gpu.ParamInfo, error) {
		if l, ok := layouts[f]; ok {
			return l, nil
		}
		l, err := b.FuncParamInfo(f)
		if errors.Is(err, gpu.ErrNotSupported) {
			// Typed arguments only (the commands' own kernels): C's
			// layout, each at a multiple of its size.
			l, err = naturalLayout(args)
		}
		if err != nil {
			return nil, fmt.Errorf("parameter layout: %w", err)
		}
		if len(l) != len(args) {
			return nil, gpu.Errorf("graph.RecordDevice", gpu.ErrInvalidValue, "the driver reports %d parameters, the node has %d", len(l), len(args))
		}
		layouts[f] = l
		return l, nil
	}
	var slots []DeviceSlot
	cmd := 0
	// pointer adds a slot for the pointer at byte off of node n's
	// parameters into buf+at, when buf moves.
	pointer := func(n gpu.GraphNode, off uint64, buf int, at uint64) {
		if opts.Movable[buf] {
			slots = append(slots, DeviceSlot{Node: n, Offset: uint32(off), Buf: buf, Off: at, cmd: cmd})
		}
	}
	for i := range cb.cmds {
		cmd = i
		c := &cb.cmds[i]
		switch {
		case kz.lead[i]:
			plan.mode[i] = devHost
		case c.Kind == KindKernel:
			l, err := layout(c.Func, c.kernelParams(addrs).Args)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c.Name, err)
			}
			for j, a := range c.Args {
				if a.IsPtr() {
					pointer(r.nodes[i], l[j].Offset, a.Ref.Buf, a.Ref.Off)
				}
			}
		case r.made[i] != devNone:
			// A copy or fill kernel: (y, x, n) or (y, value, n).
			p, _, _ := kz.kernel(i, c, addrs)
			l, err := layout(p.Func, p.Args)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c.Name, err)
			}
			pointer(r.nodes[i], l[0].Offset, c.Dst.Buf, c.Dst.Off)
			if c.Kind == KindMemcpy {
				pointer(r.nodes[i], l[1].Offset, c.Src.Buf, c.Src.Off)
			}
			plan.mode[i] = r.made[i]
		case c.Kind == KindTraced && !c.HostPath && r.flat[i] != nil && r.flat[i].tmpl != nil:
			fc := r.flat[i]
			for _, s := range fc.tmpl.Slots() {
				buf := c.Operands[s.Operand]
				if !opts.Movable[buf] {
					continue
				}
				n := &fc.params[s.Node]
				if n.Type != gpu.NodeKernel {
					plan.flatHost[i] = true
					continue
				}
				l, err := layout(n.Kernel.Func, n.Kernel.Args)
				if err != nil {
					return nil, fmt.Errorf("%s: node %d of its trace: %w", c.Name, s.Node, err)
				}
				pointer(fc.nodes[s.Node], l[s.Arg].Offset+uint64(s.Byte), buf, s.Off)
			}
			plan.mode[i] = devFlat
		default:
			plan.mode[i] = devHost
		}
	}
	// Opt in every node with a slot, once. A library's kernel the driver
	// will not opt in moves its command to the host path; one of the
	// program's own kernels is an error.
	devs := map[gpu.GraphNode]gpu.DevNode{}
	refused := map[int]bool{}
	for k := range slots {
		s := &slots[k]
		if refused[s.cmd] {
			continue
		}
		dn, ok := devs[s.Node]
		if !ok {
			if dn, err = du.GraphKernelNodeSetDeviceUpdatable(s.Node, true); err != nil {
				if plan.mode[s.cmd] == devFlat && (errors.Is(err, gpu.ErrInvalidValue) || errors.Is(err, gpu.ErrNotSupported)) {
					refused[s.cmd], plan.mode[s.cmd] = true, devHost
					d.HostPath = append(d.HostPath, fmt.Sprintf("%s: %v", cb.cmds[s.cmd].Name, err))
					continue
				}
				return nil, fmt.Errorf("%s: opt in a kernel node to device-side updates: %w", cb.cmds[s.cmd].Name, err)
			}
			devs[s.Node] = dn
		}
		s.Dev = dn
	}
	slots = slices.DeleteFunc(slots, func(s DeviceSlot) bool { return refused[s.cmd] })
	for i := range cb.cmds {
		if plan.mode[i] == devNone {
			continue
		}
		for _, b := range cb.cmds[i].buffers() {
			if w := plan.watch[b]; opts.Movable[b] && (len(w) == 0 || w[len(w)-1] != int32(i)) {
				plan.watch[b] = append(w, int32(i))
			}
		}
	}
	if len(slots) > 0 {
		d.Before = r.entries(slots[0].cmd) // slots are in command order here
	}
	slices.SortStableFunc(slots, func(a, b DeviceSlot) int { return a.Buf - b.Buf })
	for k := 0; k < len(slots); {
		j := k
		for j < len(slots) && slots[j].Buf == slots[k].Buf {
			j++
		}
		d.Ranges = append(d.Ranges, SlotRange{Buf: slots[k].Buf, First: k, N: j - k})
		k = j
	}
	d.Slots, d.plan = slots, plan
	return d, nil
}

// entries returns the nodes of command i that depend on no node of the
// same command: those of a flattened command's trace without dependencies
// there, else its node.
func (r *recording) entries(i int) []gpu.GraphNode {
	fc := r.flat[i]
	if fc == nil {
		return []gpu.GraphNode{r.nodes[i]}
	}
	var e []gpu.GraphNode
	for j := range fc.params {
		if len(fc.params[j].Deps) == 0 {
			e = append(e, fc.nodes[j])
		}
	}
	return e
}

// naturalLayout lays typed arguments out as C does: each at the next
// multiple of its size.
func naturalLayout(args []gpu.Arg) ([]gpu.ParamInfo, error) {
	l := make([]gpu.ParamInfo, len(args))
	var off uint64
	for i, a := range args {
		n := uint64(a.Size())
		if a.Kind == gpu.ArgBytes || n == 0 {
			return nil, gpu.Errorf("graph.RecordDevice", gpu.ErrNotSupported, "parameter %d is opaque and the driver gives no layout", i)
		}
		off = gpu.RoundUp(off, n)
		l[i] = gpu.ParamInfo{Offset: off, Size: n}
		off += n
	}
	return l, nil
}

// PatchDevice brings the host side of device exec x (from RecordDevice) to
// addrs: it moves from the host what does not move on the device (copy and
// memset nodes that are not kernels, traced commands on the host path),
// checks that what moves on the device still can (copy kernels at 4-byte
// aligned addresses, flattened commands in their template's alignment
// class), and returns how many nodes it updated from the host. None of
// them is opted in, so x needs no upload. It changes no opted-in node and
// allocates nothing when nothing moves on the host. x's host node, when
// HostNodeWord staged it, is applied with them (one Apply).
//
// On error x is in an unknown state and must be destroyed; an error
// wrapping gpu.ErrGraphUpdate means recording again at addrs will succeed
// where this did not (a copy kernel at addresses it cannot take, a new
// alignment class, an update the driver refused).
func (cb *CommandBuffer) PatchDevice(b ExecPatcher, x *Exec, addrs []gpu.DevicePtr) (int, error) {
	hs, err := cb.deviceSet(b, x)
	if err != nil {
		return 0, fmt.Errorf("patch device: %w", err)
	}
	dp := x.dev
	dirty := x.markDirty(cb.used, dp.watch, addrs)
	hs.apply = hs.apply[:0]
	updated, stale := 0, false
	for _, i := range dirty {
		c := &cb.cmds[i]
		var err error
		switch dp.mode[i] {
		case devCopy:
			if dst, src := c.Dst.At(addrs), c.Src.At(addrs); (dst|src)%4 != 0 {
				err = &gpu.UpdateError{Op: "graph.PatchDevice", Result: gpu.UpdateNotSupported, Node: x.Nodes[i],
					Detail: fmt.Sprintf("recorded as a 4-byte copy kernel, now at %#x and %#x, not 4-byte aligned", uint64(dst), uint64(src))}
			}
		case devFill:
			if dst := c.Dst.At(addrs); dst%4 != 0 {
				err = &gpu.UpdateError{Op: "graph.PatchDevice", Result: gpu.UpdateNotSupported, Node: x.Nodes[i],
					Detail: fmt.Sprintf("recorded as a 4-byte fill kernel, now at %#x, not 4-byte aligned", uint64(dst))}
			}
		case devFlat:
			var k int
			k, err = cb.checkFlat(b, x, c, x.flat[i], dp.flatHost[i], addrs)
			updated += k
		case devHost:
			var k int
			var moved bool
			k, moved, err = cb.patchHost(b, x, hs, i, addrs)
			updated += k
			stale = stale || moved
		}
		if err != nil {
			return 0, fmt.Errorf("patch %s: %w", c.Name, err)
		}
	}
	if err := hs.applyExec(cb); err != nil {
		return 0, err
	}
	if stale {
		if err := x.dropSet(); err != nil {
			return 0, fmt.Errorf("patch device: %w", err)
		}
	}
	copy(x.addrs, addrs)
	return updated, nil
}

// checkFlat makes sure flattened command c, moved on the device, stays in
// its template's alignment class at addrs, and moves its copy and memset
// nodes from the host when it has any (host).
func (cb *CommandBuffer) checkFlat(b ExecPatcher, x *Exec, c *Command, fc *flatCmd, host bool, addrs []gpu.DevicePtr) (int, error) {
	x.key = c.operandAddrs(addrs, x.key)
	if tmpl := cb.tr.TemplateFor(c.Trace, x.key); tmpl == nil || tmpl != fc.tmpl {
		return 0, &gpu.UpdateError{Op: "graph.PatchDevice", Result: gpu.UpdateFunctionChanged,
			Detail: "its operands moved to another alignment class: the library may choose other kernels there"}
	}
	if !host {
		return 0, nil
	}
	x.changed = fc.tmpl.Apply(fc.params, x.key, x.changed[:0])
	updated := 0
	for _, j := range x.changed {
		if p := &fc.params[j]; p.Type != gpu.NodeKernel {
			if err := setNode(b, x.X, fc.nodes[j], p); err != nil {
				return 0, fmt.Errorf("node %d of its trace: %w", j, err)
			}
			updated++
		}
	}
	return updated, nil
}

// patchHost moves command i of x from the host, as Patch does (its kernel
// nodes staged in hs); it returns how many nodes it updated and whether
// they now come from another trace than hs was prepared from.
func (cb *CommandBuffer) patchHost(b ExecPatcher, x *Exec, hs *hostSet, i int32, addrs []gpu.DevicePtr) (int, bool, error) {
	c := &cb.cmds[i]
	n := x.Nodes[i]
	switch c.Kind {
	case KindKernel: // a lead command
		return 1, false, hs.stageKernel(c, i, x.addrs, addrs)
	case KindMemcpy:
		return 1, false, b.GraphExecMemcpyNodeSetParams(x.X, n, c.memcpyParams(addrs))
	case KindMemset:
		return 1, false, b.GraphExecMemsetNodeSetParams(x.X, n, c.memsetParams(addrs))
	case KindTraced:
		x.key = c.operandAddrs(addrs, x.key)
		if fc := x.flatAt(i); fc != nil {
			return cb.patchFlat(b, x, hs, i, c, fc)
		}
		child, err := cb.tr.Trace(c.Trace, x.key, true)
		if err == nil {
			err = b.GraphExecChildGraphNodeSetParams(x.X, n, child)
		}
		return 1, false, err
	}
	return 0, false, gpu.Errorf("graph.PatchDevice", gpu.ErrInvalidValue, "%s of kind %d has no host path", c.Name, c.Kind)
}

// Moves counts what moving buffers takes, by how it moves.
type Moves struct {
	// Nodes are the kernel, memcpy and memset nodes to update in place:
	// the commands' own and the nodes of flattened traced commands.
	Nodes int
	// Copies are the memcpy and memset nodes among Nodes (they cannot move
	// on the device), and Kernelizable those of them RecordDevice makes
	// copy and fill kernels when their addresses are 4-byte aligned.
	Copies, Kernelizable int
	// Traced are the traced commands moved whole, through a child graph or
	// on the host path (collectives, functions that do not flatten).
	Traced int
}

// LibraryNodes is how many kernel nodes Moves counts for a library command
// (a GEMM) before it is recorded: cuBLAS runs most GEMMs as one kernel
// (the sim's split-K products take two), and the command flattens where
// the backend reads its kernels back.
const LibraryNodes = 1

// Moves counts, before anything is recorded, what moving every buffer of
// bufs takes: each kernel command one node, each memcpy and memset one
// copy node (Kernelizable when its size is in whole 4-byte elements), each
// library command LibraryNodes nodes, and each other traced command (and
// every HostPath one) one traced command. Exec.Moves counts what a
// recording holds. Buffers out of range are ignored.
func (cb *CommandBuffer) Moves(bufs []int) Moves { return cb.MovesIn(bufs, 0, len(cb.cmds)) }

// MovesIn is Moves over the commands from index from up to, not including,
// to: with RecordDevice's HostLead, MovesIn(bufs, 0, HostLead) is what
// moves from the host as lead commands and MovesIn(bufs, HostLead, Len())
// the rest.
func (cb *CommandBuffer) MovesIn(bufs []int, from, to int) Moves {
	var m Moves
	for _, i := range cb.usersOf(bufs) {
		if i < from || i >= to {
			continue
		}
		c := &cb.cmds[i]
		switch {
		case c.Kind == KindKernel:
			m.Nodes++
		case c.Kind == KindMemcpy || c.Kind == KindMemset:
			m.Nodes++
			m.Copies++
			size := c.Size
			if c.Kind == KindMemset {
				size = c.Count * uint64(c.ElemSize)
			}
			if size%4 == 0 && size > 0 && size/4 <= math.MaxInt32 {
				m.Kernelizable++
			}
		case c.Library && !c.HostPath:
			m.Nodes += LibraryNodes
		default:
			m.Traced++
		}
	}
	return m
}

// Moves counts what moving every buffer of bufs takes in x: as
// CommandBuffer.Moves, but a flattened traced command counts the nodes of
// its trace that point into bufs (all of them when it has no template),
// and copies and memsets count as Kernelizable only when x holds them as
// kernels. Buffers out of range are ignored.
func (x *Exec) Moves(cb *CommandBuffer, bufs []int) Moves {
	var m Moves
	moving := make([]bool, cb.nbufs)
	for _, b := range bufs {
		if b >= 0 && b < cb.nbufs {
			moving[b] = true
		}
	}
	for _, i := range cb.usersOf(bufs) {
		c := &cb.cmds[i]
		fc := x.flatAt(int32(i))
		switch {
		case c.Kind == KindKernel:
			m.Nodes++
		case c.Kind == KindMemcpy || c.Kind == KindMemset:
			m.Nodes++
			m.Copies++
			if x.dev != nil && x.dev.mode[i] != devHost && x.dev.mode[i] != devNone {
				m.Kernelizable++
			}
		case fc != nil && fc.tmpl != nil && !c.HostPath:
			seen := map[int]bool{}
			for _, s := range fc.tmpl.Slots() {
				if !moving[c.Operands[s.Operand]] || seen[s.Node] {
					continue
				}
				seen[s.Node] = true
				m.Nodes++
				if fc.params[s.Node].Type != gpu.NodeKernel {
					m.Copies++
				}
			}
		case fc != nil && !c.HostPath:
			for j := range fc.params {
				if t := fc.params[j].Type; t != gpu.NodeEmpty {
					m.Nodes++
					if t != gpu.NodeKernel {
						m.Copies++
					}
				}
			}
		default:
			m.Traced++
		}
	}
	return m
}

// usersOf returns the commands that reference at least one of bufs, each
// once, in order.
func (cb *CommandBuffer) usersOf(bufs []int) []int {
	seen := make([]bool, len(cb.cmds))
	for _, b := range bufs {
		if b < 0 || b >= cb.nbufs {
			continue
		}
		for _, c := range cb.byBuf[b] {
			seen[c] = true
		}
	}
	var out []int
	for i, s := range seen {
		if s {
			out = append(out, i)
		}
	}
	return out
}
