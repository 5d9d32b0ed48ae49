package gpu

// GEMM is an optional interface: a backend with a matrix-product library
// (cuBLAS and cuBLASLt on CUDA; a model of them on sim). Use GemmOf to get
// it. Callers without it, or for which a call returns an error wrapping
// ErrNotSupported, fall back to a kernel of their own (the traced GEMM
// command of package internal/blas launches the built-in kernels.Gemm).
//
// The product is float32 and row-major:
//
//	C[M×N] = Alpha·op(A)·op(B) + Beta·C + Bias
//
// with op(A) M×K (A stored M×K, or K×M when TransA) and op(B) K×N (B stored
// K×N, or N×K when TransB). Bias, when not zero, points at N float32 values
// added to every row of C. When Beta is 0, C is not read.
//
// A library call is stream-ordered work like a kernel launch, and it may be
// captured into a graph. What it enqueues depends on the shape and on the
// alignment of its pointers (libraries pick kernels by both: see
// AlignClass), and on the workspace: a call given none takes the library's
// own, which a library allocates inside the capture when the stream is
// capturing (graph memory nodes, a new address in every capture). Give every
// captured call a workspace that outlives the graphs holding it.
type GEMM interface {
	// GemmWorkspaceSize is the workspace, in bytes, that GEMMs on dev
	// should be given: enough for every algorithm Gemm may choose there.
	GemmWorkspaceSize(dev int) (uint64, error)
	// GemmPrepare chooses, once per device, shape and alignment class, how
	// Gemm will compute p, and keeps the choice: every later call with that
	// shape and class computes the same way (and so gives the same bits).
	// Choosing may allocate and time candidates, so it must not run while
	// any stream of the device is being captured; Gemm itself never
	// measures. Only p's shape, flags, workspace size and the alignment
	// classes of its pointers matter; its memory is not touched.
	GemmPrepare(dev int, p GemmParams) error
	// Gemm enqueues p on s (or captures it, when s is capturing). A shape
	// and class never prepared is computed the way the library's own
	// heuristic picks first, and that choice is kept as if prepared.
	Gemm(s Stream, p GemmParams) error
}

// GemmParams is one matrix product; see GEMM.
type GemmParams struct {
	C, A, B DevicePtr
	// Bias is optional (0: none): N float32 added to every row of C.
	Bias           DevicePtr
	M, N, K        int
	TransA, TransB bool
	Alpha, Beta    float32
	// Workspace is device scratch of WorkspaceSize bytes the call may use;
	// it must stay allocated while any graph that captured the call
	// exists, and must not be used by work that may run at the same time.
	// Zero: the library's own (see GEMM).
	Workspace     DevicePtr
	WorkspaceSize uint64
}

// MaxAlignClass is the largest alignment class: libraries choose kernels by
// pointer alignment up to 256 bytes (cuBLASLt's MIN_ALIGNMENT preferences
// default to 256), never beyond.
const MaxAlignClass = 256

// AlignClass is the alignment class of p: the largest power of two, at most
// MaxAlignClass, that divides it (MaxAlignClass for the null pointer). Two
// addresses of one class look the same to a library choosing its kernels by
// alignment.
func AlignClass(p DevicePtr) uint64 {
	if p == 0 {
		return MaxAlignClass
	}
	return min(uint64(p)&-uint64(p), MaxAlignClass)
}

// GraphNodeReader is an optional interface: a backend that reads back the
// parameters of memcpy and memset graph nodes, as captured library calls
// make them. Without it such nodes cannot be compared or copied node by
// node (package internal/trace keeps them in a child graph).
type GraphNodeReader interface {
	GraphMemcpyNodeParams(n GraphNode) (MemcpyParams, error)
	GraphMemsetNodeParams(n GraphNode) (Memset, error)
}
