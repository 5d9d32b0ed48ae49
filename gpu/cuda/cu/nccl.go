package cu

import (
	"encoding/binary"
	"strconv"
	"unsafe"

	"github.com/ebitengine/purego"
)

// NCCL is a loaded libnccl with its symbols resolved (nccl.h of NCCL 2.x).
//
// NCCL uses the CUDA device of the context current on the calling thread:
// the safe layer makes the communicator's device current for every call. A
// communicator must not be used from two goroutines at once (NCCL's rule);
// the safe layer serialises.
type NCCL struct {
	Path   string
	handle uintptr
	fns    []uintptr

	// The functions that return C strings, bound by purego (which copies
	// the string): nil when the symbol is missing.
	errorString func(int32) string
	lastError   func(uintptr) string
}

// NCCLComm is ncclComm_t.
type NCCLComm uintptr

// NCCLUniqueID is ncclUniqueId: 128 opaque bytes.
type NCCLUniqueID [128]byte

// NCCLResult is ncclResult_t.
type NCCLResult int32

// ncclResult_t values (nccl.h).
const (
	NCCLSuccess            NCCLResult = 0
	NCCLUnhandledCudaError NCCLResult = 1
	NCCLSystemError        NCCLResult = 2
	NCCLInternalError      NCCLResult = 3
	NCCLInvalidArgument    NCCLResult = 4
	NCCLInvalidUsage       NCCLResult = 5
	NCCLRemoteError        NCCLResult = 6
	NCCLInProgress         NCCLResult = 7
	// NCCLNotLoaded: the symbol is missing from the loaded library (never
	// returned by NCCL itself).
	NCCLNotLoaded NCCLResult = -1
)

var ncclResultNames = map[NCCLResult]string{
	NCCLSuccess:            "ncclSuccess",
	NCCLUnhandledCudaError: "ncclUnhandledCudaError",
	NCCLSystemError:        "ncclSystemError",
	NCCLInternalError:      "ncclInternalError",
	NCCLInvalidArgument:    "ncclInvalidArgument",
	NCCLInvalidUsage:       "ncclInvalidUsage",
	NCCLRemoteError:        "ncclRemoteError",
	NCCLInProgress:         "ncclInProgress",
	NCCLNotLoaded:          "STABLEGRAPH_SYMBOL_NOT_LOADED",
}

// Name is the C enum name of r.
func (r NCCLResult) Name() string {
	if n, ok := ncclResultNames[r]; ok {
		return n
	}
	return "ncclResult_t(" + strconv.Itoa(int(r)) + ")"
}

func (r NCCLResult) String() string { return r.Name() }

// NCCLDataType is ncclDataType_t.
type NCCLDataType int32

const (
	NCCLInt32   NCCLDataType = 2
	NCCLInt64   NCCLDataType = 4
	NCCLFloat32 NCCLDataType = 7
	NCCLFloat64 NCCLDataType = 8
)

// NCCLRedOp is ncclRedOp_t.
type NCCLRedOp int32

const (
	NCCLSum NCCLRedOp = 0
	NCCLMax NCCLRedOp = 2
)

type ncclSym int

const (
	ncclGetVersion ncclSym = iota
	ncclGetUniqueID
	ncclCommInitRank
	ncclCommDestroy
	ncclCommAbort
	ncclCommCount
	ncclCommUserRank
	ncclCommGetAsyncError
	ncclGetErrorString
	ncclGetLastError
	ncclAllReduce
	ncclReduceScatter
	ncclAllGather
	ncclBroadcast
	numNCCLSyms
)

var ncclSyms = [numNCCLSyms]symSpec{
	ncclGetVersion:        {names: []string{"ncclGetVersion"}, required: true},
	ncclGetUniqueID:       {names: []string{"ncclGetUniqueId"}, required: true},
	ncclCommInitRank:      {names: []string{"ncclCommInitRank"}, required: true},
	ncclCommDestroy:       {names: []string{"ncclCommDestroy"}, required: true},
	ncclCommAbort:         {names: []string{"ncclCommAbort"}},
	ncclCommCount:         {names: []string{"ncclCommCount"}, required: true},
	ncclCommUserRank:      {names: []string{"ncclCommUserRank"}, required: true},
	ncclCommGetAsyncError: {names: []string{"ncclCommGetAsyncError"}},
	ncclGetErrorString:    {names: []string{"ncclGetErrorString"}, required: true},
	ncclGetLastError:      {names: []string{"ncclGetLastError"}},
	ncclAllReduce:         {names: []string{"ncclAllReduce"}, required: true},
	ncclReduceScatter:     {names: []string{"ncclReduceScatter"}, required: true},
	ncclAllGather:         {names: []string{"ncclAllGather"}, required: true},
	ncclBroadcast:         {names: []string{"ncclBroadcast"}, required: true},
}

// NCCL is usually not on the loader's path either: toolkits and system
// packages put it in the library directories, PyTorch's wheels in
// site-packages/nvidia/nccl/lib (the path on this project's GPU machines is
// listed).
var ncclSpec = libSpec{
	what:  "libnccl",
	names: []string{"libnccl.so.2", "libnccl.so"},
	dirs: []string{
		"/usr/lib/x86_64-linux-gnu",
		"/usr/lib64",
		"/usr/local/cuda/lib64",
		"/usr/local/cuda/targets/x86_64-linux/lib",
		"/usr/local/nccl/lib",
		"/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib",
	},
}

// NCCLCandidates is Candidates for libnccl.
func NCCLCandidates(explicit string) []string { return ncclSpec.candidates(explicit) }

// OpenNCCL loads libnccl: the file named by explicit, or else the first of
// NCCLCandidates("") that loads. Cached per explicit path; a failure is a
// *LoadError listing every place tried.
func OpenNCCL(explicit string) (*NCCL, error) {
	cache.Lock()
	defer cache.Unlock()
	if n, ok := cache.nccl[explicit]; ok {
		return n, nil
	}
	h, path, fns, err := resolve(ncclSpec, explicit, ncclSyms[:])
	if err != nil {
		return nil, err
	}
	n := &NCCL{Path: path, handle: h, fns: fns}
	if fn := fns[ncclGetErrorString]; fn != 0 {
		purego.RegisterFunc(&n.errorString, fn)
	}
	if fn := fns[ncclGetLastError]; fn != 0 {
		purego.RegisterFunc(&n.lastError, fn)
	}
	if cache.nccl == nil {
		cache.nccl = map[string]*NCCL{}
	}
	cache.nccl[explicit] = n
	return n, nil
}

// call: see Driver.call.
//
//go:uintptrescapes
func (n *NCCL) call(s ncclSym, args ...uintptr) NCCLResult {
	fn := n.fns[s]
	if fn == 0 {
		return NCCLNotLoaded
	}
	r, _, _ := purego.SyscallN(fn, args...)
	return NCCLResult(int32(uint32(r)))
}

// Has reports whether the NCCL function name was resolved.
func (n *NCCL) Has(name string) bool {
	for i, s := range ncclSyms {
		for _, x := range s.names {
			if x == name {
				return n.fns[i] != 0
			}
		}
	}
	return false
}

// GetVersion returns NCCL's version code (22809 for 2.28.9).
func (n *NCCL) GetVersion(v *int32) NCCLResult {
	return n.call(ncclGetVersion, uintptr(unsafe.Pointer(v)))
}

func (n *NCCL) GetUniqueID(id *NCCLUniqueID) NCCLResult {
	return n.call(ncclGetUniqueID, uintptr(unsafe.Pointer(id)))
}

// CommInitRank is ncclCommInitRank(ncclComm_t* comm, int nranks,
// ncclUniqueId commId, int rank). The id is a 128-byte struct passed by
// value: the x86-64 System V ABI passes it in memory, on the stack, while
// the integer arguments after it still take the next free registers. So
// comm, nranks and rank go in the first three integer registers, the
// other three get zeros, and the id's sixteen 8-byte words are the first
// stack arguments, in order, exactly where the callee reads the struct.
func (n *NCCL) CommInitRank(comm *NCCLComm, nranks int, id *NCCLUniqueID, rank int) NCCLResult {
	args := make([]uintptr, 0, 6+16)
	args = append(args, uintptr(unsafe.Pointer(comm)), uintptr(int32(nranks)), uintptr(int32(rank)), 0, 0, 0)
	for i := 0; i < len(id); i += 8 {
		args = append(args, uintptr(binary.LittleEndian.Uint64(id[i:])))
	}
	return n.call(ncclCommInitRank, args...)
}

func (n *NCCL) CommDestroy(c NCCLComm) NCCLResult { return n.call(ncclCommDestroy, uintptr(c)) }

// CommAbort frees c's resources without waiting for the peers.
func (n *NCCL) CommAbort(c NCCLComm) NCCLResult { return n.call(ncclCommAbort, uintptr(c)) }

func (n *NCCL) CommCount(c NCCLComm, count *int32) NCCLResult {
	return n.call(ncclCommCount, uintptr(c), uintptr(unsafe.Pointer(count)))
}

func (n *NCCL) CommUserRank(c NCCLComm, rank *int32) NCCLResult {
	return n.call(ncclCommUserRank, uintptr(c), uintptr(unsafe.Pointer(rank)))
}

// CommGetAsyncError reports an error of c's work in flight (a peer lost).
func (n *NCCL) CommGetAsyncError(c NCCLComm, r *NCCLResult) NCCLResult {
	return n.call(ncclCommGetAsyncError, uintptr(c), uintptr(unsafe.Pointer(r)))
}

// GetErrorString is NCCL's description of r.
func (n *NCCL) GetErrorString(r NCCLResult) string {
	if n.errorString == nil || r == NCCLNotLoaded {
		return ""
	}
	return n.errorString(int32(r))
}

// GetLastError is NCCL's message about the last error on c (0: any
// communicator), "" when the library has no ncclGetLastError.
func (n *NCCL) GetLastError(c NCCLComm) string {
	if n.lastError == nil {
		return ""
	}
	return n.lastError(uintptr(c))
}

func (n *NCCL) AllReduce(send, recv DevicePtr, count uint64, dt NCCLDataType, op NCCLRedOp, c NCCLComm, s Stream) NCCLResult {
	return n.call(ncclAllReduce, uintptr(send), uintptr(recv), uintptr(count), uintptr(dt), uintptr(op), uintptr(c), uintptr(s))
}

func (n *NCCL) ReduceScatter(send, recv DevicePtr, recvCount uint64, dt NCCLDataType, op NCCLRedOp, c NCCLComm, s Stream) NCCLResult {
	return n.call(ncclReduceScatter, uintptr(send), uintptr(recv), uintptr(recvCount), uintptr(dt), uintptr(op), uintptr(c), uintptr(s))
}

func (n *NCCL) AllGather(send, recv DevicePtr, sendCount uint64, dt NCCLDataType, c NCCLComm, s Stream) NCCLResult {
	return n.call(ncclAllGather, uintptr(send), uintptr(recv), uintptr(sendCount), uintptr(dt), uintptr(c), uintptr(s))
}

func (n *NCCL) Broadcast(send, recv DevicePtr, count uint64, dt NCCLDataType, root int, c NCCLComm, s Stream) NCCLResult {
	return n.call(ncclBroadcast, uintptr(send), uintptr(recv), uintptr(count), uintptr(dt), uintptr(int32(root)), uintptr(c), uintptr(s))
}
