package cuda

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// TestNCCLErrors checks the ncclResult_t -> sentinel table and that errors
// keep NCCL's name and number (no GPU needed).
func TestNCCLErrors(t *testing.T) {
	lib := &cu.NCCL{Path: "libnccl-test.so"}
	for r, want := range map[cu.NCCLResult]error{
		cu.NCCLInvalidArgument:    gpu.ErrInvalidValue,
		cu.NCCLInvalidUsage:       gpu.ErrIllegalState,
		cu.NCCLRemoteError:        gpu.ErrDeviceLost,
		cu.NCCLUnhandledCudaError: gpu.ErrDeviceLost,
		cu.NCCLSystemError:        gpu.ErrIllegalState,
		cu.NCCLInProgress:         gpu.ErrNotReady,
		cu.NCCLNotLoaded:          gpu.ErrNotSupported,
	} {
		err := ncclError(lib, "ncclAllReduce", r, 0)
		var ge *gpu.Error
		if !errors.Is(err, want) || !errors.As(err, &ge) || ge.Code != int(r) || ge.CodeName != r.Name() {
			t.Errorf("%s: %v, want %v with its name and number", r, err, want)
		}
		if !strings.Contains(err.Error(), "ncclAllReduce: "+r.Name()) {
			t.Errorf("%s: message %q", r, err)
		}
	}
}

func TestResolveNCCLOption(t *testing.T) {
	t.Setenv(EnvLibNCCL, "/env/libnccl.so.2")
	if o := resolveOptions(Config{}); o.ncclLibrary != "/env/libnccl.so.2" {
		t.Fatalf("ncclLibrary from the environment = %q", o.ncclLibrary)
	}
	if o := resolveOptions(Config{LibNCCL: "/cfg/libnccl.so"}); o.ncclLibrary != "/cfg/libnccl.so" {
		t.Fatalf("Config.NCCLLibrary did not win: %q", o.ncclLibrary)
	}
}

// TestCollectivesWithoutNCCL: a backend whose NCCL does not load still
// works, and its collectives say why they cannot.
func TestCollectivesWithoutNCCL(t *testing.T) {
	const path = "/nonexistent/stablegraph-test/libnccl.so.2"
	b := openOrSkip(t, Config{LibNCCL: path})
	closeClean(t, b)
	_, err := b.CommUniqueID()
	if !errors.Is(err, gpu.ErrNotSupported) || !strings.Contains(err.Error(), path) {
		t.Fatalf("CommUniqueID without NCCL = %v, want ErrNotSupported naming %s", err, path)
	}
	if _, err := b.CommInit(0, gpu.CommID{}, 1, 0); !errors.Is(err, gpu.ErrNotSupported) {
		t.Fatalf("CommInit without NCCL = %v", err)
	}
	if _, _, err := b.MemGetInfo(0); err != nil {
		t.Fatalf("the backend stopped working: %v", err)
	}
}

// TestNCCLAllReduce runs a communicator over every GPU of this process,
// eagerly and from a captured graph. Every NCCL call of a rank is made from
// that rank's own goroutine: NCCL may block one rank's call until the
// others have made theirs (one thread driving several ranks needs
// ncclGroupStart). It needs NCCL and skips without it.
func TestNCCLAllReduce(t *testing.T) {
	b := openOrSkip(t, Config{})
	closeClean(t, b)
	id, err := b.CommUniqueID()
	if errors.Is(err, gpu.ErrNotSupported) {
		t.Skipf("no NCCL: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	n := b.DeviceCount()
	comms := make([]gpu.Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { comms[r], errs[r] = b.CommInit(r, id, n, r) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	defer func() {
		var wg sync.WaitGroup
		for _, c := range comms {
			wg.Go(func() {
				if err := b.CommDestroy(c); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}()
	for r, c := range comms {
		rank, size, err := b.CommRank(c)
		if err != nil || rank != r || size != n {
			t.Fatalf("CommRank = %d, %d, %v; want %d, %d", rank, size, err, r, n)
		}
	}
	const count = 1 << 10
	type rankBufs struct {
		s    gpu.Stream
		p    gpu.DevicePtr
		x    gpu.GraphExec
		g    gpu.Graph
		host []byte
	}
	rs := make([]rankBufs, n)
	for r := range rs {
		if rs[r].s, err = b.StreamCreate(r, gpu.StreamNonBlocking, 0); err != nil {
			t.Fatal(err)
		}
		defer b.StreamDestroy(rs[r].s)
		if rs[r].p, err = b.MemAlloc(r, 4*count); err != nil {
			t.Fatal(err)
		}
		defer b.MemFree(rs[r].p)
	}
	fill := func(step int) {
		for r := range rs {
			v := make([]float32, count)
			for i := range v {
				v[i] = float32(step*100 + r + 1)
			}
			if err := b.MemcpyHtoD(rs[r].p, gpu.F32ToBytes(v)); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(step int, what string) {
		want := float32(0)
		for r := range n {
			want += float32(step*100 + r + 1)
		}
		for r := range rs {
			if err := b.StreamSynchronize(rs[r].s); err != nil {
				t.Fatalf("%s: rank %d: %v", what, r, err)
			}
			out := make([]byte, 4*count)
			if err := b.MemcpyDtoH(out, rs[r].p); err != nil {
				t.Fatal(err)
			}
			for i, v := range gpu.BytesToF32(out) {
				if v != want {
					t.Fatalf("%s: rank %d element %d = %v, want %v", what, r, i, v, want)
				}
			}
		}
	}
	perRank := func(f func(r int) error) {
		t.Helper()
		errs := make([]error, n)
		var wg sync.WaitGroup
		for r := range n {
			wg.Go(func() { errs[r] = f(r) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	}
	fill(0)
	perRank(func(r int) error {
		return b.AllReduce(comms[r], rs[r].p, rs[r].p, count, gpu.Float32, gpu.Sum, rs[r].s)
	})
	check(0, "eager")
	perRank(func(r int) error {
		if err := b.StreamBeginCapture(rs[r].s); err != nil {
			return err
		}
		if err := b.AllReduce(comms[r], rs[r].p, rs[r].p, count, gpu.Float32, gpu.Sum, rs[r].s); err != nil {
			return err
		}
		var err error
		if rs[r].g, err = b.StreamEndCapture(rs[r].s); err != nil {
			return err
		}
		rs[r].x, err = b.GraphInstantiate(rs[r].g)
		return err
	})
	for r := range rs {
		defer b.GraphDestroy(rs[r].g)
		defer b.GraphExecDestroy(rs[r].x)
	}
	for step := 1; step <= 3; step++ {
		fill(step)
		for r := range rs {
			if err := b.GraphLaunch(rs[r].x, rs[r].s); err != nil {
				t.Fatal(err)
			}
		}
		check(step, "graph")
	}
}
