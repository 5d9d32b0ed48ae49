package cu

import (
	"path/filepath"
	"unsafe"

	"github.com/ebitengine/purego"
)

// BLASLt is a loaded libcublasLt with its symbols resolved (cublasLt.h of
// cuBLAS 12/13). Its statuses are cublasStatus_t (BLASStatus).
//
// A cublasLtHandle_t may be used from several threads, but descriptors are
// plain host memory that calls read: the safe layer serialises a
// descriptor's writes and the calls that read it.
type BLASLt struct {
	Path   string
	handle uintptr
	fns    []uintptr
}

// Opaque cuBLASLt handles.
type (
	LtHandle           uintptr // cublasLtHandle_t
	LtMatmulDesc       uintptr // cublasLtMatmulDesc_t
	LtMatrixLayout     uintptr // cublasLtMatrixLayout_t
	LtMatmulPreference uintptr // cublasLtMatmulPreference_t
)

// LtMatmulAlgo is cublasLtMatmulAlgo_t: 64 opaque bytes, a chosen
// algorithm with its configuration, reusable for calls of the same
// descriptors.
type LtMatmulAlgo struct{ Data [8]uint64 }

// LtHeuristicResult is cublasLtMatmulHeuristicResult_t (96 bytes).
type LtHeuristicResult struct {
	Algo          LtMatmulAlgo
	WorkspaceSize uint64
	State         BLASStatus
	WavesCount    float32
	Reserved      [4]int32
}

// cuBLASLt enum values used (cublasLt.h, cublas_api.h, library_types.h).
const (
	// cublasComputeType_t: float32 accumulation, no TF32 (the "_FAST_TF32"
	// variant would round the inputs).
	LtCompute32F int32 = 68
	// cudaDataType_t CUDA_R_32F.
	LtR32F int32 = 0

	// cublasLtMatmulDescAttributes_t.
	LtDescTransA      = 3 // int32 cublasOperation_t
	LtDescTransB      = 4 // int32 cublasOperation_t
	LtDescEpilogue    = 7 // uint32 cublasLtEpilogue_t
	LtDescBiasPointer = 8 // const void*

	// cublasLtEpilogue_t.
	LtEpilogueDefault uint32 = 1
	LtEpilogueBias    uint32 = 4

	// cublasLtMatmulPreferenceAttributes_t.
	LtPrefMaxWorkspaceBytes = 1 // uint64
	LtPrefMinAlignA         = 5 // uint32, bytes
	LtPrefMinAlignB         = 6
	LtPrefMinAlignC         = 7
	LtPrefMinAlignD         = 8
)

type ltSym int

const (
	ltCreate ltSym = iota
	ltDestroy
	ltGetVersion
	ltMatmulDescCreate
	ltMatmulDescDestroy
	ltMatmulDescSetAttribute
	ltMatrixLayoutCreate
	ltMatrixLayoutDestroy
	ltMatmulPreferenceCreate
	ltMatmulPreferenceDestroy
	ltMatmulPreferenceSetAttribute
	ltMatmulAlgoGetHeuristic
	ltMatmul
	numLtSyms
)

var ltSyms = [numLtSyms]symSpec{
	ltCreate:                       {names: []string{"cublasLtCreate"}, required: true},
	ltDestroy:                      {names: []string{"cublasLtDestroy"}, required: true},
	ltGetVersion:                   {names: []string{"cublasLtGetVersion"}},
	ltMatmulDescCreate:             {names: []string{"cublasLtMatmulDescCreate"}, required: true},
	ltMatmulDescDestroy:            {names: []string{"cublasLtMatmulDescDestroy"}, required: true},
	ltMatmulDescSetAttribute:       {names: []string{"cublasLtMatmulDescSetAttribute"}, required: true},
	ltMatrixLayoutCreate:           {names: []string{"cublasLtMatrixLayoutCreate"}, required: true},
	ltMatrixLayoutDestroy:          {names: []string{"cublasLtMatrixLayoutDestroy"}, required: true},
	ltMatmulPreferenceCreate:       {names: []string{"cublasLtMatmulPreferenceCreate"}, required: true},
	ltMatmulPreferenceDestroy:      {names: []string{"cublasLtMatmulPreferenceDestroy"}, required: true},
	ltMatmulPreferenceSetAttribute: {names: []string{"cublasLtMatmulPreferenceSetAttribute"}, required: true},
	ltMatmulAlgoGetHeuristic:       {names: []string{"cublasLtMatmulAlgoGetHeuristic"}, required: true},
	ltMatmul:                       {names: []string{"cublasLtMatmul"}, required: true},
}

// cuBLASLt lives beside cuBLAS (the toolkit's lib64, the Python wheel's
// lib directory); the directories are cuBLAS's.
var ltSpec = libSpec{
	what:  "libcublasLt",
	names: []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"},
	dirs:  blasSpec.dirs,
}

// BLASLtCandidates lists the files OpenBLASLt tries: explicit alone when it
// is set; else the library's names in the directory of beside (the
// libcublas that was loaded, so that a cuBLAS named by --libcublas brings
// its own cuBLASLt), then the standard names and directories.
func BLASLtCandidates(explicit, beside string) []string {
	if explicit != "" {
		return []string{explicit}
	}
	var out []string
	if beside != "" && filepath.IsAbs(beside) {
		for _, n := range ltSpec.names {
			out = append(out, filepath.Join(filepath.Dir(beside), n))
		}
	}
	return append(out, ltSpec.candidates("")...)
}

// OpenBLASLt loads libcublasLt: the file named by explicit, or else the
// first of BLASLtCandidates("", beside) that loads. Cached per explicit
// path and beside.
func OpenBLASLt(explicit, beside string) (*BLASLt, error) {
	cache.Lock()
	defer cache.Unlock()
	key := explicit + "\x00" + beside
	if l, ok := cache.lt[key]; ok {
		return l, nil
	}
	spec := ltSpec
	if explicit == "" {
		// Beside cuBLAS first: a cuBLASLt of another version would not
		// match the loaded cuBLAS.
		c := BLASLtCandidates("", beside)
		spec = libSpec{what: ltSpec.what, names: c}
	}
	h, path, fns, err := resolve(spec, explicit, ltSyms[:])
	if err != nil {
		return nil, err
	}
	l := &BLASLt{Path: path, handle: h, fns: fns}
	if cache.lt == nil {
		cache.lt = map[string]*BLASLt{}
	}
	cache.lt[key] = l
	return l, nil
}

// call: see Driver.call.
//
//go:uintptrescapes
func (l *BLASLt) call(s ltSym, args ...uintptr) BLASStatus {
	fn := l.fns[s]
	if fn == 0 {
		return BLASNotLoaded
	}
	r, _, _ := purego.SyscallN(fn, args...)
	return BLASStatus(int32(uint32(r)))
}

// GetVersion is cublasLtGetVersion (0 when the symbol is missing).
func (l *BLASLt) GetVersion() uint64 {
	fn := l.fns[ltGetVersion]
	if fn == 0 {
		return 0
	}
	r, _, _ := purego.SyscallN(fn)
	return uint64(r)
}

func (l *BLASLt) Create(h *LtHandle) BLASStatus {
	return l.call(ltCreate, uintptr(unsafe.Pointer(h)))
}

func (l *BLASLt) Destroy(h LtHandle) BLASStatus { return l.call(ltDestroy, uintptr(h)) }

// MatmulDescCreate makes a matmul descriptor computing in computeType with
// alpha and beta of scaleType.
func (l *BLASLt) MatmulDescCreate(d *LtMatmulDesc, computeType, scaleType int32) BLASStatus {
	return l.call(ltMatmulDescCreate, uintptr(unsafe.Pointer(d)), uintptr(computeType), uintptr(scaleType))
}

func (l *BLASLt) MatmulDescDestroy(d LtMatmulDesc) BLASStatus {
	return l.call(ltMatmulDescDestroy, uintptr(d))
}

// MatmulDescSetAttribute copies size bytes at buf into attribute attr.
func (l *BLASLt) MatmulDescSetAttribute(d LtMatmulDesc, attr int, buf unsafe.Pointer, size uintptr) BLASStatus {
	return l.call(ltMatmulDescSetAttribute, uintptr(d), uintptr(attr), uintptr(buf), size)
}

// MatrixLayoutCreate describes a column-major rows×cols matrix of dataType
// with leading dimension ld.
func (l *BLASLt) MatrixLayoutCreate(m *LtMatrixLayout, dataType int32, rows, cols uint64, ld int64) BLASStatus {
	return l.call(ltMatrixLayoutCreate, uintptr(unsafe.Pointer(m)), uintptr(dataType), uintptr(rows), uintptr(cols), uintptr(ld))
}

func (l *BLASLt) MatrixLayoutDestroy(m LtMatrixLayout) BLASStatus {
	return l.call(ltMatrixLayoutDestroy, uintptr(m))
}

func (l *BLASLt) MatmulPreferenceCreate(p *LtMatmulPreference) BLASStatus {
	return l.call(ltMatmulPreferenceCreate, uintptr(unsafe.Pointer(p)))
}

func (l *BLASLt) MatmulPreferenceDestroy(p LtMatmulPreference) BLASStatus {
	return l.call(ltMatmulPreferenceDestroy, uintptr(p))
}

// MatmulPreferenceSetAttribute copies size bytes at buf into attribute
// attr.
func (l *BLASLt) MatmulPreferenceSetAttribute(p LtMatmulPreference, attr int, buf unsafe.Pointer, size uintptr) BLASStatus {
	return l.call(ltMatmulPreferenceSetAttribute, uintptr(p), uintptr(attr), uintptr(buf), size)
}

// MatmulAlgoGetHeuristic fills results (best first) with algorithms for
// the descriptors and sets *n to how many it wrote. It runs on the host
// only.
func (l *BLASLt) MatmulAlgoGetHeuristic(h LtHandle, d LtMatmulDesc, a, b, c, dd LtMatrixLayout, p LtMatmulPreference,
	results []LtHeuristicResult, n *int32) BLASStatus {
	if len(results) == 0 {
		*n = 0
		return BLASInvalidValue
	}
	return l.call(ltMatmulAlgoGetHeuristic, uintptr(h), uintptr(d), uintptr(a), uintptr(b), uintptr(c), uintptr(dd), uintptr(p),
		uintptr(len(results)), uintptr(unsafe.Pointer(&results[0])), uintptr(unsafe.Pointer(n)))
}

// Matmul is cublasLtMatmul: D = alpha·op(A)·op(B) + beta·C (and the
// descriptor's epilogue), enqueued on s with algo and the workspace.
// alpha and beta are host pointers (the default pointer mode), read before
// the call returns.
func (l *BLASLt) Matmul(h LtHandle, d LtMatmulDesc, alpha *float32, a DevicePtr, ad LtMatrixLayout, b DevicePtr, bd LtMatrixLayout,
	beta *float32, c DevicePtr, cd LtMatrixLayout, dst DevicePtr, dd LtMatrixLayout, algo *LtMatmulAlgo,
	ws DevicePtr, wsSize uint64, s Stream) BLASStatus {
	return l.call(ltMatmul, uintptr(h), uintptr(d), uintptr(unsafe.Pointer(alpha)), uintptr(a), uintptr(ad),
		uintptr(b), uintptr(bd), uintptr(unsafe.Pointer(beta)), uintptr(c), uintptr(cd), uintptr(dst), uintptr(dd),
		uintptr(unsafe.Pointer(algo)), uintptr(ws), uintptr(wsSize), uintptr(s))
}
