package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/report"
)

// TestBenchDeviceCUDA runs the bench line the device strategy is judged by,
// `stablegraph --backend cuda bench --workload chain-moving --pattern
// random`, on a GPU (fewer steps): the report has a device row, measured
// and matching eager, beside the floor. It skips without CUDA, without
// device-side graph updates, and until the patcher is built for the GPU.
// On the GPU machine: scripts/gpu-test build ./cmd/stablegraph, then
// scripts/gpu-test run -test.run BenchDeviceCUDA.
func TestBenchDeviceCUDA(t *testing.T) {
	if !slices.Contains(gpu.Drivers(), "cuda") {
		t.Skip("cuda backend not registered in this build")
	}
	b, _, err := gpu.Open("cuda", gpu.Config{})
	if err != nil {
		t.Skipf("no CUDA here: %v", err)
	}
	props, err := b.DeviceProps(0)
	if err == nil {
		_, err = gpu.DeviceUpdatesOf(b, 0)
	}
	if err == nil {
		_, err = kernels.PatcherBinary(props.ComputeMajor, props.ComputeMinor)
	}
	if cerr := b.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil {
		t.Skipf("the device strategy cannot run here: %v", err)
	}
	path := filepath.Join(t.TempDir(), "chain-moving.json")
	code, out, errs := runCLI(t, "--backend", "cuda", "bench", "--workload", "chain-moving", "--pattern", "random",
		"--steps", "50", "--json", path)
	t.Logf("\n%s", out)
	if code != exitOK {
		t.Fatalf("bench: code %d\n%s", code, errs)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep report.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	dev, ok := rep.Result("device")
	floor, fok := rep.Result("replay-fixed")
	if !ok || !fok || !dev.OutputsMatchEager || dev.StepUS.P50 <= 0 || strings.HasPrefix(dev.Note, "not supported") {
		t.Fatalf("device row %+v, floor present %v", dev, fok)
	}
	t.Logf("DEVICE-BENCH chain-moving: device GPU p50 %.1f us (%.3fx the floor's %.1f), host p50 %.2f us (floor %.2f)",
		dev.StepUS.P50, dev.StepUS.P50/floor.StepUS.P50, floor.StepUS.P50, dev.HostUS.P50, floor.HostUS.P50)
}
