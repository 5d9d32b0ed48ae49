package replay

import (
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/graph"
)

// callerGraph is what record, update and patch share: a graph recorded over
// the step's addresses and launched every step. They differ only in how
// they bring it up to date when addresses move (record.go, update.go,
// patch.go).
type callerGraph struct {
	base
	// patchable records traced commands so that they can be patched
	// (patch): differential tracing proves their templates.
	patchable bool
	// copies, when it names kernels, records memcpy and memset commands
	// over bound buffers as copy and fill kernels (patch:
	// graph.InstantiateOptions; its Patch is patchable's).
	copies graph.InstantiateOptions
	x      *graph.Exec // nil before the first step and after a failed patch
}

// record records and instantiates the commands at addrs, replacing the
// current exec graph only once the new one exists: a failure leaves the
// old one in place, consistent with the addresses it holds. A record after
// the first is counted as a re-record for cause (refusal: the refused
// update, for causeRefused).
func (st *callerGraph) record(addrs []gpu.DevicePtr, cause recordCause, refusal error) error {
	o := st.copies
	o.Patch = st.patchable
	x, err := st.cb.InstantiateWith(st.b, addrs, o)
	if err != nil {
		return err
	}
	st.countRecord(st.c.Records > 0, cause, refusal)
	err = st.dropExec()
	st.x = x
	return err
}

// AliasSafe: record, update and patch work in the caller's memory, as
// eager does.
func (st *callerGraph) AliasSafe() bool { return true }

// launch launches the exec graph on s.
func (st *callerGraph) launch(s gpu.Stream) error {
	if err := st.x.Launch(st.b, s); err != nil {
		return err
	}
	st.c.GraphLaunches++
	return nil
}

func (st *callerGraph) dropExec() error {
	if st.x == nil {
		return nil
	}
	err := st.x.Destroy(st.b)
	st.x = nil
	return err
}

// Close destroys the exec graph.
func (st *callerGraph) Close() error { return st.dropExec() }
