package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/report"
	"github.com/stablegraph/stablegraph/workload"
)

// TestMain runs the command itself when the environment asks for it, so
// that a test can start this test binary as the stablegraph process and
// signal it (TestSIGINT: STABLEGRAPH_TEST_HOLD_AT, a line of stderr at
// which the command waits for the signal) or limit it (TestFileSizeLimit:
// STABLEGRAPH_TEST_FSIZE, the RLIMIT_FSIZE in bytes).
func TestMain(m *testing.M) {
	// One batch of two steps keeps the wall-time path of every bench and
	// run (in process, and in the processes started from this binary)
	// without the hundred steps per strategy that no test reads.
	wallBatches.n, wallBatches.size = 1, 2
	if os.Getenv("STABLEGRAPH_TEST_RUN_MAIN") == "1" {
		if at := os.Getenv("STABLEGRAPH_TEST_HOLD_AT"); at != "" {
			stderrFor = func(ctx context.Context) io.Writer { return &holdWriter{w: os.Stderr, ctx: ctx, at: at} }
		}
		if n, err := strconv.ParseUint(os.Getenv("STABLEGRAPH_TEST_FSIZE"), 10, 64); err == nil {
			if err := limitFileSize(n); err != nil {
				fmt.Fprintln(os.Stderr, "setrlimit:", err)
				os.Exit(3)
			}
		}
		main()
		return
	}
	os.Exit(m.Run())
}

var tiny = []string{"--layers", "2", "--width", "16", "--batch", "4"}

func TestVersion(t *testing.T) {
	code, out, errs := runCLI(t, "--version")
	if code != exitOK || errs != "" || !strings.HasPrefix(out, "stablegraph ") || !strings.Contains(out, runtime.Version()) {
		t.Errorf("--version: code %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, _ = runCLI(t, "help")
	if code != exitOK || !strings.Contains(out, "--version") {
		t.Errorf("help does not list --version:\n%s", out)
	}
}

func TestHelpHelp(t *testing.T) {
	code, out, errs := runCLI(t, "help", "help")
	if code != exitOK || errs != "" || !strings.HasPrefix(out, "Usage: stablegraph help [command]") {
		t.Errorf("help help: code %d, stdout %q, stderr %q", code, out, errs)
	}
}

// TestFlagErrors: every bad flag value is a usage error (exit 2) naming the
// flag, found before anything runs: nothing on stdout.
func TestFlagErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no", "such", "dir")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--backend", "nope", "info"}, "--backend nope: unknown backend"},
		{[]string{"--backend", "sim", "--libcuda", "/x/libcuda.so", "info"}, "--libcuda, --libcublas and --libnccl are for the cuda backend, not sim"},
		{[]string{"bench", "--width", "-1"}, "--width must be positive, got -1"},
		{[]string{"run", "--layers", "0"}, "--layers must be positive, got 0"},
		{[]string{"bench", "--workload", "chain", "-k", "0"}, "-k must be positive, got 0"},
		{[]string{"bench", "--workload", "chain", "-k", "20000"}, "-k must be at most 10000"},
		{[]string{"run", "--batch", "0"}, "--batch must be positive, got 0"},
		{[]string{"soak", "--segment", "1ms"}, "--segment 1ms: must be from 1s to 5m"},
		{[]string{"soak", "--segment", "10m"}, "--segment 10m0s: must be from 1s to 5m"},
		{[]string{"--backend", "sim", "bench", "--json", filepath.Join(missing, "b.json")}, "--json: cannot write"},
		{[]string{"--backend", "sim", "bench", "--plot", filepath.Join(missing, "b.png")}, "--plot: cannot write"},
		{[]string{"--backend", "sim", "run", "--json", filepath.Join(missing, "r.json")}, "--json: cannot write"},
		{[]string{"--backend", "sim", "bench-driver", "--json", filepath.Join(missing, "d.json")}, "--json: cannot write"},
		{[]string{"--backend", "sim", "bench", "--json", t.TempDir()}, "--json: cannot write"}, // a directory
		{[]string{"plot", "only-one.json"}, "want a report and a chart file"},
		{[]string{"plot", "a.json", "b.gif"}, "unsupported extension"},
	} {
		start := time.Now()
		code, out, errs := runCLI(t, tc.args...)
		if code != exitUsage || out != "" || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: code %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errs, tc.want)
		}
		if strings.Contains(errs, "{") {
			t.Errorf("%v: error shows a Go value: %s", tc.args, errs)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%v: the usage error took %v: it should come before any run", tc.args, d)
		}
	}
	// The check leaves no file behind.
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("the output check created %s", missing)
	}
}

// TestOutputCheckKeepsFiles: checking that an existing file can be written
// leaves it as it was; checking a new one leaves nothing.
func TestOutputCheckKeepsFiles(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "old.json")
	if err := os.WriteFile(old, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := checkOutput("--json", old); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(old); string(b) != "keep" {
		t.Errorf("existing file changed to %q", b)
	}
	fresh := filepath.Join(dir, "new.json")
	if err := checkOutput("--json", fresh); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fresh); !os.IsNotExist(err) {
		t.Errorf("the check left %s behind: %v", fresh, err)
	}
}

// TestBackendUnavailable: asking for cuda without a GPU gives a short error
// with a hint to use the simulator; -v gives the whole error.
func TestBackendUnavailable(t *testing.T) {
	if !slices.Contains(gpu.Drivers(), "cuda") {
		t.Skip("cuda backend not registered in this build")
	}
	if b, _, err := gpu.Open("cuda", gpu.Config{}); err == nil {
		b.Close()
		t.Skip("cuda opens here (a GPU machine): nothing to check")
	}
	code, out, errs := runCLI(t, "--backend", "cuda", "info")
	if code != exitFailure || out != "" {
		t.Fatalf("code %d, stdout %q", code, out)
	}
	if !strings.Contains(errs, "hint: without a GPU, run on the embedded simulator: --backend sim") {
		t.Errorf("no hint to use sim:\n%s", errs)
	}
	for _, line := range strings.Split(errs, "\n") {
		if len(line) > maxErrorLen+100 {
			t.Errorf("a %d-byte line:\n%s", len(line), line)
		}
	}
	_, _, verbose := runCLI(t, "-v", "--backend", "cuda", "info")
	if len(verbose) <= len(errs) || strings.Contains(verbose, "-v prints the whole error") {
		t.Errorf("-v does not print the whole error (%d bytes against %d):\n%s", len(verbose), len(errs), verbose)
	}
}

// TestExplicitLibraryMustLoad: a library path that cannot load fails the
// command (exit 1) instead of quietly running on sim.
func TestExplicitLibraryMustLoad(t *testing.T) {
	if !slices.Contains(gpu.Drivers(), "cuda") {
		t.Skip("cuda backend not registered in this build")
	}
	path := filepath.Join(t.TempDir(), "libcuda.so.1")
	code, out, errs := runCLI(t, "--libcuda", path, "info")
	if code != exitFailure || strings.Contains(out, "backend:  sim") || !strings.Contains(errs, path) {
		t.Errorf("--libcuda %s with auto: code %d\nstdout:\n%s\nstderr:\n%s", path, code, out, errs)
	}
}

func TestCutWords(t *testing.T) {
	long := "cuda: dlopen: gpu: backend unavailable: cannot load libcuda; tried 16 places: [libcuda.so.1: libcuda.so.1: cannot open shared object file]"
	for _, n := range []int{20, 37, 50, 80, 101} {
		got := cutWords(long, n, " …")
		kept := strings.TrimSuffix(got, " …")
		if len(kept) > n || !strings.HasPrefix(long, kept) {
			t.Errorf("cut at %d: %q is not a prefix of at most %d bytes", n, got, n)
		}
		if next := long[len(kept)]; !strings.ContainsRune(" ,;:", rune(next)) {
			t.Errorf("cut at %d: %q ends mid-word (next %q)", n, got, next)
		}
	}
	if got := cutWords("short", 10, "…"); got != "short" {
		t.Errorf("short string changed: %q", got)
	}
	if got := cutWords("ééééé", 5, "…"); got != "éé…" {
		t.Errorf("one long word cut mid-rune: %q", got)
	}
	if r := shortReason("sim (auto; " + long + long + ")"); len(r) > 160 || !strings.HasSuffix(r, "(see 'stablegraph info')") {
		t.Errorf("shortReason: %q", r)
	}
}

// TestJSONStdout: --json - writes the JSON to stdout, in place of the
// table, in every command that writes JSON to a file; no file named "-".
func TestJSONStdout(t *testing.T) {
	needSim(t)
	t.Chdir(t.TempDir())
	for _, args := range [][]string{
		append([]string{"--backend", "sim", "bench", "--steps", "3", "--json", "-"}, tiny...),
		append([]string{"--backend", "sim", "run", "--steps", "3", "--json", "-"}, tiny...),
		{"--backend", "sim", "bench-driver", "--iters", "2", "--heavy-iters", "1", "--graph-iters", "1", "--ks", "10",
			"--param-bytes", "24", "--update-nodes", "4", "--update-iters", "1", "--json", "-"},
	} {
		code, out, errs := runCLI(t, args...)
		if code != exitOK {
			t.Fatalf("%v: code %d\n%s", args, code, errs)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Errorf("%v: stdout is not one JSON document: %v\n%s", args, err, out)
		}
		if v["simulated"] != true {
			t.Errorf("%v: JSON lacks simulated: true", args)
		}
		checkSnakeCase(t, args[2], v)
	}
	if _, err := os.Stat("-"); err == nil {
		t.Error(`--json - wrote a file named "-"`)
	}
	code, out, _ := runCLI(t, "--backend", "sim", "info", "--json")
	var v map[string]any
	if code != exitOK || json.Unmarshal([]byte(out), &v) != nil {
		t.Fatalf("info --json: code %d\n%s", code, out)
	}
	checkSnakeCase(t, "info", v)
}

var snake = regexp.MustCompile(`^[a-z0-9]+(_[a-z0-9]+)*$`)

// checkSnakeCase fails for any key of v, at any depth, that is not
// snake_case.
func checkSnakeCase(t *testing.T, what string, v any) {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if !snake.MatchString(k) {
				t.Errorf("%s: JSON key %q is not snake_case", what, k)
			}
			checkSnakeCase(t, what, x)
		}
	case []any:
		for _, x := range v {
			checkSnakeCase(t, what, x)
		}
	}
}

// TestBenchSimulated: the bench table and JSON on sim say the times are
// simulated and carry traces_captured per strategy.
func TestBenchSimulated(t *testing.T) {
	needSim(t)
	path := filepath.Join(t.TempDir(), "b.json")
	code, out, errs := runCLI(t, append([]string{"--backend", "sim", "bench", "--steps", "4", "--json", path}, tiny...)...)
	if code != exitOK {
		t.Fatalf("code %d\n%s", code, errs)
	}
	if !strings.Contains(out, report.SimulatedNote) || !strings.Contains(out, "sim step p50 µs") || strings.Contains(out, "GPU p50") ||
		!strings.Contains(out, "traces captured") {
		t.Errorf("table:\n%s", out)
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
	if !rep.Simulated {
		t.Error("JSON: simulated is false on sim")
	}
	// In steady state no strategy but auto (which probes its candidates,
	// each capturing its traces once, after the warm-up) captures a trace:
	// one captured every step would show here.
	for _, r := range rep.Results {
		if r.Strategy != "auto" && r.TracesCaptured != 0 {
			t.Errorf("%s captured %d traces in steady state", r.Strategy, r.TracesCaptured)
		}
	}
	raw, _ := os.ReadFile(path)
	if c := bytes.Count(raw, []byte(`"traces_captured"`)); c != len(rep.Results) {
		t.Errorf("traces_captured in %d of %d results", c, len(rep.Results))
	}
}

// TestProgress: without a terminal, progress is a line at every quarter of
// each run with the time left; --progress draws a bar instead.
func TestProgress(t *testing.T) {
	needSim(t)
	code, _, errs := runCLI(t, append([]string{"--backend", "sim", "bench", "--steps", "40", "--strategies", "patch"}, tiny...)...)
	if code != exitOK || !strings.Contains(errs, "bench: patch step 20/43 (") || !strings.Contains(errs, " left)") || strings.Contains(errs, "\r") {
		t.Errorf("progress lines: code %d\n%s", code, errs)
	}
	code, _, errs = runCLI(t, append([]string{"--backend", "sim", "--progress", "bench", "--steps", "40", "--strategies", "patch"}, tiny...)...)
	if code != exitOK || !strings.Contains(errs, "\r") || !strings.Contains(errs, "/129") || strings.Contains(errs, " step 20/43") {
		t.Errorf("--progress: code %d\n%q", code, errs)
	}
	if n, want := benchSteps(nil, workload.RunOptions{Steps: 10, Warmup: 2, Pattern: workload.PingPong}), (len(sg.Strategies())+1)*12; n != want {
		t.Errorf("benchSteps of every strategy: %d, want %d (%d strategies and the floor)", n, want, len(sg.Strategies()))
	}
}

// lineWriter calls on with each line written to it.
type lineWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
	on  func(line string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for _, l := range strings.SplitAfter(string(p), "\n") {
		w.on(l)
	}
	return len(p), nil
}

// TestInterruptedBench: cancelled once eager and record are done, bench
// prints their rows, writes no file and exits 130.
func TestInterruptedBench(t *testing.T) {
	needSim(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stderr := &lineWriter{on: func(l string) {
		if strings.HasPrefix(l, "bench: update step") {
			cancel()
		}
	}}
	var stdout bytes.Buffer
	path := filepath.Join(t.TempDir(), "b.json")
	code := runContext(ctx, append([]string{"--backend", "sim", "bench", "--steps", "40", "--json", path}, tiny...), &stdout, stderr)
	out := stdout.String()
	if code != exitInterrupted || !strings.Contains(out, "interrupted: 2 strategies finished so far") ||
		!strings.Contains(out, "\neager ") || !strings.Contains(out, "\nrecord ") || strings.Contains(out, "\nupdate ") {
		t.Errorf("code %d\nstdout:\n%s\nstderr:\n%s", code, out, stderr.buf.String())
	}
	if !strings.Contains(stderr.buf.String(), "stablegraph bench: interrupted") {
		t.Errorf("stderr:\n%s", stderr.buf.String())
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("an interrupted bench wrote %s", path)
	}
}

// holdWriter writes to w and, after a line that starts with at, waits for
// ctx to end: the command is held there, mid-run, until the signal the
// test sends has cancelled it.
type holdWriter struct {
	w    io.Writer
	ctx  context.Context
	at   string
	held bool
}

func (h *holdWriter) Write(p []byte) (int, error) {
	n, err := h.w.Write(p)
	if !h.held && strings.HasPrefix(string(p), h.at) {
		h.held = true
		<-h.ctx.Done()
	}
	return n, err
}

// TestSIGINT: the process, interrupted by SIGINT while a strategy runs,
// stops at its next step, prints the strategies finished and exits 130.
// The command holds at its first progress line of record (holdWriter)
// until the signal has reached it: the signal lands mid-run on a loaded
// machine as on an idle one, and the test waits for that line, not for a
// time.
func TestSIGINT(t *testing.T) {
	needSim(t)
	if runtime.GOOS == "windows" {
		t.Skip("no SIGINT on windows")
	}
	// A watchdog for a command that no longer stops: it is killed.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const hold = "bench: record step 10/43"
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"--backend", "sim", "bench", "--steps", "40"}, tiny...)...)
	cmd.Env = append(os.Environ(), "STABLEGRAPH_TEST_RUN_MAIN=1", "STABLEGRAPH_TEST_HOLD_AT="+hold)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	var errs strings.Builder
	var signalled time.Time
	for sc.Scan() {
		errs.WriteString(sc.Text() + "\n")
		if strings.HasPrefix(sc.Text(), hold) {
			signalled = time.Now()
			if err := cmd.Process.Signal(os.Interrupt); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	rest, _ := io.ReadAll(stderr)
	errs.Write(rest)
	err = cmd.Wait()
	if signalled.IsZero() {
		t.Fatalf("the command never reached %q (%v)\nstderr:\n%s", hold, err, errs.String())
	}
	t.Logf("exited %v after the signal", time.Since(signalled).Round(time.Millisecond))
	if code := cmd.ProcessState.ExitCode(); code != exitInterrupted {
		t.Errorf("exit code %d (%v), want %d\nstderr:\n%s", code, err, exitInterrupted, errs.String())
	}
	out := stdout.String()
	if !strings.Contains(out, "interrupted: 1 strategy finished so far") || !strings.Contains(out, "\neager ") || strings.Contains(out, "\nrecord ") {
		t.Errorf("stdout:\n%s", out)
	}
	if strings.Contains(errs.String(), "bench: record step 20/43") {
		t.Errorf("record went on after the signal:\n%s", errs.String())
	}
}

// TestPlotCommand draws the chart of a bench report with no backend.
func TestPlotCommand(t *testing.T) {
	needSim(t)
	dir := t.TempDir()
	in, out := filepath.Join(dir, "mlp.json"), filepath.Join(dir, "mlp.png")
	if code, _, errs := runCLI(t, append([]string{"--backend", "sim", "bench", "--steps", "4", "--json", in}, tiny...)...); code != exitOK {
		t.Fatalf("bench: code %d\n%s", code, errs)
	}
	code, _, errs := runCLI(t, "plot", in, out)
	if code != exitOK || !strings.Contains(errs, "wrote "+out) {
		t.Fatalf("code %d\n%s", code, errs)
	}
	b, err := os.ReadFile(out)
	if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Errorf("not a PNG: %v", err)
	}
	if code, _, _ := runCLI(t, "plot", "/nonexistent.json", out); code != exitUsage {
		t.Errorf("missing report: code %d, want %d", code, exitUsage)
	}
	if report.FloorRow != workload.FloorRow {
		t.Errorf("report.FloorRow %q != workload.FloorRow %q", report.FloorRow, workload.FloorRow)
	}
}

// TestCPUProfile: --cpuprofile writes a profile pprof reads (a gzipped
// protobuf) of a whole command, and a path it cannot create is a usage
// error before anything runs.
func TestCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.prof")
	code, out, errs := runCLI(t, "--backend", "sim", "--cpuprofile", path, "info")
	if code != exitOK {
		t.Fatalf("info with --cpuprofile: code %d, stdout %q, stderr %q", code, out, errs)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Errorf("the profile (%d bytes) is not gzip data, as pprof writes it", len(b))
	}
	bad := filepath.Join(t.TempDir(), "no", "such", "dir", "cpu.prof")
	code, out, errs = runCLI(t, "--backend", "sim", "--cpuprofile", bad, "info")
	if code != exitUsage || out != "" || !strings.Contains(errs, "--cpuprofile") {
		t.Errorf("--cpuprofile into a missing directory: code %d, stdout %q, stderr %q", code, out, errs)
	}
}
