package stablegraph

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"reflect"
	"strconv"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

// ptrAlign is the alignment a slice passed to a kernel must have within its
// buffer: every built-in kernel works on elements of at least 4 bytes, and
// device code faults (or is silently wrong) on misaligned elements.
const ptrAlign = 4

// maxErrors bounds how many mistakes one Validate reports.
const maxErrors = 32

// checker collects a program's mistakes.
type checker struct {
	p    *Program
	errs []error
}

func (ck *checker) add(cmd int, op, buf, format string, args ...any) {
	if len(ck.errs) < maxErrors {
		ck.errs = append(ck.errs, &CompileError{Program: ck.p.name, Command: cmd, Op: op, Buffer: buf, Msg: fmt.Sprintf(format, args...)})
	}
}

// Validate checks the program without a device and returns every mistake
// found (up to 32), joined; each wraps ErrInvalidProgram and is a
// *CompileError naming the command and buffer. Compile calls it first.
// A nil *Program is an error too.
func (p *Program) Validate() error {
	if p == nil {
		return errNilProgram
	}
	return p.check()
}

// kernelSpecs returns the specs of the built-in kernels and of the
// program's modules, by name.
func (p *Program) kernelSpecs(ck *checker) map[string]gpu.KernelSpec {
	specs := map[string]gpu.KernelSpec{}
	for _, img := range p.images() {
		for _, k := range img.Kernels {
			if _, dup := specs[k.Name]; dup {
				ck.add(-1, "", "", "kernel %s is defined by two modules (second: %s)", k.Name, img.Name)
				continue
			}
			specs[k.Name] = k
		}
	}
	return specs
}

// images are the module images an executable of p loads: the built-in
// kernels first.
func (p *Program) images() []*gpu.ModuleImage {
	imgs := []*gpu.ModuleImage{kernels.Module()}
	for _, img := range p.modules {
		if img != nil {
			imgs = append(imgs, img)
		}
	}
	return imgs
}

func (p *Program) check() error {
	ck := &checker{p: p}
	specs := p.kernelSpecs(ck)
	names := map[string]int{}
	for i, b := range p.bufs {
		if b.name == "" {
			ck.add(-1, "", "", "buffer %d (%s) has no name", i, b.class)
		} else if j, dup := names[b.name]; dup {
			ck.add(-1, "", b.name, "declared twice (buffers %d and %d)", j, i)
		} else {
			names[b.name] = i
		}
		if b.size <= 0 {
			ck.add(-1, "", b.name, "size %d is not positive", b.size)
		}
	}
	if len(p.cmds) == 0 {
		ck.add(-1, "", "", "no commands")
	}
	written := make([]bool, len(p.bufs))
	for i := range p.cmds {
		p.checkCommand(ck, specs, i, written)
	}
	for i, b := range p.bufs {
		if b.class == Output && !written[i] {
			ck.add(-1, "", b.name, "output is never written by any command")
		}
	}
	return errors.Join(ck.errs...)
}

func (p *Program) checkCommand(ck *checker, specs map[string]gpu.KernelSpec, i int, written []bool) {
	c := &p.cmds[i]
	op := c.label()
	// Slices first: bounds, ownership, writes to constants.
	for j, a := range c.args {
		if !a.IsSlice() {
			continue
		}
		s := a.slice
		d := s.buf.decl()
		if s.buf.p != p || d == nil {
			ck.add(i, op, s.buf.Name(), "argument %d: the buffer is not declared in this program", j)
			continue
		}
		switch {
		case s.n <= 0:
			ck.add(i, op, d.name, "argument %d: slice length %d is not positive", j, s.n)
		case s.off < 0 || s.off > d.size || s.n > d.size-s.off:
			ck.add(i, op, d.name, "argument %d: slice %s is out of bounds of the buffer's %d bytes", j, span64(s.off, s.n), d.size)
		}
		if a.access&Write != 0 {
			if d.class == Constant {
				ck.add(i, op, d.name, "argument %d: a constant is written", j)
			}
			written[s.buf.id] = true
		}
	}
	switch c.kind {
	case cmdLaunch:
		p.checkLaunch(ck, specs, i, c, op)
	case cmdMemcpy:
		dst, src := c.args[0].slice, c.args[1].slice
		if dst.n != src.n {
			ck.add(i, op, dst.buf.Name(), "copies %d bytes from %s into %d bytes", src.n, src, dst.n)
		}
		if dst.buf == src.buf && overlap(dst, src) {
			ck.add(i, op, dst.buf.Name(), "source %s and destination %s overlap", src, dst)
		}
	case cmdMemset:
		dst := c.args[0].slice
		switch c.elemSize {
		case 1, 2, 4:
			if dst.off%int64(c.elemSize) != 0 || dst.n%int64(c.elemSize) != 0 {
				ck.add(i, op, dst.buf.Name(), "slice %s is misaligned for %d-byte elements", dst, c.elemSize)
			}
			if c.elemSize < 4 && c.value>>(8*c.elemSize) != 0 {
				ck.add(i, op, dst.buf.Name(), "value %#x does not fit in %d bytes", c.value, c.elemSize)
			}
		default:
			ck.add(i, op, dst.buf.Name(), "element size %d is not 1, 2 or 4", c.elemSize)
		}
	case cmdGemm:
		g := c.gemm
		if g.M <= 0 || g.N <= 0 || g.K <= 0 || g.M > math.MaxInt32 || g.N > math.MaxInt32 || g.K > math.MaxInt32 {
			ck.add(i, op, c.args[0].slice.buf.Name(), "shape m=%d n=%d k=%d is not positive 32-bit", g.M, g.N, g.K)
			return
		}
		for j, dims := range [][2]int{{g.M, g.N}, {g.M, g.K}, {g.K, g.N}} {
			s := c.args[j].slice
			if need, ok := f32Bytes(dims[0], dims[1]); !ok || s.n < need {
				ck.add(i, op, s.buf.Name(), "%s holds %d bytes, the %c matrix needs %s (%d×%d float32)", s, s.n, "cab"[j], bytesNeeded(need, ok), dims[0], dims[1])
			}
			if s.off%ptrAlign != 0 {
				ck.add(i, op, s.buf.Name(), "slice %s is not %d-byte aligned", s, ptrAlign)
			}
		}
		if len(c.args) == 4 { // the bias
			s := c.args[3].slice
			if need, ok := f32Bytes(1, g.N); !ok || s.n < need {
				ck.add(i, op, s.buf.Name(), "bias %s holds %d bytes, N=%d float32 need %s", s, s.n, g.N, bytesNeeded(need, ok))
			}
			if s.off%ptrAlign != 0 {
				ck.add(i, op, s.buf.Name(), "bias slice %s is not %d-byte aligned", s, ptrAlign)
			}
		}
	case cmdTrace:
		if c.coll != nil {
			p.checkCollective(ck, i, c, op)
		}
		if c.name == "" {
			ck.add(i, op, "", "traced command has no name")
		}
		if c.fn == nil {
			ck.add(i, op, "", "traced command has no function")
		}
		for j, a := range c.args {
			if !a.IsSlice() {
				ck.add(i, op, "", "argument %d is the scalar %s; traced commands take slices only (capture scalars in the function)", j, a)
			}
		}
	}
}

// Sizes and offsets are int64s that a caller may set anywhere: every sum
// and product of them below is checked, so that none can wrap around and
// pass a check it fails (a receive of 6e18 bytes "holding" 3 times an
// 8-byte send).

// mulSize is a·b for sizes a, b >= 0, and false when either is negative
// or the product does not fit in an int64.
func mulSize(a, b int64) (int64, bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, false
	}
	return int64(lo), true
}

// productText is a·b in decimal, exact even where it overflows an int64.
func productText(a, b int64) string {
	return new(big.Int).Mul(big.NewInt(a), big.NewInt(b)).String()
}

// addOff is a+b, and false when it overflows an int64.
func addOff(a, b int64) (int64, bool) {
	s := a + b
	if (b > 0 && s < a) || (b < 0 && s > a) {
		return 0, false
	}
	return s, true
}

// span64 prints the byte range of n bytes at off, "[off, off+n)", with its
// exact end even where off+n overflows an int64.
func span64(off, n int64) string {
	return fmt.Sprintf("[%d, %s)", off, endText(off, n))
}

// endText is off+n in decimal, exact even where it overflows an int64.
func endText(off, n int64) string {
	if end, ok := addOff(off, n); ok {
		return strconv.FormatInt(end, 10)
	}
	return new(big.Int).Add(big.NewInt(off), big.NewInt(n)).String()
}

// overlap reports whether slices a and b of one buffer share a byte. Ends
// that overflow (slices already refused as out of bounds) are compared
// exactly.
func overlap(a, b Slice) bool {
	aEnd, ok1 := addOff(a.off, a.n)
	bEnd, ok2 := addOff(b.off, b.n)
	if ok1 && ok2 {
		return a.off < bEnd && b.off < aEnd
	}
	ae := new(big.Int).Add(big.NewInt(a.off), big.NewInt(a.n))
	be := new(big.Int).Add(big.NewInt(b.off), big.NewInt(b.n))
	return big.NewInt(a.off).Cmp(be) < 0 && big.NewInt(b.off).Cmp(ae) < 0
}

// f32Bytes is the bytes of a rows×cols float32 matrix (both positive), and
// false when that does not fit in an int64: shapes are checked before any
// size is computed from them, so that no product can wrap around and pass a
// bounds check.
func f32Bytes(rows, cols int) (int64, bool) {
	hi, lo := bits.Mul64(uint64(rows), uint64(cols))
	if hi != 0 || lo > math.MaxInt64/4 {
		return 0, false
	}
	return int64(lo) * 4, true
}

// bytesNeeded says a size f32Bytes computed, or that it overflowed.
func bytesNeeded(n int64, ok bool) string {
	if !ok {
		return "more than 2^63 bytes"
	}
	return fmt.Sprintf("%d", n)
}

func (p *Program) checkLaunch(ck *checker, specs map[string]gpu.KernelSpec, i int, c *cmdDecl, op string) {
	spec, ok := specs[c.kernel]
	if !ok {
		ck.add(i, op, "", "unknown kernel %q", c.kernel)
		return
	}
	g, bl := c.cfg.Grid, c.cfg.Block
	if g.X == 0 || g.Y == 0 || g.Z == 0 || bl.X == 0 || bl.Y == 0 || bl.Z == 0 {
		ck.add(i, op, "", "launch shape grid %v block %v has a zero dimension", g, bl)
	}
	if len(c.args) != len(spec.Params) {
		ck.add(i, op, "", "kernel %s takes %d arguments, got %d", c.kernel, len(spec.Params), len(c.args))
		return
	}
	kindsOK := true
	for j, want := range spec.Params {
		a := c.args[j]
		switch {
		case want == gpu.ArgPtr && !a.IsSlice():
			ck.add(i, op, "", "argument %d is the scalar %s; kernel %s wants a slice", j, a, c.kernel)
		case want != gpu.ArgPtr && a.IsSlice():
			ck.add(i, op, a.slice.buf.Name(), "argument %d is the slice %s; kernel %s wants a %s scalar", j, a.slice, c.kernel, want)
		case a.val.Kind != want:
			ck.add(i, op, "", "argument %d is %s; kernel %s wants %s", j, a.val.Kind, c.kernel, want)
		case a.IsSlice() && a.slice.off%ptrAlign != 0:
			ck.add(i, op, a.slice.buf.Name(), "argument %d: slice %s is not %d-byte aligned", j, a.slice, ptrAlign)
			continue // of the right kind: its extent can still be checked
		default:
			continue
		}
		kindsOK = false
	}
	if !kindsOK {
		return // the extents need the arguments of the right kinds
	}
	if sig, ok := kernels.SignatureOf(c.kernel); ok {
		p.checkExtents(ck, i, c, op, sig)
	}
}

// checkExtents checks a launch of a built-in kernel against its signature
// (package kernels, "Extents"): its scalars in range, and every pointer
// argument's slice holding what the kernel reads or writes through it for
// those scalars. Device code cannot tell where a buffer ends, so a launch
// asking for more would overrun it on the device.
func (p *Program) checkExtents(ck *checker, i int, c *cmdDecl, op string, sig kernels.Signature) {
	args := make([]gpu.Arg, len(c.args))
	for j, a := range c.args {
		args[j] = a.val
	}
	if msgs := sig.CheckScalars(args); len(msgs) > 0 {
		for _, m := range msgs {
			ck.add(i, op, "", "%s", m)
		}
		return
	}
	for _, e := range sig.Extents {
		need, used, ok := e.Bytes(args)
		if !used {
			continue
		}
		s := c.args[e.Param].slice
		if !ok || s.n < need {
			ck.add(i, op, s.buf.Name(), "argument %d (%s): %s %s %s, but the slice %s holds %d bytes",
				e.Param, sig.Name(e.Param), c.kernel, e.Access, sig.Formula(e, args), s, s.n)
		}
	}
}

// checkCollective checks what can be checked without a device: the
// communicator is given, the type and reduction are known, slices hold
// whole elements, lengths follow the collective's rule, and send and recv
// overlap only in the collective's in-place form.
func (p *Program) checkCollective(ck *checker, i int, c *cmdDecl, op string) {
	d := c.coll
	if d.comm == nil {
		ck.add(i, op, "", "no communicator")
		return
	}
	size := int64(d.comm.size)
	elem := int64(d.dt.Size())
	if elem == 0 {
		ck.add(i, op, "", "unknown data type %v", d.dt)
		return
	}
	if (d.kind == collAllReduce || d.kind == collReduceScatter) && d.op != gpu.Sum && d.op != gpu.Max {
		ck.add(i, op, "", "unknown reduction %v", d.op)
	}
	if d.kind == collBroadcast && (d.root < 0 || int64(d.root) >= size) {
		ck.add(i, op, "", "root %d is not a rank of the %d", d.root, size)
	}
	for _, s := range []Slice{d.send, d.recv} {
		if s.off%elem != 0 || s.n%elem != 0 {
			ck.add(i, op, s.buf.Name(), "slice %s does not hold whole %d-byte %s elements", s, elem, d.dt)
			return
		}
	}
	send, recv := d.send, d.recv
	block := int64(-1) // the in-place position allowed, as an offset into the larger slice
	switch d.kind {
	case collAllReduce, collBroadcast:
		if send.n != recv.n {
			ck.add(i, op, recv.buf.Name(), "send %s and recv %s differ in length", send, recv)
		}
		block = 0
	case collReduceScatter:
		want, ok := mulSize(size, recv.n)
		if !ok || send.n != want {
			ck.add(i, op, recv.buf.Name(), "send %s must hold %d times recv %s (%d ranks): %s bytes", send, size, recv, size, productText(size, recv.n))
		}
		if !ok {
			return
		}
		block = int64(d.comm.rank) * recv.n // rank < size: no overflow
	case collAllGather:
		want, ok := mulSize(size, send.n)
		if !ok || recv.n != want {
			ck.add(i, op, recv.buf.Name(), "recv %s must hold %d times send %s (%d ranks): %s bytes", recv, size, send, size, productText(size, send.n))
		}
		if !ok {
			return
		}
		block = int64(d.comm.rank) * send.n
	}
	if send.buf != recv.buf || !overlap(send, recv) {
		return
	}
	inPlace := false
	switch d.kind {
	case collAllReduce, collBroadcast:
		inPlace = send == recv
	case collReduceScatter:
		inPlace = recv.off == send.off+block && recv.n <= send.n
	case collAllGather:
		inPlace = send.off == recv.off+block && send.n <= recv.n
	}
	if !inPlace {
		ck.add(i, op, recv.buf.Name(), "send %s and recv %s overlap, and not as the in-place form of %s", send, recv, d.kind)
	}
}

// checkComms checks the communicators of p's collectives against the
// backend and device Compile binds to: the backend must have collectives
// (else an error wrapping gpu.ErrNotSupported), and each communicator must
// belong to it and to the device, and be open.
func (p *Program) checkComms(b gpu.Backend, dev int) error {
	ck := &checker{p: p}
	for i := range p.cmds {
		d := p.cmds[i].coll
		if d == nil || d.comm == nil {
			continue
		}
		op := p.cmds[i].label()
		if _, err := gpu.CollectivesOf(b); err != nil {
			return fmt.Errorf("stablegraph: compile %q: command %d (%s): %w", p.name, i, op, err)
		}
		c := d.comm
		c.mu.Lock()
		closed := c.mu.closed
		c.mu.Unlock()
		switch {
		case !sameBackend(c.b, b):
			ck.add(i, op, "", "the %s belongs to backend %s, not the backend compiled for (%s)", c, c.b.Name(), b.Name())
		case c.dev != dev:
			ck.add(i, op, "", "the %s is not on device %d, which the program is compiled for", c, dev)
		case closed:
			ck.add(i, op, "", "the %s is closed", c)
		}
	}
	return errors.Join(ck.errs...)
}

// sameBackend reports whether a and b are the same backend, without the
// panic of comparing interfaces holding uncomparable values.
func sameBackend(a, b gpu.Backend) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	if ta != tb || ta == nil || !ta.Comparable() {
		return false
	}
	return a == b
}
