package trace

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/stablegraph/stablegraph/gpu"
)

// Func is a traced command's work: it enqueues work on env.Stream using the
// operand addresses in env.Ptrs. See the package doc for its contract.
type Func func(env *Env) error

// KernelLookup finds a loaded kernel by name.
type KernelLookup func(name string) (gpu.Function, error)

// Env is what a traced function gets: the backend and device, the stream
// to enqueue on (capturing or not), and the address of each slice the
// command was declared with, in declaration order. A new Env is made for
// every call; the function may keep nothing from it past its return.
type Env struct {
	Backend gpu.Backend
	Device  int
	Stream  gpu.Stream
	Ptrs    []gpu.DevicePtr
	Kernels KernelLookup
}

// Kernel returns the loaded kernel named name.
func (e *Env) Kernel(name string) (gpu.Function, error) {
	if e.Kernels == nil {
		return 0, gpu.Errorf("trace.Env.Kernel", gpu.ErrNotFound, "no kernels are loaded (looking for %s)", name)
	}
	return e.Kernels(name)
}

// Use is one slice a traced command was declared with: Off bytes into
// operand Operand.
type Use struct {
	Operand int
	Off     uint64
}

// Command is one traced command of an executable with its trace cache and,
// once it has been traced twice, its Template or the reason it has none.
// Make Commands with Tracer.NewCommand.
type Command struct {
	Name  string
	fn    Func
	uses  []Use
	sizes []uint64 // per operand, bytes

	cache  *Cache
	diffed bool      // Diff has run (successfully or not)
	tmpl   *Template // nil until diffed, or when not patchable
	why    error     // why not patchable
}

// Patchable reports whether differential tracing found the command
// patchable, and if not, why. Before the first patch-mode trace it reports
// false with a nil reason.
func (c *Command) Patchable() (bool, error) { return c.tmpl != nil, c.why }

// Template is the command's template, or nil.
func (c *Command) Template() *Template { return c.tmpl }

// CachedTraces is the number of traces in the command's cache.
func (c *Command) CachedTraces() int { return c.cache.Len() }

// Stats count a Tracer's work since it was made.
type Stats struct {
	Captures     int64 // stream captures, including the second traces of Diff
	DiffCaptures int64 // second traces taken at shadow addresses for Diff
	Synthesized  int64 // traces built from a Template instead of captured
	Hits, Misses int64 // trace cache lookups
}

// Options configure a Tracer; zero fields take the defaults given.
type Options struct {
	// CacheSize is each command's trace cache capacity. Default
	// DefaultCacheSize.
	CacheSize int
	// Kernels resolves kernel names for traced functions (Env.Kernel).
	// Default: none, Env.Kernel fails.
	Kernels KernelLookup
	// Logger gets debug logs when a command is found not patchable.
	// Default slog.Default().
	Logger *slog.Logger
}

// Tracer runs and captures the traced commands of one executable. It
// captures on a stream the caller owns and never uses for anything else.
type Tracer struct {
	b       gpu.Backend
	dev     int
	capture gpu.Stream
	opts    Options
	cmds    []*Command

	// Stats are read by the owner between calls.
	Stats Stats
}

// NewTracer returns a Tracer for device dev that captures on stream s.
func NewTracer(b gpu.Backend, dev int, s gpu.Stream, opts Options) *Tracer {
	if opts.CacheSize <= 0 {
		opts.CacheSize = DefaultCacheSize
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Tracer{b: b, dev: dev, capture: s, opts: opts}
}

// NewCommand registers a traced command: fn, called with one pointer per
// use, over operands of the given sizes (bytes). The Tracer owns its cache.
func (t *Tracer) NewCommand(name string, fn Func, uses []Use, sizes []uint64) *Command {
	c := &Command{Name: name, fn: fn, uses: uses, sizes: sizes, cache: NewCache(t.b, t.opts.CacheSize)}
	t.cmds = append(t.cmds, c)
	return c
}

func (t *Tracer) env(c *Command, ops []gpu.DevicePtr, s gpu.Stream) *Env {
	ptrs := make([]gpu.DevicePtr, len(c.uses))
	for i, u := range c.uses {
		ptrs[i] = ops[u.Operand].Add(u.Off)
	}
	return &Env{Backend: t.b, Device: t.dev, Stream: s, Ptrs: ptrs, Kernels: t.opts.Kernels}
}

// Run calls c's function on stream s with the operands at ops, without
// capturing: the eager path.
func (t *Tracer) Run(c *Command, ops []gpu.DevicePtr, s gpu.Stream) error {
	if err := c.fn(t.env(c, ops, s)); err != nil {
		return fmt.Errorf("traced command %s: %w", c.Name, err)
	}
	return nil
}

// Trace returns the trace of c with the operands at ops: from the cache, or
// else captured (and cached). With patch set, the first miss traces the
// command twice to find its Template, and later misses build the trace from
// the Template instead of capturing when there is one. The graph belongs to
// the cache: use it before the next Trace of c.
func (t *Tracer) Trace(c *Command, ops []gpu.DevicePtr, patch bool) (gpu.Graph, error) {
	if g, ok := c.cache.Get(ops); ok {
		t.Stats.Hits++
		return g, nil
	}
	t.Stats.Misses++
	var (
		g   gpu.Graph
		err error
	)
	switch {
	case patch && !c.diffed:
		g, err = t.diff(c, ops)
	case patch && c.tmpl != nil:
		if g, err = c.tmpl.Build(t.b, t.dev, ops); err == nil {
			t.Stats.Synthesized++
		}
	default:
		g, err = t.captureAt(c, ops)
	}
	if err != nil {
		return 0, fmt.Errorf("traced command %s: %w", c.Name, err)
	}
	if err := c.cache.Put(ops, g); err != nil {
		return 0, fmt.Errorf("traced command %s: %w", c.Name, err)
	}
	return g, nil
}

// captureAt captures c's function with the operands at ops. On any failure
// the stream is left out of capture mode and no graph is kept.
func (t *Tracer) captureAt(c *Command, ops []gpu.DevicePtr) (gpu.Graph, error) {
	if err := t.b.StreamBeginCapture(t.capture); err != nil {
		return 0, fmt.Errorf("begin capture: %w", err)
	}
	ferr := c.fn(t.env(c, ops, t.capture))
	g, eerr := t.b.StreamEndCapture(t.capture)
	if eerr != nil {
		// A failed end may leave the stream capturing; end it again so the
		// next capture can begin, and drop whatever it returns.
		if capturing, qerr := t.b.StreamIsCapturing(t.capture); qerr == nil && capturing {
			if g2, err := t.b.StreamEndCapture(t.capture); err == nil && g2 != 0 {
				eerr = errors.Join(eerr, t.b.GraphDestroy(g2))
			}
		}
		return 0, errors.Join(ferr, fmt.Errorf("end capture: %w", eerr))
	}
	if ferr != nil {
		if g != 0 {
			ferr = errors.Join(ferr, t.b.GraphDestroy(g))
		}
		return 0, ferr
	}
	t.Stats.Captures++
	return g, nil
}

// shadowAlign is the alignment the shadow addresses of Diff's second trace
// keep: each shadow operand has the same address modulo shadowAlign as the
// real one, so a library choosing kernels by pointer alignment chooses the
// same ones.
const shadowAlign = 256

// diff captures c at ops (the trace returned) and again with every operand
// in a shadow allocation, and keeps the Template or the reason there is
// none. Running out of memory for the shadow makes c not patchable; other
// failures are returned and leave c to be diffed again.
func (t *Tracer) diff(c *Command, ops []gpu.DevicePtr) (_ gpu.Graph, err error) {
	g1, err := t.captureAt(c, ops)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, t.b.GraphDestroy(g1))
		}
	}()
	var total uint64
	for _, s := range c.sizes {
		total += gpu.RoundUp(s, shadowAlign) + shadowAlign
	}
	base, err := t.b.MemAlloc(t.dev, total+shadowAlign)
	if errors.Is(err, gpu.ErrOutOfMemory) {
		// Operands too large to shadow: the command stays correct, it is
		// only re-traced when its addresses move.
		c.why = fmt.Errorf("%w: no device memory for %d bytes of shadow operands: %v", ErrNotPatchable, total, err)
		c.diffed = true
		t.opts.Logger.Debug("traced command is not patchable", "command", c.Name, "reason", c.why)
		return g1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("shadow operands for differential tracing: %w", err)
	}
	defer func() {
		if ferr := t.b.MemFree(base); ferr != nil {
			err = errors.Join(err, fmt.Errorf("free shadow operands: %w", ferr))
		}
	}()
	ops2 := make([]gpu.DevicePtr, len(ops))
	at := gpu.RoundUp(uint64(base), shadowAlign)
	for i, s := range c.sizes {
		ops2[i] = gpu.DevicePtr(at + uint64(ops[i])%shadowAlign)
		at += gpu.RoundUp(s, shadowAlign) + shadowAlign
	}
	g2, err := t.captureAt(c, ops2)
	if err != nil {
		return 0, err
	}
	t.Stats.DiffCaptures++
	tmpl, derr := Diff(t.b, g1, g2, ops, ops2, c.sizes)
	if err := t.b.GraphDestroy(g2); err != nil {
		return 0, fmt.Errorf("destroy shadow trace: %w", err)
	}
	switch {
	case derr == nil:
		c.tmpl = tmpl
		t.opts.Logger.Debug("traced command is patchable", "command", c.Name, "nodes", tmpl.Nodes(), "pointer_slots", len(tmpl.slots))
	case errors.Is(derr, ErrNotPatchable):
		c.why = derr
		t.opts.Logger.Debug("traced command is not patchable; it is re-traced when its addresses change",
			"command", c.Name, "reason", derr)
	default:
		return 0, fmt.Errorf("differential tracing: %w", derr)
	}
	c.diffed = true
	return g1, nil
}

// Close destroys every cached trace. The Tracer must not be used after.
func (t *Tracer) Close() error {
	var errs []error
	for _, c := range t.cmds {
		if err := c.cache.Clear(); err != nil {
			errs = append(errs, fmt.Errorf("traced command %s: %w", c.Name, err))
		}
	}
	t.cmds = nil
	return errors.Join(errs...)
}
