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
	"github.com/stablegraph/stablegraph/internal/patchtable"
)

// The patcher moves pointers inside a running graph: it is a kernel node of
// the graph, before the nodes it moves (gpu.DeviceUpdates.GraphAddKernelNodeBefore),
// that writes new values into the parameters of device-updatable kernel
// nodes (gpu.DevNode) with the device runtime's cudaGraphKernelNodeSetParam,
// one thread per parameter, so that the nodes after it run on the new
// addresses in the same launch and the host makes no driver call per step.
// Its CUDA source is cuda/patcher.cu; its Go reference, which the sim runs,
// is refPatcher. What it reads and writes (slots, a ring of tables, its
// control block and mirror) and the host's part of each launch are the
// format of package internal/patchtable, which the device strategy writes.
//
// # The inline patcher
//
// PatcherInline does the same work for a step that moves at most
// PatchInlineCap buffers, with its table in its own kernel parameters
// instead of a ring in host memory: the host writes the updates (a table of
// PatchInlineCap updates, header first, its seq unused) and sets the node's
// parameters with one exec update (gpu.Graphs.GraphExecKernelNodeSetParams),
// which the driver copies at the call, so there is no ring to wait for and
// no read over the bus before the first pointer write. The node itself is
// not device-updatable, so the graph needs no upload after it changes.

// Patcher is the patcher kernel's name: (ctl, slots, nslots u32, tables,
// stride u64, ntables u32, capacity u32, mirror): patchtable.Memory.Args.
const Patcher = "sg_patcher"

// PatcherInline is the inline patcher's name: (ctl, slots, nslots u32,
// mirror, then the table's patchtable.InlineSize bytes as InlineSize/8
// little-endian u64 parameters): patchtable.Memory.InlineArgs.
const PatcherInline = "sg_patcher_inline"

// PatchInlineCap is how many updates an inline patcher's table holds
// (SG_PATCH_INLINE in cuda/patcher.cu): at most this many buffers move
// through the inline patcher.
const PatchInlineCap = patchtable.InlineCap

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
	for range patchtable.InlineSize / 8 {
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

// refPatcher is the patcher's Go reference: one launch as package
// internal/patchtable describes it, run sequentially (so done stays 0),
// reading the updates in chunks and finding each slot write's update by the
// same binary search as the CUDA kernel, so that a malformed table does on
// the sim what it does on a GPU. Updates go through the device runtime of
// the backend (gpu.DeviceRuntime); a slot write it refuses with
// gpu.ErrInvalidValue is counted in failed, as cudaErrorInvalidValue; any
// other error (a fault) ends the kernel.
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
	raw := make([]byte, patchtable.CtlSize)
	if err := mem.Read(ctlPtr, raw); err != nil {
		return err
	}
	ctl, _ := patchtable.DecodeCtl(raw)
	table := tables.Add((ctl.Seq % ntables) * stride)
	var hdr [patchtable.HeaderSize]byte
	if err := mem.Read(table, hdr[:]); err != nil {
		return err
	}
	h := patchtable.DecodeHeader(hdr[:])
	if h.Seq != ctl.Seq || h.Count > capacity {
		ctl.Skipped++
	} else if h.Count > 0 {
		ups := make([]byte, patchtable.UpdateSize*int(h.Count))
		if err := mem.Read(table.Add(patchtable.HeaderSize), ups); err != nil {
			return err
		}
		if err := applyPatchTable(rt, mem, Patcher, slots, nslots, h.Count, h.Total, ups, &ctl); err != nil {
			return err
		}
	}
	ctl.Seq++
	ctl.Done = 0
	if err := mem.Write(ctlPtr, ctl.Encode()); err != nil {
		return err
	}
	if mirror == 0 {
		return nil
	}
	// Two 8-byte stores, the counters first, as the CUDA kernel makes them:
	// a host that sees seq sees counters at least as recent.
	counters, seq := patchtable.Mirror{Seq: ctl.Seq, Failed: ctl.Failed, Skipped: ctl.Skipped}.Encode()
	if err := mem.Write(mirror.Add(8), counters[:]); err != nil {
		return err
	}
	return mem.Write(mirror, seq[:])
}

// applyPatchTable applies the count updates ups (total slot writes) as
// the patcher does, reading them in chunks and finding each slot write's
// update by binary search, counting refused writes in ctl. Any error but a
// refused write (a fault) ends the kernel: it is returned.
func applyPatchTable(rt gpu.DeviceRuntime, mem gpu.Memory, kernel string, slots gpu.DevicePtr, nslots uint64, count, total uint32, ups []byte, ctl *patchtable.Ctl) error {
	start := func(j uint32) uint64 { _, s, _ := patchtable.UpdateAt(ups, j); return uint64(s) }
	var raw [patchtable.SlotSize]byte
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
			slot0, st, value := patchtable.UpdateAt(ups, first+lo)
			s := uint64(slot0) + (i - uint64(st))
			err := fmt.Errorf("kernel %s: slot write %d names slot %d of %d: %w", kernel, i, s, nslots, gpu.ErrInvalidValue)
			if s < nslots {
				if err = mem.Read(slots.Add(s*patchtable.SlotSize), raw[:]); err != nil {
					return err
				}
				slot := patchtable.DecodeSlot(raw[:])
				var v [8]byte
				encbin.LittleEndian.PutUint64(v[:], value+slot.Add)
				err = rt.GraphKernelNodeSetParam(slot.Node, uint64(slot.Offset), v[:])
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
// last arguments applied as refPatcher applies a ring's, failures counted in
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
	table := make([]byte, patchtable.InlineSize)
	for i, w := range a[4:] {
		encbin.LittleEndian.PutUint64(table[8*i:], w.AsU64())
	}
	h := patchtable.DecodeHeader(table)
	count := min(h.Count, PatchInlineCap)
	if count == 0 {
		return nil
	}
	raw := make([]byte, patchtable.CtlSize)
	if err := mem.Read(ctlPtr, raw); err != nil {
		return err
	}
	ctl, _ := patchtable.DecodeCtl(raw)
	failed := ctl.Failed
	if err := applyPatchTable(rt, mem, PatcherInline, slots, nslots, count, h.Total, table[patchtable.HeaderSize:], &ctl); err != nil {
		return err
	}
	if ctl.Failed == failed {
		return nil
	}
	if err := mem.Write(ctlPtr, ctl.Encode()); err != nil {
		return err
	}
	if mirror == 0 {
		return nil
	}
	counters, _ := patchtable.Mirror{Failed: ctl.Failed, Skipped: ctl.Skipped}.Encode()
	return mem.Write(mirror.Add(8), counters[:])
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
