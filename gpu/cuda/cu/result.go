package cu

import "strconv"

// Result is CUresult, the status every driver call returns.
type Result int32

// ErrorNotLoaded is returned by a wrapper whose symbol the loaded library
// does not export. CUDA never returns a negative CUresult, so it cannot be
// confused with a driver error; the safe layer reports it as a missing
// capability.
const ErrorNotLoaded Result = -1

// Name is the C enum name ("CUDA_ERROR_OUT_OF_MEMORY"), or
// "CUresult(N)" for a value this package does not know.
func (r Result) Name() string {
	if r == ErrorNotLoaded {
		return "STABLEGRAPH_SYMBOL_NOT_LOADED"
	}
	if n, ok := resultNames[r]; ok {
		return n
	}
	return "CUresult(" + strconv.Itoa(int(r)) + ")"
}

func (r Result) String() string { return r.Name() }
