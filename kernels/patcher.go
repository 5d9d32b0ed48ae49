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

// The patcher moves pointers inside a running graph: it is a kernel,
// normally the graph's root node (gpu.DeviceUpdates.GraphAddRootKernelNode),
// that writes new values into the parameters of device-updatable kernel
// nodes (gpu.DevNode) with the device runtime's cudaGraphKernelNodeSetParam,
// one thread per update, so that the nodes after it run on the new
// addresses in the same launch and the host makes no driver call per step.
// Its CUDA source is cuda/patcher.cu; its Go reference, which the sim runs,
// is refPatcher.
//
// # Memory it reads and writes (all little-endian)
//
// Slots (device memory, written once): the parameters the patcher may
// change, PatchSlotSize bytes each: {node u64 (a gpu.DevNode), offset u32
// (byte offset into the node's kernel parameters), reserved u32}. Every
// update writes 8 bytes at the slot's offset.
//
// Tables (a ring of ntables tables, stride bytes apart, usually in mapped
// pinned host memory that the host writes): each is a PatchHeaderSize-byte
// header {seq u64, count u32, reserved u32} followed by up to capacity
// updates of PatchUpdateSize bytes {slot u32, reserved u32, value u64}.
//
// Control block (device memory, PatchCtlSize bytes, zeroed before the first
// launch): {seq u64, done u32, failed u32, skipped u32, reserved u32,
// firstError u64}. seq counts the launches the patcher has run; done is the
// count of its blocks that finished the current launch (back to 0 between
// launches).
//
// # One launch
//
// The patcher reads seq from the control block and uses table seq %
// ntables. If that table's header says the same seq and count <= capacity,
// it applies the table's count updates, entry i by thread i (grid-stride);
// an update whose slot is out of range, or that the device runtime refuses,
// adds one to failed and, if firstError is 0, sets it to (i+1)<<32 | the
// cudaError_t code (1 is cudaErrorInvalidValue; with several failures in a
// launch, whichever thread gets there first). Otherwise it applies
// nothing and adds one to skipped. Its last block to finish sets done back
// to 0 and seq to seq+1. So the control block advances once per launch,
// with no host call.
//
// # The host's part
//
// For the k-th launch (k from 0) the host writes table k % ntables: the
// updates, then count, then seq = k (WritePatchTable), and launches. It may
// rewrite a table only once the launch that read it has finished (ntables
// launches earlier: a timeline tells). The control block's failed and
// skipped counters say whether every update of every launch was applied.
// The launch must be one-dimensional (PatcherConfig).

// lend is the byte order of every record the patcher reads.
var lend = encbin.LittleEndian

// Patcher is the patcher kernel's name: (ctl, slots, nslots u32, tables,
// stride u64, ntables u32, capacity u32).
const Patcher = "sg_patcher"

// Sizes of the patcher's records, in bytes.
const (
	PatchSlotSize   = 16
	PatchHeaderSize = 16
	PatchUpdateSize = 16
	PatchCtlSize    = 32
)

// cudaErrorInvalidValue is what the patcher records for an update it
// could not apply because the value was refused (device runtime or slot
// range).
const cudaErrorInvalidValue = 1

// PatcherSpec is the patcher's kernel spec.
func PatcherSpec() gpu.KernelSpec {
	return gpu.KernelSpec{Name: Patcher, Params: []gpu.ArgKind{p, p, gpu.ArgU32, p, u64, gpu.ArgU32, gpu.ArgU32}, Ref: refPatcher}
}

// PatcherModule returns the patcher's module image: its spec and, through
// Binary, the prebuilt cubins (the patcher calls the device runtime, so it
// must be linked with cudadevrt when built; it is never JIT-compiled). The
// sim runs its Go reference and needs no binary.
func PatcherModule() *gpu.ModuleImage {
	return &gpu.ModuleImage{Name: "stablegraph-patcher", Kernels: []gpu.KernelSpec{PatcherSpec()}, Binary: PatcherBinary}
}

// PatcherConfig is the patcher's launch for a table capacity: one thread
// per update, in blocks of 128.
func PatcherConfig(capacity int) gpu.LaunchConfig { return gpu.Linear(capacity, 128) }

// PatcherArgs are the patcher's arguments.
func PatcherArgs(ctl, slots gpu.DevicePtr, nslots int, tables gpu.DevicePtr, stride uint64, ntables, capacity int) []gpu.Arg {
	return []gpu.Arg{gpu.Ptr(ctl), gpu.Ptr(slots), gpu.U32(uint32(nslots)), gpu.Ptr(tables), gpu.U64(stride),
		gpu.U32(uint32(ntables)), gpu.U32(uint32(capacity))}
}

// PatchTableStride is the size of one table of capacity updates.
func PatchTableStride(capacity int) uint64 {
	return PatchHeaderSize + PatchUpdateSize*uint64(max(capacity, 0))
}

// PatchSlot is one parameter the patcher may change: 8 bytes at Offset of
// Node's kernel parameters.
type PatchSlot struct {
	Node   gpu.DevNode
	Offset uint32
}

// EncodePatchSlots returns slots in the patcher's layout.
func EncodePatchSlots(slots []PatchSlot) []byte {
	b := make([]byte, PatchSlotSize*len(slots))
	for i, s := range slots {
		lend.PutUint64(b[PatchSlotSize*i:], uint64(s.Node))
		lend.PutUint32(b[PatchSlotSize*i+8:], s.Offset)
	}
	return b
}

// PatchUpdate sets slot Slot to Value.
type PatchUpdate struct {
	Slot  uint32
	Value uint64
}

// WritePatchTable writes one table for the launch numbered seq: updates
// first, then the header, count and then seq, so that a patcher reading the
// header never sees a seq whose updates are not written yet. table is the
// table's memory (at least PatchTableStride(len(updates)) bytes).
func WritePatchTable(table []byte, seq uint64, updates []PatchUpdate) error {
	if need := PatchTableStride(len(updates)); uint64(len(table)) < need {
		return fmt.Errorf("kernels: patch table of %d bytes cannot hold %d updates (%d bytes): %w", len(table), len(updates), need, gpu.ErrInvalidValue)
	}
	for i, u := range updates {
		e := table[PatchHeaderSize+PatchUpdateSize*i:]
		lend.PutUint32(e, u.Slot)
		lend.PutUint32(e[4:], 0)
		lend.PutUint64(e[8:], u.Value)
	}
	lend.PutUint32(table[8:], uint32(len(updates)))
	lend.PutUint32(table[12:], 0)
	lend.PutUint64(table, seq)
	return nil
}

// PatchCtl is the decoded control block.
type PatchCtl struct {
	Seq     uint64 // launches run
	Done    uint32 // blocks finished in the current launch; 0 between launches
	Failed  uint32 // updates not applied
	Skipped uint32 // launches whose table was not for them (seq mismatch, count > capacity)
	// FirstEntry is the index of the first failed update plus one (0:
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

// refPatcher is the patcher's Go reference: one launch as described above,
// run sequentially (so done stays 0). Updates go through the device
// runtime of the backend (gpu.DeviceRuntime); an update it refuses with
// gpu.ErrInvalidValue is counted in failed, as cudaErrorInvalidValue; any
// other error (a fault) ends the kernel.
func refPatcher(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	rt, ok := mem.(gpu.DeviceRuntime)
	if !ok {
		return fmt.Errorf("kernel %s calls the device runtime (cudaGraphKernelNodeSetParam), which this backend does not model: %w", Patcher, gpu.ErrNotSupported)
	}
	g, bl := cfg.Grid, cfg.Block
	if g.Y != 1 || g.Z != 1 || bl.Y != 1 || bl.Z != 1 {
		return fmt.Errorf("kernel %s needs a one-dimensional launch, got grid %v block %v: %w", Patcher, g, bl, gpu.ErrInvalidValue)
	}
	ctlPtr, slots, nslots := a[0].AsPtr(), a[1].AsPtr(), uint64(a[2].AsU32())
	tables, stride, ntables, capacity := a[3].AsPtr(), a[4].AsU64(), uint64(a[5].AsU32()), a[6].AsU32()
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
	seq, count := lend.Uint64(hdr[:]), lend.Uint32(hdr[8:])
	if seq != ctl.Seq || count > capacity {
		ctl.Skipped++
	} else if count > 0 {
		ups := make([]byte, PatchUpdateSize*int(count))
		if err := mem.Read(table.Add(PatchHeaderSize), ups); err != nil {
			return err
		}
		var slot [PatchSlotSize]byte
		for i := range count {
			u := ups[PatchUpdateSize*i:]
			s := uint64(lend.Uint32(u))
			err := fmt.Errorf("kernel %s: update %d names slot %d of %d: %w", Patcher, i, s, nslots, gpu.ErrInvalidValue)
			if s < nslots {
				if err = mem.Read(slots.Add(s*PatchSlotSize), slot[:]); err != nil {
					return err
				}
				node := gpu.DevNode(lend.Uint64(slot[:]))
				err = rt.GraphKernelNodeSetParam(node, uint64(lend.Uint32(slot[8:])), u[8:16])
			}
			if err == nil {
				continue
			}
			if !errors.Is(err, gpu.ErrInvalidValue) {
				return err
			}
			ctl.Failed++
			if ctl.FirstEntry == 0 {
				ctl.FirstEntry, ctl.FirstCode = i+1, cudaErrorInvalidValue
			}
		}
	}
	ctl.Seq++
	ctl.Done = 0
	return mem.Write(ctlPtr, ctl.encode())
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
