package gputest

import (
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/kernels"
)

// Mutation tests: each mutant wraps sim with one deliberate bug, and the
// suite must fail the subtests named for it. They prove the suite detects
// the bugs it claims to, rather than passing whatever it is given. Each
// mutant runs in a child process (this test binary, re-run with
// GPUTEST_MUTANT set) because a failing subtest cannot be contained in-process.

// mutant embeds a backend and overrides one method with a bug.
type mutant struct {
	name   string
	detect []string // subtests that must fail, "Group/Test"
	wrap   func(b *sim.Backend) gpu.Backend
}

type waitIgnored struct{ gpu.Backend }

func (waitIgnored) StreamWaitEvent(gpu.Stream, gpu.Event) error { return nil }

type queryAlwaysIdle struct{ gpu.Backend }

func (queryAlwaysIdle) StreamQuery(gpu.Stream) (bool, error) { return true, nil }

type memsetEager struct{ gpu.Backend }

func (m memsetEager) MemsetAsync(p gpu.Memset, _ gpu.Stream) error { return m.Backend.Memset(p) }

type updateIgnored struct{ gpu.Backend }

func (updateIgnored) GraphExecUpdate(gpu.GraphExec, gpu.Graph) error { return nil }

type freeRoundsDown struct{ gpu.Backend }

func (m freeRoundsDown) MemFree(p gpu.DevicePtr) error { return m.Backend.MemFree(p &^ 0xff) }

type nodeSetIgnored struct{ gpu.Backend }

func (nodeSetIgnored) GraphExecMemsetNodeSetParams(gpu.GraphExec, gpu.GraphNode, gpu.Memset) error {
	return nil
}

type paramsUntyped struct{ gpu.Backend }

func (m paramsUntyped) GraphKernelNodeParams(n gpu.GraphNode) (gpu.KernelParams, error) {
	p, err := m.Backend.GraphKernelNodeParams(n)
	for i, a := range p.Args {
		b := make([]byte, a.Size())
		a.Encode(b)
		p.Args[i] = gpu.Bytes(b)
	}
	return p, err
}

// gemmTransBIgnored loads a module whose gemm reads B untransposed: a PTX
// bug of the kind the kernel tests exist to catch.
type gemmTransBIgnored struct{ gpu.Backend }

func (m gemmTransBIgnored) ModuleLoad(dev int, img *gpu.ModuleImage) (gpu.Module, error) {
	if img != nil {
		img2 := *img
		img2.Kernels = nil
		for _, k := range img.Kernels {
			if k.Name == kernels.Gemm {
				ref := k.Ref
				k.Ref = func(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
					a = append([]gpu.Arg(nil), a...)
					a[7] = gpu.I32(0)
					return ref(mem, cfg, a)
				}
			}
			img2.Kernels = append(img2.Kernels, k)
		}
		img = &img2
	}
	return m.Backend.ModuleLoad(dev, img)
}

// refusalAsInvalid reports a refused child-graph update as bad input, as
// the CUDA backend did before refusals were mapped: callers then fail the
// step instead of re-recording.
type refusalAsInvalid struct{ gpu.Backend }

func (m refusalAsInvalid) GraphExecChildGraphNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, c gpu.Graph) error {
	err := m.Backend.GraphExecChildGraphNodeSetParams(x, n, c)
	if errors.Is(err, gpu.ErrGraphUpdate) {
		return gpu.Errorf("cuGraphExecChildGraphNodeSetParams", gpu.ErrInvalidValue, "CUDA_ERROR_INVALID_VALUE")
	}
	return err
}

// extentRounded reports allocations rounded up to 512 bytes, as a driver
// that rounds them would, so that small overruns pass.
type extentRounded struct{ *sim.Backend }

func (m extentRounded) AddressRange(p gpu.DevicePtr) (gpu.DevicePtr, uint64, error) {
	base, size, err := m.Backend.AddressRange(p)
	return base, gpu.RoundUp(size, 512), err
}

// extentStale caches every answer by address and never forgets one.
type extentStale struct {
	*sim.Backend
	mu    sync.Mutex
	known map[gpu.DevicePtr][2]uint64
}

func (m *extentStale) AddressRange(p gpu.DevicePtr) (gpu.DevicePtr, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.known[p]; ok {
		return gpu.DevicePtr(e[0]), e[1], nil
	}
	base, size, err := m.Backend.AddressRange(p)
	if err == nil {
		m.known[p] = [2]uint64{uint64(base), size}
	}
	return base, size, err
}

// argsMutated loads a module whose kernel named kernel gets its arguments
// through change first: a wrong argument in device code (a swapped cache,
// a dropped scale) that the kernel cases must catch.
type argsMutated struct {
	gpu.Backend
	kernel string
	change func(a []gpu.Arg)
}

func (m argsMutated) ModuleLoad(dev int, img *gpu.ModuleImage) (gpu.Module, error) {
	if img != nil {
		img2 := *img
		img2.Kernels = nil
		for _, k := range img.Kernels {
			if k.Name == m.kernel {
				ref := k.Ref
				k.Ref = func(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
					a = append([]gpu.Arg(nil), a...)
					m.change(a)
					return ref(mem, cfg, a)
				}
			}
			img2.Kernels = append(img2.Kernels, k)
		}
		img = &img2
	}
	return m.Backend.ModuleLoad(dev, img)
}

var mutants = []mutant{
	{"wait-ignored", []string{"Streams/WaitEvent", "Streams/WaitEventCrossDevice"},
		func(b *sim.Backend) gpu.Backend { return waitIgnored{b} }},
	{"query-always-idle", []string{"Streams/QueryBusyIdle"},
		func(b *sim.Backend) gpu.Backend { return queryAlwaysIdle{b} }},
	{"memset-async-eager", []string{"Memory/CopyAsyncOrdered"},
		func(b *sim.Backend) gpu.Backend { return memsetEager{b} }},
	{"exec-update-ignored", []string{"ExecUpdate/WholeGraph", "ExecUpdate/WholeGraphFromCapture", "ExecUpdate/Refused"},
		func(b *sim.Backend) gpu.Backend { return updateIgnored{b} }},
	{"free-rounds-down", []string{"Memory/AllocFree"},
		func(b *sim.Backend) gpu.Backend { return freeRoundsDown{b} }},
	{"memset-node-update-ignored", []string{"ExecUpdate/NodeSetParams", "ExecUpdate/NodeSetParamsErrors"},
		func(b *sim.Backend) gpu.Backend { return nodeSetIgnored{b} }},
	{"kernel-params-untyped", []string{"Graphs/BuildInspectLaunch", "Capture/KernelMemcpyMemset"},
		func(b *sim.Backend) gpu.Backend { return paramsUntyped{b} }},
	{"node-refusal-as-invalid-value", []string{"ExecUpdate/NodeSetParamsErrors", "ExecUpdate/NodeRefused"},
		func(b *sim.Backend) gpu.Backend { return refusalAsInvalid{b} }},
	{"extent-rounded", []string{"Extents/Alloc", "Extents/CheckBinding"},
		func(b *sim.Backend) gpu.Backend { return extentRounded{b} }},
	{"extent-stale", []string{"Extents/Freed", "Extents/VirtualMemory"},
		func(b *sim.Backend) gpu.Backend {
			return &extentStale{Backend: b, known: map[gpu.DevicePtr][2]uint64{}}
		}},
	{"gemm-transB-ignored", []string{"Kernels/sg_gemm_NT_beta0", "Kernels/sg_gemm_TT_beta0.75", "Kernels/sg_gemm_thin"},
		func(b *sim.Backend) gpu.Backend { return gemmTransBIgnored{b} }},
	{"attention-caches-swapped", []string{"Kernels/sg_decode_attention_3seq", "Kernels/sg_decode_attention_8seq"},
		func(b *sim.Backend) gpu.Backend {
			return argsMutated{b, kernels.DecodeAttention, func(a []gpu.Arg) { a[3], a[4] = a[4], a[3] }}
		}},
	{"attention-scale-ignored", []string{"Kernels/sg_decode_attention_1seq", "Kernels/sg_decode_attention_8seq"},
		func(b *sim.Backend) gpu.Backend {
			return argsMutated{b, kernels.DecodeAttention, func(a []gpu.Arg) { a[17] = gpu.F32(1) }}
		}},
	{"kv-append-caches-swapped", []string{"Kernels/sg_kv_append_3seq", "Kernels/sg_kv_append_8seq"},
		func(b *sim.Backend) gpu.Backend {
			return argsMutated{b, kernels.KVAppend, func(a []gpu.Arg) { a[4], a[5] = a[5], a[4] }}
		}},
	{"layernorm-eps-wrong", []string{"Kernels/sg_layernorm"},
		func(b *sim.Backend) gpu.Backend {
			return argsMutated{b, kernels.LayerNorm, func(a []gpu.Arg) { a[6] = gpu.F32(0.5) }}
		}},
}

const mutantEnv = "GPUTEST_MUTANT"

// TestMutantChild runs the suite on one mutant; it does nothing unless
// started by TestMutants.
func TestMutantChild(t *testing.T) {
	name := os.Getenv(mutantEnv)
	if name == "" {
		t.Skip("run by TestMutants")
	}
	for _, m := range mutants {
		if m.name == name {
			Run(t, func(t *testing.T) gpu.Backend {
				b, err := sim.New(sim.Config{Devices: 2})
				if err != nil {
					t.Fatal(err)
				}
				return m.wrap(b)
			})
			return
		}
	}
	t.Fatalf("no mutant %q", name)
}

func TestMutants(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process per mutant")
	}
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			// Only the checks that must catch the bug run (and any of the
			// same name in another of their groups): the rest of a group
			// may spend seconds on a mutant (busy's budget, with a stream
			// that never looks busy) without deciding anything.
			var groups, checks []string
			for _, d := range m.detect {
				g, c, _ := strings.Cut(d, "/")
				groups, checks = append(groups, regexp.QuoteMeta(g)), append(checks, regexp.QuoteMeta(c))
			}
			run := "^TestMutantChild$/^(" + strings.Join(groups, "|") + ")$/^(" + strings.Join(checks, "|") + ")$"
			cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.v")
			cmd.Env = append(os.Environ(), mutantEnv+"="+m.name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a backend with bug %q", m.name)
			}
			for _, d := range m.detect {
				if !strings.Contains(string(out), "--- FAIL: TestMutantChild/"+d+" ") {
					t.Errorf("bug %q not detected by %s; output:\n%s", m.name, d, tail(string(out), 3000))
				}
			}
		})
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
