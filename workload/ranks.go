package workload

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/netsim"
	"github.com/stablegraph/stablegraph/internal/perrank"
	"github.com/stablegraph/stablegraph/rendezvous"
	"github.com/stablegraph/stablegraph/report"
)

// Ranks: running a workload with collectives (dp) on several ranks.
//
// Each rank runs the same workload, built with its own communicator
// (Config.Comm), on its communicator's device, with the same RunOptions, so
// that every rank runs the same strategies and steps and its collectives
// meet the other ranks' in the same order. With one process per GPU (CUDA,
// `stablegraph run --nproc`, or a launcher: torchrun, srun, mpirun), each
// process sets its rank up with JoinRank (or NewRank) and runs Run or Bench
// for it; with every rank in one process (the sim's devices), RunRanks and
// BenchRanks run them from one goroutine each.
//
// Setting a rank up from its launcher's environment:
//
//	l, err := rendezvous.FromEnvironment() // rank, world, rank 0's address, token
//	dev, err := l.Device(b.DeviceCount())  // the local rank's GPU
//	r, err := workload.JoinRank(ctx, b, dev, l.Config())
//	defer r.Close(ctx)
//	w, err := workload.New("dp", workload.Config{Comm: r.Comm})
//	rep, err := workload.Bench(ctx, r.Backend, w, nil, workload.RunOptions{Device: dev})

// Rank is this process's rank of a job of one process per GPU: its
// communicator, and the backend to compile and run its programs on.
type Rank struct {
	// Comm is the rank's communicator (Config.Comm of its workloads).
	Comm *sg.Comm
	// Backend is the backend given to JoinRank or NewRank. Compile the
	// rank's programs for it. On the sim, whose communicators otherwise
	// join devices of one process, NewRank gives the sim the rendezvous as
	// its collective transport (internal/netsim) until Close, so the rank
	// keeps every capability of the sim.
	Backend gpu.Backend
	// Group is the rendezvous JoinRank joined; nil for NewRank's, which
	// belongs to its caller.
	Group *rendezvous.Group

	// detach takes the transport NewRank gave the sim away again; nil when
	// it gave none.
	detach func() error
}

// JoinRank joins the rendezvous cfg describes (cfg.Rank of cfg.World) and
// sets the rank up on device dev of b as NewRank does. On error the other
// ranks are told and nothing is left open.
func JoinRank(ctx context.Context, b gpu.Backend, dev int, cfg rendezvous.Config) (*Rank, error) {
	g, err := rendezvous.Join(ctx, cfg)
	if err != nil {
		return nil, err
	}
	r, err := NewRank(ctx, b, dev, g)
	if err != nil {
		return nil, errors.Join(err, g.Close())
	}
	r.Group = g
	return r, nil
}

// NewRank sets up this process's rank of the joined group g on device dev
// of b: rank 0 makes the communicator's id (NCCL's unique id on CUDA) and
// broadcasts it, and every rank makes its communicator, which returns once
// all have. On error the group is aborted, so the other ranks stop too, and
// nothing is left open.
func NewRank(ctx context.Context, b gpu.Backend, dev int, g *rendezvous.Group) (*Rank, error) {
	var detach func() error
	fail := func(err error) (*Rank, error) {
		g.Abort(fmt.Sprintf("rank %d: %v", g.Rank(), err))
		if detach != nil {
			err = errors.Join(err, detach())
		}
		return nil, err
	}
	rb := b
	if s, ok := b.(*sim.Backend); ok && g.World() > 1 {
		if err := s.SetTransport(netsim.New(g)); err != nil {
			return fail(fmt.Errorf("workload: rank %d: the sim's collectives over the rendezvous: %w", g.Rank(), err))
		}
		detach = func() error { return s.SetTransport(nil) }
	}
	var id gpu.CommID
	if g.Rank() == 0 {
		var err error
		if id, err = sg.NewCommID(rb); err != nil {
			return fail(err)
		}
	}
	data, err := g.Broadcast(ctx, id[:])
	if err != nil {
		if detach != nil {
			err = errors.Join(err, detach())
		}
		return nil, err
	}
	if len(data) != len(id) {
		return fail(fmt.Errorf("rank 0 sent a communicator id of %d bytes, not %d", len(data), len(id)))
	}
	copy(id[:], data)
	comm, err := sg.NewComm(rb, dev, id, g.World(), g.Rank())
	if err != nil {
		return fail(err)
	}
	return &Rank{Comm: comm, Backend: rb, detach: detach}, nil
}

// Close waits, when the rank has its own group, until every rank has come
// to Close (so that none destroys its communicator while the others still
// run collectives), then closes the communicator and the group. Close the
// rank's executables first.
func (r *Rank) Close(ctx context.Context) error {
	var err error
	if r.Group != nil {
		err = r.Group.Barrier(ctx)
	}
	err = errors.Join(err, r.Comm.Close())
	if r.detach != nil {
		err = errors.Join(err, r.detach())
	}
	if r.Group != nil {
		err = errors.Join(err, r.Group.Close())
	}
	return err
}

// GatherReports collects every rank's report of one run over the group g
// (an all-gather of their JSON, without per-step samples) and returns them
// by rank, for Report.Ranks. Every rank of g calls it once, after its run;
// a rank that cannot run aborts the group instead, and the others' calls
// fail with its reason.
func GatherReports(ctx context.Context, g *rendezvous.Group, rep *report.Report) ([]report.Report, error) {
	var buf bytes.Buffer
	own := *rep
	own.Ranks = nil
	if err := own.WriteJSON(&buf, false); err != nil {
		return nil, err
	}
	parts, err := g.AllGather(ctx, buf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("workload: gather the ranks' reports: %w", err)
	}
	out := make([]report.Report, len(parts))
	for r, p := range parts {
		got, err := report.ReadJSON(bytes.NewReader(p))
		if err != nil {
			return nil, fmt.Errorf("workload: rank %d's report: %w", r, err)
		}
		out[r] = *got
	}
	return out, nil
}

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
	err := perrank.Each(len(ws), func(r int) error {
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
	err := perrank.Each(len(ws), func(r int) error {
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

// Aligning the ranks' step times.
//
// A rank's step with collectives ends no sooner than the slowest rank's
// part of each collective: timed alone, a rank that starts early waits in
// the all-reduce for the others, and that wait (rank skew: the ranks'
// host times differ, a process is descheduled, one rank compiled or
// re-recorded longer) lands in its GPU time and latency as noise. So Run
// aligns the ranks of a communicator of more than one rank (rankBarrier):
//
//   - before each measured step, and before each batch of the wall-time
//     phase, the host waits for a barrier, an all-reduce of one value on
//     the step's stream: every rank's call then starts within the
//     barrier's own exit skew (NCCL's latency and the host's wake-up);
//   - inside the gate (stepTimer), behind the gate and before the start
//     event, a second barrier holds the device until every rank's gate
//     has opened, so that every rank's device work starts together and
//     the GPU time is the step's work, not the wait for the slowest
//     rank's host. Its wait, the gate-to-start time, is the skew of the
//     ranks' calls, reported in the row's note; the latency leaves it out.
//
// The barriers are eager collectives, never captured: they do not count
// as captures in steady state, and every rank runs them at the same points
// of Run, so the order of collectives stays the same on every rank.

// rankBarrier is the barrier of one rank on one stream.
type rankBarrier struct {
	ctx context.Context
	b   gpu.Backend
	s   gpu.Stream
	exe *sg.Executable
}

// newRankBarrier compiles the barrier of comm's rank for stream s. Close
// it (after s has no barrier left to run) to release it.
func newRankBarrier(ctx context.Context, b gpu.Backend, comm *sg.Comm, s gpu.Stream) (*rankBarrier, error) {
	p := sg.NewProgram("rank-barrier")
	tok := p.Temp("token", 4)
	p.AllReduce(comm, tok.All(), tok.All(), gpu.Float32, gpu.Sum)
	exe, err := sg.Compile(ctx, b, p, sg.Options{Strategy: sg.StrategyEager, Device: comm.Device()})
	if err != nil {
		return nil, fmt.Errorf("workload: the ranks' barrier on %s: %w", comm, err)
	}
	return &rankBarrier{ctx: ctx, b: b, s: s, exe: exe}, nil
}

// enqueue puts the barrier on the stream: the stream goes on once every
// rank's barrier has run.
func (a *rankBarrier) enqueue() error {
	outs, err := a.exe.Run(a.ctx, a.s, nil)
	if err != nil {
		return fmt.Errorf("the ranks' barrier: %w", err)
	}
	outs.Release()
	return nil
}

// wait runs the barrier and waits for it: the host goes on once every
// rank has reached it.
func (a *rankBarrier) wait() error {
	if err := a.enqueue(); err != nil {
		return err
	}
	if err := a.b.StreamSynchronize(a.s); err != nil {
		return fmt.Errorf("the ranks' barrier: %w", err)
	}
	return nil
}

func (a *rankBarrier) Close() error { return a.exe.Close() }
