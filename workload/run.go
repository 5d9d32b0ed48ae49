package workload

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"strings"
	"time"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/drivercost"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/safetensors"
	"github.com/stablegraph/stablegraph/report"
)

// RunOptions configure Run and Bench. The zero value is valid; defaults are
// applied in withDefaults.
type RunOptions struct {
	// Strategy is Run's strategy (Bench ignores it). Default eager.
	Strategy sg.Strategy
	// Device is the device ordinal. Default 0.
	Device int
	// Steps is the number of measured steps. Default 100.
	Steps int
	// Warmup is the number of steps run before the measured ones, outside
	// the statistics (their outputs are still compared). Default 0.
	Warmup int
	// Pattern is how the caller's buffers move. Default PingPong.
	Pattern Pattern
	// Seed seeds the caller's random pattern. Default 1. (The workload's
	// data has its own seed, Config.Seed.)
	Seed uint64
	// Reference holds the output digests of every step (warm-up included)
	// of an eager run of the same workload, seeds and pattern; when set,
	// Run compares each step's outputs with it. Bench sets it.
	Reference []Digest
	// WallBatches is how many batches of WallBatchSize back-to-back steps
	// are timed for WallUS after the checked steps: with fixed and
	// pingpong buffers the caller's next two sets; with random ones a set
	// of its own at fresh addresses for every step of a batch, allocated
	// before the batch and freed after it (not for gpt2-decode, whose
	// caches move step by step: the row's note says so). Default 10; -1
	// measures none.
	WallBatches int
	// WallBatchSize is the number of steps per wall-time batch. Default 10.
	WallBatchSize int
	// NoGate times every step with events around Executable.Run on the
	// idle stream, as before gating, even where the backend could hold
	// the stream behind a gate (gpu.StreamWaits): the GPU time then
	// includes the host time before the launch. For comparisons.
	NoGate bool
	// GateWatchdog bounds how long a step's stream is held behind its
	// gate: a strategy whose Run waits on the stream would wait for ever
	// otherwise. Such steps are marked (RunResult.Released), left out of
	// the GPU percentiles and named in the row's note. Default
	// DefaultGateWatchdog.
	GateWatchdog time.Duration
	// NoFloor leaves out Bench's replay-fixed row.
	NoFloor bool
	// PairFloor makes Bench time, after every pairBlock measured steps of
	// every row, as many steps of the floor (the same graph replayed with
	// nothing moving, an executable of its own kept for the whole bench)
	// the same way, behind one untimed step of it: every row then carries
	// the floor's host time, latency and GPU time taken at the same
	// moments as its own (report.PairedFloor), and its figures over the
	// floor are medians over the blocks of the differences and ratios of
	// their means, without each block's first step (the row's follows the
	// floor's block, whose weights may have evicted its own from the
	// card's L2). The host clock of a GPU machine drifts between regimes
	// that last many steps, which shifts rows run seconds apart by more
	// than the µs a row is judged on; a block and the floor's beside it
	// share a regime. It doubles the measured steps. Default false (the
	// bench command turns it on).
	PairFloor bool
	// NoProbe leaves out Bench's node update probe (the driver's own
	// price of a node update, drivercost.MeasureNodeUpdates), measured
	// before the strategies run so that every row's host time per moved
	// node sits beside it.
	NoProbe bool
	// ProbeParamBytes is the parameter block size of Bench's node update
	// probe (24 plus a multiple of 8). Default 360, about a cuBLAS GEMM
	// kernel's.
	ProbeParamBytes int
	// Costs, AutoBound, DeviceInline and DeviceHostLead are the
	// executable options of the same names (stablegraph.Options): the cost
	// model of auto and patch, what auto ranks its candidates by, device's
	// inline patcher and its first command moved from the host
	// (DeviceOptions.Inline, HostLead). Zero: the defaults.
	Costs          sg.Costs
	AutoBound      sg.AutoBound
	DeviceInline   bool
	DeviceHostLead bool
	// PinnedInputs makes the caller's inputs (the row's and the paired
	// floor's) in page-locked host memory, copied to the device by DMA
	// (CallerOptions.PinnedInputs). Default false: pageable memory.
	PinnedInputs bool
	// FreeThread lets Run's goroutine change OS threads between steps,
	// and its thread change CPUs, as any goroutine does. Default false:
	// Run holds its goroutine on one thread for all its steps (the paired
	// floor's too), and on Linux, for a workload of one rank, that thread
	// on the CPU it starts on, so that the host times are one core's calls
	// with the caches its last step left, not the scheduler's moves: a
	// thread woken after a wait on another core finds its caches cold. The
	// ranks of a communicator keep their threads but not a CPU (holdFor).
	FreeThread bool
	// Dump, when set, names a safetensors file that Run writes the last
	// step's inputs (those the caller writes: for gpt2-decode the tokens,
	// positions and the sequence in each row) and outputs to, by buffer
	// name, with the step's index in the metadata: what a peer needs to
	// check its own outputs against ours.
	Dump string
	// Progress, when set, is called after every step.
	Progress func(strategy sg.Strategy, step, total int)
	// Logger receives debug logs. Default slog.Default().
	Logger *slog.Logger

	// pair, set by Bench when PairFloor, times the floor's blocks.
	pair *floorPair
}

func (o RunOptions) withDefaults() RunOptions {
	if o.Strategy == "" {
		o.Strategy = sg.StrategyEager
	}
	if o.Steps <= 0 {
		o.Steps = 100
	}
	if o.Warmup < 0 {
		o.Warmup = 0
	}
	if o.Pattern == "" {
		o.Pattern = PingPong
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.WallBatches == 0 {
		o.WallBatches = 10
	}
	if o.WallBatchSize <= 0 {
		o.WallBatchSize = 10
	}
	if o.GateWatchdog <= 0 {
		o.GateWatchdog = DefaultGateWatchdog
	}
	if o.ProbeParamBytes <= 0 {
		o.ProbeParamBytes = defaultProbeParamBytes
	}
	return o
}

// The node update probe Bench measures: its parameter block size by
// default, its chain and its samples.
const (
	defaultProbeParamBytes = 360
	probeNodes             = 16
	probeSamples           = 20
)

// Digest is the SHA-256 of one step's outputs, concatenated in the order of
// Workload.Outputs: equal digests mean bit-identical outputs.
type Digest [sha256.Size]byte

// RunResult is the outcome of Run.
type RunResult struct {
	// Result is the strategy's row of a report. OutputsMatchEager is true
	// only when Reference was given and every step matched it.
	Result report.Result
	// Digests are the outputs of every step, warm-up included.
	Digests []Digest
	// Mismatch is the first step whose outputs differ from Reference, -1
	// when none does (or no reference was given).
	Mismatch int
	// Stats are the executable's counters over the measured steps.
	Stats sg.Counters
	// Released are the measured steps (indexes into the result's samples)
	// whose gate the watchdog opened (RunOptions.GateWatchdog): their GPU
	// samples include host time, and the GPU percentiles leave them out
	// unless every step was released (the note says which).
	Released []int
}

// Run compiles w with opts.Strategy on b and runs opts.Warmup + opts.Steps
// steps, each with the caller's buffers for that step: inputs written, then
// the step timed, then the outputs read back and digested. Host time is the
// clock around Executable.Run; GPU time, where the backend can hold a
// stream behind a gate (gpu.StreamWaits), is the device's work alone, and
// latency the time from the call to the end of that work (stepTimer says
// how; without the gate both are events around the call, and the row says
// so). Then WallBatches batches of steps run back to back for the wall
// time. Everything it creates is released before it returns.
func Run(ctx context.Context, b gpu.Backend, w *Workload, opts RunOptions) (_ *RunResult, err error) {
	opts = opts.withDefaults()
	if opts.Reference != nil && len(opts.Reference) < opts.Warmup+opts.Steps {
		return nil, fmt.Errorf("workload: reference has %d steps, the run %d", len(opts.Reference), opts.Warmup+opts.Steps)
	}
	var cleanup []func() error
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			err = errors.Join(err, cleanup[i]())
		}
	}()
	// Remap maps the caller's memory itself: its caller allocates every
	// buffer as a remappable allocation; every other strategy's, from a
	// bfc region.
	copts := CallerOptionsFor(opts.Strategy)
	copts.PinnedInputs = opts.PinnedInputs
	if opts.Pattern == Random && opts.WallBatches > 0 {
		copts.BatchSets = opts.WallBatchSize // measureWallFresh's batches
	}
	caller, err := NewCallerWith(b, opts.Device, w, opts.Pattern, opts.Seed, copts)
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, caller.Close)
	s, err := b.StreamCreate(opts.Device, gpu.StreamNonBlocking, 0)
	if err != nil {
		return nil, fmt.Errorf("workload: stream: %w", err)
	}
	cleanup = append(cleanup, func() error { return b.StreamDestroy(s) }, func() error { return b.StreamSynchronize(s) })
	var barrier *rankBarrier
	if w.Comm != nil && w.Comm.Size() > 1 {
		if barrier, err = newRankBarrier(ctx, b, w.Comm, s); err != nil {
			return nil, err
		}
		cleanup = append(cleanup, barrier.Close)
	}
	timer, releaseTimer, err := newStepTimer(b, opts.Device, s, opts, barrier)
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, releaseTimer)

	baseUsed, memInfo := usedMemory(b, opts.Device)
	sopts := sg.Options{Strategy: opts.Strategy, Device: opts.Device, Logger: opts.Logger, Costs: opts.Costs}
	sopts.Remap.Memory = caller.Remappable()
	sopts.Auto.Bound = opts.AutoBound
	sopts.DeviceStrategy.Inline = opts.DeviceInline
	sopts.DeviceStrategy.HostLead = opts.DeviceHostLead
	exe, err := compileWorkload(ctx, b, w, sopts)
	if err != nil {
		return nil, err
	}
	// Closing the executable waits for its last step; the stream is
	// synchronized before it is destroyed (cleanup runs newest first).
	cleanup = append(cleanup, exe.Close)

	if !opts.FreeThread {
		release := holdFor(w)
		cleanup = append(cleanup, func() error { release(); return nil })
	}
	res := &RunResult{Mismatch: -1}
	total := opts.Warmup + opts.Steps
	var (
		stepUS, hostUS, latencyUS, skewUS       []float64
		floorHostUS, floorLatencyUS, floorGPUUS []float64
		data                                    [][]byte // the last step's outputs
		before                                  sg.Counters
		peak                                    uint64
	)
	for step := range total {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		bind, err := caller.Bind(step)
		if err != nil {
			return nil, err
		}
		if step == opts.Warmup {
			// What Compile and the warm-up left (auto builds and probes
			// several candidates, and leaves the most) is collected here,
			// not by a collection that overlaps the first measured steps
			// of one strategy and not another's.
			runtime.GC()
			before = exe.Stats().Counters
			timer.measure() // releases are counted over the measured steps
		}
		var outs sg.Outputs
		measured := step >= opts.Warmup
		if measured {
			// The goroutine keeps its thread for a measured step: the
			// host clock then times one thread's calls.
			runtime.LockOSThread()
		}
		times, err := timer.step(func() error {
			var err error
			outs, err = exe.Run(ctx, s, bind)
			return err
		})
		if measured {
			runtime.UnlockOSThread()
		}
		if err != nil {
			return nil, fmt.Errorf("workload %s: step %d with %s: %w", w.Name, step, opts.Strategy, err)
		}
		// The outputs are read into the same buffers every step: a
		// step's readback makes no garbage for a collection to run under
		// the next measured steps.
		var d Digest
		d, data, err = digest(ctx, exe, w, outs, data)
		if err != nil {
			return nil, fmt.Errorf("workload %s: step %d: %w", w.Name, step, err)
		}
		if opts.Dump != "" && step == total-1 {
			meta := map[string]string{"workload": w.Desc, "step": fmt.Sprint(step), "strategy": string(opts.Strategy),
				"pattern": string(opts.Pattern), "backend": b.Name()}
			if err := safetensors.WriteFile(opts.Dump, slices.Concat(caller.lastInputs(step), w.outputTensors(data)), meta); err != nil {
				return nil, fmt.Errorf("workload %s: dump step %d: %w", w.Name, step, err)
			}
		}
		res.Digests = append(res.Digests, d)
		if opts.Reference != nil && res.Mismatch < 0 && d != opts.Reference[step] {
			res.Mismatch = step
			opts.Logger.Warn("outputs differ from eager", "workload", w.Name, "strategy", opts.Strategy, "step", step)
		}
		if memInfo {
			if used, ok := usedMemory(b, opts.Device); ok && used > baseUsed {
				peak = max(peak, used-baseUsed)
			}
		}
		if step >= opts.Warmup {
			stepUS = append(stepUS, us(times.gpu))
			hostUS = append(hostUS, us(times.host))
			latencyUS = append(latencyUS, us(times.latency))
			skewUS = append(skewUS, us(times.skew))
		}
		if n := step - opts.Warmup + 1; opts.pair != nil && n > 0 && (n%pairBlock == 0 || step == total-1) {
			// The floor's block beside the row's last (pairBlock steps,
			// or what the last block holds).
			runtime.LockOSThread()
			paired, err := opts.pair.block(ctx, (n-1)%pairBlock+1)
			runtime.UnlockOSThread()
			if err != nil {
				return nil, fmt.Errorf("workload %s: step %d with %s: %w", w.Name, step, opts.Strategy, err)
			}
			for _, p := range paired {
				floorHostUS = append(floorHostUS, us(p.host))
				floorLatencyUS = append(floorLatencyUS, us(p.latency))
				floorGPUUS = append(floorGPUUS, us(p.gpu))
			}
		}
		if opts.Progress != nil {
			opts.Progress(opts.Strategy, step+1, total)
		}
	}

	st := exe.Stats().Counters.Sub(before)
	r := report.Result{
		Strategy:          string(opts.Strategy),
		Rerecords:         st.Rerecords,
		GraphUpdates:      st.GraphUpdates,
		PatchedNodes:      st.PatchedNodes,
		TracesCaptured:    st.TracesCaptured,
		BytesCopied:       st.BytesCopied,
		Remaps:            st.Remaps,
		PeakDeviceBytes:   max(peak, exe.Memory().Total()),
		OutputsMatchEager: opts.Reference != nil && res.Mismatch < 0,
		MovedNodesPerStep: float64(st.PatchedNodes) / float64(max(opts.Steps, 1)),
	}
	r.SetSamples(stepUS, hostUS)
	r.SetLatency(latencyUS)
	if opts.pair != nil {
		r.PairedFloor = report.NewPairedFloor(pairBlock, hostUS, latencyUS, stepUS, floorHostUS, floorLatencyUS, floorGPUUS)
	}
	var wallNote string
	switch {
	case opts.WallBatches <= 0:
	case opts.Pattern != Random:
		wall, err := measureWall(ctx, b, exe, caller, s, total, opts, barrier)
		if err != nil {
			return nil, fmt.Errorf("workload %s: wall time with %s: %w", w.Name, opts.Strategy, err)
		}
		r.WallUS = &wall
	default:
		wall, err := measureWallFresh(ctx, b, exe, caller, s, total, opts, barrier)
		switch {
		case errors.Is(err, ErrNoBatch):
			wallNote = "no wall time at fresh addresses: " + err.Error()
		case err != nil:
			return nil, fmt.Errorf("workload %s: wall time at fresh addresses with %s: %w", w.Name, opts.Strategy, err)
		default:
			r.WallUS = &wall
		}
	}
	if c := exe.Choice(); c.Requested != c.Strategy {
		r.Note = fmt.Sprintf("ran %s: %s", c.Strategy, c.Reason)
	}
	if st.UpdateFallbacks > 0 {
		r.Note = joinNote(r.Note, fmt.Sprintf("%d updates or patches refused by the driver, re-recorded (since Compile, by reason: %s)",
			st.UpdateFallbacks, fallbackReasons(exe.Stats().Fallbacks)))
	}
	if n := st.MoveRerecords + st.RetryRerecords; n > 0 && opts.Strategy != sg.StrategyRecord {
		r.Note = joinNote(r.Note, fmt.Sprintf("re-records: %d for moved addresses (a state rebound), %d after a failed step", st.MoveRerecords, st.RetryRerecords))
	}
	if st.ProbeSteps > 0 {
		r.Note = joinNote(r.Note, fmt.Sprintf("%d of the measured steps probed auto's candidates (their work counts in no counter)", st.ProbeSteps))
	}
	if st.GraphUpdates > 0 && opts.Strategy == sg.StrategyPatch {
		r.Note = joinNote(r.Note, fmt.Sprintf("%d moves by a whole-graph update from the host template", st.GraphUpdates))
	}
	if st.DeviceUpdates > 0 || st.GraphUploads > 0 {
		// The device strategy: its pointer moves are no node updates.
		r.Note = joinNote(r.Note, fmt.Sprintf("%d pointers moved on the device (%.0f per step), %d nodes from the host (%.0f per step), %d uploads",
			st.DeviceUpdates, float64(st.DeviceUpdates)/float64(max(opts.Steps, 1)),
			st.PatchedNodes, float64(st.PatchedNodes)/float64(max(opts.Steps, 1)), st.GraphUploads))
	}
	if res.Mismatch >= 0 {
		r.Note = joinNote(r.Note, fmt.Sprintf("outputs differ from eager from step %d", res.Mismatch))
	}
	timer.describe(&r)
	if barrier != nil {
		r.Note = joinNote(r.Note, alignNote(timer.gated(), skewUS))
	}
	r.Note = joinNote(r.Note, wallNote)
	res.Result, res.Stats, res.Released = r, st, timer.releasedSteps()
	return res, nil
}

// measureWall times opts.WallBatches batches of opts.WallBatchSize steps run
// back to back, as a training loop runs them: no event, readback or input
// write between steps, one stream synchronization per batch. The bindings
// are the caller's next two sets (one for fixed), written once before.
// barrier, when not nil, aligns the ranks before each batch.
func measureWall(ctx context.Context, b gpu.Backend, exe *sg.Executable, caller *Caller, s gpu.Stream, next int, opts RunOptions, barrier *rankBarrier) (report.Percentiles, error) {
	var binds []sg.Bindings
	for i := range 2 {
		bind, err := caller.Bind(next + i)
		if err != nil {
			return report.Percentiles{}, err
		}
		binds = append(binds, bind)
	}
	perStep := make([]float64, 0, opts.WallBatches)
	for range opts.WallBatches {
		if barrier != nil {
			if err := barrier.wait(); err != nil {
				return report.Percentiles{}, err
			}
		}
		t0 := time.Now()
		for i := range opts.WallBatchSize {
			outs, err := exe.Run(ctx, s, binds[i%len(binds)])
			if err != nil {
				return report.Percentiles{}, err
			}
			outs.Release()
		}
		if err := b.StreamSynchronize(s); err != nil {
			return report.Percentiles{}, err
		}
		perStep = append(perStep, float64(time.Since(t0).Nanoseconds())/1e3/float64(opts.WallBatchSize))
	}
	return report.Summarize(perStep), nil
}

// measureWallFresh is measureWall at fresh addresses (Random): every step
// of a batch is bound to buffers of its own, allocated for the batch at new
// addresses with its inputs written (Caller.BindBatch) before the clock
// starts, run back to back, one stream synchronization per batch; the
// batch's buffers are freed after it. A caller that cannot bind a batch
// ahead returns ErrNoBatch. barrier, when not nil, aligns the ranks before
// each batch.
func measureWallFresh(ctx context.Context, b gpu.Backend, exe *sg.Executable, caller *Caller, s gpu.Stream, next int, opts RunOptions, barrier *rankBarrier) (report.Percentiles, error) {
	perStep := make([]float64, 0, opts.WallBatches)
	for range opts.WallBatches {
		binds, release, err := caller.BindBatch(next, opts.WallBatchSize)
		if err != nil {
			return report.Percentiles{}, err
		}
		next += opts.WallBatchSize
		if barrier != nil {
			if err := barrier.wait(); err != nil {
				return report.Percentiles{}, errors.Join(err, release())
			}
		}
		t0 := time.Now()
		for _, bind := range binds {
			outs, err := exe.Run(ctx, s, bind)
			if err != nil {
				// The steps before it may still run: wait for them
				// before their buffers go.
				return report.Percentiles{}, errors.Join(err, b.StreamSynchronize(s), release())
			}
			outs.Release()
		}
		if err := b.StreamSynchronize(s); err != nil {
			return report.Percentiles{}, errors.Join(err, release())
		}
		perStep = append(perStep, float64(time.Since(t0).Nanoseconds())/1e3/float64(len(binds)))
		if err := release(); err != nil {
			return report.Percentiles{}, err
		}
	}
	return report.Summarize(perStep), nil
}

// alignNote says how a rank's times were aligned with the other ranks',
// and, gated, how long its device waited for them (skew).
func alignNote(gated bool, skewUS []float64) string {
	const aligned = "ranks aligned by a barrier before each step and wall batch"
	if !gated {
		return aligned
	}
	p := report.Summarize(skewUS)
	return fmt.Sprintf("%s; skew p50 %s p90 %s us (the device's wait for the other ranks, outside GPU time and latency)",
		aligned, report.FormatUS(p.P50), report.FormatUS(p.P90))
}

// fallbackReasons lists the refusals by reason, "topology changed: 2, ...".
func fallbackReasons(f sg.Fallbacks) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(f.ByReason)) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, f.ByReason[k]))
	}
	return strings.Join(parts, ", ")
}

// us is d in microseconds.
func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func joinNote(a, b string) string {
	if a == "" || b == "" {
		return a + b
	}
	return a + "; " + b
}

// usedMemory is the device memory in use (total - free), and false when
// the backend cannot say.
func usedMemory(b gpu.Backend, dev int) (uint64, bool) {
	free, total, err := b.MemGetInfo(dev)
	if err != nil || total < free {
		return 0, false
	}
	return total - free, true
}

// digest reads a step's outputs and hashes them; it returns the outputs
// too, in the order of w.Outputs, read into into's buffers (grown where
// they are short).
func digest(ctx context.Context, exe *sg.Executable, w *Workload, outs sg.Outputs, into [][]byte) (Digest, [][]byte, error) {
	h := sha256.New()
	into = slices.Grow(into[:0], len(w.Outputs))[:len(w.Outputs)]
	for i, buf := range w.Outputs {
		data, err := exe.AppendOutput(ctx, into[i][:0], outs, buf)
		if err != nil {
			return Digest{}, into, fmt.Errorf("read output %s: %w", buf.Name(), err)
		}
		h.Write(data)
		into[i] = data
	}
	var d Digest
	h.Sum(d[:0])
	return d, into, nil
}

// BenchOrder is the order in which Bench runs strategies (nil or empty:
// stablegraph.Strategies()): eager first, listed or not, then each other
// strategy once, in the order given.
func BenchOrder(strategies []sg.Strategy) []sg.Strategy {
	if len(strategies) == 0 {
		strategies = sg.Strategies()
	}
	order := []sg.Strategy{sg.StrategyEager}
	for _, s := range strategies {
		if !slices.Contains(order, s) {
			order = append(order, s)
		}
	}
	return order
}

// RunsFloor says whether Bench with o adds the floor's run after the
// strategies': the graph replayed with nothing moving, when buffers move.
func (o RunOptions) RunsFloor() bool { return o.Pattern != Fixed && !o.NoFloor }

// Bench runs w with every strategy in strategies (default
// stablegraph.Strategies()), eager first whether listed or not, and returns
// the report. Every strategy's outputs are compared with eager's at every
// step. A strategy that fails is reported with its error in Note and
// OutputsMatchEager false, and the others still run; an eager failure ends
// the bench. When ctx is cancelled Bench returns the report of the
// strategies finished so far with ctx's error.
func Bench(ctx context.Context, b gpu.Backend, w *Workload, strategies []sg.Strategy, opts RunOptions) (_ *report.Report, err error) {
	opts = opts.withDefaults()
	order := BenchOrder(strategies)
	props, err := b.DeviceProps(opts.Device)
	if err != nil {
		return nil, fmt.Errorf("workload: device %d: %w", opts.Device, err)
	}
	rep := &report.Report{
		Backend:  b.Name(),
		Device:   props.Name,
		Workload: fmt.Sprintf("%s, %s buffers", w.Desc, opts.Pattern),
		Steps:    opts.Steps,
	}
	if !opts.NoProbe {
		// The driver's own price of a node update, in this run, on one
		// core as the rows' steps are.
		release := func() {}
		if !opts.FreeThread {
			release = holdFor(w)
		}
		p, err := drivercost.MeasureNodeUpdates(ctx, b, opts.Device, opts.ProbeParamBytes, probeNodes, probeSamples)
		release()
		if err != nil {
			return nil, fmt.Errorf("workload: node update probe: %w", err)
		}
		rep.NodeUpdates = &report.NodeUpdateProbe{ParamBytes: p.ParamBytes, Nodes: p.Nodes, Samples: p.Samples,
			IdleUS: p.IdleUS, InFlightUS: p.InFlightUS}
	}
	defer rep.SetFloor()
	if opts.PairFloor && opts.RunsFloor() && (w.Comm == nil || w.Comm.Size() <= 1) {
		pair, err := newFloorPair(ctx, b, w, opts)
		if err != nil {
			return nil, err
		}
		defer func() { err = errors.Join(err, pair.close()) }()
		opts.pair = pair
	}
	for _, strat := range order {
		o := opts
		o.Strategy = strat
		if strat != sg.StrategyEager {
			o.Dump = "" // eager's outputs are the ones every strategy matched
		}
		res, err := Run(ctx, b, w, o)
		if err != nil {
			if ctx.Err() != nil {
				return rep, err
			}
			if strat == sg.StrategyEager {
				return nil, err
			}
			if ce := (compileError{}); errors.As(err, &ce) && errors.Is(err, gpu.ErrNotSupported) {
				// The device cannot run it (pool without VMM, device
				// without its patcher): no row to compare, no failure.
				rep.Results = append(rep.Results, report.Result{Strategy: string(strat), Unchecked: true,
					Note: NotSupportedNote + err.Error()})
				continue
			}
			rep.Results = append(rep.Results, report.Result{Strategy: string(strat), Note: "failed: " + err.Error()})
			continue
		}
		if strat == sg.StrategyEager {
			opts.Reference = res.Digests
			res.Result.OutputsMatchEager = true
		}
		rep.Results = append(rep.Results, res.Result)
	}
	if opts.RunsFloor() {
		// The floor every overhead ratio is measured against: the same
		// step graph replayed with nothing moving, in the same run.
		o := opts
		o.Strategy, o.Pattern, o.Dump, o.pair = sg.StrategyPatch, Fixed, "", nil
		res, err := floorRun(ctx, b, w, o, opts.Pattern)
		if err != nil {
			if ctx.Err() != nil {
				return rep, err
			}
			rep.Results = append(rep.Results, report.Result{Strategy: FloorRow, Note: "failed: " + err.Error()})
		} else {
			res.Result.Strategy = FloorRow
			res.Result.Note = joinNote(res.Result.Note, "patch strategy with fixed buffers: the graph replayed with nothing moving")
			rep.Results = append(rep.Results, res.Result)
		}
	}
	return rep, nil
}

// floorRun runs Bench's floor o (patch on fixed buffers). Under Swap the
// rows of a fixed-buffer run hold other sequences than the swapping run's,
// so its outputs are checked against an eager run on fixed buffers of its
// own rather than against o.Reference.
func floorRun(ctx context.Context, b gpu.Backend, w *Workload, o RunOptions, moving Pattern) (*RunResult, error) {
	if moving == Swap {
		e := o
		e.Strategy, e.Reference, e.WallBatches, e.Progress, e.Dump = sg.StrategyEager, nil, -1, nil, ""
		ref, err := Run(ctx, b, w, e)
		if err != nil {
			return nil, fmt.Errorf("eager reference on fixed buffers: %w", err)
		}
		o.Reference = ref.Digests
	}
	return Run(ctx, b, w, o)
}

// compileWorkload compiles w with opts on b and writes its states' first
// values; on error nothing is left open. A failed Compile is a
// compileError.
func compileWorkload(ctx context.Context, b gpu.Backend, w *Workload, opts sg.Options) (*sg.Executable, error) {
	exe, err := sg.Compile(ctx, b, w.Program, opts)
	if err != nil {
		return nil, compileError{fmt.Errorf("workload %s: compile with %s: %w", w.Name, opts.Strategy, err)}
	}
	for _, st := range w.States {
		if err := exe.WriteBuffer(ctx, st.Buffer, st.Data); err != nil {
			return nil, errors.Join(fmt.Errorf("workload %s: initialise %s: %w", w.Name, st.Buffer.Name(), err), exe.Close())
		}
	}
	return exe, nil
}

// compileError is Run's error when Compile failed.
type compileError struct{ err error }

func (e compileError) Error() string { return e.err.Error() }
func (e compileError) Unwrap() error { return e.err }

// NotSupportedNote begins the note of a Bench row whose strategy the
// device cannot run (Compile refused it with gpu.ErrNotSupported): the row
// is Unchecked, and not a failure.
const NotSupportedNote = "not supported on this device: "

// FloorRow is the name of Bench's row for the step graph replayed with no
// buffer moving: the floor of every strategy's step time.
const FloorRow = "replay-fixed"

// holdFor holds the calling goroutine for a run of w (RunOptions.FreeThread):
// on its OS thread, and, when w is a single rank, that thread on its CPU.
// The ranks of a communicator, goroutines of one process or processes of
// their own, each start on whatever CPU is free, and two held on one
// would share it for the whole run: they keep their threads only.
func holdFor(w *Workload) (release func()) {
	if w.Comm != nil && w.Comm.Size() > 1 {
		runtime.LockOSThread()
		return runtime.UnlockOSThread
	}
	return holdCore()
}
