package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/drivercost"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/report"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func needSim(t *testing.T) {
	t.Helper()
	if !slices.Contains(gpu.Drivers(), "sim") {
		t.Skip("sim backend not registered in this build")
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		code, out, errs := runCLI(t, args...)
		if code != exitOK || errs != "" {
			t.Errorf("%v: code %d, stderr %q", args, code, errs)
		}
		for _, want := range []string{"Usage:", "info", "bench-driver", "--backend", "--devices", "-v", "Exit status"} {
			if !strings.Contains(out, want) {
				t.Errorf("%v: usage lacks %q:\n%s", args, want, out)
			}
		}
	}
	for _, args := range [][]string{{"help", "bench-driver"}, {"bench-driver", "-h"}, {"--backend", "sim", "bench-driver", "--help"}} {
		code, out, errs := runCLI(t, args...)
		if code != exitOK || errs != "" {
			t.Errorf("%v: code %d, stderr %q", args, code, errs)
		}
		for _, want := range []string{"Usage: stablegraph bench-driver", "--iters", "--json file", "Global flags:", "--backend name"} {
			if !strings.Contains(out, want) {
				t.Errorf("%v: help lacks %q:\n%s", args, want, out)
			}
		}
	}
	code, out, _ := runCLI(t, "info", "-h")
	if code != exitOK || !strings.Contains(out, "--json") {
		t.Errorf("info -h: code %d:\n%s", code, out)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "Usage:"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"help", "frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"help", "a", "b"}, "too many arguments"},
		{[]string{"--nope", "info"}, "flag provided but not defined: -nope"},
		{[]string{"info", "--nope"}, "flag provided but not defined: -nope"},
		{[]string{"info", "extra"}, "unexpected arguments: extra"},
		{[]string{"--devices", "0", "info"}, "--devices must be positive"},
		{[]string{"bench-driver", "--ks", "10,x"}, `--ks: "x" is not a positive integer`},
		{[]string{"bench-driver", "--iters", "-1"}, "iteration counts must be positive"},
		{[]string{"bench-driver", "--param-bytes", "24,20"}, "--param-bytes: 20 is not 24 plus a multiple of 8"},
		{[]string{"bench-driver", "--update-iters", "0"}, "iteration counts must be positive"},
		{[]string{"bench-driver", "--sections", "graphs,nodes"}, `--sections: no section "nodes"`},
		{[]string{"bench", "--auto-bound", "fast"}, `--auto-bound: unknown auto bound "fast"`},
	} {
		code, out, errs := runCLI(t, tc.args...)
		if code != exitUsage {
			t.Errorf("%v: code %d, want %d", tc.args, code, exitUsage)
		}
		if out != "" {
			t.Errorf("%v: wrote to stdout: %q", tc.args, out)
		}
		if !strings.Contains(errs, tc.want) {
			t.Errorf("%v: stderr %q lacks %q", tc.args, errs, tc.want)
		}
	}
}

func TestUnknownBackend(t *testing.T) {
	code, out, errs := runCLI(t, "--backend", "tpu", "info")
	if code != exitUsage || out != "" || !strings.Contains(errs, "--backend tpu: unknown backend (registered: ") {
		t.Errorf("code %d, stdout %q, stderr %q", code, out, errs)
	}
}

func TestEnvBackend(t *testing.T) {
	old := getenv
	t.Cleanup(func() { getenv = old })
	getenv = func(k string) string {
		if k == "STABLEGRAPH_BACKEND" {
			return "tpu"
		}
		return ""
	}
	// The error names the variable the bad name came from.
	if code, _, errs := runCLI(t, "info"); code != exitUsage || !strings.Contains(errs, "STABLEGRAPH_BACKEND=tpu (the environment's default for --backend): unknown backend") {
		t.Errorf("environment default ignored or unnamed: code %d, stderr %q", code, errs)
	}
	if code, _, errs := runCLI(t, "--backend", "gpu9", "info"); code != exitUsage || !strings.Contains(errs, "--backend gpu9: unknown backend") {
		t.Errorf("the flag over the environment: code %d, stderr %q", code, errs)
	}
	needSim(t)
	if code, _, errs := runCLI(t, "--backend", "sim", "info"); code != exitOK {
		t.Errorf("flag does not override the environment: code %d, stderr %q", code, errs)
	}
}

func TestInfo(t *testing.T) {
	needSim(t)
	code, out, errs := runCLI(t, "--backend", "sim", "info", "--devices", "2")
	if code != exitOK {
		t.Fatalf("code %d, stderr %s", code, errs)
	}
	for _, want := range []string{"backend:  sim", "reason:   sim (requested)", "drivers:", "devices:  2", "device 0:", "device 1:",
		"compute capability", "driver version", "virtual memory (VMM)", "stream memory ops",
		"capabilities", "VirtualMemory, StreamMemOps, StreamWaits, DeviceUpdates, Collectives, GEMM"} {
		if !strings.Contains(out, want) {
			t.Errorf("info lacks %q:\n%s", want, out)
		}
	}

	code, out, errs = runCLI(t, "--backend", "sim", "info", "--json")
	if code != exitOK {
		t.Fatalf("code %d, stderr %s", code, errs)
	}
	var got infoOutput
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if got.Backend != "sim" || len(got.Devices) != 1 || got.Devices[0].Name == "" || got.Devices[0].TotalMemoryBytes == 0 ||
		!slices.Contains(got.Drivers, "sim") {
		t.Errorf("unexpected info: %+v", got)
	}
}

func TestBenchDriver(t *testing.T) {
	needSim(t)
	path := filepath.Join(t.TempDir(), "cost.json")
	code, out, errs := runCLI(t, "bench-driver", "--backend", "sim", "--iters", "5", "--heavy-iters", "2",
		"--graph-iters", "2", "--ks", "10,100", "--param-bytes", "24", "--update-nodes", "4", "--update-iters", "2", "--json", path)
	if code != exitOK {
		t.Fatalf("code %d, stderr:\n%s", code, errs)
	}
	// On sim the times are simulated: said so, and never set beside the
	// H100 figures.
	for _, want := range []string{"operation", "sim p50 µs", drivercost.RowStreamCreate, drivercost.GraphRow("replay", 100), report.SimulatedNote} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for _, unwanted := range []string{"H100", "ref", "x\n"} {
		if strings.Contains(out, unwanted) {
			t.Errorf("a sim table compares with hardware (%q):\n%s", unwanted, out)
		}
	}
	if !strings.Contains(errs, "bench-driver: graphs") || !strings.Contains(errs, "wrote "+path) {
		t.Errorf("progress missing from stderr:\n%s", errs)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var res drivercost.Result
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if res.Backend != "sim" || len(res.Rows) < 20 || !res.Simulated {
		t.Errorf("unexpected JSON result: backend %q, %d rows, simulated %v", res.Backend, len(res.Rows), res.Simulated)
	}
	if bytes.Contains(b, []byte("h100")) {
		t.Errorf("sim JSON carries H100 references:\n%.300s", b)
	}

	code, out, errs = runCLI(t, "bench-driver", "--backend", "sim", "--iters", "2", "--heavy-iters", "1",
		"--graph-iters", "1", "--ks", "10", "--param-bytes", "24", "--update-nodes", "4", "--update-iters", "1", "--json", "-")
	if code != exitOK || !json.Valid([]byte(out)) {
		t.Errorf("--json -: code %d, valid %v, stderr %s", code, json.Valid([]byte(out)), errs)
	}

	code, _, errs = runCLI(t, "bench-driver", "--backend", "sim", "--device", "3")
	if code != exitUsage || !strings.Contains(errs, "has 1 device") {
		t.Errorf("--device 3: code %d, stderr %s", code, errs)
	}
}

func TestRun(t *testing.T) {
	needSim(t)
	path := filepath.Join(t.TempDir(), "run.json")
	code, out, errs := runCLI(t, "--backend", "sim", "run", "--workload", "train", "--layers", "2", "--width", "16", "--batch", "4",
		"--steps", "4", "--warmup", "1", "--pattern", "random", "--strategy", "patch", "--json", path)
	if code != exitOK {
		t.Fatalf("code %d, stderr:\n%s", code, errs)
	}
	if !strings.Contains(out, "workload train (layers=2 width=16 batch=4") || !strings.Contains(out, "patch ") ||
		!strings.Contains(out, "yes") {
		t.Errorf("run output:\n%s", out)
	}
	if !strings.Contains(errs, "run: eager reference run") || !strings.Contains(errs, "run: patch step 5/5") {
		t.Errorf("progress:\n%s", errs)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := report.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Steps != 4 || len(rep.Results) != 1 || !rep.Results[0].OutputsMatchEager || len(rep.Results[0].StepSamplesUS) != 4 {
		t.Errorf("report %+v", rep)
	}

	code, out, _ = runCLI(t, "--backend", "sim", "run", "--workload", "chain", "-k", "5", "--steps", "2", "--check=false", "--strategy", "record")
	if code != exitOK || !strings.Contains(out, "not compared with eager") {
		t.Errorf("--check=false: code %d:\n%s", code, out)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--strategy", "magic"}, "--strategy"},
		{[]string{"run", "--workload", "resnet"}, `unknown workload "resnet"`},
		{[]string{"run", "--pattern", "zigzag"}, "--pattern"},
		{[]string{"run", "--steps", "0"}, "--steps must be positive"},
		{[]string{"bench", "--strategies", "eager,magic"}, "--strategies"},
		{[]string{"bench", "--plot", "x.gif"}, "--plot"},
	} {
		if code, _, errs := runCLI(t, tc.args...); code != exitUsage || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: code %d, stderr %q", tc.args, code, errs)
		}
	}
}

func TestBench(t *testing.T) {
	needSim(t)
	dir := t.TempDir()
	jsonPath, plotPath := filepath.Join(dir, "bench.json"), filepath.Join(dir, "bench.svg")
	code, out, errs := runCLI(t, "--backend", "sim", "bench", "--workload", "mlp", "--layers", "2", "--width", "16", "--batch", "4",
		"--steps", "5", "--json", jsonPath, "--plot", plotPath)
	if code != exitOK {
		t.Fatalf("code %d, stderr:\n%s", code, errs)
	}
	for _, s := range sg.Strategies() {
		if !strings.Contains(out, "\n"+string(s)+" ") {
			t.Errorf("table lacks strategy %s:\n%s", s, out)
		}
	}
	if strings.Contains(out, "NO") {
		t.Errorf("a strategy differs from eager:\n%s", out)
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]any
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"backend", "device", "workload", "steps", "results"} {
		if _, ok := top[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	svg, err := os.ReadFile(plotPath)
	if err != nil || !bytes.HasPrefix(svg, []byte("<?xml")) {
		t.Errorf("plot: %v, %.40q", err, svg)
	}

	code, out, _ = runCLI(t, "--backend", "sim", "bench", "--workload", "chain", "-k", "3", "--steps", "2", "--strategies", "patch")
	if code != exitOK || !strings.Contains(out, "\neager ") || !strings.Contains(out, "\npatch ") || strings.Contains(out, "\nrecord ") {
		t.Errorf("--strategies patch: code %d:\n%s", code, out)
	}
}

// TestBenchDeviceOptionsAndPairFloor: bench's device flags reach the
// strategy (by default nothing moves from the host; --device-host-lead
// moves the first command from it, --device-inline changes nothing the
// report counts), and --pair-floor, off on sim unless given, pairs every
// row with the floor.
func TestBenchDeviceOptionsAndPairFloor(t *testing.T) {
	needSim(t)
	dir := t.TempDir()
	type row struct {
		Strategy          string          `json:"strategy"`
		Note              string          `json:"note"`
		PatchedNodes      int64           `json:"patched_nodes"`
		OutputsMatchEager bool            `json:"outputs_match_eager"`
		PairedFloor       json.RawMessage `json:"paired_floor"`
	}
	bench := func(flags ...string) map[string]row {
		t.Helper()
		path := filepath.Join(dir, fmt.Sprintf("b%d.json", len(flags)))
		args := append([]string{"--backend", "sim", "bench", "--workload", "mlp", "--layers", "2", "--width", "16", "--batch", "4",
			"--pattern", "random", "--steps", "3", "--warmup", "2", "--strategies", "device", "--json", path}, flags...)
		if code, _, errs := runCLI(t, args...); code != exitOK {
			t.Fatalf("%v: code %d, stderr:\n%s", flags, code, errs)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var rep struct {
			Results []row `json:"results"`
		}
		if err := json.Unmarshal(b, &rep); err != nil {
			t.Fatal(err)
		}
		rows := map[string]row{}
		for _, r := range rep.Results {
			rows[r.Strategy] = r
		}
		return rows
	}
	plain := bench()
	if d := plain["device"]; !d.OutputsMatchEager || d.PatchedNodes != 0 || d.PairedFloor != nil {
		t.Errorf("default: device row %+v; want eager's bits, nothing from the host, no pair on sim", d)
	}
	led := bench("--device-host-lead", "--device-inline", "--pair-floor")
	d := led["device"]
	if !d.OutputsMatchEager || d.PatchedNodes != 3 || d.PairedFloor == nil {
		t.Errorf("--device-host-lead --device-inline --pair-floor: device row %+v; want eager's bits, the first command from the host each of 3 steps, a paired floor", d)
	}
	if f := led["replay-fixed"]; f.PairedFloor != nil {
		t.Errorf("the floor row is paired with itself: %+v", f)
	}
}
