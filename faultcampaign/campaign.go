// Package faultcampaign sweeps injected driver faults over every replay
// strategy and workload, the way Pebble's error_test fails operation 0, 1,
// 2, ... of its errorfs wrapper until a run succeeds (STYLE.md, Pebble).
//
// # The trial
//
// A trial is one realistic life of an executable on a fresh backend (the
// sim by default; any backend implementing gpu.FaultInjector and
// gpu.HandleCounter will do): a workload.Caller whose buffers move (random
// pattern by default; remappable buffers for remap, given to Compile as
// Options.Remap.Memory), a Client on a private stream cache, Compile, the
// states written, then Config.Steps steps, each of Run, Client.Submitted,
// Client.Retire of a scratch buffer at the point returned, and the outputs
// read back and compared with an eager reference; then the executable and
// the client are closed, the cache purged and the backend's live handles
// checked. Each call of the executable or the client is a phase ("compile",
// "run[1]", "close-exe", ...).
//
// # The sweep
//
// For each workload and strategy a clean trial counts, per phase, the calls
// of every entry point of gpu.Backend and gpu.Collectives (Calls before and
// after the phase). Every (phase, op, n) with n below that count is a site:
// a trial is run with InjectFault(op, n) armed during that phase only.
// Allocation entry points fail with gpu.ErrOutOfMemory as well, so that
// StrategyAuto's fallbacks are exercised. Config.PerSite bounds the call
// indices tried per (phase, op), spread over the range, and Config.Every
// tries one site in Every of each cell, rotating from cell to cell, so that
// CI runs a reduced campaign; with both zero, every site is tried.
//
// # What is checked after each fault
//
//   - The call of the phase returns an error wrapping gpu.ErrInjected whose
//     text names the failing entry point; or, for a fault that an auto
//     fallback absorbed, the executable's Choice names it.
//   - The executable (and client) is usable afterwards: the phase is
//     retried (a failed step after restoring the states the eager
//     reference had before it, since a failed training step may have
//     updated part of them) and every later step's outputs equal eager's bit
//     for bit; or it reports itself closed (ErrClosed).
//   - Nothing leaks: once the executable, client and caller are closed and
//     the stream cache purged, the backend's live handles are back to zero.
//     A fault in a release entry point (MemFree, StreamDestroy, ...) keeps
//     the handle it could not release by nature; such a fault must be
//     reported by the call that made it, and is counted apart
//     (ReleaseLeaks).
//   - No goroutine is left behind once the backend is closed.
//   - Nothing panics.
//
// Faults that polling calls reach only by timing (EventQuery, StreamQuery
// in back-off loops) may not fire in a given trial; those sites are counted
// as not reached, not as injected.
//
// Collectives are swept apart (TestCollectiveFaults): a rank whose
// collective fails leaves its partner waiting, the communicator is aborted,
// and a step cannot be retried on one rank alone; what is checked there is
// that the error reaches the caller, the other rank gives up within the
// communicator timeout, and nothing is left behind.
//
// # Running
//
// The campaign and the other reliability checks, all on the sim:
//
//	go test -run TestFaultCampaign -v ./faultcampaign                        # reduced (CI), summary table in the log
//	go test -run TestFaultCampaign -v ./faultcampaign -args -campaign.full   # every call index, random and pingpong buffers
//	go test -race -run TestFaultCampaign -v ./faultcampaign -args -campaign.offset 1  # CI's race sample, the next third of its sites
//	go test -run TestFaultCampaignRemap -v ./faultcampaign                   # remap: every call index (CI too)
//	go test -run TestCollectiveFaults -v ./faultcampaign                     # collectives, two ranks
//	go test -run '^$' -fuzz FuzzCompile -fuzztime 5m .                       # random programs through Compile and one step
//	go test -run '^$' -fuzz FuzzQueue -fuzztime 5m ./retire                  # the retirement queue's bookkeeping
//	go test -run '^$' -fuzz FuzzAllocFree -fuzztime 5m ./bfc                 # the caching allocator
//	go run ./cmd/stablegraph soak --duration 1h --json soak.json            # the soak (package soak)
//
// go test -race ./... runs all of them in reduced form: the campaign over
// fewer workloads and a third of their first call indices (Config.Every
// 3; -campaign.offset 1 and 2 try the other thirds, -campaign.every 1 all
// of them), the collective sweep over three strategies, the fuzz
// targets' seed corpora, a short soak per workload, the concurrency test of
// the root package.
package faultcampaign

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/client"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/retire"
	"github.com/stablegraph/stablegraph/streamcache"
	"github.com/stablegraph/stablegraph/workload"
)

// DefaultWorkloads are the workloads a campaign sweeps by default, with the
// small shapes of Shape.
var DefaultWorkloads = []string{"mlp", "train", "chain", "chain-moving", "dp"}

// Shape is the small configuration the campaign builds workload name with:
// two layers of width 16 over a batch of 4 (mlp, train, dp), four kernels
// over 64 elements (chain, chain-moving).
func Shape(name string) workload.Config {
	switch name {
	case "chain", "chain-moving":
		return workload.Config{K: 4, N: 64}
	}
	return workload.Config{Layers: 2, Width: 16, Batch: 4}
}

// Config configures Run. The zero value is valid; defaults are applied in
// withDefaults.
type Config struct {
	// Workloads to sweep. Default DefaultWorkloads.
	Workloads []string
	// Variants to sweep: strategies with their options. Default
	// DefaultVariants().
	Variants []Variant
	// Steps per trial. Default 3: a first step that records, then steps
	// whose buffers moved.
	Steps int
	// Patterns of the caller's buffers, each swept in turn. Default
	// workload.Random (every buffer moves every step).
	Patterns []workload.Pattern
	// PerSite bounds the call indices tried per (phase, op): the first, the
	// last and evenly spread ones between. Zero tries every index (the full
	// campaign).
	PerSite int
	// Every, above 1, samples the sites further: each cell tries every
	// Every-th of its sites (in the clean trial's order: phase by phase,
	// entry points by name, call indices rising), starting at the
	// cell's rotation, (Offset + the cell's index in the run) mod Every, so
	// that neighbouring cells try different sites. The Every runs with
	// Offset 0, 1, ..., Every-1 together try every site PerSite picks.
	// Zero or one: no sampling.
	Every int
	// Offset shifts the rotation of Every (see there).
	Offset int
	// Open opens a fresh backend for one trial. It must implement
	// gpu.FaultInjector and gpu.HandleCounter. Default: a one-device sim
	// of 1 GiB.
	Open func() (gpu.Backend, error)
	// Progress, when set, is called after each (workload, pattern, variant)
	// cell.
	Progress func(c Cell)
	// Logger receives the executables' and backends' logs. Default: none.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if len(c.Workloads) == 0 {
		c.Workloads = DefaultWorkloads
	}
	if len(c.Variants) == 0 {
		c.Variants = DefaultVariants()
	}
	if c.Steps <= 0 {
		c.Steps = 3
	}
	if len(c.Patterns) == 0 {
		c.Patterns = []workload.Pattern{workload.Random}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Open == nil {
		log := c.Logger
		c.Open = func() (gpu.Backend, error) {
			b, err := sim.New(sim.Config{Devices: 1, DeviceMemory: 1 << 30, Logger: log})
			if err != nil {
				return nil, err // not a typed nil inside the interface
			}
			return b, nil
		}
	}
	return c
}

// Outcome classifies one injected fault.
type Outcome uint8

const (
	// NotReached: the call index was not reached in this trial (a polling
	// call whose count depends on timing). Not an injected fault.
	NotReached Outcome = iota
	// Recovered: the phase's call returned an error naming the fault, its
	// retry succeeded, and every later output matched eager.
	Recovered
	// Absorbed: the fault was handled without failing the call: an auto
	// fallback that records the fault in Choice, or a stream the cache
	// replaced. Every output matched eager.
	Absorbed
	// Closed: the executable reported itself closed after the fault, and
	// nothing leaked.
	Closed
	// ReleaseLeak: a release entry point failed; the call that made it
	// reported the error, and the handle it could not release stayed live.
	// Every output matched eager.
	ReleaseLeak
	// Failed: a check failed; Fault.Problem says which.
	Failed
)

var outcomeNames = [...]string{"not reached", "recovered", "absorbed", "closed", "release leak", "FAILED"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Site is where a fault is injected: call Nth (0-based, counted from the
// start of the phase) of entry point Op during Phase. With Refuse the
// injected error is a refused graph update (a *gpu.UpdateError wrapping
// gpu.ErrGraphUpdate) rather than a failure, which the update and patch
// strategies answer by re-recording.
type Site struct {
	Phase  string
	Op     string
	Nth    int
	Refuse bool
}

func (s Site) String() string {
	if s.Refuse {
		return fmt.Sprintf("%s %s#%d (refused)", s.Phase, s.Op, s.Nth)
	}
	return fmt.Sprintf("%s %s#%d", s.Phase, s.Op, s.Nth)
}

// Fault is the outcome of one trial with a fault.
type Fault struct {
	Workload string
	Pattern  workload.Pattern
	Variant  string
	Site
	Outcome Outcome
	// Err is the error the faulted call returned ("" when none).
	Err string
	// Problem says what check failed (Failed), or what was absorbed or
	// kept (Absorbed, ReleaseLeak).
	Problem string
}

func (f Fault) String() string {
	s := fmt.Sprintf("%s/%s/%s %s: %s", f.Workload, f.Pattern, f.Variant, f.Site, f.Outcome)
	if f.Problem != "" {
		s += ": " + f.Problem
	}
	if f.Err != "" && f.Outcome == Failed {
		s += " (error: " + f.Err + ")"
	}
	return s
}

// Cell is the sweep of one workload, buffer pattern and variant.
type Cell struct {
	Workload string
	Pattern  workload.Pattern
	Variant  string
	// Sites is the number of (phase, op, n) sites the clean trial has;
	// Tried the number tried (PerSite and Every may sample).
	Sites, Tried int
	// Counts by outcome.
	Counts [Failed + 1]int
	// Leaks counts the failed trials that left handles live (not by a
	// reported release failure).
	Leaks int
	// Fired counts the faults that fired (every outcome but NotReached)
	// per entry point.
	Fired map[string]int
	// Faults lists every trial whose outcome is not Recovered or NotReached.
	Faults   []Fault
	Duration time.Duration
}

// Injected is the number of faults that fired.
func (c Cell) Injected() int { return c.Tried - c.Counts[NotReached] }

// Row is one variant's line of the summary: its cells summed.
type Row struct {
	Variant string
	Sites   int
	Tried   int
	Counts  [Failed + 1]int
	Leaks   int
}

// Injected is the number of faults that fired.
func (r Row) Injected() int { return r.Tried - r.Counts[NotReached] }

// Survived is the number of injected faults every check passed.
func (r Row) Survived() int { return r.Injected() - r.Counts[Failed] }

// Report is a campaign's result.
type Report struct {
	Cells    []Cell
	Duration time.Duration
	// Goroutines is how many goroutines were left after the last trial
	// beyond those running before the first (0 when none leaked).
	Goroutines int
}

// Rows sums the cells per variant, in the order of the variants swept.
func (r *Report) Rows() []Row {
	var rows []Row
	idx := map[string]int{}
	for _, c := range r.Cells {
		i, ok := idx[c.Variant]
		if !ok {
			i = len(rows)
			idx[c.Variant] = i
			rows = append(rows, Row{Variant: c.Variant})
		}
		row := &rows[i]
		row.Sites += c.Sites
		row.Tried += c.Tried
		row.Leaks += c.Leaks
		for k, n := range c.Counts {
			row.Counts[k] += n
		}
	}
	return rows
}

// Failures lists every failed trial.
func (r *Report) Failures() []Fault {
	var out []Fault
	for _, c := range r.Cells {
		for _, f := range c.Faults {
			if f.Outcome == Failed {
				out = append(out, f)
			}
		}
	}
	return out
}

// Table renders the per-variant summary.
func (r *Report) Table() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "variant\tsites\ttried\tinjected\tsurvived\trecovered\tabsorbed\tclosed\trelease-leaks (reported)\tleaks\tfailed\t")
	var tot Row
	for _, row := range r.Rows() {
		writeRow(tw, row.Variant, row)
		tot.Sites += row.Sites
		tot.Tried += row.Tried
		tot.Leaks += row.Leaks
		for k, n := range row.Counts {
			tot.Counts[k] += n
		}
	}
	writeRow(tw, "total", tot)
	tw.Flush()
	fmt.Fprintf(&b, "%d cells in %v; goroutines left behind: %d\n", len(r.Cells), r.Duration.Round(time.Millisecond), r.Goroutines)
	return b.String()
}

func writeRow(w io.Writer, name string, row Row) {
	fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", name, row.Sites, row.Tried, row.Injected(), row.Survived(),
		row.Counts[Recovered], row.Counts[Absorbed], row.Counts[Closed], row.Counts[ReleaseLeak], row.Leaks, row.Counts[Failed])
}

// Variant is a strategy with the options it is compiled with.
type Variant struct {
	Name    string
	Options sg.Options
	// Steps per trial, when not zero, replaces Config.Steps.
	Steps int
}

// AutoSteps are the steps of auto's trials: enough for its probe of every
// candidate with AutoProbeSteps measured steps each (15 steps for patch,
// device, stable and pool: their warm-ups, then one round) to end and its
// choice to run.
const AutoSteps = 18

// AutoProbeSteps are the measured steps per candidate of auto's trials:
// one round of the probe's plan exercises every kind of probe step (the
// warm-ups, the step back at the caller's addresses, a measured step behind
// the gate) at a fraction of the default's steps.
const AutoProbeSteps = 1

// DefaultVariants are every strategy with default options (auto for
// AutoSteps steps with AutoProbeSteps), then pool with one slot, pool with
// zero-copy outputs, and stable and pool with stream copies.
func DefaultVariants() []Variant {
	var vs []Variant
	for _, s := range sg.Strategies() {
		v := Variant{Name: string(s), Options: sg.Options{Strategy: s}}
		if s == sg.StrategyAuto {
			v.Steps, v.Options.Auto.ProbeSteps = AutoSteps, AutoProbeSteps
		}
		vs = append(vs, v)
	}
	return append(vs,
		Variant{Name: "pool-1-slot", Options: sg.Options{Strategy: sg.StrategyPool, StrategyOptions: sg.StrategyOptions{Pool: sg.PoolOptions{Slots: 1}}}},
		Variant{Name: "pool-zero-copy", Options: sg.Options{Strategy: sg.StrategyPool, StrategyOptions: sg.StrategyOptions{Pool: sg.PoolOptions{ZeroCopyOutputs: true}}}},
		Variant{Name: "stable-stream-copies", Options: sg.Options{Strategy: sg.StrategyStable, StrategyOptions: sg.StrategyOptions{Copies: sg.CopyOptions{OnStream: true}}}},
		Variant{Name: "pool-stream-copies", Options: sg.Options{Strategy: sg.StrategyPool, StrategyOptions: sg.StrategyOptions{Copies: sg.CopyOptions{OnStream: true}}}},
	)
}

// Ops are the entry points a campaign counts: the methods of gpu.Backend
// and of the optional capabilities executables use (gpu.VirtualMemory,
// gpu.StreamMemOps, gpu.Collectives, gpu.GEMM, gpu.GraphNodeReader,
// gpu.DeviceUpdates), less Close (the backend's own, which the trial
// makes) and those that cannot fail.
func Ops() []string {
	seen := map[string]bool{}
	for _, t := range []reflect.Type{reflect.TypeFor[gpu.Backend](), reflect.TypeFor[gpu.VirtualMemory](),
		reflect.TypeFor[gpu.StreamMemOps](), reflect.TypeFor[gpu.Collectives](),
		reflect.TypeFor[gpu.GEMM](), reflect.TypeFor[gpu.GraphNodeReader](), reflect.TypeFor[gpu.DeviceUpdates]()} {
		for i := range t.NumMethod() {
			m := t.Method(i)
			if m.Name == "Close" {
				continue
			}
			last := m.Type.NumOut() - 1
			if last < 0 || m.Type.Out(last) != reflect.TypeFor[error]() {
				continue // Name, DeviceCount: cannot fail
			}
			seen[m.Name] = true
		}
	}
	ops := make([]string, 0, len(seen))
	for op := range seen {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	return ops
}

// releaseKinds are the handle kinds (gpu.HandleCounts.String names) a failed
// release may keep: a failed unmap keeps its reservation too.
var releaseKinds = map[string][]string{
	"MemFree": {"allocations"}, "MemRelease": {"chunks"}, "MemAddressFree": {"reservations"},
	"MemUnmap": {"mappings", "reservations"}, "HostFree": {"host-allocs"}, "StreamDestroy": {"streams"},
	"EventDestroy": {"events"}, "ModuleUnload": {"modules"}, "GraphDestroy": {"graphs"},
	"GraphExecDestroy": {"graph-execs"}, "CommDestroy": {"comms"},
}

// keptByRelease reports whether live (gpu.HandleCounts.String) holds only what
// a failed release of op may keep: one handle of each of its kinds.
func keptByRelease(op string, live gpu.HandleCounts) bool {
	kinds := releaseKinds[op]
	for _, kv := range strings.Fields(live.String()) {
		k, v, _ := strings.Cut(kv, "=")
		if !slices.Contains(kinds, k) || v != "1" {
			return false
		}
	}
	return true
}

// updateOps are the graph updates whose refusal (gpu.ErrGraphUpdate) the
// strategies answer by re-recording: each is also swept refused.
var updateOps = map[string]bool{
	"GraphExecUpdate": true, "GraphExecKernelNodeSetParams": true, "GraphExecMemcpyNodeSetParams": true,
	"GraphExecMemsetNodeSetParams": true, "GraphExecChildGraphNodeSetParams": true,
}

// oomOps fail with gpu.ErrOutOfMemory besides gpu.ErrInjected.
var oomOps = map[string]bool{
	"MemAlloc": true, "MemCreate": true, "MemAddressReserve": true, "MemMap": true, "HostAlloc": true,
}

// Run runs the campaign. It returns an error only when the campaign itself
// cannot run (a workload that does not build, a backend without fault
// injection, a clean trial that fails); the faults' outcomes are in the
// report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	start := time.Now()
	goroutines := runtime.NumGoroutine()
	rep := &Report{}
	ops := Ops()
	for _, name := range cfg.Workloads {
		w, err := workload.New(name, Shape(name))
		if err != nil {
			return nil, fmt.Errorf("faultcampaign: %w", err)
		}
		// The eager reference: outputs of every step, and the states
		// before every step.
		for _, pat := range cfg.Patterns {
			eager := Variant{Name: "eager", Options: sg.Options{Strategy: sg.StrategyEager}, Steps: cfg.Steps}
			for _, v := range cfg.Variants {
				eager.Steps = max(eager.Steps, v.Steps)
			}
			ref := &trial{cfg: &cfg, w: w, pattern: pat, v: eager, ops: ops, collect: true}
			ref.run(ctx)
			if len(ref.problems) > 0 {
				return nil, fmt.Errorf("faultcampaign: %s: eager reference run: %s", name, strings.Join(ref.problems, "; "))
			}
			for _, v := range cfg.Variants {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				cell, err := sweep(ctx, &cfg, w, pat, v, ops, ref, len(rep.Cells))
				if err != nil {
					return nil, err
				}
				rep.Cells = append(rep.Cells, cell)
				if cfg.Progress != nil {
					cfg.Progress(cell)
				}
			}
		}
	}
	rep.Goroutines = settleGoroutines(goroutines) - goroutines
	rep.Duration = time.Since(start)
	return rep, nil
}

// settleGoroutines waits up to a second for the goroutine count to fall to
// want (goroutines that are ending), and returns the count.
func settleGoroutines(want int) int {
	n := runtime.NumGoroutine()
	for i := 0; n > want && i < 100; i++ {
		time.Sleep(10 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	return n
}

// sweep runs the clean trial of (w, pat, v), the index-th cell of the run,
// and then a trial per site (per sampled site, with Config.Every).
func sweep(ctx context.Context, cfg *Config, w *workload.Workload, pat workload.Pattern, v Variant, ops []string, ref *trial, index int) (Cell, error) {
	start := time.Now()
	cell := Cell{Workload: w.Name, Pattern: pat, Variant: v.Name, Fired: map[string]int{}}
	clean := &trial{cfg: cfg, w: w, pattern: pat, v: v, ops: ops, ref: ref, count: map[string]map[string]int{}}
	clean.run(ctx)
	if len(clean.problems) > 0 {
		return cell, fmt.Errorf("faultcampaign: %s (%s buffers) with %s: clean trial: %s", w.Name, pat, v.Name, strings.Join(clean.problems, "; "))
	}
	sites := sample(clean.sites(cfg.PerSite), cfg.Every, cfg.Offset+index)
	for _, n := range clean.count {
		for _, c := range n {
			cell.Sites += c
		}
	}
	for _, s := range sites {
		if err := ctx.Err(); err != nil {
			return cell, err
		}
		t := &trial{cfg: cfg, w: w, pattern: pat, v: v, ops: ops, ref: ref, fault: &s}
		f := t.run(ctx)
		cell.Tried++
		cell.Counts[f.Outcome]++
		if f.Outcome != NotReached {
			cell.Fired[s.Op]++
		}
		if t.leaked {
			cell.Leaks++
		}
		if f.Outcome != Recovered && f.Outcome != NotReached {
			cell.Faults = append(cell.Faults, f)
		}
	}
	cell.Duration = time.Since(start)
	return cell, nil
}

// pick returns at most k of 0..n-1: all when k <= 0 or n <= k, else the
// first, the last and evenly spread ones between.
func pick(n, k int) []int {
	if k <= 0 || n <= k {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	if k == 1 {
		return []int{0}
	}
	var out []int
	for i := range k {
		v := i * (n - 1) / (k - 1)
		if len(out) == 0 || out[len(out)-1] != v {
			out = append(out, v)
		}
	}
	return out
}

// sample returns every every-th of sites starting at rotation mod every;
// all of them when every <= 1.
func sample(sites []Site, every, rotation int) []Site {
	if every <= 1 {
		return sites
	}
	var out []Site
	for i := ((rotation % every) + every) % every; i < len(sites); i += every {
		out = append(out, sites[i])
	}
	return out
}

// trial is one life of an executable, clean or with one fault.
type trial struct {
	cfg     *Config
	w       *workload.Workload
	pattern workload.Pattern
	v       Variant
	ops     []string
	ref     *trial // the eager reference (nil for the reference itself)

	// The clean trial's counts: per phase, per op. Phases in order.
	count  map[string]map[string]int
	phases []string
	// The reference's outputs per step and states before each step.
	collect bool
	digests []workload.Digest
	states  [][][]byte

	fault    *Site
	fired    bool
	faultErr error // what the faulted call returned
	absorbed string
	problems []string
	closed   bool
	leaked   bool   // handles left live, not by a reported release fault
	leakNote string // handles a reported release fault kept

	fi  gpu.FaultInjector
	exe *sg.Executable
	log logBuffer
	lg  *slog.Logger // writes to log, at debug level
}

// steps is the number of steps of the trial.
func (t *trial) steps() int {
	if t.v.Steps > 0 {
		return t.v.Steps
	}
	return t.cfg.Steps
}

func (t *trial) fail(format string, args ...any) {
	t.problems = append(t.problems, fmt.Sprintf(format, args...))
}

// sites lists the clean trial's sites, at most perSite call indices per
// (phase, op).
func (t *trial) sites(perSite int) []Site {
	var out []Site
	for _, ph := range t.phases {
		ops := make([]string, 0, len(t.count[ph]))
		for op := range t.count[ph] {
			ops = append(ops, op)
		}
		sort.Strings(ops)
		for _, op := range ops {
			for _, n := range pick(t.count[ph][op], perSite) {
				out = append(out, Site{Phase: ph, Op: op, Nth: n})
				if updateOps[op] {
					out = append(out, Site{Phase: ph, Op: op, Nth: n, Refuse: true})
				}
			}
		}
	}
	return out
}

// do runs phase f: with the fault armed when it is this phase's, counting
// every op's calls in the clean trial, and turning a panic into a problem.
func (t *trial) do(phase string, f func() error) (err error) {
	var before []int
	if t.count != nil {
		before = make([]int, len(t.ops))
		for i, op := range t.ops {
			before[i] = t.fi.Calls(op)
		}
	}
	armed := t.fault != nil && !t.fired && t.fault.Phase == phase
	var c0 int
	if armed {
		c0 = t.fi.Calls(t.fault.Op)
		var extra error
		switch {
		case t.fault.Refuse:
			extra = &gpu.UpdateError{Op: t.fault.Op, Result: gpu.UpdateNotSupported, Detail: "refused by the fault campaign"}
		case oomOps[t.fault.Op]:
			extra = gpu.ErrOutOfMemory
		}
		t.fi.InjectFault(t.fault.Op, t.fault.Nth, extra)
	}
	func() {
		defer func() {
			if r := recover(); r != nil {
				buf := make([]byte, 4096)
				buf = buf[:runtime.Stack(buf, false)]
				t.fail("panic in %s: %v\n%s", phase, r, buf)
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		err = f()
	}()
	if armed {
		t.fi.ClearFaults()
		if t.fi.Calls(t.fault.Op)-c0 > t.fault.Nth {
			t.fired = true
			t.faultErr = err
		}
	}
	if t.count != nil {
		if _, ok := t.count[phase]; !ok {
			t.phases = append(t.phases, phase)
			t.count[phase] = map[string]int{}
		}
		for i, op := range t.ops {
			if n := t.fi.Calls(op) - before[i]; n > 0 {
				t.count[phase][op] += n
			}
		}
	}
	return err
}

// step runs phase f and, when it fails because of the fault, checks the
// error and, with retry, runs restore and retries f once. It returns nil
// when the phase (or its retry) succeeded, or failed by the fault without
// retry.
func (t *trial) step(phase string, f func() error, restore func() error, retry bool) error {
	firedBefore := t.fired
	err := t.do(phase, f)
	firedHere := t.fired && !firedBefore
	if err == nil {
		if firedHere {
			t.absorbed = phase
			t.checkAbsorbed(phase)
		}
		return nil
	}
	if !firedHere {
		if errors.Is(err, sg.ErrClosed) && t.fired {
			t.closed = true
			return err
		}
		t.fail("%s failed without a fault there: %v", phase, err)
		return err
	}
	t.checkFaultErr(phase, err)
	if !retry {
		return nil
	}
	if restore != nil {
		if rerr := restore(); rerr != nil {
			if errors.Is(rerr, sg.ErrClosed) {
				t.closed = true
				return rerr
			}
			t.fail("after the fault in %s: restore failed: %v", phase, rerr)
			return rerr
		}
	}
	if err := t.do(phase+" (retry)", f); err != nil {
		if errors.Is(err, sg.ErrClosed) {
			t.closed = true
			return err
		}
		t.fail("not usable after the fault: %s retried: %v", phase, err)
		return err
	}
	return nil
}

// checkFaultErr checks that err, returned by the phase the fault hit,
// reports it: it wraps gpu.ErrInjected and names the entry point.
func (t *trial) checkFaultErr(phase string, err error) {
	if !errors.Is(err, gpu.ErrInjected) {
		t.fail("%s: the error does not wrap the injected fault: %v", phase, err)
	} else if !strings.Contains(err.Error(), t.fault.Op) {
		t.fail("%s: the error does not name %s: %v", phase, t.fault.Op, err)
	}
}

// run runs the trial and classifies it.
func (t *trial) run(ctx context.Context) Fault {
	res := Fault{Workload: t.w.Name, Pattern: t.pattern, Variant: t.v.Name}
	if t.fault != nil {
		res.Site = *t.fault
	}
	t.body(ctx)
	switch {
	case t.fault == nil:
	case len(t.problems) > 0:
		res.Outcome, res.Problem = Failed, strings.Join(t.problems, "; ")
	case !t.fired:
		res.Outcome = NotReached
	case t.closed:
		res.Outcome = Closed
	case t.faultErr == nil:
		res.Outcome, res.Problem = Absorbed, t.absorbed
	case t.absorbed != "":
		res.Outcome, res.Problem = Absorbed, t.absorbed
	default:
		res.Outcome = Recovered
	}
	if res.Outcome == Recovered && t.absorbed == "" && t.leakNote != "" {
		res.Outcome, res.Problem = ReleaseLeak, t.leakNote
	}
	if t.faultErr != nil {
		res.Err = t.faultErr.Error()
	}
	return res
}

// body is the trial: see the package doc.
func (t *trial) body(ctx context.Context) {
	goroutines := runtime.NumGoroutine()
	b, err := t.cfg.Open()
	if err != nil {
		t.fail("open backend: %v", err)
		return
	}
	fi, ok1 := gpu.FaultInjectorOf(b)
	hc, ok2 := gpu.HandleCounterOf(b)
	if !ok1 || !ok2 {
		t.fail("backend %s implements neither gpu.FaultInjector nor gpu.HandleCounter", b.Name())
		t.fired = t.fault != nil // nothing to classify
		_ = b.Close()
		return
	}
	t.fi = fi
	t.lg = slog.New(slog.NewTextHandler(&t.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var (
		caller *workload.Caller
		cl     *client.Client
		exe    *sg.Executable
		cache  = streamcache.New(streamcache.Options{})
	)
	defer func() {
		if exe != nil {
			if err := t.step("close-exe", exe.Close, nil, false); err != nil {
				t.fail("close-exe: %v", err)
			}
		}
		if cl != nil {
			if err := t.step("close-client", cl.Close, nil, false); err != nil {
				t.fail("close-client: %v", err)
			}
		}
		if caller != nil {
			if err := caller.Close(); err != nil {
				t.fail("close caller: %v", err)
			}
		}
		if err := cache.Purge(b); err != nil {
			t.fail("purge stream cache: %v", err)
		}
		live := hc.LiveHandles()
		switch {
		case live.IsZero():
		case t.fired && t.faultErr != nil && keptByRelease(t.fault.Op, live):
			t.leakNote = "kept " + live.String()
		default:
			t.leaked = true
			t.fail("leak: handles live once everything was closed: %s", live)
		}
		if err := b.Close(); err != nil && live.IsZero() {
			t.fail("close backend: %v", err)
		}
		if n := settleGoroutines(goroutines); n > goroutines {
			t.fail("%d goroutines left behind", n-goroutines)
		}
	}()

	// Remap's caller allocates remappable buffers, the memory it maps.
	if caller, err = workload.NewCallerWith(b, 0, t.w, t.pattern, 1, workload.CallerOptionsFor(t.v.Options.Strategy)); err != nil {
		t.fail("caller: %v", err)
		return
	}
	openClient := func() error {
		c, err := client.Open(b, client.Options{Devices: []int{0}, StreamCache: cache, Logger: t.lg})
		cl = c
		return err
	}
	if err := t.step("open-client", openClient, nil, true); err != nil || cl == nil {
		return
	}
	s, err := cl.Stream(0, 0)
	if err != nil {
		t.fail("client stream: %v", err)
		return
	}
	compile := func() error {
		opts := t.v.Options
		opts.Logger = t.lg
		if opts.Remap.Memory == nil {
			opts.Remap.Memory = caller.Remappable()
		}
		e, err := sg.Compile(ctx, b, t.w.Program, opts)
		exe, t.exe = e, e
		return err
	}
	if err := t.step("compile", compile, nil, true); err != nil || exe == nil {
		return
	}
	initial := make([][]byte, len(t.w.States))
	for j, st := range t.w.States {
		initial[j] = st.Data
	}
	if t.collect {
		t.states = append(t.states, initial)
	}
	if err := t.step("init", func() error { return t.writeStates(ctx, exe, initial) }, nil, true); err != nil {
		return
	}
	for i := range t.steps() {
		bind, err := caller.Bind(i)
		if err != nil {
			t.fail("bind step %d: %v", i, err)
			return
		}
		var outs sg.Outputs
		run := func() error {
			o, err := exe.Run(ctx, s, bind)
			outs = o
			return err
		}
		restore := func() error {
			// A failed step may have enqueued part of its work and updated
			// part of the states: put back the states the reference had
			// before this step. WriteBuffer must wait for that work by
			// itself (the executable orders everything after its last
			// step, failed or not), so the trial does not synchronize.
			if t.ref == nil {
				return nil
			}
			return t.writeStates(ctx, exe, t.ref.states[i])
		}
		if err := t.step(fmt.Sprintf("run[%d]", i), run, restore, true); err != nil {
			return
		}
		var point uint64
		submit := func() error {
			p, err := cl.Submitted(0, 0)
			if p != 0 {
				point = p
			}
			return err
		}
		if err := t.step(fmt.Sprintf("submit[%d]", i), submit, nil, true); err != nil {
			return
		}
		// The caller frees a buffer after the step: retired at its point.
		scratch, err := b.MemAlloc(0, 256)
		if err != nil {
			t.fail("scratch: %v", err)
			return
		}
		batch := retire.Batch{{Bytes: 256, Release: func() error { return b.MemFree(scratch) }}}
		// Retire owns the batch once queued, even when it fails: no retry.
		if err := t.step(fmt.Sprintf("retire[%d]", i), func() error { return cl.Retire(ctx, 0, batch, point) }, nil, false); err != nil {
			return
		}
		var got [][]byte
		read := func() error {
			got = got[:0]
			for _, buf := range t.w.Outputs {
				d, err := exe.ReadOutput(ctx, outs, buf)
				if err != nil {
					return err
				}
				got = append(got, d)
			}
			return nil
		}
		if err := t.step(fmt.Sprintf("read[%d]", i), read, nil, true); err != nil {
			return
		}
		outs.Release()
		h := sha256.New()
		for _, d := range got {
			h.Write(d)
		}
		var d workload.Digest
		h.Sum(d[:0])
		switch {
		case t.collect:
			t.digests = append(t.digests, d)
			st := make([][]byte, len(t.w.States))
			for j, si := range t.w.States {
				if st[j], err = exe.ReadBuffer(ctx, si.Buffer); err != nil {
					t.fail("read state %s: %v", si.Buffer.Name(), err)
					return
				}
			}
			t.states = append(t.states, st)
		case t.ref != nil && d != t.ref.digests[i]:
			t.fail("step %d: outputs differ from eager", i)
		}
	}
	if err := t.step("synchronize", func() error { return cl.Synchronize(ctx) }, nil, true); err != nil {
		return
	}
}

func (t *trial) writeStates(ctx context.Context, exe *sg.Executable, data [][]byte) error {
	for j, st := range t.w.States {
		if err := exe.WriteBuffer(ctx, st.Buffer, data[j]); err != nil {
			return err
		}
	}
	return nil
}

// checkAbsorbed checks that a fault the phase absorbed (no error) is
// recorded: in Choice when Compile fell back (auto), else in a TraceInfo
// reason (patch gives up a command's template without shadow memory) or in
// the executable's or client's log (a refused update re-recorded, a stream
// replaced).
func (t *trial) checkAbsorbed(phase string) {
	op := t.fault.Op
	if phase == "compile" && t.exe != nil {
		c := t.exe.Choice()
		text := c.Reason
		for _, cand := range c.Candidates {
			text += "\n" + cand.Note
		}
		if !strings.Contains(text, op) {
			t.fail("compile absorbed the fault without recording it in Choice (strategy %s, reason %q)", c.Strategy, c.Reason)
			return
		}
		t.absorbed = fmt.Sprintf("compile: %s ran %s, Choice records the fault", c.Requested, c.Strategy)
		return
	}
	if t.exe != nil {
		for _, ti := range t.exe.Traces() {
			if strings.Contains(ti.Reason, op) {
				t.absorbed = fmt.Sprintf("%s: %s not patchable, TraceInfo records the fault", phase, ti.Command)
				return
			}
		}
	}
	for _, line := range strings.Split(t.log.String(), "\n") {
		if strings.Contains(line, op) {
			msg := line
			if _, after, ok := strings.Cut(line, "msg="); ok {
				msg = after
				if q, err := strconv.QuotedPrefix(after); err == nil {
					msg = q
				}
			}
			t.absorbed = fmt.Sprintf("%s: logged %s", phase, msg)
			return
		}
	}
	t.fail("%s absorbed the fault without recording it (neither Choice, TraceInfo nor the log names %s)", phase, op)
}

// logBuffer collects a trial's logs.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
