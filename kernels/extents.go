package kernels

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"

	"github.com/stablegraph/stablegraph/gpu"
)

// Signatures: what each built-in kernel's launch touches (see "Extents" in
// the package doc). The patcher kernels (patcher.go) have none: runtimes
// launch them themselves with records laid out by PatcherMemory.

// Access says whether a kernel reads or writes a pointer argument's memory.
type Access uint8

const (
	Reads  Access = 1 << iota // the kernel reads the memory
	Writes                    // the kernel writes the memory
)

func (a Access) String() string {
	switch a {
	case Reads:
		return "reads"
	case Writes:
		return "writes"
	case Reads | Writes:
		return "reads and writes"
	}
	return fmt.Sprintf("Access(%d)", uint8(a))
}

// Term is one factor of an element count: the value of the scalar
// parameter Param (an integer parameter), or Const when Param is -1.
type Term struct {
	Param int
	Const int64
}

// Cond says when a pointer parameter is used at all: only while the scalar
// parameter Param is more than Above.
type Cond struct {
	Param int
	Above int64
}

// Extent is the memory a launch touches through one pointer parameter:
// Elem bytes times the product of Count, from the start of the pointer.
type Extent struct {
	Param  int // the pointer parameter
	Access Access
	Elem   int64  // bytes per element
	Count  []Term // the number of elements: the product of the terms
	// When, if not nil, is when the parameter is used; otherwise the
	// launch ignores it (any valid pointer will do).
	When *Cond
}

// Bound is the range [Min, Max] of an integer scalar parameter.
type Bound struct {
	Param    int
	Min, Max int64
}

// Signature is a kernel's parameters by name, the memory each pointer
// parameter's launch touches, and the ranges of its scalars. Every scalar
// that counts elements (appears in an Extent's Count) must also be at
// least 0, unless Bounds says more.
type Signature struct {
	Kernel  string
	Names   []string // one per parameter, in order
	Extents []Extent // one per pointer parameter the kernel may use
	Bounds  []Bound
}

// SignatureOf returns the signature of the built-in kernel named kernel,
// and false when it has none (it is not built in, or it is the patcher).
func SignatureOf(kernel string) (Signature, bool) {
	s, ok := signatures[kernel]
	return s, ok
}

// Signatures returns every built-in kernel's signature, in the order of
// Specs.
func Signatures() []Signature {
	out := make([]Signature, 0, len(signatures))
	for _, k := range Specs() {
		if s, ok := signatures[k.Name]; ok {
			out = append(out, s)
		}
	}
	return out
}

// CheckScalars checks a launch's scalar arguments against the signature's
// bounds: every problem, as a phrase naming the parameter ("argument 4 (n)
// = -1 is negative"), none when they are all in range. args are the
// launch's arguments in order, of the spec's kinds.
func (s Signature) CheckScalars(args []gpu.Arg) []string {
	var out []string
	bounded := map[int]bool{}
	for _, b := range s.Bounds {
		bounded[b.Param] = true
		v, ok := intArg(args, b.Param)
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("argument %d (%s) is not an integer", b.Param, s.name(b.Param)))
		case v < b.Min || v > b.Max:
			out = append(out, fmt.Sprintf("argument %d (%s) = %d is not %s", b.Param, s.name(b.Param), v, rangeText(b.Min, b.Max)))
		}
	}
	for _, e := range s.Extents {
		for _, t := range e.Count {
			if t.Param < 0 || bounded[t.Param] {
				continue
			}
			bounded[t.Param] = true
			v, ok := intArg(args, t.Param)
			switch {
			case !ok:
				out = append(out, fmt.Sprintf("argument %d (%s) is not an integer", t.Param, s.name(t.Param)))
			case v < 0:
				out = append(out, fmt.Sprintf("argument %d (%s) = %d is negative", t.Param, s.name(t.Param), v))
			}
		}
	}
	return out
}

// Bytes is the memory, in bytes, that a launch with args touches through
// e's parameter, and whether it uses the parameter at all (e.When). ok is
// false when a count is negative or not an integer (CheckScalars says
// which) or the size does not fit in an int64.
func (e Extent) Bytes(args []gpu.Arg) (n int64, used, ok bool) {
	if e.When != nil {
		v, isInt := intArg(args, e.When.Param)
		if !isInt {
			return 0, false, false
		}
		if v <= e.When.Above {
			return 0, false, true
		}
	}
	prod := uint64(e.Elem)
	for _, t := range e.Count {
		v := t.Const
		if t.Param >= 0 {
			var isInt bool
			if v, isInt = intArg(args, t.Param); !isInt {
				return 0, true, false
			}
		}
		if v < 0 {
			return 0, true, false
		}
		hi, lo := bits.Mul64(prod, uint64(v))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, true, false
		}
		prod = lo
	}
	return int64(prod), true, true
}

// Formula says how e is computed and, given args, what it comes to:
// "4·rows·cols = 4·3·5 = 60 bytes" (the last part "more than 2^63 bytes"
// when it does not fit in an int64).
func (s Signature) Formula(e Extent, args []gpu.Arg) string {
	names := []string{strconv.FormatInt(e.Elem, 10)}
	vals := []string{strconv.FormatInt(e.Elem, 10)}
	for _, t := range e.Count {
		if t.Param < 0 {
			names = append(names, strconv.FormatInt(t.Const, 10))
			vals = append(vals, strconv.FormatInt(t.Const, 10))
			continue
		}
		names = append(names, s.name(t.Param))
		v, _ := intArg(args, t.Param)
		vals = append(vals, strconv.FormatInt(v, 10))
	}
	f := strings.Join(names, "·")
	if len(e.Count) > 0 {
		f += " = " + strings.Join(vals, "·")
	}
	if n, _, ok := e.Bytes(args); ok {
		return fmt.Sprintf("%s = %d bytes", f, n)
	}
	return f + " = more than 2^63 bytes"
}

// Name is parameter i's name.
func (s Signature) Name(i int) string { return s.name(i) }

func (s Signature) name(i int) string {
	if i >= 0 && i < len(s.Names) {
		return s.Names[i]
	}
	return fmt.Sprintf("#%d", i)
}

// intArg is args[i] as an integer, and false when it is missing or not of
// an integer kind (or a u64 past MaxInt64).
func intArg(args []gpu.Arg, i int) (int64, bool) {
	if i < 0 || i >= len(args) {
		return 0, false
	}
	a := args[i]
	switch a.Kind {
	case gpu.ArgI32:
		return int64(a.AsI32()), true
	case gpu.ArgU32:
		return int64(a.AsU32()), true
	case gpu.ArgI64:
		return a.AsI64(), true
	case gpu.ArgU64:
		if a.AsU64() > math.MaxInt64 {
			return 0, false
		}
		return int64(a.AsU64()), true
	}
	return 0, false
}

func rangeText(lo, hi int64) string {
	if hi == math.MaxInt64 || hi == math.MaxInt32 {
		if lo == 1 {
			return "positive"
		}
		return fmt.Sprintf("at least %d", lo)
	}
	return fmt.Sprintf("%d to %d", lo, hi)
}

// Building blocks of the signature table.

// arg is the term of scalar parameter i; num a constant term.
func arg(i int) Term   { return Term{Param: i} }
func num(k int64) Term { return Term{Param: -1, Const: k} }

// f32x is the extent of float32 elements of parameter i.
func f32x(i int, a Access, count ...Term) Extent {
	return Extent{Param: i, Access: a, Elem: 4, Count: count}
}

// positiveBounds bounds each of params to [1, MaxInt32].
func positiveBounds(params ...int) []Bound {
	out := make([]Bound, len(params))
	for k, i := range params {
		out[k] = Bound{Param: i, Min: 1, Max: math.MaxInt32}
	}
	return out
}

// cacheExtents are the extents of the MaxSeqsPerLaunch cache parameters from
// first: cache i, used only when nseq > i, of the product of perRow.
func cacheExtents(first, nseq int, a Access, perRow ...Term) []Extent {
	out := make([]Extent, MaxSeqsPerLaunch)
	for i := range out {
		out[i] = f32x(first+i, a, perRow...)
		out[i].When = &Cond{Param: nseq, Above: int64(i)}
	}
	return out
}

func cacheNames() []string {
	out := make([]string, MaxSeqsPerLaunch)
	for i := range out {
		out[i] = fmt.Sprintf("c%d", i)
	}
	return out
}

// signatures are the built-in kernels' signatures, by kernel name. The
// kernels' doc comments (kernels.go, gpt2.go) give the same parameters;
// TestSignaturesMatchReferences checks each extent against the reference:
// a launch with exactly those bytes runs, one with a byte less faults.
var signatures = func() map[string]Signature {
	const rw = Reads | Writes
	n1 := func(names ...string) []string { return names }
	elementwise := func(kernel string, names []string, access ...Access) Signature {
		nPar := len(names) - 1
		s := Signature{Kernel: kernel, Names: names}
		for i, a := range access {
			if a != 0 {
				s.Extents = append(s.Extents, f32x(i, a, arg(nPar)))
			}
		}
		return s
	}
	// bias kernels: (y, x, bias, rows, cols).
	biasKernel := func(kernel string, names []string, y Access) Signature {
		return Signature{Kernel: kernel, Names: names, Extents: []Extent{
			f32x(0, y, arg(3), arg(4)), f32x(1, Reads, arg(3), arg(4)), f32x(2, Reads, arg(4)),
		}}
	}
	list := []Signature{
		elementwise(Fill, n1("y", "value", "n"), Writes),
		{Kernel: FillU64, Names: n1("y", "value", "n"), Extents: []Extent{{Param: 0, Access: Writes, Elem: 8, Count: []Term{arg(2)}}}},
		elementwise(Copy, n1("y", "x", "n"), Writes, Reads),
		elementwise(Axpb, n1("y", "x", "a", "b", "n"), Writes, Reads),
		elementwise(Axpy, n1("y", "x", "a", "n"), rw, Reads),
		elementwise(Add, n1("z", "x", "y", "n"), Writes, Reads, Reads),
		elementwise(SubScale, n1("z", "x", "y", "s", "n"), Writes, Reads, Reads),
		biasKernel(BiasAdd, n1("y", "x", "bias", "rows", "cols"), Writes),
		biasKernel(BiasTanh, n1("y", "x", "bias", "rows", "cols"), Writes),
		elementwise(Tanh, n1("y", "x", "n"), Writes, Reads),
		elementwise(Relu, n1("y", "x", "n"), Writes, Reads),
		elementwise(TanhBackward, n1("dx", "dy", "y", "n"), Writes, Reads, Reads),
		elementwise(ReluBackward, n1("dx", "dy", "x", "n"), Writes, Reads, Reads),
		{Kernel: BiasGrad, Names: n1("db", "dy", "rows", "cols"), Extents: []Extent{
			f32x(0, Writes, arg(3)), f32x(1, Reads, arg(2), arg(3)),
		}},
		// C is read only when beta != 0; it is written whole either way.
		{Kernel: Gemm, Names: n1("c", "a", "b", "m", "n", "k", "transA", "transB", "alpha", "beta"), Extents: []Extent{
			f32x(0, rw, arg(3), arg(4)), f32x(1, Reads, arg(3), arg(5)), f32x(2, Reads, arg(5), arg(4)),
		}},
		// wte and wpe are indexed by token ids and positions, checked
		// against vocab and npos.
		{Kernel: Embed, Names: n1("y", "wte", "wpe", "tokens", "positions", "rows", "d", "vocab", "npos"), Extents: []Extent{
			f32x(0, Writes, arg(5), arg(6)), f32x(1, Reads, arg(7), arg(6)), f32x(2, Reads, arg(8), arg(6)),
			{Param: 3, Access: Reads, Elem: 4, Count: []Term{arg(5)}}, {Param: 4, Access: Reads, Elem: 4, Count: []Term{arg(5)}},
		}, Bounds: positiveBounds(5, 6, 7, 8)},
		{Kernel: LayerNorm, Names: n1("y", "x", "gamma", "beta", "rows", "cols", "eps"), Extents: []Extent{
			f32x(0, Writes, arg(4), arg(5)), f32x(1, Reads, arg(4), arg(5)), f32x(2, Reads, arg(5)), f32x(3, Reads, arg(5)),
		}, Bounds: positiveBounds(4, 5)},
		biasKernel(BiasGelu, n1("y", "x", "bias", "rows", "cols"), Writes),
		{Kernel: BiasResidual, Names: n1("x", "a", "bias", "rows", "cols"), Extents: []Extent{
			f32x(0, rw, arg(3), arg(4)), f32x(1, Reads, arg(3), arg(4)), f32x(2, Reads, arg(4)),
		}},
		// (q, qkv, bias, positions, c0..c7, nseq, d, layers, layer, npos):
		// a cache is npos positions of layers·2 rows of d (position-major),
		// written at position positions[i] of layer `layer`.
		{Kernel: KVAppend, Names: append(append(n1("q", "qkv", "bias", "positions"), cacheNames()...), "nseq", "d", "layers", "layer", "npos"),
			Extents: append([]Extent{
				f32x(0, Writes, arg(12), arg(13)), f32x(1, Reads, arg(12), num(3), arg(13)), f32x(2, Reads, num(3), arg(13)),
				{Param: 3, Access: Reads, Elem: 4, Count: []Term{arg(12)}},
			}, cacheExtents(4, 12, Writes, arg(16), arg(14), num(2), arg(13))...),
			Bounds: append([]Bound{{Param: 12, Min: 1, Max: MaxSeqsPerLaunch}, {Param: 15, Min: 0, Max: math.MaxInt32}}, positiveBounds(13, 14, 16)...)},
		// (out, q, positions, c0..c7, nseq, heads, headDim, layers, layer,
		// npos, scale): rows of d = heads·headDim; sequence i reads
		// positions[i]+1 ≤ npos positions of layer `layer` of its cache,
		// npos·layers·2·d floats (position-major).
		{Kernel: DecodeAttention, Names: append(append(n1("out", "q", "positions"), cacheNames()...), "nseq", "heads", "headDim", "layers", "layer", "npos", "scale"),
			Extents: append([]Extent{
				f32x(0, Writes, arg(11), arg(12), arg(13)), f32x(1, Reads, arg(11), arg(12), arg(13)),
				{Param: 2, Access: Reads, Elem: 4, Count: []Term{arg(11)}},
			}, cacheExtents(3, 11, Reads, arg(16), arg(14), num(2), arg(12), arg(13))...),
			Bounds: append([]Bound{{Param: 11, Min: 1, Max: MaxSeqsPerLaunch}, {Param: 15, Min: 0, Max: math.MaxInt32}}, positiveBounds(12, 13, 14, 16)...)},
		// (next, top, logits, rows, vocab): an int32 and two floats a row.
		{Kernel: Argmax, Names: n1("next", "top", "logits", "rows", "vocab"), Extents: []Extent{
			{Param: 0, Access: Writes, Elem: 4, Count: []Term{arg(3)}}, f32x(1, Writes, num(2), arg(3)), f32x(2, Reads, arg(3), arg(4)),
		}, Bounds: positiveBounds(3, 4)},
		// (draw, cand, stats, logits, params, rows, vocab, kmax): every
		// output row written whole, flagged or not.
		{Kernel: Sample, Names: n1("draw", "cand", "stats", "logits", "params", "rows", "vocab", "kmax"), Extents: []Extent{
			{Param: 0, Access: Writes, Elem: 4, Count: []Term{arg(5)}},
			{Param: 1, Access: Writes, Elem: 8, Count: []Term{arg(5), arg(7)}},
			{Param: 2, Access: Writes, Elem: 16, Count: []Term{arg(5)}},
			f32x(3, Reads, arg(5), arg(6)),
			{Param: 4, Access: Reads, Elem: SampleParamBytes, Count: []Term{arg(5)}},
		}, Bounds: append(positiveBounds(5, 6), Bound{Param: 7, Min: 1, Max: SampleMaxK})},
	}
	m := make(map[string]Signature, len(list))
	for _, s := range list {
		m[s.Kernel] = s
	}
	return m
}()
