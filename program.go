package stablegraph

import (
	"fmt"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/blas"
	"github.com/stablegraph/stablegraph/internal/trace"
	"github.com/stablegraph/stablegraph/replay"
)

// Class says who owns a buffer's memory and whether its address moves
// between steps (docs/ARCHITECTURE.md, "Buffer classes"); strategies see
// it too (package replay).
type Class = replay.Class

const (
	// Param buffers belong to the caller, who binds a (possibly new)
	// address every step.
	Param = replay.Param
	// State buffers (weights, optimizer state) belong to the executable,
	// live across steps and are updated in place. Their address is fixed
	// unless the caller rebinds them with Executable.BindState.
	State = replay.State
	// Temp buffers are the executable's scratch within one step. Temps
	// whose lifetimes do not overlap share memory.
	Temp = replay.Temp
	// Output buffers belong to the caller, who binds them every step like
	// params; every output must be written by some command.
	Output = replay.Output
	// Constant buffers belong to the executable and are written once, at
	// Compile, from the data given to Program.Constant. No command may
	// write them.
	Constant = replay.Constant
)

// Program is a step of GPU work declared once and compiled into an
// Executable: buffers of each class and an ordered list of commands over
// slices of them. Declaring never fails; Compile (or Validate) reports every
// mistake at once, naming the command and the buffer.
//
// A Program is not safe for concurrent use while it is being declared; once
// compiled it may be compiled again, and later declarations do not affect
// executables already compiled.
type Program struct {
	name    string
	bufs    []bufDecl
	cmds    []cmdDecl
	modules []*gpu.ModuleImage
}

type bufDecl struct {
	name  string
	class Class
	size  int64
	data  []byte // Constant only
}

// NewProgram returns an empty program. The name appears in errors and logs.
func NewProgram(name string) *Program { return &Program{name: name} }

// Name is the program's name.
func (p *Program) Name() string { return p.name }

func (p *Program) declare(name string, class Class, size int64, data []byte) Buffer {
	p.bufs = append(p.bufs, bufDecl{name: name, class: class, size: size, data: data})
	return Buffer{p: p, id: len(p.bufs) - 1}
}

// Param declares a caller-owned input of size bytes, bound every step.
func (p *Program) Param(name string, size int64) Buffer { return p.declare(name, Param, size, nil) }

// State declares an executable-owned buffer of size bytes that persists
// across steps, zeroed at Compile (see Executable.WriteBuffer).
func (p *Program) State(name string, size int64) Buffer { return p.declare(name, State, size, nil) }

// Temp declares executable-owned scratch of size bytes, valid within a step.
func (p *Program) Temp(name string, size int64) Buffer { return p.declare(name, Temp, size, nil) }

// Output declares a caller-owned result of size bytes, bound every step.
func (p *Program) Output(name string, size int64) Buffer { return p.declare(name, Output, size, nil) }

// Constant declares an executable-owned buffer holding a copy of data,
// written once at Compile.
func (p *Program) Constant(name string, data []byte) Buffer {
	return p.declare(name, Constant, int64(len(data)), slices.Clone(data))
}

// Buffers returns the declared buffers in declaration order.
func (p *Program) Buffers() []Buffer {
	out := make([]Buffer, len(p.bufs))
	for i := range p.bufs {
		out[i] = Buffer{p: p, id: i}
	}
	return out
}

// Buffer returns the buffer declared as name.
func (p *Program) Buffer(name string) (Buffer, bool) {
	for i, b := range p.bufs {
		if b.name == name {
			return Buffer{p: p, id: i}, true
		}
	}
	return Buffer{}, false
}

// AddModule makes the kernels of img available to Launch. The built-in
// kernels (package kernels) are always available.
func (p *Program) AddModule(img *gpu.ModuleImage) { p.modules = append(p.modules, img) }

// Buffer is a buffer declared in a Program. It is a small comparable value,
// usable as a map key (Bindings, Outputs). The zero Buffer is invalid.
type Buffer struct {
	p  *Program
	id int
}

func (b Buffer) decl() *bufDecl {
	if b.p == nil || b.id < 0 || b.id >= len(b.p.bufs) {
		return nil
	}
	return &b.p.bufs[b.id]
}

// Name is the buffer's declared name ("" for the zero Buffer).
func (b Buffer) Name() string {
	if d := b.decl(); d != nil {
		return d.name
	}
	return ""
}

// Class is the buffer's class (0 for the zero Buffer).
func (b Buffer) Class() Class {
	if d := b.decl(); d != nil {
		return d.class
	}
	return 0
}

// Size is the buffer's declared size in bytes.
func (b Buffer) Size() int64 {
	if d := b.decl(); d != nil {
		return d.size
	}
	return 0
}

func (b Buffer) String() string {
	if d := b.decl(); d != nil {
		return fmt.Sprintf("%q (%s, %d bytes)", d.name, d.class, d.size)
	}
	return "<invalid buffer>"
}

// Slice returns the n bytes of b starting at byte off. Bounds are checked
// at Compile.
func (b Buffer) Slice(off, n int64) Slice { return Slice{buf: b, off: off, n: n} }

// All returns the whole buffer as a slice.
func (b Buffer) All() Slice { return Slice{buf: b, off: 0, n: b.Size()} }

// Slice is a byte range of a buffer: what commands operate on.
type Slice struct {
	buf Buffer
	off int64
	n   int64
}

// Buffer is the slice's buffer.
func (s Slice) Buffer() Buffer { return s.buf }

// Offset is the slice's first byte within its buffer.
func (s Slice) Offset() int64 { return s.off }

// Len is the slice's length in bytes.
func (s Slice) Len() int64 { return s.n }

func (s Slice) String() string {
	return fmt.Sprintf("%s[%d:%s]", s.buf.Name(), s.off, endText(s.off, s.n))
}

// Access says how a command uses a slice. It drives validation (constants
// are never written, every output is written) and temp lifetimes.
type Access uint8

const (
	Read      Access = 1 << iota // the command reads the slice
	Write                        // the command writes the slice
	ReadWrite = Read | Write
)

// Arg is one argument of a command: a slice with its access (a device
// pointer) or a scalar of an explicit type. Build it with In, Out, InOut or
// I32, U32, I64, U64, F32, F64.
type Arg struct {
	slice  Slice
	access Access
	val    gpu.Arg // the scalar; Kind is gpu.ArgPtr for slices
}

// In passes s as a pointer the command reads.
func In(s Slice) Arg { return Arg{slice: s, access: Read, val: gpu.Arg{Kind: gpu.ArgPtr}} }

// Out passes s as a pointer the command writes.
func Out(s Slice) Arg { return Arg{slice: s, access: Write, val: gpu.Arg{Kind: gpu.ArgPtr}} }

// InOut passes s as a pointer the command reads and writes.
func InOut(s Slice) Arg { return Arg{slice: s, access: ReadWrite, val: gpu.Arg{Kind: gpu.ArgPtr}} }

// Scalar arguments. Their types are exact: an I32 does not match a kernel
// parameter declared U32.
func I32(v int32) Arg   { return Arg{val: gpu.I32(v)} }
func U32(v uint32) Arg  { return Arg{val: gpu.U32(v)} }
func I64(v int64) Arg   { return Arg{val: gpu.I64(v)} }
func U64(v uint64) Arg  { return Arg{val: gpu.U64(v)} }
func F32(v float32) Arg { return Arg{val: gpu.F32(v)} }
func F64(v float64) Arg { return Arg{val: gpu.F64(v)} }

// IsSlice reports whether a is a pointer argument.
func (a Arg) IsSlice() bool { return a.val.Kind == gpu.ArgPtr }

func (a Arg) String() string {
	if a.IsSlice() {
		return a.slice.String()
	}
	return a.val.String()
}

// GEMM is the shape of a matrix product C[M×N] = Alpha·op(A)·op(B) + Beta·C
// + Bias on row-major float32 matrices (see kernels.Gemm for op and
// storage).
type GEMM struct {
	M, N, K        int
	TransA, TransB bool
	Alpha, Beta    float32
	// Bias, when set (the zero Slice: none), holds N float32 added to every
	// row of C: what cuBLASLt fuses into the product as its bias epilogue.
	Bias Slice
}

// blas is g as package internal/blas runs it.
func (g GEMM) blas() blas.Gemm {
	return blas.Gemm{M: g.M, N: g.N, K: g.K, TransA: g.TransA, TransB: g.TransB, Alpha: g.Alpha, Beta: g.Beta,
		Bias: g.Bias != Slice{}}
}

// TraceFunc is the work of a traced command; see Program.Trace.
type TraceFunc = trace.Func

// TraceEnv is what a TraceFunc receives: backend, device, stream, and one
// device pointer per slice argument, in order.
type TraceEnv = trace.Env

type cmdKind uint8

const (
	cmdLaunch cmdKind = iota + 1
	cmdMemcpy
	cmdMemset
	cmdGemm
	cmdTrace
)

// cmdDecl is a declared command. Every form keeps its slices in args, with
// their accesses, so validation and lifetimes treat all kinds alike.
type cmdDecl struct {
	kind     cmdKind
	kernel   string // launch
	cfg      gpu.LaunchConfig
	args     []Arg
	value    uint32 // memset
	elemSize int    // memset
	gemm     GEMM
	name     string // trace
	fn       TraceFunc
	coll     *collDecl // collectives (traced commands; collective.go)
}

// label names the command in errors: "launch sg_gemm", "trace allreduce".
func (c *cmdDecl) label() string {
	switch c.kind {
	case cmdLaunch:
		return "launch " + c.kernel
	case cmdMemcpy:
		return "memcpy"
	case cmdMemset:
		return "memset"
	case cmdGemm:
		return "gemm"
	case cmdTrace:
		if c.coll != nil {
			return c.name
		}
		return "trace " + c.name
	}
	return "unknown command"
}

// Launch appends a kernel launch: kernel (by name, from the built-in set or
// a module added with AddModule) with launch shape cfg and typed arguments,
// which must match the kernel's parameters in number and kind.
func (p *Program) Launch(kernel string, cfg gpu.LaunchConfig, args ...Arg) {
	p.cmds = append(p.cmds, cmdDecl{kind: cmdLaunch, kernel: kernel, cfg: cfg, args: slices.Clone(args)})
}

// Memcpy appends a device-to-device copy of src into dst (equal lengths).
func (p *Program) Memcpy(dst, src Slice) {
	p.cmds = append(p.cmds, cmdDecl{kind: cmdMemcpy, args: []Arg{Out(dst), In(src)}})
}

// Memset appends a memset of dst: each elemSize-byte element (1, 2 or 4)
// is set to the low elemSize bytes of value. dst's offset and length must
// be multiples of elemSize.
func (p *Program) Memset(dst Slice, value uint32, elemSize int) {
	p.cmds = append(p.cmds, cmdDecl{kind: cmdMemset, args: []Arg{Out(dst)}, value: value, elemSize: elemSize})
}

// Gemm appends a matrix product into c (see GEMM). It is a library call
// (package internal/blas): on backends with a GEMM library (gpu.GEMM) it calls it,
// else it launches the built-in kernels.Gemm; either way it enters graphs
// as a traced command.
func (p *Program) Gemm(c, a, b Slice, g GEMM) {
	ca := Out(c)
	if g.Beta != 0 {
		ca = InOut(c)
	}
	args := []Arg{ca, In(a), In(b)}
	if g.Bias != (Slice{}) {
		args = append(args, In(g.Bias))
	}
	p.cmds = append(p.cmds, cmdDecl{kind: cmdGemm, args: args, gemm: g})
}

// Trace appends a traced command: fn enqueues work on the stream it is
// given, with one device pointer per slice argument (args must all be
// slices, built with In, Out or InOut). In graphs the command is captured
// from the stream into a child graph. fn must enqueue the same work for the
// same addresses every time (see package internal/trace); values it needs besides
// the addresses are captured by the closure when the program is built.
func (p *Program) Trace(name string, fn TraceFunc, args ...Arg) {
	p.cmds = append(p.cmds, cmdDecl{kind: cmdTrace, name: name, fn: fn, args: slices.Clone(args)})
}

// collKind is the kind of a collective command.
type collKind uint8

const (
	collAllReduce collKind = iota + 1
	collReduceScatter
	collAllGather
	collBroadcast
)

func (k collKind) String() string {
	switch k {
	case collAllReduce:
		return "allreduce"
	case collReduceScatter:
		return "reducescatter"
	case collAllGather:
		return "allgather"
	case collBroadcast:
		return "broadcast"
	}
	return fmt.Sprintf("collKind(%d)", uint8(k))
}

// collDecl is the part of a command declaration only collectives have.
type collDecl struct {
	kind       collKind
	comm       *Comm
	dt         gpu.DataType
	op         gpu.ReduceOp
	root       int
	send, recv Slice
}

// collective appends a collective command: a traced command over send (read)
// and recv (written), in that order, even when they are the same slice.
func (p *Program) collective(d *collDecl) {
	p.cmds = append(p.cmds, cmdDecl{kind: cmdTrace, name: d.kind.String(), fn: d.run,
		args: []Arg{In(d.send), Out(d.recv)}, coll: d})
}

// AllReduce appends an all-reduce over comm: every rank's recv receives the
// element-wise reduction (op: gpu.Sum or gpu.Max), in rank order, of every
// rank's send, both holding elements of dt. send and recv have the same
// length; send == recv is in place, and they may not overlap otherwise.
func (p *Program) AllReduce(comm *Comm, send, recv Slice, dt gpu.DataType, op gpu.ReduceOp) {
	p.collective(&collDecl{kind: collAllReduce, comm: comm, dt: dt, op: op, send: send, recv: recv})
}

// ReduceScatter appends a reduce-scatter over comm: the element-wise
// reduction of every rank's send is split into comm.Size() blocks and rank
// r's recv receives block r. len(send) = comm.Size()·len(recv); in place
// when recv is block r of send.
func (p *Program) ReduceScatter(comm *Comm, send, recv Slice, dt gpu.DataType, op gpu.ReduceOp) {
	p.collective(&collDecl{kind: collReduceScatter, comm: comm, dt: dt, op: op, send: send, recv: recv})
}

// AllGather appends an all-gather over comm: every rank's recv receives the
// send of every rank, rank r's at byte r·len(send). len(recv) =
// comm.Size()·len(send); in place when send is block r of recv.
func (p *Program) AllGather(comm *Comm, send, recv Slice, dt gpu.DataType) {
	p.collective(&collDecl{kind: collAllGather, comm: comm, dt: dt, send: send, recv: recv})
}

// Broadcast appends a broadcast over comm: every rank's recv receives the
// root rank's send (other ranks' send is not read, but must be declared:
// pass recv for an in-place broadcast). send and recv have the same length.
func (p *Program) Broadcast(comm *Comm, send, recv Slice, dt gpu.DataType, root int) {
	p.collective(&collDecl{kind: collBroadcast, comm: comm, dt: dt, root: root, send: send, recv: recv})
}
