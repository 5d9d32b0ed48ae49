package drivercost

import (
	"errors"
	"fmt"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

// graphs measures, for each K, a graph of K one-element fill kernels: its
// capture, instantiation, launch and replay against eager launches of the
// same kernels, and the three ways to point it at new buffers (whole-graph
// exec update from a graph captured beforehand, re-capture plus update, and
// per-node parameter updates).
func (m *bench) graphs() (err error) {
	var st stack
	defer st.release(&err)
	f, err := m.fill(&st)
	if err != nil {
		return err
	}
	s, start, end, err := m.timedStream(&st)
	if err != nil {
		return err
	}
	// Two buffers: the graph is captured over one and updated to the other.
	var bufs [2]gpu.DevicePtr
	for i := range bufs {
		if bufs[i], err = m.alloc(&st, 256); err != nil {
			return fmt.Errorf("MemAlloc: %w", err)
		}
	}
	g := graphBench{bench: m, f: f, s: s, start: start, end: end, bufs: bufs}
	for _, k := range m.opts.Ks {
		n := max(m.opts.GraphIterations, m.opts.GraphIterations*100/k)
		m.progress("graphs: K=%d (%d iterations)", k, n)
		g.k = k
		if err := m.iterate(n, g.once); err != nil {
			return fmt.Errorf("K=%d: %w", k, err)
		}
	}
	return nil
}

type graphBench struct {
	*bench
	f          gpu.Function
	s          gpu.Stream
	start, end gpu.Event
	bufs       [2]gpu.DevicePtr
	k          int
	noUpdate   error // set once GraphExecUpdate is found unsupported
}

func (g *graphBench) params(buf int) gpu.KernelParams {
	return gpu.KernelParams{
		Func:   g.f,
		Config: kernels.Elementwise(1),
		Args:   []gpu.Arg{gpu.Ptr(g.bufs[buf]), gpu.F32(float32(buf + 1)), gpu.I32(1)},
	}
}

// capture captures k launches of the fill kernel over buffer buf.
func (g *graphBench) capture(buf int) (gpu.Graph, error) {
	p := g.params(buf)
	if err := g.b.StreamBeginCapture(g.s); err != nil {
		return 0, fmt.Errorf("StreamBeginCapture: %w", err)
	}
	for i := 0; i < g.k; i++ {
		if err := g.b.LaunchKernel(p.Func, p.Config, p.Args, g.s); err != nil {
			err = fmt.Errorf("LaunchKernel %d of %d under capture: %w", i, g.k, err)
			if gr, eerr := g.b.StreamEndCapture(g.s); eerr == nil {
				return 0, errors.Join(err, g.b.GraphDestroy(gr))
			}
			return 0, err
		}
	}
	gr, err := g.b.StreamEndCapture(g.s)
	if err != nil {
		return 0, fmt.Errorf("StreamEndCapture: %w", err)
	}
	return gr, nil
}

func (g *graphBench) once(warm bool) (err error) {
	var st stack
	defer st.release(&err)
	k := float64(g.k)
	name := func(format string) string { return fmt.Sprintf(format, g.k) }

	t0 := time.Now()
	g1, err := g.capture(0)
	capture := time.Since(t0)
	if err != nil {
		return err
	}
	st.push(func() error { return g.b.GraphDestroy(g1) })

	t0 = time.Now()
	x, err := g.b.GraphInstantiate(g1)
	inst := time.Since(t0)
	if err != nil {
		return fmt.Errorf("GraphInstantiate: %w", err)
	}
	st.push(func() error { return g.b.GraphExecDestroy(x) })

	// The first launch of a new exec uploads the graph to the device, at
	// a cost close to instantiating it: it is a row of its own, and the
	// launch and replay rows measure a later launch, as a runtime that
	// replays a graph sees. Host times of launches are taken on an idle
	// stream (synchronized before, outside the timed region), so that a
	// launch never waits behind earlier work for room in the stream's
	// queue.
	if err := g.b.StreamSynchronize(g.s); err != nil {
		return fmt.Errorf("StreamSynchronize: %w", err)
	}
	t0 = time.Now()
	err = g.b.GraphLaunch(x, g.s)
	first := time.Since(t0)
	if err != nil {
		return fmt.Errorf("GraphLaunch (first): %w", err)
	}
	if err := g.b.StreamSynchronize(g.s); err != nil {
		return fmt.Errorf("StreamSynchronize after the first GraphLaunch: %w", err)
	}

	var launch time.Duration
	replay, err := g.gpuTime(g.s, g.start, g.end, func() error {
		t0 := time.Now()
		err := g.b.GraphLaunch(x, g.s)
		launch = time.Since(t0)
		if err != nil {
			return fmt.Errorf("GraphLaunch: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}

	// Eager launches: the GPU row is the time the device takes when the
	// host launches as fast as it can (what eager execution costs); the
	// host row is the launch calls alone, on a stream idle at the start.
	p := g.params(0)
	var eagerHost time.Duration
	eager, err := g.gpuTime(g.s, g.start, g.end, func() error {
		t0 := time.Now()
		for i := 0; i < g.k; i++ {
			if err := g.b.LaunchKernel(p.Func, p.Config, p.Args, g.s); err != nil {
				return fmt.Errorf("LaunchKernel: %w", err)
			}
		}
		eagerHost = time.Since(t0)
		return nil
	})
	if err != nil {
		return err
	}

	g.add(name(rowCapture), Host, warm, us(capture)/k)
	g.add(name(rowInstantiate), Host, warm, us(inst)/k)
	g.add(name(rowFirstLaunch), Host, warm, us(first))
	g.add(name(rowLaunch), Host, warm, us(launch))
	g.add(name(rowReplay), GPU, warm, us(replay)/k)
	g.add(name(rowEager), GPU, warm, us(eager)/k)
	g.add(name(rowEagerHost), Host, warm, us(eagerHost)/k)

	if err := g.update(x, warm); err != nil {
		return err
	}
	return g.setParams(x, g1, warm)
}

// update measures GraphExecUpdate to a graph captured over the other
// buffer, then re-capture plus update back to the first.
func (g *graphBench) update(x gpu.GraphExec, warm bool) error {
	rowU, rowR := fmt.Sprintf(rowExecUpdate, g.k), fmt.Sprintf(rowRecaptureUpdate, g.k)
	if g.noUpdate != nil {
		g.skip(rowU, Host, g.noUpdate)
		g.skip(rowR, Host, g.noUpdate)
		return nil
	}
	g2, err := g.capture(1)
	if err != nil {
		return err
	}
	t0 := time.Now()
	err = g.b.GraphExecUpdate(x, g2)
	u := time.Since(t0)
	err = errors.Join(err, g.b.GraphDestroy(g2))
	if errors.Is(err, gpu.ErrNotSupported) {
		g.noUpdate = err
		g.skip(rowU, Host, err)
		g.skip(rowR, Host, err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("GraphExecUpdate: %w", err)
	}

	t0 = time.Now()
	g3, err := g.capture(0)
	if err != nil {
		return err
	}
	err = g.b.GraphExecUpdate(x, g3)
	r := time.Since(t0)
	if err = errors.Join(err, g.b.GraphDestroy(g3)); err != nil {
		return fmt.Errorf("re-capture + GraphExecUpdate: %w", err)
	}
	g.add(rowU, Host, warm, us(u))
	g.add(rowR, Host, warm, us(r))
	return nil
}

// setParams measures GraphExecKernelNodeSetParams over every node of x,
// pointing each at the other buffer, and replays the result once to check
// that the backend accepted it.
func (g *graphBench) setParams(x gpu.GraphExec, g1 gpu.Graph, warm bool) error {
	row := fmt.Sprintf(rowSetParams, g.k)
	nodes, err := g.b.GraphNodes(g1)
	if err != nil {
		return fmt.Errorf("GraphNodes: %w", err)
	}
	if len(nodes) == 0 {
		return fmt.Errorf("captured graph of %d launches has no nodes", g.k)
	}
	p := g.params(1)
	t0 := time.Now()
	for _, n := range nodes {
		if err := g.b.GraphExecKernelNodeSetParams(x, n, p); err != nil {
			if errors.Is(err, gpu.ErrNotSupported) {
				g.skip(row, Host, err)
				return nil
			}
			return fmt.Errorf("GraphExecKernelNodeSetParams: %w", err)
		}
	}
	d := time.Since(t0)
	if err := g.b.GraphLaunch(x, g.s); err != nil {
		return fmt.Errorf("GraphLaunch after per-node updates: %w", err)
	}
	if err := g.b.StreamSynchronize(g.s); err != nil {
		return fmt.Errorf("replay after per-node updates: %w", err)
	}
	g.add(row, Host, warm, us(d)/float64(len(nodes)))
	return nil
}
