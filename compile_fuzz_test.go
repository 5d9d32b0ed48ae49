package stablegraph_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/remappable"
)

// fuzzReader hands out the fuzz input a byte at a time, zeros once it is
// exhausted, so every input decodes to some program. In strict mode (the
// first byte even) choices stay among the valid ones, so that many inputs
// compile and run; otherwise every choice may be a mistake.
type fuzzReader struct {
	data   []byte
	i      int
	strict bool
}

func (r *fuzzReader) next() int {
	if r.i >= len(r.data) {
		return 0
	}
	r.i++
	return int(r.data[r.i-1])
}

// choose returns an index below good in strict mode, below all otherwise.
func (r *fuzzReader) choose(good, all int) int {
	if r.strict {
		return r.next() % good
	}
	return r.next() % all
}

// fuzzPick returns one of vs, chosen among the first good in strict mode.
func fuzzPick[T any](r *fuzzReader, good int, vs ...T) T {
	return vs[r.choose(min(good, len(vs)), len(vs))]
}

// fuzzProgram is a program decoded from a fuzz input, with what the checks
// need to know about it.
type fuzzProgram struct {
	p        *stablegraph.Program
	bufs     []stablegraph.Buffer
	names    map[string]bool
	commands int
	// runnable: every buffer small and every size argument bounded, so
	// that running a step costs little whatever the kernels do.
	runnable bool
}

// Sizes and values the decoder draws from: valid ones first (strict mode
// takes those), then the edges (negative, zero, misaligned, huge) that
// validation must catch.
var (
	fuzzSizes   = []int64{64, 16, 256, 4, 1024, 4096, 3, 1, 0, -4, 1 << 40, math.MaxInt64}
	fuzzOffsets = []int64{0, 4, 16, 2, -4, 1 << 40}
	fuzzI32s    = []int32{16, 4, 1, 64, 0, -1, 1024, math.MaxInt32}
	fuzzDims    = []int{1, 2, 4, 8, 0, -1}
)

func decodeFuzzProgram(data []byte) *fuzzProgram {
	r := &fuzzReader{data: data}
	r.strict = r.next()%2 == 0
	fp := &fuzzProgram{p: stablegraph.NewProgram("fuzz"), names: map[string]bool{}, runnable: true}
	p := fp.p
	other := stablegraph.NewProgram("other").Param("foreign", 64)
	nbuf := 1 + r.next()%6
	for i := range nbuf {
		name := fmt.Sprintf("b%d", i)
		switch r.choose(1, 16) {
		case 1:
			name = ""
		case 2:
			name = "b0" // a duplicate unless i == 0
		}
		size := fuzzPick(r, 6, fuzzSizes...)
		if size > 1<<20 {
			fp.runnable = false
		}
		var b stablegraph.Buffer
		switch r.next() % 5 {
		case 0:
			b = p.Param(name, size)
		case 1:
			b = p.State(name, size)
		case 2:
			b = p.Temp(name, size)
		case 3:
			b = p.Output(name, size)
		case 4:
			n := max(0, min(size, 4096))
			data := make([]byte, n)
			for j := range data {
				data[j] = byte(j)
			}
			b = p.Constant(name, data)
		}
		fp.bufs = append(fp.bufs, b)
		fp.names[name] = true
	}
	// buffer picks a buffer; for a written one strict mode skips constants.
	buffer := func(write bool) stablegraph.Buffer {
		k := r.choose(len(fp.bufs), len(fp.bufs)+2)
		switch {
		case k == len(fp.bufs):
			return other
		case k > len(fp.bufs):
			return stablegraph.Buffer{}
		}
		for j := range fp.bufs {
			b := fp.bufs[(k+j)%len(fp.bufs)]
			if !r.strict || !write || b.Class() != stablegraph.Constant {
				return b
			}
		}
		return fp.bufs[k]
	}
	slice := func(write bool) stablegraph.Slice {
		b := buffer(write)
		off := fuzzPick(r, 3, fuzzOffsets...)
		switch r.choose(4, 6) {
		case 0, 1, 2:
			return b.All()
		case 3:
			if r.strict && off >= b.Size() {
				return b.All()
			}
			return b.Slice(off, b.Size()-off)
		case 4:
			return b.Slice(off, fuzzPick(r, 6, fuzzSizes...))
		default:
			return b.Slice(0, fuzzPick(r, 6, fuzzSizes...))
		}
	}
	scalar := func(kind gpu.ArgKind) stablegraph.Arg {
		switch kind {
		case gpu.ArgI32:
			v := fuzzPick(r, 4, fuzzI32s...)
			if v > 4096 {
				fp.runnable = false
			}
			return stablegraph.I32(v)
		case gpu.ArgU32:
			return stablegraph.U32(uint32(r.next()))
		case gpu.ArgI64:
			return stablegraph.I64(int64(r.next()))
		case gpu.ArgU64:
			return stablegraph.U64(uint64(r.next()))
		case gpu.ArgF32:
			return stablegraph.F32(float32(r.next()) / 16)
		default:
			return stablegraph.F64(float64(r.next()))
		}
	}
	arg := func(want gpu.ArgKind, write bool) stablegraph.Arg {
		kind := want
		if r.choose(1, 8) == 1 { // a wrong kind now and then
			kind = fuzzPick(r, 7, gpu.ArgPtr, gpu.ArgI32, gpu.ArgU32, gpu.ArgI64, gpu.ArgU64, gpu.ArgF32, gpu.ArgF64)
		}
		if kind != gpu.ArgPtr {
			return scalar(kind)
		}
		if write {
			if r.next()%2 == 0 {
				return stablegraph.Out(slice(true))
			}
			return stablegraph.InOut(slice(true))
		}
		return stablegraph.In(slice(false))
	}
	specs := kernels.Specs()
	fp.commands = r.next() % 8
	for range fp.commands {
		switch r.next() % 6 {
		case 0, 1:
			name := "no_such_kernel"
			params := []gpu.ArgKind{gpu.ArgPtr, gpu.ArgI32}
			if k := r.choose(len(specs), len(specs)+1); k < len(specs) {
				name, params = specs[k].Name, specs[k].Params
			}
			n := len(params)
			switch r.choose(1, 8) {
			case 1:
				n++
			case 2:
				n = max(0, n-1)
			}
			args := make([]stablegraph.Arg, n)
			for j := range args {
				want := gpu.ArgI32
				if j < len(params) {
					want = params[j]
				}
				args[j] = arg(want, j == 0) // every built-in kernel writes its first argument
			}
			cfg := kernels.Elementwise(int(fuzzPick(r, 4, fuzzI32s[:4]...)) + 1)
			switch r.choose(2, 8) {
			case 1:
				cfg = kernels.GemmConfig(fuzzPick(r, 4, fuzzDims...), fuzzPick(r, 4, fuzzDims...))
			case 2:
				cfg.Grid.X = 0
			case 3:
				cfg.Block.X = 4096 // over the device's limit
			}
			p.Launch(name, cfg, args...)
		case 2:
			dst, src := slice(true), slice(false)
			if r.strict {
				n := min(dst.Len(), src.Len())
				dst, src = dst.Buffer().Slice(dst.Offset(), n), src.Buffer().Slice(src.Offset(), n)
				if dst.Buffer() == src.Buffer() {
					p.Memset(dst, 0, 1)
					break
				}
			}
			p.Memcpy(dst, src)
		case 3:
			v := fuzzPick(r, 3, uint32(0), 1, 0x3f800000, 0x1ff)
			p.Memset(slice(true), v, fuzzPick(r, 1, 4, 1, 2, 0, 3, 8))
		case 4:
			g := stablegraph.GEMM{M: fuzzPick(r, 2, fuzzDims...), N: fuzzPick(r, 2, fuzzDims...), K: fuzzPick(r, 2, fuzzDims...),
				TransA: r.next()%2 == 0, TransB: r.next()%2 == 0, Alpha: 1, Beta: float32(r.next() % 2)}
			p.Gemm(slice(true), slice(false), slice(false), g)
		case 5:
			name := fuzzPick(r, 1, "fill", "")
			var fn stablegraph.TraceFunc
			if r.choose(1, 8) == 0 {
				fn = func(env *stablegraph.TraceEnv) error {
					f, err := env.Kernel(kernels.Fill)
					if err != nil {
						return err
					}
					if len(env.Ptrs) == 0 {
						return nil
					}
					return env.Backend.LaunchKernel(f, kernels.Elementwise(1),
						[]gpu.Arg{gpu.Ptr(env.Ptrs[0]), gpu.F32(1), gpu.I32(1)}, env.Stream)
				}
			}
			args := make([]stablegraph.Arg, r.next()%3)
			for j := range args {
				args[j] = arg(gpu.ArgPtr, j == 0)
			}
			p.Trace(name, fn, args...)
		}
	}
	if r.strict {
		// Every output written, so that strict programs can compile.
		for _, b := range fp.bufs {
			if b.Class() == stablegraph.Output {
				p.Memset(b.All(), 0, 1)
				fp.commands++
			}
		}
	}
	return fp
}

// FuzzCompile builds random programs (buffers of every class and size,
// slices in and out of bounds, commands with right and wrong arguments) and
// compiles them with a random strategy on the sim. Compile must never panic
// and must return either a working executable or an error; an invalid
// program's error is one *CompileError per mistake, naming a command of the
// program and a declared buffer; a failed compile leaves no handle live. A
// program that compiles runs one step (which may fault on the device,
// since validation does not know what a kernel's size arguments mean) and
// closes with no handle live.
func FuzzCompile(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{2, 0, 0, 0, 3, 0, 0, 3, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	// A param, an output and a copy between them: valid.
	f.Add([]byte{2, 2, 0, 0, 2, 2, 0, 3, 1, 2, 1, 0, 0, 0, 0, 0, 0})
	// The launch of a known kernel over two buffers.
	f.Add([]byte{3, 2, 2, 0, 2, 2, 3, 2, 2, 1, 1, 4, 0, 0, 5, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0})
	f.Add([]byte{5, 9, 10, 2, 0, 11, 1, 1, 1, 2, 2, 7, 3, 0, 4, 6, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Add([]byte("gemm and memset and trace and launch: a longer input decodes to a longer program"))
	for i := range 6 {
		seed := make([]byte, 64)
		for j := range seed {
			seed[j] = byte(j*7 + i*13)
		}
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fp := decodeFuzzProgram(data)
		strategies := stablegraph.Strategies()
		strat := strategies[len(data)%len(strategies)]
		b, err := sim.New(sim.Config{Devices: 1, DeviceMemory: 1 << 30})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if live := b.LiveHandles(); !live.IsZero() {
				t.Errorf("handles live at the end: %s", live)
			}
			b.Close()
		}()
		verr := fp.p.Validate()
		ctx := context.Background()
		opts := stablegraph.Options{Strategy: strat}
		var ra *remappable.Allocator
		if strat == stablegraph.StrategyRemap {
			// Remap maps the memory behind the params and outputs: they
			// come from a remappable allocator.
			if ra, err = remappable.New(b, 0, nil); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := ra.Close(); err != nil {
					t.Errorf("close the remappable allocator: %v", err)
				}
			}()
			opts.Remap.Memory = ra
		}
		exe, err := stablegraph.Compile(ctx, b, fp.p, opts)
		if err != nil {
			checkFuzzCompileError(t, fp, verr, err)
			if live := b.LiveHandles(); !live.IsZero() {
				t.Fatalf("Compile failed and left handles live: %s (error: %v)", live, err)
			}
			return
		}
		if verr != nil {
			t.Fatalf("Validate failed (%v) but Compile succeeded", verr)
		}
		defer func() {
			if err := exe.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}()
		if !fp.runnable {
			return
		}
		fuzzRunOnce(t, b, exe, fp, ra)
	})
}

// checkFuzzCompileError checks a failed Compile: the error has text, an
// invalid program fails Validate the same way, and each mistake is a
// *CompileError that names a command of the program and a declared buffer.
func checkFuzzCompileError(t *testing.T, fp *fuzzProgram, verr, err error) {
	t.Helper()
	if err.Error() == "" {
		t.Fatal("Compile failed with an empty error")
	}
	if !errors.Is(err, stablegraph.ErrInvalidProgram) {
		if verr != nil {
			t.Fatalf("Validate failed (%v) but Compile failed otherwise: %v", verr, err)
		}
		// A device failure (a buffer too large for the device): it must
		// come from the device and name the program.
		if !strings.Contains(err.Error(), `"fuzz"`) {
			t.Fatalf("compile error does not name the program: %v", err)
		}
		return
	}
	if verr == nil {
		t.Fatalf("Compile rejected a program that Validate accepts: %v", err)
	}
	var leaves []error
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, c := range j.Unwrap() {
				walk(c)
			}
			return
		}
		leaves = append(leaves, e)
	}
	walk(err)
	for _, e := range leaves {
		var ce *stablegraph.CompileError
		if !errors.As(e, &ce) {
			t.Fatalf("a mistake is not a *CompileError: %T %v", e, e)
		}
		if ce.Msg == "" || ce.Program != "fuzz" {
			t.Fatalf("CompileError without a message or program: %#v", ce)
		}
		if ce.Command < -1 || ce.Command >= fp.commands {
			t.Fatalf("CompileError names command %d of %d: %v", ce.Command, fp.commands, ce)
		}
		if ce.Command >= 0 && ce.Op == "" {
			t.Fatalf("CompileError names command %d without its operation: %v", ce.Command, ce)
		}
		if ce.Buffer != "" && !fp.names[ce.Buffer] && ce.Buffer != "foreign" {
			t.Fatalf("CompileError names buffer %q, which is not declared: %v", ce.Buffer, ce)
		}
	}
}

// fuzzRunOnce binds every param and output to fresh memory and runs one
// step. The step may fail (a kernel told to touch more than its slice
// faults on the sim): it must return an error, never panic, and leave the
// executable closable.
func fuzzRunOnce(t *testing.T, b *sim.Backend, exe *stablegraph.Executable, fp *fuzzProgram, ra *remappable.Allocator) {
	t.Helper()
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	bind := stablegraph.Bindings{}
	var allocs []gpu.DevicePtr
	defer func() {
		// A faulted device keeps its sticky error until reset; the
		// executable's Close must still release everything.
		_ = b.StreamSynchronize(s)
		_ = b.ResetDevice(0)
		for _, p := range allocs {
			free := b.MemFree
			if ra != nil {
				free = ra.Free
			}
			if err := free(p); err != nil {
				t.Errorf("free: %v", err)
			}
		}
		if err := b.StreamDestroy(s); err != nil {
			t.Errorf("destroy stream: %v", err)
		}
	}()
	for _, buf := range fp.bufs {
		if c := buf.Class(); c != stablegraph.Param && c != stablegraph.Output {
			continue
		}
		alloc := func(size uint64) (gpu.DevicePtr, error) { return b.MemAlloc(0, size) }
		if ra != nil {
			alloc = ra.Alloc
		}
		p, err := alloc(uint64(buf.Size()))
		if err != nil {
			t.Fatal(err)
		}
		allocs = append(allocs, p)
		bind[buf] = p
	}
	outs, err := exe.Run(context.Background(), s, bind)
	if err != nil {
		return
	}
	defer outs.Release()
	_ = b.StreamSynchronize(s)
}
