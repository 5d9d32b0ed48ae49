package cuda

import (
	"log/slog"
	"os"

	"github.com/stablegraph/stablegraph/gpu"
)

// Config is the CUDA backend's configuration: Open takes it, and
// gpu.Open("cuda") and "auto" read it from gpu.Config.Backends. Each
// library left empty is named by its environment variable (EnvLibCUDA,
// EnvLibCUBLAS, EnvLibNCCL), else searched for among standard names and
// directories.
type Config struct {
	// LibCUDA names the libcuda file to load. Default: STABLEGRAPH_LIBCUDA,
	// else cu.Candidates.
	LibCUDA string
	// LibCUBLAS names the libcublas file to load. Default:
	// STABLEGRAPH_LIBCUBLAS, else cu.BLASCandidates. cuBLAS is optional:
	// without it GEMMs run the built-in kernels.
	LibCUBLAS string
	// LibNCCL names the libnccl file to load for collectives. Default:
	// STABLEGRAPH_LIBNCCL, else cu.NCCLCandidates (system library
	// directories, CUDA toolkits, PyTorch's NCCL wheel). NCCL is optional:
	// without it the collectives return gpu.ErrNotSupported listing the
	// places tried.
	LibNCCL string
	// Logger receives the backend's logs; hot paths log at debug level
	// only. Default: gpu.Config.Logger when opened through gpu.Open, else
	// slog.Default().
	Logger *slog.Logger
}

// BackendName is "cuda": a Config in gpu.Config.Backends configures the
// CUDA backend (gpu.BackendConfig).
func (Config) BackendName() string { return "cuda" }

var _ gpu.BackendConfig = Config{}

// configOf returns the CUDA configuration in gc, with gc's logger unless it
// names its own. A configuration given as a *Config is taken too.
func configOf(gc gpu.Config) Config {
	var c Config
	switch bc := gc.For("cuda").(type) {
	case Config:
		c = bc
	case *Config:
		if bc != nil {
			c = *bc
		}
	}
	if c.Logger == nil {
		c.Logger = gc.Logger
	}
	return c
}

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

// Environment variables naming the libraries when Config does not.
const (
	EnvLibCUDA   = "STABLEGRAPH_LIBCUDA"
	EnvLibCUBLAS = "STABLEGRAPH_LIBCUBLAS"
	EnvLibNCCL   = "STABLEGRAPH_LIBNCCL"
)

// resolveOptions fills options from cfg, then from the environment for
// fields cfg leaves empty, then from defaults.
func resolveOptions(cfg Config) options {
	o := options{cudaLibrary: cfg.LibCUDA, cublasLibrary: cfg.LibCUBLAS, ncclLibrary: cfg.LibNCCL, log: cfg.Logger}
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
