package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/replay"
	"github.com/stablegraph/stablegraph/report"
	"github.com/stablegraph/stablegraph/workload"
)

// wallBatches, when not zero, replaces workload's default wall-time
// batches (workload.RunOptions.WallBatches and WallBatchSize) of run and
// bench. The command's tests set it small: on sim the batches are most of
// a short bench's work, and the tests read no wall time.
var wallBatches struct{ n, size int }

// workloadFlags are the flags run and bench share.
type workloadFlags struct {
	name      string
	cfg       workload.Config
	run       workload.RunOptions
	pattern   string
	autoBound string
	ranks     rankFlags
}

func (f *workloadFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.name, "workload", "mlp", "`name` of the workload: "+strings.Join(workload.Names(), ", "))
	registerShape(fs, &f.cfg)
	fs.IntVar(&f.cfg.BatchPerRank, "batch-per-rank", 0, "dp: `rows` per rank; the global batch is this times the ranks (weak scaling). Not with --batch, which is the global batch the ranks share (strong scaling)")
	fs.IntVar(&f.run.Steps, "steps", 100, "measured steps")
	fs.IntVar(&f.run.Warmup, "warmup", 3, "steps run before the measured ones (outputs still compared)")
	fs.StringVar(&f.pattern, "pattern", string(workload.PingPong), "how the caller's buffers move: fixed, pingpong, random, or swap (gpt2-decode: sequences and their KV caches swap in and out of the batch)")
	fs.StringVar(&f.cfg.Weights, "weights", "", "safetensors `file` of gpt2-decode's weights, read when it exists, else written with those drawn from --seed")
	fs.IntVar(&f.run.Device, "device", 0, "device ordinal")
	fs.StringVar(&f.autoBound, "auto-bound", "", "what bounds a step, by which the auto strategy ranks its candidates: latency (host + GPU time, the default) or throughput (the larger of the two)")
	fs.BoolVar(&f.run.DeviceInline, "device-inline", false, "the device strategy passes a step's pointer moves in its patcher's own parameters when few buffers move (one exec update of the patcher node per moving step; its patcher then reads no table over the bus)")
	fs.BoolVar(&f.run.DeviceHostLead, "device-host-lead", false, "the device strategy moves the step's first command from the host (one exec update of it per moving step; its patcher then runs beside that command, not in front of it)")
	fs.BoolVar(&f.run.PinnedInputs, "pinned-inputs", false, "make each step's inputs in page-locked host memory, which the driver copies by DMA, as a pinned data loader hands them over (default: pageable memory, copied through the calling core's caches); not for gpt2-decode")
	fs.BoolVar(&f.run.FreeThread, "free-thread", false, "let the measuring goroutine change OS threads and its thread change CPUs between steps (default: one thread, held on the CPU it starts on, for all of a row's steps and its paired floor's); to compare")
	fs.BoolVar(&f.run.NoGate, "no-gate", false, "time every step with events around Run on the idle stream, never holding the stream behind a gate: the GPU column is then the latency; to compare host times with and without the gate")
	f.ranks.register(fs)
	f.run.WallBatches, f.run.WallBatchSize = wallBatches.n, wallBatches.size
}

// build checks the flags and builds the workload.
func (f *workloadFlags) build(fs *flag.FlagSet) (*workload.Workload, error) {
	p, err := workload.ParsePattern(f.pattern)
	if err != nil {
		return nil, usagef("--pattern: %v", err)
	}
	f.run.Pattern, f.run.Seed = p, f.cfg.Seed
	if f.run.Steps <= 0 || f.run.Warmup < 0 {
		return nil, usagef("--steps must be positive and --warmup not negative")
	}
	bound, err := replay.ParseBound(f.autoBound)
	if err != nil {
		return nil, usagef("--auto-bound: %v", err)
	}
	f.run.AutoBound = bound
	if err := checkShape(fs, f.name, f.cfg); err != nil {
		return nil, err
	}
	if err := checkPattern(f.name, p); err != nil {
		return nil, err
	}
	w, err := workload.New(f.name, f.cfg)
	if err != nil {
		return nil, usagef("%v", err)
	}
	return w, f.ranks.check(f.name)
}

// benchSteps is the number of steps a bench of strats runs with o: eager
// and each other strategy once, then the floor (see workload.Bench).
func benchSteps(strats []sg.Strategy, o workload.RunOptions) int {
	n := len(workload.BenchOrder(strats))
	if o.RunsFloor() {
		n++
	}
	return n * (o.Warmup + o.Steps)
}

func runCommand() *command {
	return &command{
		name:    "run",
		summary: "run one workload with one strategy for N steps",
		detail: `Compiles the workload with the strategy and runs --warmup + --steps steps,
the caller's buffers moving as --pattern says. Each step's GPU time (events
around the step) and host time (the host clock around Executable.Run) are
kept (on the sim backend both are simulated: its model on this CPU, not a GPU
measurement); the summary row goes to stdout, progress with the time left to
stderr. With --check (the
default) an eager run of the same inputs goes first and the outputs of every
step are compared bit for bit; a difference makes the command fail.

Workloads with collectives (dp; gpt2-decode, tensor parallel over the ranks)
run on several ranks: --nproc N starts N ranks on this host (N processes,
one GPU each, on cuda; N simulated devices in this process on sim); under
torchrun, srun or mpirun each process is the rank its launcher's environment
says, with no flag (docs/MULTI-GPU.md); or --rank, --world and --rendezvous
launch one rank by hand on any host. The job token is read from
STABLEGRAPH_TOKEN or a file (--token-file), never from the command line.
Rank 0 reports, and writes --dump.`,
		flags: func(fs *flag.FlagSet) func(*env) error {
			var wf workloadFlags
			wf.register(fs)
			strategy := fs.String("strategy", string(sg.StrategyPatch), "replay `strategy`: "+strategyList())
			check := fs.Bool("check", true, "compare every step's outputs with an eager run")
			fs.StringVar(&wf.run.Dump, "dump", "", "write the last step's inputs and outputs to `file` (safetensors), for a peer to check against")
			jsonPath := fs.String("json", "", "write the report as JSON to `file` (\"-\": stdout, instead of the table)")
			return func(e *env) error {
				strat, err := sg.ParseStrategy(*strategy)
				if err != nil {
					return usagef("--strategy: %v", err)
				}
				w, err := wf.build(fs)
				if err != nil {
					return err
				}
				if wf.run.Dump == "-" {
					return usagef("--dump: the dump is a safetensors file, not for stdout")
				}
				if err := errors.Join(checkOutput("--json", *jsonPath), checkOutput("--dump", wf.run.Dump)); err != nil {
					return err
				}
				body := func(e *env, b gpu.Backend, w *workload.Workload, o workload.RunOptions, lead bool) (*report.Report, error) {
					if report.SimulatedBackend(b.Name()) {
						o = capWall(e, "run", o, lead)
					}
					return runBody(e, b, w, o, strat, *check, lead)
				}
				return wf.execute(e, fs, "run", w, body, func(rep *report.Report) error {
					return writeReport(e, rep, *jsonPath, "")
				})
			}
		},
	}
}

// runBody is run's work on an opened backend: an eager reference run when
// check asks for one, then the strategy's run. The report comes back also
// when the outputs differ from eager, with the error saying so.
func runBody(e *env, b gpu.Backend, w *workload.Workload, o workload.RunOptions, strat sg.Strategy, check, lead bool) (*report.Report, error) {
	props, err := b.DeviceProps(o.Device)
	if err != nil {
		return nil, err
	}
	watch := workload.WatchCollectives(w.Comm, &o)
	if !lead {
		o.Dump = "" // rank 0's is the run's: one file, written once
	}
	reference := check && strat != sg.StrategyEager
	if lead {
		runs := 1
		if reference {
			runs = 2
		}
		prog := newStepProgress(e, "run", runs*(o.Warmup+o.Steps))
		defer prog.finish()
		o.Progress = chainProgress(o.Progress, prog.step)
	}
	if reference {
		if lead && !e.global.progress.on {
			e.progress("run: eager reference run")
		}
		ref, err := workload.Run(e.ctx, b, w, o)
		if err != nil {
			return nil, fmt.Errorf("eager reference: %w", err)
		}
		o.Reference = ref.Digests
	}
	o.Strategy = strat
	res, err := workload.Run(e.ctx, b, w, o)
	if err != nil {
		return nil, err
	}
	switch {
	case strat == sg.StrategyEager:
		res.Result.OutputsMatchEager = true // it is the reference
	case !check:
		res.Result.Unchecked = true
		res.Result.Note = "outputs not compared with eager (--check=false)"
	}
	rep := &report.Report{
		Backend: b.Name(), Device: props.Name,
		Workload: fmt.Sprintf("%s, %s buffers", w.Desc, o.Pattern), Steps: o.Steps,
		Simulated: report.SimulatedBackend(b.Name()),
		Results:   []report.Result{res.Result},
	}
	watch.Annotate(rep)
	if check && !res.Result.OutputsMatchEager {
		return rep, fmt.Errorf("%s outputs differ from eager from step %d", strat, res.Mismatch)
	}
	return rep, nil
}

// chainProgress calls a then b.
func chainProgress(a, b func(sg.Strategy, int, int)) func(sg.Strategy, int, int) {
	if a == nil {
		return b
	}
	return func(s sg.Strategy, step, total int) {
		a(s, step, total)
		b(s, step, total)
	}
}

func benchCommand() *command {
	return &command{
		name:    "bench",
		summary: "run every strategy side by side on one workload: table, JSON, plot",
		detail: `Runs the workload with each strategy in turn (eager first: it is the
reference), on the same inputs and the same buffer movement, and compares every
step's outputs with eager's bit for bit. Reports per strategy the GPU time per
step (the device's work alone: the stream is held behind a gate while the host
enqueues the step), host time per step (the call) and latency (the call to the
end of its device work), each p50 and p90, wall time per step with steps
back to back, re-records, graph updates, patched nodes, traces captured in
steady state (above 0: a traced library call is captured again every step),
bytes copied, peak device memory and whether the outputs matched. Last comes
replay-fixed, the floor: the same graph replayed with nothing moving. A
second table sets every strategy against the floor: wall, GPU and latency
p50 over the floor's side by side, host time over the floor's, the nodes it
moved from the host per step and its host time per moved node, beside the
driver's own price of one node update (a probe measured first in the same
run: a chain of 16 kernels with 360-byte parameter blocks, updated while it
runs) and the ratio of the two. On a GPU (--pair-floor, the default there)
the floor's step is also timed beside the measured steps of every row, in
blocks of 8 after each 8 of the row's, and that table's GPU, latency and
host columns set each block against the floor's beside it (medians over the
blocks): the host clock of a GPU machine moves between regimes lasting many
steps, and so does the card's, and a block and the floor's beside it share
one. Each side may pay for following the other (the floor's weights are its
own, and can evict the row's from the card's L2), so the floor's block
starts with an untimed step and each block's first step is left out of the
comparison. On the sim backend every time is simulated
(its model on this CPU), not a GPU measurement, and the table and JSON say
so.

With no flags: the mlp workload (8 layers, width 256, batch 8), 100 steps,
pingpong buffers, on the default backend. Progress goes to stderr with the
time left; interrupted (Ctrl-C), the command prints the strategies finished so
far and exits 130. Workloads with collectives (dp, gpt2-decode) take --nproc or
--rank/--world/--rendezvous as in run; every rank runs every strategy, rank 0
reports, and the notes say how many collectives each strategy captured in
steady state.

On sim, where every kernel runs on this CPU, bench fits a time budget:
unless --steps is given, it first times 3 eager steps, then runs as many
steps per strategy as fit --budget (default 1m0s; fewer warm-up steps and
wall-time batches with them), and says so on stderr and under the table.
--budget 0 runs the defaults however long they take. Workloads with
collectives, whose ranks must run the same steps, take 5 measured steps per
strategy instead, and say so. With --steps N (or no budget),
wall time on sim is measured over at most N back-to-back steps.`,
		flags: func(fs *flag.FlagSet) func(*env) error {
			var wf workloadFlags
			wf.register(fs)
			strategies := fs.String("strategies", "", "comma-separated `list` of strategies (default all: "+strategyList()+")")
			jsonPath := fs.String("json", "", "write the report as JSON to `file` (\"-\": stdout, instead of the table)")
			plotPath := fs.String("plot", "", "draw each strategy's time per step against the floor to `file` (.png or .svg)")
			budget := fs.Duration("budget", defaultSimBudget, "sim only: the `time` the runs may take; unless --steps is given, the steps per strategy are cut to fit it, and bench says so (0: no budget)")
			fs.StringVar(&wf.run.Dump, "dump", "", "write eager's last step's inputs and outputs to `file` (safetensors; every strategy matched them)")
			pairFloor := fs.Bool("pair-floor", true, "time the floor's steps beside every row's measured steps, in blocks of 8, and set each row's host time, latency and GPU time against those (medians over the blocks) rather than against the floor row's, run seconds apart; on sim only when given")
			return func(e *env) error {
				if *budget < 0 {
					return usagef("--budget must not be negative, got %v", *budget)
				}
				given := map[string]bool{}
				fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
				var fitNote string
				var strats []sg.Strategy
				for _, s := range strings.Split(*strategies, ",") {
					if s = strings.TrimSpace(s); s == "" {
						continue
					}
					st, err := sg.ParseStrategy(s)
					if err != nil {
						return usagef("--strategies: %v", err)
					}
					strats = append(strats, st)
				}
				if *plotPath != "" {
					if _, err := report.PlotFormat(*plotPath); err != nil {
						return usagef("--plot: %v", err)
					}
				}
				w, err := wf.build(fs)
				if err != nil {
					return err
				}
				if wf.run.Dump == "-" {
					return usagef("--dump: the dump is a safetensors file, not for stdout")
				}
				if err := errors.Join(checkOutput("--json", *jsonPath), checkOutput("--plot", *plotPath), checkOutput("--dump", wf.run.Dump)); err != nil {
					return err
				}
				body := func(e *env, b gpu.Backend, w *workload.Workload, o workload.RunOptions, lead bool) (*report.Report, error) {
					o.PairFloor = *pairFloor && (given["pair-floor"] || !report.SimulatedBackend(b.Name()))
					switch {
					case !report.SimulatedBackend(b.Name()):
					case *budget > 0 && !given["steps"] && w.Comm == nil:
						var err error
						if o, fitNote, err = fitBudget(e, b, w, o, strats, *budget, given["warmup"]); err != nil {
							return nil, err
						}
					case *budget > 0 && !given["steps"]:
						// In-process ranks run this at once: the lead alone
						// writes the note.
						var note string
						if o, note = fitCollectives(e, o, given["warmup"], lead); lead {
							fitNote = note
						}
					default:
						o = capWall(e, "bench", o, lead)
					}
					return benchBody(e, b, w, o, strats, lead)
				}
				return wf.execute(e, fs, "bench", w, body, func(rep *report.Report) error {
					err := writeReport(e, rep, *jsonPath, *plotPath)
					if fitNote != "" && *jsonPath != "-" {
						fmt.Fprintf(e.stdout, "\n%s\n", fitNote)
					}
					return err
				})
			}
		},
	}
}

// benchBody is bench's work on an opened backend: every strategy in
// turn. The report comes back also when a strategy failed or differs from
// eager, with the error saying which.
func benchBody(e *env, b gpu.Backend, w *workload.Workload, o workload.RunOptions, strats []sg.Strategy, lead bool) (*report.Report, error) {
	if !lead {
		o.Dump = "" // rank 0's is the run's: one file, written once
	}
	if lead {
		prog := newStepProgress(e, "bench", benchSteps(strats, o))
		defer prog.finish()
		o.Progress = chainProgress(o.Progress, prog.step)
	}
	watch := workload.WatchCollectives(w.Comm, &o)
	rep, err := workload.Bench(e.ctx, b, w, strats, o)
	if rep != nil {
		rep.Simulated = report.SimulatedBackend(b.Name())
	}
	if err != nil {
		// Interrupted: the strategies finished so far are reported.
		return rep, err
	}
	watch.Annotate(rep)
	var bad []string
	for _, r := range rep.Results {
		// Unchecked: a strategy this device cannot run (its note says why).
		if !r.OutputsMatchEager && !r.Unchecked {
			bad = append(bad, r.Strategy)
		}
	}
	if len(bad) > 0 {
		return rep, fmt.Errorf("outputs of %s differ from eager or the strategy failed (see notes)", strings.Join(bad, ", "))
	}
	return rep, nil
}

// writeReport prints the table to stdout (or the JSON, for --json -) and
// writes the JSON and plot files that were asked for. Interrupted, it
// prints the table of the strategies finished so far and writes no file.
func writeReport(e *env, rep *report.Report, jsonPath, plotPath string) error {
	if e.ctx.Err() != nil {
		fmt.Fprintf(e.stdout, "interrupted: %s finished so far\n", plural(len(rep.Results), "strategy", "strategies"))
		if err := rep.WriteTable(e.stdout); err != nil {
			return err
		}
		if jsonPath != "" || plotPath != "" {
			e.progress("interrupted: no file written")
		}
		return nil
	}
	if jsonPath != "-" {
		if err := rep.WriteTable(e.stdout); err != nil {
			return err
		}
		if err := rep.WriteRanksTable(e.stdout); err != nil {
			return err
		}
	}
	if jsonPath != "" {
		if err := e.writeOutput(jsonPath, func(w io.Writer) error { return rep.WriteJSON(w, true) }); err != nil {
			return fmt.Errorf("write %s: %w", jsonPath, err)
		}
		if jsonPath != "-" {
			e.progress("wrote %s", jsonPath)
		}
	}
	if plotPath != "" {
		if err := rep.SavePlot(plotPath); err != nil {
			return err
		}
		e.progress("wrote %s", plotPath)
	}
	return nil
}

func strategyList() string {
	var s []string
	for _, st := range sg.Strategies() {
		s = append(s, string(st))
	}
	return strings.Join(s, ", ")
}
