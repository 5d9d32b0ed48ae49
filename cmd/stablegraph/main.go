// Command stablegraph inspects devices, runs and benchmarks stablegraph
// workloads with every replay strategy, and measures driver costs, on any
// registered backend.
//
// Usage:
//
//	stablegraph [global flags] <command> [flags]
//
// Run "stablegraph help" for the list of commands and "stablegraph <command>
// -h" for a command's flags. Exit status: 0 on success, 1 when the command
// failed, 2 on a usage error, 130 when interrupted (SIGINT or SIGTERM).
//
// Conventions: results go to stdout, progress and errors to stderr; a file
// flag given "-" (--json -) writes to stdout instead of the table; files are
// checked for writing before a run starts and written whole or not at all
// (internal/atomicfile: a failed write leaves the file that was there, a
// device or FIFO is written in place and never removed); a flag that does
// not shape the chosen workload is a usage error, like every usage error
// found before a backend opens; JSON keys are snake_case; times measured on
// the sim backend are labelled simulated.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/atomicfile"
)

// Exit statuses.
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitInterrupted = 130 // 128 + SIGINT, the shell's convention
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal the command winds down (printing what it
		// finished); a second one ends the process at once.
		<-ctx.Done()
		stop()
	}()
	code := runContext(ctx, os.Args[1:], os.Stdout, stderrFor(ctx))
	stop()
	os.Exit(code)
}

// stderrFor is where a command run by main writes its progress and errors:
// os.Stderr. A test replaces it to hold the command at a line until the
// signal it sends has cancelled ctx (TestSIGINT).
var stderrFor = func(ctx context.Context) io.Writer { return os.Stderr }

// globalFlags are accepted before the command and after it.
type globalFlags struct {
	backend string
	// backendFrom names where backend came from when not from --backend:
	// the environment variable, for errors to name it.
	backendFrom string
	devices     int
	verbose     bool
	libcuda     string
	libcublas   string
	libnccl     string
	progress    tristate
	cpuprof     string
}

func (g *globalFlags) register(fs *flag.FlagSet) {
	// Defaults are the current values, so that flags given before the
	// command survive the command's flag set.
	fs.Var(backendFlag{g}, "backend", "`name` of the backend: auto, sim or cuda (auto prefers cuda when a GPU is present); env STABLEGRAPH_BACKEND")
	fs.IntVar(&g.devices, "devices", g.devices, "`N` simulated devices (sim)")
	fs.BoolVar(&g.verbose, "v", g.verbose, "debug logs on stderr")
	fs.StringVar(&g.libcuda, "libcuda", g.libcuda, "`path` of libcuda to load (cuda; default: the backend's search); with auto it asks for cuda, and must load")
	fs.StringVar(&g.libcublas, "libcublas", g.libcublas, "`path` of libcublas to load (cuda; default: the backend's search)")
	fs.StringVar(&g.libnccl, "libnccl", g.libnccl, "`path` of libnccl to load for collectives (cuda; default: the backend's search)")
	fs.StringVar(&g.cpuprof, "cpuprofile", g.cpuprof, "write a Go CPU profile of the command to `file` (go tool pprof reads it): where the host's time goes")
	fs.Var(&g.progress, "progress", "progress bar with the time left on stderr (default: when stderr is a terminal; --progress=false: a line at every quarter)")
}

// backendFlag is --backend: setting it forgets that the environment gave
// the backend.
type backendFlag struct{ g *globalFlags }

func (b backendFlag) String() string {
	if b.g == nil {
		return ""
	}
	return b.g.backend
}

func (b backendFlag) Set(s string) error {
	b.g.backend, b.g.backendFrom = s, ""
	return nil
}

// libraries reports whether a library path was given: it asks for the
// cuda backend, and must load.
func (g *globalFlags) libraries() bool {
	return g.libcuda != "" || g.libcublas != "" || g.libnccl != ""
}

// tristate is a boolean flag that remembers whether it was set.
type tristate struct{ set, on bool }

func (t *tristate) String() string {
	if t == nil || !t.set {
		return ""
	}
	return strconv.FormatBool(t.on)
}

func (t *tristate) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	t.set, t.on = true, v
	return nil
}

func (t *tristate) IsBoolFlag() bool { return true }

// env is what a command runs with.
type env struct {
	ctx    context.Context
	stdout io.Writer
	stderr io.Writer
	global *globalFlags
	log    *slog.Logger
	// exit ends the process at once (os.Exit): a rank whose peer died
	// cannot wait for collectives that will never complete. Tests replace
	// it.
	exit func(code int)
}

// open opens the backend the global flags select. A library path given
// with auto asks for cuda: a library that cannot load is an error, not a
// quiet fall back to sim. An error is cut to a readable length (-v logs
// it whole) and says how to run without a GPU.
func (e *env) open() (gpu.Backend, string, error) {
	cfg := gpu.Config{
		Logger: e.log,
		Backends: []gpu.BackendConfig{
			sim.Config{Devices: e.global.devices},
			cuda.Config{LibCUDA: e.global.libcuda, LibCUBLAS: e.global.libcublas, LibNCCL: e.global.libnccl},
		},
	}
	name := e.global.backend
	if name == "auto" && e.global.libraries() {
		name = "cuda"
	}
	b, reason, err := gpu.Open(name, cfg)
	if err != nil {
		e.log.Debug("backend open failed", "backend", name, "err", err)
		msg := err.Error()
		if !e.global.verbose {
			msg = cutWords(msg, maxErrorLen, " … (-v prints the whole error)")
		}
		switch {
		case errors.Is(err, gpu.ErrUnavailable) && e.global.libraries():
			msg += "\nhint: check the library paths given; without a GPU, leave them out and run on the embedded simulator: --backend sim"
		case errors.Is(err, gpu.ErrUnavailable):
			msg += "\nhint: without a GPU, run on the embedded simulator: --backend sim"
		}
		return nil, "", &openError{msg: msg, err: err}
	}
	if name != e.global.backend {
		reason += ", because a library path was given"
	}
	e.log.Debug("backend opened", "backend", b.Name(), "reason", reason)
	return b, reason, nil
}

// maxErrorLen bounds a backend's open error on the terminal: a loader's
// error lists every place it tried.
const maxErrorLen = 240

// openError is a backend open error as printed, wrapping the whole one.
type openError struct {
	msg string
	err error
}

func (o *openError) Error() string { return o.msg }
func (o *openError) Unwrap() error { return o.err }

// progress writes a progress line to stderr.
func (e *env) progress(format string, args ...any) {
	fmt.Fprintf(e.stderr, format+"\n", args...)
}

type command struct {
	name    string
	args    string // synopsis of the arguments after the flags
	nargs   int    // arguments after the flags the command takes
	summary string // one line
	detail  string // paragraphs for "help <command>"
	flags   func(fs *flag.FlagSet) func(e *env) error
}

// commands returns the commands in the order help lists them.
func commands() []*command {
	return []*command{infoCommand(), runCommand(), benchCommand(), benchDriverCommand(), soakCommand(), generateCommand(), plotCommand()}
}

func findCommand(name string) *command {
	for _, c := range commands() {
		if c.name == name {
			return c
		}
	}
	return nil
}

// usageError is a mistake in the command line: reported with a hint, exit 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdout, stderr)
}

func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	g := envDefaults()
	top := flag.NewFlagSet("stablegraph", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	g.register(top)
	version := top.Bool("version", false, "print the version and exit")
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			mainUsage(stdout, &g)
			return exitOK
		}
		fmt.Fprintf(stderr, "stablegraph: %v\nRun 'stablegraph help' for usage.\n", err)
		return exitUsage
	}
	if *version {
		fmt.Fprintln(stdout, versionString())
		return exitOK
	}
	rest := top.Args()
	if len(rest) == 0 {
		mainUsage(stderr, &g)
		return exitUsage
	}
	name, rest := rest[0], rest[1:]
	if name == "help" {
		return help(rest, stdout, stderr, &g)
	}
	c := findCommand(name)
	if c == nil {
		fmt.Fprintf(stderr, "stablegraph: unknown command %q\nRun 'stablegraph help' for the list of commands.\n", name)
		return exitUsage
	}
	fs := flag.NewFlagSet("stablegraph "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	g.register(fs)
	exec := c.flags(fs)
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			commandUsage(stdout, c, fs)
			return exitOK
		}
		fmt.Fprintf(stderr, "stablegraph %s: %v\nRun 'stablegraph %s -h' for usage.\n", c.name, err, c.name)
		return exitUsage
	}
	if fs.NArg() > c.nargs {
		fmt.Fprintf(stderr, "stablegraph %s: unexpected arguments: %s\nRun 'stablegraph %s -h' for usage.\n",
			c.name, strings.Join(fs.Args()[c.nargs:], " "), c.name)
		return exitUsage
	}
	if err := g.check(); err != nil {
		fmt.Fprintf(stderr, "stablegraph %s: %v\nRun 'stablegraph help' for the global flags.\n", c.name, err)
		return exitUsage
	}
	if !g.progress.set {
		g.progress.on = isTerminal(stderr)
	}
	level := slog.LevelWarn
	if g.verbose {
		level = slog.LevelDebug
	}
	e := &env{
		ctx: ctx, stdout: stdout, stderr: stderr, global: &g,
		log:  slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})),
		exit: exitProcess,
	}
	stopProfile, err := startCPUProfile(g.cpuprof)
	if err != nil {
		fmt.Fprintf(stderr, "stablegraph %s: --cpuprofile: %v\n", c.name, err)
		return exitUsage
	}
	err = exec(e)
	if perr := stopProfile(); perr != nil {
		fmt.Fprintf(stderr, "stablegraph %s: --cpuprofile: %v\n", c.name, perr)
		if err == nil {
			return exitFailure
		}
	}
	if err != nil {
		var ue *usageError
		if ctx.Err() != nil {
			fmt.Fprintf(stderr, "stablegraph %s: interrupted\n", c.name)
			e.log.Debug("interrupted", "err", err)
			return exitInterrupted
		}
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "stablegraph %s: %v\nRun 'stablegraph %s -h' for usage.\n", c.name, err, c.name)
			return exitUsage
		}
		fmt.Fprintf(stderr, "stablegraph %s: %v\n", c.name, err)
		return exitFailure
	}
	return exitOK
}

// startCPUProfile starts writing a CPU profile to path (none when path is
// empty) and returns what stops it and puts the file in place, whole
// (atomicfile: a profile that cannot be written leaves the old one).
func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := atomicfile.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return nil, errors.Join(err, f.Abort())
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Commit()
	}, nil
}

func help(args []string, stdout, stderr io.Writer, g *globalFlags) int {
	switch len(args) {
	case 0:
		mainUsage(stdout, g)
		return exitOK
	case 1:
		if args[0] == "help" {
			fmt.Fprint(stdout, "Usage: stablegraph help [command]\n\nShows the commands and the global flags, or a command's flags.\n")
			return exitOK
		}
		c := findCommand(args[0])
		if c == nil {
			fmt.Fprintf(stderr, "stablegraph help: unknown command %q\nRun 'stablegraph help' for the list of commands.\n", args[0])
			return exitUsage
		}
		fs := flag.NewFlagSet("stablegraph "+c.name, flag.ContinueOnError)
		g.register(fs)
		c.flags(fs)
		commandUsage(stdout, c, fs)
		return exitOK
	default:
		fmt.Fprintf(stderr, "stablegraph help: too many arguments\nUsage: stablegraph help [command]\n")
		return exitUsage
	}
}

func mainUsage(w io.Writer, g *globalFlags) {
	var b strings.Builder
	b.WriteString(`stablegraph records GPU work into graphs once and replays it even when buffers move.

Usage:
  stablegraph [global flags] <command> [flags]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(&b, "  %-13s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(&b, "  %-13s %s\n", "help", "show help for stablegraph or a command")
	b.WriteString("\nGlobal flags (also accepted after the command):\n")
	fs := flag.NewFlagSet("stablegraph", flag.ContinueOnError)
	g.register(fs)
	b.WriteString(flagDefaults(fs, nil))
	b.WriteString(`  --version
        print the version and exit

Registered backends: ` + driverList() + `

Run 'stablegraph help <command>' or 'stablegraph <command> -h' for a command's flags.
A file flag given "-" writes to stdout.
Exit status: 0 on success, 1 when the command failed, 2 on a usage error, 130 when interrupted.
`)
	io.WriteString(w, b.String())
}

var globalNames = []string{"backend", "devices", "v", "libcuda", "libcublas", "libnccl", "progress", "cpuprofile"}

// check validates the global flags: a registered backend (or auto), a
// positive device count, library paths only for cuda.
func (g *globalFlags) check() error {
	if g.backend != "auto" && !slices.Contains(gpu.Drivers(), g.backend) {
		what := "--backend " + g.backend
		if g.backendFrom != "" {
			what = g.backendFrom + "=" + g.backend + " (the environment's default for --backend)"
		}
		return fmt.Errorf("%s: unknown backend (registered: %s; or auto)", what, driverList())
	}
	if g.devices <= 0 {
		return fmt.Errorf("--devices must be positive, got %d", g.devices)
	}
	if g.backend != "auto" && g.backend != "cuda" && g.libraries() {
		return fmt.Errorf("--libcuda, --libcublas and --libnccl are for the cuda backend, not %s", g.backend)
	}
	return nil
}

// versionString names this build: the module version (a tag with go
// install @version, "(devel)" from a checkout), the commit when the build
// recorded one, and the Go toolchain.
func versionString() string {
	v, rev := "(devel)", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				rev = " " + s.Value[:min(len(s.Value), 12)]
			}
		}
	}
	return fmt.Sprintf("stablegraph %s%s (%s %s/%s)", v, rev, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func commandUsage(w io.Writer, c *command, fs *flag.FlagSet) {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: stablegraph %s [flags]%s\n\n%s\n", c.name, c.args, c.summary)
	if c.detail != "" {
		b.WriteString("\n" + c.detail + "\n")
	}
	if own := flagDefaults(fs, func(name string) bool { return !slices.Contains(globalNames, name) }); own != "" {
		b.WriteString("\nFlags:\n" + own)
	}
	b.WriteString("\nGlobal flags:\n" + flagDefaults(fs, func(name string) bool { return slices.Contains(globalNames, name) }))
	io.WriteString(w, b.String())
}

// flagDefaults renders the flags of fs that keep selects (all when nil),
// like flag.PrintDefaults.
func flagDefaults(fs *flag.FlagSet, keep func(string) bool) string {
	var b strings.Builder
	fs.VisitAll(func(f *flag.Flag) {
		if keep != nil && !keep(f.Name) {
			return
		}
		dash := "--"
		if len(f.Name) == 1 {
			dash = "-"
		}
		kind, usage := flag.UnquoteUsage(f)
		line := "  " + dash + f.Name
		if kind != "" {
			line += " " + kind
		}
		b.WriteString(line + "\n        " + usage)
		// A usage that says its default itself (one that follows from
		// other flags) gets no second one.
		if !slices.Contains([]string{"", "false", "0", "0s"}, f.DefValue) && !strings.Contains(usage, "(default") {
			fmt.Fprintf(&b, " (default %s)", f.DefValue)
		}
		b.WriteString("\n")
	})
	return b.String()
}

// writeOutput writes to the file path names with fn: stdout for "-",
// else the file (see writeFile).
func (e *env) writeOutput(path string, fn func(io.Writer) error) error {
	if path == "-" {
		return fn(e.stdout)
	}
	return writeFile(path, fn)
}

// checkOutput checks, before a run, that the file path (given by what:
// "--json") can be written, so that a bad path fails at once rather than
// after the run. Nothing that exists is changed (atomicfile.Check):
// processes given the same path (the ranks of one job) never remove each
// other's files.
func checkOutput(what, path string) error {
	if path == "" || path == "-" {
		return nil
	}
	if err := atomicfile.Check(path); err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return usagef("%s: cannot write %s: %v", what, path, err)
	}
	return nil
}

// writeFile writes the file at path with fn, whole or not at all
// (atomicfile.WriteFile): on any error the file that was there is left as
// it was, and a device or FIFO is written in place and never removed.
func writeFile(path string, fn func(io.Writer) error) error {
	return atomicfile.WriteFile(path, fn)
}

// closeBackend closes b, first checking that the command released every
// handle it made.
func closeBackend(b gpu.Backend, err *error) {
	if c, ok := gpu.LiveHandles(b); ok && !c.IsZero() {
		*err = errors.Join(*err, fmt.Errorf("handles still live at exit: %v", c))
	}
	if cerr := b.Close(); cerr != nil {
		*err = errors.Join(*err, fmt.Errorf("close backend %s: %w", b.Name(), cerr))
	}
}

// plural is n and the noun for n: "1 strategy", "3 strategies".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

func driverList() string {
	if d := gpu.Drivers(); len(d) > 0 {
		return strings.Join(d, ", ")
	}
	return "(none)"
}

// shortReason cuts a backend choice reason (which lists every library path
// tried) to one readable line for progress output, at a word boundary;
// "stablegraph info" prints it whole.
func shortReason(r string) string {
	return cutWords(r, 120, " … (see 'stablegraph info')")
}

// cutWords returns s when it is at most n bytes long, else its first words
// that fit in n bytes followed by more. A single word longer than n is cut
// at a character boundary.
func cutWords(s string, n int, more string) string {
	if len(s) <= n {
		return s
	}
	cut := s[:n]
	if i := strings.LastIndexAny(cut, " \t\n"); i > 0 {
		cut = cut[:i]
	} else {
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		cut = s[:n]
	}
	return strings.TrimRight(cut, " \t\n,;:") + more
}
