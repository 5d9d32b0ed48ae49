package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/stablegraph/stablegraph/soak"
	"github.com/stablegraph/stablegraph/workload"
)

func soakCommand() *command {
	return &command{
		name:    "soak",
		summary: "run a workload for a long time, every strategy in turn, checking outputs and memory",
		detail: `Runs the workload for --duration with the caller's buffers moving (--pattern,
random by default), the strategies of --strategies taking turns in segments of
--segment (by default the duration over twice the strategies: two turns each).
Every --check-every-th step, and the first of each segment, is also run by an
eager executable from the same states, and the outputs and the states after it
must be bit for bit equal.

Device memory in use, the executable's memory, live handles and the Go heap
are sampled up to 30 times a segment, whatever the duration; the first
--warmup steps of each segment are left out. Memory is flat when, within
every segment (one executable's life: auto may keep a different candidate in
each), the average of the last third of the samples is within the tolerance
of the first third's, and when the device memory, handles, goroutines and
heap left between segments do not grow. Each strategy reports its worst
segment. A segment whose strategy has no trend yet runs on past its time
until it has three samples after its warm-up (for up to three more segments'
time), so a short soak on a slow device still judges; one with too few
samples for a trend (a short or interrupted soak) says NOT JUDGED and fails,
never passing or "growing" on too few samples.

Progress, with the time left, goes to stderr every --interval; the report to
stdout (and --json). Exit status 1 on any mismatch, memory growth, unjudged
memory or error; 130 when interrupted (the report of what ran is printed).

The one-hour soak: stablegraph soak --duration 1h --json soak.json`,
		flags: func(fs *flag.FlagSet) func(*env) error {
			var cfg soak.Config
			fs.StringVar(&cfg.Workload, "workload", "mlp", "`name` of the workload: "+strings.Join(workload.Names(), ", ")+" (dp runs one rank)")
			registerShape(fs, &cfg.Shape)
			fs.DurationVar(&cfg.Duration, "duration", soak.DefaultDuration, "how long to soak; the segments and the memory sampling follow from it")
			fs.IntVar(&cfg.CheckEvery, "check-every", soak.DefaultCheckEvery, "check every `k`-th step (and the first of each segment) against eager, bit for bit")
			strategies := fs.String("strategies", "all", "comma-separated `list` of strategies taking turns (all: "+strategyList()+")")
			fs.DurationVar(&cfg.Segment, "segment", 0, "how long each strategy runs before the next, 1s to 5m (default duration/(2×strategies) within those bounds)")
			fs.IntVar(&cfg.Warmup, "warmup", soak.DefaultWarmup, "steps at the start of each segment left out of the memory trend")
			pattern := fs.String("pattern", string(workload.Random), "how the caller's buffers move: fixed, pingpong or random (swap cannot be soaked: the eager check does not follow swapped sequences)")
			fs.IntVar(&cfg.Device, "device", 0, "device ordinal")
			fs.DurationVar(&cfg.Interval, "interval", soak.DefaultInterval, "progress on stderr every `period` (it sets nothing else)")
			tol := fs.Uint64("tolerance", soak.DefaultTolerance, "device memory growth in `bytes` still counted as flat (beside 1%)")
			jsonPath := fs.String("json", "", "write the report, with its memory samples, as JSON to `file` (\"-\": stdout, instead of the text)")
			return func(e *env) (err error) {
				if cfg.Duration <= 0 || cfg.CheckEvery <= 0 || cfg.Warmup < 0 || cfg.Interval <= 0 {
					return usagef("--duration, --check-every and --interval must be positive, --warmup not negative")
				}
				if cfg.Segment != 0 && (cfg.Segment < time.Second || cfg.Segment > 5*time.Minute) {
					return usagef("--segment %v: must be from 1s to 5m", cfg.Segment)
				}
				if err := checkShape(fs, cfg.Workload, cfg.Shape); err != nil {
					return err
				}
				if err := checkOutput("--json", *jsonPath); err != nil {
					return err
				}
				if cfg.Strategies, err = soak.ParseStrategies(*strategies); err != nil {
					return usagef("--strategies: %v", err)
				}
				p, err := workload.ParsePattern(*pattern)
				if err != nil {
					return usagef("--pattern: %v", err)
				}
				if p == workload.Swap {
					return usagef("--pattern swap: %v", strings.TrimPrefix(soak.ErrSwap.Error(), "soak: pattern swap "))
				}
				cfg.Pattern, cfg.Seed, cfg.Tolerance = p, cfg.Shape.Seed, *tol
				if cfg.Built, err = workload.New(cfg.Workload, cfg.Shape); err != nil {
					return usagef("%v", err)
				}
				b, reason, err := e.open()
				if err != nil {
					return err
				}
				defer closeBackend(b, &err)
				if cfg.Device < 0 || cfg.Device >= b.DeviceCount() {
					return usagef("--device %d: backend %s has %s", cfg.Device, b.Name(), plural(b.DeviceCount(), "device", "devices"))
				}
				e.progress("soak: %s for %v on backend %s, checking every %d steps", cfg.Workload, cfg.Duration, shortReason(reason), cfg.CheckEvery)
				cfg.Logger = e.log
				cfg.Progress = func(p soak.Progress) {
					if !p.Final {
						e.progress("soak: %s", p)
					}
				}
				rep, err := soak.Run(e.ctx, b, cfg)
				if err != nil {
					return err
				}
				if *jsonPath != "-" {
					if err := rep.WriteText(e.stdout); err != nil {
						return err
					}
				}
				if *jsonPath != "" {
					if err := e.writeOutput(*jsonPath, func(w io.Writer) error { return writeSoakJSON(w, rep) }); err != nil {
						return fmt.Errorf("write %s: %w", *jsonPath, err)
					}
					if *jsonPath != "-" {
						e.progress("wrote %s", *jsonPath)
					}
				}
				switch {
				case rep.Error != "":
					return fmt.Errorf("soak failed after %d steps: %s", rep.Steps, rep.Error)
				case rep.Mismatches > 0:
					return fmt.Errorf("%d checked steps differ from eager", rep.Mismatches)
				case rep.Memory == soak.MemoryGrows:
					return fmt.Errorf("memory grows (see the trends above)")
				case rep.Interrupted:
					return fmt.Errorf("interrupted after %v", time.Duration(rep.DurationS*float64(time.Second)).Round(time.Second))
				case rep.Memory == soak.MemoryTooFewSamples:
					return fmt.Errorf("memory not judged: too few samples for a trend (%s); run longer", strings.Join(rep.Unjudged, ", "))
				}
				return nil
			}
		},
	}
}

func writeSoakJSON(w io.Writer, rep *soak.Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}
