package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/rendezvous"
	"github.com/stablegraph/stablegraph/report"
	"github.com/stablegraph/stablegraph/workload"
)

// Ranks: run and bench of a workload with collectives (dp; gpt2-decode,
// tensor parallel over the ranks) on several ranks, one GPU each.
//
//   - Under a launcher (torchrun, srun, mpirun, or a Kubernetes Job setting
//     torchrun's variables), each process the launcher starts is one rank:
//     its rank, the world, rank 0's address and its device (its local rank)
//     come from the launcher's environment (rendezvous.ParseLaunch;
//     docs/MULTI-GPU.md), the job token from STABLEGRAPH_TOKEN or
//     STABLEGRAPH_TOKEN_FILE. No flag is needed; --rank, --world,
//     --rendezvous and --device override what the environment says.
//   - --nproc N on CUDA starts N processes of this executable on this host,
//     rank r on GPU r, with --rank r --world N --rendezvous 127.0.0.1:PORT,
//     a random job token in the environment (never on the command line,
//     which every user of the host can read), and the NCCL settings of
//     ncclDefaults unless the environment sets them. The launcher listens on
//     PORT itself and hands the listening socket to rank 0 (--rendezvous-fd),
//     so that no other process can take the port between its choice and
//     rank 0's Join. Rank 0's report goes to stdout; every rank's stderr is
//     relayed with a "[rank r]" prefix, line by line (a line longer than
//     relayLineMax is cut, and the rest of it read and dropped: a rank is
//     never left blocked on a full pipe). If a rank fails, the others learn
//     it from the rendezvous and stop; the command fails.
//   - --nproc N on sim runs the N ranks in this process, on N simulated
//     devices (--devices is raised to N).
//   - --rank R --world W --rendezvous host:port launches one rank by hand,
//     on any host, with the job token in STABLEGRAPH_TOKEN, or in a file
//     named by --token-file or STABLEGRAPH_TOKEN_FILE: rank 0 listens on
//     host:port, the others connect to it; together they make the NCCL
//     communicator.
//
// On sim, ranks in separate processes (a launcher's, or by hand) run their
// collectives through the rendezvous (workload.NewRank).
//
// A rank process waits at most --rendezvous-timeout for the others to
// arrive. While it runs, a lost rank (its process died: the rendezvous
// connection ended without goodbye) makes it exit at once with an error,
// since collectives waiting for the lost rank would never complete.

// rankFlags are the flags of multi-rank runs, and what the launcher's
// environment adds to them (resolve).
type rankFlags struct {
	nproc      int
	rank       int
	world      int
	rendezvous string
	tokenFile  string
	timeout    time.Duration

	listenFD int // rank 0: the fd of a listening socket it inherited (--nproc's)

	token      string            // the job token, from the environment or --token-file
	tokenGiven tokenFlag         // --token was given (refused; its value is not kept)
	launch     rendezvous.Launch // the launcher's environment, when it gave the ranks
	deviceSet  bool              // --device was given: it wins over the local rank
}

// rankFlagNames are the flags the --nproc launcher sets for each rank
// itself, rather than passing on the command line it was given.
var rankFlagNames = []string{"nproc", "rank", "world", "rendezvous", "rendezvous-fd", "token", "token-file", "device"}

// errTokenFlag refuses a token on the command line.
var errTokenFlag = errors.New("a token on the command line is visible to every user of the host: pass it in " +
	rendezvous.EnvToken + ", or in a file named by --token-file or " + rendezvous.EnvTokenFile)

// tokenFlag is --token: refused (check), and its value is dropped at once
// rather than kept, so that no message can repeat the secret (the flag
// package quotes the value of a flag whose Set fails).
type tokenFlag bool

func (t *tokenFlag) String() string     { return "" }
func (t *tokenFlag) Set(_ string) error { *t = true; return nil }

// listenFDFlag is the fd number a rank 0 started by --nproc finds its
// listening socket at: the first of exec.Cmd.ExtraFiles.
const listenFDFlag = 3

func (f *rankFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.nproc, "nproc", 0, "run `N` ranks of a workload with collectives (dp, gpt2-decode: tensor parallel) on this host: N processes, one GPU each (cuda), or N simulated devices in this process (sim)")
	fs.IntVar(&f.rank, "rank", 0, "this process's `rank`, when ranks are launched by hand (with --world and --rendezvous); default: the launcher's (torchrun, srun, mpirun)")
	fs.IntVar(&f.world, "world", 0, "the `number` of ranks, when ranks are launched by hand; default: the launcher's")
	fs.StringVar(&f.rendezvous, "rendezvous", "", "`host:port` rank 0 listens on and the other ranks connect to; default: from the launcher's environment (docs/MULTI-GPU.md)")
	fs.IntVar(&f.listenFD, "rendezvous-fd", 0, "rank 0 only: the `fd` of a listening socket it inherited, used instead of listening at --rendezvous (--nproc passes it)")
	fs.StringVar(&f.tokenFile, "token-file", "", "`file` holding the job token, the same on every rank (or set "+rendezvous.EnvToken+" or "+rendezvous.EnvTokenFile+")")
	fs.Var(&f.tokenGiven, "token", "not accepted: "+errTokenFlag.Error())
	fs.DurationVar(&f.timeout, "rendezvous-timeout", rendezvous.DefaultTimeout, "how long ranks wait for each other to arrive")
}

// collectiveWorkloads run on several ranks: dp (data parallel) and
// gpt2-decode (tensor parallel).
var collectiveWorkloads = []string{"dp", "gpt2-decode", "gpt2-decode-tiny"}

// hasCollectives reports whether workload name runs on several ranks.
func hasCollectives(name string) bool { return slices.Contains(collectiveWorkloads, name) }

// check validates the rank flags for workload name.
func (f *rankFlags) check(name string) error {
	if f.rendezvous != "" {
		if err := rendezvous.CheckAddr(f.rendezvous); err != nil {
			return usagef("--rendezvous %q: %v; want rank 0's host:port", f.rendezvous, err)
		}
	}
	switch {
	case bool(f.tokenGiven):
		return usagef("--token: %v", errTokenFlag)
	case f.listenFD < 0 || f.listenFD > 0 && (f.world == 0 || f.rank != 0):
		return usagef("--rendezvous-fd is for rank 0 of a world given with --world (--nproc sets it)")
	case f.nproc < 0 || f.world < 0:
		return usagef("--nproc and --world must not be negative")
	case f.nproc > 0 && f.world > 0:
		return usagef("--nproc launches the ranks itself; do not give --world with it")
	case f.world > 0 && (f.rank < 0 || f.rank >= f.world):
		return usagef("--rank %d out of range [0, %d)", f.rank, f.world)
	case f.world > 1 && f.rendezvous == "":
		return usagef("--world %d needs --rendezvous host:port (rank 0's address)", f.world)
	case f.world == 0 && f.rank != 0:
		return usagef("--rank needs --world")
	case f.timeout <= 0:
		return usagef("--rendezvous-timeout must be positive")
	}
	if (f.nproc > 0 || f.world > 0) && !hasCollectives(name) {
		return usagef("workload %s has no collectives; --nproc and --world run workloads that do (%s)", name, strings.Join(collectiveWorkloads, ", "))
	}
	return nil
}

// resolve completes the rank flags from the environment, for workload name
// (set: the flags given on the command line): the job token, and, when no
// --world or --nproc was given, the ranks of a launcher. Workloads without
// collectives ignore the launcher (each process runs alone).
func (f *rankFlags) resolve(name string, set map[string]bool) error {
	if !hasCollectives(name) || f.nproc > 0 {
		return nil
	}
	l, err := launchEnv(f.world > 0)
	if err != nil {
		return usagef("launcher environment: %v", err)
	}
	f.token = l.Token
	if f.tokenFile != "" {
		if f.token, err = readTokenFile(f.tokenFile); err != nil {
			return usagef("%v", err)
		}
	}
	if f.world > 0 || !l.Found() {
		return nil
	}
	f.launch = l
	f.rank, f.world = l.Rank, l.World
	if !set["rendezvous"] {
		f.rendezvous = l.Addr
	}
	return nil
}

// rankBody runs a command's work on an opened backend for one rank (or the
// only one). lead is the rank that reports (progress, table, files).
type rankBody func(e *env, b gpu.Backend, w *workload.Workload, o workload.RunOptions, lead bool) (*report.Report, error)

// execute runs body as the flags say (see the top of this file); output
// writes the lead rank's report.
func (f *workloadFlags) execute(e *env, fs *flag.FlagSet, cmd string, w *workload.Workload, body rankBody, output func(*report.Report) error) error {
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if err := f.ranks.resolve(f.name, set); err != nil {
		return err
	}
	f.ranks.deviceSet = set["device"]
	switch {
	case f.ranks.nproc > 0:
		return f.launch(e, fs, cmd, body, output)
	case f.ranks.world > 0:
		return f.runRank(e, cmd, body, output)
	}
	b, reason, err := e.open()
	if err != nil {
		return err
	}
	defer closeBackend(b, &err)
	if f.run.Device < 0 || f.run.Device >= b.DeviceCount() {
		return usagef("--device %d: backend %s has %d device(s)", f.run.Device, b.Name(), b.DeviceCount())
	}
	e.progress("%s: %s on backend %s", cmd, w.Desc, shortReason(reason))
	o := f.run
	o.Logger = e.log
	rep, err := body(e, b, w, o, true)
	if rep != nil {
		err = errors.Join(output(rep), err)
	}
	return err
}

// launch is --nproc: N ranks in this process on sim, else N processes.
func (f *workloadFlags) launch(e *env, fs *flag.FlagSet, cmd string, body rankBody, output func(*report.Report) error) (err error) {
	n := f.ranks.nproc
	if e.global.backend == "sim" || e.global.backend == "auto" {
		e.global.devices = max(e.global.devices, n)
		b, reason, err := e.open()
		if err != nil {
			return err
		}
		if b.Name() == "sim" {
			defer closeBackend(b, &err)
			return f.inProcess(e, cmd, b, reason, body, output)
		}
		// auto found a GPU: one process per GPU, as on cuda.
		if err := b.Close(); err != nil {
			return err
		}
	}
	return f.spawn(e, fs, cmd)
}

// inProcess runs the ranks on the devices of one sim backend, one
// goroutine each.
func (f *workloadFlags) inProcess(e *env, cmd string, b gpu.Backend, reason string, body rankBody, output func(*report.Report) error) error {
	n := f.ranks.nproc
	if t, ok := b.(interface{ SetCommTimeout(time.Duration) }); ok {
		t.SetCommTimeout(f.ranks.timeout)
	}
	devs := make([]int, n)
	for i := range devs {
		devs[i] = i
	}
	comms, err := sg.NewComms(b, devs)
	if err != nil {
		return err
	}
	defer func() {
		for _, c := range comms {
			err = errors.Join(err, c.Close())
		}
	}()
	ws, err := workload.ForRanks(f.name, f.cfg, comms)
	if err != nil {
		return usagef("%v", err)
	}
	e.progress("%s: %s, %d ranks in this process on backend %s", cmd, ws[0].Desc, n, shortReason(reason))
	reps := make([]*report.Report, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			o := f.run
			o.Logger, o.Device = e.log, comms[r].Device()
			reps[r], errs[r] = body(e, b, ws[r], o, r == 0)
			if errs[r] != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, errs[r])
			}
		})
	}
	wg.Wait()
	err = errors.Join(errs...)
	if reps[0] != nil && err == nil {
		for _, r := range reps {
			own := *r
			own.Ranks = nil
			reps[0].Ranks = append(reps[0].Ranks, own)
		}
	}
	if reps[0] != nil {
		err = errors.Join(output(reps[0]), err)
	}
	return err
}

// rankCommand is the executable that runs a rank, and its arguments for
// the rank's command line args: this executable (tests run their own
// binary in its child mode).
var rankCommand = func(args []string) (string, []string, error) {
	self, err := os.Executable()
	return self, args, err
}

// listenRendezvous listens where the ranks of --nproc meet (tests wrap it).
var listenRendezvous = func() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

// rendezvousSocket listens on a free loopback port for --nproc's ranks and
// returns its address and the listening socket as a file for rank 0 to
// inherit. The launcher's own listener is closed: the file keeps the
// socket listening, so the port is never free for another process to take
// before rank 0 accepts on it, and connections that come first wait in its
// queue.
func rendezvousSocket() (addr string, sock *os.File, err error) {
	l, err := listenRendezvous()
	if err != nil {
		return "", nil, fmt.Errorf("listen for the rendezvous: %w", err)
	}
	defer l.Close()
	fl, ok := l.(interface{ File() (*os.File, error) })
	if !ok {
		return "", nil, fmt.Errorf("listen for the rendezvous: a %T has no file to hand to rank 0", l)
	}
	if sock, err = fl.File(); err != nil {
		return "", nil, fmt.Errorf("listen for the rendezvous: %w", err)
	}
	return l.Addr().String(), sock, nil
}

// spawn starts the N rank processes and waits for them.
func (f *workloadFlags) spawn(e *env, fs *flag.FlagSet, cmd string) error {
	n := f.ranks.nproc
	addr, sock, err := rendezvousSocket()
	if err != nil {
		return err
	}
	defer sock.Close() // also once rank 0 has its copy: the port then lives as long as rank 0's
	var tok [32]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return err
	}
	token := hex.EncodeToString(tok[:])
	args := childArgs(e.global, fs, cmd)
	e.progress("%s: starting %d ranks, one process per GPU, rendezvous at %s", cmd, n, addr)

	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	procs := make([]*exec.Cmd, n)
	var relays sync.WaitGroup
	for r := range n {
		a := slices.Concat(args, []string{"--rank", strconv.Itoa(r), "--world", strconv.Itoa(n),
			"--rendezvous", addr, "--device", strconv.Itoa(r)})
		if r == 0 {
			a = append(a, "--rendezvous-fd", strconv.Itoa(listenFDFlag))
		}
		path, a, err := rankCommand(a)
		if err != nil {
			cancel()
			for _, p := range procs[:r] {
				p.Wait()
			}
			return fmt.Errorf("find this executable to start the ranks: %w", err)
		}
		c := exec.CommandContext(ctx, path, a...)
		c.Env = childEnv(token)
		c.WaitDelay = 5 * time.Second
		if r == 0 {
			c.Stdout = e.stdout
			c.ExtraFiles = []*os.File{sock} // fd listenFDFlag in the child
		}
		stderr, err := c.StderrPipe()
		if err != nil {
			return err
		}
		if err := c.Start(); err != nil {
			cancel()
			for _, p := range procs[:r] {
				p.Wait()
			}
			return fmt.Errorf("start rank %d: %w", r, err)
		}
		procs[r] = c
		if r == 0 {
			sock.Close() // rank 0 has it: the port is its own now
		}
		relays.Go(func() { relay(e.stderr, stderr, fmt.Sprintf("[rank %d] ", r)) })
	}
	// Wait for every rank. Once one has failed the others are told by the
	// rendezvous and stop; any still running after the grace period is
	// killed.
	errs := make([]error, n)
	failed := make(chan struct{}, n)
	var wg sync.WaitGroup
	for r, c := range procs {
		wg.Go(func() {
			if err := c.Wait(); err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				failed <- struct{}{}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-failed:
		select {
		case <-done:
		case <-time.After(f.ranks.timeout + 30*time.Second):
			cancel()
			<-done
		}
	}
	relays.Wait()
	return errors.Join(errs...)
}

// childArgs are the command-line arguments of a rank process: the global
// flags, the command, and the command's flags that were set, less the ones
// the launcher sets per rank.
func childArgs(g *globalFlags, fs *flag.FlagSet, cmd string) []string {
	args := []string{"--backend", g.backend, "--devices", strconv.Itoa(g.devices)}
	if g.verbose {
		args = append(args, "-v")
	}
	for name, v := range map[string]string{"libcuda": g.libcuda, "libcublas": g.libcublas, "libnccl": g.libnccl} {
		if v != "" {
			args = append(args, "--"+name, v)
		}
	}
	args = append(args, cmd)
	fs.Visit(func(fl *flag.Flag) {
		if slices.Contains(rankFlagNames, fl.Name) || slices.Contains(globalNames, fl.Name) {
			return
		}
		args = append(args, "--"+fl.Name+"="+fl.Value.String())
	})
	return args
}

// relayLineMax bounds a line relayed from a rank's stderr.
const relayLineMax = 64 << 10

// relay copies r to w line by line, each line prefixed, until r ends. A
// line longer than relayLineMax is cut there, with a note of how much was
// dropped; the rest of it is still read, so the rank never blocks on a
// full pipe, and the lines after it are relayed. Errors writing to w are
// ignored for the same reason.
func relay(w io.Writer, r io.Reader, prefix string) {
	br := bufio.NewReaderSize(r, relayLineMax)
	for {
		line, err := br.ReadSlice('\n')
		out := append([]byte(prefix), bytes.TrimSuffix(line, []byte("\n"))...)
		cut := 0
		for errors.Is(err, bufio.ErrBufferFull) {
			var rest []byte
			rest, err = br.ReadSlice('\n')
			cut += len(bytes.TrimSuffix(rest, []byte("\n")))
		}
		if len(line) > 0 {
			if cut > 0 {
				out = fmt.Appendf(out, " [... %d more bytes of this line dropped]", cut)
			}
			_, _ = w.Write(append(out, '\n'))
		}
		if err != nil {
			return // the end of the rank's stderr
		}
	}
}

// runRank is one rank of a multi-process run: join the rendezvous, set the
// rank up (the communicator), run, and report on rank 0.
func (f *workloadFlags) runRank(e *env, cmd string, body rankBody, output func(*report.Report) error) (err error) {
	rk := f.ranks
	b, reason, err := e.open()
	if err != nil {
		return err
	}
	defer closeBackend(b, &err)
	dev := f.run.Device
	if rk.launch.Found() && !rk.deviceSet {
		if dev, err = rk.launch.Device(b.DeviceCount()); err != nil {
			return usagef("%v", err)
		}
	}
	if dev < 0 || dev >= b.DeviceCount() {
		return usagef("--device %d: backend %s has %d device(s)", dev, b.Name(), b.DeviceCount())
	}
	if rk.world > 1 && rk.token == "" {
		return usagef("a world of %d ranks needs a job token, the same secret on every rank: set %s, or name a file that holds it with --token-file or %s (not on the command line, which every user of the host can read)",
			rk.world, rendezvous.EnvToken, rendezvous.EnvTokenFile)
	}
	if rk.launch.Found() {
		e.progress("%s: %s, device %d", cmd, rk.launch, dev)
	}
	cfg := rendezvous.Config{Addr: rk.rendezvous, Listen: rendezvous.ListenAddr(rk.rendezvous),
		Rank: rk.rank, World: rk.world, Token: rk.token, Timeout: rk.timeout, Logger: e.log}
	if rk.listenFD > 0 {
		sock := os.NewFile(uintptr(rk.listenFD), "rendezvous socket")
		l, err := net.FileListener(sock)
		sock.Close() // FileListener made its own copy
		if err != nil {
			return usagef("--rendezvous-fd %d: not a listening socket: %v", rk.listenFD, err)
		}
		cfg.Listener = l // Join closes it
	}
	g, err := rendezvous.Join(e.ctx, cfg)
	if errors.Is(err, rendezvous.ErrNoToken) {
		return usagef("%v", err)
	}
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, g.Close()) }()
	// abort tells the other ranks why this one stops, so they stop too.
	abort := func(err error) error {
		g.Abort(fmt.Sprintf("rank %d: %v", rk.rank, err))
		return err
	}
	stop := watchRendezvous(e, g, rk.rank)
	r, err := workload.NewRank(e.ctx, b, dev, g)
	if err != nil {
		stop()
		return err // NewRank told the others
	}
	defer func() { err = errors.Join(err, r.Close(e.ctx)) }()
	wcfg := f.cfg
	wcfg.Comm = r.Comm
	w, err := workload.New(f.name, wcfg)
	if err != nil {
		stop()
		return abort(usagef("%v", err))
	}
	lead := rk.rank == 0
	if lead {
		e.progress("%s: %s on backend %s", cmd, w.Desc, shortReason(reason))
	}
	o := f.run
	o.Logger, o.Device = e.log, dev
	rep, err := body(e, r.Backend, w, o, lead)
	if err != nil && rep == nil {
		stop()
		return abort(err)
	}
	// Rank 0 reports every rank's times (Report.Ranks).
	ranks, gerr := workload.GatherReports(e.ctx, g, rep)
	if lead {
		rep.Ranks = ranks
	}
	err = errors.Join(err, gerr)
	// Every rank finishes its collectives before any destroys its
	// communicator.
	berr := g.Barrier(e.ctx)
	stop()
	err = errors.Join(err, berr)
	if lead && rep != nil {
		err = errors.Join(output(rep), err)
	}
	return err
}

// watchRendezvous makes the process exit, with the reason on stderr, when
// the rendezvous fails while the rank runs: a rank was lost, and work
// waiting for it in a collective would never complete. stop ends the watch.
func watchRendezvous(e *env, g *rendezvous.Group, rank int) (stop func()) {
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-quit:
		case <-g.Done():
			var own *rendezvous.AbortError
			if errors.As(g.Err(), &own) && own.Rank == rank {
				return // this rank's own abort: its caller returns the error
			}
			if err := g.Err(); err != nil && !errors.Is(err, rendezvous.ErrClosed) {
				fmt.Fprintf(e.stderr, "stablegraph: rank %d stops: %v (collectives waiting for the lost rank cannot complete)\n", rank, err)
				e.exit(exitFailure)
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		<-done
	}
}
