package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSoak(t *testing.T) {
	needSim(t)
	path := filepath.Join(t.TempDir(), "soak.json")
	// Segments of a second (the shortest): patch, auto, patch, auto; three
	// at least, on a loaded machine, for the trend between segments.
	code, out, errs := runCLI(t, "--backend", "sim", "soak", "--workload", "train", "--layers", "2", "--width", "16", "--batch", "4",
		"--duration", "4s", "--segment", "1s", "--strategies", "patch,auto", "--interval", "400ms", "--check-every", "3", "--warmup", "20", "--json", path)
	if code != exitOK {
		t.Fatalf("code %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	for _, want := range []string{"soak: train", "mismatches 0", "PASS", "auto"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(errs, "soak: ") < 3 || !strings.Contains(errs, " left) steps ") {
		t.Errorf("expected progress lines with the time left on stderr:\n%s", errs)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Steps, Mismatches int64
		Memory            string `json:"memory"`
		MemoryFlat        bool   `json:"memory_flat"`
		Strategies        []struct{ Strategy string }
		Samples           []json.RawMessage
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Steps == 0 || rep.Mismatches != 0 || !rep.MemoryFlat || rep.Memory != "flat" || len(rep.Strategies) != 2 || len(rep.Samples) == 0 {
		t.Errorf("JSON report: %+v", rep)
	}
}

// TestSoakTooShort: a soak too short for a memory trend says so and fails,
// rather than calling memory flat (or growing) on a sample or two: one
// strategy, one segment, two baselines.
func TestSoakTooShort(t *testing.T) {
	needSim(t)
	code, out, errs := runCLI(t, "--backend", "sim", "soak", "--workload", "mlp", "--layers", "2", "--width", "16", "--batch", "4",
		"--duration", "1s", "--strategies", "patch")
	if code != exitFailure || !strings.Contains(out, "NOT JUDGED: mismatches 0, memory not judged: too few samples for a trend (baseline)") ||
		!strings.Contains(errs, "memory not judged: too few samples") || strings.Contains(out, "PASS") || strings.Contains(out, "grows") {
		t.Errorf("code %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
}

// TestSoakDefaultsJudged: a short soak with the default flags (every
// strategy, default warm-up, sampling and interval) is judged: the
// sampling follows from the duration, not from the progress interval,
// and a segment runs on until its strategy has a trend.
func TestSoakDefaultsJudged(t *testing.T) {
	needSim(t)
	code, out, errs := runCLI(t, "--backend", "sim", "soak", "--layers", "2", "--width", "16", "--batch", "4", "--duration", "2s")
	if code != exitOK || !strings.Contains(out, "PASS: mismatches 0, memory flat") {
		t.Errorf("code %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
}

// TestSoakJSONStdout: --json - writes the JSON report to stdout, instead of
// the text.
func TestSoakJSONStdout(t *testing.T) {
	needSim(t)
	t.Chdir(t.TempDir())
	_, out, errs := runCLI(t, "--backend", "sim", "soak", "--workload", "mlp", "--layers", "2", "--width", "16", "--batch", "4",
		"--duration", "1s", "--strategies", "patch", "--json", "-")
	var rep map[string]any
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep["memory"] == nil {
		t.Errorf("stdout is not the JSON report: %v\n%s\nstderr:\n%s", err, out, errs)
	}
	if _, err := os.Stat("-"); err == nil {
		t.Error(`--json - wrote a file named "-"`)
	}
}

func TestSoakUsage(t *testing.T) {
	for _, args := range [][]string{
		{"soak", "--duration", "0s"},
		{"soak", "--strategies", "nope"},
		{"soak", "--pattern", "nope"},
		{"soak", "--workload", "nope"},
		{"soak", "--segment", "1ms"},
		{"soak", "--segment", "6m"},
		{"soak", "--width", "-1"},
		{"soak", "-k", "0"},
		{"soak", "--json", "/nonexistent/dir/soak.json"},
	} {
		if code, _, _ := runCLI(t, append([]string{"--backend", "sim"}, args...)...); code != exitUsage {
			t.Errorf("%v: code %d, want %d", args, code, exitUsage)
		}
	}
}
