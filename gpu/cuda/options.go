package cuda

import (
	"log/slog"
	"os"

	"github.com/stablegraph/stablegraph/gpu"
)

// options are the settings of one backend, resolved once at Open. This is
// the only place the package reads the environment.
type options struct {
	// cudaLibrary is the libcuda file to load; "" searches cu.Candidates.
	cudaLibrary string
	// cublasLibrary is the libcublas file to load; "" searches
	// cu.BLASCandidates. cuBLAS is optional.
	cublasLibrary string
	// ncclLibrary is the libnccl file to load; "" searches
	// cu.NCCLCandidates. NCCL is optional.
	ncclLibrary string
	log         *slog.Logger
}

// Environment variables naming the libraries when gpu.Config does not.
const (
	EnvLibCUDA   = "STABLEGRAPH_LIBCUDA"
	EnvLibCUBLAS = "STABLEGRAPH_LIBCUBLAS"
	EnvLibNCCL   = "STABLEGRAPH_LIBNCCL"
)

// resolveOptions fills options from cfg, then from the environment for
// fields cfg leaves empty, then from defaults.
func resolveOptions(cfg gpu.Config) options {
	o := options{cudaLibrary: cfg.CUDALibrary, cublasLibrary: cfg.CUBLASLibrary, ncclLibrary: cfg.NCCLLibrary, log: cfg.Logger}
	if o.cudaLibrary == "" {
		o.cudaLibrary = os.Getenv(EnvLibCUDA)
	}
	if o.cublasLibrary == "" {
		o.cublasLibrary = os.Getenv(EnvLibCUBLAS)
	}
	if o.ncclLibrary == "" {
		o.ncclLibrary = os.Getenv(EnvLibNCCL)
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	return o
}
