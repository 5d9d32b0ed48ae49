package cu

import (
	"strconv"
	"unsafe"

	"github.com/ebitengine/purego"
)

// BLAS is a loaded libcublas with its symbols resolved.
//
// cuBLAS binds each handle to the context current when it was created, and a
// handle must not be used from two goroutines at once (NVIDIA's rule); the
// safe layer serialises.
type BLAS struct {
	Path   string
	handle uintptr
	fns    []uintptr
}

// BLASHandle is cublasHandle_t.
type BLASHandle uintptr

// BLASStatus is cublasStatus_t.
type BLASStatus int32

// cublasStatus_t values (cublas_api.h, CUDA 13.0).
const (
	BLASSuccess         BLASStatus = 0
	BLASNotInitialized  BLASStatus = 1
	BLASAllocFailed     BLASStatus = 3
	BLASInvalidValue    BLASStatus = 7
	BLASArchMismatch    BLASStatus = 8
	BLASMappingError    BLASStatus = 11
	BLASExecutionFailed BLASStatus = 13
	BLASInternalError   BLASStatus = 14
	BLASNotSupported    BLASStatus = 15
	BLASLicenseError    BLASStatus = 16
	// BLASNotLoaded: the symbol is missing from the loaded library (never
	// returned by cuBLAS itself).
	BLASNotLoaded BLASStatus = -1
)

var blasStatusNames = map[BLASStatus]string{
	BLASSuccess:         "CUBLAS_STATUS_SUCCESS",
	BLASNotInitialized:  "CUBLAS_STATUS_NOT_INITIALIZED",
	BLASAllocFailed:     "CUBLAS_STATUS_ALLOC_FAILED",
	BLASInvalidValue:    "CUBLAS_STATUS_INVALID_VALUE",
	BLASArchMismatch:    "CUBLAS_STATUS_ARCH_MISMATCH",
	BLASMappingError:    "CUBLAS_STATUS_MAPPING_ERROR",
	BLASExecutionFailed: "CUBLAS_STATUS_EXECUTION_FAILED",
	BLASInternalError:   "CUBLAS_STATUS_INTERNAL_ERROR",
	BLASNotSupported:    "CUBLAS_STATUS_NOT_SUPPORTED",
	BLASLicenseError:    "CUBLAS_STATUS_LICENSE_ERROR",
	BLASNotLoaded:       "STABLEGRAPH_SYMBOL_NOT_LOADED",
}

// Name is the C enum name of s.
func (s BLASStatus) Name() string {
	if n, ok := blasStatusNames[s]; ok {
		return n
	}
	return "cublasStatus_t(" + strconv.Itoa(int(s)) + ")"
}

func (s BLASStatus) String() string { return s.Name() }

// BLASOperation is cublasOperation_t.
type BLASOperation int32

const (
	BLASOpN BLASOperation = 0 // no transpose
	BLASOpT BLASOperation = 1 // transpose
)

type blasSym int

const (
	blasCreate blasSym = iota
	blasDestroy
	blasGetVersion
	blasSetStream
	blasSetWorkspace
	blasSgemm
	numBLASSyms
)

var blasSyms = [numBLASSyms]symSpec{
	blasCreate:       {names: []string{"cublasCreate_v2"}, required: true},
	blasDestroy:      {names: []string{"cublasDestroy_v2"}, required: true},
	blasGetVersion:   {names: []string{"cublasGetVersion_v2"}},
	blasSetStream:    {names: []string{"cublasSetStream_v2"}, required: true},
	blasSetWorkspace: {names: []string{"cublasSetWorkspace_v2"}},
	blasSgemm:        {names: []string{"cublasSgemm_v2"}, required: true},
}

// OpenBLAS loads libcublas: the file named by explicit, or else the first of
// BLASCandidates("") that loads. Cached per explicit path.
func OpenBLAS(explicit string) (*BLAS, error) {
	cache.Lock()
	defer cache.Unlock()
	if b, ok := cache.blas[explicit]; ok {
		return b, nil
	}
	h, path, fns, err := resolve(blasSpec, explicit, blasSyms[:])
	if err != nil {
		return nil, err
	}
	b := &BLAS{Path: path, handle: h, fns: fns}
	if cache.blas == nil {
		cache.blas = map[string]*BLAS{}
	}
	cache.blas[explicit] = b
	return b, nil
}

// Has reports whether the cuBLAS function name was resolved.
func (b *BLAS) Has(name string) bool {
	for i, s := range blasSyms {
		for _, n := range s.names {
			if n == name {
				return b.fns[i] != 0
			}
		}
	}
	return false
}

// call: see Driver.call.
//
//go:uintptrescapes
func (b *BLAS) call(s blasSym, args ...uintptr) BLASStatus {
	fn := b.fns[s]
	if fn == 0 {
		return BLASNotLoaded
	}
	r, _, _ := purego.SyscallN(fn, args...)
	return BLASStatus(int32(uint32(r)))
}

// Create creates a handle bound to the current context.
func (b *BLAS) Create(h *BLASHandle) BLASStatus {
	return b.call(blasCreate, uintptr(unsafe.Pointer(h)))
}

func (b *BLAS) Destroy(h BLASHandle) BLASStatus { return b.call(blasDestroy, uintptr(h)) }

func (b *BLAS) GetVersion(h BLASHandle, v *int32) BLASStatus {
	return b.call(blasGetVersion, uintptr(h), uintptr(unsafe.Pointer(v)))
}

// SetStream makes later calls on h run on s. cuBLAS resets the workspace to
// its default pool on every SetStream; call SetWorkspace after it.
func (b *BLAS) SetStream(h BLASHandle, s Stream) BLASStatus {
	return b.call(blasSetStream, uintptr(h), uintptr(s))
}

// SetWorkspace gives h a device workspace, so that it allocates nothing
// while a stream is being captured.
func (b *BLAS) SetWorkspace(h BLASHandle, ws DevicePtr, size uint64) BLASStatus {
	return b.call(blasSetWorkspace, uintptr(h), uintptr(ws), uintptr(size))
}

// Sgemm is cublasSgemm_v2, column-major: C = alpha·op(A)·op(B) + beta·C with
// op(A) m×k, op(B) k×n, C m×n. alpha and beta are host pointers (the default
// pointer mode), read before the call returns.
func (b *BLAS) Sgemm(h BLASHandle, transA, transB BLASOperation, m, n, k int32,
	alpha *float32, a DevicePtr, lda int32, bm DevicePtr, ldb int32, beta *float32, c DevicePtr, ldc int32) BLASStatus {
	return b.call(blasSgemm, uintptr(h), uintptr(transA), uintptr(transB), uintptr(m), uintptr(n), uintptr(k),
		uintptr(unsafe.Pointer(alpha)), uintptr(a), uintptr(lda), uintptr(bm), uintptr(ldb),
		uintptr(unsafe.Pointer(beta)), uintptr(c), uintptr(ldc))
}
