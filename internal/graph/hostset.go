package graph

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
)

// The host side of moving kernel nodes (Patch, PatchDevice, PatchWhole).
//
// An exec's kernel nodes that move from the host are prepared once, at the
// first move, as a gpu.KernelNodeSet: the nodes of kernel commands with a
// pointer argument, and the kernel nodes of flattened traced commands with a
// template pointer slot (under PatchDevice only those of commands that move
// from the host). The set holds what each node holds on the exec: a step
// rewrites in place the pointer words of the nodes that moved (for a kernel
// command its pointer arguments into the buffers that moved, for a
// flattened node every slot of its template) and hands them to the backend
// in one Apply, one driver call per node on CUDA.
//
// Patch writes the kernel commands' words buffer by buffer: the set lends
// each word (gpu.KernelNodeWords), and the list of a buffer's words is made
// with the set (wordsByBuffer), so that a moving step touches the moved
// words, which the driver reads next, and little else. Between two steps
// the driver's own calls (and the caller's input writes) leave the host's
// caches cold, and there every line a step touches is paid for
// (BenchmarkStubStepHostCold in package gpu/cuda).
//
// The set's words of a node equal the exec's parameters for it whenever the
// exec is consistent: after every Patch, and after the exec's
// initialisation. A change made around the set, which would leave its words
// stale, drops the set, and the next move prepares it again: a whole-graph
// Update, and a flattened command moved to another alignment class (its
// nodes then come from another trace).

// hostSet is an exec's prepared kernel nodes.
type hostSet struct {
	set gpu.KernelNodeSet
	// cmd[i] is command i's node in set, -1 when it has none; flat[i][j]
	// the j-th node of flattened command i's trace, -1 for none, flat[i]
	// nil when the command has none in the set.
	cmd  []int32
	flat [][]int32
	// owner[k] is the command of the set's node k.
	owner []int32
	// apply is the nodes of the step, in the order staged.
	apply []int32
	// host is the set's node of the exec's host node (SetHostNode), -1
	// for none; hostStaged says whether it is staged for the next apply.
	host       int32
	hostStaged bool
	// byBuf[b] are the pointer words into buffer b of the kernel
	// commands' nodes: what Patch writes when b moves (stageMoved).
	// staged[k] == gen: node k is in apply already.
	byBuf  [][]hostWord
	staged []uint32
	gen    uint32
}

// hostWord is a pointer argument of a kernel command's node in the set:
// node k's argument arg, off bytes into its buffer. w is the argument's
// word in the set's own memory (gpu.KernelNodeWords), nil when the set
// lends none: it is then written with SetWord.
type hostWord struct {
	w   *uint64
	off uint64
	k   int32
	arg int32
}

// preparedSet returns x's host set, preparing it at the first call: every
// kernel node that include(i) admits command i's nodes to.
func (x *Exec) preparedSet(b gpu.ExecKernelNodeSetter, cb *CommandBuffer, include func(i int) bool) (*hostSet, error) {
	if x.hs != nil {
		return x.hs, nil
	}
	hs := &hostSet{cmd: make([]int32, len(cb.cmds)), flat: make([][]int32, len(cb.cmds)), host: -1}
	var (
		nodes  []gpu.GraphNode
		params []gpu.KernelParams
	)
	add := func(i int, n gpu.GraphNode, p gpu.KernelParams) int32 {
		nodes = append(nodes, n)
		params = append(params, p)
		hs.owner = append(hs.owner, int32(i))
		return int32(len(nodes) - 1)
	}
	for i := range cb.cmds {
		hs.cmd[i] = -1
		c := &cb.cmds[i]
		if include != nil && !include(i) {
			continue
		}
		switch c.Kind {
		case KindKernel:
			if len(c.ptrs) > 0 {
				hs.cmd[i] = add(i, x.Nodes[i], c.kernelParams(x.addrs))
			}
		case KindMemcpy, KindMemset:
			if x.madeAt(int32(i)) != devNone {
				// A copy or fill kernel (InstantiateWith), at the
				// addresses it was recorded or last moved at.
				if p, _, ok := x.kz.kernel(i, c, x.addrs); ok {
					hs.cmd[i] = add(i, x.Nodes[i], p)
				}
			}
		case KindTraced:
			fc := x.flatAt(int32(i))
			if fc == nil || fc.tmpl == nil {
				continue
			}
			for j := range fc.params {
				if fc.params[j].Type != gpu.NodeKernel || len(fc.tmpl.SlotsOf(j)) == 0 {
					continue
				}
				if hs.flat[i] == nil {
					hs.flat[i] = make([]int32, len(fc.params))
					for k := range hs.flat[i] {
						hs.flat[i][k] = -1
					}
				}
				hs.flat[i][j] = add(i, fc.nodes[j], fc.params[j].Kernel)
			}
		}
	}
	if x.hasHost {
		hs.host = add(-1, x.host.n, x.host.p)
	}
	set, err := gpu.PrepareKernelNodes(b, x.X, nodes, params)
	if err != nil {
		return nil, fmt.Errorf("prepare the exec's kernel nodes: %w", err)
	}
	hs.set = set
	hs.wordsByBuffer(cb, len(x.addrs))
	x.hs = hs
	return hs, nil
}

// wordsByBuffer lists, per buffer, the pointer words of the kernel
// commands' nodes in the set. A moving step then visits only the words
// that moved, each where the driver reads it next, rather than every
// pointer argument of every node that moved and the bookkeeping around
// them: on a decode step most of a node's pointers (weights, activations)
// stay, and what the host touches per step is what it pays for when the
// driver's own calls have left its caches cold.
func (hs *hostSet) wordsByBuffer(cb *CommandBuffer, nbufs int) {
	hs.byBuf = make([][]hostWord, nbufs)
	hs.staged = make([]uint32, hs.set.Len())
	words, _ := hs.set.(gpu.KernelNodeWords)
	for i, k := range hs.cmd {
		c := &cb.cmds[i]
		if k < 0 || c.Kind != KindKernel {
			continue
		}
		for _, p := range c.ptrs {
			hw := hostWord{off: p.Ref.Off, k: k, arg: int32(p.Arg)}
			if words != nil {
				hw.w, _ = words.Word(int(k), p.Arg, 0) // nil: SetWord
			}
			hs.byBuf[p.Ref.Buf] = append(hs.byBuf[p.Ref.Buf], hw)
		}
	}
}

// stageMoved writes the pointer words into the buffers bufs, now at addrs,
// of the kernel commands' nodes and stages each node once.
func (hs *hostSet) stageMoved(bufs []int, addrs []gpu.DevicePtr) error {
	hs.gen++
	if hs.gen == 0 {
		// The generation wrapped: stale marks could equal it again.
		clear(hs.staged)
		hs.gen = 1
	}
	for _, b := range bufs {
		base := addrs[b]
		for _, hw := range hs.byBuf[b] {
			v := uint64(base.Add(hw.off))
			if hw.w != nil {
				*hw.w = v
			} else if err := hs.set.SetWord(int(hw.k), int(hw.arg), 0, v); err != nil {
				return err
			}
			if hs.staged[hw.k] != hs.gen {
				hs.staged[hw.k] = hs.gen
				hs.apply = append(hs.apply, hw.k)
			}
		}
	}
	return nil
}

// dropSet releases x's host set; the next move prepares it again.
func (x *Exec) dropSet() error {
	if x.hs == nil {
		return nil
	}
	err := x.hs.set.Close()
	x.hs = nil
	return err
}

// stageKernel writes kernel command i's pointers at addrs into the set and
// stages its node; held are the addresses the set's words hold.
func (hs *hostSet) stageKernel(c *Command, i int32, held, addrs []gpu.DevicePtr) error {
	k, err := hs.writeKernel(c, i, held, addrs)
	if err == nil {
		hs.apply = append(hs.apply, k)
	}
	return err
}

// writeKernel writes kernel command i's pointers at addrs into the set and
// returns its node there. The set's words are command i's at held (the
// exec's addresses, which they mirror), so only the pointers into buffers
// whose address changed are written: on a decode step most of a kernel's
// pointers (weights, activations) stay where they were.
func (hs *hostSet) writeKernel(c *Command, i int32, held, addrs []gpu.DevicePtr) (int32, error) {
	k := hs.cmd[i]
	if k < 0 {
		return 0, gpu.Errorf("graph.Patch", gpu.ErrInvalidValue, "%s has no prepared node", c.Name)
	}
	for _, p := range c.ptrs {
		if held[p.Ref.Buf] == addrs[p.Ref.Buf] {
			continue
		}
		if err := hs.set.SetWord(int(k), p.Arg, 0, uint64(p.Ref.At(addrs))); err != nil {
			return 0, err
		}
	}
	return k, nil
}

// writeMade writes the pointers at addrs of command i, a memcpy or memset
// recorded as a copy or fill kernel (mode), node n, into the set and
// returns its node there. The kernels work in 4-byte elements: a move off
// 4-byte alignment is refused (gpu.ErrGraphUpdate), and recording again
// there makes the command a copy or memset node.
func (hs *hostSet) writeMade(c *Command, i int32, mode devMode, n gpu.GraphNode, addrs []gpu.DevicePtr) (int32, error) {
	k := hs.cmd[i]
	if k < 0 {
		return 0, gpu.Errorf("graph.Patch", gpu.ErrInvalidValue, "%s has no prepared node", c.Name)
	}
	dst := c.Dst.At(addrs)
	if mode == devCopy {
		src := c.Src.At(addrs)
		if (dst|src)%4 != 0 {
			return 0, &gpu.UpdateError{Op: "graph.Patch", Result: gpu.UpdateNotSupported, Node: n,
				Detail: fmt.Sprintf("%s was recorded as a 4-byte copy kernel, now at %#x and %#x, not 4-byte aligned", c.Name, uint64(dst), uint64(src))}
		}
		if err := hs.set.SetWord(int(k), 1, 0, uint64(src)); err != nil {
			return 0, err
		}
	} else if dst%4 != 0 {
		return 0, &gpu.UpdateError{Op: "graph.Patch", Result: gpu.UpdateNotSupported, Node: n,
			Detail: fmt.Sprintf("%s was recorded as a 4-byte fill kernel, now at %#x, not 4-byte aligned", c.Name, uint64(dst))}
	}
	if err := hs.set.SetWord(int(k), 0, 0, uint64(dst)); err != nil {
		return 0, err
	}
	return k, nil
}

// stageFlat writes every template slot of node j of flattened command i at
// the operands ops into the set and stages it; false when the node is not
// in the set.
func (hs *hostSet) stageFlat(i int32, j int, fc *flatCmd, ops []gpu.DevicePtr) (bool, error) {
	k, ok, err := hs.writeFlat(i, j, fc, ops)
	if ok && err == nil {
		hs.apply = append(hs.apply, k)
	}
	return ok, err
}

// writeFlat writes every template slot of node j of flattened command i at
// the operands ops into the set and returns the node there; false when the
// node is not in the set.
func (hs *hostSet) writeFlat(i int32, j int, fc *flatCmd, ops []gpu.DevicePtr) (int32, bool, error) {
	f := hs.flat[i]
	if f == nil || f[j] < 0 {
		return 0, false, nil
	}
	k := f[j]
	for _, s := range fc.tmpl.SlotsOf(j) {
		if err := hs.set.SetWord(int(k), s.Arg, s.Byte, uint64(ops[s.Operand])+s.Off); err != nil {
			return 0, false, err
		}
	}
	return k, true, nil
}

// applyExec applies the staged nodes to the exec, naming the command of the
// one that failed.
func (hs *hostSet) applyExec(cb *CommandBuffer) error {
	if hs.hostStaged {
		hs.apply = append(hs.apply, hs.host)
		hs.hostStaged = false
	}
	idx := hs.apply
	hs.apply = hs.apply[:0]
	if len(idx) == 0 {
		return nil
	}
	if k, err := hs.set.Apply(idx); err != nil {
		return fmt.Errorf("patch %s: %w", hs.name(cb, idx, k), err)
	}
	return nil
}

// name names the command of idx[k], for errors.
func (hs *hostSet) name(cb *CommandBuffer, idx []int32, k int) string {
	if k < 0 || k >= len(idx) {
		return "the exec's kernel nodes"
	}
	if idx[k] == hs.host {
		return "the exec's host node"
	}
	return cb.cmds[hs.owner[idx[k]]].Name
}

// SetHostNode makes kernel node n of x, which is no command's (device's
// inline patcher), move from the host in the set PatchDevice moves the
// commands' nodes in, prepared with p: a step that moves both makes one
// Apply (on CUDA, the context made current once for all of them). Call it
// before the first PatchDevice, HostNodeWord or ApplyHost; x keeps p's
// arguments (a copy) as the set holds them.
func (x *Exec) SetHostNode(n gpu.GraphNode, p gpu.KernelParams) error {
	if x.dev == nil || x.hs != nil {
		return gpu.Errorf("graph.SetHostNode", gpu.ErrIllegalState, "the exec was not recorded for device-side patching, or its host nodes are prepared already")
	}
	p.Args = slices.Clone(p.Args)
	for i := range p.Args {
		p.Args[i].Raw = slices.Clone(p.Args[i].Raw)
	}
	x.host.n, x.host.p, x.hasHost = n, p, true
	return nil
}

// deviceSet is the host set of device exec x: its host-path commands'
// kernel nodes and its host node.
func (cb *CommandBuffer) deviceSet(b gpu.ExecKernelNodeSetter, x *Exec) (*hostSet, error) {
	dp := x.dev
	if dp == nil {
		return nil, gpu.Errorf("graph.PatchDevice", gpu.ErrInvalidValue, "the exec was not recorded for device-side patching")
	}
	return x.preparedSet(b, cb, func(i int) bool { return dp.mode[i] == devHost })
}

// HostNodeWord sets the 8-byte word at byte off of argument arg of x's
// host node (SetHostNode) to v in its prepared parameters and stages the
// node: the next PatchDevice or ApplyHost applies it.
func (cb *CommandBuffer) HostNodeWord(b gpu.ExecKernelNodeSetter, x *Exec, arg, off int, v uint64) error {
	if !x.hasHost {
		return gpu.Errorf("graph.HostNodeWord", gpu.ErrIllegalState, "the exec has no host node")
	}
	hs, err := cb.deviceSet(b, x)
	if err != nil {
		return err
	}
	if err := hs.set.SetWord(int(hs.host), arg, off, v); err != nil {
		return err
	}
	// What a set prepared again (after a change around it) starts from.
	if a := &x.host.p.Args[arg]; off == 0 && a.Kind != gpu.ArgBytes {
		a.Bits = v
	} else if off >= 0 && off+8 <= len(a.Raw) {
		binary.LittleEndian.PutUint64(a.Raw[off:], v)
	}
	hs.hostStaged = true
	return nil
}

// ApplyHost applies x's host node when it is staged (HostNodeWord) and no
// PatchDevice has applied it since: for a step in which nothing else moves
// from the host.
func (cb *CommandBuffer) ApplyHost(x *Exec) error {
	if x.hs == nil || !x.hs.hostStaged {
		return nil
	}
	return x.hs.applyExec(cb)
}
