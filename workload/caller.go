package workload

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/bfc"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/remappable"
)

// Pattern is how a caller's buffers move between steps.
type Pattern string

const (
	// Fixed binds the same buffers every step: the replay floor.
	Fixed Pattern = "fixed"
	// PingPong alternates between two sets of buffers (double buffering).
	PingPong Pattern = "pingpong"
	// Random allocates new buffers every step at random positions of the
	// region, between live allocations of random sizes, and frees the
	// previous step's. A workload's per-sequence state (gpt2-decode's KV
	// caches) is moved to a new place every step too.
	Random Pattern = "random"
	// Swap is for workloads with per-sequence state (gpt2-decode): the
	// caller owns more sequences than the batch has rows, and every step
	// some rows get another sequence, and with it another KV cache (see
	// gpt2caller.go); the other buffers move as with PingPong.
	Swap Pattern = "swap"
)

// Patterns lists the patterns every workload takes. Swap, for workloads
// with per-sequence state, is not among them.
func Patterns() []Pattern { return []Pattern{Fixed, PingPong, Random} }

// ParsePattern returns the pattern named s.
func ParsePattern(s string) (Pattern, error) {
	p := Pattern(s)
	if !slices.Contains(Patterns(), p) && p != Swap {
		return "", fmt.Errorf("workload: unknown movement pattern %q (fixed, pingpong, random, or swap for gpt2-decode)", s)
	}
	return p, nil
}

// Random filler allocations: how many stay live, and their sizes.
const (
	fillers       = 32
	fillerMaxSize = 64 << 10
)

// Caller is the framework side of a run: its device memory is one region
// managed by a bfc allocator, from which it binds every step's params and
// outputs according to its pattern, and into which it writes the inputs.
// A remappable caller (CallerOptions.Remappable) allocates every buffer as
// its own VMM allocation instead, for StrategyRemap.
//
// A Caller is not safe for concurrent use.
type Caller struct {
	b       gpu.Backend
	w       *Workload
	pattern Pattern
	region  gpu.DevicePtr         // the bfc caller's region
	remap   *remappable.Allocator // the remappable caller's allocator
	alloc   allocator             // the one of the two that allocates
	rng     *rand.Rand
	sets    [][]gpu.DevicePtr // fixed, pingpong, swap: the sets of w.movable()
	current []gpu.DevicePtr   // random: this step's buffers
	filler  []gpu.DevicePtr   // random: live fillers
	seq     *seqCaller        // the sequences of a gpt2-decode workload
	// loader makes the next step's inputs while this one runs.
	loader inputLoader
	// pinned are the page-locked buffers the loader makes inputs into
	// (PinnedInputs), freed by Close.
	pinned []gpu.HostMem
	hosts  hostAllocator
	// sameInput writes every step the inputs of step 0, made once (same
	// holds them): a benchmark's knob to tell what writing an input costs
	// the step after it from what making it does.
	sameInput bool
	same      [][]byte
	// shadow makes a Fixed caller's Bind do a Random caller's moves
	// without moving what it binds (CallerOptions.ShadowMoves).
	shadow bool
}

// inputLoader makes a step's inputs ahead, on a goroutine of its own, as a
// training loop's data loader does: once step k's inputs are written, step
// k+1's are made while step k runs. Made on the thread that then writes
// them and runs the step, 256 KiB of fresh inputs (mlp-large's) leave that
// core's caches cold for the step's own calls, and a bench would time the
// making as the runtime's and the driver's host cost (BENCHMARKS.md,
// section 00). Two sets of buffers take turns, so that the inputs make no
// garbage for a collection to run under the measured steps.
type inputLoader struct {
	w     *Workload
	cur   [][]byte      // the inputs returned last, written since
	spare [][]byte      // buffers free to make into
	next  int           // the step made ahead, when pending
	made  chan [][]byte // receives next's inputs, made into spare's buffers
	// pending says a making is in flight (made will receive once).
	pending bool
}

// fill makes step's inputs into set's buffers (grown where short).
func (l *inputLoader) fill(set [][]byte, step int) [][]byte {
	out := set[:0]
	for i := range l.w.Params {
		var dst []byte
		if i < len(set) {
			dst = set[i]
		}
		out = append(out, l.w.appendInput(dst, step, i))
	}
	return out
}

// inputs returns step's inputs: those made ahead when they are step's,
// else made now. They stay the loader's until the next call.
func (l *inputLoader) inputs(step int) [][]byte {
	if l.pending {
		set := <-l.made
		l.pending = false
		if l.next == step {
			l.spare, l.cur = l.cur, set
			return set
		}
		l.spare = set // another step's: free again
	}
	l.cur = l.fill(l.cur, step)
	return l.cur
}

// ahead starts making step's inputs on a goroutine of its own.
func (l *inputLoader) ahead(step int) {
	l.wait()
	if l.made == nil {
		l.made = make(chan [][]byte, 1)
	}
	spare := l.spare
	l.spare, l.next, l.pending = nil, step, true
	go func() { l.made <- l.fill(spare, step) }()
}

// wait lets a making in flight finish.
func (l *inputLoader) wait() {
	if l.pending {
		l.spare = <-l.made
		l.pending = false
	}
}

// allocator is what a Caller allocates its buffers with: a bfc.Allocator
// over its region, or a remappable.Allocator.
type allocator interface {
	Alloc(size uint64) (gpu.DevicePtr, error)
	Free(p gpu.DevicePtr) error
}

// CallerOptions configure NewCallerWith. The zero value is the bfc-backed
// caller NewCaller makes.
type CallerOptions struct {
	// Remappable allocates every buffer as its own VMM physical allocation
	// (package remappable: a whole number of granules each, at an address
	// range of its own) instead of from one bfc region, so that
	// StrategyRemap can map the memory behind it; Remappable returns the
	// allocator to compile with (stablegraph.Options' Remap.Memory). Under
	// Random every step's buffers are new allocations, at new addresses,
	// and no fillers are needed to move them. It needs a device with
	// virtual memory management.
	Remappable bool
	// BatchSets, under Random, is how many buffer sets BindBatch may hold
	// at once: the bfc caller's region gets room for them. Zero: no
	// BindBatch beyond what the region's slack happens to hold.
	BatchSets int
	// PinnedInputs makes every step's inputs in page-locked host memory
	// (the backend's HostAlloc), which the driver copies to the device by
	// DMA, as a training loop's pinned data loader hands them over: a
	// copy from pageable memory passes the bytes through the calling
	// core's caches, and leaves them cold for the step's own calls. It
	// needs a backend with page-locked host memory (gpu.StreamMemOps'
	// HostAlloc). Not for gpt2-decode, whose inputs are a few bytes.
	PinnedInputs bool
	// ShadowMoves, under Fixed, makes every Bind do the allocator's work
	// and the copies a Random caller's does (the fillers' churn and a
	// fresh set of buffers, freed at once; for gpt2-decode, from the
	// second step on, every cache copied to a fresh allocation freed at
	// once), while the buffers it binds stay where they are: the paired
	// floor's caller beside a Random row (RunOptions.PairFloor), so that
	// the row's host time over the floor's is the strategy's, not the
	// moves'. The moves' host work leaves the core's caches as cold for
	// the floor's step as for the row's, and their device copies leave
	// the device as busy before it. Only with Fixed.
	ShadowMoves bool
}

// hostAllocator is the part of a backend that PinnedInputs needs.
type hostAllocator interface {
	HostAlloc(size uint64) (gpu.HostMem, error)
	HostFree(h gpu.HostAlloc) error
}

// CallerOptionsFor returns the caller a run of strategy st needs: a
// remappable one for StrategyRemap, the bfc one otherwise.
func CallerOptionsFor(st sg.Strategy) CallerOptions {
	return CallerOptions{Remappable: st == sg.StrategyRemap}
}

// NewCaller allocates the caller's region on dev (a size that fits the
// pattern) and, for fixed and pingpong, its buffer sets.
func NewCaller(b gpu.Backend, dev int, w *Workload, pattern Pattern, seed uint64) (*Caller, error) {
	return NewCallerWith(b, dev, w, pattern, seed, CallerOptions{})
}

// NewCallerWith is NewCaller with options: with opts.Remappable the
// caller's buffers are remappable allocations rather than a bfc region's.
func NewCallerWith(b gpu.Backend, dev int, w *Workload, pattern Pattern, seed uint64, opts CallerOptions) (_ *Caller, err error) {
	if _, err := ParsePattern(string(pattern)); err != nil {
		return nil, err
	}
	if pattern == Swap && w.gpt2 == nil {
		return nil, fmt.Errorf("workload %s: pattern swap needs per-sequence state (gpt2-decode); use fixed, pingpong or random", w.Name)
	}
	if opts.ShadowMoves && pattern != Fixed {
		return nil, fmt.Errorf("workload %s: shadow moves are a fixed caller's; pattern %s moves its buffers itself", w.Name, pattern)
	}
	rng := rand.New(rand.NewPCG(seed, 0xca11e5))
	if opts.Remappable {
		a, err := remappable.New(b, dev, nil)
		if err != nil {
			return nil, fmt.Errorf("workload: remappable caller: %w", err)
		}
		c := &Caller{b: b, w: w, pattern: pattern, remap: a, alloc: a, rng: rng, loader: inputLoader{w: w}, shadow: opts.ShadowMoves}
		if err := c.pin(opts.PinnedInputs); err != nil {
			return nil, errors.Join(err, c.unpin(), a.Close())
		}
		if err := c.start(seed); err != nil {
			return nil, errors.Join(err, c.unpin(), a.Close())
		}
		return c, nil
	}
	var perSet uint64
	for _, buf := range w.movable() {
		perSet += gpu.RoundUp(uint64(buf.Size()), 256)
	}
	// Three sets cover pingpong, and random's current and previous step
	// with room to move; fillers take at most fillers*fillerMaxSize. A
	// batch of fresh sets (BindBatch) gets room for one more than it
	// holds, for the fragmentation of sets between fillers.
	sets := uint64(3)
	if pattern == Random && opts.BatchSets > 0 {
		sets += uint64(opts.BatchSets) + 1
	}
	room := pattern
	if opts.ShadowMoves {
		room = Random // the moves' sequences
	}
	size := gpu.RoundUp(sets*perSet+2*fillers*fillerMaxSize+seqRegion(w, room), 1<<20)
	region, err := b.MemAlloc(dev, size)
	if err != nil {
		return nil, fmt.Errorf("workload: caller region of %d bytes: %w", size, err)
	}
	c := &Caller{b: b, w: w, pattern: pattern, region: region, rng: rng, loader: inputLoader{w: w}, shadow: opts.ShadowMoves}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.unpin(), b.MemFree(region))
		}
	}()
	if err := c.pin(opts.PinnedInputs); err != nil {
		return nil, err
	}
	if c.alloc, err = bfc.New(region, size, bfc.Options{Name: "caller"}); err != nil {
		return nil, fmt.Errorf("workload: caller allocator: %w", err)
	}
	if err := c.start(seed); err != nil {
		return nil, err
	}
	return c, nil
}

// pin gives the loader two sets of page-locked buffers, one per param,
// when on is set.
func (c *Caller) pin(on bool) error {
	if !on {
		return nil
	}
	if c.w.gpt2 != nil {
		return fmt.Errorf("workload %s: pinned inputs: its inputs are a few bytes written with its sequences", c.w.Name)
	}
	h, ok := c.b.(hostAllocator)
	if !ok {
		return fmt.Errorf("workload: pinned inputs: backend %s has no page-locked host memory: %w", c.b.Name(), gpu.ErrNotSupported)
	}
	c.hosts = h
	var sets [2][][]byte
	for k := range sets {
		for _, buf := range c.w.Params {
			m, err := h.HostAlloc(uint64(buf.Size()))
			if err != nil {
				return fmt.Errorf("workload: pinned input %s: %w", buf.Name(), err)
			}
			c.pinned = append(c.pinned, m)
			sets[k] = append(sets[k], m.Bytes[:buf.Size():buf.Size()])
		}
	}
	c.loader.cur, c.loader.spare = sets[0], sets[1]
	return nil
}

// unpin frees the page-locked buffers, once no input is being made in
// them.
func (c *Caller) unpin() error {
	c.loader.wait()
	var errs []error
	for _, m := range c.pinned {
		errs = append(errs, c.hosts.HostFree(m.Handle))
	}
	c.pinned, c.loader.cur, c.loader.spare = nil, nil, nil
	return errors.Join(errs...)
}

// start allocates the buffer sets of fixed, pingpong and swap, and the
// sequences of a gpt2-decode workload. On error the caller frees its
// memory whole (the region, or every remappable buffer).
func (c *Caller) start(seed uint64) (err error) {
	nsets := map[Pattern]int{Fixed: 1, PingPong: 2, Swap: 2}[c.pattern]
	for range nsets {
		set, err := c.allocSet()
		if err != nil {
			return err
		}
		c.sets = append(c.sets, set)
	}
	if c.w.gpt2 != nil {
		if c.seq, err = newSeqCaller(c, seed); err != nil {
			return err
		}
	}
	return nil
}

// Remappable returns the allocator of a remappable caller, to compile
// with as stablegraph.Options' Remap.Memory, and nil for a bfc caller.
func (c *Caller) Remappable() sg.ChunkFinder {
	if c.remap == nil {
		return nil
	}
	return c.remap
}

// buffers are the caller-bound buffers: params, then outputs.
func (w *Workload) buffers() []sg.Buffer { return slices.Concat(w.Params, w.Outputs) }

// movable are the caller-bound buffers that the pattern moves as sets:
// all of them but per-sequence state (gpt2-decode's caches), which the
// sequences own.
func (w *Workload) movable() []sg.Buffer {
	if w.gpt2 == nil {
		return w.buffers()
	}
	var out []sg.Buffer
	for _, b := range w.buffers() {
		if !slices.Contains(w.gpt2.caches, b) {
			out = append(out, b)
		}
	}
	return out
}

func (c *Caller) allocSet() ([]gpu.DevicePtr, error) {
	var set []gpu.DevicePtr
	for _, buf := range c.w.movable() {
		p, err := c.alloc.Alloc(uint64(buf.Size()))
		if err != nil {
			for _, q := range set {
				err = errors.Join(err, c.alloc.Free(q))
			}
			return nil, fmt.Errorf("workload: caller buffer %s: %w", buf.Name(), err)
		}
		set = append(set, p)
	}
	return set, nil
}

// Bind returns the bindings of step, with the inputs of that step written
// into the params (synchronously). Under Random it first frees the previous
// step's buffers (the caller must have waited for that step) and churns the
// fillers. For gpt2-decode, whose sequences keep their caches across steps,
// the steps must be bound in order (as Run does): each Bind moves the
// sequences on from the previous one's (see seqCaller.bind).
func (c *Caller) Bind(step int) (sg.Bindings, error) {
	var set []gpu.DevicePtr
	switch c.pattern {
	case Fixed, PingPong, Swap:
		set = c.sets[step%len(c.sets)]
		if c.shadow {
			if err := c.shadowSet(); err != nil {
				return nil, err
			}
		}
	case Random:
		// A remappable buffer has an address range of its own: a new
		// one lands at a new address without fillers around it.
		if c.remap == nil {
			if err := c.churn(); err != nil {
				return nil, err
			}
		}
		s, err := c.allocSet()
		if err != nil {
			return nil, err
		}
		set = s
		if err := c.freeCurrent(); err != nil {
			return nil, errors.Join(err, c.freeSet(set))
		}
		c.current = set
	}
	bind := sg.Bindings{}
	for i, buf := range c.w.movable() {
		bind[buf] = set[i]
	}
	if c.seq != nil {
		if err := c.seq.bind(step, bind); err != nil {
			return nil, err
		}
		return bind, nil
	}
	inputs := c.inputsOf(step)
	for i, buf := range c.w.Params {
		if err := c.b.MemcpyHtoD(set[i], inputs[i]); err != nil {
			return nil, fmt.Errorf("workload: write input %s of step %d: %w", buf.Name(), step, err)
		}
	}
	if !c.sameInput {
		c.loader.ahead(step + 1)
	}
	return bind, nil
}

// shadowSet does the allocator's work of a Random Bind (the fillers'
// churn, a fresh set) and frees the set at once (ShadowMoves).
func (c *Caller) shadowSet() error {
	if c.remap == nil {
		if err := c.churn(); err != nil {
			return err
		}
	}
	set, err := c.allocSet()
	if err != nil {
		return err
	}
	return c.freeSet(set)
}

// inputsOf returns the inputs of step, per param (with sameInput, step
// 0's, made once).
func (c *Caller) inputsOf(step int) [][]byte {
	if !c.sameInput {
		return c.loader.inputs(step)
	}
	if c.same == nil {
		for i := range c.w.Params {
			c.same = append(c.same, c.w.Input(0, i))
		}
	}
	return c.same
}

// ErrNoBatch is BindBatch's error for a caller that cannot bind a batch of
// steps ahead: another pattern than Random, or gpt2-decode's sequences,
// whose caches move from one step's contents to the next (seqCaller.bind).
var ErrNoBatch = errors.New("workload: the caller cannot bind a batch of steps ahead")

// BindBatch binds steps first, first+1, ..., first+n-1 ahead, each to a set
// of buffers of its own at fresh addresses (allocated after the previous
// step's set is freed, with the fillers churned before each set, as Bind
// does under Random), with each step's inputs written: a batch that runs
// back to back with no allocation between steps. The caller must have
// waited for every step bound before; it runs the batch, waits for the
// device to be done with it, then calls release, which frees every set of
// the batch. On error nothing of the batch is left allocated. Only under
// Random, and not for gpt2-decode: else ErrNoBatch.
func (c *Caller) BindBatch(first, n int) (_ []sg.Bindings, _ func() error, err error) {
	if c.pattern != Random || c.seq != nil {
		return nil, nil, fmt.Errorf("%w: pattern %s, workload %s", ErrNoBatch, c.pattern, c.w.Name)
	}
	if n <= 0 {
		return nil, nil, fmt.Errorf("workload: a batch of %d steps", n)
	}
	if err := c.freeCurrent(); err != nil {
		return nil, nil, err
	}
	var sets [][]gpu.DevicePtr
	release := func() error {
		var err error
		for _, set := range sets {
			err = errors.Join(err, c.freeSet(set))
		}
		sets = nil
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, release())
		}
	}()
	binds := make([]sg.Bindings, 0, n)
	for i := range n {
		if c.remap == nil {
			if err := c.churn(); err != nil {
				return nil, nil, err
			}
		}
		set, err := c.allocSet()
		if err != nil {
			return nil, nil, err
		}
		sets = append(sets, set)
		bind := sg.Bindings{}
		for j, buf := range c.w.movable() {
			bind[buf] = set[j]
		}
		inputs := c.inputsOf(first + i)
		for j, buf := range c.w.Params {
			if err := c.b.MemcpyHtoD(set[j], inputs[j]); err != nil {
				return nil, nil, fmt.Errorf("workload: write input %s of step %d: %w", buf.Name(), first+i, err)
			}
		}
		binds = append(binds, bind)
	}
	return binds, release, nil
}

// churn frees about half the fillers and allocates new ones of random
// sizes, so that the next set lands between them at new places.
func (c *Caller) churn() error {
	kept := c.filler[:0]
	for _, p := range c.filler {
		if c.rng.IntN(2) == 0 {
			if err := c.alloc.Free(p); err != nil {
				return fmt.Errorf("workload: free filler: %w", err)
			}
			continue
		}
		kept = append(kept, p)
	}
	c.filler = kept
	for len(c.filler) < fillers {
		p, err := c.alloc.Alloc(uint64(1 + c.rng.IntN(fillerMaxSize)))
		if err != nil {
			return fmt.Errorf("workload: filler: %w", err)
		}
		c.filler = append(c.filler, p)
	}
	return nil
}

func (c *Caller) freeSet(set []gpu.DevicePtr) error {
	var err error
	for _, p := range set {
		err = errors.Join(err, c.alloc.Free(p))
	}
	return err
}

func (c *Caller) freeCurrent() error {
	err := c.freeSet(c.current)
	c.current = nil
	return err
}

// Close frees the caller's region, or every remappable buffer. The caller
// must have waited for every step that used it.
func (c *Caller) Close() error {
	perr := c.unpin()
	if c.remap != nil {
		err := c.remap.Close()
		if err == nil {
			c.remap = nil
		}
		return errors.Join(perr, err)
	}
	if c.region == 0 {
		return perr
	}
	err := c.b.MemFree(c.region)
	c.region = 0
	return errors.Join(perr, err)
}
