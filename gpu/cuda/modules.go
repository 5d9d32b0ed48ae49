package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// moduleInfo is a loaded module: its device and the image it came from.
type moduleInfo struct {
	dev int
	img *gpu.ModuleImage
	m   cu.Module
}

// funcInfo is a kernel the backend knows: one looked up in a module we
// loaded (spec set), or one found in a captured graph (spec nil: a library
// kernel whose parameters are known only by layout).
type funcInfo struct {
	dev    int
	f      cu.Function
	module gpu.Module // 0 for discovered kernels
	name   string     // "" until asked, for discovered kernels
	spec   *gpu.KernelSpec
	params []gpu.ParamInfo // cached cuFuncGetParamInfo layout; nil until asked
	// kern is the context-independent kernel a node read back named
	// instead of f (a library's cuLibrary kernel), 0 when none did.
	kern cu.Kernel
}

// ModuleLoad implements gpu.Modules. It asks img for a cubin of dev's
// architecture and loads it as built (loadBinary), else for PTX, which the
// driver JIT-compiles for dev (loadPTX). A module with neither (one whose
// kernels run only as Go references) is gpu.ErrNotSupported naming the
// device and the module's reasons.
func (b *Backend) ModuleLoad(dev int, img *gpu.ModuleImage) (gpu.Module, error) {
	d, err := b.device("ModuleLoad", dev)
	if err != nil {
		return 0, err
	}
	if img == nil {
		return 0, errf("ModuleLoad", gpu.ErrInvalidValue, "nil module image")
	}
	p := d.props
	where := fmt.Sprintf("module %q on device %d (%s, compute %d.%d, driver %d)", img.Name, dev, p.Name, p.ComputeMajor, p.ComputeMinor, p.DriverVersion)
	t, code, err := img.CodeFor(
		gpu.Target{Format: gpu.CodeCubin, Major: p.ComputeMajor, Minor: p.ComputeMinor},
		gpu.Target{Format: gpu.CodePTX, Major: p.ComputeMajor, Minor: p.ComputeMinor})
	if err != nil {
		if errors.Is(err, gpu.ErrNotSupported) {
			return 0, &gpu.Error{Op: "ModuleLoad", Err: gpu.ErrNotSupported, Detail: where + ": " + err.Error()}
		}
		return 0, err
	}
	var m cu.Module
	if t.Format == gpu.CodeCubin {
		m, err = b.loadBinary(dev, where, code)
	} else {
		m, err = b.loadPTX(dev, img, code)
	}
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	h := gpu.Module(b.newIDLocked())
	b.mu.modules[h] = &moduleInfo{dev: dev, img: img, m: m}
	return h, nil
}

// loadPTX loads PTX src of img on dev, with the JIT's error log in the
// error when it fails.
func (b *Backend) loadPTX(dev int, img *gpu.ModuleImage, src []byte) (cu.Module, error) {
	image := make([]byte, len(src)+1) // NUL-terminated
	copy(image, src)
	logBuf := make([]byte, 8192)
	var pin runtime.Pinner
	pin.Pin(&logBuf[0]) // the driver writes it through an integer option value
	defer pin.Unpin()
	opts := []uint32{cu.JITErrorLogBuffer, cu.JITErrorLogBufferSizeBytes}
	vals := []uintptr{uintptr(unsafe.Pointer(&logBuf[0])), uintptr(len(logBuf))}
	var m cu.Module
	err := b.call(dev, "cuModuleLoadDataEx", func() cu.Result { return b.d.ModuleLoadDataEx(&m, image, opts, vals) })
	runtime.KeepAlive(logBuf)
	if err != nil {
		if ge, ok := err.(*gpu.Error); ok {
			if log := cu.GoString(&logBuf[0]); log != "" {
				ge.Detail += ": JIT log: " + log
			}
			ge.Detail += " (module " + img.Name + ")"
		}
		return 0, err
	}
	return m, nil
}

// loadBinary loads prebuilt device code (a cubin for dev's architecture)
// as is: cuModuleLoadDataEx without JIT options, so it is not compiled or
// linked. A device or driver that cannot run it is gpu.ErrNotSupported
// naming where (the module, the device's compute capability and the
// driver); only running out of memory keeps its own sentinel.
func (b *Backend) loadBinary(dev int, where string, bin []byte) (cu.Module, error) {
	var m cu.Module
	var r cu.Result
	if err := b.onDevice(dev, func() error { r = b.d.ModuleLoadDataEx(&m, bin, nil, nil); return nil }); err != nil {
		return 0, err
	}
	if r != cu.Success {
		e := &gpu.Error{Op: "cuModuleLoadDataEx", Code: int(r), CodeName: r.Name(), Err: gpu.ErrNotSupported,
			Detail: b.d.GetErrorString(r) + ": prebuilt " + where}
		if sentinel(r) == gpu.ErrOutOfMemory {
			e.Err = gpu.ErrOutOfMemory
		}
		return 0, e
	}
	return m, nil
}

// ModuleUnload implements gpu.Modules. The module's functions become invalid.
func (b *Backend) ModuleUnload(m gpu.Module) error {
	b.mu.Lock()
	mi, ok := b.mu.modules[m]
	delete(b.mu.modules, m)
	b.mu.Unlock()
	if !ok {
		return errf("ModuleUnload", gpu.ErrInvalidHandle, "module %#x is not loaded", uint64(m))
	}
	err := b.call(mi.dev, "cuModuleUnload", func() cu.Result { return b.d.ModuleUnload(mi.m) })
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		b.mu.modules[m] = mi
		return err
	}
	for f, fi := range b.mu.funcs {
		if fi.module == m {
			delete(b.mu.funcs, f)
			delete(b.mu.funcByCU, fi.f)
		}
	}
	return nil
}

// ModuleFunction implements gpu.Modules. Only kernels with a spec in the
// module image can be looked up: the spec is what launches are checked
// against.
func (b *Backend) ModuleFunction(m gpu.Module, name string) (gpu.Function, error) {
	b.mu.Lock()
	mi, ok := b.mu.modules[m]
	b.mu.Unlock()
	if !ok {
		return 0, errf("ModuleFunction", gpu.ErrInvalidHandle, "module %#x is not loaded", uint64(m))
	}
	spec, ok := mi.img.Kernel(name)
	if !ok {
		return 0, errf("ModuleFunction", gpu.ErrNotFound, "module %q has no kernel %q", mi.img.Name, name)
	}
	var f cu.Function
	cname := cu.CString(name)
	if err := b.call(mi.dev, "cuModuleGetFunction", func() cu.Result { return b.d.ModuleGetFunction(&f, mi.m, cname) }); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.funcHandleLocked(f, &funcInfo{dev: mi.dev, f: f, module: m, name: name, spec: &spec}), nil
}

// funcHandleLocked returns the handle of driver function f, issuing one
// with info fi the first time f is seen (a function looked up twice, or
// met again in a captured graph, keeps its handle).
func (b *Backend) funcHandleLocked(f cu.Function, fi *funcInfo) gpu.Function {
	if h, ok := b.mu.funcByCU[f]; ok {
		if old := b.mu.funcs[h]; old.spec == nil && fi.spec != nil {
			b.mu.funcs[h] = fi // a discovered kernel turned out to be ours
		}
		return h
	}
	h := gpu.Function(b.newIDLocked())
	b.mu.funcs[h] = fi
	b.mu.funcByCU[f] = h
	return h
}

// funcInfo returns what the backend knows of f.
func (b *Backend) funcInfo(op string, f gpu.Function) (*funcInfo, error) {
	b.mu.Lock()
	fi, ok := b.mu.funcs[f]
	b.mu.Unlock()
	if !ok {
		return nil, errNoFunc(op, f)
	}
	return fi, nil
}

func errNoFunc(op string, f gpu.Function) error {
	return errf(op, gpu.ErrInvalidHandle, "function %#x is not known (unloaded module?)", uint64(f))
}

// FuncName implements gpu.Modules. For library kernels found in captured
// graphs it is the driver's (mangled) name.
func (b *Backend) FuncName(f gpu.Function) (string, error) {
	fi, err := b.funcInfo("FuncName", f)
	if err != nil {
		return "", err
	}
	b.mu.Lock()
	name := fi.name
	b.mu.Unlock()
	if name != "" {
		return name, nil
	}
	err = b.onDevice(fi.dev, func() error {
		n, r := b.d.FuncGetName(fi.f)
		name = n
		return b.check("cuFuncGetName", r)
	})
	if err != nil {
		return "", err
	}
	b.mu.Lock()
	fi.name = name
	b.mu.Unlock()
	return name, nil
}

// maxParams bounds the cuFuncGetParamInfo loop: kernel parameters take at
// most 32764 bytes, so there cannot be more.
const maxParams = 32764

// FuncParamInfo implements gpu.Modules: cuFuncGetParamInfo for index 0, 1,
// ... until CUDA_ERROR_INVALID_VALUE (driver 580 has no cuFuncGetParamCount).
func (b *Backend) FuncParamInfo(f gpu.Function) ([]gpu.ParamInfo, error) {
	fi, err := b.funcInfo("FuncParamInfo", f)
	if err != nil {
		return nil, err
	}
	return b.paramInfo(fi, f)
}

func (b *Backend) paramInfo(fi *funcInfo, f gpu.Function) ([]gpu.ParamInfo, error) {
	b.mu.Lock()
	cached := fi.params
	b.mu.Unlock()
	if cached != nil {
		return append([]gpu.ParamInfo(nil), cached...), nil
	}
	var out []gpu.ParamInfo
	err := b.onDevice(fi.dev, func() error {
		for i := uint64(0); i < maxParams; i++ {
			var off, size uint64
			r := b.d.FuncGetParamInfo(fi.f, i, &off, &size)
			if r == cu.ErrorInvalidValue {
				return nil // past the last parameter
			}
			if r != cu.Success {
				return b.check("cuFuncGetParamInfo", r)
			}
			out = append(out, gpu.ParamInfo{Offset: off, Size: size})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if out == nil {
		out = []gpu.ParamInfo{}
	}
	b.mu.Lock()
	fi.params = out
	b.mu.Unlock()
	return append([]gpu.ParamInfo(nil), out...), nil
}

// checkArgs validates args for f: against the spec of our kernels, and by
// count and size against the driver's layout for discovered ones (whose
// arguments are ArgBytes or typed values of the right sizes).
func (b *Backend) checkArgs(op string, fi *funcInfo, f gpu.Function, args []gpu.Arg) error {
	if fi.spec != nil {
		return fi.spec.CheckArgs(op, args)
	}
	layout, err := b.paramInfo(fi, f)
	if err != nil {
		return err
	}
	if len(args) != len(layout) {
		return errf(op, gpu.ErrInvalidValue, "kernel %#x takes %d parameters, got %d arguments", uint64(f), len(layout), len(args))
	}
	for i, a := range args {
		if uint64(a.Size()) != layout[i].Size {
			return errf(op, gpu.ErrInvalidValue, "kernel %#x parameter %d has %d bytes, argument %d has %d (%s)",
				uint64(f), i, layout[i].Size, i, a.Size(), a.Kind)
		}
	}
	return nil
}

// decodeArgs reads n arguments through a driver-owned void** array: typed
// by kinds when given, else as ArgBytes of the sizes in layout.
func decodeArgs(kp unsafe.Pointer, kinds []gpu.ArgKind, layout []gpu.ParamInfo) []gpu.Arg {
	n := len(kinds)
	if kinds == nil {
		n = len(layout)
	}
	if n == 0 || kp == nil {
		return []gpu.Arg{}
	}
	ptrs := unsafe.Slice((*unsafe.Pointer)(kp), n)
	out := make([]gpu.Arg, n)
	for i := range out {
		if kinds != nil {
			out[i] = decodeTyped(kinds[i], unsafe.Slice((*byte)(ptrs[i]), kinds[i].Size()))
		} else {
			out[i] = gpu.Bytes(unsafe.Slice((*byte)(ptrs[i]), layout[i].Size))
		}
	}
	return out
}

// decodeBuffer splits a packed parameter buffer (the CU_LAUNCH_PARAM_BUFFER
// form of a launch) by layout.
func decodeBuffer(buf []byte, kinds []gpu.ArgKind, layout []gpu.ParamInfo) []gpu.Arg {
	out := make([]gpu.Arg, len(layout))
	for i, p := range layout {
		raw := buf[p.Offset : p.Offset+p.Size]
		if kinds != nil && i < len(kinds) && uint64(kinds[i].Size()) == p.Size {
			out[i] = decodeTyped(kinds[i], raw)
		} else {
			out[i] = gpu.Bytes(raw)
		}
	}
	return out
}

func decodeTyped(k gpu.ArgKind, raw []byte) gpu.Arg {
	switch len(raw) {
	case 4:
		return gpu.Arg{Kind: k, Bits: uint64(binary.LittleEndian.Uint32(raw))}
	case 8:
		return gpu.Arg{Kind: k, Bits: binary.LittleEndian.Uint64(raw)}
	}
	return gpu.Bytes(raw)
}

// LaunchKernel implements gpu.Modules. Arguments are checked against the
// kernel's spec (or, for a library kernel found in a graph, its layout)
// before the driver sees them.
func (b *Backend) LaunchKernel(f gpu.Function, cfg gpu.LaunchConfig, args []gpu.Arg, s gpu.Stream) error {
	const op = "LaunchKernel"
	b.mu.Lock()
	fi, fok := b.mu.funcs[f]
	si, sok := b.mu.streams[s]
	b.mu.Unlock()
	switch {
	case !fok:
		return errNoFunc(op, f)
	case !sok:
		return errNoStream(op, s)
	case si.dev != fi.dev:
		return errf(op, gpu.ErrInvalidValue, "kernel of device %d launched on a stream of device %d", fi.dev, si.dev)
	}
	if err := b.checkArgs(op, fi, f, args); err != nil {
		return err
	}
	fr := getFrame()
	defer fr.release()
	params := fr.pack(args)
	return b.callFrame(fr, si.dev, "cuLaunchKernel", func() cu.Result {
		return b.d.LaunchKernel(fi.f, cfg.Grid.X, cfg.Grid.Y, cfg.Grid.Z, cfg.Block.X, cfg.Block.Y, cfg.Block.Z,
			cfg.SharedMem, si.s, params)
	})
}
