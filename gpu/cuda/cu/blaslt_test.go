package cu

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestLtHeuristicResultLayout: cublasLtMatmulHeuristicResult_t of
// cublasLt.h (x86-64): the 64-byte algorithm, size_t workspaceSize,
// cublasStatus_t state, float wavesCount, int reserved[4].
func TestLtHeuristicResultLayout(t *testing.T) {
	typ := reflect.TypeFor[LtHeuristicResult]()
	if typ.Size() != 96 {
		t.Errorf("size %d, want 96", typ.Size())
	}
	want := map[string]uintptr{"Algo": 0, "WorkspaceSize": 64, "State": 72, "WavesCount": 76, "Reserved": 80}
	if got := fieldOffsets(typ); !reflect.DeepEqual(got, want) {
		t.Errorf("offsets %v, want %v", got, want)
	}
	if s := reflect.TypeFor[LtMatmulAlgo]().Size(); s != 64 {
		t.Errorf("cublasLtMatmulAlgo_t is %d bytes, want 64", s)
	}
}

// TestBLASLtCandidates: an explicit file alone; otherwise cuBLASLt beside
// the cuBLAS that was loaded first, then the standard places.
func TestBLASLtCandidates(t *testing.T) {
	if got := BLASLtCandidates("/x/libcublasLt.so.13", "/y/libcublas.so.13"); len(got) != 1 || got[0] != "/x/libcublasLt.so.13" {
		t.Errorf("explicit: %v", got)
	}
	got := BLASLtCandidates("", "/opt/lib/libcublas.so.13")
	if got[0] != "/opt/lib/libcublasLt.so.13" {
		t.Errorf("first candidate %q, want the one beside cuBLAS", got[0])
	}
	if !contains(got, "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublasLt.so.13") || !contains(got, "libcublasLt.so.13") {
		t.Errorf("candidates lack the standard places: %v", got)
	}
	// A bare name (the loader's search) gives no directory to look beside.
	if got := BLASLtCandidates("", "libcublas.so.13"); got[0] != "libcublasLt.so.13" {
		t.Errorf("beside a bare name: first %q", got[0])
	}
}

// TestOpenBLASLtMissing: a file that is not there is a *LoadError naming
// it, and nothing is cached for it.
func TestOpenBLASLtMissing(t *testing.T) {
	const path = "/nonexistent/stablegraph-test/libcublasLt.so.13"
	_, err := OpenBLASLt(path, "")
	var le *LoadError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), path) {
		t.Fatalf("OpenBLASLt(missing) = %v, want a LoadError naming %s", err, path)
	}
}
