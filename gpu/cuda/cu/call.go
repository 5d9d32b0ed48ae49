package cu

import (
	"sync"

	"github.com/ebitengine/purego"
)

// The wrappers call their symbol through callN, N being the number of C
// arguments. Each callN is marked go:uintptrescapes, as syscall.Syscall is:
// a uintptr(unsafe.Pointer(x)) argument written in the call expression
// moves x to the heap (where Go's collector never moves it) and keeps it
// alive until the C function returns. They are not variadic because the
// directive moves a variadic argument list to the heap as well: one
// allocation per driver call. Instead the arguments are copied into a
// pooled array, which purego.SyscallN (itself variadic and
// go:uintptrescapes) can take without another allocation.

// maxArgs bounds the C arguments of one call (cuLaunchKernel has 11).
const maxArgs = MaxStubArgs

type argArray = [maxArgs]uintptr

var argArrays = sync.Pool{New: func() any { return new(argArray) }}

// invoke calls symbol s with the first n of args. It runs inside a callN,
// whose go:uintptrescapes keeps the objects the arguments point at alive.
func (d *Driver) invoke(s sym, n int, args *argArray) Result {
	fn := d.fns[s]
	if fn == 0 {
		return ErrorNotLoaded
	}
	a := argArrays.Get().(*argArray)
	*a = *args
	var r uintptr
	if d.stub != nil {
		r = uintptr(uint32(d.stub(driverSyms[s].names[0], StubArgs{N: n, A: *a})))
	} else {
		r, _, _ = purego.SyscallN(fn, a[:n]...)
	}
	argArrays.Put(a)
	return Result(int32(uint32(r))) // CUresult is a 32-bit enum in eax
}

//go:uintptrescapes
func (d *Driver) call0(s sym) Result { return d.invoke(s, 0, &argArray{}) }

//go:uintptrescapes
func (d *Driver) call1(s sym, a0 uintptr) Result { return d.invoke(s, 1, &argArray{a0}) }

//go:uintptrescapes
func (d *Driver) call2(s sym, a0, a1 uintptr) Result { return d.invoke(s, 2, &argArray{a0, a1}) }

//go:uintptrescapes
func (d *Driver) call3(s sym, a0, a1, a2 uintptr) Result {
	return d.invoke(s, 3, &argArray{a0, a1, a2})
}

//go:uintptrescapes
func (d *Driver) call4(s sym, a0, a1, a2, a3 uintptr) Result {
	return d.invoke(s, 4, &argArray{a0, a1, a2, a3})
}

//go:uintptrescapes
func (d *Driver) call5(s sym, a0, a1, a2, a3, a4 uintptr) Result {
	return d.invoke(s, 5, &argArray{a0, a1, a2, a3, a4})
}

//go:uintptrescapes
func (d *Driver) call6(s sym, a0, a1, a2, a3, a4, a5 uintptr) Result {
	return d.invoke(s, 6, &argArray{a0, a1, a2, a3, a4, a5})
}

//go:uintptrescapes
func (d *Driver) call11(s sym, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10 uintptr) Result {
	return d.invoke(s, 11, &argArray{a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10})
}
