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
// failed, 2 on a usage error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/stablegraph/stablegraph/gpu"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runContext(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// globalFlags are accepted before the command and after it.
type globalFlags struct {
	backend   string
	devices   int
	verbose   bool
	libcuda   string
	libcublas string
	libnccl   string
}

func (g *globalFlags) register(fs *flag.FlagSet) {
	// Defaults are the current values, so that flags given before the
	// command survive the command's flag set.
	fs.StringVar(&g.backend, "backend", g.backend, "`name` of the backend: auto, sim or cuda (auto prefers cuda when a GPU is present); env STABLEGRAPH_BACKEND")
	fs.IntVar(&g.devices, "devices", g.devices, "`N` simulated devices (sim)")
	fs.BoolVar(&g.verbose, "v", g.verbose, "debug logs on stderr")
	fs.StringVar(&g.libcuda, "libcuda", g.libcuda, "`path` of libcuda to load (cuda; default: the backend's search)")
	fs.StringVar(&g.libcublas, "libcublas", g.libcublas, "`path` of libcublas to load (cuda; default: the backend's search)")
	fs.StringVar(&g.libnccl, "libnccl", g.libnccl, "`path` of libnccl to load for collectives (cuda; default: the backend's search)")
}

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

// open opens the backend the global flags select.
func (e *env) open() (gpu.Backend, string, error) {
	cfg := gpu.Config{
		Devices:       e.global.devices,
		CUDALibrary:   e.global.libcuda,
		CUBLASLibrary: e.global.libcublas,
		NCCLLibrary:   e.global.libnccl,
		Logger:        e.log,
	}
	b, reason, err := gpu.Open(e.global.backend, cfg)
	if err != nil {
		return nil, "", err
	}
	e.log.Debug("backend opened", "backend", b.Name(), "reason", reason)
	return b, reason, nil
}

// progress writes a progress line to stderr.
func (e *env) progress(format string, args ...any) {
	fmt.Fprintf(e.stderr, format+"\n", args...)
}

type command struct {
	name    string
	args    string // synopsis of the arguments after the flags
	summary string // one line
	detail  string // paragraphs for "help <command>"
	flags   func(fs *flag.FlagSet) func(e *env) error
}

// commands returns the commands in the order help lists them.
func commands() []*command {
	return []*command{infoCommand(), runCommand(), benchCommand(), benchDriverCommand(), soakCommand()}
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
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			mainUsage(stdout, &g)
			return exitOK
		}
		fmt.Fprintf(stderr, "stablegraph: %v\nRun 'stablegraph help' for usage.\n", err)
		return exitUsage
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
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "stablegraph %s: unexpected arguments: %s\nRun 'stablegraph %s -h' for usage.\n",
			c.name, strings.Join(fs.Args(), " "), c.name)
		return exitUsage
	}
	if g.devices <= 0 {
		fmt.Fprintf(stderr, "stablegraph %s: --devices must be positive, got %d\n", c.name, g.devices)
		return exitUsage
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
	if err := exec(e); err != nil {
		var ue *usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "stablegraph %s: %v\nRun 'stablegraph %s -h' for usage.\n", c.name, err, c.name)
			return exitUsage
		}
		fmt.Fprintf(stderr, "stablegraph %s: %v\n", c.name, err)
		return exitFailure
	}
	return exitOK
}

func help(args []string, stdout, stderr io.Writer, g *globalFlags) int {
	switch len(args) {
	case 0:
		mainUsage(stdout, g)
		return exitOK
	case 1:
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
	b.WriteString(`
Registered backends: ` + driverList() + `

Run 'stablegraph help <command>' or 'stablegraph <command> -h' for a command's flags.
Exit status: 0 on success, 1 when the command failed, 2 on a usage error.
`)
	io.WriteString(w, b.String())
}

var globalNames = []string{"backend", "devices", "v", "libcuda", "libcublas", "libnccl"}

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
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			fmt.Fprintf(&b, " (default %s)", f.DefValue)
		}
		b.WriteString("\n")
	})
	return b.String()
}

// writeFile writes to path with fn, reporting the first error, and removes a
// partly written file.
func writeFile(path string, fn func(io.Writer) error) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			err = errors.Join(err, os.Remove(path))
		}
	}()
	return fn(f)
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

func driverList() string {
	if d := gpu.Drivers(); len(d) > 0 {
		return strings.Join(d, ", ")
	}
	return "(none)"
}

// shortReason cuts a backend choice reason (which lists every library path
// tried) to one readable line for progress output; "stablegraph info"
// prints it whole.
func shortReason(r string) string {
	const max = 120
	if len(r) <= max {
		return r
	}
	return r[:max] + "... (see 'stablegraph info')"
}
