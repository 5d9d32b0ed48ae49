package drivercost

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/report"
)

// This file holds the rows of a moving step's host side at the driver's own
// price: what one exec update of a kernel node costs, by the size of the
// node's parameter block, with the graph idle and while it runs; what a step
// of m updates and a launch costs; and a whole-graph update from a host
// template, per node. The bench command runs MeasureNodeUpdates in the same
// run as the strategies, so that every strategy's host time per moved node
// sits beside the driver's.
//
// The setting is a chain of K kernel nodes, each reading one buffer of 256
// floats and writing the next, of a kernel whose parameter block is P bytes
// (two pointers, two 4-byte integers, and 8-byte words of padding: 24, 152,
// 360 and 1024 bytes cover the built-in kernels, a cuBLAS GEMM's and a
// large one). The kernels are generated (probeModule), so every size has
// the same work. Updates go through a prepared gpu.KernelNodeSet, the path
// the patch strategy takes (one driver call per node on CUDA), and each
// update moves both pointers between two sets of buffers; the per-call
// path (GraphExecKernelNodeSetParams) has a row of its own.

// Rows of the node update section: formats over P and K (and m).
const (
	rowUpdIdle      = "node update P=%dB K=%d: idle, per node"
	rowUpdFlight    = "node update P=%dB K=%d: in flight, per node"
	rowUpdCall      = "node update P=%dB K=%d: GraphExecKernelNodeSetParams, idle, per node"
	rowUpdStep      = "node update P=%dB K=%d: step of %d updates + launch"
	rowUpdSlope     = "node update P=%dB K=%d: step cost per updated node"
	rowWholeSet     = "whole update P=%dB K=%d: template node set, per node"
	rowWholeExec    = "whole update P=%dB K=%d: GraphExecUpdate"
	rowWholePerNode = "whole update P=%dB K=%d: template + update, per node"
	rowLaunchPlain  = "node update P=%dB K=%d: launch awaited, no update, plain nodes"
	rowLaunchDevUpd = "node update P=%dB K=%d: launch awaited, no update, every node device-updatable"
)

// UpdateRow names a row of the node update section for parameter blocks of
// p bytes and a chain of k nodes; what is one of "idle", "in-flight",
// "call", "slope", "template-set", "exec-update", "whole-per-node",
// "launch-plain", "launch-device-updatable", or "step" (with m updates).
// Empty for anything else.
func UpdateRow(what string, p, k, m int) string {
	f, ok := map[string]string{
		"idle": rowUpdIdle, "in-flight": rowUpdFlight, "call": rowUpdCall, "slope": rowUpdSlope,
		"template-set": rowWholeSet, "exec-update": rowWholeExec, "whole-per-node": rowWholePerNode,
		"launch-plain": rowLaunchPlain, "launch-device-updatable": rowLaunchDevUpd,
	}[what]
	switch {
	case what == "step":
		return fmt.Sprintf(rowUpdStep, p, k, m)
	case !ok:
		return ""
	}
	return fmt.Sprintf(f, p, k)
}

// probeWords is how many floats each buffer of the chain holds.
const probeWords = 256

// probeModule is a module of one kernel per parameter block size: y[i] =
// x[i]·0.999 + 0.001 over n floats, with parameters (y, x, n, 0, then
// (P-24)/8 unused 8-byte words). Sizes must be 24 plus a multiple of 8.
func probeModule(sizes []int) (*gpu.ModuleImage, error) {
	img := &gpu.ModuleImage{Name: "stablegraph-drivercost-probe"}
	var ptx strings.Builder
	ptx.WriteString(".version 7.0\n.target sm_52\n.address_size 64\n")
	for _, p := range sizes {
		if p < 24 || (p-24)%8 != 0 {
			return nil, fmt.Errorf("drivercost: parameter block of %d bytes: must be 24 plus a multiple of 8", p)
		}
		name := probeKernel(p)
		kinds := []gpu.ArgKind{gpu.ArgPtr, gpu.ArgPtr, gpu.ArgI32, gpu.ArgU32}
		for range (p - 24) / 8 {
			kinds = append(kinds, gpu.ArgU64)
		}
		img.Kernels = append(img.Kernels, gpu.KernelSpec{Name: name, Params: kinds, Ref: refProbe})
		fmt.Fprintf(&ptx, "\n.visible .entry %s(\n\t.param .u64 %[1]s_y,\n\t.param .u64 %[1]s_x,\n\t.param .u32 %[1]s_n,\n\t.param .u32 %[1]s_z", name)
		for i := range (p - 24) / 8 {
			fmt.Fprintf(&ptx, ",\n\t.param .u64 %s_pad%d", name, i)
		}
		fmt.Fprintf(&ptx, `
)
{
	.reg .pred %%p<2>;
	.reg .f32 %%f<3>;
	.reg .b32 %%r<6>;
	.reg .b64 %%rd<8>;
	ld.param.u64 %%rd1, [%[1]s_y];
	ld.param.u64 %%rd2, [%[1]s_x];
	ld.param.u32 %%r1, [%[1]s_n];
	mov.u32 %%r2, %%ctaid.x;
	mov.u32 %%r3, %%ntid.x;
	mov.u32 %%r4, %%tid.x;
	mad.lo.s32 %%r5, %%r2, %%r3, %%r4;
	setp.ge.s32 %%p1, %%r5, %%r1;
	@%%p1 bra $L_%[1]s_done;
	cvta.to.global.u64 %%rd3, %%rd1;
	cvta.to.global.u64 %%rd4, %%rd2;
	mul.wide.s32 %%rd5, %%r5, 4;
	add.s64 %%rd6, %%rd4, %%rd5;
	ld.global.f32 %%f1, [%%rd6];
	fma.rn.f32 %%f2, %%f1, 0f3F7FBE77, 0f3A83126F;
	add.s64 %%rd7, %%rd3, %%rd5;
	st.global.f32 [%%rd7], %%f2;
$L_%[1]s_done:
	ret;
}
`, name)
	}
	code := []byte(ptx.String())
	img.Code = func(t gpu.Target) ([]byte, error) {
		if t.Format != gpu.CodePTX {
			return nil, fmt.Errorf("drivercost: the probe kernels are PTX only, not %s: %w", t, gpu.ErrNotSupported)
		}
		return code, nil
	}
	return img, nil
}

func probeKernel(p int) string { return fmt.Sprintf("sg_probe_update_%d", p) }

// refProbe is the probe kernels' Go reference (sim).
func refProbe(mem gpu.Memory, _ gpu.LaunchConfig, args []gpu.Arg) error {
	n := int(args[2].AsI32())
	x, err := gpu.ReadF32(mem, args[1].AsPtr(), n)
	if err != nil {
		return err
	}
	for i := range x {
		x[i] = float32(math.FMA(float64(x[i]), float64(float32(0.999)), float64(float32(0.001))))
	}
	return gpu.WriteF32(mem, args[0].AsPtr(), x)
}

// chain is the node update section's setting for one P and K: the module's
// kernel, two sets of K+1 buffers, the chain recorded over set 0 and
// instantiated, and its nodes prepared as a set.
type chain struct {
	b     gpu.Backend
	s     gpu.Stream
	f     gpu.Function
	p, k  int
	bufs  [2][]gpu.DevicePtr
	g     gpu.Graph
	x     gpu.GraphExec
	nodes []gpu.GraphNode
	set   gpu.KernelNodeSet
	all   []int32
	on    int // the buffer set the nodes hold
}

// newChain builds a chain of k nodes of f (parameter blocks of p bytes) on
// s, every handle pushed onto st.
func newChain(b gpu.Backend, dev int, s gpu.Stream, f gpu.Function, p, k int, st *stack) (*chain, error) {
	return newChainWith(b, dev, s, f, p, k, nil, st)
}

// newChainWith is newChain with, when du is set, every node opted in to
// device-side updates (as the device strategy opts in the nodes it moves)
// and the graph uploaded, with no node set prepared.
func newChainWith(b gpu.Backend, dev int, s gpu.Stream, f gpu.Function, p, k int, du gpu.DeviceUpdates, st *stack) (*chain, error) {
	c := &chain{b: b, s: s, f: f, p: p, k: k}
	for set := range c.bufs {
		for range k + 1 {
			ptr, err := b.MemAlloc(dev, 4*probeWords)
			if err != nil {
				return nil, fmt.Errorf("MemAlloc: %w", err)
			}
			st.push(func() error { return b.MemFree(ptr) })
			c.bufs[set] = append(c.bufs[set], ptr)
		}
	}
	for _, ptr := range c.bufs[0] {
		if err := b.Memset(gpu.Memset{Dst: ptr, ElemSize: 4, Count: probeWords}); err != nil {
			return nil, fmt.Errorf("Memset: %w", err)
		}
	}
	for _, ptr := range c.bufs[1] {
		if err := b.Memset(gpu.Memset{Dst: ptr, ElemSize: 4, Count: probeWords}); err != nil {
			return nil, fmt.Errorf("Memset: %w", err)
		}
	}
	g, err := b.GraphCreate(dev)
	if err != nil {
		return nil, fmt.Errorf("GraphCreate: %w", err)
	}
	st.push(func() error { return b.GraphDestroy(g) })
	c.g = g
	params := make([]gpu.KernelParams, k)
	for i := range k {
		params[i] = c.params(i, 0)
		var deps []gpu.GraphNode
		if i > 0 {
			deps = c.nodes[i-1 : i]
		}
		n, err := b.GraphAddKernelNode(g, deps, params[i])
		if err != nil {
			return nil, fmt.Errorf("GraphAddKernelNode: %w", err)
		}
		c.nodes = append(c.nodes, n)
		c.all = append(c.all, int32(i))
		if du != nil {
			if _, err := du.GraphKernelNodeSetDeviceUpdatable(n, true); err != nil {
				return nil, fmt.Errorf("GraphKernelNodeSetDeviceUpdatable: %w", err)
			}
		}
	}
	if c.x, err = b.GraphInstantiate(g); err != nil {
		return nil, fmt.Errorf("GraphInstantiate: %w", err)
	}
	x := c.x
	st.push(func() error { return b.GraphExecDestroy(x) })
	if du != nil {
		// A graph with device-updatable nodes must be uploaded before it
		// is launched; its nodes move on the device, not through a set.
		if err := du.GraphUpload(c.x, s); err != nil {
			return nil, fmt.Errorf("GraphUpload: %w", err)
		}
	} else {
		if c.set, err = gpu.PrepareKernelNodes(b, c.x, c.nodes, params); err != nil {
			return nil, fmt.Errorf("PrepareKernelNodes: %w", err)
		}
		st.push(c.set.Close)
	}
	// The first launch uploads the graph: not what a step pays.
	if err := b.GraphLaunch(c.x, s); err != nil {
		return nil, fmt.Errorf("GraphLaunch: %w", err)
	}
	return c, b.StreamSynchronize(s)
}

// params are node i's parameters over buffer set set.
func (c *chain) params(i, set int) gpu.KernelParams {
	args := []gpu.Arg{gpu.Ptr(c.bufs[set][i+1]), gpu.Ptr(c.bufs[set][i]), gpu.I32(probeWords), gpu.U32(0)}
	for range (c.p - 24) / 8 {
		args = append(args, gpu.U64(0))
	}
	return gpu.KernelParams{Func: c.f, Config: gpu.Linear(probeWords, 256), Args: args}
}

// point writes node i's pointers over buffer set set into the set.
func (c *chain) point(i, set int) error {
	if err := c.set.SetWord(i, 0, 0, uint64(c.bufs[set][i+1])); err != nil {
		return err
	}
	return c.set.SetWord(i, 1, 0, uint64(c.bufs[set][i]))
}

// flip points every node at the other buffer set, in the set only.
func (c *chain) flip() error {
	c.on ^= 1
	for i := range c.k {
		if err := c.point(i, c.on); err != nil {
			return err
		}
	}
	return nil
}

// updateSteps are the m of the step rows: updates per step before the
// launch.
var updateSteps = []int{0, 1, 2, 8, 16, 48}

// hostUpdates measures, for every P of opts.ParamBytes and K of
// opts.UpdateNodes, the node update rows.
func (m *bench) hostUpdates() (err error) {
	var st stack
	defer st.release(&err)
	img, err := probeModule(m.opts.ParamBytes)
	if err != nil {
		return err
	}
	mod, err := m.b.ModuleLoad(m.dev, img)
	if err != nil {
		return fmt.Errorf("ModuleLoad of the probe kernels: %w", err)
	}
	st.push(func() error { return m.b.ModuleUnload(mod) })
	s, err := m.stream(&st)
	if err != nil {
		return fmt.Errorf("StreamCreate: %w", err)
	}
	st.push(func() error { return m.b.StreamSynchronize(s) })
	for _, p := range m.opts.ParamBytes {
		f, err := m.b.ModuleFunction(mod, probeKernel(p))
		if err != nil {
			return fmt.Errorf("ModuleFunction %s: %w", probeKernel(p), err)
		}
		for _, k := range m.opts.UpdateNodes {
			m.progress("node updates: P=%d bytes, K=%d", p, k)
			if err := m.updateRows(s, f, p, k); err != nil {
				return fmt.Errorf("P=%d K=%d: %w", p, k, err)
			}
		}
	}
	return nil
}

// updateRows measures the rows of one P and K.
func (m *bench) updateRows(s gpu.Stream, f gpu.Function, p, k int) (err error) {
	var st stack
	defer st.release(&err)
	c, err := newChain(m.b, m.dev, s, f, p, k, &st)
	if err != nil {
		return err
	}
	st.push(func() error { return m.b.StreamSynchronize(s) })
	n := m.opts.UpdateIterations
	if err := m.iterate(n, func(warm bool) error {
		idle, flight, err := c.once()
		if err != nil {
			return err
		}
		m.add(fmt.Sprintf(rowUpdIdle, p, k), Host, warm, idle)
		m.add(fmt.Sprintf(rowUpdFlight, p, k), Host, warm, flight)
		c.on ^= 1
		params := make([]gpu.KernelParams, k)
		for i := range k {
			params[i] = c.params(i, c.on)
		}
		t0 := time.Now()
		for i := range k {
			if err := m.b.GraphExecKernelNodeSetParams(c.x, c.nodes[i], params[i]); err != nil {
				return fmt.Errorf("GraphExecKernelNodeSetParams: %w", err)
			}
		}
		m.add(fmt.Sprintf(rowUpdCall, p, k), Host, warm, us(time.Since(t0))/float64(k))
		// The exec holds set c.on now: so must the set.
		for i := range k {
			if err := c.point(i, c.on); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	var steps []float64
	for _, mm := range updateSteps {
		if mm > k {
			continue
		}
		var med []float64
		if err := m.iterate(n, func(warm bool) error {
			d, err := c.steps(mm, 50)
			if err != nil {
				return err
			}
			m.add(fmt.Sprintf(rowUpdStep, p, k, mm), Host, warm, d)
			if !warm {
				med = append(med, d)
			}
			return nil
		}); err != nil {
			return err
		}
		steps = append(steps, report.Percentile(med, 50))
	}
	if len(steps) > 1 {
		last := updateSteps[len(steps)-1]
		m.add(fmt.Sprintf(rowUpdSlope, p, k), Host, false, (steps[len(steps)-1]-steps[0])/float64(last))
	}
	if err := m.iterate(n, func(warm bool) error {
		set, exec, err := c.whole()
		if errors.Is(err, gpu.ErrNotSupported) {
			for _, r := range []string{rowWholeSet, rowWholeExec, rowWholePerNode} {
				m.skip(fmt.Sprintf(r, p, k), Host, err)
			}
			return nil
		}
		if err != nil {
			return err
		}
		m.add(fmt.Sprintf(rowWholeSet, p, k), Host, warm, set/float64(k))
		m.add(fmt.Sprintf(rowWholeExec, p, k), Host, warm, exec)
		m.add(fmt.Sprintf(rowWholePerNode, p, k), Host, warm, (set+exec)/float64(k))
		return nil
	}); err != nil {
		return err
	}
	return m.launchRows(c, s, f, p, k, &st)
}

// launchRows times the launch of c's graph, awaited before the next, beside
// the launch of the same chain with every node opted in to device-side
// updates: what the driver charges a launch for the device strategy's
// graph, apart from stablegraph. Skipped where the device has no
// device-side updates.
func (m *bench) launchRows(c *chain, s gpu.Stream, f gpu.Function, p, k int, st *stack) error {
	plain, dev := fmt.Sprintf(rowLaunchPlain, p, k), fmt.Sprintf(rowLaunchDevUpd, p, k)
	du, ok := m.b.(gpu.DeviceUpdates)
	var why error = fmt.Errorf("backend %s: %w", m.b.Name(), gpu.ErrNotSupported)
	if ok {
		why = du.DeviceUpdatesSupported(m.dev)
	}
	if why != nil {
		m.skip(plain, Host, why)
		m.skip(dev, Host, why)
		return nil
	}
	d, err := newChainWith(m.b, m.dev, s, f, p, k, du, st)
	if err != nil {
		return fmt.Errorf("the device-updatable chain: %w", err)
	}
	// One launch of each in turn, each awaited, so that both meet the
	// host in the same state.
	const launches = 20
	return m.iterate(m.opts.UpdateIterations, func(warm bool) error {
		var tp, td time.Duration
		for range launches {
			for _, x := range []struct {
				g gpu.GraphExec
				t *time.Duration
			}{{c.x, &tp}, {d.x, &td}} {
				t0 := time.Now()
				if err := m.b.GraphLaunch(x.g, s); err != nil {
					return errors.Join(fmt.Errorf("GraphLaunch: %w", err), m.b.StreamSynchronize(s))
				}
				*x.t += time.Since(t0)
				if err := m.b.StreamSynchronize(s); err != nil {
					return err
				}
			}
		}
		m.add(plain, Host, warm, us(tp)/launches)
		m.add(dev, Host, warm, us(td)/launches)
		return nil
	})
}

// once updates every node with the graph idle, then launches it and updates
// every node while it runs; it returns the host microseconds per node of
// each.
func (c *chain) once() (idle, flight float64, err error) {
	if err := c.b.StreamSynchronize(c.s); err != nil {
		return 0, 0, err
	}
	if err := c.flip(); err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	if _, err := c.set.Apply(c.all); err != nil {
		return 0, 0, fmt.Errorf("apply the node set: %w", err)
	}
	idle = us(time.Since(t0)) / float64(c.k)
	if err := c.b.GraphLaunch(c.x, c.s); err != nil {
		return 0, 0, fmt.Errorf("GraphLaunch: %w", err)
	}
	if err := c.flip(); err != nil {
		return 0, 0, err
	}
	t0 = time.Now()
	if _, err := c.set.Apply(c.all); err != nil {
		return 0, 0, errors.Join(fmt.Errorf("apply the node set while the graph runs: %w", err), c.b.StreamSynchronize(c.s))
	}
	flight = us(time.Since(t0)) / float64(c.k)
	return idle, flight, c.b.StreamSynchronize(c.s)
}

// steps runs n steps back to back, each updating mm nodes (moving their
// pointers to the other buffer set) and launching; it returns the host
// microseconds per step.
func (c *chain) steps(mm, n int) (float64, error) {
	if err := c.b.StreamSynchronize(c.s); err != nil {
		return 0, err
	}
	idx := make([]int32, mm)
	t0 := time.Now()
	for step := range n {
		for j := range mm {
			i := (step*7 + j) % c.k
			if err := c.point(i, step&1); err != nil {
				return 0, err
			}
			idx[j] = int32(i)
		}
		if _, err := c.set.Apply(idx); err != nil {
			return 0, errors.Join(fmt.Errorf("apply the node set: %w", err), c.b.StreamSynchronize(c.s))
		}
		if err := c.b.GraphLaunch(c.x, c.s); err != nil {
			return 0, errors.Join(fmt.Errorf("GraphLaunch: %w", err), c.b.StreamSynchronize(c.s))
		}
	}
	d := us(time.Since(t0)) / float64(n)
	// The nodes hold a mix of both sets now: bring every one to c.on.
	for i := range c.k {
		if err := c.point(i, c.on); err != nil {
			return 0, err
		}
	}
	if _, err := c.set.Apply(c.all); err != nil {
		return 0, errors.Join(err, c.b.StreamSynchronize(c.s))
	}
	return d, c.b.StreamSynchronize(c.s)
}

// whole moves every node with a whole-graph update from the host template:
// the nodes set on the graph, then one GraphExecUpdate. It returns the host
// microseconds of each.
func (c *chain) whole() (set, exec float64, err error) {
	if err := c.b.StreamSynchronize(c.s); err != nil {
		return 0, 0, err
	}
	if err := c.flip(); err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	if _, err := c.set.ApplyGraph(c.all); err != nil {
		return 0, 0, err
	}
	t1 := time.Now()
	if err := c.b.GraphExecUpdate(c.x, c.g); err != nil {
		return 0, 0, fmt.Errorf("GraphExecUpdate from the template: %w", err)
	}
	return us(t1.Sub(t0)), us(time.Since(t1)), nil
}

// NodeUpdateProbe is what MeasureNodeUpdates measured: the host cost of one
// exec update of a kernel node with a parameter block of ParamBytes bytes,
// in a chain of Nodes nodes, in microseconds (medians over Samples
// samples of every node updated): with the graph idle, and while it runs.
type NodeUpdateProbe struct {
	ParamBytes int     `json:"param_bytes"`
	Nodes      int     `json:"nodes"`
	Samples    int     `json:"samples"`
	IdleUS     float64 `json:"idle_us_per_node"`
	InFlightUS float64 `json:"in_flight_us_per_node"`
	// Simulated is true on a simulator: the times are its model's.
	Simulated bool `json:"simulated,omitempty"`
}

// MeasureNodeUpdates measures, on b's device dev, the exec update of a
// kernel node with a parameter block of paramBytes bytes (24 plus a
// multiple of 8) in a chain of nodes nodes, samples times, idle and in
// flight, as the node update section does: for a bench to set its
// strategies' host time per moved node beside the driver's, in the same
// run. Everything it makes is released before it returns.
func MeasureNodeUpdates(ctx context.Context, b gpu.Backend, dev, paramBytes, nodes, samples int) (_ NodeUpdateProbe, err error) {
	if nodes <= 0 || samples <= 0 {
		return NodeUpdateProbe{}, fmt.Errorf("drivercost: a probe of %d nodes and %d samples", nodes, samples)
	}
	img, err := probeModule([]int{paramBytes})
	if err != nil {
		return NodeUpdateProbe{}, err
	}
	var st stack
	defer st.release(&err)
	mod, err := b.ModuleLoad(dev, img)
	if err != nil {
		return NodeUpdateProbe{}, fmt.Errorf("drivercost: load the probe kernel: %w", err)
	}
	st.push(func() error { return b.ModuleUnload(mod) })
	f, err := b.ModuleFunction(mod, probeKernel(paramBytes))
	if err != nil {
		return NodeUpdateProbe{}, fmt.Errorf("drivercost: the probe kernel: %w", err)
	}
	s, err := b.StreamCreate(dev, gpu.StreamNonBlocking, 0)
	if err != nil {
		return NodeUpdateProbe{}, fmt.Errorf("drivercost: stream: %w", err)
	}
	st.push(func() error { return b.StreamDestroy(s) })
	c, err := newChain(b, dev, s, f, paramBytes, nodes, &st)
	if err != nil {
		return NodeUpdateProbe{}, fmt.Errorf("drivercost: the probe's chain: %w", err)
	}
	st.push(func() error { return b.StreamSynchronize(s) })
	var idle, flight []float64
	for i := -1; i < samples; i++ {
		if err := ctx.Err(); err != nil {
			return NodeUpdateProbe{}, err
		}
		id, fl, err := c.once()
		if err != nil {
			return NodeUpdateProbe{}, fmt.Errorf("drivercost: node update probe: %w", err)
		}
		if i >= 0 {
			idle, flight = append(idle, id), append(flight, fl)
		}
	}
	return NodeUpdateProbe{ParamBytes: paramBytes, Nodes: nodes, Samples: samples, Simulated: report.SimulatedBackend(b.Name()),
		IdleUS: report.Percentile(idle, 50), InFlightUS: report.Percentile(flight, 50)}, nil
}
