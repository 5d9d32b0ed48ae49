package stablegraph

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/graph"
)

// strategy is one way of turning a step's buffer addresses into device
// work. The executable owns one, chosen by newStrategy, and calls it with
// its mutex held, so a strategy needs no locking of its own (pool's leases,
// released from any goroutine, have their own).
type strategy interface {
	// run enqueues one step on s with every buffer at addrs (the
	// executable's vector, rewritten every step: copy what must be kept).
	// After an error the strategy must still be usable: the next run
	// either reuses a consistent graph or records afresh.
	run(ctx context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (stepResult, error)
	// close releases what the strategy holds. The executable has waited
	// for the last step.
	close() error
}

// stepResult is what a step hands back beyond the caller's own buffers.
type stepResult struct {
	// outs, when not nil, are where the outputs are (per output of the
	// executable, in declaration order) instead of the bound addresses.
	outs []gpu.DevicePtr
	// lease, when not nil, holds the memory of outs for the caller.
	lease *lease
}

// acquirer is implemented by strategies whose next step may have to wait
// for a resource (a pool slot). The executable calls acquire with its lock
// held, right before run; nil means run can start at once. Otherwise the
// executable drops its lock, calls the function returned, which waits until
// the step may be able to start (ctx carries the deadline,
// Options.SlotWait), and tries again.
type acquirer interface {
	acquire() func(ctx context.Context) error
}

// outputLeaser is implemented by strategies that may hand out their own
// memory for outputs; the outputs need not be bound when it says so.
type outputLeaser interface {
	leasesOutputs() bool
}

// strategyEnv is what strategies share with their executable.
type strategyEnv struct {
	b     gpu.Backend
	cb    *graph.CommandBuffer
	stats *Counters
	log   *slog.Logger
}

// newStrategy is the one place a Strategy becomes an implementation:
// StrategyAuto chooses here (see auto.go), and the memory a strategy holds
// is added to the executable's accounting here.
func newStrategy(e *Executable, s Strategy) (strategy, Choice, error) {
	if s == StrategyAuto {
		return chooseStrategy(e)
	}
	st, err := buildStrategy(e, s)
	if err != nil {
		return nil, Choice{}, err
	}
	return st, Choice{Requested: s, Strategy: s, Reason: "requested"}, nil
}

// buildStrategy makes strategy s for e, releasing what it made on error.
func buildStrategy(e *Executable, s Strategy) (strategy, error) {
	env := strategyEnv{b: e.b, cb: e.cb, stats: &e.mu.stats.Counters, log: e.log}
	switch s {
	case StrategyEager:
		return &eager{env}, nil
	case StrategyRecord:
		return &recorder{strategyEnv: env}, nil
	case StrategyUpdate:
		return &recorder{strategyEnv: env, update: true}, nil
	case StrategyPatch:
		return &recorder{strategyEnv: env, patch: true}, nil
	case StrategyStable:
		st, bytes, err := newStable(e, env)
		if err != nil {
			return nil, err
		}
		e.mem.Persistent = bytes
		return st, nil
	case StrategyPool:
		p, bytes, err := newPool(e, env)
		if err != nil {
			return nil, err
		}
		e.mem.Slots, e.mem.SlotCount = bytes, len(p.slots)
		return p, nil
	}
	return nil, fmt.Errorf("strategy %q is not implemented", s)
}

// eager launches every command every step.
type eager struct{ strategyEnv }

func (st *eager) run(_ context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (stepResult, error) {
	n, err := st.cb.Launch(st.b, s, addrs)
	st.stats.Launches += int64(n)
	return stepResult{}, err
}

func (st *eager) close() error { return nil }

// recorder runs a recorded graph and, when addresses move, brings it up to
// date by the strategy's means: re-recording (record), a whole-graph exec
// update (update), or per-node patches (patch). Whenever update or patch is
// refused by the driver, it re-records.
type recorder struct {
	strategyEnv
	update, patch bool
	x             *graph.Exec // nil before the first step and after a failed patch
}

func (st *recorder) run(_ context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (stepResult, error) {
	return stepResult{}, st.step(s, addrs)
}

func (st *recorder) step(s gpu.Stream, addrs []gpu.DevicePtr) error {
	switch {
	case st.x == nil:
		if err := st.record(addrs); err != nil {
			return err
		}
	case !st.cb.Moved(st.x.Addrs(), addrs):
		// Nothing moved: replay as is.
	case st.update:
		err := st.cb.Update(st.b, st.x, addrs)
		if err == nil {
			st.stats.GraphUpdates++
			break
		}
		if !errors.Is(err, gpu.ErrGraphUpdate) {
			return err
		}
		st.stats.UpdateFallbacks++
		st.log.Debug("graph exec update refused; re-recording", "reason", err)
		if err := st.record(addrs); err != nil {
			return err
		}
	case st.patch:
		n, err := st.cb.Patch(st.b, st.x, addrs)
		if err == nil {
			st.stats.PatchedNodes += int64(n)
			break
		}
		// Some nodes may be patched and others not: the exec graph is
		// no longer consistent with any address set.
		derr := st.dropExec()
		if !errors.Is(err, gpu.ErrGraphUpdate) || derr != nil {
			return errors.Join(err, derr)
		}
		st.stats.UpdateFallbacks++
		st.log.Debug("node update refused; re-recording", "reason", err)
		if err := st.record(addrs); err != nil {
			return err
		}
	default:
		if err := st.record(addrs); err != nil {
			return err
		}
	}
	if err := st.x.Launch(st.b, s); err != nil {
		return err
	}
	st.stats.GraphLaunches++
	return nil
}

// record records and instantiates the commands at addrs, replacing the
// current exec graph only once the new one exists: a failure leaves the
// old one in place, consistent with the addresses it holds.
func (st *recorder) record(addrs []gpu.DevicePtr) error {
	x, err := st.cb.Instantiate(st.b, addrs, st.patch)
	if err != nil {
		return err
	}
	if st.stats.Records > 0 {
		st.stats.Rerecords++
		st.log.Debug("re-recorded the step graph")
	}
	st.stats.Records++
	err = st.dropExec()
	st.x = x
	return err
}

func (st *recorder) dropExec() error {
	if st.x == nil {
		return nil
	}
	err := st.x.Destroy(st.b)
	st.x = nil
	return err
}

func (st *recorder) close() error { return st.dropExec() }
