package cuda

import (
	"errors"
	"fmt"
	"sync"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// Collectives: the CUDA backend implements gpu.Collectives with NCCL, loaded
// at the first collective call like cuBLAS (Config.LibNCCL, else
// STABLEGRAPH_LIBNCCL, else cu.NCCLCandidates). Without a libnccl every
// collective entry point returns an error wrapping gpu.ErrNotSupported that
// lists the places tried; the rest of the backend works as before.
//
// NCCL's model is one rank per GPU and, with CUDA graphs, one process per
// GPU: CommInit calls ncclCommInitRank on the device's primary context and
// blocks until every rank has joined (share the id with package rendezvous,
// whose deadline catches a rank that never starts). Collectives are enqueued
// on the caller's stream, with the device's context current; on a capturing
// stream NCCL captures them into the graph. Set NCCL_GRAPH_REGISTER=0 when
// graphs capture collectives over VMM memory on GPUs before Blackwell (the
// pool strategy), and keep NVLink SHARP off (NCCL_NVLS_ENABLE=0) on the
// project's machines.
//
// Errors keep NCCL's ncclResult_t name and number (gpu.Error.CodeName and
// Code) and its message, with ncclGetLastError's detail when the library has
// it.

var _ gpu.Collectives = (*Backend)(nil)

// ncclState is NCCL as loaded by one backend, and its communicators.
type ncclState struct {
	once sync.Once
	lib  *cu.NCCL
	err  error // why NCCL is not available (nil when it is)

	mu    sync.Mutex
	comms map[gpu.Comm]*ncclCommInfo
}

// ncclCommInfo is one rank's communicator. mu serialises its calls.
type ncclCommInfo struct {
	mu         sync.Mutex
	c          cu.NCCLComm
	dev        int
	rank, size int
}

// loadNCCL loads NCCL once; a failure is remembered and reported by every
// collective call.
func (b *Backend) loadNCCL(op string) (*cu.NCCL, error) {
	b.nccl.once.Do(func() {
		lib, err := cu.OpenNCCL(b.opts.ncclLibrary)
		if err != nil {
			b.nccl.err = err
			b.opts.log.Debug("cuda: NCCL unavailable; collectives are not supported", "err", err)
			return
		}
		var v int32
		lib.GetVersion(&v)
		b.nccl.lib = lib
		b.opts.log.Debug("cuda: NCCL loaded", "library", lib.Path, "version", v)
	})
	if b.nccl.err != nil {
		return nil, &gpu.Error{Op: op, Err: gpu.ErrNotSupported, Detail: "collectives need NCCL: " + b.nccl.err.Error()}
	}
	return b.nccl.lib, nil
}

// NCCLLibrary is the path of the loaded libnccl and its version code
// (22809 for 2.28.9), loading it if needed; the error says why there is
// none.
func (b *Backend) NCCLLibrary() (string, int, error) {
	lib, err := b.loadNCCL("NCCLLibrary")
	if err != nil {
		return "", 0, err
	}
	var v int32
	if r := lib.GetVersion(&v); r != cu.NCCLSuccess {
		return lib.Path, 0, ncclError(lib, "ncclGetVersion", r, 0)
	}
	return lib.Path, int(v), nil
}

// ncclSentinel maps an ncclResult_t to the gpu sentinel that says what the
// caller may do about it.
func ncclSentinel(r cu.NCCLResult) error {
	switch r {
	case cu.NCCLInvalidArgument:
		return gpu.ErrInvalidValue
	case cu.NCCLInvalidUsage:
		return gpu.ErrIllegalState
	case cu.NCCLInProgress:
		return gpu.ErrNotReady
	case cu.NCCLRemoteError, cu.NCCLUnhandledCudaError:
		// A peer failed, or CUDA did: the communicator cannot continue.
		return gpu.ErrDeviceLost
	case cu.NCCLNotLoaded:
		return gpu.ErrNotSupported
	}
	return gpu.ErrIllegalState // system and internal errors
}

// ncclError builds the error of a failed NCCL call, keeping the result's
// name and number.
func ncclError(lib *cu.NCCL, op string, r cu.NCCLResult, c cu.NCCLComm) error {
	e := &gpu.Error{Op: op, Code: int(r), CodeName: r.Name(), Err: ncclSentinel(r)}
	if r == cu.NCCLNotLoaded {
		e.Detail = "symbol not exported by " + lib.Path
		return e
	}
	e.Detail = lib.GetErrorString(r)
	if last := lib.GetLastError(c); last != "" {
		e.Detail += ": " + last
	}
	return e
}

// ncclCall runs one NCCL call on dev's context and checks its result.
func (b *Backend) ncclCall(lib *cu.NCCL, dev int, op string, c cu.NCCLComm, f func() cu.NCCLResult) error {
	return b.onDevice(dev, func() error {
		if r := f(); r != cu.NCCLSuccess {
			return ncclError(lib, op, r, c)
		}
		return nil
	})
}

// CommUniqueID implements gpu.Collectives (ncclGetUniqueId).
func (b *Backend) CommUniqueID() (gpu.CommID, error) {
	const op = "ncclGetUniqueId"
	lib, err := b.loadNCCL(op)
	if err != nil {
		return gpu.CommID{}, err
	}
	var id cu.NCCLUniqueID
	if r := lib.GetUniqueID(&id); r != cu.NCCLSuccess {
		return gpu.CommID{}, ncclError(lib, op, r, 0)
	}
	return gpu.CommID(id), nil
}

// CommInit implements gpu.Collectives (ncclCommInitRank on dev's context).
// It blocks until every rank has joined.
func (b *Backend) CommInit(dev int, id gpu.CommID, nranks, rank int) (gpu.Comm, error) {
	const op = "ncclCommInitRank"
	lib, err := b.loadNCCL(op)
	if err != nil {
		return 0, err
	}
	if _, err := b.device(op, dev); err != nil {
		return 0, err
	}
	if nranks < 1 || rank < 0 || rank >= nranks {
		return 0, errf(op, gpu.ErrInvalidValue, "rank %d of %d", rank, nranks)
	}
	nid := cu.NCCLUniqueID(id)
	var c cu.NCCLComm
	if err := b.ncclCall(lib, dev, op, 0, func() cu.NCCLResult { return lib.CommInitRank(&c, nranks, &nid, rank) }); err != nil {
		return 0, err
	}
	b.mu.Lock()
	h := gpu.Comm(b.newIDLocked())
	b.mu.Unlock()
	b.nccl.mu.Lock()
	defer b.nccl.mu.Unlock()
	if b.nccl.comms == nil {
		b.nccl.comms = map[gpu.Comm]*ncclCommInfo{}
	}
	b.nccl.comms[h] = &ncclCommInfo{c: c, dev: dev, rank: rank, size: nranks}
	return h, nil
}

// comm looks up a live communicator.
func (b *Backend) comm(op string, c gpu.Comm) (*cu.NCCL, *ncclCommInfo, error) {
	lib, err := b.loadNCCL(op)
	if err != nil {
		return nil, nil, err
	}
	b.nccl.mu.Lock()
	ci, ok := b.nccl.comms[c]
	b.nccl.mu.Unlock()
	if !ok {
		return nil, nil, errf(op, gpu.ErrInvalidHandle, "communicator %#x is not live", uint64(c))
	}
	return lib, ci, nil
}

// CommDestroy implements gpu.Collectives (ncclCommDestroy).
func (b *Backend) CommDestroy(c gpu.Comm) error {
	const op = "ncclCommDestroy"
	lib, ci, err := b.comm(op, c)
	if err != nil {
		return err
	}
	b.nccl.mu.Lock()
	delete(b.nccl.comms, c)
	b.nccl.mu.Unlock()
	ci.mu.Lock()
	defer ci.mu.Unlock()
	return b.ncclCall(lib, ci.dev, op, ci.c, func() cu.NCCLResult { return lib.CommDestroy(ci.c) })
}

// CommRank implements gpu.Collectives (ncclCommUserRank, ncclCommCount).
func (b *Backend) CommRank(c gpu.Comm) (rank, nranks int, err error) {
	const op = "ncclCommUserRank"
	lib, ci, err := b.comm(op, c)
	if err != nil {
		return 0, 0, err
	}
	ci.mu.Lock()
	defer ci.mu.Unlock()
	var r, n int32
	err = b.ncclCall(lib, ci.dev, op, ci.c, func() cu.NCCLResult {
		if res := lib.CommUserRank(ci.c, &r); res != cu.NCCLSuccess {
			return res
		}
		return lib.CommCount(ci.c, &n)
	})
	return int(r), int(n), err
}

func ncclType(op string, dt gpu.DataType) (cu.NCCLDataType, error) {
	switch dt {
	case gpu.Float32:
		return cu.NCCLFloat32, nil
	case gpu.Float64:
		return cu.NCCLFloat64, nil
	case gpu.Int32:
		return cu.NCCLInt32, nil
	case gpu.Int64:
		return cu.NCCLInt64, nil
	}
	return 0, errf(op, gpu.ErrInvalidValue, "unknown data type %v", dt)
}

func ncclOp(op string, o gpu.ReduceOp) (cu.NCCLRedOp, error) {
	switch o {
	case gpu.Sum:
		return cu.NCCLSum, nil
	case gpu.Max:
		return cu.NCCLMax, nil
	}
	return 0, errf(op, gpu.ErrInvalidValue, "unknown reduction %v", o)
}

// collective checks the stream and communicator of a collective and runs
// enqueue on the communicator's device.
func (b *Backend) collective(op string, c gpu.Comm, s gpu.Stream, dt gpu.DataType,
	enqueue func(lib *cu.NCCL, ci *ncclCommInfo, cs cu.Stream, t cu.NCCLDataType) cu.NCCLResult) error {
	lib, ci, err := b.comm(op, c)
	if err != nil {
		return err
	}
	dev, cs, err := b.stream(op, s)
	if err != nil {
		return err
	}
	if dev != ci.dev {
		return errf(op, gpu.ErrInvalidValue, "communicator of rank %d is on device %d, stream %#x on device %d", ci.rank, ci.dev, uint64(s), dev)
	}
	t, err := ncclType(op, dt)
	if err != nil {
		return err
	}
	ci.mu.Lock()
	defer ci.mu.Unlock()
	return b.ncclCall(lib, dev, op, ci.c, func() cu.NCCLResult { return enqueue(lib, ci, cs, t) })
}

// AllReduce implements gpu.Collectives (ncclAllReduce).
func (b *Backend) AllReduce(c gpu.Comm, send, recv gpu.DevicePtr, count uint64, dt gpu.DataType, op gpu.ReduceOp, s gpu.Stream) error {
	const name = "ncclAllReduce"
	o, err := ncclOp(name, op)
	if err != nil {
		return err
	}
	return b.collective(name, c, s, dt, func(lib *cu.NCCL, ci *ncclCommInfo, cs cu.Stream, t cu.NCCLDataType) cu.NCCLResult {
		return lib.AllReduce(cu.DevicePtr(send), cu.DevicePtr(recv), count, t, o, ci.c, cs)
	})
}

// ReduceScatter implements gpu.Collectives (ncclReduceScatter).
func (b *Backend) ReduceScatter(c gpu.Comm, send, recv gpu.DevicePtr, recvCount uint64, dt gpu.DataType, op gpu.ReduceOp, s gpu.Stream) error {
	const name = "ncclReduceScatter"
	o, err := ncclOp(name, op)
	if err != nil {
		return err
	}
	return b.collective(name, c, s, dt, func(lib *cu.NCCL, ci *ncclCommInfo, cs cu.Stream, t cu.NCCLDataType) cu.NCCLResult {
		return lib.ReduceScatter(cu.DevicePtr(send), cu.DevicePtr(recv), recvCount, t, o, ci.c, cs)
	})
}

// AllGather implements gpu.Collectives (ncclAllGather).
func (b *Backend) AllGather(c gpu.Comm, send, recv gpu.DevicePtr, sendCount uint64, dt gpu.DataType, s gpu.Stream) error {
	return b.collective("ncclAllGather", c, s, dt, func(lib *cu.NCCL, ci *ncclCommInfo, cs cu.Stream, t cu.NCCLDataType) cu.NCCLResult {
		return lib.AllGather(cu.DevicePtr(send), cu.DevicePtr(recv), sendCount, t, ci.c, cs)
	})
}

// Broadcast implements gpu.Collectives (ncclBroadcast).
func (b *Backend) Broadcast(c gpu.Comm, send, recv gpu.DevicePtr, count uint64, dt gpu.DataType, root int, s gpu.Stream) error {
	const name = "ncclBroadcast"
	return b.collective(name, c, s, dt, func(lib *cu.NCCL, ci *ncclCommInfo, cs cu.Stream, t cu.NCCLDataType) cu.NCCLResult {
		if root < 0 || root >= ci.size {
			return cu.NCCLInvalidArgument
		}
		return lib.Broadcast(cu.DevicePtr(send), cu.DevicePtr(recv), count, t, root, ci.c, cs)
	})
}

// liveComms counts the communicators still live.
func (b *Backend) liveComms() int {
	b.nccl.mu.Lock()
	defer b.nccl.mu.Unlock()
	return len(b.nccl.comms)
}

// closeComms releases the communicators still live at Close with
// ncclCommAbort (their peers may be gone: a destroy could wait for them),
// or ncclCommDestroy when the library has no abort.
func (b *Backend) closeComms() error {
	b.nccl.mu.Lock()
	comms := b.nccl.comms
	b.nccl.comms = nil
	b.nccl.mu.Unlock()
	lib := b.nccl.lib
	var errs []error
	for _, ci := range comms {
		op, f := "ncclCommAbort", lib.CommAbort
		if !lib.Has("ncclCommAbort") {
			op, f = "ncclCommDestroy", lib.CommDestroy
		}
		if err := b.ncclCall(lib, ci.dev, op, ci.c, func() cu.NCCLResult { return f(ci.c) }); err != nil {
			errs = append(errs, fmt.Errorf("communicator rank %d: %w", ci.rank, err))
		}
	}
	return errors.Join(errs...)
}
