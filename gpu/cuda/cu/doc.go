// Package cu is the raw layer of stablegraph's CUDA backend: the CUDA driver
// API (libcuda) and cuBLAS (libcublas), loaded at run time with purego, so
// that no cgo and no CUDA headers are needed to build.
//
// It holds only what the C headers say: handle types, the C structs the
// calls take (with tests of their sizes and offsets against the CUDA 13
// headers), enum values, result codes with their names, and one Go wrapper
// per C function, named after it without the "cu" prefix and the version
// suffix. Wrappers return the C status as is; ownership, contexts and errors
// that callers can act on live in the safe layer, package gpu/cuda (the split
// cudarc makes between sys and safe).
//
// # Loading
//
// Open and OpenBLAS try a list of candidate files (Candidates), or the one
// file the caller names, and return a *LoadError listing every place tried
// when none loads. Loaded libraries are cached for the life of the process
// and never closed: unloading libcuda under live contexts is unsafe.
//
// # Missing symbols
//
// Each wrapper resolves its symbol when the library is loaded. A symbol that
// the installed driver does not export (an older driver, say) is not an
// error at load: its wrapper returns ErrorNotLoaded, a result CUDA itself
// never returns, and Has reports it missing. Only the symbols without which
// nothing works (cuInit, device and context calls) are required by Open.
//
// # Calling convention
//
// Calls go through purego.SyscallN: every C argument is passed as a uintptr,
// pointers to Go memory only in the call expression itself (the helpers that
// make the calls, callN for N arguments, are marked go:uintptrescapes, so the
// pointed-to values are moved to the heap and kept alive for the call). The
// helpers are not variadic, and hand SyscallN a pooled argument array, so
// that a call allocates nothing beyond what its pointers point at (call.go).
// Results are 32-bit enums, truncated from the return register.
//
// # Stub drivers
//
// NewStub makes a Driver whose calls a Go function answers instead of
// libcuda, for tests and benchmarks of the safe layer without a GPU.
//
// # Concurrency
//
// A *Driver and a *BLAS are immutable after loading and safe for concurrent
// use; what the C functions allow concurrently is CUDA's rule, not ours.
package cu
