// Package soak runs a workload for a long time, every strategy in turn,
// with the caller's buffers moving, and checks that the outputs stay equal
// to eager's and that memory stays flat.
//
// # The run
//
// Run cycles through Config.Strategies in segments of Config.Segment: each
// segment compiles the workload with the next strategy, gives it the states
// the previous segment left (a training run goes on across strategies),
// runs steps until the segment's time is up, takes the states back and
// closes the executable. Every step binds the caller's buffers for that
// step (workload.Caller; random placement by default, so every buffer moves
// every step), runs it and waits for it.
//
// Every Config.CheckEvery-th step is checked, and the first step of every
// segment: an eager executable (compiled
// once, with buffers of its own) is given the states the strategy under
// test has before the step, both run the step on the same inputs, and the
// outputs and the states after it must be bit for bit equal. A check is
// thus exact for that step's whole transition, whatever the workload keeps
// in its states.
//
// # Memory
//
// After a step, at most one every Config.SampleEvery (a thirtieth of a
// segment by default, so that a segment of any length has enough samples
// for a trend), Run samples the device memory in use (MemGetInfo: total -
// free), the executable's own memory (Executable.Memory), the backend's
// live handles (gpu.LiveHandles) and the Go heap. Segments of
// Config.SegmentSteps steps are sampled by count instead, after each
// checked step: as many samples on a loaded machine as on an idle one.
// Samples of each segment's first Config.Warmup steps are left out of the
// trend (caches fill then: traces, pool slots, retired graphs waiting for
// their release).
//
// A segment of a strategy that has no trend yet runs on past its time
// until it has three samples after its warm-up, for at most three more
// segments' time: a short soak on a slow device is judged rather than cut
// off before its first trend, and a soak longer than asked says so in its
// duration.
//
// Trends are taken within one executable's life: per segment, never
// across segments. Memory is flat when, in every segment, the average of
// the last third of its samples exceeds that of the first third by no more
// than the tolerance (Config.Tolerance bytes, or 1%); the same holds for
// live handles. A strategy reports its worst segment (the largest growth
// beyond the tolerance). Two segments of one strategy may hold different
// amounts for good reasons: auto measures its candidates anew in each and
// may keep another one (stable, patch and pool hold different numbers of
// graphs, events and slots), so a series that steps between segments but
// is flat within each is flat. A segment with fewer than three samples
// after warm-up has no trend. What an executable leaves behind is judged
// apart: after each segment, with the executable closed, the device
// memory, live handles, goroutines and Go heap (after a GC) must come back
// to where they were after the first cycle of strategies (after the first
// segment, in a soak too short for three baselines beyond that cycle): the
// baseline trend. The first cycle is left out because a strategy's first
// use may set up driver state for the life of the process.
//
// The verdict (Report.Memory) is "grows" when a trend of three samples or
// more grows, else "too_few_samples" when a strategy has no segment with a
// trend or there are fewer than three judged baselines (a short or
// interrupted soak: nothing was judged, so it neither passes nor grows:
// too few samples never read as growth), else "flat".
//
// # Progress
//
// Config.Progress is called every Config.Interval (and at the end) with the
// steps run, checks, mismatches and memory so far. The interval sets
// nothing else.
package soak

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"strings"
	"time"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/report"
	"github.com/stablegraph/stablegraph/workload"
)

// Config configures Run. The zero value is valid; defaults are applied in
// withDefaults.
type Config struct {
	// Workload is the workload's name (workload.Names). Default "mlp".
	Workload string
	// Shape configures the workload (zero fields: its defaults).
	Shape workload.Config
	// Built, when set, is the workload to soak, already built (Workload
	// and Shape are then ignored): a caller that built it to check its
	// flags need not build it twice (gpt2-decode's weights take seconds).
	Built *workload.Workload
	// Duration is how long to run. Default 1 minute. Every strategy runs
	// at least one whole segment, so a run may last longer when the
	// segments do not fit.
	Duration time.Duration
	// CheckEvery is k: every k-th step is checked against eager. Default
	// 10.
	CheckEvery int
	// Strategies run in turn. Default stablegraph.Strategies().
	Strategies []sg.Strategy
	// Segment is how long each strategy runs before the next takes over.
	// Default: Duration / (2 × strategies), so that each strategy runs at
	// least twice, between 1 second and 5 minutes.
	Segment time.Duration
	// SegmentSteps, when positive, makes each segment that many steps
	// instead of Segment's time, sampled by count (after every checked
	// step): a soak whose samples do not depend on the machine's speed.
	// Segments still take turns until Duration has passed, every strategy
	// at least once.
	SegmentSteps int
	// Warmup is the number of steps at the start of each segment left out
	// of the memory trend. Default 50.
	Warmup int
	// Pattern is how the caller's buffers move. Default workload.Random.
	Pattern workload.Pattern
	// Device is the device ordinal. Default 0.
	Device int
	// Seed seeds the caller's buffer placement (the workload's data has
	// Shape.Seed). Default 1.
	Seed uint64
	// Tolerance is the device memory growth, in bytes, that still counts
	// as flat (beside 1% of the first third's average). Default 1 MiB.
	Tolerance uint64
	// Interval is the period of Progress calls, and nothing else. Default
	// 30 s.
	Interval time.Duration
	// SampleEvery is the least time between two memory samples, which
	// bounds the samples of a long soak. Default Segment / 30: up to 30
	// samples a segment, whatever the duration. Not used with
	// SegmentSteps.
	SampleEvery time.Duration
	// Progress, when set, receives the progress every Interval and at the
	// end.
	Progress func(Progress)
	// Logger receives the executables' logs. Default slog.Default().
	Logger *slog.Logger
}

// ErrSwap refuses workload.Swap: a check runs the step on an eager
// executable with buffers of its own, fixed, whose sequences do not follow
// the rows the swap pattern gives other sequences, so every check would
// differ.
var ErrSwap = errors.New("soak: pattern swap cannot be soaked: the eager check has its own sequences, which do not follow the swapped rows; use fixed, pingpong or random")

// Defaults of Config.
const (
	DefaultDuration   = time.Minute
	DefaultCheckEvery = 10
	DefaultWarmup     = 50
	DefaultTolerance  = 1 << 20
	DefaultInterval   = 30 * time.Second
)

func (c Config) withDefaults() (Config, error) {
	if c.Workload == "" {
		c.Workload = "mlp"
	}
	if c.Duration <= 0 {
		c.Duration = DefaultDuration
	}
	if c.CheckEvery <= 0 {
		c.CheckEvery = DefaultCheckEvery
	}
	if len(c.Strategies) == 0 {
		c.Strategies = sg.Strategies()
	}
	if c.Segment <= 0 {
		c.Segment = min(max(c.Duration/time.Duration(2*len(c.Strategies)), time.Second), 5*time.Minute)
	}
	if c.Warmup < 0 {
		return c, fmt.Errorf("soak: negative warm-up %d", c.Warmup)
	}
	if c.Warmup == 0 {
		c.Warmup = DefaultWarmup
	}
	if c.Pattern == "" {
		c.Pattern = workload.Random
	}
	if c.Pattern == workload.Swap {
		return c, ErrSwap
	}
	if c.SegmentSteps < 0 {
		return c, fmt.Errorf("soak: negative segment steps %d", c.SegmentSteps)
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Tolerance == 0 {
		c.Tolerance = DefaultTolerance
	}
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.SampleEvery <= 0 {
		c.SampleEvery = c.Segment / 30
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// Progress is the state of a soak, as reported every Config.Interval.
type Progress struct {
	Elapsed, Duration time.Duration
	Steps, Checks     int64
	Mismatches        int64
	Strategy          sg.Strategy // running now
	Segment           int
	// UsedBytes is the device memory in use at the last sample;
	// PeakUsedBytes the most since the last Progress.
	UsedBytes, PeakUsedBytes uint64
	Handles                  int // live handles at the last sample (-1: unknown)
	HeapBytes                uint64
	Final                    bool
}

func (p Progress) String() string {
	s := fmt.Sprintf("%v/%v (%v left) steps %d checks %d mismatches %d; %s (segment %d); device used %s (peak %s)",
		p.Elapsed.Round(time.Second), p.Duration, max(p.Duration-p.Elapsed, 0).Round(time.Second),
		p.Steps, p.Checks, p.Mismatches, p.Strategy, p.Segment,
		report.FormatBytes(p.UsedBytes), report.FormatBytes(p.PeakUsedBytes))
	if p.Handles >= 0 {
		s += fmt.Sprintf(", %d live handles", p.Handles)
	}
	return s + fmt.Sprintf(", Go heap %s", report.FormatBytes(p.HeapBytes))
}

// Sample is one memory sample, taken after a step (see the package doc).
type Sample struct {
	ElapsedS float64 `json:"elapsed_s"`
	Step     int64   `json:"step"`
	Strategy string  `json:"strategy"`
	Segment  int     `json:"segment"`
	// Warmup: taken in the first Config.Warmup steps of its segment, left
	// out of the trend.
	Warmup          bool   `json:"warmup,omitempty"`
	UsedBytes       uint64 `json:"device_used_bytes"`
	ExecutableBytes uint64 `json:"executable_bytes"`
	Handles         int    `json:"live_handles"`
	HeapBytes       uint64 `json:"go_heap_bytes"`
}

// Trend compares the average of the last third of a series of samples with
// that of the first third.
type Trend struct {
	Samples    int     `json:"samples"`
	FirstThird float64 `json:"first_third_avg"`
	LastThird  float64 `json:"last_third_avg"`
	Growth     float64 `json:"growth"`
	Tolerance  float64 `json:"tolerance"`
	Flat       bool    `json:"flat"`
}

// samples is "1 sample", "n samples".
func samples(n int) string {
	if n == 1 {
		return "1 sample"
	}
	return fmt.Sprintf("%d samples", n)
}

// minTrendSamples is the fewest samples a trend is taken over.
const minTrendSamples = 3

// trendOf computes the trend of vals, flat when the growth is at most
// max(abs, rel × first third's average). Fewer than three samples are flat
// by default (nothing to compare).
func trendOf(vals []float64, abs, rel float64) Trend {
	t := Trend{Samples: len(vals), Flat: true}
	if len(vals) < minTrendSamples {
		return t
	}
	third := len(vals) / 3
	avg := func(v []float64) float64 {
		var s float64
		for _, x := range v {
			s += x
		}
		return s / float64(len(v))
	}
	t.FirstThird, t.LastThird = avg(vals[:third]), avg(vals[len(vals)-third:])
	t.Growth = t.LastThird - t.FirstThird
	t.Tolerance = max(abs, rel*t.FirstThird)
	t.Flat = t.Growth <= t.Tolerance
	return t
}

// segmentTrend computes the trend of val over the samples of strategy
// after warm-up, per segment (within one executable's life), and returns
// the worst: the one growing most beyond its tolerance, and its segment.
// With no segment of three samples or more it returns a flat trend of
// every sample and segment -1 (too few to judge).
func segmentTrend(samples []Sample, strategy string, val func(Sample) float64, abs, rel float64) (Trend, int) {
	var segs []int
	bySeg := map[int][]float64{}
	n := 0
	for _, smp := range samples {
		if smp.Strategy != strategy || smp.Warmup {
			continue
		}
		if _, ok := bySeg[smp.Segment]; !ok {
			segs = append(segs, smp.Segment)
		}
		bySeg[smp.Segment] = append(bySeg[smp.Segment], val(smp))
		n++
	}
	worst, worstSeg := Trend{Samples: n, Flat: true}, -1
	for _, seg := range segs {
		t := trendOf(bySeg[seg], abs, rel)
		if t.Samples < minTrendSamples {
			continue
		}
		if worstSeg < 0 || t.Growth-t.Tolerance > worst.Growth-worst.Tolerance {
			worst, worstSeg = t, seg
		}
	}
	return worst, worstSeg
}

// segmentTrendString is t and the segment it was taken in.
func segmentTrendString(t Trend, seg int) string {
	if seg < 0 {
		return samples(t.Samples) + " (too few in every segment for a trend)"
	}
	return fmt.Sprintf("%s in segment %d", t, seg)
}

func (t Trend) String() string {
	if t.Samples < minTrendSamples {
		return samples(t.Samples) + " (too few for a trend)"
	}
	verdict := "flat"
	if !t.Flat {
		verdict = "GROWS"
	}
	return fmt.Sprintf("%s: %.0f -> %.0f (%+.0f, tolerance %.0f, %d samples)", verdict, t.FirstThird, t.LastThird, t.Growth, t.Tolerance, t.Samples)
}

// StrategyReport is what one strategy did over all its segments.
type StrategyReport struct {
	Strategy   string `json:"strategy"`
	Segments   int    `json:"segments"`
	Steps      int64  `json:"steps"`
	Checks     int64  `json:"checks"`
	Mismatches int64  `json:"mismatches"`
	// FirstMismatch is the first step whose check failed, -1 when none.
	FirstMismatch   int64  `json:"first_mismatch"`
	PeakDeviceBytes uint64 `json:"peak_device_used_bytes"`
	ExecutableBytes uint64 `json:"executable_bytes"`
	// Device and Handles are the trends of the device memory in use and
	// the live handles over the samples after warm-up of one segment: the
	// worst segment's, which DeviceSegment and HandlesSegment name (-1:
	// no segment had enough samples). See the package doc.
	Device         Trend `json:"device_trend"`
	Handles        Trend `json:"handles_trend"`
	DeviceSegment  int   `json:"device_trend_segment"`
	HandlesSegment int   `json:"handles_trend_segment"`
	// Ran is the strategy that ran (auto's choice), when it differs; the
	// choices of its segments, comma-separated in the order first made,
	// when they differ between segments.
	Ran string `json:"ran,omitempty"`
	// Unsupported says why the device cannot run the strategy (Compile
	// refused it with gpu.ErrNotSupported: the device strategy without its
	// patcher, pool without VMM); its segments are skipped, and it is not
	// judged.
	Unsupported string `json:"unsupported,omitempty"`
}

// Report is a soak's result.
type Report struct {
	Workload  string  `json:"workload"`
	Pattern   string  `json:"pattern"`
	Backend   string  `json:"backend"`
	Device    string  `json:"device"`
	DurationS float64 `json:"duration_s"`
	Steps     int64   `json:"steps"`
	Checks    int64   `json:"checks"`
	// Mismatches counts checked steps whose outputs or states differed
	// from eager's. It must be 0.
	Mismatches      int64            `json:"mismatches"`
	PeakDeviceBytes uint64           `json:"peak_device_used_bytes"`
	Strategies      []StrategyReport `json:"strategies"`
	// Baseline trends are sampled after each segment, with its executable
	// closed: device memory in use, live handles, goroutines, Go heap after
	// a GC.
	BaselineDevice     Trend `json:"baseline_device_trend"`
	BaselineHandles    Trend `json:"baseline_handles_trend"`
	BaselineGoroutines Trend `json:"baseline_goroutines_trend"`
	BaselineHeap       Trend `json:"baseline_heap_trend"`
	// Memory is the memory verdict: MemoryFlat, MemoryGrows or
	// MemoryTooFewSamples (see the package doc). Unjudged lists what had
	// too few samples: strategies without a segment of three samples
	// after warm-up, and "baseline" for fewer than three segments.
	Memory   string   `json:"memory"`
	Unjudged []string `json:"unjudged,omitempty"`
	// MemoryFlat: Memory is MemoryFlat (every trend above was judged and
	// is flat).
	MemoryFlat  bool     `json:"memory_flat"`
	Interrupted bool     `json:"interrupted,omitempty"`
	Error       string   `json:"error,omitempty"`
	Samples     []Sample `json:"samples"`
}

// Memory verdicts (Report.Memory).
const (
	MemoryFlat          = "flat"
	MemoryGrows         = "grows"
	MemoryTooFewSamples = "too_few_samples"
)

// OK reports whether the soak passed: no error, no mismatch, memory judged
// and flat.
func (r *Report) OK() bool { return r.Error == "" && r.Mismatches == 0 && r.MemoryFlat }

// WriteText writes the report for people: a line per strategy and the
// verdicts.
func (r *Report) WriteText(w io.Writer) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "soak: %s (%s buffers) on %s (%s): %.0f s, %d steps, %d checked against eager, %d mismatches, peak device memory in use %s\n",
		r.Workload, r.Pattern, r.Backend, r.Device, r.DurationS, r.Steps, r.Checks, r.Mismatches, report.FormatBytes(r.PeakDeviceBytes))
	tw := report.NewTabWriter(&b)
	fmt.Fprintln(tw, "strategy\tsegments\tsteps\tchecks\tmismatches\tpeak used\texecutable\tdevice memory trend (bytes, worst segment)\tlive handles trend (worst segment)")
	for _, s := range r.Strategies {
		name := s.Strategy
		if s.Ran != "" {
			name += " (" + s.Ran + ")"
		}
		if s.Unsupported != "" {
			fmt.Fprintf(tw, "%s\tnot supported here: %s\n", name, s.Unsupported)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", name, s.Segments, s.Steps, s.Checks, s.Mismatches,
			report.FormatBytes(s.PeakDeviceBytes), report.FormatBytes(s.ExecutableBytes),
			segmentTrendString(s.Device, s.DeviceSegment), segmentTrendString(s.Handles, s.HandlesSegment))
	}
	tw.Flush()
	fmt.Fprintf(&b, "after each segment: device memory %s; live handles %s; goroutines %s; Go heap %s\n",
		r.BaselineDevice, r.BaselineHandles, r.BaselineGoroutines, r.BaselineHeap)
	verdict := "PASS"
	switch {
	case r.Error != "" || r.Mismatches > 0 || r.Memory == MemoryGrows:
		verdict = "FAIL"
	case !r.OK():
		verdict = "NOT JUDGED"
	}
	fmt.Fprintf(&b, "%s: mismatches %d, memory ", verdict, r.Mismatches)
	if r.Memory == MemoryTooFewSamples {
		fmt.Fprintf(&b, "not judged: too few samples for a trend (%s); run longer (--duration), or with longer segments (--segment) or a shorter warm-up (--warmup)",
			strings.Join(r.Unjudged, ", "))
	} else {
		b.WriteString(r.Memory)
	}
	if r.Interrupted {
		b.WriteString(", interrupted")
	}
	if r.Error != "" {
		b.WriteString(", error: " + r.Error)
	}
	b.WriteString("\n")
	_, err := w.Write(b.Bytes())
	return err
}

// Run soaks b with cfg. The error is for a soak that could not start (a
// bad configuration, a workload that does not build); a failure while it
// runs is in Report.Error, with the report of what ran until then. A
// cancelled ctx ends the soak early (Report.Interrupted).
func Run(ctx context.Context, b gpu.Backend, cfg Config) (*Report, error) {
	return run(ctx, b, cfg, time.Now)
}

// run is Run on the clock now.
func run(ctx context.Context, b gpu.Backend, cfg Config, now func() time.Time) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	w := cfg.Built
	if w == nil {
		if w, err = workload.New(cfg.Workload, cfg.Shape); err != nil {
			return nil, fmt.Errorf("soak: %w", err)
		}
	}
	if w.Comm != nil {
		return nil, fmt.Errorf("soak: workload %s has a communicator: soak one rank without", w.Name)
	}
	if cfg.Device < 0 || cfg.Device >= b.DeviceCount() {
		return nil, fmt.Errorf("soak: device %d of %d: %w", cfg.Device, b.DeviceCount(), gpu.ErrInvalidValue)
	}
	props, err := b.DeviceProps(cfg.Device)
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	s := &soaker{cfg: cfg, b: b, w: w, now: now, start: now(),
		rep: &Report{Workload: w.Desc, Pattern: string(cfg.Pattern), Backend: b.Name(), Device: props.Name}}
	s.perStrat, s.trended = map[sg.Strategy]*StrategyReport{}, map[sg.Strategy]bool{}
	for _, st := range cfg.Strategies {
		if _, ok := s.perStrat[st]; !ok {
			s.perStrat[st] = &StrategyReport{Strategy: string(st), FirstMismatch: -1}
		}
	}
	if err := s.run(ctx); err != nil {
		s.rep.Error = err.Error()
	}
	s.finish()
	return s.rep, nil
}

type soaker struct {
	cfg   Config
	now   func() time.Time // time.Now; a test's clock
	b     gpu.Backend
	w     *workload.Workload
	start time.Time
	rep   *Report

	perStrat map[sg.Strategy]*StrategyReport
	trended  map[sg.Strategy]bool // has a segment with a trend
	states   [][]byte             // carried from segment to segment

	stream       gpu.Stream
	caller       *workload.Caller // the strategy under test's buffers
	remapCaller  *workload.Caller // remap's (remappable buffers), when remap is soaked
	eagerCaller  *workload.Caller // the eager shadow's
	eager        *sg.Executable
	strategy     sg.Strategy
	segment      int
	lastProgress time.Time
	lastSample   time.Time
	intervalPeak uint64
	last         Sample
	baselines    []baseline
}

type baseline struct {
	used       uint64
	handles    int
	goroutines int
	heap       uint64
}

func (s *soaker) run(ctx context.Context) (err error) {
	b, dev := s.b, s.cfg.Device
	var cleanup []func() error
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			err = errors.Join(err, cleanup[i]())
		}
	}()
	if s.caller, err = workload.NewCaller(b, dev, s.w, s.cfg.Pattern, s.cfg.Seed); err != nil {
		return err
	}
	cleanup = append(cleanup, s.caller.Close)
	if s.eagerCaller, err = workload.NewCaller(b, dev, s.w, workload.Fixed, s.cfg.Seed); err != nil {
		return err
	}
	cleanup = append(cleanup, s.eagerCaller.Close)
	if slices.Contains(s.cfg.Strategies, sg.StrategyRemap) {
		// Remap maps the memory behind the caller's buffers: its segments
		// bind remappable ones, each its own allocation. One step's set
		// is bound now, so that the buffers live between segments are as
		// many after the first segment as after any other.
		opts := workload.CallerOptions{Remappable: true}
		if s.remapCaller, err = workload.NewCallerWith(b, dev, s.w, s.cfg.Pattern, s.cfg.Seed, opts); err != nil {
			return err
		}
		cleanup = append(cleanup, s.remapCaller.Close)
		if _, err := s.remapCaller.Bind(0); err != nil {
			return err
		}
	}
	if s.stream, err = b.StreamCreate(dev, gpu.StreamNonBlocking, 0); err != nil {
		return fmt.Errorf("soak: stream: %w", err)
	}
	cleanup = append(cleanup, func() error { return b.StreamDestroy(s.stream) }, func() error { return b.StreamSynchronize(s.stream) })
	s.eager, err = sg.Compile(ctx, b, s.w.Program, sg.Options{Strategy: sg.StrategyEager, Device: dev, Logger: s.cfg.Logger})
	if err != nil {
		return fmt.Errorf("soak: compile eager: %w", err)
	}
	cleanup = append(cleanup, s.eager.Close)
	for _, st := range s.w.States {
		s.states = append(s.states, st.Data)
	}
	s.baselines = append(s.baselines, s.baseline())
	s.lastProgress = s.now()
	end := s.start.Add(s.cfg.Duration)
	var step int64
	// Every strategy runs at least one whole segment, even when setting
	// them up took the duration: a soak that skipped one would judge it on
	// no samples.
	for seg := 0; s.now().Before(end) || seg < len(s.cfg.Strategies); seg++ {
		if ctx.Err() != nil {
			s.rep.Interrupted = true
			return nil
		}
		s.segment, s.strategy = seg, s.cfg.Strategies[seg%len(s.cfg.Strategies)]
		if s.perStrat[s.strategy].Unsupported != "" {
			if s.allUnsupported() {
				return errors.New("no strategy of the soak can run on this device")
			}
			continue
		}
		segEnd := s.now().Add(s.cfg.Segment)
		if segEnd.After(end) && seg >= len(s.cfg.Strategies) {
			segEnd = end
		}
		if err := s.runSegment(ctx, &step, segEnd); err != nil {
			if ctx.Err() != nil {
				s.rep.Interrupted = true
				return nil
			}
			return fmt.Errorf("segment %d (%s), step %d: %w", seg, s.strategy, step, err)
		}
		s.baselines = append(s.baselines, s.baseline())
	}
	return nil
}

// allUnsupported reports whether no strategy of the soak can run.
func (s *soaker) allUnsupported() bool {
	for _, st := range s.perStrat {
		if st.Unsupported == "" {
			return false
		}
	}
	return true
}

// runSegment runs the current strategy until segEnd (for
// Config.SegmentSteps steps, when set).
func (s *soaker) runSegment(ctx context.Context, step *int64, segEnd time.Time) (err error) {
	b := s.b
	st := s.perStrat[s.strategy]
	caller := s.caller
	if s.strategy == sg.StrategyRemap {
		caller = s.remapCaller
	}
	opts := sg.Options{Strategy: s.strategy, Device: s.cfg.Device, Logger: s.cfg.Logger}
	opts.Remap.Memory = caller.Remappable()
	exe, err := sg.Compile(ctx, b, s.w.Program, opts)
	if errors.Is(err, gpu.ErrNotSupported) && s.strategy != sg.StrategyEager {
		st.Unsupported = err.Error()
		s.cfg.Logger.Warn("soak: the device cannot run the strategy; its segments are skipped", "strategy", s.strategy, "err", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("compile: %w", err)
	}
	defer func() {
		if len(s.states) > 0 && err == nil {
			s.states, err = readStates(ctx, exe, s.w)
		}
		// At the end: auto's choice at Compile is the model's, until its
		// probes decide.
		if c := exe.Choice(); c.Strategy != c.Requested && !slices.Contains(strings.Split(st.Ran, ","), string(c.Strategy)) {
			if st.Ran != "" {
				st.Ran += ","
			}
			st.Ran += string(c.Strategy)
		}
		err = errors.Join(err, exe.Close())
	}()
	st.Segments++
	if err := writeStates(ctx, exe, s.w, s.states); err != nil {
		return err
	}
	byCount := s.cfg.SegmentSteps > 0
	// Past segEnd, a strategy without a trend yet runs on until this
	// segment has one, up to limit.
	limit := segEnd.Add(3 * s.cfg.Segment)
	trend := 0 // samples after the warm-up
	for i := 0; ; i++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch {
		case byCount:
			if i >= s.cfg.SegmentSteps {
				return nil
			}
		case i == 0 || s.now().Before(segEnd):
		default:
			if trend >= minTrendSamples {
				s.trended[s.strategy] = true
			}
			if s.trended[s.strategy] || !s.now().Before(limit) {
				return nil
			}
		}
		n := *step
		warm := i < s.cfg.Warmup
		// Every k-th step is checked, and the first of each segment: the
		// states just handed over from the previous strategy.
		checked := n%int64(s.cfg.CheckEvery) == 0 || i == 0
		if checked {
			ok, err := s.check(ctx, exe, caller, n)
			if err != nil {
				return err
			}
			st.Checks++
			s.rep.Checks++
			if !ok {
				st.Mismatches++
				s.rep.Mismatches++
				if st.FirstMismatch < 0 {
					st.FirstMismatch = n
				}
				s.cfg.Logger.Warn("soak: outputs or states differ from eager", "strategy", s.strategy, "step", n)
			}
		} else if err := s.plainStep(ctx, exe, caller, n); err != nil {
			return err
		}
		if byCount && checked || !byCount && (s.now().Sub(s.lastSample) >= s.cfg.SampleEvery || !warm && trend == 0) {
			s.sample(exe, n, warm)
			if !warm {
				trend++
			}
		}
		*step = n + 1
		st.Steps++
		s.rep.Steps++
		if s.now().Sub(s.lastProgress) >= s.cfg.Interval {
			s.progress(false)
		}
	}
}

// plainStep runs step n with c's buffers and waits for it.
func (s *soaker) plainStep(ctx context.Context, exe *sg.Executable, c *workload.Caller, n int64) error {
	bind, err := c.Bind(int(n))
	if err != nil {
		return err
	}
	outs, err := exe.Run(ctx, s.stream, bind)
	if err != nil {
		return err
	}
	defer outs.Release()
	return s.b.StreamSynchronize(s.stream)
}

// check runs step n on the strategy under test (with c's buffers) and on
// the eager shadow, from the same states, and compares the outputs and the
// states after.
func (s *soaker) check(ctx context.Context, exe *sg.Executable, c *workload.Caller, n int64) (bool, error) {
	before, err := readStates(ctx, exe, s.w)
	if err != nil {
		return false, err
	}
	if err := writeStates(ctx, s.eager, s.w, before); err != nil {
		return false, fmt.Errorf("eager: %w", err)
	}
	want, wantStates, err := s.runRead(ctx, s.eager, s.eagerCaller, n)
	if err != nil {
		return false, fmt.Errorf("eager: %w", err)
	}
	got, gotStates, err := s.runRead(ctx, exe, c, n)
	if err != nil {
		return false, err
	}
	return slices.EqualFunc(got, want, bytes.Equal) && slices.EqualFunc(gotStates, wantStates, bytes.Equal), nil
}

// runRead runs step n of exe with c's buffers and returns its outputs and
// the states after it.
func (s *soaker) runRead(ctx context.Context, exe *sg.Executable, c *workload.Caller, n int64) ([][]byte, [][]byte, error) {
	bind, err := c.Bind(int(n))
	if err != nil {
		return nil, nil, err
	}
	outs, err := exe.Run(ctx, s.stream, bind)
	if err != nil {
		return nil, nil, err
	}
	defer outs.Release()
	var got [][]byte
	for _, buf := range s.w.Outputs {
		d, err := exe.ReadOutput(ctx, outs, buf)
		if err != nil {
			return nil, nil, err
		}
		got = append(got, d)
	}
	states, err := readStates(ctx, exe, s.w)
	return got, states, err
}

func readStates(ctx context.Context, exe *sg.Executable, w *workload.Workload) ([][]byte, error) {
	out := make([][]byte, len(w.States))
	for i, st := range w.States {
		d, err := exe.ReadBuffer(ctx, st.Buffer)
		if err != nil {
			return nil, err
		}
		out[i] = d
	}
	return out, nil
}

func writeStates(ctx context.Context, exe *sg.Executable, w *workload.Workload, data [][]byte) error {
	for i, st := range w.States {
		if err := exe.WriteBuffer(ctx, st.Buffer, data[i]); err != nil {
			return err
		}
	}
	return nil
}

// usedMemory is the device memory in use, 0 when the backend cannot say.
func (s *soaker) usedMemory() uint64 {
	free, total, err := s.b.MemGetInfo(s.cfg.Device)
	if err != nil || total < free {
		return 0
	}
	return total - free
}

func (s *soaker) handles() int {
	c, ok := gpu.LiveHandles(s.b)
	if !ok {
		return -1
	}
	return c.Streams + c.Events + c.Allocations + c.HostAllocs + c.Chunks + c.Reservations + c.Mappings +
		c.Modules + c.Graphs + c.GraphExecs + c.Comms
}

func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// sample records the memory after step n of exe.
func (s *soaker) sample(exe *sg.Executable, n int64, warmup bool) {
	smp := Sample{
		ElapsedS: s.now().Sub(s.start).Seconds(), Step: n, Strategy: string(s.strategy), Segment: s.segment,
		Warmup: warmup, UsedBytes: s.usedMemory(), ExecutableBytes: exe.Memory().Total(), Handles: s.handles(),
		HeapBytes: heapInUse(),
	}
	s.rep.Samples = append(s.rep.Samples, smp)
	s.lastSample = s.now()
	s.last = smp
	s.intervalPeak = max(s.intervalPeak, smp.UsedBytes)
	st := s.perStrat[s.strategy]
	st.PeakDeviceBytes = max(st.PeakDeviceBytes, smp.UsedBytes)
	st.ExecutableBytes = max(st.ExecutableBytes, smp.ExecutableBytes)
	s.rep.PeakDeviceBytes = max(s.rep.PeakDeviceBytes, smp.UsedBytes)
}

// baseline samples what is left between segments, after a GC.
func (s *soaker) baseline() baseline {
	runtime.GC()
	// Goroutines that are ending (stream workers of destroyed streams)
	// get a moment to go.
	g := runtime.NumGoroutine()
	if len(s.baselines) > 0 {
		for i := 0; g > s.baselines[0].goroutines && i < 50; i++ {
			time.Sleep(2 * time.Millisecond)
			g = runtime.NumGoroutine()
		}
	}
	return baseline{used: s.usedMemory(), handles: s.handles(), goroutines: g, heap: heapInUse()}
}

func (s *soaker) progress(final bool) {
	s.lastProgress = s.now()
	if s.cfg.Progress != nil {
		s.cfg.Progress(Progress{
			Elapsed: s.now().Sub(s.start), Duration: s.cfg.Duration, Steps: s.rep.Steps, Checks: s.rep.Checks,
			Mismatches: s.rep.Mismatches, Strategy: s.strategy, Segment: s.segment, UsedBytes: s.last.UsedBytes,
			PeakUsedBytes: s.intervalPeak, Handles: s.last.Handles, HeapBytes: s.last.HeapBytes, Final: final,
		})
	}
	s.intervalPeak = 0
}

// finish computes the trends and the verdicts.
func (s *soaker) finish() {
	r := s.rep
	r.DurationS = s.now().Sub(s.start).Seconds()
	flat := true
	for _, strat := range s.cfg.Strategies {
		st, ok := s.perStrat[strat]
		if !ok {
			continue
		}
		delete(s.perStrat, strat)
		if st.Unsupported != "" {
			st.DeviceSegment, st.HandlesSegment = -1, -1
			r.Strategies = append(r.Strategies, *st)
			continue
		}
		st.Device, st.DeviceSegment = segmentTrend(r.Samples, st.Strategy, func(smp Sample) float64 { return float64(smp.UsedBytes) },
			float64(s.cfg.Tolerance), 0.01)
		st.Handles, st.HandlesSegment = segmentTrend(r.Samples, st.Strategy, func(smp Sample) float64 { return float64(smp.Handles) }, 0, 0.01)
		if s.handles() < 0 {
			st.Handles, st.HandlesSegment = Trend{Flat: true}, -1
		}
		flat = flat && st.Device.Flat && st.Handles.Flat
		if st.DeviceSegment < 0 || (st.HandlesSegment < 0 && s.handles() >= 0) {
			r.Unjudged = append(r.Unjudged, st.Strategy)
		}
		r.Strategies = append(r.Strategies, *st)
	}
	bls := judgedBaselines(s.baselines, len(s.cfg.Strategies))
	var used, handles, gor, heap []float64
	for _, bl := range bls {
		used = append(used, float64(bl.used))
		handles = append(handles, float64(bl.handles))
		gor = append(gor, float64(bl.goroutines))
		heap = append(heap, float64(bl.heap))
	}
	r.BaselineDevice = trendOf(used, float64(s.cfg.Tolerance), 0.01)
	r.BaselineHandles = trendOf(handles, 0, 0)
	r.BaselineGoroutines = trendOf(gor, 2, 0)
	// The Go heap is noisy: a quarter and 8 MiB of growth still pass.
	r.BaselineHeap = trendOf(heap, 8<<20, 0.25)
	if len(bls) >= 3 {
		// Back where it started, too: the first against the last. Not
		// with fewer: then the first is the cold start, before any step
		// loaded what stays for the process's life, and a soak too short
		// to judge would read as growth.
		first, last := bls[0], bls[len(bls)-1]
		if float64(last.used) > float64(first.used)+math.Max(float64(s.cfg.Tolerance), 0.01*float64(first.used)) {
			r.BaselineDevice.Flat = false
		}
		if last.handles > first.handles {
			r.BaselineHandles.Flat = false
		}
	}
	if len(bls) < 3 {
		r.Unjudged = append(r.Unjudged, "baseline")
	}
	// Only a judged trend (three samples or more: trendOf) can grow.
	switch {
	case !flat || !r.BaselineDevice.Flat || !r.BaselineHandles.Flat || !r.BaselineGoroutines.Flat || !r.BaselineHeap.Flat:
		r.Memory = MemoryGrows
	case len(r.Unjudged) > 0:
		r.Memory = MemoryTooFewSamples
	default:
		r.Memory = MemoryFlat
	}
	r.MemoryFlat = r.Memory == MemoryFlat
	s.progress(true)
}

// ParseStrategies parses a comma-separated list of strategies; "" and
// "all" are every strategy.
func ParseStrategies(list string) ([]sg.Strategy, error) {
	if list == "" || list == "all" {
		return sg.Strategies(), nil
	}
	var out []sg.Strategy
	for _, name := range strings.Split(list, ",") {
		st, err := sg.ParseStrategy(strings.TrimSpace(name))
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// judgedBaselines returns the baselines the trend judges, of those taken
// before the first step and after each segment of a soak cycling through
// n strategies. The first, taken before any step, misses what the first
// steps set up for good (lazily loaded kernels, the eager shadow's first
// use): the trend starts at the end of the first segment. Each strategy's
// first segment may set up more for good in the driver (on CUDA, the
// device runtime's memory at the first device-side graph update, once per
// process; BENCHMARKS.md, section 6): when there are at least three
// baselines beyond the first cycle, the trend starts at the end of that
// cycle, so that what is judged is growth from one cycle to the next.
func judgedBaselines[T any](bls []T, n int) []T {
	switch {
	case len(bls) >= n+1+3:
		return bls[n+1:]
	case len(bls) >= 3:
		return bls[1:]
	}
	return bls
}
