package cu

// Stub answers the calls of a driver made by NewStub, in place of libcuda.
// name is the C function's name (the preferred name of its symbol, as in
// Missing: "cuMemAlloc_v2"), args its arguments as C would receive them.
// Output parameters are addresses among the arguments, valid until the stub
// returns; a stub writes them through unsafe.Pointer. A Stub may be called
// from several goroutines at once.
type Stub func(name string, args StubArgs) Result

// MaxStubArgs bounds the arguments of one call (cuLaunchKernel has 11).
const MaxStubArgs = 16

// StubArgs are the arguments of one stubbed call: A[:N]. They are passed by
// value, so that a call costs no allocation.
type StubArgs struct {
	N int
	A [MaxStubArgs]uintptr
}

// NewStub returns a Driver that loads no library: every call is answered by
// stub, except the symbols named in missing, which behave as symbols the
// installed driver does not export (ErrorNotLoaded, Has false). It lets
// tests and benchmarks run the layers above cu without a GPU: the wrappers,
// their argument marshalling and the go:uintptrescapes rules are the same
// as for a loaded library; only the final purego call is replaced. Path is
// what Driver.Path reports.
func NewStub(path string, stub Stub, missing ...string) *Driver {
	fns := make([]uintptr, numSyms)
	for i, s := range driverSyms {
		fns[i] = 1 // never called: stub answers
		for _, m := range missing {
			for _, n := range s.names {
				if n == m {
					fns[i] = 0
				}
			}
		}
	}
	return &Driver{Path: path, fns: fns, stub: stub}
}
