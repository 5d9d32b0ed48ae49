package replay

import (
	"log/slog"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/graph"
)

// base is what every strategy keeps of its Spec, and its counters. Every
// graph a strategy records is counted by countRecord, with its cause: it
// is the one place that counts Records, Rerecords and the counters that
// explain them, and refusals by reason (Fallbacks), so that Rerecords =
// MoveRerecords + UpdateFallbacks + RetryRerecords always holds and every
// refused update reaches Stats.Fallbacks (TestEveryRecordCounted checks
// every strategy; TestRecordCountedInOnePlace that nothing else counts).
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

// recordCause is why a strategy records a graph again, once it has
// recorded it before (Counters.Rerecords and the counters that explain
// it).
type recordCause uint8

const (
	// causeMoved: an address the graph holds moved (a state rebound, or
	// under record any move).
	causeMoved recordCause = iota
	// causeRefused: the backend refused an update (the refusal says why).
	causeRefused
	// causeRetry: a failed step left no usable graph.
	causeRetry
)

// refused logs a refused update, in full, at debug level; the record that
// replaces it is counted, with the refusal, by countRecord.
func (st *base) refused(what string, err error) {
	st.log.Debug(what+" refused; re-recording", "reason", refusalReason(err), "err", err)
}

// countRecord counts a graph recorded and instantiated. again says
// whether it replaces one recorded before for the same addresses' layout:
// then it is a re-record, counted for cause (refusal: the refused update,
// for causeRefused); the first recording of a layout has no cause.
func (st *base) countRecord(again bool, cause recordCause, refusal error) {
	st.c.Records++
	if !again {
		return
	}
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
	st.log.Debug("re-recorded the step graph", "cause", cause.String())
}

func (c recordCause) String() string {
	switch c {
	case causeMoved:
		return "moved"
	case causeRefused:
		return "refused"
	}
	return "retry"
}
