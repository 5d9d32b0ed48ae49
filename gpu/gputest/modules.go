package gputest

import (
	"errors"
	"fmt"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

var moduleTests = []test{
	{name: "LoadFunctions", run: testModuleLoad},
	{name: "ParamInfo", run: testFuncParamInfo},
	{name: "LaunchErrors", run: testLaunchErrors},
	{name: "Unload", run: testModuleUnload},
}

// naturalLayout is the parameter layout of kinds under C's natural alignment,
// which is what the driver reports for a kernel with those parameters.
func naturalLayout(kinds []gpu.ArgKind) []gpu.ParamInfo {
	var out []gpu.ParamInfo
	var off uint64
	for _, k := range kinds {
		size := uint64(k.Size())
		off = gpu.RoundUp(off, size)
		out = append(out, gpu.ParamInfo{Offset: off, Size: size})
		off += size
	}
	return out
}

func testModuleLoad(h *h) {
	_, err := h.b.ModuleLoad(0, nil)
	if errors.Is(err, gpu.ErrNotSupported) {
		h.Skipf("ModuleLoad: %v", err)
	}
	h.wantErr("ModuleLoad(nil)", err, gpu.ErrInvalidValue)
	before, _ := h.counters()
	m := h.module(0)
	h.wantCounters("after ModuleLoad", before, func(c *gpu.HandleCounts) { c.Modules++ })
	seen := map[gpu.Function]string{}
	for _, spec := range kernels.Specs() {
		f, err := h.b.ModuleFunction(m, spec.Name)
		h.ok("ModuleFunction("+spec.Name+")", err)
		if f == 0 {
			h.Errorf("ModuleFunction(%s) returned the zero handle", spec.Name)
		}
		if other, dup := seen[f]; dup {
			h.Errorf("ModuleFunction gave %s and %s the same handle %#x", other, spec.Name, uint64(f))
		}
		seen[f] = spec.Name
		name, err := h.b.FuncName(f)
		if err != nil || name != spec.Name {
			h.Errorf("FuncName(%s) = %q, %v", spec.Name, name, err)
		}
	}
	for _, name := range []string{"sg_no_such_kernel", "", "SG_FILL"} {
		_, err := h.b.ModuleFunction(m, name)
		h.wantErr(fmt.Sprintf("ModuleFunction(%q)", name), err, gpu.ErrNotFound)
	}
	// A second load of the same image is a separate module.
	m2, err := h.b.ModuleLoad(0, kernels.Module())
	h.ok("second ModuleLoad", err)
	h.track(moduleKey(m2), 0, func() error { return h.b.ModuleUnload(m2) })
	if m2 == m {
		h.Errorf("two ModuleLoads returned the same handle %#x", uint64(m))
	}
	h.wantCounters("after a second ModuleLoad", before, func(c *gpu.HandleCounts) { c.Modules += 2 })
	if h.b.DeviceCount() > 1 {
		f1 := h.fn(1, kernels.Fill)
		if name, err := h.b.FuncName(f1); err != nil || name != kernels.Fill {
			h.Errorf("FuncName of a device 1 function = %q, %v", name, err)
		}
	}
}

func testFuncParamInfo(h *h) {
	for _, spec := range kernels.Specs() {
		f := h.fn(0, spec.Name)
		got, err := h.b.FuncParamInfo(f)
		h.ok("FuncParamInfo("+spec.Name+")", err)
		if want := naturalLayout(spec.Params); !slices.Equal(got, want) {
			h.Errorf("FuncParamInfo(%s) = %v, want %v", spec.Name, got, want)
		}
	}
	// The layout measured with cuFuncGetParamInfo on an H100 (docs/GPU-MACHINE.md).
	got, err := h.b.FuncParamInfo(h.fn(0, kernels.Axpb))
	h.ok("FuncParamInfo(sg_axpb)", err)
	want := []gpu.ParamInfo{{Offset: 0, Size: 8}, {Offset: 8, Size: 8}, {Offset: 16, Size: 4}, {Offset: 20, Size: 4}, {Offset: 24, Size: 4}}
	if !slices.Equal(got, want) {
		h.Errorf("FuncParamInfo(sg_axpb) = %v, want %v", got, want)
	}
	_, err = h.b.FuncParamInfo(0)
	h.wantErr("FuncParamInfo(0)", err, gpu.ErrInvalidHandle)
	_, err = h.b.FuncName(0)
	h.wantErr("FuncName(0)", err, gpu.ErrInvalidHandle)
}

func testLaunchErrors(h *h) {
	const n = 256
	p := h.alloc(0, 4*n)
	h.setF32(p, 1, n)
	s := h.stream(0)
	fill := h.fillParams(0, p, 2, n)
	bad := []struct {
		what string
		args []gpu.Arg
		cfg  gpu.LaunchConfig
		want error
	}{
		{"too few arguments", fill.Args[:2], fill.Config, gpu.ErrInvalidValue},
		{"too many arguments", append(slices.Clone(fill.Args), gpu.I32(0)), fill.Config, gpu.ErrInvalidValue},
		{"no arguments", nil, fill.Config, gpu.ErrInvalidValue},
		{"f32 for i32", []gpu.Arg{fill.Args[0], fill.Args[1], gpu.F32(n)}, fill.Config, gpu.ErrInvalidValue},
		{"i64 for ptr", []gpu.Arg{gpu.I64(int64(p)), fill.Args[1], fill.Args[2]}, fill.Config, gpu.ErrInvalidValue},
		{"bytes for ptr", []gpu.Arg{gpu.Bytes(make([]byte, 8)), fill.Args[1], fill.Args[2]}, fill.Config, gpu.ErrInvalidValue},
		{"invalid kind", []gpu.Arg{{}, fill.Args[1], fill.Args[2]}, fill.Config, gpu.ErrInvalidValue},
		{"empty grid", fill.Args, gpu.LaunchConfig{Grid: gpu.Dim3{X: 0, Y: 1, Z: 1}, Block: gpu.Dim3{X: 256, Y: 1, Z: 1}}, gpu.ErrInvalidValue},
		{"empty block", fill.Args, gpu.LaunchConfig{Grid: gpu.Dim3{X: 1, Y: 1, Z: 1}, Block: gpu.Dim3{X: 256, Y: 0, Z: 1}}, gpu.ErrInvalidValue},
		{"block of 2048 threads", fill.Args, gpu.LaunchConfig{Grid: gpu.Dim3{X: 1, Y: 1, Z: 1}, Block: gpu.Dim3{X: 2048, Y: 1, Z: 1}}, gpu.ErrInvalidValue},
	}
	for _, c := range bad {
		h.wantErr("LaunchKernel with "+c.what, h.b.LaunchKernel(fill.Func, c.cfg, c.args, s), c.want)
	}
	h.wantErr("LaunchKernel of function 0", h.b.LaunchKernel(0, fill.Config, fill.Args, s), gpu.ErrInvalidHandle)
	h.wantErr("LaunchKernel on stream 0", h.b.LaunchKernel(fill.Func, fill.Config, fill.Args, 0), gpu.ErrInvalidHandle)
	h.sync(s)
	h.wantAllF32("memory after refused launches", h.downloadF32(p, n), 1)
	h.launch(fill, s)
	h.sync(s)
	h.wantAllF32("the good launch", h.downloadF32(p, n), 2)
}

func testModuleUnload(h *h) {
	keep := h.fn(0, kernels.Fill)
	before, _ := h.counters()
	m, err := h.b.ModuleLoad(0, kernels.Module())
	h.ok("ModuleLoad", err)
	f, err := h.b.ModuleFunction(m, kernels.Copy)
	h.ok("ModuleFunction", err)
	h.ok("ModuleUnload", h.b.ModuleUnload(m))
	h.wantCounters("after ModuleUnload", before, nil)
	h.wantErr("second ModuleUnload", h.b.ModuleUnload(m), gpu.ErrInvalidHandle)
	h.wantErr("ModuleUnload(0)", h.b.ModuleUnload(0), gpu.ErrInvalidHandle)
	_, err = h.b.ModuleFunction(m, kernels.Copy)
	h.wantErr("ModuleFunction of an unloaded module", err, gpu.ErrInvalidHandle)
	_, err = h.b.ModuleFunction(0, kernels.Copy)
	h.wantErr("ModuleFunction of module 0", err, gpu.ErrInvalidHandle)
	_, err = h.b.FuncName(f)
	h.wantErr("FuncName of a function of an unloaded module", err, gpu.ErrInvalidHandle)
	_, err = h.b.FuncParamInfo(f)
	h.wantErr("FuncParamInfo of a function of an unloaded module", err, gpu.ErrInvalidHandle)
	s := h.stream(0)
	p := h.alloc(0, 64)
	h.wantErr("LaunchKernel of a function of an unloaded module",
		h.b.LaunchKernel(f, kernels.Elementwise(16), []gpu.Arg{gpu.Ptr(p), gpu.Ptr(p), gpu.I32(16)}, s), gpu.ErrInvalidHandle)
	// The other module is untouched.
	if name, err := h.b.FuncName(keep); err != nil || name != kernels.Fill {
		h.Errorf("a function of another module after an unload: %q, %v", name, err)
	}
	h.launch(h.fillParams(0, p, 1, 16), s)
	h.sync(s)
}
