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
	code, out, errs := runCLI(t, "--backend", "sim", "soak", "--workload", "train", "--layers", "2", "--width", "16", "--batch", "4",
		"--duration", "1500ms", "--interval", "400ms", "--check-every", "3", "--warmup", "20", "--json", path)
	if code != exitOK {
		t.Fatalf("code %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	for _, want := range []string{"soak: train", "mismatches 0", "PASS", "auto"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(errs, "soak: ") < 3 {
		t.Errorf("expected progress lines on stderr:\n%s", errs)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Steps, Mismatches int64
		MemoryFlat        bool `json:"memory_flat"`
		Strategies        []struct{ Strategy string }
		Samples           []json.RawMessage
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Steps == 0 || rep.Mismatches != 0 || !rep.MemoryFlat || len(rep.Strategies) != 7 || len(rep.Samples) == 0 {
		t.Errorf("JSON report: %+v", rep)
	}
}

func TestSoakUsage(t *testing.T) {
	for _, args := range [][]string{
		{"soak", "--duration", "0s"},
		{"soak", "--strategies", "nope"},
		{"soak", "--pattern", "nope"},
		{"soak", "--workload", "nope"},
	} {
		if code, _, _ := runCLI(t, append([]string{"--backend", "sim"}, args...)...); code != exitUsage {
			t.Errorf("%v: code %d, want %d", args, code, exitUsage)
		}
	}
}
