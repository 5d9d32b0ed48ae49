package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	reportpkg "github.com/stablegraph/stablegraph/report"
	"github.com/stablegraph/stablegraph/workload"
)

// tripwire is a backend that counts its opens and never opens: a usage
// error must come before any backend opens.
type tripwire struct{ opens atomic.Int64 }

func (t *tripwire) Open(gpu.Config) (gpu.Backend, error) {
	t.opens.Add(1)
	return nil, errors.New("tripwire backend: opened")
}

// Priority keeps the tripwire out of "auto": it opens by name only.
func (t *tripwire) Priority() gpu.Priority { return gpu.PriorityManual }

var trip = &tripwire{}

func init() { gpu.Register("tripwire", trip) }

// TestUsageBeforeBackend: a flag that does not apply to the workload, a
// pattern the workload cannot run, a bad output path or a missing report is
// a usage error (exit 2) found before any backend opens; what applies is
// accepted (and gets as far as opening the backend).
func TestUsageBeforeBackend(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "no", "such", "dir")
	report := filepath.Join(dir, "mlp.json")
	writeTestReport(t, report)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--pattern", "swap"}, "--pattern swap is for workloads with per-sequence state (gpt2-decode, gpt2-decode-tiny), not mlp"},
		{[]string{"run", "--workload", "train", "--pattern", "swap"}, "--pattern swap is for workloads with per-sequence state"},
		{[]string{"run", "--workload", "chain", "--batch", "4"}, "--batch does not apply to workload chain: it is for dp, gpt2-decode"},
		{[]string{"bench", "-k", "5"}, "-k does not apply to workload mlp: it is for chain, chain-moving"},
		{[]string{"bench", "--workload", "chain-moving", "--width", "8"}, "--width does not apply to workload chain-moving"},
		{[]string{"run", "--weights", filepath.Join(dir, "w.safetensors")}, "--weights does not apply to workload mlp: it is for gpt2-decode"},
		{[]string{"soak", "--workload", "chain", "--layers", "2"}, "--layers does not apply to workload chain"},
		{[]string{"soak", "--pattern", "swap"}, "--pattern swap: cannot be soaked"},
		{[]string{"soak", "--workload", "gpt2-decode-tiny", "--pattern", "swap"}, "--pattern swap: cannot be soaked"},
		{[]string{"plot", filepath.Join(dir, "missing.json"), filepath.Join(dir, "out.png")}, "no such file"},
		{[]string{"plot", report, filepath.Join(missing, "out.png")}, "the chart: cannot write"},
		{[]string{"run", "--dump", "-"}, "--dump: the dump is a safetensors file"},
		{[]string{"run", "--dump", filepath.Join(missing, "d.safetensors")}, "--dump: cannot write"},
		{[]string{"soak", "--json", filepath.Join(missing, "s.json")}, "--json: cannot write"},
	} {
		before := trip.opens.Load()
		code, out, errs := runCLI(t, append([]string{"--backend", "tripwire"}, tc.args...)...)
		if code != exitUsage || out != "" || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: code %d, stdout %q, stderr %q; want exit 2 saying %q", tc.args, code, out, errs, tc.want)
		}
		if n := trip.opens.Load() - before; n != 0 {
			t.Errorf("%v: the backend was opened before the usage error", tc.args)
		}
	}
	for _, args := range [][]string{
		{"bench", "--workload", "gpt2-decode-tiny", "--pattern", "swap", "--batch", "4", "--layers", "1"},
		{"run", "--workload", "chain", "-k", "5"},
		{"run", "--workload", "dp", "--batch", "4", "--width", "8"},
		{"soak", "--workload", "chain-moving", "-k", "3"},
	} {
		before := trip.opens.Load()
		code, _, errs := runCLI(t, append([]string{"--backend", "tripwire"}, args...)...)
		if code != exitFailure || !strings.Contains(errs, "tripwire backend: opened") || trip.opens.Load() != before+1 {
			t.Errorf("%v: code %d, stderr %q; want the flags accepted and the backend opened", args, code, errs)
		}
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("the checks created %s", missing)
	}
}

// TestShapeFlagsMatchWorkloads checks workloadsTaking and swapWorkloads
// against package workload: a flag applies to a workload exactly when
// changing the Config field it sets changes the workload built, and swap
// exactly when a caller takes the pattern.
func TestShapeFlagsMatchWorkloads(t *testing.T) {
	needSim(t)
	base := workload.Config{Layers: 1, Width: 8, Batch: 2, K: 2, Heads: 2, Vocab: 16, Positions: 8, Pos: 2}
	change := map[string]func(*workload.Config){
		"layers":  func(c *workload.Config) { c.Layers = 2 },
		"width":   func(c *workload.Config) { c.Width = 16 },
		"batch":   func(c *workload.Config) { c.Batch = 4 },
		"k":       func(c *workload.Config) { c.K = 3 },
		"weights": func(c *workload.Config) { c.Weights = filepath.Join(t.TempDir(), "w.safetensors") },
	}
	b, _, err := gpu.Open("sim", gpu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, name := range workload.Names() {
		w0, err := workload.New(name, base)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for flagName, set := range change {
			cfg := base
			set(&cfg)
			w1, err := workload.New(name, cfg)
			if err != nil {
				t.Fatalf("%s with --%s changed: %v", name, flagName, err)
			}
			takes := w1.Desc != w0.Desc
			if listed := slices.Contains(workloadsTaking[flagName], name); listed != takes {
				t.Errorf("--%s: listed for %s %v, but the workload takes it: %v (%q, %q)", flagName, name, listed, takes, w0.Desc, w1.Desc)
			}
		}
		c, err := workload.NewCaller(b, 0, w0, workload.Swap, 1)
		if err == nil {
			c.Close()
		}
		if listed := slices.Contains(swapWorkloads, name); listed != (err == nil) {
			t.Errorf("swap: listed for %s %v, the caller takes it: %v (%v)", name, listed, err == nil, err)
		}
	}
}

// TestHelpMatchesCode: the help of every command cites only files that
// exist, shows no flag with two defaults, and, in a command that takes a
// workload, names in each shape flag's text the workloads it applies to.
func TestHelpMatchesCode(t *testing.T) {
	results := regexp.MustCompile(`bench/results/\S+`)
	for _, c := range commands() {
		code, out, _ := runCLI(t, "help", c.name)
		if code != exitOK {
			t.Fatalf("help %s: code %d", c.name, code)
		}
		for _, path := range results.FindAllString(out, -1) {
			if _, err := os.Stat(filepath.Join("..", "..", strings.TrimRight(path, ".,;:)"))); err != nil {
				t.Errorf("help %s cites %s: %v", c.name, path, err)
			}
		}
		for _, entry := range strings.Split(out, "\n  -") {
			if strings.Count(entry, "(default") > 1 {
				t.Errorf("help %s: a flag with two defaults: -%s", c.name, entry)
			}
		}
		fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
		g := envDefaults()
		g.register(fs)
		c.flags(fs)
		if fs.Lookup("workload") == nil {
			continue // no workload: its flags are its own (generate's --weights)
		}
		fs.VisitAll(func(f *flag.Flag) {
			for _, w := range workloadsTaking[f.Name] {
				family := strings.TrimSuffix(strings.TrimSuffix(w, "-large"), "-tiny")
				if !strings.Contains(f.Usage, family) {
					t.Errorf("%s %s: the help does not say it applies to %s: %q", c.name, flagName(f.Name), w, f.Usage)
				}
			}
		})
	}
}

// writeTestReport writes a small bench report, a floor and one strategy, to
// path: a report the plot command can draw.
func writeTestReport(t *testing.T, path string) {
	t.Helper()
	rep := &reportpkg.Report{Backend: "sim", Device: "sim device 0", Workload: "mlp", Steps: 4, Simulated: true}
	for _, s := range []string{reportpkg.FloorRow, "patch"} {
		r := reportpkg.Result{Strategy: s, OutputsMatchEager: true}
		r.SetSamples([]float64{10, 11, 12, 13}, []float64{1, 2, 3, 4})
		rep.Results = append(rep.Results, r)
	}
	var b bytes.Buffer
	if err := rep.WriteJSON(&b, true); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
