package stablegraph

import (
	"errors"
	"os"
	"strings"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
)

// namedBackend is a backend that answers another name (the policy is
// NCCL's: it applies to the cuda backend alone).
type namedBackend struct {
	gpu.Backend
	name string
}

func (b namedBackend) Name() string { return b.name }

// withEnv replaces ncclEnv by a map for the test, and resets the
// process-wide once.
func withEnv(t *testing.T, env map[string]string) {
	t.Helper()
	old := ncclEnv
	ncclEnv.lookup = func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	ncclEnv.set = func(k, v string) error { env[k] = v; return nil }
	ncclSetOnce.done = false
	t.Cleanup(func() { ncclEnv = old; ncclSetOnce.done = false })
}

// TestNCCLGraphRegisterOff: on the cuda backend, the policy sets
// NCCL_GRAPH_REGISTER=0 when it is unset, accepts 0, and NewComm refuses
// any other value with an error naming the variable and the fix, before
// NCCL is touched; other backends leave the environment alone.
func TestNCCLGraphRegisterOff(t *testing.T) {
	s, err := sim.New(sim.Config{Devices: 1, DeviceMemory: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cuda := namedBackend{s, "cuda"}

	env := map[string]string{}
	withEnv(t, env)
	if err := ncclGraphRegisterOff(s); err != nil || len(env) != 0 {
		t.Fatalf("sim: %v, environment %v", err, env)
	}
	if err := ncclGraphRegisterOff(cuda); err != nil {
		t.Fatal(err)
	}
	if env[ncclGraphRegisterVar] != "0" {
		t.Fatalf("unset: environment %v, want %s=0", env, ncclGraphRegisterVar)
	}
	if err := ncclGraphRegisterOff(cuda); err != nil {
		t.Fatalf("0: %v", err)
	}
	for _, v := range []string{"1", "", "yes"} {
		env[ncclGraphRegisterVar] = v
		_, err := NewComm(cuda, 0, gpu.CommID{}, 2, 1)
		if !errors.Is(err, gpu.ErrNotSupported) || !strings.Contains(err.Error(), ncclGraphRegisterVar+`="`+v+`"`) ||
			!strings.Contains(err.Error(), "set it to 0") || !strings.Contains(err.Error(), "rank 1 of 2") {
			t.Errorf("%s=%q: %v", ncclGraphRegisterVar, v, err)
		}
	}
}

// TestSetenvReachesC: what the policy relies on. os.Setenv in this
// process is seen by the C library's getenv, which NCCL calls: through
// cgo's hook, or purego's stand-in for it in a binary built with
// CGO_ENABLED=0.
func TestSetenvReachesC(t *testing.T) {
	libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		t.Skipf("no libc.so.6 to ask: %v", err)
	}
	var getenv func(name string) uintptr
	purego.RegisterLibFunc(&getenv, libc, "getenv")
	const name = "STABLEGRAPH_TEST_SETENV_REACHES_C"
	t.Setenv(name, "seen-by-c")
	p := getenv(name)
	if p == 0 {
		t.Fatalf("C's getenv(%s) is NULL after os.Setenv", name)
	}
	var got []byte
	for i := uintptr(0); ; i++ {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(nil), p+i)) //nolint:govet // a C string
		if c == 0 {
			break
		}
		got = append(got, c)
	}
	if string(got) != "seen-by-c" {
		t.Fatalf("C's getenv(%s) = %q", name, got)
	}
	_ = os.Unsetenv(name)
}
