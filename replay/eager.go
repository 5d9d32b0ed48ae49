package replay

import (
	"context"
	"log/slog"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/graph"
)

// eager launches every command on the stream every step. It records
// nothing and is the reference the others must match bit for bit.
type eager struct{ base }

func newEager(spec Spec) (Strategy, error) { return &eager{newBase(spec)}, nil }

func (st *eager) Run(_ context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (Result, error) {
	n, err := st.cb.Launch(st.b, s, addrs)
	st.c.Launches += int64(n)
	return Result{}, err
}

func (st *eager) Close() error { return nil }

// AliasSafe: eager works in the caller's memory, the reference semantics.
func (st *eager) AliasSafe() bool { return true }

// base is what every strategy keeps of its Spec, and its counters.
type base struct {
	b     gpu.Backend
	cb    *graph.CommandBuffer
	log   *slog.Logger
	c     Counters
	falls Fallbacks
}

func newBase(spec Spec) base {
	return base{b: spec.Backend, cb: spec.Commands, log: spec.Logger}
}

// Counters returns what the strategy counted.
func (st *base) Counters() Counters { return st.c }

// Fallbacks says why the strategy's updates were refused (a copy).
func (st *base) Fallbacks() Fallbacks { return st.falls.clone() }

// recordCause is why a strategy records again a graph it recorded before
// (Counters.Rerecords and the counters that explain it).
type recordCause uint8

const (
	// causeMoved: an address the graph holds moved.
	causeMoved recordCause = iota
	// causeRefused: the backend refused an update (the refusal says why).
	causeRefused
	// causeRetry: a failed step left no usable graph.
	causeRetry
)

// refused logs a refused update, in full, at debug level; the re-record
// that replaces it is counted by rerecorded.
func (st *base) refused(what string, err error) {
	st.log.Debug(what+" refused; re-recording", "reason", refusalReason(err), "err", err)
}

// rerecorded counts a re-record and its cause; refusal is the refused
// update's error for causeRefused.
func (st *base) rerecorded(cause recordCause, refusal error) {
	st.c.Rerecords++
	switch cause {
	case causeMoved:
		st.c.MoveRerecords++
	case causeRefused:
		st.c.UpdateFallbacks++
		if st.falls.ByReason == nil {
			st.falls.ByReason = map[string]int64{}
		}
		st.falls.ByReason[refusalReason(refusal)]++
		st.falls.Last, st.falls.seq = refusal.Error(), fallbackSeq.Add(1)
	case causeRetry:
		st.c.RetryRerecords++
	}
}
