package gpu

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error returned by a Backend wraps exactly one of
// them; test with errors.Is.
var (
	// ErrUnavailable: the backend cannot be opened here (no driver library,
	// no device). Open("auto") moves on to the next backend.
	ErrUnavailable = errors.New("gpu: backend unavailable")
	// ErrNotSupported: the device or driver lacks the capability (VMM, stream
	// memory operations, a graph update of this kind). The caller may fall
	// back to another way of doing the same work.
	ErrNotSupported = errors.New("gpu: not supported")
	// ErrOutOfMemory: an allocation, reservation or mapping could not be
	// satisfied. Nothing was allocated; the caller may free memory and retry.
	ErrOutOfMemory = errors.New("gpu: out of memory")
	// ErrInvalidValue: an argument is out of range, misaligned, of the wrong
	// kind or count. Nothing happened.
	ErrInvalidValue = errors.New("gpu: invalid value")
	// ErrInvalidHandle: a handle is zero, was never issued, or was already
	// destroyed (a double free is reported with this error). Nothing happened.
	ErrInvalidHandle = errors.New("gpu: invalid handle")
	// ErrIllegalState: the call is not valid in the object's current state
	// (ending a capture that was not begun, unmapping a range that is not
	// mapped, freeing a reservation that is still mapped).
	ErrIllegalState = errors.New("gpu: illegal state")
	// ErrIllegalAddress: device code touched memory that is unmapped, freed,
	// or not accessible from its device. It is sticky: the device reports it
	// from every later synchronizing call, as a GPU does after a fault.
	ErrIllegalAddress = errors.New("gpu: illegal address")
	// ErrCaptureInvalidated: a stream capture was broken by an operation not
	// allowed while capturing; the capture must be ended and discarded.
	ErrCaptureInvalidated = errors.New("gpu: stream capture invalidated")
	// ErrGraphUpdate: a whole-graph exec update or a per-node update was
	// refused; the error is an *UpdateError that says why. The executable
	// graph is unchanged and still usable.
	ErrGraphUpdate = errors.New("gpu: graph exec update refused")
	// ErrNotReady: the work a query or EventElapsed asks about has not
	// completed yet; ask again later.
	ErrNotReady = errors.New("gpu: not ready")
	// ErrNotFound: a named kernel or symbol does not exist in the module,
	// or an address lies in no live allocation (AddressRanger).
	ErrNotFound = errors.New("gpu: not found")
	// ErrTimeout: a wait passed its deadline.
	ErrTimeout = errors.New("gpu: timeout")
	// ErrDeviceLost: the device or driver failed in a way that cannot be
	// recovered in this process.
	ErrDeviceLost = errors.New("gpu: device lost")
	// ErrInjected: the sim backend failed this call on request (fault
	// injection). Tests use it to tell injected faults from real ones.
	ErrInjected = errors.New("gpu: injected fault")
	// ErrOutOfBounds: a range of device memory runs past the allocation
	// its start lies in, or lies in none (CheckBinding returns it, as an
	// *ExtentError; backends do not).
	ErrOutOfBounds = errors.New("gpu: range outside its allocation")
)

// Error is the error type backends return. It names the entry point that
// failed and wraps a sentinel; backends with native status codes keep them.
type Error struct {
	Op       string // entry point, e.g. "MemAlloc" or "cuMemAlloc_v2"
	Err      error  // one of the sentinels above
	Code     int    // native status code (CUresult), 0 when there is none
	CodeName string // native code name, e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Detail   string // what was wrong, in words
}

func (e *Error) Error() string {
	msg := e.Op + ": "
	if e.CodeName != "" {
		msg += fmt.Sprintf("%s (%d)", e.CodeName, e.Code)
	} else if e.Err != nil {
		msg += e.Err.Error()
	}
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf builds an *Error for op wrapping sentinel, with a formatted detail.
func Errorf(op string, sentinel error, format string, args ...any) error {
	return &Error{Op: op, Err: sentinel, Detail: fmt.Sprintf(format, args...)}
}

// FaultError reports an access by device code outside mapped, live and
// accessible memory. It wraps ErrIllegalAddress.
type FaultError struct {
	Device int
	Kernel string    // kernel (or operation) that faulted
	Addr   DevicePtr // first faulting address
	Size   uint64    // size of the faulting access
	Write  bool
	Reason string // "unmapped", "freed", "no access from device 1", ...
}

func (e *FaultError) Error() string {
	kind := "read"
	if e.Write {
		kind = "write"
	}
	return fmt.Sprintf("gpu: illegal address: %s %s of %d bytes at %#x on device %d: %s",
		e.Kernel, kind, e.Size, uint64(e.Addr), e.Device, e.Reason)
}

func (e *FaultError) Unwrap() error { return ErrIllegalAddress }

// UpdateResult says why a graph exec update was refused, mirroring
// CUgraphExecUpdateResult.
type UpdateResult int

const (
	UpdateSuccess           UpdateResult = iota
	UpdateFailed                         // generic failure
	UpdateTopologyChanged                // node count or edges differ
	UpdateNodeTypeChanged                // a node changed type
	UpdateFunctionChanged                // a kernel node changed function in a way not allowed
	UpdateParametersChanged              // a parameter that may not change did
	UpdateNotSupported                   // the node or its change is not updatable
	UpdateAttributesChanged              // node attributes differ
)

var updateResultNames = [...]string{
	"success", "error", "topology changed", "node type changed",
	"function changed", "parameters changed", "not supported", "attributes changed",
}

func (r UpdateResult) String() string {
	if r >= 0 && int(r) < len(updateResultNames) {
		return updateResultNames[r]
	}
	return fmt.Sprintf("UpdateResult(%d)", int(r))
}

// UpdateError is returned when a graph exec update is refused: a whole-graph
// update (GraphExecUpdate) or a per-node one (GraphExec*NodeSetParams) asked
// for a change the backend cannot apply to an instantiated graph. Both
// backends return it for the same situations (see the Graphs interface);
// the exec graph is unchanged, and instantiating the new parameters
// afresh is the way forward. It wraps ErrGraphUpdate and nothing else, so
// callers tell a refusal (re-record) from bad input (ErrInvalidValue: fail)
// with errors.Is.
//
// Result says why, in CUDA's terms; Result.String() is a short stable
// reason for statistics and logs, Detail the particulars. Node is the
// offending node when one is known: for a per-node update the node named
// in the call, for a whole-graph update the node of the new graph. Code
// and CodeName keep the native status when a driver refused (CUDA:
// CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE for whole-graph updates,
// CUDA_ERROR_INVALID_VALUE for per-node ones); they are zero when the
// backend refused before asking the driver, as sim always does.
type UpdateError struct {
	Op       string
	Result   UpdateResult
	Node     GraphNode
	Detail   string
	Code     int    // native status code (CUresult), 0 when there is none
	CodeName string // native code name, e.g. "CUDA_ERROR_INVALID_VALUE"
}

func (e *UpdateError) Error() string {
	msg := fmt.Sprintf("%s: graph exec update refused: %s", e.Op, e.Result)
	if e.Node != 0 {
		msg += fmt.Sprintf(" at node %#x", uint64(e.Node))
	}
	if e.CodeName != "" {
		msg += fmt.Sprintf(" (%s %d)", e.CodeName, e.Code)
	}
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

func (e *UpdateError) Unwrap() error { return ErrGraphUpdate }
