package stablegraph_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/workload"
)

// extentLaunches are launches of every built-in kernel that has a
// signature, by their scalar arguments (parameter index → value); every
// pointer argument gets a buffer of its own.
var extentLaunches = map[string]struct {
	cfg     gpu.LaunchConfig
	scalars map[int]gpu.Arg
}{
	kernels.Fill:         {kernels.Elementwise(6), map[int]gpu.Arg{1: gpu.F32(1), 2: gpu.I32(6)}},
	kernels.FillU64:      {kernels.Elementwise(6), map[int]gpu.Arg{1: gpu.U64(1), 2: gpu.I32(6)}},
	kernels.Copy:         {kernels.Elementwise(6), map[int]gpu.Arg{2: gpu.I32(6)}},
	kernels.Axpb:         {kernels.Elementwise(6), map[int]gpu.Arg{2: gpu.F32(2), 3: gpu.F32(1), 4: gpu.I32(6)}},
	kernels.Axpy:         {kernels.Elementwise(6), map[int]gpu.Arg{2: gpu.F32(2), 3: gpu.I32(6)}},
	kernels.Add:          {kernels.Elementwise(6), map[int]gpu.Arg{3: gpu.I32(6)}},
	kernels.SubScale:     {kernels.Elementwise(6), map[int]gpu.Arg{3: gpu.F32(2), 4: gpu.I32(6)}},
	kernels.BiasAdd:      {kernels.Elementwise(12), map[int]gpu.Arg{3: gpu.I32(3), 4: gpu.I32(4)}},
	kernels.BiasTanh:     {kernels.Elementwise(12), map[int]gpu.Arg{3: gpu.I32(3), 4: gpu.I32(4)}},
	kernels.Tanh:         {kernels.Elementwise(6), map[int]gpu.Arg{2: gpu.I32(6)}},
	kernels.Relu:         {kernels.Elementwise(6), map[int]gpu.Arg{2: gpu.I32(6)}},
	kernels.TanhBackward: {kernels.Elementwise(6), map[int]gpu.Arg{3: gpu.I32(6)}},
	kernels.ReluBackward: {kernels.Elementwise(6), map[int]gpu.Arg{3: gpu.I32(6)}},
	kernels.BiasGrad:     {kernels.Elementwise(4), map[int]gpu.Arg{2: gpu.I32(3), 3: gpu.I32(4)}},
	kernels.Gemm: {kernels.GemmConfig(3, 4), map[int]gpu.Arg{3: gpu.I32(3), 4: gpu.I32(4), 5: gpu.I32(5),
		6: gpu.I32(1), 7: gpu.I32(0), 8: gpu.F32(1), 9: gpu.F32(1)}},
	kernels.Embed: {kernels.Elementwise(12), map[int]gpu.Arg{5: gpu.I32(3), 6: gpu.I32(4), 7: gpu.I32(7), 8: gpu.I32(5)}},
	kernels.LayerNorm: {kernels.LayerNormConfig(3), map[int]gpu.Arg{4: gpu.I32(3), 5: gpu.I32(4),
		6: gpu.F32(1e-5)}},
	kernels.BiasGelu:     {kernels.Elementwise(12), map[int]gpu.Arg{3: gpu.I32(3), 4: gpu.I32(4)}},
	kernels.BiasResidual: {kernels.Elementwise(12), map[int]gpu.Arg{3: gpu.I32(3), 4: gpu.I32(4)}},
	kernels.KVAppend: {kernels.Elementwise(12), map[int]gpu.Arg{12: gpu.I32(3), 13: gpu.I32(4),
		14: gpu.I32(1), 15: gpu.I32(0), 16: gpu.I32(5)}},
	kernels.DecodeAttention: {kernels.DecodeAttentionConfig(3, 2, 2, 5), map[int]gpu.Arg{11: gpu.I32(3),
		12: gpu.I32(2), 13: gpu.I32(2), 14: gpu.I32(1), 15: gpu.I32(0), 16: gpu.I32(5), 17: gpu.F32(0.5)}},
	kernels.Argmax: {kernels.ArgmaxConfig(3), map[int]gpu.Arg{3: gpu.I32(3), 4: gpu.I32(5)}},
	kernels.Sample: {kernels.SampleConfig(3), map[int]gpu.Arg{5: gpu.I32(3), 6: gpu.I32(5), 7: gpu.I32(2)}},
}

// extentProgram declares a launch of sig's kernel with the scalars of
// extentLaunches and, for every pointer argument, a buffer of exactly its
// extent, named after the argument (an unused cache, or one whose extent
// does not evaluate, gets 4 bytes); the
// argument short gets a slice short bytes shorter than its buffer. It
// returns each argument's extent in bytes.
func extentProgram(t *testing.T, sig kernels.Signature, short int, by int64) (*stablegraph.Program, map[int]int64) {
	t.Helper()
	spec, _ := kernels.Module().Kernel(sig.Kernel)
	l, ok := extentLaunches[sig.Kernel]
	if !ok {
		t.Fatalf("no launch of %s in the table", sig.Kernel)
	}
	raw := make([]gpu.Arg, len(spec.Params))
	for i, k := range spec.Params {
		raw[i] = gpu.Arg{Kind: k}
	}
	for i, a := range l.scalars {
		raw[i] = a
	}
	p := stablegraph.NewProgram("extents")
	args := make([]stablegraph.Arg, len(spec.Params))
	sizes := map[int]int64{}
	for _, e := range sig.Extents {
		n, used, ok := e.Bytes(raw)
		if !used || !ok { // unused, or a scalar out of range (refused first)
			n = 4
		}
		sizes[e.Param] = n
		buf := p.Param(sig.Name(e.Param), n)
		s := buf.All()
		if e.Param == short {
			s = buf.Slice(0, n-by)
		}
		if e.Access&kernels.Writes != 0 {
			args[e.Param] = stablegraph.InOut(s)
		} else {
			args[e.Param] = stablegraph.In(s)
		}
	}
	for i, a := range l.scalars {
		args[i] = sgArg(a)
	}
	p.Launch(sig.Kernel, l.cfg, args...)
	out := p.Output("result", 4)
	p.Memset(out.All(), 0, 4)
	return p, sizes
}

// sgArg is a scalar as a program's argument.
func sgArg(a gpu.Arg) stablegraph.Arg {
	switch a.Kind {
	case gpu.ArgI32:
		return stablegraph.I32(a.AsI32())
	case gpu.ArgU64:
		return stablegraph.U64(a.AsU64())
	case gpu.ArgF32:
		return stablegraph.F32(a.AsF32())
	}
	panic("sgArg: kind " + a.Kind.String())
}

// TestLaunchExtents: for every built-in kernel, a launch whose slices hold
// exactly what the kernel touches compiles, and one whose slice of any
// pointer argument is 4 bytes short is refused with one error wrapping
// ErrInvalidProgram that names the command, the kernel argument, the
// buffer, the bytes the kernel needs and the bytes the slice holds.
func TestLaunchExtents(t *testing.T) {
	for _, sig := range kernels.Signatures() {
		t.Run(sig.Kernel, func(t *testing.T) {
			p, sizes := extentProgram(t, sig, -1, 0)
			if err := p.Validate(); err != nil {
				t.Fatalf("every slice exactly its extent: %v", err)
			}
			for _, e := range sig.Extents {
				need := sizes[e.Param]
				if e.When != nil && need == 4 {
					continue // an unused cache: any size will do, checked below
				}
				p, _ := extentProgram(t, sig, e.Param, 4)
				err := p.Validate()
				var ce *stablegraph.CompileError
				if !errors.Is(err, stablegraph.ErrInvalidProgram) || !errors.As(err, &ce) || strings.Count(err.Error(), "\n") != 0 {
					t.Errorf("%s 4 bytes short: %v, want one *CompileError", sig.Name(e.Param), err)
					continue
				}
				name := sig.Name(e.Param)
				for _, want := range []string{
					fmt.Sprintf("command 0 (launch %s)", sig.Kernel),
					fmt.Sprintf("buffer %q", name),
					fmt.Sprintf("argument %d (%s): %s %s", e.Param, name, sig.Kernel, e.Access),
					fmt.Sprintf("= %d bytes, but the slice %s[0:%d] holds %d bytes", need, name, need-4, need-4),
				} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("%s 4 bytes short: %q lacks %q", name, err, want)
					}
				}
				if ce.Command != 0 || ce.Buffer != name {
					t.Errorf("%s 4 bytes short: command %d, buffer %q", name, ce.Command, ce.Buffer)
				}
			}
		})
	}
	if got, want := len(kernels.Signatures()), len(extentLaunches); got != want {
		t.Errorf("%d signatures, %d launches in the table", got, want)
	}
}

// TestLaunchExtentAxpb is the audit's case: sg_axpb over 1000 elements of
// 16-byte buffers compiled, Run returned nil, and the sim faulted at the
// next synchronisation. Compile refuses it, naming both arguments and both
// sizes, and allocates nothing.
func TestLaunchExtentAxpb(t *testing.T) {
	b := simtest.New(t, 1)
	p := stablegraph.NewProgram("axpb")
	x, y := p.Param("x", 16), p.Output("y", 16)
	p.Launch(kernels.Axpb, kernels.Elementwise(1000), stablegraph.Out(y.All()), stablegraph.In(x.All()),
		stablegraph.F32(2), stablegraph.F32(1), stablegraph.I32(1000))
	exe, err := stablegraph.Compile(context.Background(), b, p, stablegraph.Options{})
	if err == nil {
		exe.Close()
		t.Fatal("compiled")
	}
	want := []string{
		`stablegraph: program "axpb": command 0 (launch sg_axpb): buffer "y": argument 0 (y): sg_axpb writes 4·n = 4·1000 = 4000 bytes, but the slice y[0:16] holds 16 bytes`,
		`stablegraph: program "axpb": command 0 (launch sg_axpb): buffer "x": argument 1 (x): sg_axpb reads 4·n = 4·1000 = 4000 bytes, but the slice x[0:16] holds 16 bytes`,
	}
	if !errors.Is(err, stablegraph.ErrInvalidProgram) || err.Error() != strings.Join(want, "\n") {
		t.Errorf("got %q\nwant %q", err, strings.Join(want, "\n"))
	}
	simtest.WantZero(t, b, "after the refused Compile")
}

// TestLaunchScalarBounds: scalars a kernel cannot take (a negative count,
// nseq past MaxSeqsPerLaunch, a zero vocabulary) are refused at Compile,
// naming the argument, instead of failing on the device.
func TestLaunchScalarBounds(t *testing.T) {
	sig, _ := kernels.SignatureOf(kernels.KVAppend)
	p, _ := extentProgram(t, sig, -1, 0)
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		kernel string
		param  int
		value  int32
		want   string
	}{
		{kernels.KVAppend, 12, 9, "argument 12 (nseq) = 9 is not 1 to 8"},
		{kernels.DecodeAttention, 11, 0, "argument 11 (nseq) = 0 is not 1 to 8"},
		{kernels.Embed, 7, 0, "argument 7 (vocab) = 0 is not positive"},
		{kernels.Copy, 2, -1, "argument 2 (n) = -1 is negative"},
		{kernels.Gemm, 5, -2, "argument 5 (k) = -2 is negative"},
	}
	for _, c := range cases {
		sig, _ := kernels.SignatureOf(c.kernel)
		l := extentLaunches[c.kernel]
		old := l.scalars[c.param]
		l.scalars[c.param] = gpu.I32(c.value)
		p, _ := extentProgram(t, sig, -1, 0)
		l.scalars[c.param] = old
		err := p.Validate()
		if !errors.Is(err, stablegraph.ErrInvalidProgram) || !strings.Contains(err.Error(), fmt.Sprintf("command 0 (launch %s): %s", c.kernel, c.want)) {
			t.Errorf("%s: %v, want %q", c.kernel, err, c.want)
		}
	}
}

// TestLaunchExtentUnusedCaches: caches past nseq are ignored by the
// kernels, so any slice will do for them; a used one is checked.
func TestLaunchExtentUnusedCaches(t *testing.T) {
	sig, _ := kernels.SignatureOf(kernels.DecodeAttention)
	p, sizes := extentProgram(t, sig, -1, 0)
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if sizes[3] != 4*2*5*2*2 || sizes[5] != sizes[3] || sizes[6] != 4 || sizes[10] != 4 {
		t.Errorf("cache sizes %v: c0..c2 used (npos·layers·2·heads·headDim floats, one layer here), c3..c7 not", sizes)
	}
}

// TestWorkloadsCompileWithExtents: every workload at its default shape
// (the large ones over two layers), gpt2-decode with a batch that fills one
// launch and spills into a second, passes the checks.
func TestWorkloadsCompileWithExtents(t *testing.T) {
	for _, name := range workload.Names() {
		cfg := workload.Config{}
		if strings.HasPrefix(name, "gpt2-decode") {
			cfg = workload.Config{Layers: 1, Width: 64, Heads: 4, Vocab: 256, Positions: 64, Pos: 8, Batch: kernels.MaxSeqsPerLaunch + 3}
		}
		if strings.HasSuffix(name, "-large") {
			// Every layer has the same shapes: two of the eight check
			// them, without drawing the other six layers' weights.
			cfg.Layers = 2
		}
		w, err := workload.New(name, cfg)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if err := w.Program.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
