package kernels

import (
	"embed"
	encbin "encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/stablegraph/stablegraph/gpu"
)

// The patcher moves pointers inside a running graph: it is a kernel node of
// the graph, before the nodes it moves (gpu.DeviceUpdates.GraphAddKernelNodeBefore),
// that writes new values into the parameters of device-updatable kernel
// nodes (gpu.DevNode) with the device runtime's cudaGraphKernelNodeSetParam,
// one thread per parameter, so that the nodes after it run on the new
// addresses in the same launch and the host makes no driver call per step.
// Its CUDA source is cuda/patcher.cu; its Go reference, which the sim runs,
// is refPatcher.
//
// # Memory it reads and writes (all little-endian)
//
// Slots (device memory, written once): the parameters the patcher may
// change, PatchSlotSize bytes each: {node u64 (a gpu.DevNode), add u64,
// offset u32 (byte offset into the node's kernel parameters), reserved u32}.
// Every update writes 8 bytes at the slot's offset: the update's value plus
// the slot's add. A host that lays out the slots of one buffer side by side,
// each with its offset into the buffer as add, moves every pointer into the
// buffer with one update whose value is the buffer's new address.
//
// Tables (a ring of ntables tables, stride bytes apart, usually in mapped
// pinned host memory that the host writes): each is a PatchHeaderSize-byte
// header {seq u64, count u32, total u32} followed by up to capacity updates
// of PatchUpdateSize bytes {slot u32, start u32, value u64}. Update j sets
// the slots [slot, slot+n) where n is the next update's start minus its own
// (the last update's: total minus its start): start is the number of slot
// writes of the updates before it (0 for the first), and total the number of
// slot writes of the table. Slot write i of the table, for i in [0, total),
// is thread i's (grid-stride).
//
// Control block (device memory, PatchCtlSize bytes, zeroed before the first
// launch): {seq u64, done u32, failed u32, skipped u32, dirty u32,
// firstError u64}. seq counts the launches the patcher has run; done is the
// count of its blocks that finished the current launch and dirty whether
// one of them failed or skipped anything (both back to 0 between
// launches).
//
// Mirror (optional, mapped pinned host memory, PatchMirrorSize bytes, zeroed
// before the first launch): {seq u64, failed u32, skipped u32}, written by
// the patcher as each launch ends, each 8-byte word with one store: the
// counters when they changed in that launch, then (after a system-wide
// fence) seq: what the host reads, without a driver call, to know which
// tables are free again and whether every update was applied. seq may
// reach the host late (the kernel's completion publishes it), so a host
// waiting for it polls; it never sees a seq without the counters of that
// launch.
//
// # One launch
//
// The patcher reads seq from the control block and uses table seq %
// ntables. If that table's header says the same seq and count <= capacity,
// it applies the table's updates, slot write i by thread i (grid-stride,
// reading the updates in chunks of PatchChunk); a slot write whose slot is
// out of range, or that the device runtime refuses, adds one to failed and,
// if firstError is 0, sets it to (i+1)<<32 | the cudaError_t code (1 is
// cudaErrorInvalidValue; with several failures in a launch, whichever thread
// gets there first). Otherwise it applies nothing and adds one to skipped.
// Its last block to finish sets done back to 0 and seq to seq+1 and, when
// there is a mirror, writes failed and skipped to it and then seq+1. So the
// control block advances once per launch, with no host call.
//
// # The host's part
//
// For the k-th launch (k from 0) the host writes table k % ntables (the
// updates, then the header: WritePatchTable or a PatchTableWriter) when
// something moves, and launches; a launch whose table is not its own moves
// nothing (and counts as skipped). It may rewrite a table only once the
// launch that read it has finished its patcher (ntables launches earlier:
// the mirror's seq has passed it). The mirror's failed counter says whether
// every update of every launch was applied. The launch must be
// one-dimensional (PatcherConfig).

// # The inline patcher
//
// PatcherInline does the same work for a step that moves at most
// PatchInlineCap buffers, with its table in its own kernel parameters
// instead of a ring in host memory: the host writes the updates (a table of
// PatchInlineCap updates, header first, its seq unused) and sets the node's
// parameters with one exec update (gpu.Graphs.GraphExecKernelNodeSetParams),
// which the driver copies at the call, so there is no ring to wait for and
// no read over the bus before the first pointer write. The node itself is
// not device-updatable, so the graph needs no upload after it changes. A
// launch applies its table's updates, which the next launch applies again
// unless the host changes them (to an empty table, when nothing moves). A
// failed update counts in the control block as above and, with a mirror,
// the counters go to it; the control block's seq and the mirror's are not
// used.

// lend is the byte order of every record the patcher reads.
var lend = encbin.LittleEndian

// Patcher is the patcher kernel's name: (ctl, slots, nslots u32, tables,
// stride u64, ntables u32, capacity u32, mirror).
const Patcher = "sg_patcher"

// PatcherInline is the inline patcher's name: (ctl, slots, nslots u32,
// mirror, then the table's PatchInlineSize bytes as PatchInlineSize/8
// little-endian u64 parameters). See "The inline patcher" above.
const PatcherInline = "sg_patcher_inline"

// PatchInlineCap is how many updates an inline patcher's table holds
// (SG_PATCH_INLINE in cuda/patcher.cu), and PatchInlineSize its size.
const (
	PatchInlineCap  = 16
	PatchInlineSize = PatchHeaderSize + PatchUpdateSize*PatchInlineCap
)

// Sizes of the patcher's records, in bytes.
const (
	PatchSlotSize   = 24
	PatchHeaderSize = 16
	PatchUpdateSize = 16
	PatchCtlSize    = 32
	PatchMirrorSize = 16
)

// PatchChunk is how many updates each block of the patcher reads at a time
// (SG_PATCH_CHUNK in cuda/patcher.cu): a launch reads its table's updates
// in ceil(count/PatchChunk) rounds.
const PatchChunk = 1024

// cudaErrorInvalidValue is what the patcher records for an update it
// could not apply because the value was refused (device runtime or slot
// range).
const cudaErrorInvalidValue = 1

// PatcherSpec is the patcher's kernel spec.
func PatcherSpec() gpu.KernelSpec {
	return gpu.KernelSpec{Name: Patcher, Params: []gpu.ArgKind{p, p, gpu.ArgU32, p, u64, gpu.ArgU32, gpu.ArgU32, p}, Ref: refPatcher}
}

// PatcherInlineSpec is the inline patcher's kernel spec.
func PatcherInlineSpec() gpu.KernelSpec {
	params := []gpu.ArgKind{p, p, gpu.ArgU32, p}
	for range PatchInlineSize / 8 {
		params = append(params, u64)
	}
	return gpu.KernelSpec{Name: PatcherInline, Params: params, Ref: refPatcherInline}
}

// PatcherModule returns the patcher's module image: its spec and, through
// Code, the prebuilt cubins (the patcher calls the device runtime, so it
// must be linked with cudadevrt when built; it is never JIT-compiled, and
// ships as no PTX). The sim runs its Go reference and needs no code.
func PatcherModule() *gpu.ModuleImage {
	return &gpu.ModuleImage{Name: "stablegraph-patcher", Kernels: []gpu.KernelSpec{PatcherSpec(), PatcherInlineSpec()}, Code: patcherCode}
}

// patcherCode is the patcher module's Code: a cubin for the device
// (PatcherBinary), nothing else.
func patcherCode(t gpu.Target) ([]byte, error) {
	if t.Format != gpu.CodeCubin {
		return nil, fmt.Errorf("kernels: the patcher ships as cubins only (it links the device runtime), not as %s: %w", t.Format, gpu.ErrNotSupported)
	}
	return PatcherBinary(t.Major, t.Minor)
}

// PatcherConfig is the patcher's launch for up to writes slot writes per
// launch: one block, of a thread per write up to 1024 threads, while a
// thread has at most two writes to make (up to 2048 writes); blocks of 1024
// beyond. The patcher is every node's dependency, so its latency is the
// step's: with one block, its threads finish together at a barrier, where
// several blocks would count themselves done with device-wide atomics,
// which cost more (bench/probes/patcher).
func PatcherConfig(writes int) gpu.LaunchConfig {
	const maxBlock, perThread = 1024, 2
	writes = max(writes, 1)
	if writes > maxBlock*perThread {
		return gpu.Linear(writes, maxBlock)
	}
	threads := gpu.RoundUp(uint64(min(writes, maxBlock)), 32)
	return gpu.LaunchConfig{Grid: gpu.Dim3{X: 1, Y: 1, Z: 1}, Block: gpu.Dim3{X: uint32(threads), Y: 1, Z: 1}}
}

// PatcherMemory is where one patcher's records are: its arguments.
type PatcherMemory struct {
	Ctl    gpu.DevicePtr // the control block
	Slots  gpu.DevicePtr
	NSlots int
	// Tables is the first of NTables tables, Stride bytes apart, of
	// Capacity updates each (PatchTableStride).
	Tables   gpu.DevicePtr
	Stride   uint64
	NTables  int
	Capacity int
	// Mirror is the host-mapped mirror of the control block; 0: none.
	Mirror gpu.DevicePtr
}

// Args are the patcher's arguments for m.
func (m PatcherMemory) Args() []gpu.Arg {
	return []gpu.Arg{gpu.Ptr(m.Ctl), gpu.Ptr(m.Slots), gpu.U32(uint32(m.NSlots)), gpu.Ptr(m.Tables), gpu.U64(m.Stride),
		gpu.U32(uint32(m.NTables)), gpu.U32(uint32(m.Capacity)), gpu.Ptr(m.Mirror)}
}

// InlineArgs are the inline patcher's arguments for m (its tables unused)
// and table, PatchInlineSize bytes written like a ring's table
// (NewPatchTableWriter; its seq is not read).
func (m PatcherMemory) InlineArgs(table []byte) []gpu.Arg {
	args := []gpu.Arg{gpu.Ptr(m.Ctl), gpu.Ptr(m.Slots), gpu.U32(uint32(m.NSlots)), gpu.Ptr(m.Mirror)}
	for range PatchInlineSize / 8 {
		args = append(args, gpu.U64(0))
	}
	SetInlineArgs(args, table)
	return args
}

// SetInlineArgs rewrites the table words of inline patcher arguments args
// (from InlineArgs) from table, allocating nothing.
func SetInlineArgs(args []gpu.Arg, table []byte) {
	w := args[len(args)-PatchInlineSize/8:]
	for i := range w {
		w[i].Bits = lend.Uint64(table[8*i:])
	}
}

// PatcherArgs are the patcher's arguments without a mirror.
func PatcherArgs(ctl, slots gpu.DevicePtr, nslots int, tables gpu.DevicePtr, stride uint64, ntables, capacity int) []gpu.Arg {
	return PatcherMemory{Ctl: ctl, Slots: slots, NSlots: nslots, Tables: tables, Stride: stride, NTables: ntables, Capacity: capacity}.Args()
}

// PatchTableStride is the size of one table of capacity updates.
func PatchTableStride(capacity int) uint64 {
	return PatchHeaderSize + PatchUpdateSize*uint64(max(capacity, 0))
}

// PatchSlot is one parameter the patcher may change: 8 bytes at Offset of
// Node's kernel parameters, set to an update's value plus Add.
type PatchSlot struct {
	Node   gpu.DevNode
	Offset uint32
	Add    uint64
}

// EncodePatchSlots returns slots in the patcher's layout.
func EncodePatchSlots(slots []PatchSlot) []byte {
	b := make([]byte, PatchSlotSize*len(slots))
	for i, s := range slots {
		PutPatchSlot(b[PatchSlotSize*i:], s)
	}
	return b
}

// PutPatchSlot writes s in the patcher's layout at the start of b (at least
// PatchSlotSize bytes).
func PutPatchSlot(b []byte, s PatchSlot) {
	lend.PutUint64(b, uint64(s.Node))
	lend.PutUint64(b[8:], s.Add)
	lend.PutUint32(b[16:], s.Offset)
	lend.PutUint32(b[20:], 0)
}

// PatchUpdate sets Count slots from Slot on (0 counts as 1) to Value plus
// each slot's Add.
type PatchUpdate struct {
	Slot  uint32
	Count uint32
	Value uint64
}

// WritePatchTable writes one table for the launch numbered seq: updates
// first, then the header, count and total and then seq, so that a patcher
// reading the header never sees a seq whose updates are not written yet.
// table is the table's memory (at least PatchTableStride(len(updates))
// bytes).
func WritePatchTable(table []byte, seq uint64, updates []PatchUpdate) error {
	w := NewPatchTableWriter(table)
	for i, u := range updates {
		if err := w.Add(u.Slot, max(u.Count, 1), u.Value); err != nil {
			return fmt.Errorf("update %d: %w", i, err)
		}
	}
	w.Seal(seq)
	return nil
}

// PatchTableWriter writes one table in place, allocating nothing: the
// per-step path of a host that moves ranges of slots. Add the updates, then
// Seal.
type PatchTableWriter struct {
	b            []byte
	count, total uint32
}

// NewPatchTableWriter starts writing table, which keeps its old contents
// (and header) until Seal.
func NewPatchTableWriter(table []byte) PatchTableWriter { return PatchTableWriter{b: table} }

// Add appends an update setting n slots from slot on (n ≥ 1) to value plus
// each slot's add. It fails, writing nothing, when the table is full or the
// table's slot writes would pass 2³²-1.
func (w *PatchTableWriter) Add(slot, n uint32, value uint64) error {
	off := PatchHeaderSize + PatchUpdateSize*uint64(w.count)
	switch {
	case uint64(len(w.b)) < off+PatchUpdateSize:
		return fmt.Errorf("kernels: patch table of %d bytes cannot hold %d updates (%d bytes): %w",
			len(w.b), w.count+1, off+PatchUpdateSize, gpu.ErrInvalidValue)
	case n == 0 || uint64(w.total)+uint64(n) > 1<<32-1:
		return fmt.Errorf("kernels: patch update of %d slots after %d: %w", n, w.total, gpu.ErrInvalidValue)
	}
	e := w.b[off : off+PatchUpdateSize]
	lend.PutUint32(e, slot)
	lend.PutUint32(e[4:], w.total)
	lend.PutUint64(e[8:], value)
	w.count++
	w.total += n
	return nil
}

// Updates is the number of updates added; Writes the slot writes they make.
func (w *PatchTableWriter) Updates() int { return int(w.count) }

// Writes is the number of slot writes of the updates added.
func (w *PatchTableWriter) Writes() int { return int(w.total) }

// Seal writes the header for the launch numbered seq: count and total, then
// seq.
func (w *PatchTableWriter) Seal(seq uint64) {
	lend.PutUint32(w.b[8:], w.count)
	lend.PutUint32(w.b[12:], w.total)
	lend.PutUint64(w.b, seq)
}

// PatchCtl is the decoded control block.
type PatchCtl struct {
	Seq     uint64 // launches run
	Done    uint32 // blocks finished in the current launch; 0 between launches
	Failed  uint32 // slot writes not applied
	Skipped uint32 // launches whose table was not for them (seq mismatch, count > capacity)
	// FirstEntry is the index of the first failed slot write plus one (0:
	// none), FirstCode its cudaError_t.
	FirstEntry uint32
	FirstCode  uint32
}

// DecodePatchCtl decodes a control block read back from the device.
func DecodePatchCtl(b []byte) (PatchCtl, error) {
	if len(b) < PatchCtlSize {
		return PatchCtl{}, fmt.Errorf("kernels: patch control block of %d bytes, want %d: %w", len(b), PatchCtlSize, gpu.ErrInvalidValue)
	}
	first := lend.Uint64(b[24:])
	return PatchCtl{Seq: lend.Uint64(b), Done: lend.Uint32(b[8:]), Failed: lend.Uint32(b[12:]), Skipped: lend.Uint32(b[16:]),
		FirstEntry: uint32(first >> 32), FirstCode: uint32(first)}, nil
}

func (c PatchCtl) encode() []byte {
	b := make([]byte, PatchCtlSize)
	lend.PutUint64(b, c.Seq)
	lend.PutUint32(b[8:], c.Done)
	lend.PutUint32(b[12:], c.Failed)
	lend.PutUint32(b[16:], c.Skipped)
	lend.PutUint64(b[24:], uint64(c.FirstEntry)<<32|uint64(c.FirstCode))
	return b
}

// PatchMirror is the mirror of a control block as the host reads it.
type PatchMirror struct {
	Seq             uint64 // launches whose patcher has finished
	Failed, Skipped uint32
}

// ReadPatchMirror reads the mirror at byte off (a multiple of 8) of h
// without synchronizing with the device: seq first, then the counters, which
// the patcher writes before seq, so they are at least those of launch seq.
func ReadPatchMirror(h gpu.HostMem, off int) PatchMirror {
	seq := h.Load64(off)
	c := h.Load64(off + 8)
	return PatchMirror{Seq: seq, Failed: uint32(c), Skipped: uint32(c >> 32)}
}

// refPatcher is the patcher's Go reference: one launch as described above,
// run sequentially (so done stays 0), reading the updates in chunks and
// finding each slot write's update by the same binary search as the CUDA
// kernel, so that a malformed table does on the sim what it does on a GPU.
// Updates go through the device runtime of the backend (gpu.DeviceRuntime);
// a slot write it refuses with gpu.ErrInvalidValue is counted in failed, as
// cudaErrorInvalidValue; any other error (a fault) ends the kernel.
func refPatcher(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	rt, ok := gpu.DeviceRuntimeOf(mem)
	if !ok {
		return fmt.Errorf("kernel %s calls the device runtime (cudaGraphKernelNodeSetParam), which this backend does not model: %w", Patcher, gpu.ErrNotSupported)
	}
	g, bl := cfg.Grid, cfg.Block
	if g.Y != 1 || g.Z != 1 || bl.Y != 1 || bl.Z != 1 {
		return fmt.Errorf("kernel %s needs a one-dimensional launch, got grid %v block %v: %w", Patcher, g, bl, gpu.ErrInvalidValue)
	}
	ctlPtr, slots, nslots := a[0].AsPtr(), a[1].AsPtr(), uint64(a[2].AsU32())
	tables, stride, ntables, capacity := a[3].AsPtr(), a[4].AsU64(), uint64(a[5].AsU32()), a[6].AsU32()
	mirror := a[7].AsPtr()
	if ntables == 0 {
		return fmt.Errorf("kernel %s: zero tables (the device would divide by zero): %w", Patcher, gpu.ErrInvalidValue)
	}
	raw := make([]byte, PatchCtlSize)
	if err := mem.Read(ctlPtr, raw); err != nil {
		return err
	}
	ctl, _ := DecodePatchCtl(raw)
	table := tables.Add((ctl.Seq % ntables) * stride)
	var hdr [PatchHeaderSize]byte
	if err := mem.Read(table, hdr[:]); err != nil {
		return err
	}
	seq, count, total := lend.Uint64(hdr[:]), lend.Uint32(hdr[8:]), lend.Uint32(hdr[12:])
	if seq != ctl.Seq || count > capacity {
		ctl.Skipped++
	} else if count > 0 {
		ups := make([]byte, PatchUpdateSize*int(count))
		if err := mem.Read(table.Add(PatchHeaderSize), ups); err != nil {
			return err
		}
		if err := applyPatchTable(rt, mem, Patcher, slots, nslots, count, total, ups, &ctl); err != nil {
			return err
		}
	}
	ctl.Seq++
	ctl.Done = 0
	if err := mem.Write(ctlPtr, ctl.encode()); err != nil {
		return err
	}
	if mirror == 0 {
		return nil
	}
	// Two 8-byte stores, the counters first, as the CUDA kernel makes them:
	// a host that sees seq sees counters at least as recent.
	var w [8]byte
	lend.PutUint64(w[:], uint64(ctl.Failed)|uint64(ctl.Skipped)<<32)
	if err := mem.Write(mirror.Add(8), w[:]); err != nil {
		return err
	}
	lend.PutUint64(w[:], ctl.Seq)
	return mem.Write(mirror, w[:])
}

// applyPatchTable applies the count updates ups (total slot writes) as
// the patcher does, reading them in chunks and finding each slot write's
// update by binary search, counting refused writes in ctl. Any error but a
// refused write (a fault) ends the kernel: it is returned.
func applyPatchTable(rt gpu.DeviceRuntime, mem gpu.Memory, kernel string, slots gpu.DevicePtr, nslots uint64, count, total uint32, ups []byte, ctl *PatchCtl) error {
	start := func(j uint32) uint64 { return uint64(lend.Uint32(ups[PatchUpdateSize*j+4:])) }
	var slot [PatchSlotSize]byte
	for first := uint32(0); first < count; first += PatchChunk {
		n := min(count-first, PatchChunk)
		end := uint64(total)
		if first+n < count {
			end = start(first + n)
		}
		for i := start(first); i < end; i++ {
			// The last update of the chunk whose start is at most i.
			lo, hi := uint32(0), n
			for hi-lo > 1 {
				m := (lo + hi) / 2
				if start(first+m) <= i {
					lo = m
				} else {
					hi = m
				}
			}
			u := ups[PatchUpdateSize*(first+lo):]
			s := uint64(lend.Uint32(u)) + (i - start(first+lo))
			err := fmt.Errorf("kernel %s: slot write %d names slot %d of %d: %w", kernel, i, s, nslots, gpu.ErrInvalidValue)
			if s < nslots {
				if err = mem.Read(slots.Add(s*PatchSlotSize), slot[:]); err != nil {
					return err
				}
				var v [8]byte
				lend.PutUint64(v[:], lend.Uint64(u[8:])+lend.Uint64(slot[8:]))
				err = rt.GraphKernelNodeSetParam(gpu.DevNode(lend.Uint64(slot[:])), uint64(lend.Uint32(slot[16:])), v[:])
			}
			if err == nil {
				continue
			}
			if !errors.Is(err, gpu.ErrInvalidValue) {
				return err
			}
			ctl.Failed++
			if ctl.FirstEntry == 0 {
				ctl.FirstEntry, ctl.FirstCode = uint32(i+1), cudaErrorInvalidValue
			}
		}
	}
	return nil
}

// refPatcherInline is the inline patcher's Go reference: the table in its
// last argument applied as refPatcher applies a ring's, failures counted in
// the control block and, when there are any, written to the mirror.
func refPatcherInline(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	rt, ok := gpu.DeviceRuntimeOf(mem)
	if !ok {
		return fmt.Errorf("kernel %s calls the device runtime (cudaGraphKernelNodeSetParam), which this backend does not model: %w", PatcherInline, gpu.ErrNotSupported)
	}
	g, bl := cfg.Grid, cfg.Block
	if g.Y != 1 || g.Z != 1 || bl.Y != 1 || bl.Z != 1 {
		return fmt.Errorf("kernel %s needs a one-dimensional launch, got grid %v block %v: %w", PatcherInline, g, bl, gpu.ErrInvalidValue)
	}
	ctlPtr, slots, nslots, mirror := a[0].AsPtr(), a[1].AsPtr(), uint64(a[2].AsU32()), a[3].AsPtr()
	table := make([]byte, PatchInlineSize)
	for i, w := range a[4:] {
		lend.PutUint64(table[8*i:], w.AsU64())
	}
	count, total := min(lend.Uint32(table[8:]), PatchInlineCap), lend.Uint32(table[12:])
	if count == 0 {
		return nil
	}
	raw := make([]byte, PatchCtlSize)
	if err := mem.Read(ctlPtr, raw); err != nil {
		return err
	}
	ctl, _ := DecodePatchCtl(raw)
	failed := ctl.Failed
	if err := applyPatchTable(rt, mem, PatcherInline, slots, nslots, count, total, table[PatchHeaderSize:], &ctl); err != nil {
		return err
	}
	if ctl.Failed == failed {
		return nil
	}
	if err := mem.Write(ctlPtr, ctl.encode()); err != nil {
		return err
	}
	if mirror == 0 {
		return nil
	}
	var w [8]byte
	lend.PutUint64(w[:], uint64(ctl.Failed)|uint64(ctl.Skipped)<<32)
	return mem.Write(mirror.Add(8), w[:])
}

// The prebuilt patcher: one cubin per architecture, patcher/sm_<NN>.cubin,
// written by cuda/gen-patcher.sh with nvcc (-rdc=true, device-linked with
// cudadevrt), and patcher/SOURCE_SHA256, the source they were built from
// (TestPatcherMatchesSource). Until the script has run, the directory holds
// only its README and the patcher is "not built".
//
//go:embed patcher
var patcherFS embed.FS

// patcherArch is one cubin: its architecture (sm_<Major><Minor>).
type patcherArch struct {
	major, minor int
	file         string
}

func (a patcherArch) String() string { return fmt.Sprintf("sm_%d%d", a.major, a.minor) }

// patcherArchs lists the cubins in fsys (patcherFS but in tests), by
// architecture.
func patcherArchs(fsys fs.FS) []patcherArch {
	ents, err := fs.ReadDir(fsys, "patcher")
	if err != nil {
		return nil
	}
	var out []patcherArch
	for _, e := range ents {
		name := e.Name()
		num, ok := strings.CutPrefix(strings.TrimSuffix(name, ".cubin"), "sm_")
		if !strings.HasSuffix(name, ".cubin") || !ok {
			continue
		}
		n, err := strconv.Atoi(num)
		if err != nil || n < 10 {
			continue
		}
		out = append(out, patcherArch{major: n / 10, minor: n % 10, file: "patcher/" + name})
	}
	slices.SortFunc(out, func(a, b patcherArch) int { return (a.major*10 + a.minor) - (b.major*10 + b.minor) })
	return out
}

// PatcherArchs names the architectures the patcher was built for ("sm_80",
// ...), empty when it was not built.
func PatcherArchs() []string { return archNames(patcherArchs(patcherFS)) }

func archNames(archs []patcherArch) []string {
	var out []string
	for _, a := range archs {
		out = append(out, a.String())
	}
	return out
}

// PatcherBinary returns the patcher cubin for a device of compute
// capability major.minor: the one of the same major version with the
// highest minor not above the device's (a cubin runs on later minor
// versions of its major). It returns an error wrapping gpu.ErrNotSupported
// when the patcher was not built (cuda/gen-patcher.sh) or not for this
// architecture, naming the device's and the shipped architectures.
func PatcherBinary(major, minor int) ([]byte, error) { return patcherBinary(patcherFS, major, minor) }

func patcherBinary(fsys fs.FS, major, minor int) ([]byte, error) {
	archs := patcherArchs(fsys)
	if len(archs) == 0 {
		return nil, fmt.Errorf("kernels: the patcher is not built (run kernels/cuda/gen-patcher.sh on a machine with nvcc and commit kernels/patcher): %w", gpu.ErrNotSupported)
	}
	var pick *patcherArch
	for i, a := range archs {
		if a.major == major && a.minor <= minor {
			pick = &archs[i]
		}
	}
	if pick == nil {
		return nil, fmt.Errorf("kernels: the patcher has no cubin for compute capability %d.%d (built for %s): %w",
			major, minor, strings.Join(archNames(archs), ", "), gpu.ErrNotSupported)
	}
	return fs.ReadFile(fsys, pick.file)
}
