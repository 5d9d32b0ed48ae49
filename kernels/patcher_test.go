package kernels

import (
	"bytes"
	"crypto/sha256"
	encbin "encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/patchtable"
)

// TestPatcherMatchesSource fails when cuda/patcher.cu changed after the
// cubins were built: run kernels/cuda/gen-patcher.sh (needs nvcc) and commit
// kernels/patcher. It skips while the patcher is not built.
func TestPatcherMatchesSource(t *testing.T) {
	rec, err := patcherFS.ReadFile("patcher/SOURCE_SHA256")
	if errors.Is(err, os.ErrNotExist) {
		if len(PatcherArchs()) > 0 {
			t.Fatalf("kernels/patcher has cubins (%v) but no SOURCE_SHA256: rerun kernels/cuda/gen-patcher.sh", PatcherArchs())
		}
		t.Skip("the patcher is not built (kernels/cuda/gen-patcher.sh, on a machine with nvcc)")
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(PatcherArchs()) == 0 {
		t.Fatal("kernels/patcher/SOURCE_SHA256 exists but no cubin does: rerun kernels/cuda/gen-patcher.sh")
	}
	src, err := os.ReadFile("cuda/patcher.cu")
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(rec))
	if len(fields) == 0 {
		t.Fatal("kernels/patcher/SOURCE_SHA256 is empty")
	}
	sum := sha256.Sum256(src)
	if got := hex.EncodeToString(sum[:]); got != fields[0] {
		t.Fatalf("kernels/cuda/patcher.cu has sha256 %s but the cubins were built from %s: "+
			"run kernels/cuda/gen-patcher.sh on a machine with nvcc and commit kernels/patcher", got, fields[0])
	}
	for _, a := range patcherArchs(patcherFS) {
		bin, err := PatcherBinary(a.major, a.minor)
		if err != nil || !bytes.HasPrefix(bin, []byte("\x7fELF")) || !bytes.Contains(bin, []byte(Patcher)) {
			t.Errorf("PatcherBinary(%d, %d) for %s: %d bytes, %v; want an ELF cubin defining %s", a.major, a.minor, a, len(bin), err, Patcher)
		}
	}
}

// TestPatcherSourceSignature checks that patcher.cu defines the kernel with
// the parameter count of its spec, and the record sizes of patcher.go.
func TestPatcherSourceSignature(t *testing.T) {
	src, err := os.ReadFile("cuda/patcher.cu")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`extern "C" __global__ void ` + Patcher + `\(([^)]*)\)`).FindSubmatch(src)
	if m == nil {
		t.Fatalf("cuda/patcher.cu defines no %s", Patcher)
	}
	if got, want := len(strings.Split(string(m[1]), ",")), len(PatcherSpec().Params); got != want {
		t.Errorf("%s has %d parameters in patcher.cu, %d in its spec", Patcher, got, want)
	}
	for name, size := range map[string]int{"sg_patch_slot": patchtable.SlotSize, "sg_patch_header": patchtable.HeaderSize,
		"sg_patch_update": patchtable.UpdateSize, "sg_patch_ctl": patchtable.CtlSize, "sg_patch_mirror": patchtable.MirrorSize} {
		if !bytes.Contains(src, []byte(fmt.Sprintf("static_assert(sizeof(%s) == %d,", name, size))) {
			t.Errorf("patcher.cu does not assert sizeof(%s) == %d", name, size)
		}
	}
	mi := regexp.MustCompile(`extern "C" __global__ void ` + PatcherInline + `\(([^)]*)\)`).FindSubmatch(src)
	if mi == nil {
		t.Fatalf("cuda/patcher.cu defines no %s", PatcherInline)
	}
	if got, want := len(strings.Split(string(mi[1]), ",")), len(PatcherInlineSpec().Params); got != want {
		t.Errorf("%s has %d parameters in patcher.cu, %d in its spec", PatcherInline, got, want)
	}
	if !bytes.Contains(src, []byte(fmt.Sprintf("#define SG_PATCH_INLINE %d\n", PatchInlineCap))) {
		t.Errorf("patcher.cu does not define SG_PATCH_INLINE as PatchInlineCap (%d)", PatchInlineCap)
	}
	if !bytes.Contains(src, []byte(fmt.Sprintf("#define SG_PATCH_CHUNK %d\n", PatchChunk))) {
		t.Errorf("patcher.cu does not define SG_PATCH_CHUNK as PatchChunk (%d)", PatchChunk)
	}
}

func TestPatcherBinaryPicksArchitecture(t *testing.T) {
	if _, err := patcherBinary(fstest.MapFS{"patcher/README.md": {Data: []byte("x")}}, 9, 0); !errors.Is(err, gpu.ErrNotSupported) ||
		!strings.Contains(err.Error(), "not built") {
		t.Errorf("no cubins: %v, want a 'not built' ErrNotSupported", err)
	}
	fsys := fstest.MapFS{
		"patcher/README.md":     {Data: []byte("x")},
		"patcher/SOURCE_SHA256": {Data: []byte("abc  patcher.cu")},
		"patcher/sm_80.cubin":   {Data: []byte("80")},
		"patcher/sm_86.cubin":   {Data: []byte("86")},
		"patcher/sm_90.cubin":   {Data: []byte("90")},
		"patcher/sm_120.cubin":  {Data: []byte("120")},
		"patcher/sm_9x.cubin":   {Data: []byte("junk")},
	}
	for _, c := range []struct {
		major, minor int
		want         string
	}{{8, 0, "80"}, {8, 6, "86"}, {8, 9, "86"}, {9, 0, "90"}, {12, 0, "120"}, {12, 1, "120"}} {
		got, err := patcherBinary(fsys, c.major, c.minor)
		if err != nil || string(got) != c.want {
			t.Errorf("compute %d.%d: %q, %v; want the sm_%s cubin", c.major, c.minor, got, err, c.want)
		}
	}
	for _, cc := range [][2]int{{7, 5}, {10, 0}} {
		_, err := patcherBinary(fsys, cc[0], cc[1])
		want := fmt.Sprintf("compute capability %d.%d (built for sm_80, sm_86, sm_90, sm_120)", cc[0], cc[1])
		if !errors.Is(err, gpu.ErrNotSupported) || !strings.Contains(err.Error(), want) {
			t.Errorf("compute %d.%d: %v, want ErrNotSupported naming %q", cc[0], cc[1], err, want)
		}
	}
}

// fakeDevice is device memory in a map of allocations plus a device runtime
// whose nodes are parameter buffers.
type fakeDevice struct {
	mem     map[gpu.DevicePtr][]byte
	next    gpu.DevicePtr
	params  map[gpu.DevNode][]byte
	refuse  map[gpu.DevNode]bool  // SetParam returns ErrInvalidValue
	fault   map[gpu.DevNode]error // SetParam returns this
	setLogs []string
}

func newFakeDevice() *fakeDevice {
	return &fakeDevice{mem: map[gpu.DevicePtr][]byte{}, next: 1 << 20, params: map[gpu.DevNode][]byte{},
		refuse: map[gpu.DevNode]bool{}, fault: map[gpu.DevNode]error{}}
}

func (d *fakeDevice) alloc(b []byte) gpu.DevicePtr {
	p := d.next
	d.mem[p] = append([]byte(nil), b...)
	d.next += gpu.DevicePtr(gpu.RoundUp(uint64(len(b)), 256) + 256)
	return p
}

func (d *fakeDevice) find(p gpu.DevicePtr, n int) ([]byte, error) {
	for base, b := range d.mem {
		if p >= base && uint64(p-base)+uint64(n) <= uint64(len(b)) {
			return b[p-base : uint64(p-base)+uint64(n)], nil
		}
	}
	return nil, &gpu.FaultError{Kernel: Patcher, Addr: p, Size: uint64(n), Reason: "unmapped"}
}

func (d *fakeDevice) Read(p gpu.DevicePtr, dst []byte) error {
	b, err := d.find(p, len(dst))
	if err == nil {
		copy(dst, b)
	}
	return err
}

func (d *fakeDevice) Write(p gpu.DevicePtr, src []byte) error {
	b, err := d.find(p, len(src))
	if err == nil {
		copy(b, src)
	}
	return err
}

func (d *fakeDevice) GraphKernelNodeSetParam(n gpu.DevNode, off uint64, v []byte) error {
	if err := d.fault[n]; err != nil {
		return err
	}
	pb, ok := d.params[n]
	if !ok || d.refuse[n] || off+uint64(len(v)) > uint64(len(pb)) {
		return gpu.Errorf("cudaGraphKernelNodeSetParam", gpu.ErrInvalidValue, "refused")
	}
	copy(pb[off:], v)
	d.setLogs = append(d.setLogs, fmt.Sprintf("%d@%d", n, off))
	return nil
}

// lend is the byte order of the patcher's records.
var lend = encbin.LittleEndian

// memOnly hides the device runtime.
type memOnly struct{ gpu.Memory }

type patchRig struct {
	d                  *fakeDevice
	ctl, slots, tables gpu.DevicePtr
	mirror             gpu.DevicePtr // 0: none
	nslots, ntables    int
	capacity           int
	stride             uint64
}

func newPatchRig(t *testing.T, nodes int, ntables, capacity int) *patchRig {
	t.Helper()
	d := newFakeDevice()
	var slots []patchtable.Slot
	for i := 1; i <= nodes; i++ {
		d.params[gpu.DevNode(i)] = make([]byte, 24)
		slots = append(slots, patchtable.Slot{Node: gpu.DevNode(i), Offset: 0}, patchtable.Slot{Node: gpu.DevNode(i), Offset: 8})
	}
	r := &patchRig{d: d, nslots: len(slots), ntables: ntables, capacity: capacity, stride: patchtable.Stride(capacity)}
	r.ctl = d.alloc(make([]byte, patchtable.CtlSize))
	r.slots = d.alloc(patchtable.EncodeSlots(slots))
	r.tables = d.alloc(make([]byte, int(r.stride)*ntables))
	return r
}

func (r *patchRig) write(t *testing.T, seq uint64, ups []patchtable.Update) {
	t.Helper()
	tb, err := r.d.find(r.tables.Add(uint64(seq%uint64(r.ntables))*r.stride), int(r.stride))
	if err != nil {
		t.Fatal(err)
	}
	if err := patchtable.Write(tb, seq, ups); err != nil {
		t.Fatal(err)
	}
}

func (r *patchRig) run(mem gpu.Memory, cfg gpu.LaunchConfig) error {
	return refPatcher(mem, cfg, patchtable.Memory{Ctl: r.ctl, Slots: r.slots, NSlots: r.nslots, Tables: r.tables, Stride: r.stride,
		NTables: r.ntables, Capacity: r.capacity, Mirror: r.mirror}.Args())
}

func (r *patchRig) ctlState(t *testing.T) patchtable.Ctl {
	t.Helper()
	b := make([]byte, patchtable.CtlSize)
	if err := r.d.Read(r.ctl, b); err != nil {
		t.Fatal(err)
	}
	c, err := patchtable.DecodeCtl(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (r *patchRig) param(n int, off int) uint64 { return lend.Uint64(r.d.params[gpu.DevNode(n)][off:]) }

func TestRefPatcherAppliesRing(t *testing.T) {
	r := newPatchRig(t, 3, 2, 8)
	cfg := PatcherConfig(r.capacity)
	// Launch k moves node 1's first pointer and node 3's second to 100k+n.
	for k := uint64(0); k < 5; k++ {
		r.write(t, k, []patchtable.Update{{Slot: 0, Value: 100*k + 1}, {Slot: 5, Value: 100*k + 3}})
		if err := r.run(r.d, cfg); err != nil {
			t.Fatalf("launch %d: %v", k, err)
		}
		if got := r.param(1, 0); got != 100*k+1 {
			t.Errorf("launch %d: node 1 offset 0 = %d, want %d", k, got, 100*k+1)
		}
		if got := r.param(3, 8); got != 100*k+3 {
			t.Errorf("launch %d: node 3 offset 8 = %d, want %d", k, got, 100*k+3)
		}
		if got := r.param(2, 0) | r.param(2, 8) | r.param(1, 8) | r.param(3, 0); got != 0 {
			t.Errorf("launch %d: a slot not in the table changed", k)
		}
		if c := r.ctlState(t); c != (patchtable.Ctl{Seq: k + 1}) {
			t.Errorf("launch %d: control block %+v", k, c)
		}
	}
	// An empty table applies nothing and still advances.
	r.write(t, 5, nil)
	if err := r.run(r.d, cfg); err != nil || r.ctlState(t) != (patchtable.Ctl{Seq: 6}) || r.param(1, 0) != 401 {
		t.Errorf("empty table: %v, %+v", err, r.ctlState(t))
	}
}

func TestRefPatcherSkipsStaleTables(t *testing.T) {
	r := newPatchRig(t, 2, 2, 4)
	cfg := PatcherConfig(r.capacity)
	r.write(t, 0, []patchtable.Update{{Slot: 0, Value: 7}})
	if err := r.run(r.d, cfg); err != nil {
		t.Fatal(err)
	}
	// Launch 1 finds table 1 written for launch 3: nothing applied.
	r.write(t, 3, []patchtable.Update{{Slot: 0, Value: 9}})
	if err := r.run(r.d, cfg); err != nil {
		t.Fatal(err)
	}
	if c := r.ctlState(t); c != (patchtable.Ctl{Seq: 2, Skipped: 1}) || r.param(1, 0) != 7 {
		t.Errorf("stale table: %+v, node 1 = %d (want 7, untouched)", c, r.param(1, 0))
	}
	// Launch 2: a count past the capacity is not trusted either.
	tb, _ := r.d.find(r.tables, int(r.stride))
	if err := patchtable.Write(tb, 2, []patchtable.Update{{Slot: 0, Value: 11}}); err != nil {
		t.Fatal(err)
	}
	lend.PutUint32(tb[8:], uint32(r.capacity+1))
	if err := r.run(r.d, cfg); err != nil {
		t.Fatal(err)
	}
	if c := r.ctlState(t); c != (patchtable.Ctl{Seq: 3, Skipped: 2}) || r.param(1, 0) != 7 {
		t.Errorf("count past capacity: %+v, node 1 = %d", c, r.param(1, 0))
	}
}

func TestRefPatcherCountsRefusedUpdates(t *testing.T) {
	r := newPatchRig(t, 3, 1, 8)
	r.d.refuse[2] = true
	r.write(t, 0, []patchtable.Update{{Slot: 0, Value: 1}, {Slot: 2, Value: 2}, {Slot: 99, Value: 3}, {Slot: 4, Value: 4}})
	if err := r.run(r.d, PatcherConfig(r.capacity)); err != nil {
		t.Fatal(err)
	}
	want := patchtable.Ctl{Seq: 1, Failed: 2, FirstEntry: 2, FirstCode: cudaErrorInvalidValue}
	if c := r.ctlState(t); c != want {
		t.Errorf("control block %+v, want %+v", c, want)
	}
	if r.param(1, 0) != 1 || r.param(3, 0) != 4 || r.param(2, 0) != 0 {
		t.Errorf("the valid updates must apply around the refused ones: %d %d %d", r.param(1, 0), r.param(3, 0), r.param(2, 0))
	}
}

func TestRefPatcherErrors(t *testing.T) {
	r := newPatchRig(t, 1, 1, 4)
	r.write(t, 0, []patchtable.Update{{Slot: 0, Value: 1}})
	cfg := PatcherConfig(r.capacity)
	if err := r.run(memOnly{r.d}, cfg); !errors.Is(err, gpu.ErrNotSupported) {
		t.Errorf("memory without a device runtime: %v, want ErrNotSupported", err)
	}
	twoD := cfg
	twoD.Grid.Y = 2
	if err := r.run(r.d, twoD); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("2-D launch: %v", err)
	}
	r.d.fault[1] = &gpu.FaultError{Kernel: Patcher, Addr: 1, Size: 8, Reason: "unmapped"}
	if err := r.run(r.d, cfg); !errors.Is(err, gpu.ErrIllegalAddress) {
		t.Errorf("a fault in the device runtime must end the kernel: %v", err)
	}
	args := patchtable.Args(r.ctl, r.slots, r.nslots, r.tables, r.stride, 0, r.capacity)
	if err := refPatcher(r.d, cfg, args); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("zero tables: %v", err)
	}
	args = patchtable.Args(0x10, r.slots, r.nslots, r.tables, r.stride, 1, r.capacity)
	if err := refPatcher(r.d, cfg, args); !errors.Is(err, gpu.ErrIllegalAddress) {
		t.Errorf("unmapped control block: %v", err)
	}
	if c := r.ctlState(t); c.Seq != 0 {
		t.Errorf("failed launches advanced the control block: %+v", c)
	}
}

func TestPatcherModule(t *testing.T) {
	m := PatcherModule()
	k, ok := m.Kernel(Patcher)
	if !ok || k.Ref == nil || m.Code == nil {
		t.Fatalf("PatcherModule = %+v", m)
	}
	if err := k.CheckArgs("test", patchtable.Args(1, 2, 3, 4, 5, 6, 7)); err != nil {
		t.Errorf("patchtable.Args do not match the spec: %v", err)
	}
	for _, tc := range []struct{ writes, grid, block int }{
		{0, 1, 32}, {1, 1, 32}, {33, 1, 64}, {1000, 1, 1024}, {2048, 1, 1024}, {2049, 3, 1024}, {5000, 5, 1024},
	} {
		c := PatcherConfig(tc.writes)
		if int(c.Grid.X) != tc.grid || int(c.Block.X) != tc.block || c.Grid.Y != 1 || c.Grid.Z != 1 || c.Block.Y != 1 || c.Block.Z != 1 {
			t.Errorf("PatcherConfig(%d) = %+v, want grid %d, block %d", tc.writes, c, tc.grid, tc.block)
		}
		if threads := int(c.Grid.X * c.Block.X); threads*2 < tc.writes {
			t.Errorf("PatcherConfig(%d): %d threads, more than two writes each", tc.writes, threads)
		}
	}
	if _, err := m.Code(gpu.Target{Format: gpu.CodeCubin, Major: 9}); err != nil && !errors.Is(err, gpu.ErrNotSupported) {
		t.Errorf("Code(cubin for 9.0): %v", err)
	}
	// Never as PTX: the patcher links the device runtime.
	if _, err := m.Code(gpu.Target{Format: gpu.CodePTX, Major: 9}); !errors.Is(err, gpu.ErrNotSupported) {
		t.Errorf("Code(ptx): %v, want ErrNotSupported", err)
	}
}

// TestRefPatcherRanges: one update moves a range of slots, each to the
// value plus its own add; the ranges of a table follow one another.
func TestRefPatcherRanges(t *testing.T) {
	d := newFakeDevice()
	const nodes = 5
	var slots []patchtable.Slot
	for i := 1; i <= nodes; i++ {
		d.params[gpu.DevNode(i)] = make([]byte, 16)
		slots = append(slots, patchtable.Slot{Node: gpu.DevNode(i), Offset: 0, Add: uint64(100 * i)}, patchtable.Slot{Node: gpu.DevNode(i), Offset: 8, Add: 0})
	}
	r := &patchRig{d: d, nslots: len(slots), ntables: 1, capacity: 4, stride: patchtable.Stride(4)}
	r.ctl = d.alloc(make([]byte, patchtable.CtlSize))
	r.slots = d.alloc(patchtable.EncodeSlots(slots))
	r.tables = d.alloc(make([]byte, r.stride))
	r.mirror = d.alloc(make([]byte, patchtable.MirrorSize))
	// Slots 0..3 (nodes 1 and 2), then slot 6 (node 4's first), then 8..9.
	r.write(t, 0, []patchtable.Update{{Slot: 0, Count: 4, Value: 1 << 20}, {Slot: 6, Value: 2 << 20}, {Slot: 8, Count: 2, Value: 3 << 20}})
	if err := r.run(r.d, PatcherConfig(len(slots))); err != nil {
		t.Fatal(err)
	}
	want := map[[2]int]uint64{{1, 0}: 1<<20 + 100, {1, 8}: 1 << 20, {2, 0}: 1<<20 + 200, {2, 8}: 1 << 20,
		{3, 0}: 0, {3, 8}: 0, {4, 0}: 2<<20 + 400, {4, 8}: 0, {5, 0}: 3<<20 + 500, {5, 8}: 3 << 20}
	for k, v := range want {
		if got := r.param(k[0], k[1]); got != v {
			t.Errorf("node %d offset %d = %#x, want %#x", k[0], k[1], got, v)
		}
	}
	if c := r.ctlState(t); c != (patchtable.Ctl{Seq: 1}) {
		t.Errorf("control block %+v", c)
	}
	mir := make([]byte, patchtable.MirrorSize)
	if err := d.Read(r.mirror, mir); err != nil {
		t.Fatal(err)
	}
	if m := patchtable.ReadMirror(gpu.HostMem{Bytes: mir}, 0); m != (patchtable.Mirror{Seq: 1}) {
		t.Errorf("mirror %+v, want seq 1", m)
	}
	// A range past the last slot: the writes inside apply, the others fail,
	// counted in the control block and its mirror.
	r.write(t, 1, []patchtable.Update{{Slot: 8, Count: 4, Value: 4 << 20}})
	if err := r.run(r.d, PatcherConfig(len(slots))); err != nil {
		t.Fatal(err)
	}
	if got := r.param(5, 0); got != 4<<20+500 {
		t.Errorf("in-range write of a range that overruns: %#x", got)
	}
	wantCtl := patchtable.Ctl{Seq: 2, Failed: 2, FirstEntry: 3, FirstCode: cudaErrorInvalidValue}
	if c := r.ctlState(t); c != wantCtl {
		t.Errorf("control block %+v, want %+v", c, wantCtl)
	}
	if err := d.Read(r.mirror, mir); err != nil {
		t.Fatal(err)
	}
	if m := patchtable.ReadMirror(gpu.HostMem{Bytes: mir}, 0); m != (patchtable.Mirror{Seq: 2, Failed: 2}) {
		t.Errorf("mirror %+v, want seq 2, 2 failed", m)
	}
}

// TestRefPatcherChunks: a table of more updates than one chunk applies
// every slot write once, across the chunk boundaries.
func TestRefPatcherChunks(t *testing.T) {
	const nodes = PatchChunk + 50 // 2(PatchChunk+50) slots
	r := newPatchRig(t, nodes, 2, 2*nodes)
	var ups []patchtable.Update
	for i := 0; i < 2*nodes; i += 2 { // one node's slots each: both, or the first
		ups = append(ups, patchtable.Update{Slot: uint32(i), Count: uint32(1 + (i/2)%2), Value: uint64(1000 + i)})
	}
	if len(ups) <= PatchChunk {
		t.Fatalf("%d updates: not more than a chunk", len(ups))
	}
	r.write(t, 0, ups)
	if err := r.run(r.d, PatcherConfig(2*nodes)); err != nil {
		t.Fatal(err)
	}
	set := 0
	for _, u := range ups {
		for k := uint32(0); k < u.Count; k++ {
			s := int(u.Slot + k)
			if got := r.param(s/2+1, 8*(s%2)); got != u.Value {
				t.Fatalf("slot %d = %d, want %d", s, got, u.Value)
			}
			set++
		}
	}
	if len(r.d.setLogs) != set {
		t.Errorf("%d slot writes for %d slots in the table", len(r.d.setLogs), set)
	}
	if c := r.ctlState(t); c != (patchtable.Ctl{Seq: 1}) {
		t.Errorf("control block %+v", c)
	}
}

// TestRefPatcherMalformedTable: starts that go backwards leave the writes
// they skip unapplied and fault nothing; the launch still advances.
func TestRefPatcherMalformedTable(t *testing.T) {
	r := newPatchRig(t, 2, 1, 4)
	tb, err := r.d.find(r.tables, int(r.stride))
	if err != nil {
		t.Fatal(err)
	}
	w := patchtable.NewWriter(tb)
	for _, v := range []uint64{1, 2} {
		if err := w.Add(uint32(v-1), 1, v); err != nil {
			t.Fatal(err)
		}
	}
	w.Seal(0)
	lend.PutUint32(tb[patchtable.HeaderSize+4:], 5) // the first update starts past the total
	if err := r.run(r.d, PatcherConfig(4)); err != nil {
		t.Fatal(err)
	}
	if r.param(1, 0) != 0 || r.param(1, 8) != 0 {
		t.Errorf("a table whose first start passes its total applied something: %d %d", r.param(1, 0), r.param(1, 8))
	}
	if c := r.ctlState(t); c != (patchtable.Ctl{Seq: 1}) {
		t.Errorf("control block %+v", c)
	}
}

// TestRefPatcherInline: the inline patcher applies the table in its own
// arguments (ranges, adds), leaves the control block alone while every
// write applies, applies nothing for an empty table, and counts refused
// writes in the control block and the mirror's counters (not its seq).
func TestRefPatcherInline(t *testing.T) {
	d := newFakeDevice()
	const nodes = 5
	var slots []patchtable.Slot
	for i := 1; i <= nodes; i++ {
		d.params[gpu.DevNode(i)] = make([]byte, 16)
		slots = append(slots, patchtable.Slot{Node: gpu.DevNode(i), Offset: 0, Add: uint64(100 * i)}, patchtable.Slot{Node: gpu.DevNode(i), Offset: 8})
	}
	m := patchtable.Memory{Ctl: d.alloc(make([]byte, patchtable.CtlSize)), Slots: d.alloc(patchtable.EncodeSlots(slots)), NSlots: len(slots),
		Mirror: d.alloc(make([]byte, patchtable.MirrorSize))}
	table := make([]byte, patchtable.InlineSize)
	run := func(ups []patchtable.Update) error {
		if err := patchtable.Write(table, 0, ups); err != nil {
			t.Fatal(err)
		}
		args := m.InlineArgs(table)
		if err := PatcherInlineSpec().CheckArgs("test", args); err != nil {
			t.Fatal(err)
		}
		return refPatcherInline(d, PatcherConfig(len(slots)), args)
	}
	if err := run([]patchtable.Update{{Slot: 0, Count: 4, Value: 1 << 20}, {Slot: 6, Value: 2 << 20}, {Slot: 8, Count: 2, Value: 3 << 20}}); err != nil {
		t.Fatal(err)
	}
	want := map[[2]int]uint64{{1, 0}: 1<<20 + 100, {1, 8}: 1 << 20, {2, 0}: 1<<20 + 200, {2, 8}: 1 << 20,
		{3, 0}: 0, {3, 8}: 0, {4, 0}: 2<<20 + 400, {4, 8}: 0, {5, 0}: 3<<20 + 500, {5, 8}: 3 << 20}
	check := func(what string) {
		t.Helper()
		for k, v := range want {
			if got := lend.Uint64(d.params[gpu.DevNode(k[0])][k[1]:]); got != v {
				t.Errorf("%s: node %d offset %d = %#x, want %#x", what, k[0], k[1], got, v)
			}
		}
	}
	check("ranges")
	ctl := func() patchtable.Ctl {
		b := make([]byte, patchtable.CtlSize)
		if err := d.Read(m.Ctl, b); err != nil {
			t.Fatal(err)
		}
		c, _ := patchtable.DecodeCtl(b)
		return c
	}
	if c := ctl(); c != (patchtable.Ctl{}) {
		t.Errorf("control block %+v after writes that all applied, want untouched", c)
	}
	if err := run(nil); err != nil {
		t.Fatal(err)
	}
	check("an empty table")
	// A range past the last slot: the writes inside apply, the others fail.
	if err := run([]patchtable.Update{{Slot: 8, Count: 4, Value: 4 << 20}}); err != nil {
		t.Fatal(err)
	}
	if got := lend.Uint64(d.params[5][0:]); got != 4<<20+500 {
		t.Errorf("in-range write of a range that overruns: %#x", got)
	}
	if c, want := ctl(), (patchtable.Ctl{Failed: 2, FirstEntry: 3, FirstCode: cudaErrorInvalidValue}); c != want {
		t.Errorf("control block %+v, want %+v", c, want)
	}
	mir := make([]byte, patchtable.MirrorSize)
	if err := d.Read(m.Mirror, mir); err != nil {
		t.Fatal(err)
	}
	if got := patchtable.ReadMirror(gpu.HostMem{Bytes: mir}, 0); got != (patchtable.Mirror{Failed: 2}) {
		t.Errorf("mirror %+v, want 2 failed", got)
	}
}
