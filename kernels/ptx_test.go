package kernels

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"testing"
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
	if !bytes.Equal(Module().PTX, ptxPortable) {
		t.Errorf("Module().PTX is not the portable build")
	}
	if !bytes.Equal(PTXFor(9, 0), ptxSM90) || !bytes.Equal(PTXFor(8, 6), ptxPortable) {
		t.Errorf("PTXFor picks the wrong build")
	}
	if !IsBuiltinPTX(Module().PTX) || IsBuiltinPTX([]byte("x")) {
		t.Errorf("IsBuiltinPTX wrong")
	}
}
