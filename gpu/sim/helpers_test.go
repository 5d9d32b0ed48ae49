package sim

import (
	"errors"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

// newSim opens a backend and, when the test ends, checks that every handle
// was released and that Close reports nothing.
func newSim(t testing.TB, cfg Config) *Backend {
	t.Helper()
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c := b.LiveHandles(); !c.IsZero() {
			t.Errorf("handles still live at the end of the test: %s", c)
		}
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantErr(t testing.TB, err, sentinel error) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("got error %v, want %v", err, sentinel)
	}
	var ge *gpu.Error
	var ue *gpu.UpdateError
	if !errors.As(err, &ge) && !errors.As(err, &ue) {
		t.Fatalf("error %v (%T) is not a *gpu.Error or *gpu.UpdateError", err, err)
	}
}

func wantFault(t testing.TB, err error) *gpu.FaultError {
	t.Helper()
	var fe *gpu.FaultError
	if !errors.As(err, &fe) {
		t.Fatalf("got error %v, want a *gpu.FaultError", err)
	}
	if !errors.Is(err, gpu.ErrIllegalAddress) {
		t.Fatalf("fault %v does not wrap ErrIllegalAddress", err)
	}
	return fe
}

// kern is the built-in kernel set loaded on one device.
type kern struct {
	b *Backend
	m gpu.Module
}

func loadKernels(t testing.TB, b *Backend, dev int) kern {
	t.Helper()
	m, err := b.ModuleLoad(dev, kernels.Module())
	must(t, err)
	t.Cleanup(func() { must(t, b.ModuleUnload(m)) })
	return kern{b, m}
}

func (k kern) fn(t testing.TB, name string) gpu.Function {
	t.Helper()
	f, err := k.b.ModuleFunction(k.m, name)
	must(t, err)
	return f
}

func newStream(t testing.TB, b *Backend, dev int) gpu.Stream {
	t.Helper()
	s, err := b.StreamCreate(dev, gpu.StreamNonBlocking, 0)
	must(t, err)
	t.Cleanup(func() { must(t, b.StreamDestroy(s)) })
	return s
}

func newEvent(t testing.TB, b *Backend, dev int, flags gpu.EventFlags) gpu.Event {
	t.Helper()
	e, err := b.EventCreate(dev, flags)
	must(t, err)
	t.Cleanup(func() { must(t, b.EventDestroy(e)) })
	return e
}

func alloc(t testing.TB, b *Backend, dev int, size uint64) gpu.DevicePtr {
	t.Helper()
	p, err := b.MemAlloc(dev, size)
	must(t, err)
	t.Cleanup(func() { must(t, b.MemFree(p)) })
	return p
}

func newGraph(t testing.TB, b *Backend, dev int) gpu.Graph {
	t.Helper()
	g, err := b.GraphCreate(dev)
	must(t, err)
	t.Cleanup(func() { must(t, b.GraphDestroy(g)) })
	return g
}

func instantiate(t testing.TB, b *Backend, g gpu.Graph) gpu.GraphExec {
	t.Helper()
	x, err := b.GraphInstantiate(g)
	must(t, err)
	t.Cleanup(func() { must(t, b.GraphExecDestroy(x)) })
	return x
}

func writeF32(t testing.TB, b *Backend, p gpu.DevicePtr, v []float32) {
	t.Helper()
	must(t, b.MemcpyHtoD(p, gpu.F32ToBytes(v)))
}

func readF32(t testing.TB, b *Backend, p gpu.DevicePtr, n int) []float32 {
	t.Helper()
	buf := make([]byte, 4*n)
	must(t, b.MemcpyDtoH(buf, p))
	return gpu.BytesToF32(buf)
}

func fillArgs(p gpu.DevicePtr, v float32, n int) []gpu.Arg {
	return []gpu.Arg{gpu.Ptr(p), gpu.F32(v), gpu.I32(int32(n))}
}

func wantAll(t testing.TB, got []float32, want float32) {
	t.Helper()
	for i, g := range got {
		if g != want {
			t.Fatalf("element %d = %v, want %v (all: %v)", i, g, want, got)
		}
	}
}

// gate is a test kernel that blocks its stream until the test opens it, to
// make asynchrony observable.
type gate struct {
	open  chan struct{}
	entry chan struct{}
	f     gpu.Function
}

func newGate(t testing.TB, b *Backend, dev int) *gate {
	t.Helper()
	g := &gate{open: make(chan struct{}), entry: make(chan struct{}, 100)}
	img := &gpu.ModuleImage{Name: "gate", Kernels: []gpu.KernelSpec{{
		Name: "gate", Params: nil,
		Ref: func(gpu.Memory, gpu.LaunchConfig, []gpu.Arg) error {
			g.entry <- struct{}{}
			<-g.open
			return nil
		},
	}}}
	m, err := b.ModuleLoad(dev, img)
	must(t, err)
	t.Cleanup(func() {
		g.release()
		must(t, b.ModuleUnload(m))
	})
	g.f, err = b.ModuleFunction(m, "gate")
	must(t, err)
	return g
}

func (g *gate) launch(t testing.TB, b *Backend, s gpu.Stream) {
	t.Helper()
	must(t, b.LaunchKernel(g.f, gpu.Linear(1, 1), nil, s))
}

func (g *gate) release() {
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}
