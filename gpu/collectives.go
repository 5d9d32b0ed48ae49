package gpu

import "fmt"

// Collectives is an optional interface: a backend that can run collective
// operations across ranks (NCCL on CUDA; simulated devices in one process on
// sim). Use CollectivesOf to get it; a backend without it returns
// ErrNotSupported there, and programs with collective commands fail to
// compile on it.
//
// The model is NCCL's: every rank of a communicator calls the same
// collectives in the same order, each on its own stream; a collective
// completes on a rank's stream once every rank has reached it. Collectives
// enqueued on a capturing stream are captured into the graph, like kernels.
//
// A Comm is used by one rank; calls on one Comm must not race (NCCL's rule).
type Collectives interface {
	// CommUniqueID makes the id that every rank passes to CommInit (NCCL:
	// ncclGetUniqueId on rank 0, shared out of band).
	CommUniqueID() (CommID, error)
	// CommInit joins rank (0 <= rank < nranks) of the communicator named
	// id, using device dev. It blocks until all nranks ranks have joined.
	CommInit(dev int, id CommID, nranks, rank int) (Comm, error)
	CommDestroy(c Comm) error
	// CommRank reports the communicator's rank and size.
	CommRank(c Comm) (rank, nranks int, err error)

	// AllReduce reduces count elements of every rank's send into every
	// rank's recv (send == recv is in place).
	AllReduce(c Comm, send, recv DevicePtr, count uint64, dt DataType, op ReduceOp, s Stream) error
	// ReduceScatter reduces nranks*recvCount elements of send and leaves
	// rank r's block of recvCount elements in recv.
	ReduceScatter(c Comm, send, recv DevicePtr, recvCount uint64, dt DataType, op ReduceOp, s Stream) error
	// AllGather gathers sendCount elements from every rank into recv,
	// rank r's at offset r*sendCount.
	AllGather(c Comm, send, recv DevicePtr, sendCount uint64, dt DataType, s Stream) error
	// Broadcast copies count elements of root's send into every rank's recv.
	Broadcast(c Comm, send, recv DevicePtr, count uint64, dt DataType, root int, s Stream) error
}

// CommID names a communicator; it is NCCL's 128-byte unique id.
type CommID [128]byte

// Comm is one rank's handle on a communicator.
type Comm uint64

// DataType is the element type of a collective.
type DataType int

const (
	Float32 DataType = iota + 1
	Float64
	Int32
	Int64
)

// Size is the element size in bytes.
func (d DataType) Size() int {
	switch d {
	case Float32, Int32:
		return 4
	case Float64, Int64:
		return 8
	}
	return 0
}

func (d DataType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	}
	return fmt.Sprintf("DataType(%d)", int(d))
}

// ReduceOp is the reduction of AllReduce and ReduceScatter.
type ReduceOp int

const (
	Sum ReduceOp = iota + 1
	Max
)

func (o ReduceOp) String() string {
	switch o {
	case Sum:
		return "sum"
	case Max:
		return "max"
	}
	return fmt.Sprintf("ReduceOp(%d)", int(o))
}
