package trace

import (
	"errors"
	"fmt"
	"log/slog"
	"math/bits"

	"github.com/stablegraph/stablegraph/gpu"
)

// Func is a traced command's work: it enqueues work on env.Stream using the
// operand addresses in env.Ptrs. See the package doc for its contract.
type Func func(env *Env) error

// Library is a traced command that calls a library (a GEMM): besides its
// work, it asks the tracer for device workspace and has a preparation step
// that must run outside any capture. Make its Command with
// Tracer.NewLibraryCommand.
type Library interface {
	// Run enqueues the work, as a Func does. env.Workspace is the tracer's
	// workspace: give it to the library, so that a captured call allocates
	// nothing.
	Run(env *Env) error
	// Prepare runs outside any capture, before the command first runs or is
	// captured with its pointers in an alignment class not seen before
	// (env.Ptrs are those pointers; their memory must not be touched, and
	// env.Stream must not be used). The library chooses its algorithm here.
	Prepare(env *Env) error
	// Workspace is the device workspace, in bytes, the command wants from
	// the tracer on dev (0: none).
	Workspace(b gpu.Backend, dev int) (uint64, error)
}

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
	// Workspace is device scratch of WorkspaceSize bytes that the tracer
	// owns for library commands: one allocation per tracer, made before its
	// first capture and freed at Close, at the same address in every call,
	// so that traces holding it stay valid and patchable. Zero for plain
	// functions, and when no library command asked for one.
	Workspace     gpu.DevicePtr
	WorkspaceSize uint64
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
// per alignment class of its pointers, its Template or the reason it has
// none. Make Commands with Tracer.NewCommand or NewLibraryCommand.
type Command struct {
	Name  string
	fn    Func
	lib   Library // nil for plain functions
	uses  []Use
	sizes []uint64 // per operand, bytes

	cache *Cache
	// classes holds what is known per alignment class of the pointers
	// (classKey); last is the class of the latest trace.
	classes map[string]*class
	last    *class
	key     []byte // scratch for classKey
	// flat is what the latest Flat found: whether the trace could be
	// flattened, and why not.
	flatTried bool
	flatWhy   string
}

// class is what a Command knows about its traces at one alignment class.
type class struct {
	prepared bool      // Library.Prepare ran for this class
	diffed   bool      // Diff has run (successfully or not)
	tmpl     *Template // nil until diffed, or when not patchable
	why      error     // why not patchable
}

// Patchable reports whether differential tracing found the command
// patchable at the alignment class it was last traced at, and if not, why.
// Before the first patch-mode trace it reports false with a nil reason.
func (c *Command) Patchable() (bool, error) {
	if c.last == nil {
		return false, nil
	}
	return c.last.tmpl != nil, c.last.why
}

// Template is the command's template at the class it was last traced at,
// or nil.
func (c *Command) Template() *Template {
	if c.last == nil {
		return nil
	}
	return c.last.tmpl
}

// Flattened reports whether the command's latest trace was added to its
// step's graph node by node (Tracer.Flat), and if not, why ("" before any
// Flat, and when flattening is turned off).
func (c *Command) Flattened() (bool, string) { return c.flatTried && c.flatWhy == "", c.flatWhy }

// CachedTraces is the number of traces in the command's cache.
func (c *Command) CachedTraces() int { return c.cache.Len() }

// Classes is the number of alignment classes the command has been run or
// traced at.
func (c *Command) Classes() int { return len(c.classes) }

// Stats count a Tracer's work since it was made.
type Stats struct {
	Captures     int64 // stream captures, including the second traces of Diff
	DiffCaptures int64 // second traces taken at shadow addresses for Diff
	// Synthesized counts traces made from a Template instead of captured:
	// graphs built for child-graph nodes and node lists for flattened ones.
	Synthesized int64
	// Moved counts flattened traces moved to new operands in place, by
	// their template's pointer slots (Moved), as the patch path does: no
	// trace is made, only the nodes' pointers change.
	Moved        int64
	Hits, Misses int64 // trace cache lookups
	Prepares     int64 // Library.Prepare calls (one per command and class)
}

// Minus returns s - o, field by field.
func (s Stats) Minus(o Stats) Stats {
	return Stats{Captures: s.Captures - o.Captures, DiffCaptures: s.DiffCaptures - o.DiffCaptures,
		Synthesized: s.Synthesized - o.Synthesized, Moved: s.Moved - o.Moved, Hits: s.Hits - o.Hits,
		Misses: s.Misses - o.Misses, Prepares: s.Prepares - o.Prepares}
}

// Plus returns s + o, field by field.
func (s Stats) Plus(o Stats) Stats { return s.Minus(Stats{}.Minus(o)) }

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
	// NoWorkspace gives library commands no workspace (Env.Workspace 0),
	// leaving libraries to their own: what a captured library call does
	// then is the backend's business (cuBLAS allocates inside the capture).
	// For tests and comparisons; the default gives them one.
	NoWorkspace bool
	// NoFlatten makes Flat report every trace not flattenable, so that
	// traced commands stay child graphs. For tests and comparisons.
	NoFlatten bool
}

// Tracer runs and captures the traced commands of one executable. It
// captures on a stream the caller owns and never uses for anything else,
// and owns the workspace of its library commands.
type Tracer struct {
	b       gpu.Backend
	dev     int
	capture gpu.Stream
	opts    Options
	cmds    []*Command

	// ws is the workspace of library commands, allocated at the first run
	// or trace of any command (wsDone), before any capture.
	ws     gpu.DevicePtr
	wsSize uint64
	wsDone bool
	// flats caches the node lists read from captured traces, by graph; an
	// entry goes when the cache destroys its graph.
	flats map[gpu.Graph]flatRead

	// Stats are read by the owner between calls.
	Stats Stats
}

// flatRead is a captured trace read node by node, or why it could not be.
type flatRead struct {
	nodes []Node
	why   string
}

// NewTracer returns a Tracer for device dev that captures on stream s.
func NewTracer(b gpu.Backend, dev int, s gpu.Stream, opts Options) *Tracer {
	if opts.CacheSize <= 0 {
		opts.CacheSize = DefaultCacheSize
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Tracer{b: b, dev: dev, capture: s, opts: opts, flats: map[gpu.Graph]flatRead{}}
}

// cacheDestroyer is the trace caches' GraphDestroyer: it forgets what was read
// from a graph before destroying it.
type cacheDestroyer struct{ t *Tracer }

func (d cacheDestroyer) GraphDestroy(g gpu.Graph) error {
	delete(d.t.flats, g)
	return d.t.b.GraphDestroy(g)
}

// NewCommand registers a traced command: fn, called with one pointer per
// use, over operands of the given sizes (bytes). The Tracer owns its cache.
func (t *Tracer) NewCommand(name string, fn Func, uses []Use, sizes []uint64) *Command {
	c := &Command{Name: name, fn: fn, uses: uses, sizes: sizes,
		cache: NewCache(cacheDestroyer{t}, t.opts.CacheSize), classes: map[string]*class{}}
	t.cmds = append(t.cmds, c)
	return c
}

// NewLibraryCommand registers a traced library command (see Library). All
// commands must be registered before the first Run or Trace: the tracer
// sizes its workspace for them then.
func (t *Tracer) NewLibraryCommand(name string, lib Library, uses []Use, sizes []uint64) *Command {
	c := t.NewCommand(name, lib.Run, uses, sizes)
	c.lib = lib
	return c
}

// WorkspaceSize is the size of the tracer's workspace (0 before the first
// run or trace, and when no library command wants one).
func (t *Tracer) WorkspaceSize() uint64 { return t.wsSize }

// ensureWorkspace allocates the workspace the library commands want, once.
// A failure is returned and tried again at the next call.
func (t *Tracer) ensureWorkspace() error {
	if t.wsDone {
		return nil
	}
	var want uint64
	if !t.opts.NoWorkspace {
		for _, c := range t.cmds {
			if c.lib == nil {
				continue
			}
			n, err := c.lib.Workspace(t.b, t.dev)
			if err != nil {
				return fmt.Errorf("traced command %s: workspace size: %w", c.Name, err)
			}
			want = max(want, n)
		}
	}
	if want > 0 {
		ws, err := t.b.MemAlloc(t.dev, want)
		if err != nil {
			return fmt.Errorf("library workspace (%d bytes): %w", want, err)
		}
		t.ws, t.wsSize = ws, want
		t.opts.Logger.Debug("library workspace allocated", "bytes", want)
	}
	t.wsDone = true
	return nil
}

func (t *Tracer) env(c *Command, ops []gpu.DevicePtr, s gpu.Stream) *Env {
	ptrs := make([]gpu.DevicePtr, len(c.uses))
	for i, u := range c.uses {
		ptrs[i] = ops[u.Operand].Add(u.Off)
	}
	e := &Env{Backend: t.b, Device: t.dev, Stream: s, Ptrs: ptrs, Kernels: t.opts.Kernels}
	if c.lib != nil {
		e.Workspace, e.WorkspaceSize = t.ws, t.wsSize
	}
	return e
}

// classKey writes into c.key the alignment class (log2 of gpu.AlignClass)
// of every pointer c's function gets at ops. A trace is reused, patched or
// moved only at pointers of the class it was recorded at: libraries choose
// their kernels by alignment.
func (c *Command) classKey(ops []gpu.DevicePtr) []byte {
	c.key = c.key[:0]
	for _, u := range c.uses {
		c.key = append(c.key, byte(bits.TrailingZeros64(gpu.AlignClass(ops[u.Operand].Add(u.Off)))))
	}
	return c.key
}

// classAt returns c's state at the class of ops, making it the first time
// (indexing the map with a converted byte slice allocates nothing).
func (c *Command) classAt(ops []gpu.DevicePtr) *class {
	key := c.classKey(ops)
	if cl, ok := c.classes[string(key)]; ok {
		return cl
	}
	cl := &class{}
	c.classes[string(key)] = cl
	return cl
}

// prepare readies c at ops's class: the workspace, and the library's
// preparation once per class. It runs before any capture.
func (t *Tracer) prepare(c *Command, cl *class, ops []gpu.DevicePtr) error {
	if err := t.ensureWorkspace(); err != nil {
		return err
	}
	if c.lib == nil || cl.prepared {
		return nil
	}
	if err := c.lib.Prepare(t.env(c, ops, 0)); err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	cl.prepared = true
	t.Stats.Prepares++
	return nil
}

// Run calls c's function on stream s with the operands at ops, without
// capturing: the eager path.
func (t *Tracer) Run(c *Command, ops []gpu.DevicePtr, s gpu.Stream) error {
	if err := t.prepare(c, c.classAt(ops), ops); err != nil {
		return fmt.Errorf("traced command %s: %w", c.Name, err)
	}
	if err := c.fn(t.env(c, ops, s)); err != nil {
		return fmt.Errorf("traced command %s: %w", c.Name, err)
	}
	return nil
}

// Trace returns the trace of c with the operands at ops: from the cache, or
// else captured (and cached). With patch set, the first miss at an
// alignment class traces the command twice to find that class's Template,
// and later misses at that class build the trace from the Template instead
// of capturing when there is one. The graph belongs to the cache: use it
// before the next Trace of c.
func (t *Tracer) Trace(c *Command, ops []gpu.DevicePtr, patch bool) (gpu.Graph, error) {
	g, _, err := t.trace(c, ops, patch)
	return g, err
}

// trace is Trace, also saying whether the graph was captured now.
func (t *Tracer) trace(c *Command, ops []gpu.DevicePtr, patch bool) (gpu.Graph, bool, error) {
	cl := c.classAt(ops)
	c.last = cl
	// The cache is keyed by the exact addresses, and so by their class.
	if g, ok := c.cache.Get(ops); ok {
		t.Stats.Hits++
		return g, false, nil
	}
	t.Stats.Misses++
	if err := t.prepare(c, cl, ops); err != nil {
		return 0, false, fmt.Errorf("traced command %s: %w", c.Name, err)
	}
	var (
		g        gpu.Graph
		err      error
		captured = true
	)
	switch {
	case patch && !cl.diffed:
		g, err = t.diff(c, cl, ops)
	case patch && cl.tmpl != nil:
		if g, err = cl.tmpl.Build(t.b, t.dev, ops); err == nil {
			t.Stats.Synthesized++
			captured = false
		}
	default:
		g, err = t.captureAt(c, ops)
	}
	if err != nil {
		return 0, false, fmt.Errorf("traced command %s: %w", c.Name, err)
	}
	if err := c.cache.Put(ops, g); err != nil {
		return 0, false, fmt.Errorf("traced command %s: %w", c.Name, err)
	}
	return g, captured, nil
}

// Flat is a trace as a list of nodes to add to a step's graph in place of
// one child-graph node. Nodes is nil when the trace cannot be flattened;
// Why then says why.
type Flat struct {
	Nodes []Node
	// Template is the template Nodes were made from (nil when they were
	// read from a captured trace): at operands of the same class, Apply
	// moves them without capturing or comparing.
	Template *Template
	Why      string
}

// Flat returns the trace of c at ops node by node (see Trace for patch).
// A trace whose nodes are all kernels, memcpys, memsets or empty nodes can
// be flattened; one with any other node (graph memory nodes of a library
// allocating inside the capture, nested graphs, nodes the backend cannot
// read back) cannot, and is left to a child-graph node. The nodes are the
// caller's to keep and modify.
func (t *Tracer) Flat(c *Command, ops []gpu.DevicePtr, patch bool) (Flat, error) {
	if t.opts.NoFlatten {
		return Flat{Why: "flattening is turned off"}, nil
	}
	if patch {
		if cl := c.classes[string(c.classKey(ops))]; cl != nil && cl.tmpl != nil {
			// Moved from the class's template: no capture, no read.
			c.last, c.flatTried, c.flatWhy = cl, true, ""
			t.Stats.Synthesized++
			return Flat{Nodes: cl.tmpl.NodesAt(ops), Template: cl.tmpl}, nil
		}
	}
	g, _, err := t.trace(c, ops, patch)
	if err != nil {
		return Flat{}, err
	}
	if cl := c.last; patch && cl.tmpl != nil {
		// Diffed just now: the template's nodes are the trace's.
		c.flatTried, c.flatWhy = true, ""
		return Flat{Nodes: cl.tmpl.NodesAt(ops), Template: cl.tmpl}, nil
	}
	fr, ok := t.flats[g]
	if !ok {
		nodes, why, err := readNodes(t.b, g)
		if err != nil {
			return Flat{}, fmt.Errorf("traced command %s: %w", c.Name, err)
		}
		fr = flatRead{nodes: nodes, why: why}
		t.flats[g] = fr
	}
	c.flatTried, c.flatWhy = true, fr.why
	if fr.why != "" {
		return Flat{Why: fr.why}, nil
	}
	return Flat{Nodes: CloneNodes(fr.nodes)}, nil
}

// TemplateFor returns c's template at the alignment class of ops, or nil
// when that class has none (yet). It captures and allocates nothing: the
// per-step patch path asks it whether nodes made from a template can be
// moved to ops in place.
func (t *Tracer) TemplateFor(c *Command, ops []gpu.DevicePtr) *Template {
	cl := c.classes[string(c.classKey(ops))]
	if cl == nil {
		return nil
	}
	return cl.tmpl
}

// Moved counts a trace of c moved in place to new operands with its
// template's Apply, as the patch path does: a trace made without capturing.
func (t *Tracer) Moved(c *Command) {
	c.flatTried, c.flatWhy = true, ""
	t.Stats.Moved++
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
// real one, so every pointer keeps its alignment class (gpu.AlignClass
// stops at shadowAlign) and a library choosing kernels by alignment
// chooses the same ones.
const shadowAlign = gpu.MaxAlignClass

// diff captures c at ops (the trace returned) and again with every operand
// in a shadow allocation, and keeps in cl the Template or the reason there
// is none. Running out of memory for the shadow makes cl not patchable;
// other failures are returned and leave cl to be diffed again.
func (t *Tracer) diff(c *Command, cl *class, ops []gpu.DevicePtr) (_ gpu.Graph, err error) {
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
		cl.why = fmt.Errorf("%w: no device memory for %d bytes of shadow operands: %v", ErrNotPatchable, total, err)
		cl.diffed = true
		t.opts.Logger.Debug("traced command is not patchable", "command", c.Name, "reason", cl.why)
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
		cl.tmpl = tmpl
		t.opts.Logger.Debug("traced command is patchable", "command", c.Name, "nodes", tmpl.Nodes(), "pointer_slots", len(tmpl.slots))
	case errors.Is(derr, ErrNotPatchable):
		cl.why = derr
		t.opts.Logger.Debug("traced command is not patchable; it is re-traced when its addresses change",
			"command", c.Name, "reason", derr)
	default:
		return 0, fmt.Errorf("differential tracing: %w", derr)
	}
	cl.diffed = true
	return g1, nil
}

// Close destroys every cached trace and frees the workspace. The Tracer
// must not be used after, and no graph holding a trace of it may run.
func (t *Tracer) Close() error {
	var errs []error
	for _, c := range t.cmds {
		if err := c.cache.Clear(); err != nil {
			errs = append(errs, fmt.Errorf("traced command %s: %w", c.Name, err))
		}
	}
	t.cmds = nil
	if t.ws != 0 {
		if err := t.b.MemFree(t.ws); err != nil {
			errs = append(errs, fmt.Errorf("free library workspace: %w", err))
		}
		t.ws, t.wsSize = 0, 0
	}
	return errors.Join(errs...)
}
