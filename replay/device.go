package replay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/graph"
	"github.com/stablegraph/stablegraph/internal/patchtable"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/vmm"
)

// DeviceOptions configure device (Options.DeviceStrategy). By default a
// moving step makes no driver call but its launch: every pointer move goes
// through the ring of tables in mapped host memory, and the step's first
// command moves on the device with the rest. Each option trades one exec
// update per moving step of host time for GPU time (BENCHMARKS.md,
// section 0, has both sides).
type DeviceOptions struct {
	// Inline passes a step's pointer moves in the patcher node's own
	// parameters when at most kernels.PatchInlineCap buffers can move,
	// set with one exec update of that node per step that moves
	// anything: the patcher then reads them without a round trip over
	// the bus, which halves its GPU time. Default false: the ring of
	// tables, which the patcher reads over the bus, and no exec update.
	Inline bool
	// HostLead moves the step's first command from the host when it
	// points into a bound buffer (hostLead), as patch moves it: one exec
	// update of its node per moving step, and the patcher runs beside it
	// instead of in front of it, so its pointer writes leave the step's
	// critical path, which a launch-bound step (a small graph) feels.
	// Default false: the first command moves on the device too, and the
	// patcher runs before it.
	HostLead bool
}

// device moves the step's pointers on the device: the graph is recorded
// once, every kernel node with a pointer into a buffer the caller binds
// every step (params, outputs) is opted in to device-side updates
// (gpu.DeviceUpdates), and the patcher (package kernels) is a node of the
// graph that runs before the first of them. Per step the host compares the
// addresses with the ones the device holds, writes one update per moved
// buffer, and launches: the patcher rewrites every pointer into those
// buffers before any node it moves runs, in the same launch. No step
// allocates.
//
// What device is for is a moving step whose host work is the floor's:
// by default a step writes its moves into the next table of a ring in
// mapped pinned host memory and launches, with no other driver call, and
// the patcher runs before the step's first command. A node that must wait
// for the patcher waits for all of it, so the patcher's pointer writes
// (and its read of the table over the bus) are on the step's critical
// path: a few µs that a launch-bound step (a small graph) feels and a
// large one does not, and less than the exec updates they replace cost a
// step awaited before the next (BENCHMARKS.md, section 0). Two options
// buy that GPU time back with host time. DeviceOptions.HostLead moves the
// step's first command, when it points into a bound buffer (mlp's first
// GEMM reads x), from the host, as patch moves it (one exec update per
// moved node; it is not opted in, so no upload), and the patcher then
// waits only in front of the first command it moves
// (graph.DeviceOptions.HostLead, hostLead), beside the first.
// DeviceOptions.Inline passes the moves, when at most
// kernels.PatchInlineCap buffers can move, in the patcher's own kernel
// parameters, set with one exec update of that node per step that moves
// something (the node is not device-updatable, so the graph needs no
// upload): the patcher reads them with no round trip over the bus, which
// halves its GPU time (bench/probes/patcher). What is left is the patcher
// node itself: any extra node costs a launch-bound step GPU time even
// with nothing to do, wherever it sits, so when nothing is left to move
// on the device, the graph gets no patcher. Each graph's patcher is thus
// in one of three modes (patcherMode): tables, inline, or none.
//
// Only nodes with a pointer into a buffer bound every step opt in: an
// opted-in cuBLAS kernel node costs GPU time even when nothing moves
// (BENCHMARKS.md, section 0b). States keep their recorded addresses; a
// state rebound to another address records the graph afresh.
//
// # What moves where
//
// graph.RecordDevice says it in full. Kernels of the program, and the
// kernel nodes of library calls flattened from a template (a cuBLAS GEMM's,
// whose pointer slots differential tracing found), move on the device.
//
// Copies and memsets cannot be updated from the device. One over a buffer
// that moves is recorded as a copy or fill kernel of package kernels
// (4-byte elements) when its size and addresses allow, and moves on the
// device with the rest: kept a copy node, it would cost the host an exec
// update at every step it moves. A copy kernel costs the GPU what a copy
// node costs (both are latency-bound at these sizes) and the host nothing. The
// kernels are bit-exact copies, so eager's bits are kept. A copy whose size
// or addresses are not whole 4-byte elements keeps the host path.
//
// Collectives keep the host path: NCCL's kernels cannot be read back, so
// their traces are never flattened on CUDA, and a child graph's nodes
// cannot opt in. In data-parallel steps their buffers are the gradients,
// temps of the executable that never move, so they cost nothing per step.
//
// What moves from the host is never a device-updatable node, so the graph
// needs no upload after it, and the opted-in nodes keep what the patcher
// set (conformance group DeviceUpdates, HostChangeKeepsDeviceState, checks
// this on the H100 too).
//
// # The ring and the mirror
//
// The table patcher reads table k % deviceTables at launch k. The host may
// rewrite a table only once the launch that read it last has passed its
// patcher: the patcher's mirror of its control block, in the same mapped
// host memory, says how many launches have, with no driver call (the role
// the timeline plays for pool, written by the patcher itself instead of a
// stream write per step). Acquire makes the executable wait, without its
// lock, while the host is deviceTables launches ahead of the device,
// polling as Spec.Poll says. The mirror also counts the pointer
// updates the device runtime refused; a step that finds the count grown
// fails (the steps before it ran on stale pointers) and the graph is
// recorded afresh.
//
// # When it records again
//
// At its first step; when a state is rebound (its pointers are in no
// slot: a re-record for a move); when a host-side update is refused (a
// copy kernel's buffers moved off 4-byte alignment or a flattened library
// call's operands to another alignment class, which graph.PatchDevice
// refuses since the library may choose other kernels there, or an update
// the driver refused: a re-record for a refusal); and after a failure (for
// a retry). A graph with device-updatable nodes cannot take a whole-graph
// update, so recording again means a new graph: the old one's patcher
// memory is freed once the stream has finished with it.
//
// # Options and counters
//
// Its options are DeviceOptions (Options.DeviceStrategy); Spec.Poll says
// how it waits for a table. It counts DeviceUpdates (the pointers the
// patcher rewrote), PatchedNodes (the nodes moved from the host: the lead
// command's, copies it could not make kernels, traced commands on the host
// path), GraphUploads (one per recording), its re-records by cause, and
// GraphLaunches.
//
// # Requirements
//
// gpu.DeviceUpdates on the device (CUDA 12.4 or newer) and the patcher
// built for its architecture (kernels/cuda/gen-patcher.sh); New fails
// with an error wrapping gpu.ErrNotSupported that says which is missing,
// and auto skips the strategy.
type device struct {
	base
	dev     int
	du      gpu.DeviceUpdates
	module  gpu.Module
	patcher gpu.Function
	inline  gpu.Function // the inline patcher; 0: the cubins predate it
	inlined bool         // DeviceOptions.Inline
	opts    graph.DeviceOptions
	states  []int // the states: recorded at their addresses, never moved on the device
	policy  vmm.WaitPolicy

	x   *graph.Exec // nil before the first step and after a failure
	rig *patchRig   // x's patcher memory
	// rec is the addresses x was recorded at, what an upload restores in
	// its opted-in nodes; held is what the device holds in them once every
	// launch enqueued has run its patcher.
	rec, held []gpu.DevicePtr
	// retired are the rigs of execs dropped while their launches may still
	// run: freed once a stream synchronization covers them, or at Close.
	retired []*patchRig
}

// hostLead is how many of the step's first commands move from the host
// when they point into a bound buffer (graph.DeviceOptions.HostLead). One:
// the first command is the only one the patcher must delay whatever the
// step; a later one has the commands before it to run beside the patcher.
// It costs the host one exec update per moved node of that command
// (docs/GPU-MACHINE.md prices a GEMM node's).
const hostLead = 1

// deviceTables is the number of tables in the ring: how many launches the
// host may enqueue ahead of the device's patcher before it waits. A table
// holds one update per buffer, so the ring is small.
const deviceTables = 16

// rigCtlBytes and rigMirrorBytes are where the slots and the tables start
// in the rig's device and host memory.
const (
	rigCtlBytes    = 256
	rigMirrorBytes = 64
)

func newDevice(spec Spec) (_ Strategy, err error) {
	b, dev := spec.Backend, spec.Ordinal
	du, err := gpu.DeviceUpdatesOf(b, dev)
	if err != nil {
		return nil, fmt.Errorf("device: pointers moved on the device need device-updatable graph nodes: %w", err)
	}
	st := &device{base: newBase(spec), dev: dev, du: du, policy: spec.Poll, inlined: spec.Options.DeviceStrategy.Inline}
	m, err := b.ModuleLoad(dev, kernels.PatcherModule())
	if err != nil {
		return nil, fmt.Errorf("device: load the patcher: %w", err)
	}
	st.module = m
	defer func() {
		if err != nil {
			err = errors.Join(err, st.Close())
		}
	}()
	if st.patcher, err = b.ModuleFunction(m, kernels.Patcher); err != nil {
		return nil, fmt.Errorf("device: the patcher kernel: %w", err)
	}
	// Cubins built before the inline patcher existed lack it: then every
	// step goes through the ring.
	switch f, err := b.ModuleFunction(m, kernels.PatcherInline); {
	case err == nil:
		st.inline = f
	case !errors.Is(err, gpu.ErrNotFound):
		return nil, fmt.Errorf("device: the inline patcher kernel: %w", err)
	}
	// Only what moves every step opts in: a node opted in to device-side
	// updates costs the GPU time even when nothing moves (a cuBLAS kernel
	// node more than a small one), and states move only when rebound,
	// which records afresh (Run).
	st.opts.Movable = make([]bool, len(spec.Buffers))
	if spec.Options.DeviceStrategy.HostLead {
		st.opts.HostLead = hostLead
	}
	for _, i := range spec.classes.Bound {
		st.opts.Movable[i] = true
	}
	st.states = spec.classes.States
	if spec.Kernels != nil {
		// Without them, copies and memsets that move take the host path.
		if f, err := spec.Kernels(kernels.Copy); err == nil {
			st.opts.Copy = f
		}
		if f, err := spec.Kernels(kernels.Fill); err == nil {
			st.opts.Fill = f
		}
	}
	st.rec = make([]gpu.DevicePtr, len(spec.Buffers))
	st.held = make([]gpu.DevicePtr, len(spec.Buffers))
	return st, nil
}

// WarmUp: the graph is recorded at the first step, and the templates of
// library calls are proved then too; the second step moves on the device.
func (st *device) WarmUp() int { return 2 }

// AliasSafe: like patch, the graph works in the caller's memory (its
// copies and memsets, made kernels, too), so overlapping bindings get
// eager's semantics.
func (st *device) AliasSafe() bool { return true }

// Acquire waits, when the next launch's table may still be read by the
// patcher of the launch deviceTables before it.
func (st *device) Acquire() func(context.Context) error {
	r := st.rig
	if r == nil || r.mode != patcherTables || r.launches < deviceTables {
		return nil
	}
	need := r.launches - deviceTables + 1
	if r.mirror().Seq >= need {
		return nil
	}
	policy := st.policy
	return func(ctx context.Context) error {
		if _, err := policy.Poll(ctx, time.Time{}, func() bool { return r.passed(need) }, nil); err != nil {
			return fmt.Errorf("device: the patcher of launch %d has not run, and its table is the next launch's: %w", need-1, err)
		}
		return nil
	}
}

func (st *device) Run(_ context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (Result, error) {
	if err := st.checkPatcher(); err != nil {
		return Result{}, err
	}
	writes, err := st.move(s, addrs)
	if err != nil {
		return Result{}, err
	}
	if err := st.x.Launch(st.b, s); err != nil {
		// Nothing ran. The table must not move anything at the next
		// launch, which takes this one's number and writes its own (an
		// inline table is rewritten by the next step: held is unchanged).
		if st.rig.mode == patcherTables {
			w := patchtable.NewWriter(st.rig.table(st.rig.launches))
			w.Seal(math.MaxUint64)
		}
		return Result{}, err
	}
	st.rig.launches++
	st.c.GraphLaunches++
	if writes > 0 {
		for _, r := range st.rig.ranges {
			st.held[r.Buf] = addrs[r.Buf]
		}
		st.c.DeviceUpdates += int64(writes)
	}
	return Result{}, nil
}

// move brings the graph to addrs, recording it when it must, and writes
// the next launch's table; it returns how many pointers the launch moves
// on the device. An update the backend refuses is replaced by a record;
// after any other failure the graph is dropped and the next step records
// it afresh.
func (st *device) move(s gpu.Stream, addrs []gpu.DevicePtr) (int, error) {
	switch {
	case st.x == nil:
		// The first step, or a failed step dropped the graph.
		if err := st.record(s, addrs, causeRetry, nil); err != nil {
			return 0, err
		}
	case st.stateMoved(addrs):
		// A state rebound: its pointers are in no slot.
		if err := st.dropExec(); err != nil {
			return 0, err
		}
		if err := st.record(s, addrs, causeMoved, nil); err != nil {
			return 0, err
		}
	default:
		writes, err := st.update(addrs)
		if err == nil {
			return writes, nil
		}
		// Some nodes may be moved and others not.
		derr := st.dropExec()
		if !errors.Is(err, gpu.ErrGraphUpdate) || derr != nil {
			return 0, errors.Join(err, derr)
		}
		st.refused("device: host-side update", err)
		if err := st.record(s, addrs, causeRefused, err); err != nil {
			return 0, err
		}
	}
	// Just recorded at addrs: the device holds them, and nothing is
	// staged unless the inline patcher must stop applying (ApplyHost).
	writes, err := st.writeTable(addrs)
	if err != nil {
		return 0, err
	}
	if err := st.cb.ApplyHost(st.x); err != nil {
		return 0, fmt.Errorf("device: set the inline patcher's table: %w", err)
	}
	return writes, nil
}

// update moves from the host what does not move on the device
// (graph.PatchDevice), then writes the next launch's table.
//
// The inline patcher's node is in the set of the nodes that move from the
// host (graph.Exec.SetHostNode): its table is staged first, and one Apply
// sets it with them.
func (st *device) update(addrs []gpu.DevicePtr) (int, error) {
	writes, err := st.writeTable(addrs)
	if err != nil {
		return 0, err
	}
	if st.cb.Moved(st.x.Addrs(), addrs) {
		n, err := st.cb.PatchDevice(st.b, st.x, addrs)
		if err != nil {
			return 0, err
		}
		// What moved from the host is no opted-in node: no upload.
		st.c.PatchedNodes += int64(n)
	} else if err := st.cb.ApplyHost(st.x); err != nil {
		return 0, fmt.Errorf("device: set the inline patcher's table: %w", err)
	}
	return writes, nil
}

// stateMoved reports whether a state is not where the graph was recorded.
func (st *device) stateMoved(addrs []gpu.DevicePtr) bool {
	for _, i := range st.states {
		if addrs[i] != st.rec[i] {
			return true
		}
	}
	return false
}

// writeTable writes the next launch's table when a buffer with pointers on
// the device is not where the device holds it, and returns how many
// pointers it moves.
func (st *device) writeTable(addrs []gpu.DevicePtr) (int, error) {
	r := st.rig
	if r.mode == patcherNone {
		return 0, nil
	}
	moved := false
	for _, rg := range r.ranges {
		if st.held[rg.Buf] != addrs[rg.Buf] {
			moved = true
			break
		}
	}
	if r.mode == patcherInline {
		return st.writeInline(addrs, moved)
	}
	k := r.launches
	free := k < deviceTables || r.passed(k-deviceTables+1)
	if !moved {
		if free {
			// An empty table of its own: the patcher finds nothing to
			// do, rather than a table that is not its launch's (which it
			// counts as skipped, on a slower path).
			w := patchtable.NewWriter(r.table(k))
			w.Seal(k)
		}
		return 0, nil
	}
	if !free {
		// Acquire waits for this; a caller that did not ask is a bug.
		return 0, fmt.Errorf("device: the table of launch %d is still in use by launch %d: %w", k, k-deviceTables, gpu.ErrIllegalState)
	}
	w := patchtable.NewWriter(r.table(k))
	if err := st.addMoves(&w, addrs); err != nil {
		return 0, err
	}
	w.Seal(k)
	return w.Writes(), nil
}

// addMoves adds to w one update per buffer that is not where the device
// holds it: its range of slots, to its address in addrs.
func (st *device) addMoves(w *patchtable.Writer, addrs []gpu.DevicePtr) error {
	for _, rg := range st.rig.ranges {
		if st.held[rg.Buf] == addrs[rg.Buf] {
			continue
		}
		if err := w.Add(uint32(rg.First), uint32(rg.N), uint64(addrs[rg.Buf])); err != nil {
			return fmt.Errorf("device: %w", err)
		}
	}
	return nil
}

// writeInline sets the inline patcher's parameters for the next launch:
// the moved buffers' updates, or an empty table once nothing moves (so
// that the patcher stops applying the last moves again); it returns how
// many pointers the launch moves.
func (st *device) writeInline(addrs []gpu.DevicePtr, moved bool) (int, error) {
	r := st.rig
	if !moved && !r.applying {
		return 0, nil
	}
	w := patchtable.NewWriter(r.param)
	if moved {
		if err := st.addMoves(&w, addrs); err != nil {
			return 0, err
		}
	}
	w.Seal(0)
	// Only the table's words change: they are rewritten in the node's
	// prepared parameters and the node set with one driver call. The
	// patcher reads the header's count of updates and no further, so only
	// the header and those updates are rewritten: the words past them may
	// hold an earlier step's, which nothing reads.
	// The node is staged; the caller applies it (update).
	base := len(r.args) - patchtable.InlineSize/8
	used := (patchtable.HeaderSize + patchtable.UpdateSize*int(patchtable.DecodeHeader(r.param).Count)) / 8
	for k := range used {
		if err := st.cb.HostNodeWord(st.b, st.x, base+k, 0, binary.LittleEndian.Uint64(r.param[8*k:])); err != nil {
			return 0, fmt.Errorf("device: write the inline patcher's table: %w", err)
		}
	}
	r.applying = moved
	return w.Writes(), nil
}

// checkPatcher fails when the patcher's mirror shows pointer updates the
// device runtime refused since the last check: the steps since ran on
// stale pointers. The graph is dropped, so the next step records afresh.
func (st *device) checkPatcher() error {
	r := st.rig
	if r == nil {
		return nil
	}
	m := r.mirror()
	if m.Failed == r.failed {
		return nil
	}
	n := m.Failed - r.failed
	r.failed = m.Failed
	err := fmt.Errorf("device: the patcher could not apply %d pointer updates in the %d launches run; steps ran on stale addresses: %w",
		n, m.Seq, gpu.ErrIllegalState)
	return errors.Join(err, st.dropExec())
}

// record records, instantiates and uploads the step at addrs with the
// patcher before the first node it moves, and then frees what earlier
// graphs left, once the stream has finished with it; a record after the
// first is a re-record for cause. On error the current graph, if any, is
// kept.
func (st *device) record(s gpu.Stream, addrs []gpu.DevicePtr, cause recordCause, refusal error) (err error) {
	b := st.b
	dr, err := st.cb.RecordDevice(b, st.du, addrs, st.opts)
	if err != nil {
		return fmt.Errorf("device: %w", err)
	}
	for _, why := range dr.HostPath {
		st.log.Debug("device: a library call's kernels cannot opt in; it moves from the host", "reason", why)
	}
	var rig *patchRig
	defer func() {
		if err != nil {
			err = errors.Join(err, dr.Destroy(b))
			if rig != nil {
				err = errors.Join(err, rig.free(b))
			}
		}
	}()
	if rig, err = newPatchRig(b, st.dev, dr.Slots, dr.Ranges); err != nil {
		return err
	}
	// A thread per pointer into the buffers bound every step: the states'
	// pointers move only when a state is rebound, and then the threads
	// take several each (grid-stride) rather than idle every step.
	threads := 0
	for _, r := range dr.Ranges {
		if st.opts.Movable[r.Buf] {
			threads += r.N
		}
	}
	p := gpu.KernelParams{Func: st.patcher, Config: kernels.PatcherConfig(threads), Args: rig.mem.Args()}
	switch {
	case len(dr.Slots) == 0:
		// No patcher, which would cost the step a node's time for
		// nothing.
		rig.mode = patcherNone
	case st.inline != 0 && st.inlined && len(dr.Ranges) <= kernels.PatchInlineCap:
		// Every step's updates fit the patcher's own parameters.
		rig.mode = patcherInline
		rig.param = make([]byte, patchtable.InlineSize)
		rig.args = rig.mem.InlineArgs(rig.param)
		p = gpu.KernelParams{Func: st.inline, Config: p.Config, Args: rig.args}
	default:
		rig.mode = patcherTables
	}
	if rig.mode != patcherNone {
		if rig.node, err = st.du.GraphAddKernelNodeBefore(dr.Graph(), p, dr.Before); err != nil {
			return fmt.Errorf("device: add the %s patcher: %w", rig.mode, err)
		}
	}
	x, err := dr.Instantiate(b) // the recording is spent, on error too
	if err != nil {
		return fmt.Errorf("device: %w", err)
	}
	if rig.mode == patcherInline {
		// The inline patcher's parameters change every step that moves
		// something: prepared once with the nodes that move from the
		// host, only its table rewritten.
		if err = x.SetHostNode(rig.node, p); err != nil {
			return errors.Join(fmt.Errorf("device: the inline patcher's node: %w", err), x.Destroy(b))
		}
	}
	if err = st.du.GraphUpload(x.X, s); err != nil {
		return errors.Join(fmt.Errorf("device: upload: %w", err), x.Destroy(b))
	}
	st.c.GraphUploads++
	st.countRecord(st.c.Records > 0, cause, refusal)
	derr := st.dropExec()
	st.x, st.rig = x, rig
	copy(st.rec, addrs)
	copy(st.held, addrs)
	return errors.Join(derr, st.freeRetired(s))
}

// dropExec destroys the exec graph (launches in flight complete) and
// retires its patcher memory, which they may still read.
func (st *device) dropExec() error {
	if st.x == nil {
		return nil
	}
	err := st.x.Destroy(st.b)
	st.x = nil
	st.retired = append(st.retired, st.rig)
	st.rig = nil
	return err
}

// freeRetired frees the retired patcher memory once s, which every earlier
// step is ordered before, has finished.
func (st *device) freeRetired(s gpu.Stream) error {
	if len(st.retired) == 0 {
		return nil
	}
	if err := st.b.StreamSynchronize(s); err != nil {
		// Kept for Close, when the executable has waited for its steps.
		return fmt.Errorf("device: wait for the launches of the graph recorded before: %w", err)
	}
	return st.freeAllRetired()
}

func (st *device) freeAllRetired() error {
	var errs []error
	for _, r := range st.retired {
		errs = append(errs, r.free(st.b))
	}
	st.retired = nil
	return errors.Join(errs...)
}

// Close destroys the graph and frees the patcher memory and module. The
// executable has waited for its last step.
func (st *device) Close() error {
	errs := []error{st.dropExec(), st.freeAllRetired()}
	if st.module != 0 {
		if err := st.b.ModuleUnload(st.module); err != nil {
			errs = append(errs, fmt.Errorf("device: unload the patcher: %w", err))
		}
		st.module = 0
	}
	return errors.Join(errs...)
}

// patchRig is one graph's patcher memory: the control block and the slots
// in device memory, the mirror and the ring of tables in one allocation of
// mapped pinned host memory.
type patchRig struct {
	dmem     gpu.DevicePtr
	mem      patchtable.Memory
	ranges   []graph.SlotRange
	launches uint64 // launches of its graph enqueued
	failed   uint32 // the mirror's failed count last seen

	mode patcherMode
	// The inline patcher: its node, table (in its arguments, rewritten
	// in place each step) and whether that table moves anything.
	node     gpu.GraphNode
	param    []byte
	args     []gpu.Arg
	applying bool

	// host's lifetime: a wait reads the mirror without the executable's
	// lock, while Close may free it (see pool's timeline).
	life   sync.RWMutex
	host   gpu.HostMem
	hostOf gpu.StreamMemOps // what allocated host
	closed bool
}

// patcherMode is how a graph's patcher gets each step's pointer moves.
type patcherMode uint8

const (
	// patcherTables: from the next table of the ring in mapped host
	// memory, read over the bus (more than kernels.PatchInlineCap buffers
	// with pointers on the device, no DeviceOptions.Inline, or cubins that
	// predate the inline patcher).
	patcherTables patcherMode = iota
	// patcherInline: from the patcher node's own parameters, set with one
	// exec update of that node per step that moves anything.
	patcherInline
	// patcherNone: the graph has no patcher, since nothing moves on the
	// device (the lead command was the only one to point into bound
	// buffers, or the rest are on the host path).
	patcherNone
)

func (m patcherMode) String() string {
	switch m {
	case patcherInline:
		return "inline"
	case patcherNone:
		return "none"
	}
	return "tables"
}

// newPatchRig allocates and fills a patcher's memory for slots (one
// update per range at most, per launch). On error nothing is left.
func newPatchRig(b gpu.Backend, dev int, slots []graph.DeviceSlot, ranges []graph.SlotRange) (_ *patchRig, err error) {
	r := &patchRig{ranges: ranges}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.free(b))
		}
	}()
	raw := make([]byte, patchtable.SlotSize*len(slots))
	for i, s := range slots {
		patchtable.PutSlot(raw[patchtable.SlotSize*i:], patchtable.Slot{Node: s.Dev, Offset: s.Offset, Add: s.Off})
	}
	if r.dmem, err = b.MemAlloc(dev, uint64(rigCtlBytes+max(len(raw), patchtable.SlotSize))); err != nil {
		return nil, fmt.Errorf("device: patcher memory: %w", err)
	}
	if err = b.Memset(gpu.Memset{Dst: r.dmem, ElemSize: 4, Count: patchtable.CtlSize / 4}); err != nil {
		return nil, fmt.Errorf("device: zero the patcher's control block: %w", err)
	}
	if len(raw) > 0 {
		if err = b.MemcpyHtoD(r.dmem.Add(rigCtlBytes), raw); err != nil {
			return nil, fmt.Errorf("device: write the patcher's slots: %w", err)
		}
	}
	capacity := max(len(ranges), 1)
	stride := patchtable.Stride(capacity)
	if r.hostOf, err = gpu.StreamMemOpsOf(b, dev); err != nil {
		return nil, fmt.Errorf("device: patch tables: %w", err)
	}
	if r.host, err = r.hostOf.HostAlloc(rigMirrorBytes + deviceTables*stride); err != nil {
		return nil, fmt.Errorf("device: patch tables: %w", err)
	}
	if uint64(len(r.host.Bytes)) < rigMirrorBytes+deviceTables*stride {
		return nil, fmt.Errorf("device: patch tables: a host view of %d bytes: %w", len(r.host.Bytes), gpu.ErrInvalidValue)
	}
	// Pinned memory comes uninitialised: no table may look like a launch's
	// before the host writes it.
	clear(r.host.Bytes)
	for k := range uint64(deviceTables) {
		w := patchtable.NewWriter(r.host.Bytes[rigMirrorBytes+k*stride:])
		w.Seal(math.MaxUint64)
	}
	r.mem = patchtable.Memory{Ctl: r.dmem, Slots: r.dmem.Add(rigCtlBytes), NSlots: len(slots),
		Tables: r.host.Ptr.Add(rigMirrorBytes), Stride: stride, NTables: deviceTables, Capacity: capacity, Mirror: r.host.Ptr}
	return r, nil
}

// table is the memory of launch k's table.
func (r *patchRig) table(k uint64) []byte {
	off := rigMirrorBytes + (k%deviceTables)*r.mem.Stride
	return r.host.Bytes[off : off+r.mem.Stride]
}

// mirror reads the patcher's mirror; under the executable's lock, which
// Close takes too.
func (r *patchRig) mirror() patchtable.Mirror { return patchtable.ReadMirror(r.host, 0) }

// passed reports whether the patchers of the first n launches have run;
// without the executable's lock. A freed rig has nothing left to wait for.
func (r *patchRig) passed(n uint64) bool {
	r.life.RLock()
	defer r.life.RUnlock()
	return r.closed || patchtable.ReadMirror(r.host, 0).Seq >= n
}

// free frees the rig's memory, reporting every failure; it is idempotent.
func (r *patchRig) free(b gpu.Backend) error {
	var errs []error
	if r.dmem != 0 {
		if err := b.MemFree(r.dmem); err != nil {
			errs = append(errs, fmt.Errorf("device: free the patcher memory: %w", err))
		}
		r.dmem = 0
	}
	r.life.Lock()
	defer r.life.Unlock()
	if r.host.Handle != 0 {
		if err := r.hostOf.HostFree(r.host.Handle); err != nil {
			errs = append(errs, fmt.Errorf("device: free the patch tables: %w", err))
		}
		r.host = gpu.HostMem{}
	}
	r.closed = true
	return errors.Join(errs...)
}

// modelDevice prices a step in which every param and output moves: the
// patcher node and its per-pointer cost, plus what moves from the host (the
// lead command, copies it cannot make kernels, traced commands that do not
// flatten, collectives). When the step's first command moves from the host
// (hostLead), the patcher runs beside it and only its per-node cost and
// the inline table's update count. It says why not when the device has no
// device-side graph updates; whether the patcher is built for it shows
// when auto builds it.
func modelDevice(spec Spec) Candidate {
	cand := Candidate{Strategy: Device}
	if _, err := gpu.DeviceUpdatesOf(spec.Backend, spec.Ordinal); err != nil {
		cand.Note = err.Error()
		return cand
	}
	c := spec.Costs
	bound := spec.classes.Bound
	hl := 0
	if spec.Options.DeviceStrategy.HostLead {
		hl = hostLead
	}
	lead := spec.Commands.MovesIn(bound, 0, hl)
	m := spec.Commands.MovesIn(bound, hl, spec.Commands.Len())
	kern := 0
	if spec.Kernels != nil {
		kern = m.Kernelizable
	}
	onDevice, copies := m.Nodes-m.Copies+kern, m.Copies-kern
	// What moves every step fits the inline patcher's parameters, set
	// with one exec update per step, or it goes through the ring.
	patcher, update, what := c.PatcherUS, 0.0, "the patcher node"
	if len(bound) <= kernels.PatchInlineCap && spec.Options.DeviceStrategy.Inline {
		patcher, update, what = c.PatcherInlineUS, c.NodeUpdateUS, "the inline patcher node and its update"
	}
	cand.Note = what
	if onDevice == 0 {
		// Nothing for the device: no patcher at all.
		patcher, update, cand.Note = 0, 0, "no patcher"
	} else if lead.Nodes+lead.Traced > 0 {
		patcher = 0
		cand.Note += fmt.Sprintf(" beside the first command (%d nodes and %d traced commands from the host)", lead.Nodes, lead.Traced)
	}
	us := patcher + update + float64(lead.Nodes)*c.NodeUpdateUS + float64(lead.Traced)*c.TracedUpdateUS
	us += float64(onDevice) * c.PatcherNodeUS
	cand.Note += fmt.Sprintf(", %d nodes moved on the device", onDevice)
	if copies+m.Traced > 0 {
		us += float64(copies)*c.NodeUpdateUS + float64(m.Traced)*c.TracedUpdateUS
		cand.Note += fmt.Sprintf(", %d nodes and %d traced commands from the host", copies, m.Traced)
	}
	cand.Usable, cand.StepUS = true, us
	return cand
}
