package cuda

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"unsafe"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// TestGemmOverStubWithoutCUBLAS runs the GEMM library's checks over the
// stub driver (no GPU), with libcublas missing: bad parameters are
// ErrInvalidValue before the library is needed, good ones
// gpu.ErrNotSupported naming why (the callers' cue for the built-in
// kernels), and Libraries says what was loaded.
func TestGemmOverStubWithoutCUBLAS(t *testing.T) {
	sd := newStubDriver()
	const missing = "/nonexistent/stablegraph-test/libcublas.so.13"
	b, err := openDriver(cu.NewStub("stub-libcuda", sd.call), resolveOptions(Config{LibCUBLAS: missing}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.StreamDestroy(s)
	ok := gpu.GemmParams{C: 1 << 20, A: 2 << 20, B: 3 << 20, Bias: 4 << 20, M: 8, N: 256, K: 256, Alpha: 1}
	bad := ok
	bad.A += 2
	if err := b.Gemm(s, bad); !errors.Is(err, gpu.ErrInvalidValue) || !strings.Contains(err.Error(), "A at") {
		t.Errorf("misaligned A: %v", err)
	}
	if err := b.Gemm(s, ok); !errors.Is(err, gpu.ErrNotSupported) || !strings.Contains(err.Error(), missing) {
		t.Errorf("Gemm without cuBLAS: %v, want ErrNotSupported naming %s", err, missing)
	}
	if err := b.GemmPrepare(0, ok); !errors.Is(err, gpu.ErrNotSupported) {
		t.Errorf("GemmPrepare without cuBLAS: %v", err)
	}
	if err := b.GemmPrepare(1, ok); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("GemmPrepare on device 1 of 1: %v", err)
	}
	props, err := b.DeviceProps(0)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := b.GemmWorkspaceSize(0); err != nil || n != workspaceSize(props.ComputeMajor) || n < 4<<20 {
		t.Errorf("GemmWorkspaceSize = %d, %v", n, err)
	}
	libs := b.Libraries()
	if libs["libcuda"] != "stub-libcuda" || !strings.Contains(libs["cublas"], missing) || !strings.HasPrefix(libs["cublasLt"], "not loaded") {
		t.Errorf("Libraries = %v", libs)
	}
}

// TestGemmKey: a kept choice is per shape, flags, bias, workspace size and
// the alignment class of every pointer, and nothing else.
func TestGemmKey(t *testing.T) {
	p := gpu.GemmParams{C: 0x1000, A: 0x2000, B: 0x3000, M: 8, N: 256, K: 256, Alpha: 1, WorkspaceSize: 1 << 20, Workspace: 0x9000}
	same := p
	same.C, same.A, same.Alpha, same.Beta, same.Workspace = 0x7100, 0x8200, 2, 1, 0xa000 // same classes (256)
	if keyOf(p) != keyOf(same) {
		t.Errorf("keys differ for the same shape and classes: %+v, %+v", keyOf(p), keyOf(same))
	}
	for name, mod := range map[string]func(*gpu.GemmParams){
		"class of C":     func(q *gpu.GemmParams) { q.C += 64 },
		"class of B":     func(q *gpu.GemmParams) { q.B += 16 },
		"bias":           func(q *gpu.GemmParams) { q.Bias = 0x4000 },
		"transposed A":   func(q *gpu.GemmParams) { q.TransA = true },
		"workspace size": func(q *gpu.GemmParams) { q.WorkspaceSize = 0 },
		"shape":          func(q *gpu.GemmParams) { q.K = 128 },
	} {
		q := p
		mod(&q)
		if keyOf(q) == keyOf(p) {
			t.Errorf("%s: same key", name)
		}
	}
}

// TestLibraryKernelLaunchAttributes: a captured library kernel launched
// with thread-block clusters (or cooperatively) cannot be read back as
// KernelParams, which would lose the attribute when the node is made
// again: GraphKernelNodeParams refuses it with gpu.ErrNotSupported, which
// keeps its trace whole (not flattened, not patched). Without the
// attribute it reads back as ArgBytes of the driver's layout.
func TestLibraryKernelLaunchAttributes(t *testing.T) {
	for _, c := range []struct {
		name    string
		attr    cu.LaunchAttributeID
		value   uint32
		refused bool
	}{
		{"plain", 0, 0, false},
		{"cluster", cu.LaunchAttributeClusterDimension, 2, true},
		{"cooperative", cu.LaunchAttributeCooperative, 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			sd := newStubDriver()
			const node, fn = 0x5550, 0x7770
			p0, p1, p2 := make([]byte, 8), make([]byte, 4), make([]byte, 4)
			p0[0], p1[0], p2[0] = 1, 2, 3
			ptrs := []unsafe.Pointer{unsafe.Pointer(&p0[0]), unsafe.Pointer(&p1[0]), unsafe.Pointer(&p2[0])}
			stub := func(name string, a cu.StubArgs) cu.Result {
				switch name {
				case "cuGraphGetNodes": // (graph, nodes, count): one kernel node
					if a.A[1] != 0 {
						*out[uintptr](&a, 1) = node
					}
					*out[uint64](&a, 2) = 1
					return cu.Success
				case "cuGraphNodeGetType":
					*out[cu.GraphNodeType](&a, 1) = cu.GraphNodeKernel
					return cu.Success
				case "cuGraphKernelNodeGetParams_v2":
					kp := out[cu.KernelNodeParams](&a, 1)
					*kp = cu.KernelNodeParams{Func: fn, GridDimX: 1, GridDimY: 1, GridDimZ: 1, BlockDimX: 32, BlockDimY: 1, BlockDimZ: 1,
						KernelParams: unsafe.Pointer(&ptrs[0])}
					return cu.Success
				case "cuGraphKernelNodeGetAttribute": // (node, attr, value)
					v := out[cu.LaunchAttributeValue](&a, 2)
					*v = cu.LaunchAttributeValue{}
					if cu.LaunchAttributeID(a.A[1]) == c.attr {
						binary.LittleEndian.PutUint32(v.Raw()[0:], c.value)
					}
					return cu.Success
				}
				return sd.call(name, a)
			}
			b, err := openDriver(cu.NewStub("stub-libcuda", stub), resolveOptions(Config{}))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			g, err := b.GraphCreate(0)
			if err != nil {
				t.Fatal(err)
			}
			defer b.GraphDestroy(g)
			nodes, err := b.GraphNodes(g)
			if err != nil || len(nodes) != 1 {
				t.Fatalf("GraphNodes = %v, %v", nodes, err)
			}
			kp, err := b.GraphKernelNodeParams(nodes[0])
			if c.refused {
				if !errors.Is(err, gpu.ErrNotSupported) {
					t.Fatalf("GraphKernelNodeParams = %v, want ErrNotSupported", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(kp.Args) != 3 || kp.Args[0].Kind != gpu.ArgBytes || kp.Args[0].Raw[0] != 1 || kp.Args[2].Raw[0] != 3 {
				t.Errorf("params %+v", kp)
			}
		})
	}
}
