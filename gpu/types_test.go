package gpu

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestArgEncode(t *testing.T) {
	for _, tc := range []struct {
		arg  Arg
		want []byte
	}{
		{I32(-2), []byte{0xfe, 0xff, 0xff, 0xff}},
		{F32(1), []byte{0, 0, 0x80, 0x3f}},
		{Ptr(0x1122334455667788), []byte{0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11}},
		// Raw arguments of 4 and 8 bytes must encode their bytes, not Bits.
		{Bytes([]byte{1, 2, 3, 4}), []byte{1, 2, 3, 4}},
		{Bytes([]byte{1, 2, 3, 4, 5, 6, 7, 8}), []byte{1, 2, 3, 4, 5, 6, 7, 8}},
		{Bytes([]byte{9, 8, 7}), []byte{9, 8, 7}},
	} {
		got := make([]byte, tc.arg.Size())
		tc.arg.Encode(got)
		if !bytes.Equal(got, tc.want) {
			t.Errorf("%v.Encode = %x, want %x", tc.arg, got, tc.want)
		}
	}
}

func TestKernelSpecCheckArgs(t *testing.T) {
	k := KernelSpec{Name: "k", Params: []ArgKind{ArgPtr, ArgF32}}
	if err := k.CheckArgs("Launch", []Arg{Ptr(1), F32(2)}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]Arg{{Ptr(1)}, {Ptr(1), I32(2)}, {F32(1), F32(2)}} {
		err := k.CheckArgs("Launch", args)
		if !errors.Is(err, ErrInvalidValue) {
			t.Errorf("CheckArgs(%v) = %v, want ErrInvalidValue", args, err)
		}
	}
}

func TestErrorsWrapSentinels(t *testing.T) {
	e := &Error{Op: "cuMemAlloc_v2", Err: ErrOutOfMemory, Code: 2, CodeName: "CUDA_ERROR_OUT_OF_MEMORY", Detail: "out of memory"}
	if !errors.Is(e, ErrOutOfMemory) || e.Error() != "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory" {
		t.Errorf("Error = %q", e.Error())
	}
	var ue error = &UpdateError{Op: "GraphExecUpdate", Result: UpdateTopologyChanged, Node: 7}
	if !errors.Is(ue, ErrGraphUpdate) {
		t.Error("UpdateError does not wrap ErrGraphUpdate")
	}
	var fe error = &FaultError{Device: 1, Kernel: "sg_copy", Addr: 0x1000, Size: 4, Reason: "freed"}
	if !errors.Is(fe, ErrIllegalAddress) {
		t.Error("FaultError does not wrap ErrIllegalAddress")
	}
}

func TestOpenUnknownBackend(t *testing.T) {
	if _, _, err := Open("nope", Config{}); err == nil {
		t.Fatal("Open of an unknown backend succeeded")
	}
}

func TestBriefReason(t *testing.T) {
	long := errors.New(string(bytes.Repeat([]byte("x"), 500)))
	if got := brief(long); len(got) > briefLen+60 || got[:briefLen] != long.Error()[:briefLen] {
		t.Errorf("brief of a long error: %q", got)
	}
	if got := brief(errors.New("short")); got != "short" {
		t.Errorf("brief(short) = %q", got)
	}
}

// TestModuleCodeFor: a backend gets the first target a module has code
// for, in the order it asks; the module's reasons when it has none; and a
// module's real error as is.
func TestModuleCodeFor(t *testing.T) {
	ptx := []byte(".version 9.0")
	cubin90 := []byte("\x7fELF sm_90")
	m := &ModuleImage{Name: "m", Code: func(t Target) ([]byte, error) {
		switch {
		case t.Format == CodeCubin && t.Major == 9:
			return cubin90, nil
		case t.Format == CodePTX:
			return ptx, nil
		}
		return nil, fmt.Errorf("no %s here: %w", t, ErrNotSupported)
	}}
	cubin, ptxT := Target{Format: CodeCubin, Major: 9}, Target{Format: CodePTX, Major: 9}
	if got, code, err := m.CodeFor(cubin, ptxT); err != nil || got != cubin || !bytes.Equal(code, cubin90) {
		t.Errorf("CodeFor(cubin 9.0, ptx) = %s, %q, %v; want the cubin", got, code, err)
	}
	old := Target{Format: CodeCubin, Major: 8, Minor: 6}
	if got, code, err := m.CodeFor(old, Target{Format: CodePTX, Major: 8, Minor: 6}); err != nil || got.Format != CodePTX || !bytes.Equal(code, ptx) {
		t.Errorf("CodeFor(cubin 8.6, ptx) = %s, %q, %v; want the PTX", got, code, err)
	}
	_, _, err := m.CodeFor(Target{Format: CodeHSACO, Arch: "gfx942"})
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "no hsaco for gfx942 here") {
		t.Errorf("CodeFor(hsaco) = %v, want ErrNotSupported with the module's reason", err)
	}
	if _, _, err := (&ModuleImage{Name: "refs"}).CodeFor(ptxT); !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "no device code") {
		t.Errorf("CodeFor of a module without code = %v", err)
	}
	broken := errors.New("read failed")
	bad := &ModuleImage{Name: "bad", Code: func(Target) ([]byte, error) { return nil, broken }}
	if _, _, err := bad.CodeFor(ptxT); !errors.Is(err, broken) || errors.Is(err, ErrNotSupported) {
		t.Errorf("CodeFor with a failing Code = %v, want its error", err)
	}
	pc := PTXCode(ptx)
	if code, err := pc(ptxT); err != nil || !bytes.Equal(code, ptx) {
		t.Errorf("PTXCode(ptx) = %q, %v", code, err)
	}
	if _, err := pc(cubin); !errors.Is(err, ErrNotSupported) {
		t.Errorf("PTXCode(cubin) = %v, want ErrNotSupported", err)
	}
}
