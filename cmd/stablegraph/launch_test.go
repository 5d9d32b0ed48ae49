package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/rendezvous"
	"github.com/stablegraph/stablegraph/report"
)

// Launchers, simulated: the tests start several processes of this test
// binary, each running the command line as one rank, with the environment
// torchrun, srun or mpirun would give it, and no rank flags. The ranks
// meet over loopback, on sim (their collectives cross the rendezvous).

// childMarker, set in a process's environment, makes TestLaunchChild run
// the command line after "--" and exit with its status.
const childMarker = "STABLEGRAPH_TEST_LAUNCH_CHILD"

// TestLaunchChild is not a test: it is the body of the rank processes the
// launcher tests start (it skips otherwise).
func TestLaunchChild(t *testing.T) {
	if _, ok := os.LookupEnv(childMarker); !ok {
		t.Skip("the body of the processes TestDPUnderLaunchers starts")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	os.Exit(runContext(ctx, flag.Args(), os.Stdout, os.Stderr))
}

// launcherVars are the variables a child must not inherit from the test's
// own environment (the machine running the tests may be inside a job).
func launcherVars(kv string) bool {
	name, _, _ := strings.Cut(kv, "=")
	for _, p := range []string{"SLURM_", "OMPI_", "PMIX_", "TORCHELASTIC_", "STABLEGRAPH_", "NCCL_"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return slices.Contains([]string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"}, name)
}

// freePort finds a loopback port in [20000, 30000) that nothing listens on
// and that ok accepts.
func freePort(t *testing.T, ok func(port int) bool) int {
	t.Helper()
	for p := 20000 + os.Getpid()%10000; ; p = 20000 + (p-20000+7919)%10000 {
		if !ok(p) {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err == nil {
			l.Close()
			return p
		}
	}
}

// rankProc is one started rank process.
type rankProc struct {
	cmd            *exec.Cmd
	stdout, stderr strings.Builder
}

// startRanks starts one process per environment of envs, each running args
// as the command line, and waits for all.
func startRanks(t *testing.T, args []string, envs [][]string) []*rankProc {
	t.Helper()
	base := []string{childMarker + "=1"}
	for _, kv := range os.Environ() {
		if !launcherVars(kv) {
			base = append(base, kv)
		}
	}
	procs := make([]*rankProc, len(envs))
	for r, env := range envs {
		p := &rankProc{cmd: exec.Command(os.Args[0], append([]string{"-test.run=^TestLaunchChild$", "--"}, args...)...)}
		p.cmd.Env = slices.Concat(base, env)
		p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
		p.cmd.WaitDelay = 5 * time.Second
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[r] = p
	}
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(func() {
			timer := time.AfterFunc(3*time.Minute, func() { p.cmd.Process.Kill() })
			defer timer.Stop()
			p.cmd.Wait()
		})
	}
	wg.Wait()
	return procs
}

// TestDPUnderLaunchers runs `stablegraph bench --workload dp` with no rank
// flags under the environments of torchrun, srun and mpirun (two or three
// processes over loopback, on sim): each process finds its rank, the world,
// rank 0's address, its device (the local rank: device 1 for local rank 1)
// and the job token in its environment; every strategy matches eager on
// every rank and captures no collective in steady state. Every strategy
// runs under torchrun; the other jobs, whose point is their launcher's
// environment and a world of three or four, run patch and pool (the
// in-process ranks of workload's TestDPBenchEveryStrategy try the rest).
func TestDPUnderLaunchers(t *testing.T) {
	needSim(t)
	if testing.Short() {
		t.Skip("starts processes")
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("a-token-in-a-file-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const token = "STABLEGRAPH_TOKEN=launcher-test-token-0123456789abcdef"
	for _, tc := range []struct {
		name  string
		world int
		env   func(t *testing.T, world int) func(r int) []string
		some  bool // patch and pool only
	}{
		{"torchrun", 2, func(t *testing.T, world int) func(int) []string {
			port := freePort(t, func(p int) bool { return p > 20000 })
			return func(r int) []string {
				return []string{token, "RANK=" + strconv.Itoa(r), "WORLD_SIZE=" + strconv.Itoa(world), "LOCAL_RANK=" + strconv.Itoa(r),
					"LOCAL_WORLD_SIZE=" + strconv.Itoa(world), "GROUP_RANK=0", "TORCHELASTIC_RUN_ID=test",
					"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + strconv.Itoa(port-1)} // rank 0 listens at MASTER_PORT+1
			}
		}, false},
		{"torchrun4", 4, func(t *testing.T, world int) func(int) []string {
			port := freePort(t, func(p int) bool { return p > 20000 })
			return func(r int) []string {
				return []string{token, "RANK=" + strconv.Itoa(r), "WORLD_SIZE=" + strconv.Itoa(world), "LOCAL_RANK=" + strconv.Itoa(r),
					"LOCAL_WORLD_SIZE=" + strconv.Itoa(world), "GROUP_RANK=0", "TORCHELASTIC_RUN_ID=test",
					"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + strconv.Itoa(port-1)}
			}
		}, true},
		{"srun", 3, func(t *testing.T, world int) func(int) []string {
			port := freePort(t, func(int) bool { return true })
			job := 4200000 + port - 20000 // SLURM_JOB_ID mod 10000 gives the port
			return func(r int) []string {
				return []string{"STABLEGRAPH_TOKEN_FILE=" + tokenFile, "SLURM_PROCID=" + strconv.Itoa(r), "SLURM_NTASKS=" + strconv.Itoa(world),
					"SLURM_LOCALID=" + strconv.Itoa(r%2), "SLURM_JOB_ID=" + strconv.Itoa(job), "SLURM_STEP_ID=0",
					"SLURM_STEP_NODELIST=localhost", "SLURM_JOB_NODELIST=localhost", "SLURM_NNODES=1"}
			}
		}, true},
		{"mpirun", 2, func(t *testing.T, world int) func(int) []string {
			var ns string
			freePort(t, func(p int) bool {
				for i := range 100000 {
					if n := fmt.Sprintf("prterun-test-%d-%d@1", os.Getpid(), i); rendezvous.PortFor(n) == p {
						ns = n
						return true
					}
				}
				return false
			})
			return func(r int) []string {
				return []string{token, "OMPI_COMM_WORLD_RANK=" + strconv.Itoa(r), "OMPI_COMM_WORLD_SIZE=" + strconv.Itoa(world),
					"OMPI_COMM_WORLD_LOCAL_RANK=" + strconv.Itoa(r), "OMPI_COMM_WORLD_LOCAL_SIZE=" + strconv.Itoa(world),
					"PMIX_NAMESPACE=" + ns, "PMIX_RANK=" + strconv.Itoa(r)}
			}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			jsonPath := filepath.Join(dir, tc.name+".json")
			args := []string{"--backend", "sim", "--devices", "4", "bench", "--workload", "dp", "--layers", "2", "--width", "16",
				"--batch", "12", "--steps", "3", "--warmup", "1", "--pattern", "random", "--json", jsonPath, "--rendezvous-timeout", "60s"}
			want := sg.Strategies()
			if tc.some {
				want = []sg.Strategy{sg.StrategyPatch, sg.StrategyPool}
				args = append(args, "--strategies", "patch,pool")
			}
			envOf := tc.env(t, tc.world)
			var envs [][]string
			for r := range tc.world {
				envs = append(envs, envOf(r))
			}
			procs := startRanks(t, args, envs)
			for r, p := range procs {
				if code := p.cmd.ProcessState.ExitCode(); code != 0 {
					t.Fatalf("rank %d exited %d\nstderr:\n%s\nstdout:\n%s", r, code, p.stderr.String(), p.stdout.String())
				}
				local, launcher := r, strings.TrimRight(tc.name, "0123456789")
				if tc.name == "srun" {
					local, launcher = r%2, "slurm"
				}
				want := fmt.Sprintf("rank %d of %d (%s), local rank %d", r, tc.world, launcher, local)
				wantDev := fmt.Sprintf(", device %d\n", local) // the local rank's
				if !strings.Contains(p.stderr.String(), want) || !strings.Contains(p.stderr.String(), wantDev) {
					t.Errorf("rank %d's stderr does not say %q and %q:\n%s", r, want, wantDev, p.stderr.String())
				}
			}
			data, err := os.ReadFile(jsonPath)
			if err != nil {
				t.Fatal(err)
			}
			var rep report.Report
			if err := json.Unmarshal(data, &rep); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(rep.Workload, fmt.Sprintf("rank 0 of %d", tc.world)) {
				t.Errorf("the report is not rank 0's of %d: %q", tc.world, rep.Workload)
			}
			// Rank 0 reports every rank's times, and shows them.
			if len(rep.Ranks) != tc.world {
				t.Fatalf("the report holds %d ranks' reports, want %d", len(rep.Ranks), tc.world)
			}
			for r, rr := range rep.Ranks {
				if !strings.Contains(rr.Workload, fmt.Sprintf("rank %d of %d", r, tc.world)) || len(rr.Results) != len(rep.Results) {
					t.Errorf("rank %d's report: %q with %d results", r, rr.Workload, len(rr.Results))
				}
			}
			if out := procs[0].stdout.String(); !strings.Contains(out, fmt.Sprintf("per rank (ranks 0..%d", tc.world-1)) {
				t.Errorf("rank 0's table shows no ranks:\n%s", out)
			}
			seen := map[string]bool{}
			for _, res := range rep.Results {
				seen[res.Strategy] = true
				if !res.OutputsMatchEager {
					t.Errorf("%s does not match eager: %s", res.Strategy, res.Note)
				}
				if _, err := sg.ParseStrategy(res.Strategy); err == nil && !strings.Contains(res.Note, "collectives captured in steady state: 0") {
					t.Errorf("%s: note %q", res.Strategy, res.Note)
				}
			}
			for _, s := range want {
				if !seen[string(s)] {
					t.Errorf("no row for %s", s)
				}
			}
		})
	}
}

// TestStrangerRankIsRefused: two processes launched by hand as ranks of one
// job, but with different tokens: rank 1 is refused ("not authenticated")
// and rank 0 gives up at its deadline naming rank 1; neither runs.
func TestStrangerRankIsRefused(t *testing.T) {
	needSim(t)
	if testing.Short() {
		t.Skip("starts processes")
	}
	port := freePort(t, func(int) bool { return true })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	args := []string{"--backend", "sim", "run", "--workload", "dp", "--layers", "2", "--width", "16", "--batch", "4", "--steps", "2",
		"--world", "2", "--rendezvous", addr, "--rendezvous-timeout", "3s"}
	ranks := make([]*rankProc, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			a := append(slices.Clone(args), "--rank", strconv.Itoa(r))
			ranks[r] = startRanks(t, a, [][]string{{fmt.Sprintf("STABLEGRAPH_TOKEN=token-of-job-%d-0123456789", r)}})[0]
		})
	}
	wg.Wait()
	if code := ranks[1].cmd.ProcessState.ExitCode(); code != exitFailure || !strings.Contains(ranks[1].stderr.String(), "not authenticated (is the job token the same on every rank?)") {
		t.Errorf("rank 1: exit %d\n%s", code, ranks[1].stderr.String())
	}
	if code := ranks[0].cmd.ProcessState.ExitCode(); code != exitFailure || !strings.Contains(ranks[0].stderr.String(), "ranks [1], which never arrived") {
		t.Errorf("rank 0: exit %d\n%s", code, ranks[0].stderr.String())
	}
}

// TestLauncherEnvironmentErrors: a partial or inconsistent launcher
// environment is a usage error naming the variables, before anything runs;
// a workload without collectives ignores the launcher.
func TestLauncherEnvironmentErrors(t *testing.T) {
	needSim(t)
	dp := []string{"--backend", "sim", "run", "--workload", "dp", "--layers", "2", "--width", "16", "--batch", "4", "--steps", "2"}
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"RANK": "1"}, dp, "launcher environment: rendezvous: RANK is set but WORLD_SIZE is not"},
		{map[string]string{"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, dp, "RANK=2 is not below WORLD_SIZE=2"},
		{map[string]string{"RANK": "1", "WORLD_SIZE": "2"}, dp, "no address for rank 0"},
		{map[string]string{"RANK": "1", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, dp, "the launchers' variables disagree"},
		{map[string]string{"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, dp, "needs a job token"},
		{map[string]string{"STABLEGRAPH_TOKEN": "a", "STABLEGRAPH_TOKEN_FILE": "/b"}, dp, "both STABLEGRAPH_TOKEN and STABLEGRAPH_TOKEN_FILE"},
		{map[string]string{"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "STABLEGRAPH_TOKEN": "short"}, dp, "fewer than 16"},
		{map[string]string{"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
			"STABLEGRAPH_TOKEN": "launcher-test-token-0123456789abcdef"}, append([]string{"--devices", "2"}, dp...), "local rank 3 (torchrun) but only 2 devices"},
	} {
		for _, kv := range os.Environ() {
			if launcherVars(kv) {
				name, _, _ := strings.Cut(kv, "=")
				t.Setenv(name, "")
			}
		}
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		code, _, errs := runCLI(t, tc.args...)
		if code != exitUsage || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: code %d, stderr %q; want a usage error with %q", tc.env, code, errs, tc.want)
		}
		for k := range tc.env {
			t.Setenv(k, "")
		}
	}
	// A workload without collectives runs alone under a launcher.
	t.Setenv("RANK", "1")
	t.Setenv("WORLD_SIZE", "4")
	if code, _, errs := runCLI(t, "--backend", "sim", "run", "--workload", "mlp", "--layers", "2", "--width", "16", "--steps", "2"); code != exitOK {
		t.Errorf("mlp under a launcher: code %d\n%s", code, errs)
	}
}

// TestDeviceFlagWins: under a launcher --device wins over the local rank
// (TestDPUnderLaunchers checks that the local rank picks the device).
func TestDeviceFlagWins(t *testing.T) {
	needSim(t)
	for _, kv := range os.Environ() {
		if launcherVars(kv) {
			name, _, _ := strings.Cut(kv, "=")
			t.Setenv(name, "")
		}
	}
	t.Setenv("RANK", "0")
	t.Setenv("WORLD_SIZE", "1")
	t.Setenv("LOCAL_RANK", "0")
	for _, tc := range []struct {
		device []string
		want   string
	}{{nil, ", device 0\n"}, {[]string{"--device", "2"}, ", device 2\n"}} {
		args := slices.Concat([]string{"--backend", "sim", "--devices", "3", "run"}, tc.device,
			[]string{"--workload", "dp", "--layers", "2", "--width", "16", "--batch", "4", "--steps", "2", "--strategy", "pool"})
		code, out, errs := runCLI(t, args...)
		if code != exitOK || !strings.Contains(errs, "rank 0 of 1 (torchrun), local rank 0"+tc.want) {
			t.Errorf("%v: code %d, want %q\nstdout:\n%s\nstderr:\n%s", tc.device, code, tc.want, out, errs)
		}
	}
}
