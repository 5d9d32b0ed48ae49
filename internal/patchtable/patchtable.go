// Package patchtable is the record format of the patcher (kernels.Patcher,
// kernels.PatcherInline): the memory the host writes and the patcher reads
// to move pointers inside a running graph, and the control block and mirror
// it writes back. The device strategy (package replay) writes it, the
// patcher's Go reference (package kernels) and its CUDA source
// (kernels/cuda/patcher.cu, whose static_asserts hold the sizes below) read
// it, and the conformance suite (gpu/gputest) drives both. It is internal:
// nothing outside the module writes patch tables.
//
// # Memory the patcher reads and writes (all little-endian)
//
// Slots (device memory, written once): the parameters the patcher may
// change, SlotSize bytes each: {node u64 (a gpu.DevNode), add u64, offset
// u32 (byte offset into the node's kernel parameters), reserved u32}. Every
// update writes 8 bytes at the slot's offset: the update's value plus the
// slot's add. A host that lays out the slots of one buffer side by side,
// each with its offset into the buffer as add, moves every pointer into the
// buffer with one update whose value is the buffer's new address.
//
// Tables (a ring of ntables tables, stride bytes apart, usually in mapped
// pinned host memory that the host writes): each is a HeaderSize-byte
// header {seq u64, count u32, total u32} followed by up to capacity updates
// of UpdateSize bytes {slot u32, start u32, value u64}. Update j sets the
// slots [slot, slot+n) where n is the next update's start minus its own
// (the last update's: total minus its start): start is the number of slot
// writes of the updates before it (0 for the first), and total the number
// of slot writes of the table. Slot write i of the table, for i in [0,
// total), is thread i's (grid-stride).
//
// Control block (device memory, CtlSize bytes, zeroed before the first
// launch): {seq u64, done u32, failed u32, skipped u32, dirty u32,
// firstError u64}. seq counts the launches the patcher has run; done is the
// count of its blocks that finished the current launch and dirty whether
// one of them failed or skipped anything (both back to 0 between
// launches).
//
// Mirror (optional, mapped pinned host memory, MirrorSize bytes, zeroed
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
// reading the updates in chunks of kernels.PatchChunk); a slot write whose
// slot is out of range, or that the device runtime refuses, adds one to
// failed and, if firstError is 0, sets it to (i+1)<<32 | the cudaError_t
// code (1 is cudaErrorInvalidValue; with several failures in a launch,
// whichever thread gets there first). Otherwise it applies nothing and adds
// one to skipped. Its last block to finish sets done back to 0 and seq to
// seq+1 and, when there is a mirror, writes failed and skipped to it and
// then seq+1. So the control block advances once per launch, with no host
// call.
//
// # The host's part
//
// For the k-th launch (k from 0) the host writes table k % ntables (the
// updates, then the header: Write or a Writer) when something moves, and
// launches; a launch whose table is not its own moves nothing (and counts
// as skipped). It may rewrite a table only once the launch that read it has
// finished its patcher (ntables launches earlier: the mirror's seq has
// passed it). The mirror's failed counter says whether every update of
// every launch was applied. The launch must be one-dimensional
// (kernels.PatcherConfig).
//
// # The inline table
//
// The inline patcher takes a table of InlineCap updates (InlineSize bytes,
// header first, its seq unused) in its own kernel parameters instead of a
// ring in host memory: Memory.InlineArgs lays them out, SetInlineArgs
// rewrites them in place. A launch applies its table's updates, which the
// next launch applies again unless the host changes them (to an empty
// table, when nothing moves). A failed update counts in the control block
// as above and, with a mirror, the counters go to it; the control block's
// seq and the mirror's are not used.
package patchtable

import (
	encbin "encoding/binary"
	"fmt"

	"github.com/stablegraph/stablegraph/gpu"
)

// lend is the byte order of every record.
var lend = encbin.LittleEndian

// Sizes of the records, in bytes.
const (
	SlotSize   = 24
	HeaderSize = 16
	UpdateSize = 16
	CtlSize    = 32
	MirrorSize = 16
)

// InlineCap is how many updates an inline table holds (SG_PATCH_INLINE in
// kernels/cuda/patcher.cu; kernels.PatchInlineCap), and InlineSize its size.
const (
	InlineCap  = 16
	InlineSize = HeaderSize + UpdateSize*InlineCap
)

// Memory is where one patcher's records are: its arguments.
type Memory struct {
	Ctl    gpu.DevicePtr // the control block
	Slots  gpu.DevicePtr
	NSlots int
	// Tables is the first of NTables tables, Stride bytes apart, of
	// Capacity updates each (Stride).
	Tables   gpu.DevicePtr
	Stride   uint64
	NTables  int
	Capacity int
	// Mirror is the host-mapped mirror of the control block; 0: none.
	Mirror gpu.DevicePtr
}

// Args are the ring patcher's arguments for m (kernels.Patcher: ctl,
// slots, nslots u32, tables, stride u64, ntables u32, capacity u32,
// mirror).
func (m Memory) Args() []gpu.Arg {
	return []gpu.Arg{gpu.Ptr(m.Ctl), gpu.Ptr(m.Slots), gpu.U32(uint32(m.NSlots)), gpu.Ptr(m.Tables), gpu.U64(m.Stride),
		gpu.U32(uint32(m.NTables)), gpu.U32(uint32(m.Capacity)), gpu.Ptr(m.Mirror)}
}

// InlineArgs are the inline patcher's arguments for m (its tables unused)
// and table, InlineSize bytes written like a ring's table (NewWriter; its
// seq is not read).
func (m Memory) InlineArgs(table []byte) []gpu.Arg {
	args := []gpu.Arg{gpu.Ptr(m.Ctl), gpu.Ptr(m.Slots), gpu.U32(uint32(m.NSlots)), gpu.Ptr(m.Mirror)}
	for range InlineSize / 8 {
		args = append(args, gpu.U64(0))
	}
	SetInlineArgs(args, table)
	return args
}

// SetInlineArgs rewrites the table words of inline patcher arguments args
// (from InlineArgs) from table, allocating nothing.
func SetInlineArgs(args []gpu.Arg, table []byte) {
	w := args[len(args)-InlineSize/8:]
	for i := range w {
		w[i].Bits = lend.Uint64(table[8*i:])
	}
}

// Stride is the size of one table of capacity updates.
func Stride(capacity int) uint64 {
	return HeaderSize + UpdateSize*uint64(max(capacity, 0))
}

// Slot is one parameter the patcher may change: 8 bytes at Offset of
// Node's kernel parameters, set to an update's value plus Add.
type Slot struct {
	Node   gpu.DevNode
	Offset uint32
	Add    uint64
}

// EncodeSlots returns slots in the patcher's layout.
func EncodeSlots(slots []Slot) []byte {
	b := make([]byte, SlotSize*len(slots))
	for i, s := range slots {
		PutSlot(b[SlotSize*i:], s)
	}
	return b
}

// PutSlot writes s in the patcher's layout at the start of b (at least
// SlotSize bytes).
func PutSlot(b []byte, s Slot) {
	lend.PutUint64(b, uint64(s.Node))
	lend.PutUint64(b[8:], s.Add)
	lend.PutUint32(b[16:], s.Offset)
	lend.PutUint32(b[20:], 0)
}

// DecodeSlot reads the slot at the start of b (at least SlotSize bytes).
func DecodeSlot(b []byte) Slot {
	return Slot{Node: gpu.DevNode(lend.Uint64(b)), Add: lend.Uint64(b[8:]), Offset: lend.Uint32(b[16:])}
}

// Update sets Count slots from Slot on (0 counts as 1) to Value plus each
// slot's Add.
type Update struct {
	Slot  uint32
	Count uint32
	Value uint64
}

// Write writes one table for the launch numbered seq: updates first, then
// the header, count and total and then seq, so that a patcher reading the
// header never sees a seq whose updates are not written yet. table is the
// table's memory (at least Stride(len(updates)) bytes).
func Write(table []byte, seq uint64, updates []Update) error {
	w := NewWriter(table)
	for i, u := range updates {
		if err := w.Add(u.Slot, max(u.Count, 1), u.Value); err != nil {
			return fmt.Errorf("update %d: %w", i, err)
		}
	}
	w.Seal(seq)
	return nil
}

// Writer writes one table in place, allocating nothing: the per-step path
// of a host that moves ranges of slots. Add the updates, then Seal.
type Writer struct {
	b            []byte
	count, total uint32
}

// NewWriter starts writing table, which keeps its old contents (and
// header) until Seal.
func NewWriter(table []byte) Writer { return Writer{b: table} }

// Add appends an update setting n slots from slot on (n ≥ 1) to value plus
// each slot's add. It fails, writing nothing, when the table is full or the
// table's slot writes would pass 2³²-1.
func (w *Writer) Add(slot, n uint32, value uint64) error {
	off := HeaderSize + UpdateSize*uint64(w.count)
	switch {
	case uint64(len(w.b)) < off+UpdateSize:
		return fmt.Errorf("patch table of %d bytes cannot hold %d updates (%d bytes): %w",
			len(w.b), w.count+1, off+UpdateSize, gpu.ErrInvalidValue)
	case n == 0 || uint64(w.total)+uint64(n) > 1<<32-1:
		return fmt.Errorf("patch update of %d slots after %d: %w", n, w.total, gpu.ErrInvalidValue)
	}
	e := w.b[off : off+UpdateSize]
	lend.PutUint32(e, slot)
	lend.PutUint32(e[4:], w.total)
	lend.PutUint64(e[8:], value)
	w.count++
	w.total += n
	return nil
}

// Updates is the number of updates added.
func (w *Writer) Updates() int { return int(w.count) }

// Writes is the number of slot writes of the updates added.
func (w *Writer) Writes() int { return int(w.total) }

// Seal writes the header for the launch numbered seq: count and total, then
// seq.
func (w *Writer) Seal(seq uint64) {
	lend.PutUint32(w.b[8:], w.count)
	lend.PutUint32(w.b[12:], w.total)
	lend.PutUint64(w.b, seq)
}

// Header is a table's header.
type Header struct {
	Seq          uint64
	Count, Total uint32
}

// DecodeHeader reads the header at the start of b (at least HeaderSize
// bytes).
func DecodeHeader(b []byte) Header {
	return Header{Seq: lend.Uint64(b), Count: lend.Uint32(b[8:]), Total: lend.Uint32(b[12:])}
}

// UpdateAt reads update j of the updates ups (a table's, after its header):
// its first slot, the slot writes before it, and its value.
func UpdateAt(ups []byte, j uint32) (slot, start uint32, value uint64) {
	u := ups[UpdateSize*uint64(j):]
	return lend.Uint32(u), lend.Uint32(u[4:]), lend.Uint64(u[8:])
}

// Ctl is the decoded control block.
type Ctl struct {
	Seq     uint64 // launches run
	Done    uint32 // blocks finished in the current launch; 0 between launches
	Failed  uint32 // slot writes not applied
	Skipped uint32 // launches whose table was not for them (seq mismatch, count > capacity)
	// FirstEntry is the index of the first failed slot write plus one (0:
	// none), FirstCode its cudaError_t.
	FirstEntry uint32
	FirstCode  uint32
}

// DecodeCtl decodes a control block read back from the device.
func DecodeCtl(b []byte) (Ctl, error) {
	if len(b) < CtlSize {
		return Ctl{}, fmt.Errorf("patch control block of %d bytes, want %d: %w", len(b), CtlSize, gpu.ErrInvalidValue)
	}
	first := lend.Uint64(b[24:])
	return Ctl{Seq: lend.Uint64(b), Done: lend.Uint32(b[8:]), Failed: lend.Uint32(b[12:]), Skipped: lend.Uint32(b[16:]),
		FirstEntry: uint32(first >> 32), FirstCode: uint32(first)}, nil
}

// Encode returns c as the device holds it.
func (c Ctl) Encode() []byte {
	b := make([]byte, CtlSize)
	lend.PutUint64(b, c.Seq)
	lend.PutUint32(b[8:], c.Done)
	lend.PutUint32(b[12:], c.Failed)
	lend.PutUint32(b[16:], c.Skipped)
	lend.PutUint64(b[24:], uint64(c.FirstEntry)<<32|uint64(c.FirstCode))
	return b
}

// Mirror is the mirror of a control block as the host reads it.
type Mirror struct {
	Seq             uint64 // launches whose patcher has finished
	Failed, Skipped uint32
}

// ReadMirror reads the mirror at byte off (a multiple of 8) of h without
// synchronizing with the device: seq first, then the counters, which the
// patcher writes before seq, so they are at least those of launch seq.
func ReadMirror(h gpu.HostMem, off int) Mirror {
	seq := h.Load64(off)
	c := h.Load64(off + 8)
	return Mirror{Seq: seq, Failed: uint32(c), Skipped: uint32(c >> 32)}
}

// Encode returns the mirror's two words as the patcher writes them:
// the counters (at byte 8) and seq (at byte 0), in that order.
func (m Mirror) Encode() (counters, seq [8]byte) {
	lend.PutUint64(counters[:], uint64(m.Failed)|uint64(m.Skipped)<<32)
	lend.PutUint64(seq[:], m.Seq)
	return counters, seq
}

// Args are the ring patcher's arguments without a mirror.
func Args(ctl, slots gpu.DevicePtr, nslots int, tables gpu.DevicePtr, stride uint64, ntables, capacity int) []gpu.Arg {
	return Memory{Ctl: ctl, Slots: slots, NSlots: nslots, Tables: tables, Stride: stride, NTables: ntables, Capacity: capacity}.Args()
}
