package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/report"
)

// TestDPRemapNCCLCUDA runs dp's bench with eager and remap on two GPUs,
// one process each as torchrun starts them, with fresh addresses every
// step (--pattern random), NCCL_GRAPH_REGISTER left unset (the
// communicators turn graph registration off themselves: ncclenv.go):
// remap matches eager on both ranks and remapped buffers every step. A
// replay that hangs in NCCL fails the test when startRanks kills the ranks
// (3 minutes). It skips without two GPUs. On the GPU machine:
// scripts/gpu-test build ./cmd/stablegraph, then scripts/gpu-test run
// -test.run DPRemapNCCLCUDA (scripts/gpu-multi runs it).
func TestDPRemapNCCLCUDA(t *testing.T) {
	if !slices.Contains(gpu.Drivers(), "cuda") {
		t.Skip("cuda backend not registered in this build")
	}
	b, _, err := gpu.Open("cuda", gpu.Config{})
	if err != nil {
		t.Skipf("no CUDA here: %v", err)
	}
	n := b.DeviceCount()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Skipf("%d GPU(s): the test needs two", n)
	}
	const world = 2
	path := filepath.Join(t.TempDir(), "dp-remap.json")
	port := freePort(t, func(p int) bool { return p > 20000 })
	args := []string{"--backend", "cuda", "bench", "--workload", "dp", "--strategies", "eager,remap", "--pattern", "random",
		"--steps", "100", "--warmup", "5", "--json", path, "--rendezvous-timeout", "60s"}
	var envs [][]string
	for r := range world {
		envs = append(envs, []string{"STABLEGRAPH_TOKEN=remap-nccl-test-token-0123456789", "NCCL_NVLS_ENABLE=0",
			"RANK=" + strconv.Itoa(r), "WORLD_SIZE=" + strconv.Itoa(world), "LOCAL_RANK=" + strconv.Itoa(r),
			"LOCAL_WORLD_SIZE=" + strconv.Itoa(world), "GROUP_RANK=0", "TORCHELASTIC_RUN_ID=remap-nccl",
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + strconv.Itoa(port-1)})
	}
	procs := startRanks(t, args, envs)
	for r, p := range procs {
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			t.Fatalf("rank %d exited %d (a hang is killed after 3 minutes)\nstderr:\n%s\nstdout:\n%s", r, code, p.stderr.String(), p.stdout.String())
		}
	}
	t.Logf("\n%s", procs[0].stdout.String())
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep report.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Ranks) != world {
		t.Fatalf("%d ranks' reports, want %d", len(rep.Ranks), world)
	}
	for r, rr := range rep.Ranks {
		res, ok := rr.Result("remap")
		if !ok || !res.OutputsMatchEager || res.Remaps == 0 || !strings.Contains(res.Note, "collectives captured in steady state: 0") {
			t.Errorf("rank %d: remap row %+v", r, res)
			continue
		}
		wall := 0.0
		if res.WallUS != nil {
			wall = res.WallUS.P50
		}
		t.Logf("DP-REMAP-NCCL rank %d: remap matches eager, %d remaps, GPU p50 %.1f us, wall p50 %.1f us", r, res.Remaps, res.StepUS.P50, wall)
	}
}
