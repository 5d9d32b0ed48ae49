package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/safetensors"
	"github.com/stablegraph/stablegraph/rendezvous"
)

var dpSmall = []string{"--workload", "dp", "--layers", "2", "--width", "16", "--batch", "4", "--steps", "3", "--warmup", "1"}

func TestRunDPRanksInProcess(t *testing.T) {
	needSim(t)
	for _, args := range [][]string{
		append([]string{"--backend", "sim", "run", "--nproc", "2", "--strategy", "pool"}, dpSmall...),
		append([]string{"--backend", "sim", "bench", "--nproc", "2", "--strategies", "patch,stable", "--pattern", "random"}, dpSmall...),
		// One rank through the rank path: rendezvous of one, a
		// communicator of one.
		append([]string{"--backend", "sim", "run", "--world", "1", "--strategy", "record"}, dpSmall...),
	} {
		code, out, errs := runCLI(t, args...)
		if code != exitOK {
			t.Fatalf("%v: code %d\nstdout:\n%s\nstderr:\n%s", args, code, out, errs)
		}
		if !strings.Contains(out, "collectives captured in steady state: 0") || !strings.Contains(out, "rank 0 of") {
			t.Fatalf("%v: report lacks the collective note or the rank:\n%s", args, out)
		}
	}
}

// TestGPT2DecodeTensorParallelCLI: gpt2-decode under --nproc is tensor
// parallel over the ranks (run, and bench of two strategies); rank 0's
// dump (bench: eager's last step) has the single-rank run's logits within
// float32 reassociation; heads that do not split over the ranks are a
// usage error.
func TestGPT2DecodeTensorParallelCLI(t *testing.T) {
	needSim(t)
	dir := t.TempDir()
	tiny := []string{"--workload", "gpt2-decode-tiny", "--layers", "1", "--steps", "2", "--warmup", "1", "--pattern", "swap"}
	dumps := map[int]string{}
	for _, n := range []int{1, 2} {
		dumps[n] = filepath.Join(dir, fmt.Sprintf("n%d.safetensors", n))
		args := append([]string{"--backend", "sim", "run", "--strategy", "device", "--dump", dumps[n]}, tiny...)
		if n > 1 {
			args = append([]string{"--backend", "sim", "bench", "--strategies", "device,stable", "--dump", dumps[n], "--nproc", strconv.Itoa(n)}, tiny...)
		}
		code, out, errs := runCLI(t, args...)
		if code != exitOK {
			t.Fatalf("%v: code %d\nstdout:\n%s\nstderr:\n%s", args, code, out, errs)
		}
		if tp := strings.Contains(out, "tensor-parallel rank 0 of 2: 2 heads, 128 MLP columns"); tp != (n > 1) {
			t.Fatalf("%v: tensor parallel %v in the report:\n%s", args, tp, out)
		}
		if n > 1 && !strings.Contains(out, "collectives captured in steady state: 0") {
			t.Fatalf("%v: no collective note:\n%s", args, out)
		}
	}
	logits := func(path string) []float32 {
		f, err := safetensors.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		x, err := f.ReadTensor("logits")
		if err != nil {
			t.Fatal(err)
		}
		return gpu.BytesToF32(x.Data)
	}
	one, two := logits(dumps[1]), logits(dumps[2])
	for i := range one {
		if d := math.Abs(float64(one[i]) - float64(two[i])); !(d <= 1e-4) {
			t.Fatalf("logit %d: %v on one rank, %v on two", i, one[i], two[i])
		}
	}
	code, _, errs := runCLI(t, append([]string{"--backend", "sim", "run", "--nproc", "3"}, tiny...)...)
	if code != exitUsage || !strings.Contains(errs, "4 heads do not split over 3 ranks") {
		t.Fatalf("3 ranks of 4 heads: code %d, stderr %q", code, errs)
	}
}

func TestRankUsageErrors(t *testing.T) {
	needSim(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--workload", "dp", "--world", "2"}, "needs --rendezvous"},
		{[]string{"run", "--workload", "dp", "--nproc", "2", "--world", "2"}, "do not give --world"},
		{[]string{"run", "--workload", "dp", "--world", "2", "--rank", "2", "--rendezvous", "x:1"}, "--rank 2 out of range"},
		{[]string{"run", "--workload", "mlp", "--nproc", "2"}, "workload mlp has no collectives; --nproc and --world run workloads that do (dp, gpt2-decode, gpt2-decode-tiny)"},
		{[]string{"--backend", "sim", "run", "--workload", "dp", "--world", "2", "--rank", "1", "--rendezvous", "127.0.0.1:1"}, "needs a job token"},
		{[]string{"--backend", "sim", "run", "--workload", "dp", "--world", "2", "--rendezvous", "127.0.0.1:1", "--token", "s3cret"}, "visible to every user of the host"},
		{[]string{"--backend", "sim", "run", "--workload", "dp", "--world", "2", "--rendezvous", "127.0.0.1:1", "--token=s3cret"}, "visible to every user of the host"},
		{[]string{"--backend", "sim", "run", "--workload", "dp", "--nproc", "2", "-token", "s3cret"}, "visible to every user of the host"},
		{[]string{"--backend", "sim", "run", "--workload", "dp", "--world", "2", "--rendezvous", "127.0.0.1:"}, `--rendezvous "127.0.0.1:": no port`},
		{[]string{"--backend", "sim", "run", "--workload", "dp", "--world", "2", "--rendezvous", "127.0.0.1:0"}, `--rendezvous "127.0.0.1:0": port "0" is not a port number`},
		{[]string{"--backend", "sim", "run", "--workload", "dp", "--world", "2", "--rendezvous", "127.0.0.1"}, `--rendezvous "127.0.0.1": address 127.0.0.1: missing port`},
		{[]string{"--backend", "sim", "run", "--workload", "dp", "--world", "2", "--rendezvous", ":29500"}, "no host"},
		{[]string{"--backend", "sim", "run", "--workload", "dp", "--world", "2", "--rank", "1", "--rendezvous", "127.0.0.1:1", "--rendezvous-fd", "3"}, "--rendezvous-fd is for rank 0"},
		{[]string{"--backend", "sim", "run", "--workload", "dp", "--world", "2", "--rendezvous", "127.0.0.1:1", "--token-file", "/nonexistent/tok"}, "--token-file: open /nonexistent/tok"},
		{[]string{"--backend", "sim", "run", "--workload", "dp", "--nproc", "3"}, "does not split into 3"},
	} {
		code, _, errs := runCLI(t, tc.args...)
		if code != exitUsage || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: code %d, stderr %q; want usage error %q", tc.args, code, errs, tc.want)
		}
		if strings.Contains(errs, "s3cret") {
			t.Errorf("%v: the error repeats the token given on the command line: %q", tc.args, errs)
		}
	}
}

// TestRelayLongLines: a rank's stderr line of several MiB is cut, the
// rest of it read and dropped, and the lines after it still relayed; the
// rank never blocks on its pipe.
func TestRelayLongLines(t *testing.T) {
	r, w := io.Pipe()
	var out bytes.Buffer
	relayed := make(chan struct{})
	go func() {
		relay(&out, r, "[rank 1] ")
		close(relayed)
	}()
	wrote := make(chan error, 1)
	go func() {
		_, err := io.WriteString(w, "first\n"+strings.Repeat("x", 3<<20)+"\n"+strings.Repeat("y", relayLineMax)+"\nrank 1: the error after it\nlast, unterminated")
		w.Close()
		wrote <- err
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the rank is blocked writing its stderr: the relay stopped reading")
	}
	<-relayed
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	want := []string{
		"[rank 1] first",
		"[rank 1] " + strings.Repeat("x", relayLineMax) + fmt.Sprintf(" [... %d more bytes of this line dropped]", 3<<20-relayLineMax),
		"[rank 1] " + strings.Repeat("y", relayLineMax),
		"[rank 1] rank 1: the error after it",
		"[rank 1] last, unterminated",
	}
	if !slices.Equal(lines, want) {
		for i, l := range lines {
			if len(l) > 120 {
				lines[i] = l[:60] + fmt.Sprintf("...(%d bytes)...", len(l)-120) + l[len(l)-60:]
			}
		}
		t.Fatalf("relayed %d lines:\n%s", len(lines), strings.Join(lines, "\n"))
	}
}

// squatListener is the launcher's rendezvous listener with a neighbour
// that tries to take its port the moment the launcher closes it.
type squatListener struct {
	net.Listener
	squatted chan error // nil: the port was taken by the neighbour
	held     net.Listener
}

func (l *squatListener) File() (*os.File, error) { return l.Listener.(*net.TCPListener).File() }

func (l *squatListener) Close() error {
	err := l.Listener.Close()
	s, serr := net.Listen("tcp", l.Addr().String())
	if serr == nil {
		l.held = s
	}
	l.squatted <- serr
	return err
}

// TestNprocHandsRankZeroItsSocket: --nproc starts the ranks as processes
// (here of this test binary, on sim) and hands rank 0 the socket it
// listens on: the port is never free in between, so a process that tries
// to take it the moment the launcher lets go of its own listener fails,
// and the ranks meet and run.
func TestNprocHandsRankZeroItsSocket(t *testing.T) {
	needSim(t)
	if testing.Short() {
		t.Skip("starts processes")
	}
	t.Setenv("STABLEGRAPH_TEST_RUN_MAIN", "1")
	sq := &squatListener{squatted: make(chan error, 1)}
	defer func() {
		if sq.held != nil {
			sq.held.Close()
		}
	}()
	oldListen, oldCommand := listenRendezvous, rankCommand
	defer func() { listenRendezvous, rankCommand = oldListen, oldCommand }()
	listenRendezvous = func() (net.Listener, error) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		sq.Listener = l
		return sq, err
	}
	rankCommand = func(args []string) (string, []string, error) { return os.Args[0], args, nil }

	g := &globalFlags{backend: "sim", devices: 2}
	var wf workloadFlags
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	g.register(fs)
	wf.register(fs)
	if err := fs.Parse(append([]string{"--nproc", "2"}, dpSmall...)); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	e := &env{ctx: context.Background(), stdout: &stdout, stderr: &stderr, global: g, log: slog.New(slog.NewTextHandler(&stderr, nil))}
	err := wf.spawn(e, fs, "run")
	if serr := <-sq.squatted; serr == nil {
		t.Errorf("another process took the rendezvous port %s once the launcher closed its listener", sq.Addr())
	}
	if err != nil || !strings.Contains(stdout.String(), "rank 0 of 2") {
		t.Fatalf("spawn: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
}

func TestChildArgs(t *testing.T) {
	g := &globalFlags{backend: "cuda", devices: 1, libnccl: "/x/libnccl.so.2"}
	var wf workloadFlags
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	g.register(fs)
	wf.register(fs)
	if err := fs.Parse([]string{"--workload", "dp", "--steps", "7", "--nproc", "2", "--device", "1", "--pattern", "random", "--token-file", "/tok"}); err != nil {
		t.Fatal(err)
	}
	got := childArgs(g, fs, "bench")
	want := []string{"--backend", "cuda", "--devices", "1", "--libnccl", "/x/libnccl.so.2", "bench", "--pattern=random", "--steps=7", "--workload=dp"}
	if !slices.Equal(got, want) {
		t.Fatalf("childArgs = %q, want %q", got, want)
	}
}

func TestChildEnv(t *testing.T) {
	t.Setenv("NCCL_GRAPH_REGISTER", "1")
	t.Setenv("STABLEGRAPH_TOKEN", "the parent's token")
	t.Setenv("STABLEGRAPH_TOKEN_FILE", "/the/parent's/file")
	env := childEnv("the job's token")
	if !slices.Contains(env, "NCCL_GRAPH_REGISTER=1") || slices.Contains(env, "NCCL_GRAPH_REGISTER=0") {
		t.Errorf("a setting of the environment was overridden")
	}
	if !slices.Contains(env, "NCCL_NVLS_ENABLE=0") {
		t.Errorf("NCCL_NVLS_ENABLE=0 not added")
	}
	var tokens []string
	for _, kv := range env {
		if strings.HasPrefix(kv, "STABLEGRAPH_TOKEN") {
			tokens = append(tokens, kv)
		}
	}
	if !slices.Equal(tokens, []string{"STABLEGRAPH_TOKEN=the job's token"}) {
		t.Errorf("the rank's token variables: %q", tokens)
	}
}

// TestLostRankExits: a rank whose peer is lost while it runs exits at once
// with the reason, instead of waiting in collectives forever.
func TestLostRankExits(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := make([]*rendezvous.Group, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		cfg := rendezvous.Config{Addr: l.Addr().String(), Rank: r, World: 2, Token: "lost-rank-token-0123456789", Timeout: 5 * time.Second}
		if r == 0 {
			cfg.Listener = l
		}
		wg.Go(func() { gs[r], errs[r] = rendezvous.Join(context.Background(), cfg) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	defer gs[0].Close()
	var stderr bytes.Buffer
	exited := make(chan int, 1)
	e := &env{stderr: &stderr, exit: func(code int) { exited <- code }}
	stop := watchRendezvous(e, gs[0], 0)
	defer stop()
	gs[1].Abort("device fell off the bus")
	select {
	case code := <-exited:
		if code != exitFailure || !strings.Contains(stderr.String(), "device fell off the bus") {
			t.Fatalf("exit %d, stderr %q", code, stderr.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the rank did not exit when its peer was lost")
	}
}

// TestOwnAbortDoesNotExit: a rank that aborts the group itself returns its
// own error; the watch exits the process only for another rank's failure.
// (The group records a rank's own abort before it tells rank 0, so an
// echo cannot replace it: rendezvous.TestOwnAbortIsKept forces that race.)
func TestOwnAbortDoesNotExit(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := make([]*rendezvous.Group, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		cfg := rendezvous.Config{Addr: l.Addr().String(), Rank: r, World: 2, Token: "own-abort-token-0123456789", Timeout: 5 * time.Second}
		if r == 0 {
			cfg.Listener = l
		}
		wg.Go(func() { gs[r], _ = rendezvous.Join(context.Background(), cfg) })
	}
	wg.Wait()
	if gs[0] == nil || gs[1] == nil {
		t.Fatal("join failed")
	}
	defer gs[0].Close()
	defer gs[1].Close()
	exited := make(chan int, 2)
	var stderr bytes.Buffer
	e := &env{stderr: &stderr, exit: func(code int) { exited <- code }}
	stop := watchRendezvous(e, gs[1], 1)
	gs[1].Abort("rank 1 could not make its communicator")
	<-gs[0].Done() // rank 0 heard the abort (and relays it to the others, not back)
	<-gs[1].Done()
	stop() // the watch has made its decision
	select {
	case code := <-exited:
		t.Fatalf("the rank exited %d on its own abort: %s", code, stderr.String())
	default:
	}
}
