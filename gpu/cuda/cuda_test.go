package cuda

import (
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// openOrSkip opens the CUDA backend, skipping the test (with the reason)
// where there is no driver or no device.
func openOrSkip(t testing.TB, cfg Config) *Backend {
	t.Helper()
	b, err := Open(cfg)
	if errors.Is(err, gpu.ErrUnavailable) {
		t.Skipf("no CUDA here: %v", err)
	}
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return b
}

// closeClean closes b at the end of the test and fails on leaks.
func closeClean(t testing.TB, b *Backend) {
	t.Cleanup(func() {
		if c := b.LiveHandles(); !c.IsZero() {
			t.Errorf("leak: %v", c)
		}
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}

func TestRegistered(t *testing.T) {
	if !slices.Contains(gpu.Drivers(), "cuda") {
		t.Fatalf("gpu.Drivers() = %v, want cuda registered", gpu.Drivers())
	}
}

// TestOpenMissingLibrary: a library that is not there is ErrUnavailable
// naming the place tried, from the Config field and from the environment.
func TestOpenMissingLibrary(t *testing.T) {
	const path = "/nonexistent/stablegraph-test/libcuda.so.1"
	_, err := Open(Config{LibCUDA: path})
	if !errors.Is(err, gpu.ErrUnavailable) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open(LibCUDA: missing) = %v, want ErrUnavailable naming %s", err, path)
	}
	const envPath = "/nonexistent/stablegraph-env/libcuda.so.1"
	t.Setenv(EnvLibCUDA, envPath)
	_, err = Open(Config{})
	if !errors.Is(err, gpu.ErrUnavailable) || !strings.Contains(err.Error(), envPath) {
		t.Fatalf("Open with %s set = %v, want ErrUnavailable naming %s", EnvLibCUDA, err, envPath)
	}
	// The Config field wins over the environment.
	_, err = Open(Config{LibCUDA: path})
	if !strings.Contains(err.Error(), path) || strings.Contains(err.Error(), envPath) {
		t.Fatalf("Config.LibCUDA did not win over %s: %v", EnvLibCUDA, err)
	}
	// Through the registry too: the backend reads its own configuration
	// from gpu.Config.Backends.
	_, _, err = gpu.Open("cuda", gpu.Config{Backends: []gpu.BackendConfig{Config{LibCUDA: path}}})
	if !errors.Is(err, gpu.ErrUnavailable) || !strings.Contains(err.Error(), path) {
		t.Fatalf("gpu.Open(cuda) = %v, want ErrUnavailable naming %s", err, path)
	}
}

// TestConfigOf: the backend takes its own configuration out of a
// gpu.Config, by value or pointer, with the gpu.Config's logger unless it
// names one.
func TestConfigOf(t *testing.T) {
	shared := slog.New(slog.DiscardHandler)
	own := slog.New(slog.DiscardHandler)
	if c := configOf(gpu.Config{Logger: shared}); c != (Config{Logger: shared}) {
		t.Errorf("no cuda configuration: %+v", c)
	}
	gc := gpu.Config{Logger: shared, Backends: []gpu.BackendConfig{otherConfig{}, Config{LibNCCL: "/x/libnccl.so"}}}
	if c := configOf(gc); c.LibNCCL != "/x/libnccl.so" || c.Logger != shared {
		t.Errorf("configOf = %+v", c)
	}
	gc.Backends = []gpu.BackendConfig{&Config{LibCUBLAS: "/y/libcublas.so", Logger: own}}
	if c := configOf(gc); c.LibCUBLAS != "/y/libcublas.so" || c.Logger != own {
		t.Errorf("configOf(pointer) = %+v", c)
	}
}

// otherConfig is another backend's configuration.
type otherConfig struct{}

func (otherConfig) BackendName() string { return "other" }

func TestResolveOptions(t *testing.T) {
	t.Setenv(EnvLibCUDA, "/env/libcuda.so.1")
	t.Setenv(EnvLibCUBLAS, "/env/libcublas.so.13")
	o := resolveOptions(Config{LibCUBLAS: "/cfg/libcublas.so"})
	if o.cudaLibrary != "/env/libcuda.so.1" || o.cublasLibrary != "/cfg/libcublas.so" || o.log == nil {
		t.Fatalf("resolveOptions = %+v", o)
	}
}

// TestErrorMapping checks the CUresult -> sentinel table and the shape of
// driver errors (no GPU needed).
func TestErrorMapping(t *testing.T) {
	for r, want := range map[cu.Result]error{
		cu.ErrorOutOfMemory:              gpu.ErrOutOfMemory,
		cu.ErrorInvalidValue:             gpu.ErrInvalidValue,
		cu.ErrorInvalidHandle:            gpu.ErrInvalidHandle,
		cu.ErrorInvalidContext:           gpu.ErrInvalidHandle,
		cu.ErrorNotReady:                 gpu.ErrNotReady,
		cu.ErrorIllegalState:             gpu.ErrIllegalState,
		cu.ErrorNotSupported:             gpu.ErrNotSupported,
		cu.ErrorIllegalAddress:           gpu.ErrIllegalAddress,
		cu.ErrorStreamCaptureUnsupported: gpu.ErrCaptureInvalidated,
		cu.ErrorStreamCaptureInvalidated: gpu.ErrCaptureInvalidated,
		cu.ErrorGraphExecUpdateFailure:   gpu.ErrGraphUpdate,
		cu.ErrorNotFound:                 gpu.ErrNotFound,
		cu.ErrorTimeout:                  gpu.ErrTimeout,
		cu.ErrorNoDevice:                 gpu.ErrUnavailable,
		cu.ErrorLaunchFailed:             gpu.ErrDeviceLost,
		cu.ErrorNotLoaded:                gpu.ErrNotSupported,
		cu.Result(4242):                  gpu.ErrIllegalState,
	} {
		err := driverError(nil, "cuTest", r)
		if !errors.Is(err, want) {
			t.Errorf("%s: %v does not wrap %v", r.Name(), err, want)
		}
		if !strings.HasPrefix(err.Error(), "cuTest") {
			t.Errorf("%s: error %q does not name the call", r.Name(), err)
		}
	}
	var ge *gpu.Error
	err := driverError(nil, "cuMemAlloc_v2", cu.ErrorOutOfMemory)
	if !errors.As(err, &ge) || ge.Op != "cuMemAlloc_v2" || ge.Code != 2 || ge.CodeName != "CUDA_ERROR_OUT_OF_MEMORY" {
		t.Errorf("driverError = %#v, want Op, Code and CodeName set", err)
	}
	var ue *gpu.UpdateError
	if err := driverError(nil, "cuGraphExecUpdate_v2", cu.ErrorGraphExecUpdateFailure); !errors.As(err, &ue) {
		t.Errorf("GRAPH_EXEC_UPDATE_FAILURE gave %T, want *gpu.UpdateError", err)
	}
	if err := driverError(nil, "cuX", cu.ErrorNotLoaded); !strings.Contains(err.Error(), "not exported") {
		t.Errorf("missing symbol error %q does not say so", err)
	}
	for r, want := range map[cu.GraphExecUpdateResult]gpu.UpdateResult{
		cu.GraphExecUpdateErrorTopologyChanged:           gpu.UpdateTopologyChanged,
		cu.GraphExecUpdateErrorNodeTypeChanged:           gpu.UpdateNodeTypeChanged,
		cu.GraphExecUpdateErrorFunctionChanged:           gpu.UpdateFunctionChanged,
		cu.GraphExecUpdateErrorUnsupportedFunctionChange: gpu.UpdateFunctionChanged,
		cu.GraphExecUpdateErrorParametersChanged:         gpu.UpdateParametersChanged,
		cu.GraphExecUpdateErrorNotSupported:              gpu.UpdateNotSupported,
		cu.GraphExecUpdateErrorAttributesChanged:         gpu.UpdateAttributesChanged,
		cu.GraphExecUpdateError:                          gpu.UpdateFailed,
	} {
		if got := updateResult(r); got != want {
			t.Errorf("updateResult(%d) = %v, want %v", r, got, want)
		}
	}
	if err := blasError("cublasSgemm_v2", cu.BLASInvalidValue); !errors.Is(err, gpu.ErrInvalidValue) ||
		!strings.Contains(err.Error(), "CUBLAS_STATUS_INVALID_VALUE") {
		t.Errorf("blasError = %v", err)
	}
}

// TestPackArgs checks the C view of kernel arguments: one pointer per
// argument, 8-byte aligned, pointing at its little-endian bytes; and that
// decoding reads back what was packed, typed or as bytes.
func TestPackArgs(t *testing.T) {
	args := []gpu.Arg{gpu.Ptr(0x7f0012345600), gpu.F32(1.5), gpu.I32(-7), gpu.U64(1 << 40),
		gpu.Bytes([]byte{1, 2, 3}), gpu.Bytes([]byte{9, 8, 7, 6}), gpu.Bytes([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})}
	a := packArgs(args)
	defer a.release()
	if len(a.ptrs) != len(args) {
		t.Fatalf("%d pointers for %d args", len(a.ptrs), len(args))
	}
	kinds := []gpu.ArgKind{gpu.ArgPtr, gpu.ArgF32, gpu.ArgI32, gpu.ArgU64}
	typed := decodeArgs(unsafe.Pointer(a.params()), kinds, nil)
	for i, k := range kinds {
		if typed[i].Kind != k || typed[i].Bits != args[i].Bits {
			t.Errorf("typed arg %d = %v, want %v", i, typed[i], args[i])
		}
	}
	var layout []gpu.ParamInfo
	for _, ps := range [][2]uint64{{0, 8}, {8, 4}, {12, 4}, {16, 8}, {24, 3}, {28, 4}, {32, 12}} {
		layout = append(layout, gpu.ParamInfo{Offset: ps[0], Size: ps[1]})
	}
	raw := decodeArgs(unsafe.Pointer(a.params()), nil, layout)
	for i, r := range raw {
		want := make([]byte, args[i].Size())
		if args[i].Kind == gpu.ArgBytes {
			copy(want, args[i].Raw)
		} else {
			args[i].Encode(want)
		}
		if r.Kind != gpu.ArgBytes || !slices.Equal(r.Raw, want) {
			t.Errorf("raw arg %d = %v, want bytes %x", i, r, want)
		}
	}
	if p := packArgs(nil); p.params() != nil {
		t.Errorf("no arguments gave a non-nil params array")
	}
}

// gemmRef is C = alpha·op(A)·op(B) + beta·C in float64, row-major.
func gemmRef(a, b, c []float32, m, n, k int, transA, transB bool, alpha, beta float32) []float64 {
	out := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for l := 0; l < k; l++ {
				av := a[i*k+l]
				if transA {
					av = a[l*m+i]
				}
				bv := b[l*n+j]
				if transB {
					bv = b[j*k+l]
				}
				s += float64(av) * float64(bv)
			}
			out[i*n+j] = float64(alpha) * s
			if beta != 0 {
				out[i*n+j] += float64(beta) * float64(c[i*n+j])
			}
		}
	}
	return out
}

// relErr is ‖got − ref‖ / ‖ref‖; NaN counts as infinitely wrong.
func relErr(got []float32, ref []float64) float64 {
	var num, den float64
	for i := range ref {
		d := float64(got[i]) - ref[i]
		if math.IsNaN(d) {
			return math.Inf(1)
		}
		num += d * d
		den += ref[i] * ref[i]
	}
	return math.Sqrt(num / max(den, 1e-30))
}

func randF32(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.Float64()*2 - 1)
	}
	return v
}
