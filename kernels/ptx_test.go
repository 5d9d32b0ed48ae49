package kernels

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// TestPTXMatchesSource fails when cuda/kernels.cu changed after the PTX was
// generated: run kernels/cuda/gen.sh (needs nvcc) and commit kernels/ptx.
func TestPTXMatchesSource(t *testing.T) {
	src, err := os.ReadFile("cuda/kernels.cu")
	if err != nil {
		t.Fatal(err)
	}
	rec, err := os.ReadFile("ptx/SOURCE_SHA256")
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(rec)) // sha256sum format: "<hex>  kernels.cu"
	if len(fields) == 0 {
		t.Fatal("ptx/SOURCE_SHA256 is empty")
	}
	sum := sha256.Sum256(src)
	if got := hex.EncodeToString(sum[:]); got != fields[0] {
		t.Fatalf("kernels/cuda/kernels.cu has sha256 %s but the PTX was generated from %s: "+
			"run kernels/cuda/gen.sh on a machine with nvcc and commit kernels/ptx", got, fields[0])
	}
}

// TestPTXHasEveryKernel checks that both PTX builds define an entry for
// every spec, with the parameter count of its signature.
func TestPTXHasEveryKernel(t *testing.T) {
	for name, p := range map[string][]byte{"sm75": ptxPortable, "sm90": ptxSM90} {
		if len(p) == 0 {
			t.Fatalf("%s PTX is empty", name)
		}
		for _, k := range Specs() {
			i := bytes.Index(p, []byte(".entry "+k.Name+"("))
			if i < 0 {
				t.Errorf("%s PTX has no entry %s", name, k.Name)
				continue
			}
			end := bytes.IndexByte(p[i:], ')')
			params := bytes.Count(p[i:i+end], []byte(".param "))
			if params != len(k.Params) {
				t.Errorf("%s PTX entry %s has %d params, spec %d", name, k.Name, params, len(k.Params))
			}
		}
	}
	// The module's code per target: the sm_90 build for Hopper, the
	// portable one for the rest, and no other format.
	m := Module()
	for _, tc := range []struct {
		t    gpu.Target
		want []byte
	}{
		{gpu.Target{Format: gpu.CodePTX, Major: 9, Minor: 0}, ptxSM90},
		{gpu.Target{Format: gpu.CodePTX, Major: 8, Minor: 6}, ptxPortable},
		{gpu.Target{Format: gpu.CodePTX, Major: 10, Minor: 0}, ptxPortable},
	} {
		if got, err := m.Code(tc.t); err != nil || !bytes.Equal(got, tc.want) {
			t.Errorf("Code(%s): the wrong build (%v)", tc.t, err)
		}
	}
	for _, f := range []gpu.CodeFormat{gpu.CodeCubin, gpu.CodeHSACO} {
		if _, err := m.Code(gpu.Target{Format: f, Major: 9}); !errors.Is(err, gpu.ErrNotSupported) {
			t.Errorf("Code(%s): %v, want ErrNotSupported", f, err)
		}
	}
	// A CUDA backend asks for a cubin first, then PTX.
	got, code, err := m.CodeFor(gpu.Target{Format: gpu.CodeCubin, Major: 9}, gpu.Target{Format: gpu.CodePTX, Major: 9})
	if err != nil || got.Format != gpu.CodePTX || !bytes.Equal(code, ptxSM90) {
		t.Errorf("CodeFor(cubin, ptx) = %s, %d bytes, %v; want the sm_90 PTX", got, len(code), err)
	}
}
