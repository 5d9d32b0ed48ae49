package sim

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/stablegraph/stablegraph/gpu"
)

// Modules hold kernels whose code is their Go reference (KernelSpec.Ref),
// run by the stream worker against a checked view of device memory.

type module struct {
	handle gpu.Module
	dev    int
	name   string
	funcs  []*function
}

type function struct {
	handle   gpu.Function
	mod      *module
	dev      int
	spec     gpu.KernelSpec
	params   []gpu.ParamInfo
	unloaded atomic.Bool // set by ModuleUnload and Close; read by workers
}

// ModuleLoad loads img's kernels on dev. Every kernel needs a name, a Ref
// (sim runs kernels only through their Go reference) and parameters of
// sized kinds (not ArgBytes); names must be unique.
func (b *Backend) ModuleLoad(dev int, img *gpu.ModuleImage) (gpu.Module, error) {
	const op = "ModuleLoad"
	if err := b.enter(op); err != nil {
		return 0, err
	}
	if err := b.checkDev(op, dev); err != nil {
		return 0, err
	}
	if img == nil {
		return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "module image is nil")
	}
	seen := map[string]bool{}
	for i, k := range img.Kernels {
		switch {
		case k.Name == "":
			return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "module %q: kernel %d has no name", img.Name, i)
		case seen[k.Name]:
			return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "module %q: kernel %s defined twice", img.Name, k.Name)
		case k.Ref == nil:
			return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "module %q: kernel %s has no Go reference (Ref); the sim backend runs kernels only through Ref", img.Name, k.Name)
		}
		seen[k.Name] = true
		for j, kind := range k.Params {
			if kind.Size() == 0 {
				return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "module %q: kernel %s parameter %d has kind %s, which has no fixed size", img.Name, k.Name, j, kind)
			}
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return 0, errClosed(op)
	}
	m := &module{handle: gpu.Module(b.newHandleLocked()), dev: dev, name: img.Name}
	for _, k := range img.Kernels {
		k.Params = slices.Clone(k.Params)
		f := &function{handle: gpu.Function(b.newHandleLocked()), mod: m, dev: dev, spec: k, params: paramLayout(k.Params)}
		m.funcs = append(m.funcs, f)
		b.mu.funcs[f.handle] = f
	}
	b.mu.modules[m.handle] = m
	return m.handle, nil
}

// paramLayout lays parameters out as the CUDA ABI does: each at the next
// offset aligned to its own (natural) size.
func paramLayout(kinds []gpu.ArgKind) []gpu.ParamInfo {
	out := make([]gpu.ParamInfo, len(kinds))
	var off uint64
	for i, k := range kinds {
		sz := uint64(k.Size())
		off = gpu.RoundUp(off, sz)
		out[i] = gpu.ParamInfo{Offset: off, Size: sz}
		off += sz
	}
	return out
}

// ModuleUnload unloads m; its functions become invalid handles. Graph
// nodes and execs that still name them fail: instantiating with
// gpu.ErrInvalidHandle, running with a sticky error.
func (b *Backend) ModuleUnload(m gpu.Module) error {
	const op = "ModuleUnload"
	if err := b.enter(op); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	mod, err := getLocked(b, op, "module", b.mu.modules, m)
	if err != nil {
		return err
	}
	for _, f := range mod.funcs {
		f.unloaded.Store(true)
		delete(b.mu.funcs, f.handle)
	}
	delete(b.mu.modules, m)
	return nil
}

func (b *Backend) ModuleFunction(m gpu.Module, name string) (gpu.Function, error) {
	const op = "ModuleFunction"
	if err := b.enter(op); err != nil {
		return 0, err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	mod, err := getLocked(b, op, "module", b.mu.modules, m)
	if err != nil {
		return 0, err
	}
	for _, f := range mod.funcs {
		if f.spec.Name == name {
			return f.handle, nil
		}
	}
	return 0, gpu.Errorf(op, gpu.ErrNotFound, "module %q has no kernel %q", mod.name, name)
}

func (b *Backend) function(op string, f gpu.Function) (*function, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return getLocked(b, op, "function", b.mu.funcs, f)
}

func (b *Backend) FuncName(f gpu.Function) (string, error) {
	const op = "FuncName"
	if err := b.enter(op); err != nil {
		return "", err
	}
	fn, err := b.function(op, f)
	if err != nil {
		return "", err
	}
	return fn.spec.Name, nil
}

func (b *Backend) FuncParamInfo(f gpu.Function) ([]gpu.ParamInfo, error) {
	const op = "FuncParamInfo"
	if err := b.enter(op); err != nil {
		return nil, err
	}
	fn, err := b.function(op, f)
	if err != nil {
		return nil, err
	}
	return slices.Clone(fn.params), nil
}

// checkConfig applies the launch limits of a compute 9.0 device.
func checkConfig(op, name string, c gpu.LaunchConfig) error {
	g, bl := c.Grid, c.Block
	bad := func(format string, args ...any) error {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "kernel %s: "+format, append([]any{name}, args...)...)
	}
	switch {
	case g.X == 0 || g.Y == 0 || g.Z == 0 || bl.X == 0 || bl.Y == 0 || bl.Z == 0:
		return bad("launch dimensions grid %v block %v have a zero", g, bl)
	case bl.X > 1024 || bl.Y > 1024 || bl.Z > 64 || uint64(bl.X)*uint64(bl.Y)*uint64(bl.Z) > 1024:
		return bad("block %v exceeds 1024 threads (or 1024×1024×64)", bl)
	case g.X > 1<<31-1 || g.Y > 65535 || g.Z > 65535:
		return bad("grid %v exceeds (2^31-1)×65535×65535", g)
	case c.SharedMem > maxSharedMem:
		return bad("%d bytes of dynamic shared memory exceed %d", c.SharedMem, maxSharedMem)
	}
	return nil
}

// kernelParamsLocked validates p and returns its stored form, with args
// copied.
func (b *Backend) kernelParamsLocked(op string, p gpu.KernelParams) (kernelParams, error) {
	fn, err := getLocked(b, op, "function", b.mu.funcs, p.Func)
	if err != nil {
		return kernelParams{}, err
	}
	if err := fn.spec.CheckArgs(op, p.Args); err != nil {
		return kernelParams{}, err
	}
	for i, a := range p.Args {
		// Untyped parameters (the GEMM library's structs) are checked by
		// size against the function's layout.
		if a.Kind == gpu.ArgBytes && uint64(len(a.Raw)) != fn.params[i].Size {
			return kernelParams{}, gpu.Errorf(op, gpu.ErrInvalidValue, "kernel %s parameter %d has %d bytes, its layout %d",
				fn.spec.Name, i, len(a.Raw), fn.params[i].Size)
		}
	}
	if err := checkConfig(op, fn.spec.Name, p.Config); err != nil {
		return kernelParams{}, err
	}
	return kernelParams{fn: fn, cfg: p.Config, args: cloneArgs(p.Args)}, nil
}

func cloneArgs(args []gpu.Arg) []gpu.Arg {
	out := slices.Clone(args)
	for i := range out {
		if out[i].Raw != nil {
			out[i].Raw = slices.Clone(out[i].Raw)
		}
	}
	return out
}

func (k *kernelParams) public() gpu.KernelParams {
	return gpu.KernelParams{Func: k.fn.handle, Config: k.cfg, Args: cloneArgs(k.args)}
}

// LaunchKernel queues f on s (or records a kernel node when s is
// capturing). f must belong to s's device; args are checked against the
// kernel's spec.
func (b *Backend) LaunchKernel(f gpu.Function, cfg gpu.LaunchConfig, args []gpu.Arg, s gpu.Stream) error {
	const op = "LaunchKernel"
	if err := b.enter(op); err != nil {
		return err
	}
	return b.submit(op, s, capNode, func(st *stream) (cmd, error) {
		k, err := b.kernelParamsLocked(op, gpu.KernelParams{Func: f, Config: cfg, Args: args})
		if err != nil {
			return cmd{}, err
		}
		if k.fn.dev != st.dev {
			return cmd{}, gpu.Errorf(op, gpu.ErrInvalidValue, "kernel %s of device %d launched on stream %#x of device %d", k.fn.spec.Name, k.fn.dev, uint64(s), st.dev)
		}
		return cmd{kind: cmdKernel, p: params{kern: k}}, nil
	})
}

// memView is device memory as a kernel running on dev sees it, and its
// device runtime (devupdate.go).
type memView struct {
	b  *Backend
	a  actor
	lc launchCtx
}

func (m memView) Read(p gpu.DevicePtr, dst []byte) error  { return m.b.access(m.a, p, dst, false) }
func (m memView) Write(p gpu.DevicePtr, src []byte) error { return m.b.access(m.a, p, src, true) }

// runKernel runs k on its function's device, on the worker of st. It
// returns false when the kernel did not complete (the device is or became
// faulted): a fault is the *gpu.FaultError of the access; another error of
// the reference becomes an *gpu.Error for "LaunchKernel" wrapping it. Both
// are sticky.
func (st *stream) runKernel(k *kernelParams) bool { return st.runKernelIn(k, launchCtx{}) }

// runKernelIn is runKernel for a kernel of a graph launch.
func (st *stream) runKernelIn(k *kernelParams, lc launchCtx) (ok bool) {
	b, fn := st.b, k.fn
	dev, name := fn.dev, fn.spec.Name
	if b.faulted(dev) || b.closingNow() {
		return false
	}
	if fn.unloaded.Load() {
		b.stick(dev, gpu.Errorf("LaunchKernel", gpu.ErrInvalidHandle, "kernel %s on device %d: its module was unloaded", name, dev))
		return false
	}
	defer func() {
		if r := recover(); r != nil {
			b.stick(dev, &gpu.Error{Op: "LaunchKernel", Err: fmt.Errorf("kernel %s panicked: %v: %w", name, r, gpu.ErrDeviceLost),
				Detail: fmt.Sprintf("device %d", dev)})
			ok = false
		}
	}()
	st.args = append(st.args[:0], k.args...)
	err := fn.spec.Ref(memView{b, actor{dev: dev, kernel: name}, lc}, k.cfg, st.args)
	if err == nil {
		return true
	}
	if fe := (*gpu.FaultError)(nil); !errors.As(err, &fe) {
		// A fault was made sticky by the access itself; anything else
		// the reference returns is a kernel error, sticky too.
		b.stick(dev, &gpu.Error{Op: "LaunchKernel", Err: err, Detail: fmt.Sprintf("kernel %s on device %d failed", name, dev)})
	}
	return false
}
