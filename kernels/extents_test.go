package kernels_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/gputest"
	"github.com/stablegraph/stablegraph/kernels"
)

// launchCase is a launch of a built-in kernel that is in range and uses
// every byte of each pointer argument's extent: scalars by parameter index,
// and the data of the parameters whose contents steer the kernel (ids and
// positions at their largest allowed values, so that the largest offsets
// are touched).
type launchCase struct {
	cfg     gpu.LaunchConfig
	scalars map[int]gpu.Arg
	data    map[int][]byte
}

// extentCases has one launch per built-in kernel (the transposes of Gemm
// too).
func extentCases() map[string][]launchCase {
	i32, f32 := gpu.I32, gpu.F32
	n5 := func(extra map[int]gpu.Arg, nParam int) launchCase {
		s := map[int]gpu.Arg{nParam: i32(5)}
		for k, v := range extra {
			s[k] = v
		}
		return launchCase{cfg: kernels.Elementwise(5), scalars: s}
	}
	bias := launchCase{cfg: kernels.Elementwise(12), scalars: map[int]gpu.Arg{3: i32(3), 4: i32(4)}}
	var gemms []launchCase
	for _, ta := range []int32{0, 1} {
		for _, tb := range []int32{0, 1} {
			gemms = append(gemms, launchCase{cfg: kernels.GemmConfig(3, 4), scalars: map[int]gpu.Arg{
				3: i32(3), 4: i32(4), 5: i32(5), 6: i32(ta), 7: i32(tb), 8: f32(1), 9: f32(0.5)}})
		}
	}
	const npos = 5
	last := make([]int32, 3)
	for i := range last {
		last[i] = npos - 1 // every cache's last position, of its last layer: the whole cache is touched
	}
	return map[string][]launchCase{
		kernels.Fill:         {n5(map[int]gpu.Arg{1: f32(1)}, 2)},
		kernels.FillU64:      {n5(map[int]gpu.Arg{1: gpu.U64(7)}, 2)},
		kernels.Copy:         {n5(nil, 2)},
		kernels.Axpb:         {n5(map[int]gpu.Arg{2: f32(2), 3: f32(1)}, 4)},
		kernels.Axpy:         {n5(map[int]gpu.Arg{2: f32(2)}, 3)},
		kernels.Add:          {n5(nil, 3)},
		kernels.SubScale:     {n5(map[int]gpu.Arg{3: f32(2)}, 4)},
		kernels.BiasAdd:      {bias},
		kernels.BiasTanh:     {bias},
		kernels.Tanh:         {n5(nil, 2)},
		kernels.Relu:         {n5(nil, 2)},
		kernels.TanhBackward: {n5(nil, 3)},
		kernels.ReluBackward: {n5(nil, 3)},
		kernels.BiasGrad:     {{cfg: kernels.Elementwise(4), scalars: map[int]gpu.Arg{2: i32(3), 3: i32(4)}}},
		kernels.Gemm:         gemms,
		kernels.Embed: {{cfg: kernels.Elementwise(12),
			scalars: map[int]gpu.Arg{5: i32(3), 6: i32(4), 7: i32(7), 8: i32(npos)},
			data:    map[int][]byte{3: i32s(0, 6, 2), 4: i32s(1, npos-1, 0)}}},
		kernels.LayerNorm:    {{cfg: kernels.LayerNormConfig(3), scalars: map[int]gpu.Arg{4: i32(3), 5: i32(4), 6: f32(1e-5)}}},
		kernels.BiasGelu:     {bias},
		kernels.BiasResidual: {bias},
		kernels.KVAppend: {{cfg: kernels.Elementwise(3 * 4),
			scalars: map[int]gpu.Arg{12: i32(3), 13: i32(4), 14: i32(2), 15: i32(1), 16: i32(npos)},
			data:    map[int][]byte{3: i32s(last...)}}},
		kernels.DecodeAttention: {{cfg: kernels.DecodeAttentionConfig(3, 2, 2, npos),
			scalars: map[int]gpu.Arg{11: i32(3), 12: i32(2), 13: i32(2), 14: i32(2), 15: i32(1), 16: i32(npos), 17: f32(0.5)},
			data:    map[int][]byte{2: i32s(last...)}}},
		kernels.Argmax: {{cfg: kernels.ArgmaxConfig(3), scalars: map[int]gpu.Arg{3: i32(3), 4: i32(5)}}},
		// Rows that draw, give candidates, both and neither: every output
		// is written whole either way.
		kernels.Sample: {{cfg: kernels.SampleConfig(4), scalars: map[int]gpu.Arg{5: i32(4), 6: i32(5), 7: i32(3)},
			data: map[int][]byte{4: sampleParams(1, 2, 3, 0)}}},
	}
}

// sampleParams are kernels.Sample's params of rows with the flags given,
// temperature 0.7.
func sampleParams(flags ...uint32) []byte {
	b := make([]byte, kernels.SampleParamBytes*len(flags))
	for r, f := range flags {
		kernels.SampleParams{Seed: 9, Seq: uint32(r), Index: 4, Temperature: 0.7, Flags: f}.Put(b[r*kernels.SampleParamBytes:])
	}
	return b
}

// run launches the reference of spec with lc's scalars, every used pointer
// parameter given exactly its extent (less shrink bytes for parameter
// short), unused ones the first pointer.
func (lc launchCase) run(t *testing.T, spec gpu.KernelSpec, sig kernels.Signature, short int, shrink int64) error {
	t.Helper()
	args := make([]gpu.Arg, len(spec.Params))
	for i, k := range spec.Params {
		if k == gpu.ArgPtr {
			args[i] = gpu.Arg{Kind: gpu.ArgPtr}
			continue
		}
		a, ok := lc.scalars[i]
		if !ok {
			t.Fatalf("%s: no value for scalar %d (%s)", spec.Name, i, sig.Name(i))
		}
		args[i] = a
	}
	mem := gputest.NewMapMemory()
	var first gpu.DevicePtr
	for _, e := range sig.Extents {
		n, used, ok := e.Bytes(args)
		if !ok {
			t.Fatalf("%s: extent of %s does not evaluate", spec.Name, sig.Name(e.Param))
		}
		if !used {
			continue
		}
		if e.Param == short {
			n -= shrink
		}
		buf := make([]byte, n)
		copy(buf, lc.data[e.Param])
		args[e.Param] = gpu.Ptr(mem.Alloc(buf))
		if first == 0 {
			first = args[e.Param].AsPtr()
		}
	}
	for i, k := range spec.Params {
		if k == gpu.ArgPtr && args[i].AsPtr() == 0 {
			args[i] = gpu.Ptr(first)
		}
	}
	return spec.Ref(mem, lc.cfg, args)
}

// TestSignaturesMatchReferences checks each built-in kernel's declared
// extents against its Go reference, whose memory faults on any access
// outside a buffer: with every pointer argument exactly its extent the
// launch runs; with any one of them a byte short it faults. So no extent
// is too small (Compile would pass a launch that overruns) or too large
// (Compile would refuse a launch that fits).
func TestSignaturesMatchReferences(t *testing.T) {
	cases := extentCases()
	for _, spec := range kernels.Specs() {
		sig, ok := kernels.SignatureOf(spec.Name)
		if strings.HasPrefix(spec.Name, "sg_patcher") {
			if ok {
				t.Errorf("%s has a signature: runtimes launch it themselves", spec.Name)
			}
			continue
		}
		if !ok {
			t.Errorf("built-in kernel %s has no signature", spec.Name)
			continue
		}
		lcs := cases[spec.Name]
		if len(lcs) == 0 {
			t.Errorf("%s: no launch case", spec.Name)
			continue
		}
		for n, lc := range lcs {
			t.Run(fmt.Sprintf("%s/%d", spec.Name, n), func(t *testing.T) {
				if err := lc.run(t, spec, sig, -1, 0); err != nil {
					t.Fatalf("every argument exactly its extent: %v", err)
				}
				for _, e := range sig.Extents {
					err := lc.run(t, spec, sig, e.Param, 1)
					var fe *gpu.FaultError
					if _, used, _ := e.Bytes(lcArgs(spec, lc)); used && !errors.As(err, &fe) {
						t.Errorf("argument %d (%s) a byte short of %s: %v, want a fault",
							e.Param, sig.Name(e.Param), sig.Formula(e, lcArgs(spec, lc)), err)
					}
				}
			})
		}
	}
}

// lcArgs are lc's scalars as a launch's arguments (pointers null).
func lcArgs(spec gpu.KernelSpec, lc launchCase) []gpu.Arg {
	args := make([]gpu.Arg, len(spec.Params))
	for i, k := range spec.Params {
		args[i] = gpu.Arg{Kind: k}
		if a, ok := lc.scalars[i]; ok {
			args[i] = a
		}
	}
	return args
}

// TestSignaturesComplete: every signature names every parameter, gives
// every pointer parameter an extent, and counts only with integer
// parameters; a bound or an implied "at least 0" that a value breaks is
// one the reference refuses too (gpu.ErrInvalidValue), so Compile refuses
// nothing the kernel would run.
func TestSignaturesComplete(t *testing.T) {
	cases := extentCases()
	for _, sig := range kernels.Signatures() {
		spec, ok := kernels.Module().Kernel(sig.Kernel)
		if !ok {
			t.Errorf("signature of %s, which is not built in", sig.Kernel)
			continue
		}
		if len(sig.Names) != len(spec.Params) {
			t.Errorf("%s: %d names for %d parameters", sig.Kernel, len(sig.Names), len(spec.Params))
		}
		var ptrs, covered []int
		for i, k := range spec.Params {
			if k == gpu.ArgPtr {
				ptrs = append(ptrs, i)
			}
		}
		isInt := func(i int) bool {
			return i >= 0 && i < len(spec.Params) && slices.Contains([]gpu.ArgKind{gpu.ArgI32, gpu.ArgU32, gpu.ArgI64, gpu.ArgU64}, spec.Params[i])
		}
		counted := map[int]bool{}
		for _, e := range sig.Extents {
			covered = append(covered, e.Param)
			if e.Elem <= 0 || e.Access == 0 {
				t.Errorf("%s: extent of %s: element %d bytes, access %v", sig.Kernel, sig.Name(e.Param), e.Elem, e.Access)
			}
			for _, term := range e.Count {
				if term.Param >= 0 {
					counted[term.Param] = true
					if !isInt(term.Param) {
						t.Errorf("%s: extent of %s counts with %s, not an integer", sig.Kernel, sig.Name(e.Param), sig.Name(term.Param))
					}
				}
			}
			if e.When != nil && !isInt(e.When.Param) {
				t.Errorf("%s: extent of %s depends on %s, not an integer", sig.Kernel, sig.Name(e.Param), sig.Name(e.When.Param))
			}
		}
		slices.Sort(covered)
		if !slices.Equal(covered, ptrs) {
			t.Errorf("%s: extents of parameters %v, pointer parameters %v", sig.Kernel, covered, ptrs)
		}
		lc := cases[sig.Kernel][0]
		if msgs := sig.CheckScalars(lcArgs(spec, lc)); len(msgs) > 0 {
			t.Errorf("%s: the good case is refused: %v", sig.Kernel, msgs)
		}
		// Each bound's edges, and the implied lower bound 0 of every count.
		type edge struct {
			param int
			v     int64
		}
		var edges []edge
		for _, b := range sig.Bounds {
			delete(counted, b.Param)
			edges = append(edges, edge{b.Param, b.Min - 1})
			if b.Max < math.MaxInt32 {
				edges = append(edges, edge{b.Param, b.Max + 1})
			}
		}
		for p := range counted {
			edges = append(edges, edge{p, -1})
		}
		for _, ed := range edges {
			bad := launchCase{cfg: lc.cfg, scalars: map[int]gpu.Arg{}, data: lc.data}
			for k, v := range lc.scalars {
				bad.scalars[k] = v
			}
			bad.scalars[ed.param] = gpu.I32(int32(ed.v))
			args := lcArgs(spec, bad)
			msgs := sig.CheckScalars(args)
			if len(msgs) != 1 || !strings.Contains(msgs[0], fmt.Sprintf("argument %d (%s) = %d", ed.param, sig.Name(ed.param), ed.v)) {
				t.Errorf("%s with %s = %d: %q, want one problem naming it", sig.Kernel, sig.Name(ed.param), ed.v, msgs)
			}
			// The reference refuses it too. Its buffers are the good case's.
			good := lcArgs(spec, lc)
			mem := gputest.NewMapMemory()
			for _, e := range sig.Extents {
				n, _, _ := e.Bytes(good)
				buf := make([]byte, n)
				copy(buf, lc.data[e.Param])
				args[e.Param] = gpu.Ptr(mem.Alloc(buf))
			}
			if err := spec.Ref(mem, lc.cfg, args); !errors.Is(err, gpu.ErrInvalidValue) {
				t.Errorf("%s with %s = %d: the reference says %v, want ErrInvalidValue", sig.Kernel, sig.Name(ed.param), ed.v, err)
			}
		}
	}
}

// TestExtentBytesOverflow: an extent whose product does not fit in an
// int64 is not ok (never a wrapped small size), and says so.
func TestExtentBytesOverflow(t *testing.T) {
	sig, _ := kernels.SignatureOf(kernels.DecodeAttention)
	args := make([]gpu.Arg, 16)
	for i := range args {
		args[i] = gpu.Arg{Kind: gpu.ArgPtr}
	}
	args[11], args[12], args[13], args[14], args[15] = gpu.I32(8), gpu.I32(math.MaxInt32), gpu.I32(math.MaxInt32), gpu.I32(math.MaxInt32), gpu.F32(1)
	for _, e := range sig.Extents {
		if e.Param != 3 {
			continue
		}
		if n, used, ok := e.Bytes(args); ok || !used {
			t.Errorf("c0 of 2·npos·heads·headDim at 2^31-1 each: %d bytes, used %v, ok %v", n, used, ok)
		}
		if f := sig.Formula(e, args); !strings.Contains(f, "more than 2^63 bytes") {
			t.Errorf("formula %q", f)
		}
	}
}
