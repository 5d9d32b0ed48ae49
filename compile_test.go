package stablegraph_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
	"github.com/stablegraph/stablegraph/kernels"
)

// TestCompileErrors declares one mistake per case and checks that Compile
// rejects it with an error wrapping ErrInvalidProgram that names the
// command and the buffer, and that nothing was allocated.
func TestCompileErrors(t *testing.T) {
	const n = 16
	cfg := kernels.Elementwise(n)
	nop := func(*stablegraph.TraceEnv) error { return nil }
	cases := []struct {
		name  string
		build func(p *stablegraph.Program, x, y stablegraph.Buffer)
		want  []string // substrings of the error
	}{
		{"slice out of bounds", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Launch(kernels.Copy, cfg, stablegraph.Out(y.Slice(4*n, 4*n)), stablegraph.In(x.All()), stablegraph.I32(n))
		}, []string{"command 0 (launch sg_copy)", `buffer "y"`, "slice [64, 128) is out of bounds of the buffer's 64 bytes"}},
		{"negative offset", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Launch(kernels.Copy, cfg, stablegraph.Out(y.All()), stablegraph.In(x.Slice(-4, 8)), stablegraph.I32(n))
		}, []string{"command 0 (launch sg_copy)", `buffer "x"`, "out of bounds"}},
		{"wrong argument count", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Launch(kernels.Copy, cfg, stablegraph.Out(y.All()), stablegraph.In(x.All()))
		}, []string{"command 0 (launch sg_copy)", "takes 3 arguments, got 2"}},
		{"scalar kind", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Launch(kernels.Fill, cfg, stablegraph.Out(y.All()), stablegraph.I32(1), stablegraph.I32(n))
		}, []string{"command 0 (launch sg_fill)", "argument 1 is i32; kernel sg_fill wants f32"}},
		{"slice for a scalar", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Launch(kernels.Copy, cfg, stablegraph.Out(y.All()), stablegraph.In(x.All()), stablegraph.In(x.All()))
		}, []string{"command 0 (launch sg_copy)", `buffer "x"`, "wants a i32 scalar"}},
		{"scalar for a slice", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Launch(kernels.Copy, cfg, stablegraph.Out(y.All()), stablegraph.U64(0x7f0000000000), stablegraph.I32(n))
		}, []string{"command 0 (launch sg_copy)", "argument 1 is the scalar u64", "wants a slice"}},
		{"misaligned slice", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Launch(kernels.Copy, cfg, stablegraph.Out(y.All()), stablegraph.In(x.Slice(2, 8)), stablegraph.I32(2))
			p.Memcpy(y.All(), x.All())
		}, []string{"command 0 (launch sg_copy)", `buffer "x"`, "not 4-byte aligned"}},
		{"misaligned memset", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Memset(y.Slice(2, 8), 0, 4)
		}, []string{"command 0 (memset)", `buffer "y"`, "misaligned for 4-byte elements"}},
		{"memset element size", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Memset(y.All(), 0, 8)
		}, []string{"command 0 (memset)", `buffer "y"`, "element size 8"}},
		{"negative size", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			z := p.Temp("z", -8)
			p.Memcpy(y.All(), x.All())
			_ = z
		}, []string{`buffer "z"`, "size -8 is not positive"}},
		{"unknown kernel", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Launch("sg_nope", cfg, stablegraph.Out(y.All()))
		}, []string{"command 0 (launch sg_nope)", `unknown kernel "sg_nope"`}},
		{"output never written", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Launch(kernels.Copy, cfg, stablegraph.Out(x.All()), stablegraph.In(y.All()), stablegraph.I32(n))
		}, []string{`buffer "y"`, "output is never written"}},
		{"constant written", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			c := p.Constant("c", make([]byte, 4*n))
			p.Memcpy(c.All(), x.All())
			p.Memcpy(y.All(), c.All())
		}, []string{"command 0 (memcpy)", `buffer "c"`, "a constant is written"}},
		{"memcpy lengths", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Memcpy(y.Slice(0, 8), x.Slice(0, 16))
		}, []string{"command 0 (memcpy)", `buffer "y"`, "copies 16 bytes"}},
		{"memcpy overlap", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Memcpy(y.Slice(0, 16), y.Slice(8, 16))
		}, []string{"command 0 (memcpy)", `buffer "y"`, "overlap"}},
		{"buffer of another program", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			other := stablegraph.NewProgram("other").Param("alien", 4*n)
			p.Memcpy(y.All(), other.All())
		}, []string{"command 0 (memcpy)", `buffer "alien"`, "not declared in this program"}},
		{"gemm too small", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Gemm(y.All(), x.All(), x.All(), stablegraph.GEMM{M: 4, N: 4, K: 8, Alpha: 1})
		}, []string{"command 0 (gemm)", `buffer "x"`, "the a matrix needs 128"}},
		{"gemm shape", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Gemm(y.All(), x.All(), x.All(), stablegraph.GEMM{M: -1, N: 4, K: 4})
		}, []string{"command 0 (gemm)", `buffer "y"`, "not positive"}},
		{"trace scalar", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Trace("lib", nop, stablegraph.Out(y.All()), stablegraph.I32(3))
		}, []string{"command 0 (trace lib)", "argument 1 is the scalar i32(3)"}},
		{"trace without function", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Trace("lib", nil, stablegraph.Out(y.All()))
		}, []string{"command 0 (trace lib)", "no function"}},
		{"duplicate name", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Temp("x", 4)
			p.Memcpy(y.All(), x.All())
		}, []string{`buffer "x"`, "declared twice"}},
		{"zero launch dimension", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Launch(kernels.Copy, gpu.LaunchConfig{}, stablegraph.Out(y.All()), stablegraph.In(x.All()), stablegraph.I32(n))
		}, []string{"command 0 (launch sg_copy)", "zero dimension"}},
		{"no commands", func(p *stablegraph.Program, x, y stablegraph.Buffer) {}, []string{"no commands"}},
	}
	b := simtest.New(t, 1)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := stablegraph.NewProgram("bad")
			x := p.Param("x", 4*n)
			y := p.Output("y", 4*n)
			c.build(p, x, y)
			exe, err := stablegraph.Compile(context.Background(), b, p, stablegraph.Options{})
			if err == nil {
				exe.Close()
				t.Fatal("Compile accepted the program")
			}
			if !errors.Is(err, stablegraph.ErrInvalidProgram) {
				t.Errorf("error does not wrap ErrInvalidProgram: %v", err)
			}
			var ce *stablegraph.CompileError
			if !errors.As(err, &ce) {
				t.Errorf("error is not a *CompileError: %v", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if err := p.Validate(); err == nil {
				t.Error("Validate accepted the program")
			}
			if live := b.LiveHandles(); !live.IsZero() {
				t.Errorf("handles live after a rejected program: %s", live)
			}
		})
	}
}

// TestCompileFaults fails, one at a time, every device call Compile makes
// and checks that each failure is returned and releases everything.
func TestCompileFaults(t *testing.T) {
	for _, st := range []stablegraph.Strategy{stablegraph.StrategyPatch, stablegraph.StrategyStable, stablegraph.StrategyAuto} {
		t.Run(string(st), func(t *testing.T) { compileFaults(t, stablegraph.Options{Strategy: st}) })
	}
	// Auto choosing stable, which allocates.
	t.Run("auto-stable", func(t *testing.T) {
		compileFaults(t, stablegraph.Options{Strategy: stablegraph.StrategyAuto,
			Costs: stablegraph.Costs{CopyLatencyUS: 1e-9, CopyBytesPerUS: 1e12, NodeUpdateUS: 10}})
	})
}

func compileFaults(t *testing.T, opts stablegraph.Options) {
	b := simtest.New(t, 1)
	w := steptest.NewMLP(2, 8, 2, 10, 2)
	steptest.CompileFaults(t, b, w.P, opts, []string{"ModuleLoad", "ModuleFunction", "MemAlloc", "Memset", "MemcpyHtoD", "StreamCreate", "EventCreate"}, false)
}
