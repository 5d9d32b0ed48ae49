package workload

import (
	"context"
	"errors"
	"fmt"
	"sync"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/report"
)

// Ranks: running a workload with collectives (dp) on several ranks.
//
// Each rank runs the same workload, built with its own communicator
// (Config.Comm), on its communicator's device, with the same RunOptions, so
// that every rank runs the same strategies and steps and its collectives
// meet the other ranks' in the same order. With one process per GPU (CUDA,
// `stablegraph run --nproc`), each process runs Run or Bench for its rank;
// with every rank in one process (the sim's devices), RunRanks and
// BenchRanks run them from one goroutine each.

// ForRanks builds the workload name once per communicator of comms, with
// cfg otherwise the same: ranks[i] uses comms[i].
func ForRanks(name string, cfg Config, comms []*sg.Comm) ([]*Workload, error) {
	ws := make([]*Workload, len(comms))
	for i, c := range comms {
		cfg.Comm = c
		w, err := New(name, cfg)
		if err != nil {
			return nil, err
		}
		ws[i] = w
	}
	return ws, nil
}

// eachRank runs f for every rank in its own goroutine, and returns the
// ranks' errors joined, each naming its rank.
func eachRank(n int, f func(r int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			if err := f(r); err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// rankOptions are opts for rank w: its communicator's device, and the
// collective watch.
func rankOptions(w *Workload, opts RunOptions) (RunOptions, *CollectiveWatch) {
	if w.Comm != nil {
		opts.Device = w.Comm.Device()
	}
	watch := WatchCollectives(w.Comm, &opts)
	return opts, watch
}

// RunRanks runs Run for every workload of ws (the ranks of one
// communicator, as ForRanks builds them) concurrently, each on its
// communicator's device, and returns the results by rank. Each result's
// Note says how many collectives the measured steps captured.
func RunRanks(ctx context.Context, b gpu.Backend, ws []*Workload, opts RunOptions) ([]*RunResult, error) {
	out := make([]*RunResult, len(ws))
	err := eachRank(len(ws), func(r int) error {
		o, watch := rankOptions(ws[r], opts)
		res, err := Run(ctx, b, ws[r], o)
		if err != nil {
			return err
		}
		watch.annotate(&res.Result)
		out[r] = res
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// BenchRanks runs Bench for every workload of ws concurrently, each on its
// communicator's device, and returns the reports by rank, annotated by
// CollectiveWatch.Annotate.
func BenchRanks(ctx context.Context, b gpu.Backend, ws []*Workload, strategies []sg.Strategy, opts RunOptions) ([]*report.Report, error) {
	out := make([]*report.Report, len(ws))
	err := eachRank(len(ws), func(r int) error {
		o, watch := rankOptions(ws[r], opts)
		rep, err := Bench(ctx, b, ws[r], strategies, o)
		if err != nil {
			return err
		}
		watch.Annotate(rep)
		out[r] = rep
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// CollectiveWatch counts the collectives a communicator captures during
// the measured steps of each strategy's run, so that a report can show
// that a steady state captures none. It follows the steps through
// RunOptions.Progress; measured steps start after the warm-up (after the
// first step when there is none).
//
// A CollectiveWatch is safe for use by one Run or Bench at a time.
type CollectiveWatch struct {
	comm   *sg.Comm
	warmup int
	mu     sync.Mutex
	start  map[sg.Strategy]int64
	counts map[sg.Strategy]int64
}

// WatchCollectives returns a watch of comm's captures and makes opts report
// steps to it (before calling opts.Progress, if set). With comm nil it
// watches nothing and leaves opts alone.
func WatchCollectives(comm *sg.Comm, opts *RunOptions) *CollectiveWatch {
	w := &CollectiveWatch{comm: comm, warmup: max(opts.Warmup, 1),
		start: map[sg.Strategy]int64{}, counts: map[sg.Strategy]int64{}}
	if comm == nil {
		return w
	}
	inner := opts.Progress
	opts.Progress = func(s sg.Strategy, step, total int) {
		w.step(s, step, total)
		if inner != nil {
			inner(s, step, total)
		}
	}
	return w
}

func (w *CollectiveWatch) step(s sg.Strategy, step, total int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	captured := w.comm.Stats().Captured
	if step == min(w.warmup, total) {
		w.start[s] = captured
	}
	if step == total {
		// Summed over runs of the same strategy (Bench's floor row reruns
		// one), so that none hides another's captures.
		w.counts[s] += captured - w.start[s]
	}
}

// Captured returns how many collectives the measured steps of strategy s
// captured, and false when s did not complete a run under the watch.
func (w *CollectiveWatch) Captured(s sg.Strategy) (int64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, ok := w.counts[s]
	return n, ok
}

// Annotate adds to the Note of each result of rep the collectives its
// measured steps captured. It does nothing for a watch of no communicator.
func (w *CollectiveWatch) Annotate(rep *report.Report) {
	for i := range rep.Results {
		w.annotate(&rep.Results[i])
	}
}

func (w *CollectiveWatch) annotate(r *report.Result) {
	if w.comm == nil {
		return
	}
	if n, ok := w.Captured(sg.Strategy(r.Strategy)); ok {
		r.Note = joinNote(r.Note, fmt.Sprintf("collectives captured in steady state: %d", n))
	}
}
