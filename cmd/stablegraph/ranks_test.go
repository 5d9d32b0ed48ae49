package main

import (
	"bytes"
	"context"
	"flag"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

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

func TestRankUsageErrors(t *testing.T) {
	needSim(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--workload", "dp", "--world", "2"}, "needs --rendezvous"},
		{[]string{"run", "--workload", "dp", "--nproc", "2", "--world", "2"}, "do not give --world"},
		{[]string{"run", "--workload", "dp", "--world", "2", "--rank", "2", "--rendezvous", "x:1"}, "--rank 2 out of range"},
		{[]string{"run", "--workload", "mlp", "--nproc", "2"}, "workload mlp has no collectives"},
		{[]string{"--backend", "sim", "run", "--workload", "dp", "--world", "2", "--rank", "1", "--rendezvous", "127.0.0.1:1"}, "needs a job token"},
		{[]string{"--backend", "sim", "run", "--workload", "dp", "--world", "2", "--rendezvous", "127.0.0.1:1", "--token", "s3cret"}, "visible to every user of the host"},
		{[]string{"--backend", "sim", "run", "--workload", "dp", "--world", "2", "--rendezvous", "127.0.0.1:1", "--token-file", "/nonexistent/tok"}, "--token-file: open /nonexistent/tok"},
		{[]string{"--backend", "sim", "run", "--workload", "dp", "--nproc", "3"}, "does not split into 3"},
	} {
		code, _, errs := runCLI(t, tc.args...)
		if code != exitUsage || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: code %d, stderr %q; want usage error %q", tc.args, code, errs, tc.want)
		}
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
	select {
	case code := <-exited:
		t.Fatalf("the rank exited %d on its own abort: %s", code, stderr.String())
	case <-time.After(300 * time.Millisecond):
	}
	stop()
}
