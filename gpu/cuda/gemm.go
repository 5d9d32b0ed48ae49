package cuda

import (
	"sync"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
	"github.com/stablegraph/stablegraph/kernels"
)

// GEMMer is an optional capability: single-precision matrix products on a
// stream, row-major, C[m×n] = alpha·op(A)·op(B) + beta·C with op(A) m×k and
// op(B) k×n (A stored k×m when transA, B stored n×k when transB); when beta
// is 0, C is not read. It is stream-ordered work like a kernel launch and
// may be captured into a graph (that is how library calls enter graphs as
// traced commands).
//
// The CUDA backend implements it with cuBLAS when libcublas loads, and with
// the built-in PTX kernel sg_gemm otherwise. Discover it with a type
// assertion: gemmer, ok := backend.(cuda.GEMMer).
type GEMMer interface {
	Gemm(s gpu.Stream, c, a, b gpu.DevicePtr, m, n, k int, transA, transB bool, alpha, beta float32) error
}

var _ GEMMer = (*Backend)(nil)

// blasLib is cuBLAS as loaded (once) by a backend.
type blasLib struct {
	once sync.Once
	lib  *cu.BLAS
	err  error // why cuBLAS is not used (nil when it is)
}

// gemmState is one device's GEMM machinery, made at its first Gemm: a
// cuBLAS handle with a workspace of our own (so that captured calls allocate
// nothing), or the built-in module for the fallback kernel. mu serialises
// the handle (cuBLAS handles are not safe for concurrent use: SetStream and
// the call must stay together).
type gemmState struct {
	mu     sync.Mutex
	ready  bool
	handle cu.BLASHandle
	ws     cu.DevicePtr
	wsSize uint64
	module cu.Module
	fn     cu.Function
}

// workspaceSize is the cuBLAS workspace per device: NVIDIA recommends 32 MiB
// on Hopper and 4 MiB before it.
func workspaceSize(major int) uint64 {
	if major >= 9 {
		return 32 << 20
	}
	return 4 << 20
}

// loadBLAS loads cuBLAS once; a failure is remembered and the PTX kernel
// used instead.
func (b *Backend) loadBLAS() (*cu.BLAS, error) {
	b.blas.once.Do(func() {
		b.blas.lib, b.blas.err = cu.OpenBLAS(b.opts.cublasLibrary)
		if b.blas.err != nil {
			b.opts.log.Debug("cuda: cuBLAS unavailable, using the PTX gemm", "err", b.blas.err)
		}
	})
	return b.blas.lib, b.blas.err
}

// GemmImpl says which implementation Gemm uses on dev ("cublas" or "ptx"),
// preparing it if needed. Preparing creates the cuBLAS handle and workspace
// (or loads the fallback module): do it before a capture begins.
func (b *Backend) GemmImpl(dev int) (string, error) {
	d, err := b.device("Gemm", dev)
	if err != nil {
		return "", err
	}
	d.gemm.mu.Lock()
	defer d.gemm.mu.Unlock()
	if err := b.prepareGemmLocked(dev, d); err != nil {
		return "", err
	}
	if d.gemm.handle != 0 {
		return "cublas", nil
	}
	return "ptx", nil
}

// prepareGemmLocked makes dev's GEMM machinery; d.gemm.mu is held.
func (b *Backend) prepareGemmLocked(dev int, d *device) error {
	if d.gemm.ready {
		return nil
	}
	lib, lerr := b.loadBLAS()
	err := b.onDevice(dev, func() error {
		if lerr == nil {
			var h cu.BLASHandle
			s := lib.Create(&h)
			if s == cu.BLASSuccess {
				size := workspaceSize(d.props.ComputeMajor)
				var ws cu.DevicePtr
				if r := b.d.MemAlloc(&ws, size); r != cu.Success {
					lib.Destroy(h)
					return b.check("cuMemAlloc_v2", r)
				}
				d.gemm.handle, d.gemm.ws, d.gemm.wsSize = h, ws, size
				return nil
			}
			b.opts.log.Debug("cuda: cublasCreate_v2 failed, using the PTX gemm", "status", s.Name())
		}
		// Fallback: the built-in module, internal (not counted).
		img := kernels.Module()
		m, err := b.loadPTX(dev, d, img)
		if err != nil {
			return err
		}
		var f cu.Function
		if r := b.d.ModuleGetFunction(&f, m, cu.CString(kernels.Gemm)); r != cu.Success {
			b.d.ModuleUnload(m)
			return b.check("cuModuleGetFunction", r)
		}
		d.gemm.module, d.gemm.fn = m, f
		// Known by its spec, so that captured launches of it read back
		// typed (GraphKernelNodeParams); internal, so not counted.
		if spec, ok := img.Kernel(kernels.Gemm); ok {
			b.mu.Lock()
			b.funcHandleLocked(f, &funcInfo{dev: dev, f: f, name: kernels.Gemm, spec: &spec})
			b.mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return err // not sticky: a later Gemm tries again
	}
	d.gemm.ready = true
	return nil
}

// Gemm implements GEMMer.
func (b *Backend) Gemm(s gpu.Stream, c, a, bm gpu.DevicePtr, m, n, k int, transA, transB bool, alpha, beta float32) error {
	const op = "Gemm"
	dev, cs, err := b.stream(op, s)
	if err != nil {
		return err
	}
	const maxDim = 1<<31 - 1
	if m < 0 || n < 0 || k < 0 || m > maxDim || n > maxDim || k > maxDim {
		return errf(op, gpu.ErrInvalidValue, "shape m=%d n=%d k=%d", m, n, k)
	}
	if m == 0 || n == 0 {
		return nil
	}
	d := b.devs[dev]
	d.gemm.mu.Lock()
	defer d.gemm.mu.Unlock()
	if err := b.prepareGemmLocked(dev, d); err != nil {
		return err
	}
	if d.gemm.handle == 0 {
		return b.gemmPTXLocked(dev, d, cs, c, a, bm, m, n, k, transA, transB, alpha, beta)
	}
	lib := b.blas.lib
	// Row-major C = op(A)·op(B) is column-major C^T = op(B)^T·op(A)^T: pass
	// B as cuBLAS's first operand and A as its second, n and m swapped. A
	// row-major matrix stored r×c is its transpose in column-major with
	// leading dimension c.
	opA, lda := cu.BLASOpN, n // cuBLAS "A" is our B
	if transB {
		opA, lda = cu.BLASOpT, k
	}
	opB, ldb := cu.BLASOpN, k // cuBLAS "B" is our A
	if transA {
		opB, ldb = cu.BLASOpT, m
	}
	return b.onDevice(dev, func() error {
		if st := lib.SetStream(d.gemm.handle, cs); st != cu.BLASSuccess {
			return blasError("cublasSetStream_v2", st)
		}
		// SetStream resets the workspace to cuBLAS's own pool: give ours back.
		if st := lib.SetWorkspace(d.gemm.handle, d.gemm.ws, d.gemm.wsSize); st != cu.BLASSuccess && st != cu.BLASNotLoaded {
			return blasError("cublasSetWorkspace_v2", st)
		}
		al, be := alpha, beta
		st := lib.Sgemm(d.gemm.handle, opA, opB, int32(n), int32(m), int32(k),
			&al, cu.DevicePtr(bm), int32(max(lda, 1)), cu.DevicePtr(a), int32(max(ldb, 1)), &be, cu.DevicePtr(c), int32(max(n, 1)))
		if st != cu.BLASSuccess {
			return blasError("cublasSgemm_v2", st)
		}
		return nil
	})
}

// gemmPTXLocked launches the built-in sg_gemm.
func (b *Backend) gemmPTXLocked(dev int, d *device, cs cu.Stream, c, a, bm gpu.DevicePtr, m, n, k int,
	transA, transB bool, alpha, beta float32) error {
	flag := func(t bool) gpu.Arg {
		if t {
			return gpu.I32(1)
		}
		return gpu.I32(0)
	}
	args := []gpu.Arg{gpu.Ptr(c), gpu.Ptr(a), gpu.Ptr(bm), gpu.I32(int32(m)), gpu.I32(int32(n)), gpu.I32(int32(k)),
		flag(transA), flag(transB), gpu.F32(alpha), gpu.F32(beta)}
	pack := packArgs(args)
	defer pack.release()
	cfg := kernels.GemmConfig(m, n)
	return b.call(dev, "cuLaunchKernel", func() cu.Result {
		return b.d.LaunchKernel(d.gemm.fn, cfg.Grid.X, cfg.Grid.Y, cfg.Grid.Z, cfg.Block.X, cfg.Block.Y, cfg.Block.Z,
			0, cs, pack.params())
	})
}

// closeGemm releases dev's GEMM machinery (at Close).
func (b *Backend) closeGemm(dev int) error {
	d := b.devs[dev]
	d.gemm.mu.Lock()
	defer d.gemm.mu.Unlock()
	if !d.gemm.ready {
		return nil
	}
	d.gemm.ready = false
	return b.onDevice(dev, func() error {
		var err error
		if d.gemm.handle != 0 {
			if st := b.blas.lib.Destroy(d.gemm.handle); st != cu.BLASSuccess {
				err = blasError("cublasDestroy_v2", st)
			}
			if r := b.d.MemFree(d.gemm.ws); r != cu.Success && err == nil {
				err = b.check("cuMemFree_v2", r)
			}
		}
		if d.gemm.module != 0 {
			if r := b.d.ModuleUnload(d.gemm.module); r != cu.Success && err == nil {
				err = b.check("cuModuleUnload", r)
			}
		}
		d.gemm.handle, d.gemm.ws, d.gemm.wsSize, d.gemm.module, d.gemm.fn = 0, 0, 0, 0, 0
		return err
	})
}
