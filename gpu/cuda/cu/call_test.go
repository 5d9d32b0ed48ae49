package cu

import (
	"testing"

	"github.com/ebitengine/purego"
)

// TestCallThroughPurego runs wrappers through the real purego path (not a
// stub) against C functions with the same argument shapes: libc's strlen
// and strnlen stand in for two driver symbols. It checks that pointer
// arguments reach C pointing at the Go value and that results come back,
// through the pooled argument arrays of invoke.
func TestCallThroughPurego(t *testing.T) {
	libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Skipf("no libc.so.6 here: %v", err)
	}
	sym := func(name string) uintptr {
		p, err := purego.Dlsym(libc, name)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	d := &Driver{Path: "libc-as-driver", fns: make([]uintptr, numSyms)}
	d.fns[symDriverGetVersion] = sym("strlen") // (int32*) -> strlen(const char*)
	d.fns[symDeviceTotalMem] = sym("strnlen")  // (uint64*, dev) -> strnlen(const char*, maxlen)
	for i := range 1000 {
		v := int32(0x00434241) // "ABC\0" little-endian
		if r := d.DriverGetVersion(&v); r != 3 {
			t.Fatalf("call %d: strlen through call1 = %d, want 3", i, r)
		}
		u := uint64(0x0000_0047_4645_4443) // "CDEFG\0..."
		if r := d.DeviceTotalMem(&u, 2); r != 2 {
			t.Fatalf("call %d: strnlen through call2 = %d, want 2", i, r)
		}
		if r := d.DeviceTotalMem(&u, 100); r != 5 {
			t.Fatalf("call %d: strnlen through call2 = %d, want 5", i, r)
		}
	}
	if r := d.DeviceGetCount(new(int32)); r != ErrorNotLoaded {
		t.Errorf("a symbol left unresolved gave %v, want ErrorNotLoaded", r)
	}
}
