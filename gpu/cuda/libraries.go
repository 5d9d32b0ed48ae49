package cuda

// Libraries reports the shared libraries the backend uses, by name, each
// with the file loaded or why none was (the LibraryReporter of
// "stablegraph info"). It loads the optional libraries (cuBLAS, cuBLASLt,
// NCCL) if they were not loaded yet.
func (b *Backend) Libraries() map[string]string {
	out := map[string]string{"libcuda": b.d.Path}
	lib, err := b.loadBLAS()
	if err != nil {
		out["cublas"] = "not loaded: " + err.Error()
		out["cublasLt"] = "not loaded: needs cuBLAS"
	} else {
		out["cublas"] = lib.Path
		if b.blas.lt != nil {
			out["cublasLt"] = b.blas.lt.Path
		} else {
			out["cublasLt"] = "not loaded: " + b.blas.ltErr.Error()
		}
	}
	if nccl, err := b.loadNCCL("Libraries"); err != nil {
		out["nccl"] = "not loaded: " + err.Error()
	} else {
		out["nccl"] = nccl.Path
	}
	return out
}
